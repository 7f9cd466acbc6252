"""Cross-method reuse: several methods in one whale.py command share their first phases (whale, weight-only,
stagewise and fast-slow all start with RSFT under h0), so a run takes what another run of the command already
computed, exactly, instead of redoing it:
- a weight phase's RSFT steps, from a snapshot made under the same settings with the same harness at every step;
- a test evaluation of the same weights (adapter content) and harness (content) under the same settings;
- a harness search from the same harness under the same weights and settings.
Copies are hard links (or real copies) put in place by one rename, so a kill never leaves half of one."""
import json
import os
import re
import shutil
from pathlib import Path

from lib.files import file_sha, link_file, link_tree, read_json, resolved_path, whole_jsonl, write_json

# flags that shape a run's plan, or only how it is checked and watched, but not what one RSFT step or one
# evaluation computes
PLAN_FLAGS = ("method", "out", "schedule", "preset", "prompt_only", "harness", "epochs", "phase_epochs",
              "harness_iterations", "adaptive_epochs", "harness_patience", "harness_min_iterations",
              "harness_max_iterations", "check", "report_to", "infra_budget",
              "test_evals")


def result_settings(args):
    """Every other flag: work is reused only when all of them match (as JSON, the way it is stored)."""
    return json.loads(json.dumps({k: v for k, v in sorted(vars(args).items()) if k not in PLAN_FLAGS}))








def step_harnesses(history, run_dir):
    """The content hash of the harness each RSFT step so far ran under (history paths inside the run folder
    run_dir are relative to it)."""
    return [file_sha(resolved_path(row["harness"], run_dir)) for row in history]


# -----------------------------------------------------------------------------
# weight phases: snapshots of the checkpoint that ends one

def snapshot_weights(weights, step, history, settings):
    """Keep the checkpoint that ends a weight phase as weights/snapshot-<step>/, with key.json saying what
    it holds, so another run of this command can start from it instead of redoing its steps."""
    dst = Path(weights, f"snapshot-{step:06d}")
    if (dst / "key.json").exists():
        return
    shutil.rmtree(dst, ignore_errors=True)
    link_tree(Path(weights, "ckpt").resolve(), dst)
    write_json(dst / "key.json", {"settings": settings,  # last: it counts now
                                  "harnesses": step_harnesses(history, Path(weights).parent)})


def find_snapshot(history, harness, settings, donors, phase_over, start, run_dir="."):
    """The donor snapshot furthest along this weight phase: made under the same settings, its steps those
    of `history` (this trainer's so far, in the run folder run_dir) followed by steps under `harness` only, and
    not past where this phase ends (phase_over(rewards since `start`))."""
    mine, sha = step_harnesses(history, run_dir), file_sha(harness)
    found, reach = None, len(mine)
    for donor in donors:
        for key_path in sorted(Path(donor, "weights").glob("snapshot-*/key.json")):
            key = read_json(key_path)
            steps = key["harnesses"]
            if len(steps) <= reach or key["settings"] != settings or steps[:len(mine)] != mine \
                    or any(s != sha for s in steps[len(mine):]):
                continue
            rewards = [r["reward"] for r in read_json(key_path.parent / "state.json")["history"]][start:]
            if not any(phase_over(rewards[:n]) for n in range(len(mine) - start, len(steps) - start)):
                found, reach = key_path.parent, len(steps)
    return found


# -----------------------------------------------------------------------------
# harness phases and test evaluations

def adopt_archive(archive, key, donors):
    """Before a harness phase starts a new archive: if a donor run searched with the same key (harness, weights,
    settings; stagewise after weight phases that accepted nothing is harness-only), copy its archive; search()
    then replays what it needs of it and goes on from there. Real copies, not hard links: the index files are
    rewritten. whale_key.json, which says what the archive searched, is written here, by whale itself (a proposer
    never writes into the run folder)."""
    if os.path.exists(os.path.join(archive, "whale_key.json")):
        return
    for donor in sorted(p for run_dir in donors for p in Path(run_dir).glob("harness_w*")
                        if re.fullmatch(r"harness_w\d+", p.name)):  # not a copy a kill left half-made
        if read_json(donor / "whale_key.json", {}) == key:
            shutil.rmtree(archive, ignore_errors=True)  # what a kill before the key left
            link_tree(donor, archive, copy_function=shutil.copy2)
            print(f"harness phase: the same search as {donor}, copied")
            break
    os.makedirs(archive, exist_ok=True)
    write_json(os.path.join(archive, "whale_key.json"), key)


def copy_evaluation(key, run_dirs, path, label):
    """If an evaluation under `key` is in evals/ of one of run_dirs, copy it (with its traces) to `path` and
    return its stats; else None."""
    for run_dir in run_dirs:
        for other in sorted(Path(run_dir, "evals").glob("*.json")):
            saved = read_json(other)
            traces = other.with_name(other.name[:-len(".json")] + ".traces.jsonl")
            if saved.get("key") == key and whole_jsonl(traces, saved["stats"].get("test_rollouts")):  # never a cut copy
                if traces.exists():
                    link_file(traces, path.with_name(path.name[:-len(".json")] + ".traces.jsonl"))
                write_json(path, {**saved, "copied_from": str(other)})  # last: marks it done
                print(f"{label}: the same as {other}, copied")
                return saved["stats"]
    return None


def adopt_steps(trainer, harness, settings, donors, phase_over, start, run_dir):
    """The trainer, moved on to a donor's snapshot where a donor run made exactly this phase's next steps
    (find_snapshot), else as it is."""
    snapshot = find_snapshot(trainer.history, harness, settings, donors, phase_over, start, run_dir=run_dir)
    if snapshot is None:
        return trainer
    done = trainer.step_count
    trainer = trainer.adopt(snapshot)
    print(f"weights: RSFT steps {done + 1}-{trainer.step_count} taken from {snapshot}")
    return trainer


def search_key(args, weights, harness):
    """What makes two harness searches the same: the weights, the seed harness's content and the settings."""
    return {"weights": weights, "seed": file_sha(harness), "prompt_only": args.prompt_only,
            "settings": result_settings(args)}
