"""The paper's data, for `--data paper` only (domains.py's flags and Domain.load call in here): the hub
datasets through `datasets` (a GPU/paper extra, imported only when a hub name is read), parsed into tasks of
the bundled shape (searchqa's retrievers over Wikipedia 2018: lib/paper/retriever.py). Every dataset name is a flag
(add_args) and may be a local .jsonl / .csv / .parquet file, so runs work offline from copied files.
- searchqa: train = a seeded sample of Search-R1's merged NQ + HotpotQA set, the docs' 18,946 questions, each
  source keeping its share (the official builder is not public); test = its seven test sets from the FlashRAG
  collection (nq, triviaqa, popqa: test; hotpotqa, 2wikimultihopqa, musique: dev; bamboogle: test), a seeded
  100 per set, each task naming its set in `source`; harness = D_harness as the official builder draws it
  (searchqa_harness): 256 NQ rows of D_weight, seed 42.
- math: train = DAPO-Math-17K, its prompt as the release writes it (the official training prompt keeps DAPO's
  own "Answer: $Answer" instruction: the ReTool recipe adds its \\boxed line and the official prompt hook takes
  off only that line), one row per problem id: the release stores its 17,917 problems 100 times over; test =
  AIME 2024 + AIME 2025, 30 each, the bare problem.
- chess: Lichess puzzles (CC0), built as the official grpo_dataset.py does: the first move of `Moves` is the
  trigger, the solution is the rest (1-9 plies), every move legal, no rating filter, one puzzle per position,
  split by a hash of the position into disjoint harness / test-pool / train buckets; the test set is a seeded
  256 of the test pool.

    tasks = paper_tasks("math", "train", flags)      # flags: add_args' (domains.get gives them)
"""
import csv
import hashlib
import os
import random
from functools import lru_cache

import chess

from lib.common.argtypes import positive_int
from lib.common.json_files import read_jsonl
from lib.subsets import seeded_sample

SEARCHQA_TRAIN = "PeterJinGo/nq_hotpotqa_train"
SEARCHQA_TEST = "RUC-NLPIR/FlashRAG_datasets"
SEARCHQA_TEST_SETS = ("nq:test", "triviaqa:test", "popqa:test", "hotpotqa:dev", "2wikimultihopqa:dev",
                      "musique:dev", "bamboogle:test")
SEARCHQA_TEST_PER_SET = 100
SEARCHQA_TRAIN_SIZE = 18_946  # the official docs' D_weight (krafton-ai/WHALE docs/data.md; docs/protocol.md section 1); the hub set holds 169,615
MATH_TRAIN = "BytedTsinghua-SIA/DAPO-Math-17k"
MATH_TEST = ("Maxwell-Jia/AIME_2024:train", "yentinglin/aime_2025:train")
CHESS_PUZZLES = "Lichess/chess-puzzles"
PAPER_SPLIT_SEED = 0
# D_harness as the official builder writes it (krafton-ai/WHALE domains/search_qa/scripts/data_process/
# build_meta_harness_nq_256.py): NQ rows of the training set only, one per question, 256, seed 42. NQ is "nq"
# in the hub set, "searchR1_nq" in the official processed parquet
SEARCHQA_HARNESS_SOURCES = ("nq", "searchR1_nq")
SEARCHQA_HARNESS_SIZE = 256
SEARCHQA_HARNESS_SEED = 42
# chess, as the official grpo_dataset.py: buckets in its order (its mh_val is our harness split), seed 42
CHESS_BUCKETS = (("harness", 256), ("test", 1024), ("train", 16_384))
CHESS_TEST_SIZE = 256  # drawn from the test bucket; the official selection rule is not public
CHESS_SPLIT_SEED = 42
CHESS_MAX_PLIES = 9
CHESS_MAX_SCAN = 2_000_000  # rows of the stream read at most

# DAPO-Math-17K wraps every problem in this instruction, which the training prompt keeps as officially (these build
# the tests' and the dry run's fixtures)
DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your response should be of the form "
               "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
MALFORMED = "malformed data file {path}: line {lineno} is not a JSON object; fix or remove that line"


def read_rows(name, config=None, split="train", streaming=False):
    """Rows of a hub dataset (through `datasets`, imported only here) or of a local .jsonl/.csv/.parquet file; a
    local folder holds one file per config and split, as a hub snapshot of FlashRAG lays them out
    (<folder>/nq/test.jsonl)."""
    if os.path.isdir(name) and config:
        name = set_file(name, config, split)
        if not os.path.exists(name):
            raise FileNotFoundError(f"no {name} (or .parquet): the folder lacks the {config}:{split} file")
    if os.path.exists(name) and name.endswith((".jsonl", ".json")):
        return read_jsonl(name, error=MALFORMED)
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


def set_file(folder, config, split):
    """The file of one config and split in a local folder laid out as FlashRAG's snapshot: <folder>/<config>/<split>
    .jsonl, or .parquet; the .jsonl name when neither exists."""
    files = [os.path.join(folder, config, f"{split}.{ext}") for ext in ("jsonl", "parquet")]
    return next((f for f in files if os.path.exists(f)), files[0])


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
    text = text.strip()
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
    uid = row.get("id", row.get("ID", row.get("problem_idx", index)))
    return {"id": f"{source}-{uid}", "question": question, "answer": str(answer).strip(), "source": source}


def position_key(fen):
    """FEN piece placement + side to move: one puzzle per position, whatever the castling, clocks or move number."""
    return " ".join(fen.split()[:2])


def lichess_task(row):
    """A Lichess puzzle row (the puzzle CSV's columns) as a task, or None when a move is not legal. `fen` is the
    position before the trigger (the first of `Moves`, the opponent's), `moves` the trigger then the solution."""
    moves = row.get("Moves") or []
    moves = [str(m).lower() for m in (moves.split() if isinstance(moves, str) else moves) if str(m).strip()]
    fen = str(row.get("FEN") or "").strip()
    if not fen or len(moves) < 2:
        return None
    try:
        board = chess.Board(fen)
        for i, uci in enumerate(moves):
            move = chess.Move.from_uci(uci)
            if move not in board.legal_moves:
                return None
            board.push(move)
            if i == 0:
                start = board.fen()  # the position the solver sees
    except ValueError:
        return None
    themes = row.get("Themes") or []
    rating = row.get("Rating")
    return {"id": str(row.get("PuzzleId") or hashlib.sha256(f"{fen} {' '.join(moves)}".encode()).hexdigest()[:16]),
            "fen": fen, "moves": moves, "rating": int(rating) if str(rating).isdigit() else None,
            "themes": themes.split() if isinstance(themes, str) else list(themes), "game": row.get("GameUrl", ""),
            "position_key": position_key(start)}


def chess_bucket(key, buckets=CHESS_BUCKETS, seed=CHESS_SPLIT_SEED):
    """The bucket of a position key, as grpo_dataset.py computes it: sha256 of sha256(key + ":42")'s hex digest,
    its first 12 hex digits mod the buckets' total, the buckets laid end to end in their order."""
    split_key = hashlib.sha256(f"{key}:{seed}".encode()).hexdigest()
    point = int(hashlib.sha256(split_key.encode()).hexdigest()[:12], 16) % sum(n for _, n in buckets)
    for name, n in buckets:
        if point < n:
            return name
        point -= n


# -----------------------------------------------------------------------------
# loaders


def load_searchqa(split, train_name=SEARCHQA_TRAIN, test_name=SEARCHQA_TEST, test_sets=SEARCHQA_TEST_SETS,
                  per_set=SEARCHQA_TEST_PER_SET, train_size=SEARCHQA_TRAIN_SIZE, seed=PAPER_SPLIT_SEED):
    if split == "train":
        tasks = (searchqa_task(r, "train", i) for i, r in enumerate(read_rows(train_name, split="train")))
        # the docs' D_weight is a part of the merged set whose builder is not public: a seeded sample that keeps
        # the NQ / HotpotQA shares of the merged set
        return seeded_sample([t for t in tasks if t], train_size or None, seed, key="source")
    tasks = []
    for spec in test_sets:
        config, _, set_split = spec.partition(":")
        rows = [t for i, r in enumerate(read_rows(test_name, config, set_split or "test")) if (t := searchqa_task(r, config, i))]
        tasks += random.Random(f"{seed}-{config}").sample(rows, min(per_set, len(rows)))
    return tasks


def searchqa_harness(train, size=SEARCHQA_HARNESS_SIZE, seed=SEARCHQA_HARNESS_SEED):
    """searchqa's D_harness, as the official builder draws it: the NQ rows of D_weight (`train`), one per question,
    `size` of them drawn with `seed` (all when fewer). The builder keeps 128 earlier NQ rows (mh_nq_single_128, not
    public) and draws the other 128 with seed 42; here all 256 are drawn with it."""
    nq, seen = [], set()
    for task in train:
        if task["source"] in SEARCHQA_HARNESS_SOURCES and task["question"] not in seen:
            seen.add(task["question"])
            nq.append(task)
    if not nq:
        raise ValueError("--data paper: searchqa's harness set is the NQ rows of the train set (data_source "
                         f"{' or '.join(SEARCHQA_HARNESS_SOURCES)}), and it has none: pass a --searchqa-train with NQ rows")
    return nq if len(nq) <= size else random.Random(seed).sample(nq, size)


def load_math(split, train_name=MATH_TRAIN, test_names=MATH_TEST):
    if split == "train":
        # one row per problem id (extra_info.index): the release repeats its 17,917 problems 100 times, and
        # that count, the docs' D_weight, keeps the few problems whose text appears under two ids; a row
        # without an id is keyed by its text
        tasks, seen = [], set()
        for i, row in enumerate(read_rows(train_name, split="train")):
            task = dapo_task(row, i)
            key = task and (task["id"] if "index" in (row.get("extra_info") or {}) else task["question"])
            if task and key not in seen:
                seen.add(key)
                tasks.append(task)
        return tasks
    tasks = []
    for spec in test_names:
        name, _, name_split = spec.partition(":")
        source = os.path.basename(name).lower().replace(".", "-")
        tasks += [t for i, r in enumerate(read_rows(name, split=name_split or "train")) if (t := aime_task(r, source, i))]
    return tasks


@lru_cache(maxsize=4)
def chess_buckets(name=CHESS_PUZZLES, buckets=CHESS_BUCKETS, max_plies=CHESS_MAX_PLIES, max_scan=CHESS_MAX_SCAN):
    """{bucket: tasks} as grpo_dataset.py fills them: puzzles in the stream's order with 1..max_plies solution
    plies and a position not seen before go to their hash bucket, or, when it is full, to the first bucket in
    order that is not; the scan stops once every bucket is full. Built once per process for all three splits."""
    sizes, filled, seen, scanned = dict(buckets), {b: [] for b, _ in buckets}, set(), 0
    for row in read_rows(name, split="train", streaming=True):
        scanned += 1
        if scanned > max_scan:
            break
        task = lichess_task(row)
        if task is None or not 1 <= len(task["moves"]) - 1 <= max_plies or task["position_key"] in seen:
            continue
        bucket = chess_bucket(task["position_key"], buckets)
        if len(filled[bucket]) >= sizes[bucket]:
            bucket = next(b for b, n in buckets if len(filled[b]) < n)  # one is left: the scan stops when none is
        seen.add(task["position_key"])
        filled[bucket].append(task)
        if all(len(filled[b]) >= n for b, n in buckets):
            break
    short = {b: f"{len(filled[b])}/{n}" for b, n in buckets if len(filled[b]) < n}
    if short:
        raise ValueError(f"--chess-puzzles {name}: {scanned} rows give too few distinct legal puzzles for the "
                         f"splits ({', '.join(f'{b} {v}' for b, v in short.items())}): use the full puzzle set or "
                         "smaller --chess-train-size/--chess-harness-size/--chess-test-pool")
    return filled


def load_chess(split, name=CHESS_PUZZLES, buckets=CHESS_BUCKETS, test_size=CHESS_TEST_SIZE, max_plies=CHESS_MAX_PLIES):
    """The paper's chess split: train and harness are their buckets (harness shuffled with Random(42), as the
    official runner reads it), test a seeded test_size of the test bucket."""
    filled = chess_buckets(name, tuple(buckets), max_plies)
    if split == "test":
        return seeded_sample(filled["test"], test_size, CHESS_SPLIT_SEED)
    if split == "harness":
        tasks = list(filled["harness"])
        random.Random(CHESS_SPLIT_SEED).shuffle(tasks)
        return tasks
    return list(filled["train"])


# -----------------------------------------------------------------------------
# the flags: every dataset name, size and retriever

DATA_GROUP = ("data: bundled (offline, data/) or the paper's sets through `datasets` (a name may be a "
              "local file)")
BUCKETS = dict(CHESS_BUCKETS)  # the official split: its bucket sizes set the hash's modulus
# the --data switch and the paper data's flags, as (flag, argparse keywords): domains.add_args adds them
FLAGS = [
    ("--data", dict(default="bundled", choices=("bundled", "paper"))),
    ("--searchqa-train", dict(default=SEARCHQA_TRAIN, help="Search-R1's NQ + HotpotQA train set")),
    ("--searchqa-test", dict(default=SEARCHQA_TEST,
                             help="the collection holding the seven test sets, or a local copy: a folder "
                                  "with <config>/<split>.jsonl (or .parquet) per set, as FlashRAG's "
                                  "snapshot")),
    ("--searchqa-test-sets", dict(default=",".join(SEARCHQA_TEST_SETS), help="config:split, comma-separated")),
    ("--searchqa-test-per-set", dict(type=positive_int, default=SEARCHQA_TEST_PER_SET)),
    ("--searchqa-train-size", dict(type=int, default=SEARCHQA_TRAIN_SIZE,
                                   help="D_weight: a seeded sample of the train set keeping its NQ / "
                                        "HotpotQA shares (0: all of it)")),
    ("--retriever-url", dict(default=None, help="Search-R1's retrieval server, e.g. "
                             "http://127.0.0.1:8010/retrieve (scripts/search_r1_retriever.sh; "
                             "lib/paper/retriever.py)")),
    ("--wiki", dict(default=None, help="without a server: bm25s over this wiki-18 .jsonl file")),
    ("--wiki-limit", dict(type=positive_int, default=None, help="index only the first N passages of --wiki")),
    ("--math-train", dict(default=MATH_TRAIN)),
    ("--math-test", dict(default=",".join(MATH_TEST), help="name:split, comma-separated")),
    ("--chess-puzzles", dict(default=CHESS_PUZZLES, help="hub dataset or lichess_db_puzzle.csv")),
    ("--chess-max-plies", dict(type=positive_int, default=CHESS_MAX_PLIES, help="solution plies: 1..N")),
    ("--chess-train-size", dict(type=positive_int, default=BUCKETS["train"])),
    ("--chess-harness-size", dict(type=positive_int, default=BUCKETS["harness"])),
    ("--chess-test-pool", dict(type=positive_int, default=BUCKETS["test"], help="the test bucket")),
    ("--chess-test-size", dict(type=positive_int, default=CHESS_TEST_SIZE,
                               help="a seeded sample of the test bucket")),
]


# --preset paper refuses --wiki / --wiki-limit (lib/cli.py conflicting_flags) unless given this flag; not a data
# flag (domains.add_args leaves it out of data_flags): it changes no result, --wiki and --wiki-limit do
PAPER_WITH_BM25 = ("--paper-with-bm25", dict(action="store_true", help="--preset paper: search with bm25s over "
                   "--wiki instead of the official retriever (Search-R1's e5 server); a deviation (docs/fidelity.md)"))


# -----------------------------------------------------------------------------
# a domain's paper tasks, with add_args' dataset names and filters


def paper_tasks(name, split, flags):
    """The paper's train, test (or, for chess, harness) tasks of a domain, with the dataset names and sizes of
    add_args' flags (the data flags only, as attributes: cli.Inputs.data)."""
    if name == "searchqa":
        tasks = load_searchqa(split, flags.searchqa_train, flags.searchqa_test, flags.searchqa_test_sets.split(","),
                              flags.searchqa_test_per_set, flags.searchqa_train_size)
    elif name == "math":
        tasks = load_math(split, flags.math_train, flags.math_test.split(","))
    else:
        buckets = (("harness", flags.chess_harness_size), ("test", flags.chess_test_pool), ("train", flags.chess_train_size))
        tasks = load_chess(split, flags.chess_puzzles, buckets, flags.chess_test_size, flags.chess_max_plies)
    if not tasks:
        raise ValueError(f"--data paper: the {name} {split} data has no usable rows (every row lacks a question or "
                         f"an answer): check the {name} dataset flags (see --help)")
    return tasks
