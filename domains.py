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
- searchqa: BM25 (bm25s) over a synthetic encyclopedia, split by entity; reward = exact match after normalisation
  (lower case, punctuation and the articles a/an/the removed, white space folded) with any gold answer.
- math: test = the GSM8K originals, or with --math-test-set generated 200 held-out generated problems of
  1-2 steps; --math-max-steps N keeps only the bundled training problems of at most N steps (and so the
  harness set drawn from them); `python(code)` runs in a fresh OS sandbox (sandbox.py) with CPU, memory and output limits;
  reward = the last \\boxed{...} of the answer (nested braces handled) equals the gold answer after only
  two normalisations: white space removed and thousands separators dropped ("1,234" -> "1234").
- chess: Lichess puzzles; the line's first move is the opponent's and is played before the agent
  sees the position (FEN, board, legal moves in UCI and in SAN without the check and mate marks + and #);
  a legal move off the line ends the episode (any mating move is accepted where the line mates);
  reward 1.0 only for the whole line.

The paper's data (--data paper, `domains.get(name, args)` with add_args' flags; needs `datasets`,
a GPU/paper extra imported only then). Every dataset name is a flag and may be a local .jsonl / .csv /
.parquet file, so runs work offline from copied files. Tasks keep the bundled shape.
- searchqa: train = Search-R1's NQ + HotpotQA; test = its seven test sets from the FlashRAG collection
  (nq, triviaqa, popqa: test; hotpotqa, 2wikimultihopqa, musique: dev; bamboogle: test), a seeded 100
  per set = 700 questions; search = Search-R1's retrieval server (e5 over Wikipedia 2018,
  --retriever-url) or, without one, bm25s over a wiki-18 .jsonl file (--wiki).
- math: train = DAPO-Math-17K (its prompt template stripped, repeats dropped); test = AIME 2024 + 2025.
- chess: Lichess puzzles (CC0) in a rating band with 1..N solver moves; seeded disjoint train/test.
"""
import argparse
import csv
import json
import os
import random
import re
import string
import subprocess
import tempfile
import urllib.error
import urllib.request
from functools import lru_cache

import chess

import sandbox

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
    """Shared by the three domains: splits from data/<name>_<split>.jsonl, or the paper's data when built
    with args (--data paper)."""
    name = ""
    TOOL_METHODS = ()
    REQUIRED = ("id",)

    def __init__(self, args=None):
        self.args = args  # None: bundled data
        self.paper_splits = {}  # the paper's splits, loaded once (harness re-reads train)

    def load(self, split):
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r} for {self.name}: choose train, harness or test")
        if split == "harness":
            train = self.load("train")
            if len(train) <= HARNESS_SET_SIZE:
                return train
            return random.Random(HARNESS_SET_SEED).sample(train, HARNESS_SET_SIZE)
        if self.args is not None:
            if split not in self.paper_splits:
                self.paper_splits[split] = paper_tasks(self.name, split, self.args)
            return self.paper_splits[split]
        return read_jsonl(self.bundled_file(split), self.REQUIRED)

    def bundled_file(self, split):
        return f"{self.name}_{split}.jsonl"

    def gold(self, task):
        """The gold answer in words, for `show` and for people reading traces."""
        raise NotImplementedError

# -----------------------------------------------------------------------------
# SearchQA


MAX_PASSAGE_CHARS = 4000  # a flood guard only: whole passages come back, the harness cuts them (PASSAGE_WORDS)
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
        return SearchTools() if self.args is None else WikiSearchTools(self.wiki())

    def wiki(self):
        """The paper's retriever, made once: the retrieval server if given, else bm25s over --wiki."""
        if not hasattr(self, "retriever"):
            if self.args.retriever_url:
                self.retriever = RetrieverClient(self.args.retriever_url)
            elif self.args.wiki:
                self.retriever = WikiBM25(self.args.wiki, self.args.wiki_limit)
            else:
                raise ValueError("the paper's searchqa needs --retriever-url URL (Search-R1's retrieval server) "
                                 "or --wiki PATH (a wiki-18 .jsonl file for bm25s)")
        return self.retriever

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
PYTHON_MAX_OUTPUT_BYTES = 1 << 20
MAX_OUTPUT_CHARS = 2000
# Runs in the sandboxed child before the model's code: it sets its own limits, and an audit hook that
# names the refused process calls (the sandbox's seccomp filter refuses them anyway, this only says so
# clearly), then runs the code from stdin.
SANDBOX_PRELUDE = r"""
import resource, sys
cpu, memory, fsize = map(int, sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
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


def run_python(code, timeout_s=PYTHON_TIMEOUT_S, memory_bytes=PYTHON_MEMORY_BYTES, max_chars=MAX_OUTPUT_CHARS):
    """Run code in a fresh OS sandbox (sandbox.py: no project, no data, no network, no other process, one
    process only) with CPU, memory, output and wall limits; return stdout+stderr, cut."""
    if not isinstance(code, str):
        return "error: code must be a string"
    env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
    cpu_s = int(timeout_s) + 1
    limits = [str(cpu_s), str(memory_bytes), str(PYTHON_MAX_OUTPUT_BYTES)]
    # output goes to a file whose size the child may not push past the limit, never into our memory
    with tempfile.TemporaryFile() as out:
        proc = sandbox.start_one_process([sandbox.python(), "-I", "-c", SANDBOX_PRELUDE, *limits], env=env,
                                         stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT)
        error = ""
        try:
            proc.communicate(code.encode("utf-8", "replace"), timeout=timeout_s)
            signum = -proc.returncode if proc.returncode < 0 else proc.returncode - 128  # bwrap: 128 + signal
            if 0 < signum < 65:
                error = f"\nerror: killed by signal {signum} (limits: {cpu_s} s CPU, " \
                        f"{memory_bytes >> 20} MB memory, {PYTHON_MAX_OUTPUT_BYTES >> 20} MB output)"
        except subprocess.TimeoutExpired:
            proc.kill()  # SIGKILL to bwrap: its pid namespace takes every process inside along
            proc.wait()
            error = f"\nerror: timed out after {timeout_s:g} s"
        finally:
            proc.kill()
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


MATH_TEST_SETS = {"gsm8k": "math_test.jsonl", "generated": "math_test_generated.jsonl"}


class Math(Domain):
    name = "math"
    TOOL_METHODS = ("python",)
    REQUIRED = ("id", "question", "answer")
    python_timeout_s = PYTHON_TIMEOUT_S  # tests and quick runs may lower it on the instance
    test_set = "gsm8k"  # bundled test split: GSM8K originals, or "generated" (1-2 steps, held out from train)
    max_steps = None  # bundled train (and harness) problems of at most this many steps; None: all (1-4)

    def bundled_file(self, split):
        return MATH_TEST_SETS[self.test_set] if split == "test" else super().bundled_file(split)

    def load(self, split):
        tasks = super().load(split)
        if split == "train" and self.max_steps is not None:
            if any("steps" not in t for t in tasks):
                raise ValueError(f"--math-max-steps needs the generated problems' `steps` field, missing in "
                                 f"data/{self.bundled_file(split)}: {REBUILD_HINT}")
            tasks = [t for t in tasks if t["steps"] <= self.max_steps]
        return tasks

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


def plain_san(board, move):
    """SAN without the check and mate marks (+, #): the view must not say which moves give mate."""
    return board.san(move).rstrip("+#")


def board_view(board):
    """What the agent sees of a position (the keys shared by public() and a move's "ok" answer)."""
    legal = list(board.legal_moves)
    return {"fen": board.fen(), "board": str(board), "legal_uci": [m.uci() for m in legal],
            "legal_san": [plain_san(board, m) for m in legal]}


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
        reply_san = plain_san(self.board, reply)
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
        first_san = plain_san(board, first)
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
# The paper's data: loaders through `datasets` (dataset names are flags), retrieval over Wikipedia 2018

SEARCHQA_TRAIN = "PeterJinGo/nq_hotpotqa_train"
SEARCHQA_TEST = "RUC-NLPIR/FlashRAG_datasets"
SEARCHQA_TEST_SETS = ("nq:test", "triviaqa:test", "popqa:test", "hotpotqa:dev", "2wikimultihopqa:dev",
                      "musique:dev", "bamboogle:test")
SEARCHQA_TEST_PER_SET = 100
MATH_TRAIN = "BytedTsinghua-SIA/DAPO-Math-17k"
MATH_TEST = ("HuggingFaceH4/aime_2024:train", "MathArena/aime_2025:train")
CHESS_PUZZLES = "Lichess/chess-puzzles"
PAPER_SPLIT_SEED = 0

# DAPO-Math-17K wraps every problem in this instruction; the harness writes its own prompt
DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your response should be of the form "
               "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def read_rows(name, config=None, split="train", streaming=False):
    """Rows of a hub dataset (through `datasets`, imported only here) or of a local .jsonl/.csv/.parquet file."""
    if os.path.exists(name) and name.endswith((".jsonl", ".json")):
        return read_local_jsonl(name)
    if os.path.exists(name) and name.endswith(".csv"):
        with open(name, encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    try:
        import datasets
    except ImportError:
        raise ImportError("the paper's data (--data paper) needs `datasets`: pip install -r requirements-gpu.txt") from None
    if os.path.exists(name) and name.endswith(".parquet"):
        return datasets.load_dataset("parquet", data_files=name, split="train", streaming=streaming)
    return datasets.load_dataset(name, config, split=split, streaming=streaming)

def read_local_jsonl(path):
    """Rows of a local JSON Lines file (blank lines skipped); a line that is not a JSON object is an error naming it."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if not isinstance(row, dict):
                raise ValueError(f"malformed data file {path}: line {lineno} is not a JSON object; fix or remove that line")
            rows.append(row)
    return rows

# -----------------------------------------------------------------------------
# row parsers: one dataset row -> one task dict (None for a row that cannot be a task)


def searchqa_task(row, source, index):
    question = str(row.get("question") or "").strip()
    answers = row.get("golden_answers")
    if answers is None:  # Search-R1's verl parquet keeps them under reward_model.ground_truth.target
        answers = ((row.get("reward_model") or {}).get("ground_truth") or {}).get("target")
    answers = [answers] if isinstance(answers, str) else [str(a) for a in (answers or []) if str(a).strip()]
    if not question or not answers:
        return None
    if not question.endswith("?"):
        question += "?"  # as Search-R1's preprocessing does
    source = row.get("data_source") or source
    return {"id": f"{source}-{row.get('id', index)}", "question": question, "answers": answers, "source": source}


def dapo_task(row, index):
    prompt = row.get("prompt")
    text = prompt[0]["content"] if isinstance(prompt, list) and prompt else str(row.get("question") or prompt or "")
    text = text.removeprefix(DAPO_PREFIX).removesuffix(DAPO_SUFFIX).strip()
    answer = (row.get("reward_model") or {}).get("ground_truth", row.get("answer"))
    if not text or answer is None:
        return None
    uid = (row.get("extra_info") or {}).get("index", index)
    return {"id": f"dapo-{uid}", "question": text, "answer": str(answer).strip(), "source": "dapo-math-17k"}


def aime_task(row, source, index):
    question = str(row.get("problem") or row.get("question") or row.get("Problem") or "").strip()
    answer = row.get("answer", row.get("Answer"))
    if not question or answer is None:
        return None
    uid = row.get("id", row.get("problem_idx", index))
    return {"id": f"{source}-{uid}", "question": question, "answer": str(answer).strip(), "source": source}


def lichess_task(row):
    """A Lichess puzzle row (the puzzle CSV's columns): FEN before the opponent's first move, Moves in UCI."""
    moves = row["Moves"].split() if isinstance(row["Moves"], str) else list(row["Moves"])
    themes = row.get("Themes") or []
    return {"id": str(row["PuzzleId"]), "fen": row["FEN"], "moves": moves, "rating": int(row["Rating"]),
            "themes": themes.split() if isinstance(themes, str) else list(themes), "game": row.get("GameUrl", "")}

# -----------------------------------------------------------------------------
# loaders


def load_searchqa(split, train_name=SEARCHQA_TRAIN, test_name=SEARCHQA_TEST, test_sets=SEARCHQA_TEST_SETS,
                  per_set=SEARCHQA_TEST_PER_SET, seed=PAPER_SPLIT_SEED):
    if split == "train":
        tasks = (searchqa_task(r, "train", i) for i, r in enumerate(read_rows(train_name, split="train")))
        return [t for t in tasks if t]
    tasks = []
    for spec in test_sets:
        config, _, set_split = spec.partition(":")
        rows = [t for i, r in enumerate(read_rows(test_name, config, set_split or "test")) if (t := searchqa_task(r, config, i))]
        tasks += random.Random(f"{seed}-{config}").sample(rows, min(per_set, len(rows)))
    return tasks


def load_math(split, train_name=MATH_TRAIN, test_names=MATH_TEST):
    if split == "train":
        tasks, seen = [], set()
        for i, row in enumerate(read_rows(train_name, split="train")):
            task = dapo_task(row, i)
            if task and task["question"] not in seen:  # the released file repeats each problem
                seen.add(task["question"])
                tasks.append(task)
        return tasks
    tasks = []
    for spec in test_names:
        name, _, name_split = spec.partition(":")
        source = os.path.basename(name).lower().replace(".", "-")
        tasks += [t for i, r in enumerate(read_rows(name, split=name_split or "train")) if (t := aime_task(r, source, i))]
    return tasks


def load_chess(split, name=CHESS_PUZZLES, min_rating=0, max_rating=1500, max_solver_moves=2, test_size=1000,
               train_size=20000, seed=PAPER_SPLIT_SEED):
    """Puzzles with rating in [min_rating, max_rating] and 1..max_solver_moves solver moves; the first
    test_size + train_size such rows in the file's order, split by a seeded shuffle (disjoint)."""
    wanted, picked = test_size + train_size, []
    for row in read_rows(name, split="train", streaming=True):
        task = lichess_task(row)
        if min_rating <= task["rating"] <= max_rating and 2 <= len(task["moves"]) <= 2 * max_solver_moves:
            picked.append(task)
            if len(picked) == wanted:
                break
    random.Random(seed).shuffle(picked)
    return picked[:test_size] if split == "test" else picked[test_size:]


# -----------------------------------------------------------------------------
# retrieval over Wikipedia 2018


def passage_text(contents):
    """wiki-18 / Search-R1 `contents` ('"Title"\\ntext') -> 'Title: text', the bundled corpus' form."""
    title, _, text = str(contents).partition("\n")
    return f"{title.strip().strip(chr(34))}: {text.strip()}"


class RetrieverClient:
    """Search-R1's retrieval server: POST {"queries", "topk", "return_scores"} -> {"result": [[hit, ...], ...]}."""

    def __init__(self, url="http://127.0.0.1:8000/retrieve", timeout=60.0):
        self.url, self.timeout = url, timeout

    def search_batch(self, queries, k=1):
        payload = json.dumps({"queries": list(queries), "topk": k, "return_scores": True}).encode()
        req = urllib.request.Request(self.url, data=payload, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                result = json.loads(resp.read())["result"]
        except (urllib.error.URLError, OSError) as e:
            raise RuntimeError(f"retrieval server {self.url} failed ({e}): start Search-R1's retrieval_server.py "
                               "or pass --wiki PATH to search a corpus file with bm25s") from None
        # with return_scores each hit is {"document": {...}, "score": s}; without, the document itself
        return [[passage_text((h.get("document") or h)["contents"]) for h in hits] for hits in result]

    def search(self, query, k=1):
        return self.search_batch([query], k)[0]


class WikiBM25:
    """bm25s over a wiki-18 style .jsonl file ({"id", "contents": '"Title"\\ntext'}); the index is built once
    (slow for the full 21M passages: use `limit` for a slice) and saved beside the file."""

    def __init__(self, path, limit=None):
        import bm25s
        if not os.path.exists(path):
            raise FileNotFoundError(f"wiki corpus {path} not found: download Search-R1's wiki-18.jsonl or pass "
                                    "--retriever-url for a retrieval server")
        index_dir = f"{path}.bm25s" + (f"-{limit}" if limit else "")
        self.passages = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                if limit and len(self.passages) >= limit:
                    break
                self.passages.append(passage_text(json.loads(line)["contents"]))
        if os.path.isdir(index_dir):
            self.retriever = bm25s.BM25.load(index_dir)
        else:
            self.retriever = bm25s.BM25()
            self.retriever.index(bm25s.tokenize(self.passages, stopwords="en", show_progress=False), show_progress=False)
            self.retriever.save(index_dir)

    def search(self, query, k=1):
        import bm25s
        tokens = bm25s.tokenize([str(query)[:2000]], stopwords="en", return_ids=False, show_progress=False)
        if not tokens[0]:
            return []
        ids, scores = self.retriever.retrieve(tokens, k=min(k, len(self.passages)), show_progress=False)
        return [self.passages[i] for i, s in zip(ids[0], scores[0]) if s > 0]


def add_args(p):
    """The --data switch and the paper data's flags (whale.py and the other CLIs pass their args to get())."""
    # data: bundled (offline, data/) or the paper's sets through `datasets` (a name may be a local file)
    p.add_argument("--data", default="bundled", choices=("bundled", "paper"))
    p.add_argument("--searchqa-train", default=SEARCHQA_TRAIN, help="Search-R1's NQ + HotpotQA train set")
    p.add_argument("--searchqa-test", default=SEARCHQA_TEST, help="the collection holding the seven test sets")
    p.add_argument("--searchqa-test-sets", default=",".join(SEARCHQA_TEST_SETS), help="config:split, comma-separated")
    p.add_argument("--searchqa-test-per-set", type=int, default=SEARCHQA_TEST_PER_SET)
    p.add_argument("--retriever-url", default=None, help="Search-R1's retrieval server, e.g. http://127.0.0.1:8000/retrieve")
    p.add_argument("--wiki", default=None, help="without a server: bm25s over this wiki-18 .jsonl file")
    p.add_argument("--wiki-limit", type=int, default=None, help="index only the first N passages of --wiki")
    p.add_argument("--math-train", default=MATH_TRAIN)
    p.add_argument("--math-test", default=",".join(MATH_TEST), help="name:split, comma-separated")
    p.add_argument("--math-test-set", default="gsm8k", choices=sorted(MATH_TEST_SETS),
                   help="bundled math test split: the GSM8K originals, or generated 1-2 step problems held out from train")
    p.add_argument("--math-max-steps", type=int, default=None, choices=range(1, 5), metavar="{1..4}",
                   help="bundled math: train (and draw the harness set) on problems of at most N steps only")
    p.add_argument("--chess-puzzles", default=CHESS_PUZZLES, help="hub dataset or lichess_db_puzzle.csv")
    p.add_argument("--chess-rating", default="0-1500", help="rating band MIN-MAX")
    p.add_argument("--chess-max-solver-moves", type=int, default=2, help="line length: 1..N moves by the solver")
    p.add_argument("--chess-train-size", type=int, default=20000)
    p.add_argument("--chess-test-size", type=int, default=1000)


def paper_tasks(name, split, args):
    """The paper's train or test tasks of a domain, with the dataset names and filters of add_args' flags."""
    if name == "searchqa":
        tasks = load_searchqa(split, args.searchqa_train, args.searchqa_test, args.searchqa_test_sets.split(","),
                              args.searchqa_test_per_set)
    elif name == "math":
        tasks = load_math(split, args.math_train, args.math_test.split(","))
    else:
        tasks = load_chess_split(split, args)
    if not tasks:
        raise ValueError(f"--data paper: the {name} {split} data has no usable rows (every row lacks a question or "
                         f"an answer): check the {name} dataset flags (see --help)")
    return tasks


def load_chess_split(split, args):
    """The paper's chess puzzles in the rating band and line length of the flags."""
    try:
        low, high = (int(x) for x in args.chess_rating.split("-"))
    except ValueError:
        raise ValueError(f"--chess-rating {args.chess_rating!r} is not a band MIN-MAX, e.g. 0-1500") from None
    return load_chess(split, args.chess_puzzles, low, high, args.chess_max_solver_moves, args.chess_test_size,
                      args.chess_train_size)


class WikiSearchTools:
    """The paper's search tool: Wikipedia 2018 through the retrieval server or bm25s, passages cut as bundled ones."""

    def __init__(self, retriever):
        self.retriever = retriever

    def search(self, query, k=1):
        k = max(1, min(k, MAX_SEARCH_K)) if isinstance(k, int) else 1
        return [p[:MAX_PASSAGE_CHARS] for p in self.retriever.search(str(query)[:2000], k)]

# -----------------------------------------------------------------------------

DOMAINS = {"searchqa": SearchQA, "math": Math, "chess": Chess}


def get(name, args=None):
    """A domain on the bundled data, or on the paper's data when args (add_args' flags) say --data paper."""
    if name not in DOMAINS:
        raise ValueError(f"unknown domain {name!r}: choose searchqa, math or chess")
    paper = getattr(args, "data", "bundled") == "paper"
    domain = DOMAINS[name](args if paper else None)
    test_set = getattr(args, "math_test_set", "gsm8k")
    if name == "math" and test_set != "gsm8k":
        if paper:
            raise ValueError(f"--math-test-set {test_set} is a bundled test split: with --data paper the test set "
                             "is --math-test (default AIME 2024 + 2025); drop one of the two flags")
        domain.test_set = test_set
    max_steps = getattr(args, "math_max_steps", None)
    if name == "math" and max_steps is not None:
        if paper:
            raise ValueError(f"--math-max-steps {max_steps} filters the bundled generated problems: with --data paper "
                             "the train set is --math-train; drop one of the two flags")
        domain.max_steps = max_steps
    return domain


def print_stats():
    print(f"{'domain':10s} {'train':>7s} {'harness':>8s} {'test':>6s}")
    for name in DOMAINS:
        d = get(name)
        print(f"{name:10s} " + " ".join(f"{len(d.load(s)):>{w}d}" for s, w in zip(SPLITS, (7, 8, 6))))
    print(f"math test, --math-test-set generated: {len(read_jsonl(MATH_TEST_SETS['generated']))} problems")
    docs = read_jsonl("searchqa_corpus.jsonl")
    print(f"searchqa corpus: {len(docs)} documents")


def show(name, split, n, args=None):
    d = get(name, args)
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
    add_args(p)  # `show DOMAIN --data paper` reads the paper's sets
    args = parser.parse_args()
    try:
        if args.command == "stats":
            print_stats()
        else:
            show(args.domain, args.split, args.n, args)
    except (ValueError, FileNotFoundError, ImportError) as e:
        raise SystemExit(f"error: {e}")
