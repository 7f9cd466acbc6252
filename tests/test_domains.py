"""Domains, bundled data, tools, rewards and the h0 harnesses.  python -m pytest -q tests/test_domains.py"""
import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time

import chess
import pytest

import domains

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
    with pytest.raises(ValueError, match="unknown domain 'nope': choose searchqa, math or chess"):
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
    return subprocess.run([sys.executable, "domains.py", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


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
    shutil.copy(os.path.join(ROOT, "sandbox.py"), tmp_path)  # domains.py imports it (the python tool's sandbox)
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
        # the legal moves are the board's own order: nothing ranks or marks the solution
        assert public["legal_uci"] == [m.uci() for m in board.legal_moves]


@pytest.mark.parametrize("name", ["searchqa", "math", "chess"])
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


def test_search_tool_limits():
    tools = domains.get("searchqa").tools({})
    assert len(tools.search("city founded river", 50)) == domains.MAX_SEARCH_K
    assert tools.search("the of a") == [] and tools.search("") == [] and tools.search("qqqzzz") == []
    assert all(len(p) <= domains.MAX_PASSAGE_CHARS for p in tools.search("city", 10))
    assert len(tools.search("Veipouthrous capital", "3")) == 1  # a k that is not an int means 1


def test_search_index_loads_fast():
    domains.searchqa_index.cache_clear()
    start = time.time()
    domains.get("searchqa").tools({}).search("country capital", 3)
    assert time.time() - start < 5

# -----------------------------------------------------------------------------
# Math


@pytest.mark.parametrize("answer,gold,expected", [
    ("\\boxed{18}", "18", 1.0),
    ("so the answer is \\boxed{18}.", "18", 1.0),
    ("\\boxed{ 18 }", "18", 1.0),                                   # spaces removed
    ("\\boxed{1,234}", "1234", 1.0),                                # thousands separator
    ("\\boxed{1,234,567}", "1234567", 1.0),
    ("\\boxed{12,34}", "1234", 0.0),                                # not a thousands separator
    ("\\boxed{17} then \\boxed{18}", "18", 1.0),                    # the last box counts
    ("\\boxed{18} then \\boxed{17}", "18", 0.0),
    ("\\boxed{18} but on reflection the answer is 17", "18", 1.0),  # a box outside the final part still counts
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
    ("\\boxed{1 000}", "1000", 1.0),
    ("\\boxed{18}\n\\boxed{ 1,000 }", "1000", 1.0),
])
def test_math_reward(answer, gold, expected):
    assert domains.get("math").reward({"answer": gold}, answer, None) == expected


def test_math_gold_answers_match_their_own_box():
    d, tasks = all_tasks("math")
    for t in tasks:
        assert d.reward(t, f"\\boxed{{{t['answer']}}}", None) == 1.0


def child_pids():
    """Processes whose parent is this test process (read from /proc: no helper process of our own)."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
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
    start = time.time()
    out = domains.run_python(code, timeout_s=3)
    assert re.search(expected, out) and time.time() - start < 6
    assert domains.run_python("print(6 * 7)", timeout_s=3) == "42\n"  # the caller is unharmed
    assert child_pids() == []  # nothing left running, not even a zombie


def test_python_tool_output():
    tools = domains.get("math").tools({})
    assert tools.python("import math\nprint(math.comb(10, 3))") == "120\n"
    assert "ZeroDivisionError" in tools.python("print(1 / 0)")
    assert "SyntaxError" in tools.python("print(")
    assert tools.python(12) == "error: code must be a string"
    assert len(tools.python("print('x' * 100000)")) < domains.MAX_OUTPUT_CHARS + 100
    assert "killed" in domains.run_python("import os\nos.abort()", timeout_s=3)
    d = domains.get("math")
    d.python_timeout_s = 3  # how tests and smoke runs shorten the 30 s limit
    assert d.tools({}).timeout_s == 3

# -----------------------------------------------------------------------------
# Chess


def solver_moves(task):
    return task["moves"][1::2]


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
        wrong = next(m for m in board.legal_moves if m != expected and not domains.gives_mate(board, m))
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


def test_chess_alternative_mate_is_accepted():
    d, tasks = all_tasks("chess")
    found = 0
    for t in tasks:
        board = chess.Board(t["fen"])
        for uci in t["moves"][:-1]:
            board.push_uci(uci)
        last = chess.Move.from_uci(t["moves"][-1])
        if not domains.gives_mate(board, last):
            continue
        mates = [m for m in board.legal_moves if m != last and domains.gives_mate(board, m)]
        if mates:
            tools = d.tools(t)
            for uci in solver_moves(t)[:-1]:
                tools.move(uci)
            assert tools.move(mates[0].uci())["status"] == "solved" and d.reward(t, None, tools) == 1.0
            found += 1
    assert found >= 10


# -----------------------------------------------------------------------------
# h0 harnesses: contract, scripted runs


@pytest.mark.parametrize("name", ["searchqa", "math", "chess"])
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
        assert knob in knobs and isinstance(knobs[knob].value, ast.Constant)  # NAME = literal, for mutate
        assert getattr(h, knob) in values and len(values) >= 2


class ScriptedLLM:
    def __init__(self, replies):
        self.replies, self.calls = list(replies), []

    def __call__(self, messages, max_tokens=None):
        self.calls.append(messages)
        return self.replies.pop(0)


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
