"""The paper's data, for `--data paper` only (domains.py's flags and Domain.load call in here): the hub
datasets through `datasets` (a GPU/paper extra, imported only when a hub name is read), parsed into tasks of
the bundled shape, and the retrievers over Wikipedia 2018 for searchqa. Every dataset name is a flag and may
be a local .jsonl / .csv / .parquet file, so runs work offline from copied files.
- searchqa: train = Search-R1's NQ + HotpotQA; test = its seven test sets from the FlashRAG collection
  (nq, triviaqa, popqa: test; hotpotqa, 2wikimultihopqa, musique: dev; bamboogle: test), a seeded 100
  per set = 700 questions; search = Search-R1's retrieval server (e5 over Wikipedia 2018,
  --retriever-url) or, without one, bm25s over a wiki-18 .jsonl file (--wiki).
- math: train = DAPO-Math-17K (its prompt template stripped, repeats dropped); test = AIME 2024 + 2025.
- chess: Lichess puzzles (CC0) in a rating band with 1..N solver moves; seeded disjoint train/test.

    tasks = paper_tasks("math", "train", args)       # args: domains.add_args' flags
"""
import csv
import json
import os
import random
import urllib.error
import urllib.request

from lib.io import read_jsonl

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
MALFORMED = "malformed data file {path}: line {lineno} is not a JSON object; fix or remove that line"


def read_rows(name, config=None, split="train", streaming=False):
    """Rows of a hub dataset (through `datasets`, imported only here) or of a local .jsonl/.csv/.parquet file."""
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
            for lineno, line in enumerate(f, 1):
                if limit and len(self.passages) >= limit:
                    break
                try:
                    self.passages.append(passage_text(json.loads(line)["contents"]))
                except (ValueError, TypeError, KeyError):
                    raise ValueError(f"wiki corpus {path}: line {lineno} is not a JSON object with a 'contents' "
                                     "string: fix or remove that line") from None
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


# -----------------------------------------------------------------------------
# a domain's paper tasks, with domains.add_args' dataset names and filters


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
