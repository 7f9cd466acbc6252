"""Bad input gets a one-line error before any work starts, with no traceback (issue 12, item 8): bad flags in
every CLI that has them, malformed data files, damaged run folders.  python -m pytest -q tests/test_cli_errors.py

Most cases call each CLI's main in-process (its imports are paid once); two subprocess runs check the exit code,
the single stderr line and the absence of a traceback end to end."""
import hashlib
import importlib.util
import json
import os
import subprocess
import sys

import pytest

import domains
import meta_harness
import rft
import report
import rollout
import whale
from scripts import show_data
from lib.common.errors import SandboxError
from lib.run_folder import files, ledger
from lib.run_folder.store import Store
from lib.backends.canary import EngineError
from lib.cli import one_line_errors
from lib.contract import check_harness_fits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATH = os.path.join(ROOT, "harnesses", "math.py")


def as_cli(cli, main):
    """main(bad) run as `python cli ...` would: argparse names the program after sys.argv[0]."""
    def call(argv):
        old = sys.argv
        sys.argv = [cli, *argv]
        try:
            return main(argv)
        finally:
            sys.argv = old
    return call


def run_rollout(argv):
    return as_cli("rollout.py", lambda _: rollout.main())(argv)


# each CLI's main with the arguments it requires, then the bad flag
CLIS = {
    "rollout.py": lambda bad: run_rollout(["--domain", "math", "--harness", MATH, *bad]),
    "rft.py": as_cli("rft.py", lambda bad: rft.main(["--domain", "math", "--harness", MATH, "--out", "/nonexistent", *bad])),
    "meta_harness.py": as_cli("meta_harness.py", lambda bad: meta_harness.main(
        ["--domain", "math", "--harness", MATH, "--out", "/nonexistent", *bad])),
    "whale.py": as_cli("whale.py", lambda bad: whale.main(["--domain", "math", "--harness", MATH, "--out", "/nonexistent", *bad])),
}
BAD_FLAGS = [  # (flag, value, the CLIs that have it)
    ("--k", "0", ("rollout.py", "whale.py")), ("--k", "-3", ("rollout.py", "whale.py")),
    ("--limit", "0", ("rollout.py",)), ("--limit", "-1", ("rollout.py",)),
    ("--test-limit", "0", ("whale.py",)),
    ("--harness-tasks", "0", ("meta_harness.py", "whale.py")), ("--harness-tasks", "-1", ("meta_harness.py", "whale.py")),
    ("--rounds", "-1", ("meta_harness.py",)),
    ("--candidates", "-2", ("meta_harness.py", "whale.py")),
    ("--harness-samples", "0", ("meta_harness.py", "whale.py")),
    ("--deadline", "0", tuple(CLIS)), ("--deadline", "-1", tuple(CLIS)),
    ("--temperature", "-1", tuple(CLIS)),
    ("--max-new-tokens", "0", tuple(CLIS)),
    ("--micro-batch", "0", ("rft.py", "whale.py")),
    ("--k", "two", ("rollout.py", "whale.py")), ("--deadline", "nan", ("whale.py",)),
]


@pytest.mark.parametrize("flag,value,clis", BAD_FLAGS, ids=[f"{f}={v}" for f, v, _ in BAD_FLAGS])
def test_bad_flag_is_a_one_line_error_in_every_cli(flag, value, clis, capsys):
    for cli in clis:
        with pytest.raises(SystemExit) as e:
            CLIS[cli]([flag, value])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, (cli, err)
        assert err.startswith(f"{cli}: error: argument {flag}") and value in err, (cli, err)


def test_the_cli_exits_with_one_line_and_no_traceback():
    """End to end for whale.py (each subprocess pays the torch import; the other CLIs share Parser)."""
    out = subprocess.run([sys.executable, "whale.py", "--domain", "math", "--harness", MATH, "--k=0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr == "whale.py: error: argument --k: must be >= 1, got 0\n"


# -----------------------------------------------------------------------------
# malformed data files

def test_malformed_bundled_data_names_the_file_and_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(domains, "DATA_DIR", str(tmp_path))
    (tmp_path / "math_train.jsonl").write_text('{"id": "a", "question": "q", "answer": "1"}\n{"id": "b", "quest\n')
    (tmp_path / "math_test.jsonl").write_text('{"id": "t", "question": "q", "answer": "1"}\n')
    for cli, argv in [("whale.py", ["--preset", "smoke", "--out", str(tmp_path / "w")]),
                      ("rft.py", ["--out", str(tmp_path / "r")]), ("meta_harness.py", ["--out", str(tmp_path / "m")])]:
        with pytest.raises(SystemExit) as e:
            CLIS[cli](argv)
        assert str(e.value.code).startswith(f"{cli}: error: corrupt data file {tmp_path}/math_train.jsonl (line 2 ")
    with pytest.raises(SystemExit) as e:
        CLIS["rollout.py"](["--split", "train"])
    assert "math_train.jsonl (line 2" in str(e.value.code) and "\n" not in str(e.value.code)
    assert not (tmp_path / "w" / "evals").exists()  # nothing ran


def test_malformed_paper_data_file_names_the_file_and_line(tmp_path):
    bad = tmp_path / "dapo.jsonl"
    bad.write_text('{"prompt": "1 + 1?", "answer": "2"}\n[1, 2]\n')
    with pytest.raises(SystemExit) as e:
        CLIS["rollout.py"](["--split", "train", "--data", "paper", "--math-train", str(bad)])
    assert str(e.value.code) == (f"rollout.py: error: malformed data file {bad}: line 2 is not a JSON object; "
                                 "fix or remove that line")

# -----------------------------------------------------------------------------
# damaged run folders: an error naming the file and what to do, never a silent restart


PHASE_0_ROW = {"event": "eval", "phase": 0, "kind": "start", "step": 0, "weights": "base", "rollouts": 0,
               "mean_at_k": 0.0, "stored": {"evaluation": {"weights": "base", "harness": "x", "config": "y"}}}


def test_whale_rows_that_name_work_the_store_lacks(tmp_path):
    """metrics.jsonl and the store are the run's state: rows that name a store item the store no longer holds, or a
    row cut by a kill, are one line naming the file and the fix."""
    out = tmp_path / "run"
    out.mkdir()
    start = {"event": "start", "weight_steps": 8, "harness_rounds": 3, "h0": files.file_sha(MATH), "unconfined": False}
    (out / "metrics.jsonl").write_text(json.dumps(start) + "\n" + json.dumps(PHASE_0_ROW) + "\n")
    ledger.check_run_folder(str(out), MATH, False)  # the rows read back
    with pytest.raises(SystemExit) as e:
        CLIS["whale.py"](["--out", str(out)])
    item = Store(tmp_path / "store").item("evaluation", PHASE_0_ROW["stored"]["evaluation"])
    assert str(e.value.code) == (f"whale.py: error: {out}/metrics.jsonl names {item}, which the store no longer "
                                 f"holds (deleted, or made by another version of the code): move {out} aside (mv "
                                 f"{out} {out}.old) and rerun to start the run over")
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"event": "ev')
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 3 is not a JSON object: .*delete that line"):
        ledger.check_run_folder(str(out), MATH, False)


# -----------------------------------------------------------------------------
# issue 25: every bad input is one line, `PROG: error: message`, and a refused input changes no run folder


SEARCHQA = os.path.join(ROOT, "harnesses", "searchqa.py")


def listing(folder):
    """Every path under folder with its content hash: what a refused input must leave as it was."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder"
            for p in sorted(folder.rglob("*"))} if folder.exists() else None


def refused(cli, argv, words, capsys, folder=None):
    """CLIS[cli](argv) stops with one line `cli: error: ...` holding `words` (argparse's exit 2, the others 1),
    nothing else on stderr, no traceback, and `folder` unchanged. -> the line"""
    before = listing(folder) if folder else None
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        CLIS[cli](argv)
    err = capsys.readouterr().err
    line = err.strip() if e.value.code == 2 else str(e.value.code)
    assert e.value.code == 2 or (isinstance(e.value.code, str) and err == ""), (cli, e.value.code, err)
    assert line.startswith(f"{cli}: error: ") and "\n" not in line and words in line, (cli, line)
    if folder:
        assert listing(folder) == before, cli
    return line


def test_one_place_turns_the_project_errors_into_one_line():
    for error in (ValueError("bad value\nsecond line"), FileNotFoundError(2, "No such file or directory", "x.json"),
                  PermissionError(13, "Permission denied", "/root/x"), IsADirectoryError(21, "Is a directory", "d"),
                  NotADirectoryError(20, "Not a directory", "f/x"), OSError(30, "Read-only file system", "/ro"),
                  SandboxError("no sandbox here"), EngineError("engine serves stale weights"),
                  ModuleNotFoundError("No module named 'vllm'", name="vllm")):
        with pytest.raises(SystemExit) as e:
            with one_line_errors("prog.py"):
                raise error
        assert str(e.value.code).startswith("prog.py: error: ") and "\n" not in str(e.value.code), error
    assert str(e.value.code) == ("prog.py: error: No module named 'vllm': vllm is an optional package (pip install "
                                 "-r requirements-gpu.txt, or see README)")
    with pytest.raises(KeyError):  # a bug keeps its traceback
        with one_line_errors("prog.py"):
            raise KeyError("bug")


NOT_FINITE = [  # (flag, value, the CLIs that have it): accepted silently or an OverflowError before
    ("--epochs", "inf", ("whale.py",)), ("--phase-epochs", "inf", ("whale.py",)),
    ("--adaptive-epochs", "inf", ("whale.py",)), ("--temperature", "inf", tuple(CLIS)),
    ("--lr", "inf", ("rft.py", "whale.py")), ("--deadline", "inf", tuple(CLIS)),
    ("--proposer-timeout", "inf", ("meta_harness.py", "whale.py")),
    ("--gpu-memory", "-1", tuple(CLIS)), ("--gpu-memory", "1.5", tuple(CLIS)), ("--max-model-len", "0", tuple(CLIS)),
    ("--max-lora-rank", "-4", tuple(CLIS)), ("--openai-workers", "0", tuple(CLIS)), ("--wiki-limit", "-1", tuple(CLIS)),
    ("--lora-dropout", "1", ("rft.py", "whale.py")), ("--seed", "-1", tuple(CLIS)),
    ("--chess-test-size", "0", tuple(CLIS)),
]


@pytest.mark.parametrize("flag,value,clis", NOT_FINITE, ids=[f"{f}={v}" for f, v, _ in NOT_FINITE])
def test_every_number_is_range_checked_and_finite(flag, value, clis, capsys):
    for cli in clis:
        refused(cli, [flag, value], f"argument {flag}: must be", capsys)


def test_domains_show_refuses_a_negative_count(capsys):
    with pytest.raises(SystemExit) as e:
        as_cli("show_data.py", show_data.main)(["show", "searchqa", "-n", "-1"])
    assert e.value.code == 2 and capsys.readouterr().err == "show_data.py show: error: argument -n: must be >= 1, got -1\n"


def test_every_h0_fits_its_own_domain_only():
    """Each tool-using h0 against every other domain: refused, naming both tool sets (countdown's h0 calls no
    tool, so it fits any domain's; the others call theirs)."""
    for harness in domains.DOMAINS:
        for name, domain in domains.DOMAINS.items():
            path = os.path.join(ROOT, "harnesses", f"{harness}.py")
            if name == harness or not domains.DOMAINS[harness].TOOL_METHODS:
                check_harness_fits(path, name, domain.TOOL_METHODS)
            elif not domain.TOOL_METHODS:
                with pytest.raises(ValueError, match=rf"calls tools\.{domains.DOMAINS[harness].TOOL_METHODS[0]}, "
                                                     rf"but {name} offers no tools"):
                    check_harness_fits(path, name, domain.TOOL_METHODS)
            else:
                with pytest.raises(ValueError, match=rf"calls tools\.{domains.DOMAINS[harness].TOOL_METHODS[0]}, but "
                                                     rf"{name} offers tools\.{domain.TOOL_METHODS[0]}"):
                    check_harness_fits(path, name, domain.TOOL_METHODS)


def test_a_harness_is_checked_against_its_domain_before_any_model_loads(tmp_path, capsys):
    bad = {"syntax.py": ("def run(task, llm, tools)\n    pass\n", "syntax.py:1: syntax error"),
           "norun.py": ("def solve(task):\n    return {'answer': 1}\n", "no top-level function run"),
           "text.py": ("def run(task, llm, tools):\n    return 'an answer'\n", "run() returns 'an answer', not a dict"),
           "keys.py": ("def run(task, llm, tools):\n    return {'reply': llm([])}\n", "not a dict with an 'answer' key"),
           "latin1.py": (b"# caf\xe9\ndef run(task, llm, tools):\n    return {'answer': 1}\n", "cannot read the harness")}
    for name, (source, _) in bad.items():
        (tmp_path / name).write_bytes(source if isinstance(source, bytes) else source.encode())
    for cli in CLIS:
        refused(cli, ["--domain", "chess", "--harness", SEARCHQA], "harnesses/searchqa.py:121: calls tools.search, "
                "but chess offers tools.move: pass a chess harness such as harnesses/chess.py", capsys)
        for name, (_, words) in bad.items():
            refused(cli, ["--harness", str(tmp_path / name)], words, capsys)
        refused(cli, ["--harness", str(tmp_path)], f"{tmp_path}", capsys)  # a folder: no such harness file


CONFLICTS = [  # (flags, words, the CLIs that have them)
    (["--method", "weight-only", "--prompt-only"], "--prompt-only limits the harness search", ("whale.py",)),
    (["--proposer-cmd", "agent {workdir}"], "--proposer-cmd is the command of --proposer command",
     ("meta_harness.py", "whale.py")),
    (["--data", "paper", "--retriever-url", "http://x", "--wiki", "w.jsonl"], "give one of them", tuple(CLIS)),
    (["--wiki", "w.jsonl"], "add --data paper", tuple(CLIS)),
    (["--backend", "vllm", "--lora-rank", "128", "--max-lora-rank", "64"], "--lora-rank 128 is above --max-lora-rank 64",
     ("rft.py", "whale.py")),
    (["--openai-model", "m"], "--openai-model names the served model of --backend openai", tuple(CLIS)),
    (["--schedule", "adaptive", "--harness-min-iterations", "5", "--harness-max-iterations", "2"],
     "--harness-min-rounds 5 is above --harness-max-rounds 2", ("whale.py",)),
]


@pytest.mark.parametrize("flags,words,clis", CONFLICTS, ids=[c[0][0] for c in CONFLICTS])
def test_flags_that_contradict_each_other_are_refused(flags, words, clis, capsys):
    for cli in clis:
        refused(cli, flags, words, capsys)


def test_an_out_folder_nothing_can_be_written_in(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for cli in CLIS:
        refused(cli, ["--out", str(tmp_path / "file")], f"{tmp_path}/file is a file, not a folder", capsys)
        refused(cli, ["--out", str(tmp_path / "file" / "run")], f"{tmp_path}/file is a file, not a folder", capsys)
        refused(cli, ["--out", "/proc/whale-run"], "--out /proc/whale-run: cannot write in /proc", capsys)
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "locked").mkdir(mode=0o500)
        for cli in CLIS:
            refused(cli, ["--out", str(tmp_path / "locked" / "run")], "cannot write in", capsys)


def test_unreadable_data_file_and_a_batch_beyond_the_training_set(tmp_path, monkeypatch, capsys):
    refused("whale.py", ["--preset", "smoke", "--batch", "100"], "--batch 100 does not fit the train split of math "
            "(8 prompts): use 1 <= --batch <= 8", capsys)
    refused("rft.py", ["--batch", "100000"], "--batch 100000 does not fit the train split of math", capsys)
    monkeypatch.setattr(domains, "DATA_DIR", str(tmp_path))
    (tmp_path / "math_train.jsonl").mkdir()  # there, but not a file that reads
    for cli in CLIS:
        refused(cli, ["--split", "train"] if cli == "rollout.py" else [], f"{tmp_path}/math_train.jsonl: Is a directory",
                capsys)


def test_a_resume_with_another_model_is_refused_and_changes_nothing(tmp_path, capsys):
    """rft.py and meta_harness.py resume a folder only on the model its config.json names (whale.py: its config.json,
    tests/test_whale.py); other settings are another key of their store (tests/test_meta_harness.py)."""
    for cli in ("rft.py", "meta_harness.py"):
        out = tmp_path / cli
        out.mkdir()
        (out / "config.json").write_text(json.dumps({"model": "smoke"}))
        refused(cli, ["--model", "cpu", "--out", str(out)], f"{out} was run on model 'smoke', not 'cpu'", capsys,
                folder=out)


def test_a_model_or_engine_that_is_not_here(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for cli in CLIS:
        refused(cli, ["--model", "no/such-model"], "--model no/such-model: not in this machine's hub cache, and HF_HUB_OFFLINE=1", capsys)
        refused(cli, ["--model", "./no/such/folder"], "no such folder", capsys)
        if importlib.util.find_spec("vllm") is None:
            refused(cli, ["--backend", "vllm"], "--backend vllm: the vllm package is not installed here", capsys)


def test_the_paper_searchqa_needs_a_retriever_before_any_model_loads(tmp_path, capsys):
    (tmp_path / "wiki.txt").write_text("Kelmar is a city.\n")
    for cli in CLIS:
        argv = ["--domain", "searchqa", "--harness", SEARCHQA, "--data", "paper"]
        refused(cli, argv, 'or leave searchqa out (run_all.sh: DOMAINS="math chess")', capsys)
        refused(cli, argv + ["--wiki", str(tmp_path / "wiki.txt")], "is not a wiki-18 .jsonl or .jsonl.gz file",
                capsys)


def test_report_on_a_damaged_summary_or_an_empty_preset_folder(tmp_path, capsys):
    CLIS["report.py"] = as_cli("report.py", report.main)
    try:
        (tmp_path / "cpu").mkdir()
        refused("report.py", ["--results", str(tmp_path), "--preset", "cpu"], f"no runs in {tmp_path}/cpu (no "
                "<domain>/<method>/metrics.jsonl): run `PRESET=cpu bash run_all.sh`", capsys, folder=tmp_path)
        refused("report.py", ["--results", str(tmp_path), "--preset", "paper"], f"no results in {tmp_path}/paper",
                capsys)
        run = tmp_path / "cpu" / "math" / "whale"
        (run / "evals").mkdir(parents=True)
        (run / "metrics.jsonl").write_text(json.dumps({"event": "eval", "phase": 0, "rollouts": 0, "mean_at_k": 0.5,
                                                       "kind": "start", "test_tasks": 2}) + "\n")
        (run / "summary.json").write_text('{"k": 2, "best_pha')
        refused("report.py", ["--results", str(tmp_path), "--preset", "cpu"], f"damaged run file {run}/summary.json: "
                "rerun the run's whale.py command", capsys, folder=tmp_path)
        (run / "summary.json").write_text("[1, 2]")
        refused("report.py", ["--results", str(tmp_path), "--preset", "cpu"], "not the summary of the phases", capsys)
    finally:
        del CLIS["report.py"]


def test_a_refused_input_is_one_line_end_to_end():
    """One subprocess for the path of one_line_errors (exit 1), as test_the_cli_exits_with_one_line_and_no_traceback
    is for argparse's (exit 2)."""
    out = subprocess.run([sys.executable, "rft.py", "--domain", "chess", "--harness", "harnesses/searchqa.py",
                          "--out", "/proc/x"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stderr == ("rft.py: error: --out /proc/x: cannot write in /proc (No such file "
                                                  "or directory): pass a folder you can write to\n"), out.stderr
