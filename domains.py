"""The three domains: bundled data, what a harness may see, the episode tools and the rewards.

    python domains.py stats                          # every split's size per domain
    python domains.py show chess --split test -n 3   # tasks as a harness sees them, then the gold

    import domains
    d = domains.get("searchqa")          # or "math", "chess"
    task = d.load("train")[0]
    tools = d.tools(task)                # fresh per episode: SearchQA search, Math python, Chess move
    d.reward(task, answer, tools)        # 0.0 or 1.0

Splits: train and test are bundled files (data/, rebuilt by data/build.py); harness is a fixed
seeded sample of 256 training tasks, the set every harness candidate is scored on (as in the paper).
- searchqa: BM25 (bm25s) over a synthetic encyclopedia; reward = exact match after normalisation
  (lower case, punctuation and the articles a/an/the removed, white space folded) with any gold answer.
- math: `python(code)` runs in a separate, resource-limited process; reward = the last \\boxed{...}
  of the answer (nested braces handled) equals the gold answer after only two normalisations:
  white space removed and thousands separators dropped ("1,234" -> "1234").
- chess: Lichess puzzles; the line's first move is the opponent's and is played before the agent
  sees the position; a legal move off the line ends the episode (any mating move is accepted where
  the line mates); reward 1.0 only for the whole line.
"""
import argparse
import json
import os
import random
import re
import signal
import string
import subprocess
import sys
import tempfile
from functools import lru_cache

import chess

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
SPLITS = ("train", "harness", "test")
HARNESS_SET_SIZE = 256
HARNESS_SET_SEED = 0
REBUILD_HINT = "rebuild it with `python data/build.py` (or restore it with `git checkout data/`)"


def read_jsonl(name, required=()):
    """Rows of data/<name>, each a dict holding the `required` keys; one-line errors otherwise."""
    path = os.path.join(DATA_DIR, name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"missing data file {path}: {REBUILD_HINT}")
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if not isinstance(row, dict) or any(k not in row for k in required):
                raise ValueError(f"corrupt data file {path} (line {lineno} is not a JSON object with keys "
                                 f"{', '.join(required)}): {REBUILD_HINT}")
            rows.append(row)
    if not rows:
        raise ValueError(f"corrupt data file {path} (empty): {REBUILD_HINT}")
    return rows


class Domain:
    """Shared by the three domains: splits from data/<name>_<split>.jsonl."""
    name = ""
    TOOL_METHODS = ()
    REQUIRED = ("id",)

    def load(self, split):
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r} for {self.name}: choose train, harness or test")
        if split == "harness":
            train = self.load("train")
            if len(train) <= HARNESS_SET_SIZE:
                return train
            return random.Random(HARNESS_SET_SEED).sample(train, HARNESS_SET_SIZE)
        return read_jsonl(f"{self.name}_{split}.jsonl", self.REQUIRED)

    def gold(self, task):
        """The gold answer in words, for `show` and for people reading traces."""
        raise NotImplementedError

# -----------------------------------------------------------------------------
# SearchQA


MAX_PASSAGE_CHARS = 600
MAX_SEARCH_K = 10


def normalize_answer(text):
    """SQuAD-style: lower case, no punctuation, no articles, white space folded."""
    text = str(text).lower()
    text = "".join(ch for ch in text if ch not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


@lru_cache(maxsize=1)
def searchqa_index():
    """(passages, bm25 retriever) over the bundled corpus, built once per process (< 1 s)."""
    import bm25s  # here, not at the top: its import takes ~1 s that math and chess need not pay
    docs = read_jsonl("searchqa_corpus.jsonl", ("title", "text"))
    passages = [f"{d['title']}: {d['text']}" for d in docs]
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(passages, stopwords="en", show_progress=False), show_progress=False)
    return passages, retriever


class SearchTools:
    def __init__(self):
        self.passages, self.retriever = searchqa_index()

    def search(self, query, k=1):
        """Top-k passages "Title: text" for a query, each cut to MAX_PASSAGE_CHARS; k capped at MAX_SEARCH_K."""
        import bm25s  # already loaded by searchqa_index
        k = max(1, min(k, MAX_SEARCH_K)) if isinstance(k, int) else 1
        tokens = bm25s.tokenize([str(query)[:2000]], stopwords="en", return_ids=False, show_progress=False)
        if not tokens[0]:
            return []
        ids, scores = self.retriever.retrieve(tokens, k=k, show_progress=False)
        return [self.passages[i][:MAX_PASSAGE_CHARS] for i, s in zip(ids[0], scores[0]) if s > 0]


class SearchQA(Domain):
    name = "searchqa"
    TOOL_METHODS = ("search",)
    REQUIRED = ("id", "question", "answers")

    def public(self, task):
        return {"question": task["question"]}

    def tools(self, task):
        return SearchTools()

    def reward(self, task, answer, tools=None):
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str):
            return 0.0
        pred = normalize_answer(answer[:10_000])
        return 1.0 if any(pred == normalize_answer(g) for g in task["answers"]) else 0.0

    def gold(self, task):
        return " | ".join(task["answers"])

# -----------------------------------------------------------------------------
# Math


PYTHON_TIMEOUT_S = 30.0
PYTHON_MEMORY_BYTES = 1 << 30
PYTHON_MAX_PROCS = 64
PYTHON_MAX_OUTPUT_BYTES = 1 << 20
MAX_OUTPUT_CHARS = 2000
# Runs in the child before the model's code: it sets its own limits (no preexec_fn, which is not
# safe in a threaded parent), installs an audit hook (which cannot be removed) that forbids creating
# or signalling processes, since RLIMIT_NPROC does not bind root, then runs the code from stdin.
SANDBOX_PRELUDE = r"""
import resource, sys
cpu, memory, nproc, fsize = map(int, sys.argv[1:5])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
BLOCKED = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
           "os.kill", "os.killpg"}
def guard(event, args):
    if event in BLOCKED:
        raise PermissionError(f"{event} is not allowed in this sandbox")
sys.addaudithook(guard)
sys.argv = ["<code>"]
exec(compile(sys.stdin.read(), "<code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
"""


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own session: this reaches any grandchild too
    except (ProcessLookupError, PermissionError):
        pass


def run_python(code, timeout_s=PYTHON_TIMEOUT_S, memory_bytes=PYTHON_MEMORY_BYTES, max_chars=MAX_OUTPUT_CHARS):
    """Run code in a fresh isolated interpreter with CPU, memory, output and wall limits; return stdout+stderr, cut."""
    if not isinstance(code, str):
        return "error: code must be a string"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
    cpu_s = int(timeout_s) + 1
    limits = [str(cpu_s), str(memory_bytes), str(PYTHON_MAX_PROCS), str(PYTHON_MAX_OUTPUT_BYTES)]
    # output goes to a file whose size the child may not push past the limit, never into our memory
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([sys.executable, "-I", "-c", SANDBOX_PRELUDE, *limits], stdin=subprocess.PIPE,
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tempfile.gettempdir(),
                                start_new_session=True)
        error = ""
        try:
            proc.communicate(code.encode("utf-8", "replace"), timeout=timeout_s)
            if proc.returncode < 0:
                error = f"\nerror: killed by signal {-proc.returncode} (limits: {cpu_s} s CPU, " \
                        f"{memory_bytes >> 20} MB memory, {PYTHON_MAX_OUTPUT_BYTES >> 20} MB output)"
        except subprocess.TimeoutExpired:
            kill_group(proc)
            proc.wait()
            error = f"\nerror: timed out after {timeout_s:g} s"
        finally:
            kill_group(proc)  # also reaps anything the code left running in its session
        out.seek(0)
        text = out.read(4 * max_chars).decode("utf-8", "replace")
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n... [output cut at {max_chars} chars]"
    return (text + error).lstrip("\n") if error else text


class PythonTools:
    def __init__(self, timeout_s=PYTHON_TIMEOUT_S):
        self.timeout_s = timeout_s

    def python(self, code):
        """Run code; return its stdout and stderr (or an error text), cut to MAX_OUTPUT_CHARS."""
        return run_python(code, timeout_s=self.timeout_s)


def last_boxed(text):
    """Content of the last \\boxed{...} in text, nested braces handled; None if there is none or it is unclosed."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def normalize_number(text):
    text = "".join(text.split())
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):
        text = text.replace(",", "")
    return text


class Math(Domain):
    name = "math"
    TOOL_METHODS = ("python",)
    REQUIRED = ("id", "question", "answer")
    python_timeout_s = PYTHON_TIMEOUT_S  # tests and quick runs may lower it on the instance

    def public(self, task):
        return {"question": task["question"]}

    def tools(self, task):
        return PythonTools(self.python_timeout_s)

    def reward(self, task, answer, tools=None):
        if not isinstance(answer, str):
            return 0.0
        boxed = last_boxed(answer)
        if boxed is None:
            return 0.0
        return 1.0 if normalize_number(boxed) == normalize_number(task["answer"]) else 0.0

    def gold(self, task):
        return task["answer"]

# -----------------------------------------------------------------------------
# Chess


def board_view(board):
    """What the agent sees of a position (the keys shared by public() and a move's "ok" answer)."""
    legal = list(board.legal_moves)
    return {"fen": board.fen(), "board": str(board), "legal_uci": [m.uci() for m in legal],
            "legal_san": [board.san(m) for m in legal]}


class ChessTools:
    """One puzzle episode: the hidden line, the board, and whether it is over or solved."""

    def __init__(self, task):
        self.line = [chess.Move.from_uci(u) for u in task["moves"]]
        self.board = chess.Board(task["fen"])
        self.board.push(self.line[0])  # the opponent's move that sets the puzzle
        self.next = 1  # index in line of the move the solver must find
        self.solved = False
        self.over = False

    def move(self, uci):
        if self.over:
            return {"status": "over", "message": "the puzzle is over; no more moves are taken"}
        try:
            move = chess.Move.from_uci(str(uci).strip()[:10])
        except (ValueError, TypeError):
            return {"status": "unparseable", "message": f"{str(uci)[:40]!r} is not a UCI move like e2e4 or e7e8q"}
        if move not in self.board.legal_moves:
            return {"status": "illegal", "message": f"{move.uci()} is not legal in this position"}
        expected = self.line[self.next]
        if move != expected and not self.is_alternative_mate(move, expected):
            self.over = True
            return {"status": "wrong", "message": f"{move.uci()} is not the best move; the puzzle is failed"}
        self.board.push(move)
        self.next += 1
        if self.next >= len(self.line):
            self.solved = self.over = True
            return {"status": "solved", "message": f"{move.uci()} is correct; the puzzle is solved"}
        reply = self.line[self.next]
        reply_san = self.board.san(reply)
        self.board.push(reply)
        self.next += 1
        return {"status": "ok", "message": f"{move.uci()} is correct; the opponent replied {reply.uci()}",
                "opponent_move": reply.uci(), "opponent_san": reply_san, **board_view(self.board)}

    def is_alternative_mate(self, move, expected):
        """As on Lichess: where the line mates, any mating move is accepted."""
        return gives_mate(self.board, expected) and gives_mate(self.board, move)


def gives_mate(board, move):
    board.push(move)
    mate = board.is_checkmate()
    board.pop()
    return mate


class Chess(Domain):
    name = "chess"
    TOOL_METHODS = ("move",)
    REQUIRED = ("id", "fen", "moves")

    def public(self, task):
        board = chess.Board(task["fen"])
        first = chess.Move.from_uci(task["moves"][0])
        first_san = board.san(first)
        board.push(first)
        return {**board_view(board), "side": "white" if board.turn == chess.WHITE else "black",
                "last_move": first.uci(), "last_move_san": first_san}

    def tools(self, task):
        return ChessTools(task)

    def reward(self, task, answer, tools):
        return 1.0 if getattr(tools, "solved", False) is True else 0.0

    def gold(self, task):
        return " ".join(task["moves"][1:]) + f"   (opponent first: {task['moves'][0]}; rating {task.get('rating')})"

# -----------------------------------------------------------------------------

DOMAINS = {"searchqa": SearchQA, "math": Math, "chess": Chess}


def get(name):
    if name not in DOMAINS:
        raise ValueError(f"unknown domain {name!r}: choose searchqa, math or chess")
    return DOMAINS[name]()


def print_stats():
    print(f"{'domain':10s} {'train':>7s} {'harness':>8s} {'test':>6s}")
    for name in DOMAINS:
        d = get(name)
        print(f"{name:10s} " + " ".join(f"{len(d.load(s)):>{w}d}" for s, w in zip(SPLITS, (7, 8, 6))))
    docs = read_jsonl("searchqa_corpus.jsonl")
    print(f"searchqa corpus: {len(docs)} documents")


def show(name, split, n):
    d = get(name)
    for task in d.load(split)[:n]:
        print(f"--- {name}/{split} {task['id']}")
        for key, value in d.public(task).items():
            text = value if isinstance(value, str) else json.dumps(value)
            print(f"{key}:\n{text}" if "\n" in text else f"{key}: {text}")
        print(f"gold: {d.gold(task)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Inspect the bundled domains.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("stats", help="every split's size per domain")
    p = sub.add_parser("show", help="tasks as a harness sees them, then the gold answer")
    p.add_argument("domain")
    p.add_argument("--split", default="test")
    p.add_argument("-n", type=int, default=3)
    args = parser.parse_args()
    try:
        if args.command == "stats":
            print_stats()
        else:
            show(args.domain, args.split, args.n)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}")
