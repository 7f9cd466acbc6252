"""A run folder is checked as a whole before work resumes (issue 25): a whale smoke run stopped right before RSFT
step 3 (as a kill during "rft step 3 rollouts"), copied, one file damaged, then the same command on the copy.
Either one line names the file and the fix and the folder is left exactly as it was, or the damage is rebuilt
exactly: the result is the undamaged resume's.   python -m pytest -q tests/test_run_folder.py

The stand-in runner of tests/test_whale.py (rewards from the task, the sample and the seed) keeps it fast and
exactly repeatable; RSFT really updates the smoke model's adapter, so evaluations after a weight phase carry an
adapter's content hash and a lost one is rerun under the snapshot that ended its phase."""
import hashlib
import json
import os
import shutil

import pytest

import whale
from lib.run_folder import files
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
    state = json.loads((base / "killed" / "state.json").read_text())
    assert (state["phase"], state["running"], state["phase_start_step"]) == (2, "weight", 2)
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
    argv, killed, _, resumed = runs
    out = tmp_path / "run"
    shutil.copytree(resumed if finished else killed, out, symlinks=True)
    return argv, out


ADAPTER = "weights/ckpt/adapter/adapter_model.safetensors"
REFUSED = {  # damage -> (what it does, words of the one line)
    "metrics.jsonl emptied": (lambda d: (d / "metrics.jsonl").write_text(""), "metrics.jsonl holds no row for phase 0, 1, 2"),
    "metrics.jsonl removed": (lambda d: (d / "metrics.jsonl").unlink(), "metrics.jsonl holds no row for phase 0, 1, 2"),
    "state.json holds [1, 2]": (lambda d: (d / "state.json").write_text("[1, 2]"), "state.json (a JSON list, not an object)"),
    "adapter truncated": (lambda d: cut(d / ADAPTER, 1000), "adapter_model.safetensors ("),
    "random bytes appended to the adapter": (lambda d: open(d / ADAPTER, "ab").write(os.urandom(64)),
                                             "adapter_model.safetensors ("),
    "optimizer.pt truncated": (lambda d: cut(d / "weights/ckpt/optimizer.pt", 1000), "optimizer.pt (not a whole torch file"),
    "a candidate's harness.py removed": (lambda d: (d / "harness_w1/candidates/h1_1/harness.py").unlink(),
                                         "h1_1/harness.py is missing, but"),
    "harness_w1/ removed": (lambda d: shutil.rmtree(d / "harness_w1"), "harness_w1 is missing, but"),
    "the checkpoint's history cut": (lambda d: (d / "weights/ckpt/state.json").write_text(json.dumps(
        {**json.loads((d / "weights/ckpt/state.json").read_text()), "history": []})), "its history is not steps 1-2"),
}


@pytest.mark.parametrize("damage", REFUSED)
def test_a_damaged_file_that_cannot_be_rebuilt_is_one_line_and_the_folder_stays_as_it_is(runs, tmp_path, damage,
                                                                                         capsys, stand_in):
    argv, out = copy_of(runs, tmp_path)
    hurt, words = REFUSED[damage]
    hurt(out)
    before = listing(out)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        whale.main(argv + ["--out", str(out)])
    line = str(e.value.code)
    assert line.startswith("whale.py: error: ") and "\n" not in line and words in line, line
    assert line.endswith(f"restore it, or delete {out} to start the run over"), line
    assert capsys.readouterr().err == ""  # nothing else: the message above is the one stderr line
    assert listing(out) == before


REBUILT = {  # damage -> the file it hurts (whole again after the resume)
    "harness_w1/summary.jsonl truncated": (lambda d: cut(d / "harness_w1/summary.jsonl", 200), "harness_w1/summary.jsonl"),
    "harness_w1/frontier.json removed": (lambda d: (d / "harness_w1/frontier.json").unlink(), "harness_w1/frontier.json"),
    "evals/phase_0.traces.jsonl truncated": (lambda d: cut(d / "evals/phase_0.traces.jsonl", 100),
                                             "evals/phase_0.traces.jsonl"),
    "evals/phase_1.json removed": (lambda d: (d / "evals/phase_1.json").unlink(), "evals/phase_1.json"),
    "evals/phase_1.json emptied": (lambda d: (d / "evals/phase_1.json").write_text(""), "evals/phase_1.json"),
    "evals/phase_2.traces.jsonl removed": (lambda d: (d / "evals/phase_2.traces.jsonl").unlink(),
                                           "evals/phase_2.traces.jsonl"),
    "weights/metrics.jsonl removed": (lambda d: (d / "weights/metrics.jsonl").unlink(), "weights/metrics.jsonl"),
    "harness_w1/candidates/h0/harness.py removed": (lambda d: (d / "harness_w1/candidates/h0/harness.py").unlink(),
                                                    "harness_w1/candidates/h0/harness.py"),
}


@pytest.mark.parametrize("damage", REBUILT)
def test_a_damaged_file_that_can_be_rebuilt_is_rebuilt_exactly(runs, tmp_path, damage, stand_in):
    argv, out = copy_of(runs, tmp_path)
    hurt, name = REBUILT[damage]
    hurt(out)
    whale.main(argv + ["--out", str(out)])
    assert (out / name).is_file() and (out / name).stat().st_size > 0
    assert record(out) == runs[2]


def test_a_finished_run_rebuilds_what_no_later_phase_would_write_again(runs, tmp_path, stand_in):
    argv, out = copy_of(runs, tmp_path, finished=True)
    (out / "weights/metrics.jsonl").unlink()  # rewritten only by RSFT steps, and none is left
    (out / "evals/phase_3.json").unlink()  # the last phase (weight, harness, weight): the adapter of RSFT step 4
    cut(out / "harness_w1/summary.jsonl", 10)
    whale.main(argv + ["--out", str(out)])
    assert record(out) == runs[2]


def test_a_lost_evaluation_after_a_weight_phase_is_rerun_under_the_snapshot_that_ended_it(tmp_path, monkeypatch):
    # h0 earns 0.9 here, so the first weight phase's RSFT steps surely accept and update the adapter
    monkeypatch.setattr(whale.rollout, "run_episodes", lambda *a, **kw: fake_episodes(*a, h0_reward=0.9, **kw))
    (tmp_path / "h0.py").write_text(HARNESS)
    argv = ["--domain", "math", "--preset", "smoke", "--harness", str(tmp_path / "h0.py"), "--test-limit", "3",
            "--k", "2", "--harness-tasks", "3", "--candidates", "2", "--out", str(tmp_path / "run")]
    with monkeypatch.context() as stop:
        interrupt(stop, whale.rft.RSFT, "step", 3, before=True)  # killed in weight phase 3, after phases 1 and 2
        with pytest.raises(Interrupt):
            whale.main(argv)
    path = tmp_path / "run" / "evals" / "phase_1.json"
    key = json.loads(path.read_text())["key"]
    assert key["weights"].startswith("adapter ")  # RSFT steps 1-2 updated the adapter
    path.unlink()
    whale.main(argv)
    assert json.loads(path.read_text())["key"] == key


def test_a_moved_run_folder_resumes(runs, tmp_path, stand_in):
    argv, out = copy_of(runs, tmp_path)
    state = json.loads((out / "state.json").read_text())
    assert state["harness"] == "harness_w1/candidates/h0/harness.py"  # inside the folder: relative to it
    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    shutil.move(out, moved)
    whale.main(argv + ["--out", str(moved)])
    assert record(moved) == runs[2]


def test_a_moved_run_folder_with_the_absolute_paths_of_older_runs_resumes(runs, tmp_path, stand_in):
    argv, out = copy_of(runs, tmp_path)
    old = str(tmp_path / "old-place" / "run")  # where an older whale.py wrote absolute paths into the folder
    state = json.loads((out / "state.json").read_text())
    (out / "state.json").write_text(json.dumps({**state, "harness": f"{old}/{state['harness']}"}))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        if "winner" in row:
            row["winner"] = f"{old}/{row['winner']}"
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    whale.main(argv + ["--out", str(out)])
    got = record(out)
    for row in got["metrics"]:  # the rows written before the move keep the old spelling of the same file
        if row.get("winner", "").startswith(old):
            row["winner"] = files.file_sha(out / os.path.relpath(row["winner"], old))
    assert got == runs[2]
