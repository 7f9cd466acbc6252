"""Bad input gets a one-line error before any work starts, with no traceback (issue 12, item 8): bad flags in
every CLI that has them, malformed data files, damaged run folders.  python -m pytest -q tests/test_cli_errors.py

Most cases call each CLI's main in-process (its imports are paid once); two subprocess runs check the exit code,
the single stderr line and the absence of a traceback end to end."""
import json
import os
import subprocess
import sys

import pytest

import domains
import meta_harness
import rft
import rollout
import whale

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
    ("--iterations", "-1", ("meta_harness.py",)),
    ("--candidates", "-2", ("meta_harness.py", "whale.py")),
    ("--harness-samples", "0", ("meta_harness.py", "whale.py")),
    ("--deadline", "0", tuple(CLIS)), ("--deadline", "-1", tuple(CLIS)),
    ("--temperature", "-1", tuple(CLIS)),
    ("--max-new-tokens", "0", tuple(CLIS)),
    ("--minibatch", "0", ("rft.py", "whale.py")),
    ("--k", "two", ("rollout.py", "whale.py")), ("--deadline", "nan", ("whale.py",)),
]


@pytest.mark.parametrize("flag,value,clis", BAD_FLAGS, ids=[f"{f}={v}" for f, v, _ in BAD_FLAGS])
def test_bad_flag_is_a_one_line_error_in_every_cli(flag, value, clis, capsys):
    for cli in clis:
        with pytest.raises(SystemExit) as e:
            CLIS[cli]([flag, value])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, (cli, err)
        assert err.startswith(f"{cli}: error: argument {flag}: ") and value in err, (cli, err)


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


def fake_checkpoint(weights, step=2):
    """The files of an RSFT checkpoint (only their presence and state.json are read before the model loads)."""
    folder = weights / f"ckpt-{step:06d}"
    (folder / "adapter").mkdir(parents=True)
    (folder / "adapter" / "adapter_model.safetensors").write_bytes(b"")
    (folder / "optimizer.pt").write_bytes(b"")
    (folder / "state.json").write_text(json.dumps({"model": "smoke", "step": step}))
    (weights / "ckpt").symlink_to(folder.name)
    (weights / "metrics.jsonl").write_text("".join(json.dumps({"step": s + 1}) + "\n" for s in range(step)))
    return folder


def test_rft_checkpoint_link_to_a_missing_folder(tmp_path):
    folder = fake_checkpoint(tmp_path)
    rft.check_checkpoint(tmp_path)  # intact
    for path in sorted(folder.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    folder.rmdir()
    out = subprocess.run([sys.executable, "rft.py", "--domain", "math", "--harness", MATH, "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr and out.stderr.count("\n") == 1
    assert out.stderr.startswith(f"rft.py: error: checkpoint link {tmp_path}/ckpt points to ckpt-000002, which is "
                                 f"missing: restore it, or delete {tmp_path} to train from step 0")
    (tmp_path / "ckpt").unlink()  # no link at all, but metrics.jsonl shows finished steps
    with pytest.raises(ValueError, match=r"metrics.jsonl records finished RSFT steps but the checkpoint .*ckpt is missing"):
        rft.check_checkpoint(tmp_path)


def test_whale_missing_state_json_after_finished_steps(tmp_path, capsys):
    out = tmp_path / "run"
    fake_checkpoint(out / "weights")
    (out / "state.json").write_text(json.dumps({"phase": 0}))
    whale.check_run_folder(str(out))  # intact
    (out / "state.json").unlink()
    with pytest.raises(SystemExit) as e:
        CLIS["whale.py"](["--out", str(out)])
    assert str(e.value.code) == (f"whale.py: error: {out}/state.json is missing but {out} holds finished phases or "
                                 f"RSFT steps: restore it, or delete {out} to start the run over")
    # a harness-only run: state.json is written after phase 1, so a phase-2 evaluation without it means it was lost
    out = tmp_path / "harness-only"
    out.mkdir()
    (out / "metrics.jsonl").write_text("".join(json.dumps({"event": "eval", "phase": p}) + "\n" for p in (0, 1)))
    whale.check_run_folder(str(out))  # killed between phase 1's evaluation and its state: resumes
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"event": "eval", "phase": 2}) + "\n")
    with pytest.raises(ValueError, match="state.json is missing"):
        whale.check_run_folder(str(out))
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"event": "ev')
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 4 is not a JSON object: .*delete that line"):
        whale.check_run_folder(str(out))


def test_empty_meta_json_in_an_archive(tmp_path):
    meta = tmp_path / "mh" / "candidates" / "h1_1" / "meta.json"
    meta.parent.mkdir(parents=True)
    meta.write_text("")
    with pytest.raises(SystemExit) as e:
        CLIS["meta_harness.py"](["--out", str(tmp_path / "mh")])
    assert str(e.value.code) == (f"meta_harness.py: error: damaged run file {meta} (empty): restore it, or start this "
                                 "run over in a fresh --out")
    meta = tmp_path / "w" / "harness_w1" / "candidates" / "h0" / "meta.json"
    meta.parent.mkdir(parents=True)
    meta.write_text('{"parent": nu')
    with pytest.raises(SystemExit) as e:
        CLIS["whale.py"](["--out", str(tmp_path / "w")])
    assert str(e.value.code).startswith(f"whale.py: error: damaged run file {meta} (Expecting value)")
