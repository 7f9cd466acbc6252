"""A run folder's progress is its rows (metrics.jsonl) and the store beside it: a whale smoke run stopped right before
RSFT step 3 (as a kill during "rft step 3 rollouts"), copied, one file damaged or deleted, then the same command on
the copy. A damaged row is one line naming the file and the fix, and the folder is left exactly as it was; any
other file of a finished phase is copied back from the store, so the result is the undamaged resume's.
    python -m pytest -q tests/test_run_folder.py

The stand-in runner of tests/test_whale.py (rewards from the task, the sample and the seed) keeps it fast and
exactly repeatable; RSFT really updates the smoke model's adapter."""
import hashlib
import json
import os
import shutil

import pytest

import whale
from test_whale import HARNESS, Interrupt, fake_episodes, interrupt, record


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """-> (argv, the killed run folder, the record of its undamaged resume, that finished run's folder), built once
    for the module."""
    base = tmp_path_factory.mktemp("runs")
    (base / "h0.py").write_text(HARNESS)
    argv = ["--domain", "math", "--preset", "smoke", "--harness", str(base / "h0.py"), "--test-limit", "3", "--k", "2",
            "--harness-tasks", "3", "--candidates", "2"]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(whale.rollout, "run_episodes", fake_episodes)
        with m.context() as stop:
            interrupt(stop, whale.rft.RSFT, "step", 3, before=True)
            with pytest.raises(Interrupt):
                whale.main(argv + ["--out", str(base / "killed")])
        shutil.copytree(base / "killed", base / "resumed", symlinks=True)
        whale.main(argv + ["--out", str(base / "resumed")])
    phases = [r["phase"] for r in map(json.loads, (base / "killed" / "metrics.jsonl").read_text().splitlines())
              if r["event"] == "eval"]
    assert phases == [0, 1, 2] and json.loads((base / "killed" / "weights/ckpt/state.json").read_text())["step"] == 2
    assert (base / "killed" / "evals" / "phase_2.json").exists() and not (base / "killed" / "summary.json").exists()
    return argv, base / "killed", record(base / "resumed"), base / "resumed"


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(whale.rollout, "run_episodes", fake_episodes)


def listing(folder):
    """Every path under folder with its content hash (links by their target): what a refusal must not change."""
    def entry(p):
        if p.is_symlink():
            return "-> " + os.readlink(p)
        return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder"
    return {str(p.relative_to(folder)): entry(p) for p in sorted(folder.rglob("*"))}


def cut(path, n):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - n])


def copy_of(runs, tmp_path, finished=False):
    """A copy of the killed run's folder (or its finished resume's) and of the store beside it, which the killed run
    and its resume filled."""
    argv, killed, _, resumed = runs
    out = tmp_path / "run"
    shutil.copytree(resumed if finished else killed, out, symlinks=True)
    shutil.copytree(killed.parent / "store", tmp_path / "store")
    return argv, out


ADAPTER = "weights/ckpt/adapter/adapter_model.safetensors"
REFUSED = {  # damage to the rows -> (what it does, words of the one line)
    "metrics.jsonl cut": (lambda d: cut(d / "metrics.jsonl", 10), "metrics.jsonl: line 4 is not a JSON object"),
    "metrics.jsonl without phase 1": (lambda d: (d / "metrics.jsonl").write_text("".join(
        line for line in (d / "metrics.jsonl").read_text().splitlines(keepends=True) if '"phase": 1,' not in line)),
        "metrics.jsonl (its phase rows are not 0, 1, 2, ...)"),
}


@pytest.mark.parametrize("damage", REFUSED)
def test_damaged_rows_are_one_line_and_the_folder_stays_as_it_is(runs, tmp_path, damage, capsys, stand_in):
    argv, out = copy_of(runs, tmp_path)
    hurt, words = REFUSED[damage]
    hurt(out)
    before = listing(out)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        whale.main(argv + ["--out", str(out)])
    line = str(e.value.code)
    assert line.startswith("whale.py: error: ") and "\n" not in line and words in line, line
    assert line.endswith((f"restore it, or delete {out} to start the run over",  # rows out of order
                          "delete that line and rerun")), line  # a row cut by a kill
    assert capsys.readouterr().err == ""  # nothing else: the message above is the one stderr line
    assert listing(out) == before


REPAIRED = {  # damage to any other file: the store gives the finished phases' files back
    "evals/phase_1.json removed": lambda d: (d / "evals/phase_1.json").unlink(),
    "evals/phase_1.json emptied": lambda d: (d / "evals/phase_1.json").write_text(""),
    "a trace cut": lambda d: cut(d / "evals/phase_0.traces.jsonl", 100),
    "adapter truncated": lambda d: cut(d / ADAPTER, 1000),
    "random bytes appended to the adapter": lambda d: open(d / ADAPTER, "ab").write(os.urandom(64)),
    "optimizer.pt truncated": lambda d: cut(d / "weights/ckpt/optimizer.pt", 1000),
    "a candidate's harness.py removed": lambda d: (d / "harness_w1/candidates/h1_1/harness.py").unlink(),
    "harness_w1/ removed": lambda d: shutil.rmtree(d / "harness_w1"),
    "frontier.json removed": lambda d: (d / "harness_w1/frontier.json").unlink(),
    "the step rows removed": lambda d: (d / "weights/metrics.jsonl").unlink(),
    "metrics.jsonl removed": lambda d: (d / "metrics.jsonl").unlink(),
}


@pytest.mark.parametrize("damage", REPAIRED)
def test_a_damaged_or_deleted_file_is_given_back_by_the_store(runs, tmp_path, damage, stand_in):
    argv, out = copy_of(runs, tmp_path)
    REPAIRED[damage](out)
    whale.main(argv + ["--out", str(out)])
    assert record(out) == runs[2]


def test_a_deleted_folder_takes_every_finished_phase_from_the_store(runs, tmp_path, monkeypatch):
    """Deleting the folder and rerunning computes nothing that was computed before: the killed run and its resume
    left every phase's weights, search and test evaluation in the store beside them."""
    argv, out = copy_of(runs, tmp_path)
    shutil.rmtree(out)
    stepped, scored, evaluated = [], [], []
    monkeypatch.setattr(whale.rollout, "run_episodes", lambda *a, **kw: scored.append(1) or fake_episodes(*a, **kw))
    step, evaluate = whale.rft.RSFT.step, whale.evaluate_test
    monkeypatch.setattr(whale.rft.RSFT, "step", lambda self, h: stepped.append(self.step_count + 1) or step(self, h))
    monkeypatch.setattr(whale, "evaluate_test", lambda *a: evaluated.append(1) or evaluate(*a))
    whale.main(argv + ["--out", str(out)])
    assert record(out) == runs[2]
    assert stepped == scored == evaluated == []  # no RSFT step, no candidate scored, no test evaluation


def test_a_moved_run_folder_resumes(runs, tmp_path, stand_in):
    argv, out = copy_of(runs, tmp_path)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["winner"] == "harness_w1/candidates/h0/harness.py"  # inside the folder: relative to it
    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    shutil.move(out, moved)
    shutil.move(tmp_path / "store", moved.parent / "store")  # the store goes with it: it lies beside the folder
    whale.main(argv + ["--out", str(moved)])
    assert record(moved) == runs[2]
