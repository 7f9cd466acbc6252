"""The domains: bundled data, what a harness may see, the episode tools and the rewards.
(Their split sizes and tasks as a harness sees them: scripts/show_data.py.)

    import domains
    d = domains.get("searchqa")          # or "math", "chess", "countdown": any name in domains.DOMAINS
    task = d.load("train")[0]
    tools = d.tools(task)                # fresh per episode: search, python, or the chess move
    d.reward(task, answer, tools)        # 0.0 or 1.0

Splits: train and test are bundled files (data/, rebuilt by data/build.py); harness is a fixed seeded sample of 256
training tasks, the set every harness candidate is scored on (as in the official code, it overlaps the training set;
only the paper's chess has a harness split of its own, disjoint from train and test). Every limit (--train-limit,
--test-limit, --harness-tasks, rollout.py --limit, `show_data.py show -n`) is lib/subsets.seeded_sample: a seeded sample
keeping each `source`'s share, never the first N. The rewards are the official verifiers (docs/protocol.md section 4):
- searchqa: BM25 (bm25s) over a synthetic encyclopedia, split by entity (`source` "synthetic");
  reward = exact match after normalisation (lower case, punctuation and the articles a/an/the
  removed, white space folded) with any gold answer, or with --judge-url the verdict of the LLM judge
  the official docs name, in the project's wording of its rules (lib/paper/judge.py; docs/fidelity.md 16, 17).
- math: test = the GSM8K originals, or with --math-test-set generated 200 held-out generated
  problems of 1-2 steps; --math-max-steps N keeps only the bundled training problems of at most N
  steps (and so the harness set drawn from them); `python(code)` runs in a fresh OS sandbox
  (lib/episodes/python_tool.py) with CPU, memory and output limits; reward = the last \\boxed{...} within the
  answer's final 100 characters (nested braces handled) equals the gold answer as a string, white
  space included (math_dapo's strict box check).
- chess: Lichess puzzles; the line's first move is the opponent's and is played before the agent
  sees the position (FEN, board, legal moves in UCI and in SAN: without the check and mate marks +
  and #, or with --chess-san-marks as python-chess writes them, as the official observation has
  them); only the reference move is right: any other legal move, an alternative mate too, ends the
  episode; reward 1.0 only for the whole line.
- countdown (the fourth domain, and the template for a fork's own): generated puzzles of 3-4 numbers and a
  target; no tools; reward = the answer's expression (left of an '=') uses only the given numbers, each at
  most once, + - * / and parentheses, and its exact value is the target (countdown_value: parsed, never run).

What the verifier reads (--scoring): with the paper's data the model's last assistant message, as the official
verifiers read it (searchqa its innermost <answer>, math its last 100 characters); with the bundled data the answer
the harness's run() returns (Domain.scored_answer; docs/fidelity.md).

The paper's data (--data paper: `domains.get(name, args)` with add_args' flags) loads through
lib/paper/paper_data.py: the hub datasets (or local copies of them) in the bundled tasks' shape, and
Wikipedia 2018 for search.
"""
import argparse
import os
import random
import re
import string
from collections import Counter
from fractions import Fraction
from functools import cache, lru_cache
from types import SimpleNamespace

import chess

from lib.common import json_files
from lib.paper import paper_data
from lib.paper.retriever import check_flags as check_retriever_flags, shared_retriever
from lib.contract import check_harness_fits
from lib.paper.judge import FLAGS as JUDGE_FLAGS, JUDGE_GROUP, judge_from_flags
from lib.episodes.python_tool import MAX_OUTPUT_CHARS, PYTHON_TIMEOUT_S, run_python

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
    rows = json_files.read_jsonl(path, fix=REBUILD_HINT, required=required,
                                 error="corrupt data file {path} (line {lineno} is not a JSON object with keys "
                                       "{required}): {fix}")
    if not rows:
        raise ValueError(f"corrupt data file {path} (empty): {REBUILD_HINT}")
    return rows


class Domain:
    """Shared by the three domains: splits from data/<name>_<split>.jsonl, or the paper's data when
    built with args (--data paper)."""
    name = ""
    TOOL_METHODS = ()
    REQUIRED = ("id",)
    # True: the paper's data has a harness split of its own, not drawn from train
    PAPER_HARNESS_SPLIT = False
    # True: the bundled data has one too (data/<name>_harness.jsonl), else HARNESS_SET_SIZE drawn from train
    HARNESS_FILE = False
    # the runner's caps on an episode, whatever its harness asks (docs/protocol.md section 3): past them llm()
    # returns '' without sampling, and the harness ends the episode with what it has
    MODEL_CALLS = 16
    MAX_RETRIES = None  # at most this many retries of each kind (chess: a reply with no move, an illegal move)
    OUT_OF_TOKENS_SCORES_ZERO = False  # an episode that asks for a call its token budget cannot hold scores 0
    # imports a harness of this domain is refused for with its own reason (lib/contract.py static_check; any
    # import outside ALLOWED_IMPORTS is refused anyway): BANNED_WHY.format(module=...)
    BANNED_IMPORTS, BANNED_WHY = (), ""
    # True: the report gives it a column even where it has no runs ("not run"), as the paper's table does
    REPORTED = True
    # what a proposer reads of the domain (lib/proposers.write_instructions): the caps in words, and its brief
    CAPS = "at most 16 model calls an episode"
    BRIEF = ""
    # the brief's rules on a round's candidates beyond "one mechanism, not a sweep of constants" (lib/briefs.py
    # INSTRUCTIONS, step 3): the paper's domains say what their official skill says (meta_harness/skills/*/SKILL.md,
    # docs/fidelity.md setting 4); these, the project's own, hold for any other domain
    SKILL_RULES = ("; the round's candidates test different mechanisms, each a falsifiable hypothesis tied to failures "
                   "seen in the traces. Do not stop early or call the current best optimal.")
    # the brief's words for what a proposer notes of the traces (step 2) and puts in a candidate's `hypothesis`
    # (step 3), and the `axis` it records where its skill names lettered axes (searchqa, math: pending_eval.json's
    # "axis", which evolution_summary.jsonl keeps and their axis rules read); chess's skill asks for failures and
    # one mechanism, never for hypotheses or an axis (docs/fidelity.json: brief_chess_wording, candidate_axis)
    NOTES_RULE = "falsifiable hypotheses about why episodes fail"
    HYPOTHESIS_RULE = "falsifiable: what will change in the score and why"
    AXIS_RULE = ""
    # what judges an answer, in words: summary.json records it and the report's table header shows it (None: a
    # domain with one verifier and nothing to tell apart says none)
    VERIFIER = None
    # what the verifier reads (--scoring; get() sets it): "last-message", the model's last assistant message with
    # the domain's own extraction (last_message_answer), as the official verifiers read it; or "answer", what the
    # harness's run() returned (docs/fidelity.md, "What the verifier reads")
    scoring = "answer"

    def __init__(self, data=None):
        self.data = data  # the paper data's flags (add_args'), as attributes; None: bundled data
        self.paper_splits = {}  # the paper's splits, loaded once (harness re-reads train)

    def verifier(self):
        return self.VERIFIER

    def scoring_rule(self):
        """What the verifier reads, in words: summary.json, the evaluations and the null-model scores record it,
        and the report names it beside the verifier."""
        return SCORING_RULES[self.scoring]

    def scored_answer(self, answer, last_message):
        """What the reward reads: the harness's returned `answer`, or under --scoring last-message the answer in
        the model's last assistant message (`last_message`: its text, '' when the model was never called)."""
        return answer if self.scoring == "answer" else self.last_message_answer(last_message)

    def last_message_answer(self, text):
        """The answer the official verifier reads in the model's last message: the message itself (math reads
        its last 100 characters, as the reward does for any answer); searchqa reads its innermost <answer>."""
        return text

    def scoring_brief(self):
        """The proposer brief's line on what the verifier reads (lib/briefs.py INSTRUCTIONS), as the official skills
        state their reward's input (the math skill: it "uses the last assistant message only")."""
        if self.scoring == "answer":
            return "The verifier reads the `answer` run() returns."
        return ("The verifier reads the model's last message: the text of the episode's last `llm()` reply, as the "
                "official verifier does; the `answer` run() returns is kept in the traces but not scored.")

    def load(self, split):
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r} for {self.name}: choose train, harness or "
                             f"test")
        if split == "harness" and self.data is None and self.HARNESS_FILE:
            return read_jsonl(self.bundled_file(split), self.REQUIRED)
        if split == "harness" and not (self.data is not None and self.PAPER_HARNESS_SPLIT):
            train = self.load("train")
            if len(train) <= HARNESS_SET_SIZE:
                return train
            return random.Random(HARNESS_SET_SEED).sample(train, HARNESS_SET_SIZE)
        if self.data is not None:
            if split not in self.paper_splits:
                self.paper_splits[split] = paper_data.paper_tasks(self.name, split, self.data)
            return self.paper_splits[split]
        return read_jsonl(self.bundled_file(split), self.REQUIRED)

    def bundled_file(self, split):
        return f"{self.name}_{split}.jsonl"

    # what every domain defines for itself: the episode runner (lib/episodes/runner.py) calls these three, and takes
    # the rest (TOOL_METHODS, the caps, scored_answer, scoring_rule, extract) from this class where a domain does not
    # set its own
    def public(self, task):
        """What a harness may see of `task` (its `task` argument), never the answer."""
        raise NotImplementedError

    def tools(self, task):
        """A fresh tool object for one episode of `task`, whose methods TOOL_METHODS lists (none: NoTools())."""
        raise NotImplementedError

    def reward(self, task, answer, tools):
        """0.0 or 1.0 for any answer value, never raising (a hostile or malformed answer scores 0)."""
        raise NotImplementedError

    def gold(self, task):
        """The gold answer in words, for `show` and for people reading traces."""
        raise NotImplementedError

    def gold_answer(self, task, tools):
        """An answer that earns reward 1, made through `tools` where the domain needs them (chess plays its
        line): the contract tests' proof that the reward can be earned (tests/test_domain_contract.py)."""
        raise NotImplementedError

    def extract(self, answer):
        """What the reward reads from an answer, None when nothing: kept in traces, never the gold answer."""
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        return answer.strip()[:200] if isinstance(answer, str) and answer.strip() else None


# what the verifier reads (--scoring), in the words summary.json and the report use
SCORING_RULES = {"last-message": "the model's last message", "answer": "the harness's answer"}


# -----------------------------------------------------------------------------
# SearchQA


# a flood guard only: whole passages come back, the harness cuts them (PASSAGE_WORDS)
MAX_PASSAGE_CHARS = 4000
# bounds on what an untrusted harness may ask of the shared retriever (officially the search payload passes the
# model's topk and query through whole: a stated deviation, docs/fidelity.md "search tool bounds")
MAX_SEARCH_K = 10
MAX_QUERY_CHARS = 2000


def normalize_answer(text):
    """SQuAD-style: lower case, no punctuation, no articles, white space folded."""
    text = str(text).lower()
    text = "".join(ch for ch in text if ch not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


@lru_cache(maxsize=1)
def searchqa_index():
    """(passages, bm25 retriever) over the bundled corpus, built once per process."""
    import bm25s  # here, not at the top: its import is slow, and math and chess need not pay for it
    docs = read_jsonl("searchqa_corpus.jsonl", ("title", "text"))
    passages = [f"{d['title']}: {d['text']}" for d in docs]
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(passages, stopwords="en", show_progress=False),
                    show_progress=False)
    return passages, retriever


class SearchTools:
    def __init__(self):
        self.passages, self.retriever = searchqa_index()

    def search(self, query, k=1):
        """Top-k passages "Title: text" for a query, each cut to MAX_PASSAGE_CHARS; k capped at MAX_SEARCH_K, the query
        cut to MAX_QUERY_CHARS."""
        import bm25s  # already loaded by searchqa_index
        k = max(1, min(k, MAX_SEARCH_K)) if isinstance(k, int) else 1
        tokens = bm25s.tokenize([str(query)[:MAX_QUERY_CHARS]], stopwords="en", return_ids=False,
                                show_progress=False)
        if not tokens[0]:
            return []
        ids, scores = self.retriever.retrieve(tokens, k=k, show_progress=False)
        return [self.passages[i][:MAX_PASSAGE_CHARS] for i, s in zip(ids[0], scores[0]) if s > 0]


class WikiSearchTools:
    """The paper's search tool: Wikipedia 2018 through the retrieval server or bm25s, passages cut as bundled ones."""

    def __init__(self, retriever):
        self.retriever = retriever

    def search(self, query, k=1):
        k = max(1, min(k, MAX_SEARCH_K)) if isinstance(k, int) else 1
        return [p[:MAX_PASSAGE_CHARS] for p in self.retriever.search(str(query)[:MAX_QUERY_CHARS], k)]


def innermost_answer(text):
    """The official extraction (S/environments/search_r1/env.py `_inner_most_extract`): the text between the last
    </answer> and the nearest <answer> before it, stripped; None when either tag is missing."""
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    return text[start + len("<answer>"):end].strip() if start >= 0 else None


def exact_match(answer, golds):
    """The official EM path: 1.0 when the normalised answer equals a normalised gold answer."""
    pred = normalize_answer(answer)
    return 1.0 if any(pred == normalize_answer(g) for g in golds) else 0.0


class SearchQA(Domain):
    name = "searchqa"
    TOOL_METHODS = ("search",)
    REQUIRED = ("id", "question", "answers")
    # after the official runs' proposer skill (meta_harness/skills/meta-harness-search-r1/SKILL.md)
    BRIEF = """Multi-turn factual question answering over an encyclopedia through `tools.search` (a retriever over
a fixed corpus, not a web search engine); the reward is exact match of the final answer, after normalisation,
with any gold answer (or an LLM judge's verdict, where the run uses one). Good candidates change a mechanism, on
one of these axes (if the last 3 iterations explored the same axis, pick different ones):
- A. the system prompt's structure (e.g. plan, search, verify, then answer);
- B. the user template;
- C. query rewriting before a search (decomposition, entity extraction, dropping filler words);
- D. retrieval parameters (passages per search, words per passage), together with how they are used;
- E. what the harness says back after a turn (how results are shown, a nudge when the model neither searches
  nor answers, feedback on a repeated query);
- F. the turn budget and when to stop.
Combining mechanisms of earlier candidates is fine, as are published patterns (ReAct, self-ask, IRCoT). Never
branch on question text, entities or the benchmark a question comes from. Where the harness gives the model a
tool schema (`TOOLS`), keep its name and its first parameter: the weights are trained under it."""
    # the skill's "For each candidate slot, form ONE falsifiable hypothesis tied to a specific failure mechanism you
    # observed. K slots -> K distinct hypotheses on different axes", and "Do not stop early"
    SKILL_RULES = ("; each tests one falsifiable hypothesis tied to a failure seen in the traces, and the round's "
                   "candidates test distinct hypotheses on different axes (A-F below). Do not stop early or call the "
                   "current best optimal.")
    AXIS_RULE = ", `axis` (the letter, A-F, of the axis below it explores)"
    judge = None  # lib.paper.judge.Judge with --judge-url, else exact match

    def verifier(self):
        """Exact match (the official code's default) or the LLM judge (the official docs'; docs/fidelity.md)."""
        return "exact match" if self.judge is None else f"LLM judge {self.judge.model}"

    def load(self, split):
        if split == "harness" and self.data is not None:  # the official builder's D_harness: NQ rows of D_weight
            return paper_data.searchqa_harness(self.load("train"))
        tasks = super().load(split)
        if self.data is None:  # the bundled set is one benchmark; the paper's tasks name theirs
            tasks = [{**t, "source": t.get("source", "synthetic")} for t in tasks]
        return tasks

    def public(self, task):
        return {"question": task["question"]}

    def tools(self, task):
        return SearchTools() if self.data is None else WikiSearchTools(self.wiki())

    def wiki(self):
        """The paper's retriever, made once: the retrieval server if given, else bm25s over --wiki."""
        if not hasattr(self, "retriever"):
            # one client or one loaded corpus per process
            if self.data.retriever_url or self.data.wiki:
                self.retriever = shared_retriever(self.data.retriever_url, self.data.wiki,
                                                  self.data.wiki_limit)
            else:
                raise ValueError("the paper's searchqa needs --retriever-url URL (Search-R1's "
                                 "retrieval server) or --wiki PATH (a wiki-18 .jsonl file for "
                                 "bm25s)")
        return self.retriever

    def reward(self, task, answer, tools=None):
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str) or not answer.strip():
            return 0.0  # no answer: 0, and the judge is not asked
        answer = answer[:10_000]
        em = exact_match(answer, task["answers"])
        if self.judge is None:
            return em
        return float(self.judge.verdict(task.get("question", ""), task["answers"], answer,
                                        fallback=em))

    def last_message_answer(self, text):
        """The official `correct_answer`: the innermost <answer> of the model's last assistant message."""
        return innermost_answer(text)

    def gold_answer(self, task, tools):
        return task["answers"][0]

    def gold(self, task):
        return " | ".join(task["answers"])


# -----------------------------------------------------------------------------
# Math


# the python tool's output with the paper's data: whole up to this many characters (a message's cap,
# lib/episodes/runner.py MAX_CHARS 32,000, less room for the cut's marker), so the paper h0 cuts it as the official
# training does (4,096 characters, head and tail: harnesses/paper/math.py MAX_OUTPUT_CHARS) and a candidate may keep
# more, as the official harness scoring does (every call's whole output); the bundled data keeps
# lib.episodes.python_tool.MAX_OUTPUT_CHARS (2,000), as its h0s were calibrated
PAPER_TOOL_OUTPUT_CHARS = 30_000


class PythonTools:
    def __init__(self, timeout_s=PYTHON_TIMEOUT_S, max_chars=MAX_OUTPUT_CHARS):
        self.timeout_s, self.max_chars = timeout_s, max_chars

    def python(self, code):
        """Run code; return its stdout and stderr (or an error text), cut to max_chars."""
        return run_python(code, timeout_s=self.timeout_s, max_chars=self.max_chars)


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


# math_dapo keeps the last 300 characters, then looks for the box in the last 100
MATH_TAIL_CHARS = 100


MATH_TEST_SETS = {"gsm8k": "math_test.jsonl", "generated": "math_test_generated.jsonl"}


class Math(Domain):
    name = "math"
    TOOL_METHODS = ("python",)
    REQUIRED = ("id", "question", "answer")
    VERIFIER = "the last \\boxed{} by string equality"
    # after the official runs' proposer skill (meta_harness/skills/meta-harness-retool/SKILL.md)
    BRIEF = """Math problems, with `tools.python` to run code; the reward reads the last `\\boxed{...}` of the final
answer and compares it with the gold answer as a string. Good candidates change a mechanism; useful axes:
- A. the system prompt's structure (e.g. plan, compute, check, answer);
- B. the user template: keep the problem as it is and keep the boxed-answer requirement;
- C. how the model's code is taken (which block, printing the last value);
- D. how the interpreter's output and errors are shown, and the nudges after an error;
- E. recovery when the model neither calls the tool nor answers;
- F. the turn budget and when to stop.
Never branch on problem text, numbers of a given problem or the dataset it comes from. Where the harness gives
the model a tool schema (`TOOLS`), keep its name and its first parameter (`code`)."""
    # the skill's "For each requested slot, form one falsifiable hypothesis tied to a failure mechanism you observed"
    # and "Do not stop early"; it has no rule on axes or on how a round's candidates differ
    SKILL_RULES = ("; each tests one falsifiable hypothesis tied to a failure seen in the traces. Do not stop early "
                   "or call the current best optimal.")
    AXIS_RULE = ", `axis` (the letter, A-F, of the axis below it explores)"
    python_timeout_s = PYTHON_TIMEOUT_S  # tests and quick runs may lower it on the instance
    # bundled test split: GSM8K originals, or "generated" (1-2 steps, held out from train)
    test_set = "gsm8k"
    # bundled train (and harness) problems of at most this many steps; None: all (1-4)
    max_steps = None

    def bundled_file(self, split):
        return MATH_TEST_SETS[self.test_set] if split == "test" else super().bundled_file(split)

    def load(self, split):
        tasks = super().load(split)
        if split == "train" and self.max_steps is not None:
            if any("steps" not in t for t in tasks):
                raise ValueError(f"--math-max-steps needs the generated problems' `steps` field, "
                                 f"missing in data/{self.bundled_file(split)}: {REBUILD_HINT}")
            tasks = [t for t in tasks if t["steps"] <= self.max_steps]
        return tasks

    def public(self, task):
        return {"question": task["question"]}

    def tools(self, task):
        return PythonTools(self.python_timeout_s, MAX_OUTPUT_CHARS if self.data is None else PAPER_TOOL_OUTPUT_CHARS)

    def reward(self, task, answer, tools=None):
        if not isinstance(answer, str):
            return 0.0
        # strict, as the official check: no normalisation at all, so "\\boxed{ 42 }" and "\\boxed{4
        # 2}" are not 42
        return 1.0 if last_boxed(answer[-MATH_TAIL_CHARS:]) == task["answer"] else 0.0

    def extract(self, answer):
        return last_boxed(answer[-MATH_TAIL_CHARS:]) if isinstance(answer, str) else None

    def gold_answer(self, task, tools):
        return f"The answer is \\boxed{{{task['answer']}}}"

    def gold(self, task):
        return task["answer"]


# -----------------------------------------------------------------------------
# Chess


def move_san(board, move, marks=False):
    """SAN as python-chess writes it with marks, else without the check and mate marks (+, #), so the view does not say
    which moves give mate (the bundled data's choice; the official observation keeps them)."""
    return board.san(move) if marks else board.san(move).rstrip("+#")


def board_view(board, marks=False):
    """What the agent sees of a position (the keys shared by public() and a move's "ok" answer)."""
    legal = list(board.legal_moves)
    return {"fen": board.fen(), "board": str(board), "legal_uci": [m.uci() for m in legal],
            "legal_san": [move_san(board, m, marks) for m in legal]}


class ChessTools:
    """One puzzle episode: the hidden line, the board, and whether it is over or solved."""

    def __init__(self, task, san_marks=False):
        self.san_marks = san_marks
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
            return {"status": "unparseable",
                    "message": f"{str(uci)[:40]!r} is not a UCI move like e2e4 or e7e8q"}
        if move not in self.board.legal_moves:
            return {"status": "illegal", "message": f"{move.uci()} is not legal in this position"}
        # the reference move only, as the official verifier: another mate too
        if move != self.line[self.next]:
            self.over = True
            return {"status": "wrong",
                    "message": f"{move.uci()} is not the best move; the puzzle is failed"}
        self.board.push(move)
        self.next += 1
        if self.next >= len(self.line):
            self.solved = self.over = True
            return {"status": "solved", "message": f"{move.uci()} is correct; the puzzle is solved"}
        reply = self.line[self.next]
        reply_san = move_san(self.board, reply, self.san_marks)
        self.board.push(reply)
        self.next += 1
        # a line that ends on the opponent's reply (the paper's filter allows one)
        if self.next >= len(self.line):
            self.solved = self.over = True
            return {"status": "solved",
                    "message": f"{move.uci()} is correct; the opponent replied {reply.uci()}; "
                    "the puzzle is solved", "opponent_move": reply.uci(), "opponent_san": reply_san}
        return {"status": "ok",
                "message": f"{move.uci()} is correct; the opponent replied {reply.uci()}",
                "opponent_move": reply.uci(), "opponent_san": reply_san,
                **board_view(self.board, self.san_marks)}


class Chess(Domain):
    name = "chess"
    TOOL_METHODS = ("move",)
    REQUIRED = ("id", "fen", "moves")
    VERIFIER = "the reference move"
    PAPER_HARNESS_SPLIT = True  # the official mh_val bucket, disjoint from train and test
    MODEL_CALLS, MAX_RETRIES = 18, 10  # the official runner: 2 x its 9 turns, each retry budget clamped to 10
    OUT_OF_TOKENS_SCORES_ZERO = True  # the official agent loop forces the reward to 0
    BANNED_IMPORTS = ("chess", "stockfish", "subprocess")
    BANNED_WHY = ("chess engine: imports {module}; a chess harness relays the model's move and never chooses one (no "
                  "chess library, engine or move search)")
    CAPS = ("at most 18 model calls a puzzle, and at most 10 retries of each kind (a reply that names no single "
            "valid move, a move that is not legal)")
    # after the official runs' proposer skill (meta_harness/skills/meta-harness-chess-puzzle/SKILL.md)
    BRIEF = """Chess puzzles: at each turn the model must name the one move of the puzzle's line; `tools.move` plays
it, then the opponent's reply. A legal move other than the line's ends the puzzle with 0.
The harness is a communication layer only. Hard bans (a candidate that breaks one is worthless even if it
scores):
- no chess library (`import chess` is refused) and no engine, tablebase or move search of any kind;
- no minimax, mate search, ranking of captures or checks, piece values, move ordering, or any other rule that
  chooses, ranks or filters moves;
- never turn a legal wrong move of the model into another move: a legal wrong move is the model's failure
  and stays final;
- no puzzle ids, positions, lines, ratings or themes written into the code.
What a candidate may do: present the visible position better (board, FEN, legal moves, history, the last
reply), parse the model's reply more robustly (tags, brackets, a bare move, promotion case, ambiguity),
check a move only against the legal moves shown, and retry a malformed or illegal move with short, clear
feedback. Weak changes: a word or punctuation, or a retry budget alone without better feedback.
Where the harness lists `RUNNER_OWNS` (the paper and gpu presets' chess h0, as the official runner), those names
are the runner's: its loop, the conversation and the verifier's messages stay exactly as they are, and a
candidate that changes one is refused; the prompts, the observation, the parser, the retry budgets and
MAX_TURNS are yours."""
    # the skill's workflow: separate the failures (malformed output, illegal output, legal wrong moves, token budget,
    # parser ambiguity), then "Choose one concrete mechanism"; it has no rule on axes, hypotheses or stopping early
    SKILL_RULES = ("; each is one concrete mechanism chosen from the failures the traces show (malformed or illegal "
                   "output, legal wrong moves, the token budget, an ambiguous parse).")
    # the skill's workflow, step 2: "Separate failures caused by malformed output, illegal output, legal wrong moves,
    # token budget, and parser ambiguity"; step 3: "Choose one concrete mechanism" (no hypotheses asked)
    NOTES_RULE = ("which failures the traces show (malformed output, illegal output, legal wrong moves, the token "
                  "budget, an ambiguous parse)")
    HYPOTHESIS_RULE = "the one mechanism and the failures it should reduce"
    san_marks = False  # --chess-san-marks: SAN with + and # (the paper and gpu presets)

    def public(self, task):
        board = chess.Board(task["fen"])
        first = chess.Move.from_uci(task["moves"][0])
        first_san = move_san(board, first, self.san_marks)
        board.push(first)
        return {**board_view(board, self.san_marks),
                "side": "white" if board.turn == chess.WHITE else "black", "last_move": first.uci(),
                "last_move_san": first_san}

    def tools(self, task):
        return ChessTools(task, self.san_marks)

    def scoring_rule(self):
        """Chess is scored by the moves the tools played, under every --scoring (the official runner's too)."""
        return "the moves played"

    def scored_answer(self, answer, last_message):
        return answer  # the reward reads the tools' moves, never a text: the trace keeps what run() returned

    def scoring_brief(self):
        return "The verifier reads the moves played through `tools.move`, never the answer run() returns."

    def reward(self, task, answer, tools):
        return 1.0 if getattr(tools, "solved", False) is True else 0.0

    def gold_answer(self, task, tools):
        for move in task["moves"][1::2]:  # the solver's moves; the tools play the opponent's replies
            tools.move(move)
        return None

    def gold(self, task):
        first, rating = task["moves"][0], task.get("rating")
        return " ".join(task["moves"][1:]) + f"   (opponent first: {first}; rating {rating})"


# -----------------------------------------------------------------------------
# the registry and the data flags

# -----------------------------------------------------------------------------
# Countdown: the fourth domain, and the template for a fork's own (README, "Adding a domain")

MAX_EXPRESSION_CHARS = 200
EXPRESSION_TOKEN = re.compile(r"\s*(\d+|[-+*/()])")


def countdown_value(expression, numbers):
    """The exact value (a Fraction) of an arithmetic expression over `numbers`, or None when it is not one: only
    whole numbers from `numbers`, each used at most once, +, -, *, / and parentheses, at most
    MAX_EXPRESSION_CHARS characters; a division by zero is None too. Parsed by a recursive descent over its
    tokens, never run as code."""
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        return None
    tokens, pos, end = [], 0, len(expression.rstrip())
    while pos < end:
        match = EXPRESSION_TOKEN.match(expression, pos)
        if not match:
            return None
        tokens.append(match.group(1))
        pos = match.end()
    try:
        value, rest = countdown_sum(tokens, Counter(numbers))
    except (ValueError, ZeroDivisionError, IndexError, RecursionError):
        return None
    return value if not rest else None


def countdown_sum(tokens, left):
    value, tokens = countdown_product(tokens, left)
    while tokens and tokens[0] in "+-":
        op, (other, tokens) = tokens[0], countdown_product(tokens[1:], left)
        value = value + other if op == "+" else value - other
    return value, tokens


def countdown_product(tokens, left):
    value, tokens = countdown_atom(tokens, left)
    while tokens and tokens[0] in "*/":
        op, (other, tokens) = tokens[0], countdown_atom(tokens[1:], left)
        value = value * other if op == "*" else value / other
    return value, tokens


def countdown_atom(tokens, left):
    """A number still left, or a parenthesised sum; `left` counts the numbers not used yet."""
    if tokens[0] == "(":
        value, rest = countdown_sum(tokens[1:], left)
        if not rest or rest[0] != ")":
            raise ValueError("unclosed parenthesis")
        return value, rest[1:]
    if not tokens[0].isdigit() or left[int(tokens[0])] < 1:
        raise ValueError(f"{tokens[0]} is not one of the numbers left")
    left[int(tokens[0])] -= 1
    return Fraction(int(tokens[0])), tokens[1:]


class NoTools:
    """A domain without tools: the harness has only the model."""


class Countdown(Domain):
    """Reach the target with the given numbers: each at most once, + - * / and parentheses. The answer is the
    expression (an "= target" after it is allowed); reward 1 when it is valid and its value is the target
    exactly. Bundled only (data/countdown_*.jsonl, built by data/build.py), with a harness split of its own."""
    name = "countdown"
    REQUIRED = ("id", "numbers", "target")
    VERIFIER = "the expression's exact value"
    HARNESS_FILE = True
    REPORTED = False  # not one of the paper's domains: a column in the report only where it ran
    # a search over expressions in code would answer without the model (the null-model check refuses it too)
    BANNED_IMPORTS = ("itertools",)
    BANNED_WHY = ("countdown: imports {module}; a countdown harness relays the model's expression and never "
                  "searches for one itself")
    BRIEF = """Countdown: reach the target number with the given numbers, each used at most once, and + - * / with
parentheses; the answer is the expression, and the reward is 1 only when it is valid and equals the target
exactly (fractions allowed on the way). There are no tools. Good candidates change a mechanism: the prompt's
structure (plan, try, check), worked examples, how the expression is read from the reply, or a retry that tells
the model which rule its last expression broke. Never compute, enumerate or search for an expression in the
harness's own code: the answer must be the model's."""

    def public(self, task):
        return {"numbers": task["numbers"], "target": task["target"]}

    def tools(self, task):
        return NoTools()

    def extract(self, answer):
        """The expression: the answer up to an '=', stripped."""
        if not isinstance(answer, str):
            return None
        return answer.split("=")[0].strip()[:MAX_EXPRESSION_CHARS + 1] or None

    def reward(self, task, answer, tools=None):
        value = countdown_value(self.extract(answer), task["numbers"])
        return 1.0 if value is not None and value == task["target"] else 0.0

    def gold_answer(self, task, tools):
        return task["solution"]

    def gold(self, task):
        return f"{task['solution']} = {task['target']}"


# the registry: a new domain adds its one line here (whale.py, rollout.py, rft.py, meta_harness.py, --check,
# plan.py, the report and the contract tests take the domains from it)
DOMAINS = {"searchqa": SearchQA, "math": Math, "chess": Chess, "countdown": Countdown}


def get(name, data=None, out=None):
    """A domain on the bundled data, or on the paper's data when `data` (add_args' flags: cli.Inputs.data)
    says --data paper; out: the run folder, where searchqa's judge keeps its cache."""
    if name not in DOMAINS:
        raise ValueError(f"unknown domain {name!r}: choose {', '.join(DOMAINS)} (a new one registers in domains.DOMAINS)")
    flags = SimpleNamespace(**(data or {}))
    paper = getattr(flags, "data", "bundled") == "paper"
    domain = DOMAINS[name](flags if paper else None)
    test_set = getattr(flags, "math_test_set", "gsm8k")
    if name == "math" and test_set != "gsm8k":
        if paper:
            raise ValueError(f"--math-test-set {test_set} is a bundled test split: with --data "
                             "paper the test set is --math-test (default AIME 2024 + 2025); "
                             "drop one of the two flags")
        domain.test_set = test_set
    max_steps = getattr(flags, "math_max_steps", None)
    if name == "math" and max_steps is not None:
        if paper:
            raise ValueError(f"--math-max-steps {max_steps} filters the bundled generated "
                             "problems: with --data paper the train set is --math-train; drop one "
                             "of the two flags")
        domain.max_steps = max_steps
    # the official verifiers read the model's last message: the default with the paper's data; the bundled h0s (cpu,
    # smoke) were built and calibrated to be scored on what they return (docs/fidelity.md)
    domain.scoring = getattr(flags, "scoring", None) or ("last-message" if paper else "answer")
    if name == "searchqa":
        domain.judge = judge_from_flags(flags, out)
    if name == "chess":
        domain.san_marks = getattr(flags, "chess_san_marks", False)
    return domain


def from_args(args):
    """The domain of a CLI's flags (--domain, the data flags, --out)."""
    return get(args.domain, data_of(args), getattr(args, "out", None))


def add_args(parser):
    """The data flags every CLI passes to get(): the paper's sets (lib/paper/paper_data.py), the bundled
    sets' options, and searchqa's judge (lib/paper/judge.py). -> their names (dests): what a run's
    cli.Inputs.data holds, so what its reuse and resume keys compare"""
    first = len(parser._actions)
    p = parser.add_argument_group(paper_data.DATA_GROUP)
    for flag, kw in paper_data.FLAGS:
        p.add_argument(flag, **kw)
    p.add_argument("--math-test-set", default="gsm8k", choices=sorted(MATH_TEST_SETS),
                   help="bundled math test split: the GSM8K originals, or generated 1-2 step "
                        "problems held out from train")
    p.add_argument("--math-max-steps", type=int, default=None, choices=range(1, 5),
                   metavar="{1..4}",
                   help="bundled math: train (and draw the harness set) on problems of at most N "
                        "steps only")
    p.add_argument("--scoring", default=None, choices=sorted(SCORING_RULES),
                   help="what the verifier reads: last-message (the model's last assistant message, with the "
                        "official extraction: searchqa its innermost <answer>, math its last \\boxed{} in the last "
                        "100 characters) or answer (what the harness's run() returns); default: last-message with "
                        "--data paper, as officially, else answer; chess is scored by the moves played either way")
    p.add_argument("--chess-san-marks", action="store_true",
                   help="chess: SAN with the check and mate marks + and #, as python-chess writes "
                        "it and the official observation shows it (the paper and gpu presets; "
                        "default: without them)")
    judge = parser.add_argument_group(JUDGE_GROUP)
    for flag, kw in JUDGE_FLAGS:
        judge.add_argument(flag, **kw)
    names = [a.dest for a in parser._actions[first:]]
    p.add_argument(paper_data.PAPER_WITH_BM25[0], **paper_data.PAPER_WITH_BM25[1])  # no result changes: no key
    return names


@cache
def data_flags():
    """The names of add_args' flags: what cli.Inputs.data holds."""
    return tuple(add_args(argparse.ArgumentParser()))


def data_of(args):
    """The data flags of a CLI's flags, as get() takes them."""
    return {k: getattr(args, k) for k in data_flags()}


def check_harness(args):
    """The domain's flags and the harness against its domain (a file that parses, defines run(), and
    calls only this domain's tools). -> the domain. --check runs it as its `harness` line."""
    domain = from_args(args)
    check_harness_fits(args.harness, args.domain, domain.TOOL_METHODS)
    return domain


def check_inputs(args, split="train"):
    """Every input of a run refused before any model loads, each error one line with its fix: the
    one check of whale.py, rft.py, meta_harness.py and rollout.py. The harness, the tools (the
    paper's retriever), the engine, the data of `split` read whole (a malformed row is an error
    now), the model. --check (lib/ops/preflight.py) runs the same checks and, where it can, asks
    more (the server, the hub). -> (domain, the split's tasks)"""
    from lib.backends.models import check_model  # here: the report imports this module without torch
    from lib.backends.policy import check_backend
    domain = check_harness(args)
    check_tools(args.domain, args)
    check_backend(args)
    tasks = domain.load(split)
    check_model(args.model)
    return domain, tasks


def check_tools(name, args):
    """The episode tools can be served, before any model loads: the paper's searchqa needs a retriever."""
    if name == "searchqa" and getattr(args, "data", "bundled") == "paper":
        check_retriever_flags(args)
