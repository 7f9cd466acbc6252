"""The search keeps its own truth (issue 11 items 3-5): hostile `--proposer command` scripts, one per attack,
each followed by what the archive must still say. The proposer runs in the real OS sandbox (lib/episodes/sandbox.py);
scoring uses the fake rollout module of test_meta_harness (fast, deterministic: score = 0.1 * MAX_TURNS)."""
import json
import os
import tempfile
import time
from pathlib import Path

import pytest

import meta_harness as mh
from fixtures import stand_ins
from lib.episodes import sandbox, switches
from test_meta_harness import SEED, FakeDomain, FakeRollout, make_args, rows_of

# what only the OS sandbox can give (nothing outside its folder visible, no process outliving it)
needs_sandbox = pytest.mark.skipif(switches.disabled(), reason=f"{switches.OPT_OUT}=1: no OS boundary to test")

PROJECT = Path(mh.__file__).resolve().parent
SECRET = "SECRET-GOLD-7f3a"  # in the fake test traces next to the run folder, and in a file outside it

HOSTILE = r'''
"""A hostile proposer: argv = attack, its folder, the project, the run folder, a folder outside both."""
import json, os, shutil, subprocess, sys, time
attack, work, project, run_dir, outside = sys.argv[1:6]
cand = lambda name: f"{work}/candidates/{name}"
fresh = sorted(d for d in os.listdir(f"{work}/candidates")
               if not json.load(open(cand(d) + "/meta.json"))["proposed"])
seed = open(cand("h0") + "/harness.py").read()
better = seed.replace("MAX_TURNS = 1", "MAX_TURNS = 3")  # the fake scorer gives it 0.3


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def try_all(paths, act):
    log = []
    for path in paths:
        try:
            log.append(f"DONE {path}: {act(path)}")
        except OSError as e:
            log.append(f"denied {path}: {e.strerror}")
    return log


if attack == "prescored":  # a modest edit with a scores.json that claims the best score
    write(cand(fresh[0]) + "/harness.py", seed.replace("Answer briefly", "Answer"))
    write(cand(fresh[0]) + "/scores.json", json.dumps({"score": 1.0, "mean_turns": 1.0, "rollouts": 0}))
elif attack == "claims_valid":  # a forbidden file whose meta.json says valid, and an extra candidate
    meta = {"parent": "h0", "hypothesis": "h", "changed": "c", "proposer": "command", "iteration": 1,
            "proposed": True, "valid": True, "reason": None, "smoke_rollouts": 0}
    write(cand(fresh[0]) + "/harness.py", "import os\n" + better)
    write(cand(fresh[0]) + "/meta.json", json.dumps(meta))
    write(cand("h1_9") + "/harness.py", better)
    write(cand("h1_9") + "/meta.json", json.dumps(meta))
    write(cand("h1_9") + "/scores.json", json.dumps({"score": 1.0, "mean_turns": 1.0}))
elif attack == "overwrite_h0":
    write(cand("h0") + "/harness.py", better)
    write(cand("h0") + "/scores.json", json.dumps({"score": 1.0, "mean_turns": 1.0}))
elif attack == "junk":  # the issue's 10,000 folders behave alike, but cost 30 s on the CI disk
    meta = json.dumps({"parent": "h0", "proposed": True, "iteration": 1, "valid": True})
    for i in range(500):
        os.mkdir(cand(f"junk{i}"))
        with open(cand(f"junk{i}") + "/meta.json", "w") as f:
            f.write(meta)
elif attack == "escape":  # writes outside its folder; reads of the test split, the test traces, the metrics
    log = try_all([f"{project}/harnesses/evil.py", f"{run_dir}/candidates/h0/harness.py", f"{outside}/evil.txt"],
                  lambda p: open(p, "w").write(better))
    log += try_all([f"{project}/data/searchqa_test.jsonl", f"{run_dir}/../evals/phase_0.traces.jsonl",
                    f"{run_dir}/../metrics.jsonl", f"{outside}/secret_harness.py",
                    f"/proc/{os.getppid()}/cwd/data/searchqa_test.jsonl", "/proc/1/cwd/../evals/phase_0.traces.jsonl"],
                   lambda p: open(p).read(300))
    system = {"/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/proc", "/sys", "/dev",
              os.path.realpath(sys.base_prefix)}
    for root, dirs, files in os.walk("/"):
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in system]
        log += [f"FOUND {root}/{f}" for f in files if f.endswith(("_test.jsonl", ".traces.jsonl", "metrics.jsonl"))]
    write(f"{work}/notes.md", "\n".join(log) + "\n")
elif attack == "leftover_child":  # a valid file now, swapped for a forbidden one after the proposer returned
    target = cand(fresh[0]) + "/harness.py"
    write(target, seed.replace("Answer briefly", "Answer"))
    archived = f"{run_dir}/candidates/{fresh[0]}/harness.py"
    swap = (f"import time\ntime.sleep(1.5)\nfor p in [{target!r}, {archived!r}]:\n"
            f"    try:\n        open(p, 'w').write('import os\\n')\n    except OSError:\n        pass\n")
    if os.fork() == 0:  # double fork, new session: the child survives its parent
        os.setsid()
        subprocess.Popen([sys.executable, "-c", swap, "LEFTOVER-MARKER"], stdout=subprocess.DEVNULL)
        os._exit(0)
elif attack in ("hang", "exit_early"):  # a child in its own session keeps stdout open for a minute
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "STDOUT-MARKER"], start_new_session=True)
    write(cand(fresh[0]) + "/harness.py", seed.replace("Answer briefly", "Answer"))
    if attack == "hang":
        time.sleep(60)
elif attack == "links":  # symlinks out of its folder (a file, a folder), a fifo, a file for a folder
    os.remove(cand(fresh[0]) + "/harness.py")
    os.symlink(f"{outside}/secret_harness.py", cand(fresh[0]) + "/harness.py")
    shutil.rmtree(cand(fresh[1]))
    os.symlink(f"{outside}/secret_dir", cand(fresh[1]))
    os.remove(cand(fresh[2]) + "/harness.py")
    os.mkfifo(cand(fresh[2]) + "/harness.py")
    os.symlink(f"{outside}/secret_harness.py", f"{work}/notes.md")
    shutil.rmtree(cand(fresh[3]))
    write(cand(fresh[3]), "a file where a folder was")
elif attack == "deep":  # issue 11 item 4: recursion in the checks, a huge file
    terms = lambda n: seed.replace('return {"answer": reply}',
                                   'return {"answer": reply, "n": ' + "+".join(["1"] * n) + "}")
    write(cand(fresh[0]) + "/harness.py", terms(2000))  # parses; ast.dump / strings_blanked overflow
    write(cand(fresh[1]) + "/harness.py", terms(6000))  # ast.parse overflows
    write(cand(fresh[2]) + "/harness.py", seed + "#" * 500_000 + "\n")
    write(cand(fresh[3]) + "/harness.py", seed + "X = " + "-" * 5000 + "1\n")
'''


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    """run(attack, **args) -> (run_dir, FakeRollout); the run folder sits where whale puts it, next to evals/."""
    fr = FakeRollout()
    monkeypatch.setattr(mh, "rollout", fr)
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_root))  # the proposer's scratch folders go here
    seed, script = tmp_path / "seed.py", tmp_path / "hostile.py"
    seed.write_text(SEED)
    script.write_text(HOSTILE)
    outside = tmp_path / "outside"
    (outside / "secret_dir").mkdir(parents=True)
    secret_harness = SEED.replace("Answer briefly", SECRET)
    (outside / "secret_harness.py").write_text(secret_harness)
    (outside / "secret_dir" / "harness.py").write_text(secret_harness)
    out = tmp_path / "out"
    (out / "evals").mkdir(parents=True)
    (out / "evals" / "phase_0.traces.jsonl").write_text(json.dumps({"answers": [SECRET]}) + "\n")
    (out / "metrics.jsonl").write_text(json.dumps({"event": "eval", "mean_at_k": 0.5, "note": SECRET}) + "\n")
    run_dir = out / "harness_w0"

    def run(attack, iterations=1, **over):
        cmd = f"{sandbox.python()} {script} {attack} {{workdir}} {PROJECT} {run_dir} {outside}"
        args = make_args(proposer="command", proposer_cmd=cmd, proposer_ro=[str(script)], **over)
        mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir, args, rounds=iterations)
        assert list(scratch_root.iterdir()) == [], "the proposer's scratch folder was left behind"
        return run_dir, fr
    return run


def processes_with(marker):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


def assert_h0_intact(run_dir):
    assert (run_dir / "candidates" / "h0" / "harness.py").read_text() == SEED
    assert json.loads((run_dir / "candidates" / "h0" / "scores.json").read_text())["score"] == pytest.approx(0.1)


# -----------------------------------------------------------------------------
# the archive trusts the proposer (issue 11)

def test_prewritten_scores_are_ignored_and_the_candidate_rescored(hostile):
    run_dir, fr = hostile("prescored", candidates=2)
    rows = rows_of(run_dir)
    assert fr.evaluated.count("h1_1") == 1 and rows["h1_1"]["score"] == pytest.approx(0.1)
    frontier = json.loads((run_dir / "frontier.json").read_text())
    assert frontier["score"] == pytest.approx(0.1) and frontier["best"] == "h0"


def test_meta_claiming_valid_is_validated_and_extra_folders_are_not_taken(hostile):
    run_dir, fr = hostile("claims_valid", candidates=2)
    rows = rows_of(run_dir)
    assert not rows["h1_1"]["valid"] and rows["h1_1"]["reason"].startswith("forbidden import: os")
    assert "h1_9" not in rows and not (run_dir / "candidates" / "h1_9").exists()
    assert fr.evaluated == ["h0"]  # h1_2 is a copy of h0: a duplicate, never scored
    meta = json.loads((run_dir / "candidates" / "h1_1" / "meta.json").read_text())
    assert (meta["hypothesis"], meta["changed"], meta["parent"]) == ("h", "c", "h0")  # the text fields are kept


def test_h0_cannot_be_overwritten(hostile):
    run_dir, fr = hostile("overwrite_h0", iterations=2, candidates=1)
    assert_h0_intact(run_dir)
    assert fr.evaluated == ["h0"] and json.loads((run_dir / "frontier.json").read_text())["score"] == pytest.approx(0.1)


def test_junk_folders_add_no_row(hostile):
    run_dir, _ = hostile("junk", candidates=2)
    assert list(rows_of(run_dir)) == ["h0", "h1_1", "h1_2"]
    assert sorted(p.name for p in (run_dir / "candidates").iterdir()) == ["h0", "h1_1", "h1_2"]


# -----------------------------------------------------------------------------
# the proposer can write outside its folder or read the test set (issue 11)

@needs_sandbox
def test_no_write_outside_and_no_test_data_visible(hostile, tmp_path):
    before = sorted(p.name for p in (PROJECT / "harnesses").iterdir())
    run_dir, _ = hostile("escape", candidates=1)
    notes = (run_dir / "notes.md").read_text()  # what the proposer could do, in its own words
    assert "DONE" not in notes and "FOUND" not in notes and SECRET not in notes, notes
    assert notes.count("denied") == 9
    assert sorted(p.name for p in (PROJECT / "harnesses").iterdir()) == before
    assert not (tmp_path / "outside" / "evil.txt").exists()
    assert_h0_intact(run_dir)


# -----------------------------------------------------------------------------
# processes: a child left behind, a child that keeps stdout open (issue 11)

@needs_sandbox
def test_a_leftover_child_is_dead_and_swaps_nothing(hostile):
    run_dir, fr = hostile("leftover_child", candidates=1)
    time.sleep(2.5)  # past the moment the child would have swapped the file
    assert processes_with("LEFTOVER-MARKER") == []
    assert (run_dir / "candidates" / "h1_1" / "harness.py").read_text() == SEED.replace("Answer briefly", "Answer")
    assert rows_of(run_dir)["h1_1"]["valid"] and fr.evaluated == ["h0", "h1_1"]


@needs_sandbox
@pytest.mark.parametrize("attack", ["hang", "exit_early"])
def test_timeout_holds_with_a_child_keeping_stdout_open(hostile, attack):
    # no clock: "timed out" says the proposer's timeout ended the hang, and a valid candidate that the search
    # did not wait for the child holding stdout (waiting would have hit proposer_timeout=30, not valid)
    if attack == "hang":
        with pytest.raises(SystemExit, match=r"failed 1 times in a row, last: timed out after 1\.5s"):
            hostile(attack, candidates=1, proposer_timeout=1.5, proposer_max_failures=1)
    else:
        run_dir, _ = hostile(attack, candidates=1, proposer_timeout=30)
        assert rows_of(run_dir)["h1_1"]["valid"]
    assert processes_with("STDOUT-MARKER") == []


# -----------------------------------------------------------------------------
# files the search reads back: links, fifos, recursion, size (issue 11 items 3 and 4)

def test_symlinks_and_fifos_are_not_followed(hostile):
    run_dir, fr = hostile("links", candidates=4)
    rows = rows_of(run_dir)
    assert "symlink" in rows["h1_1"]["reason"] and "symlink" in rows["h1_2"]["reason"]
    assert "not a regular file" in rows["h1_3"]["reason"] and "Not a directory" in rows["h1_4"]["reason"]
    assert not any(SECRET in p.read_text() for p in run_dir.rglob("*") if p.is_file())
    assert fr.evaluated == ["h0"]


@pytest.mark.parametrize("prompt_only", [False, True])
def test_recursion_and_size_reject_one_candidate_and_the_search_goes_on(hostile, prompt_only):
    run_dir, _ = hostile("deep", iterations=2, candidates=4, prompt_only=prompt_only)
    reasons = [rows_of(run_dir)[f"h1_{j}"]["reason"] for j in range(1, 5)]
    assert [r.split(":")[0] for r in reasons] == ["too deeply nested", "too deeply nested", "too large",
                                                  "too deeply nested"]
    hostile("deep", iterations=3, candidates=4, prompt_only=prompt_only)  # a rerun resumes without crashing
    rows = rows_of(run_dir)
    assert [rows[f"h1_{j}"]["reason"] for j in range(1, 5)] == reasons and "h3_4" in rows
