"""The run folder as the ledger of a run's finished work. It runs nothing: whale.run looks up each phase, search
and test evaluation here before doing it, and records it here after.

    ledger = Ledger(out, donors, h0)
    start, key = ledger.enter("weight", step, key)      # saved before the work: a resume finishes this phase
    ledger.find_snapshot(key)                           # a donor's weights after the same phase, else None
    ledger.archive_for(weights)                         # (archive, rounds it holds): continued or new
    ledger.evaluation(tag, weights, harness, config)    # stats made before (here or by a donor), else None
    ledger.close_phase(kind, harness); ledger.log_eval(row); ledger.save()

A lookup's key is an allow-list: the weights' id, the harness's sha256 and the hash of the config the work
receives (lib/cli.config_hash), nothing else. The ledger finds a result:
- in this run's folder (a resume: a finished phase, evaluation or search round is never redone; a phase
  killed midway resumes inside itself, from RSFT's own checkpoint or the archive's own index);
- in the folder of a donor run, another method of the same whale.py command that made the same work with the
  same key (cross-method reuse: whale, weight-only, stagewise and fast-slow all start with RSFT under h0), taken
  as hard links (or real copies) put in place by one rename, so a kill never leaves half of one.
It keeps state.json (which phases finished, what is running), the rows of metrics.jsonl, and checks the run
folder as a whole before any work resumes (check_run_folder), so a damaged or missing file is one line naming it
and the fix, or rebuilt exactly (Ledger.repair), never a silent restart or a summary with phases missing. A rerun
keeps the settings the folder was started with (check_same_settings)."""
import json
import os
import re
import shutil
import time
from pathlib import Path

from lib.archive import check_archive, rebuild_index, restore_seed
from lib.cli import NO_RESULT_FLAGS, config_hash
from lib.run_folder.files import (adapter_id, append_jsonl, check_checkpoint, check_checkpoint_files,
                                  check_checkpoint_model, check_run_files, check_same_model, damaged, file_sha,
                                  json_object, link_file, link_tree, read_json, read_jsonl, resolved_path, start_over,
                                  stored_path, whole_jsonl, write_json, write_jsonl)


def fresh_state():
    """state.json as this whale.py writes it, before the first phase (load_state says what each key holds)."""
    return {"phase": 0, "kinds": [], "running": None, "harness": None, "phase_start_step": None,
            "archive_iterations": {}, "harness_rollouts": {}, "archive_weights": {}, "phase_key": None}


def load_state(out):
    """phase: phases finished; kinds: their kinds; running: the kind of the phase under way (None between
    phases); harness: the run's harness (None: h0); phase_start_step and phase_key: where a running weight phase
    started and the key of its snapshot; archive_iterations, harness_rollouts and archive_weights: per harness
    archive, its rounds, rollouts and the weights it searched under, as of the last finished phase. A state.json
    of an older whale.py, which lacks some of these, is refused: the run is started over in a fresh folder."""
    path = os.path.join(out, "state.json")
    state = read_json(path, fresh_state())
    if not isinstance(state, dict):
        raise damaged(path, f"a JSON {type(state).__name__}, not an object", start_over(out))
    lacking = [key for key in fresh_state() if key not in state]
    if lacking:
        raise ValueError(f"{path} was written by an older whale.py (it lacks {', '.join(lacking)}): "
                         f"{move_aside(out)}")
    counters = [state[k] for k in ("archive_iterations", "harness_rollouts")]
    if not (isinstance(state["phase"], int) and isinstance(state["kinds"], list)
            and len(state["kinds"]) == state["phase"] and set(state["kinds"]) <= {"weight", "harness"}
            and state["running"] in (None, "weight", "harness") and isinstance(state["harness"], (str, type(None)))
            and isinstance(state["phase_start_step"], (int, type(None)))
            and all(isinstance(c, dict) and all(isinstance(v, int) for v in c.values()) for c in counters)):
        raise damaged(path, "not the state of a whale run", start_over(out))
    return state


def check_run_folder(out, model=None, h0=None, candidates=None):
    """The run folder as a whole, before any work: every file a resume reads is there and whole, as state.json
    says it must be, else one line naming the file and the fix (never a silent restart, never a summary with
    phases missing). What can be rebuilt exactly is left for Ledger.repair to rebuild (lost_seeds,
    lost_evaluations). state.json is written before the first RSFT step and after phase 1's evaluation, so RSFT
    steps or a phase-2 evaluation without it mean it was lost. model, h0, candidates: the resuming command's,
    which must be the run's (checked where given). -> the state, None for a run not yet started"""
    check_run_files(out, skip=("evals",))  # a damaged evaluation is rerun (lost_evaluations)
    check_checkpoint(os.path.join(out, "weights"), start_over(out))
    path = os.path.join(out, "state.json")
    steps = os.path.join(out, "weights", "ckpt")
    phases = [r["phase"] for r in read_rows(out) if r.get("event") == "eval"]
    if not os.path.exists(path) and (os.path.exists(steps) or max(phases, default=0) >= 2):
        raise ValueError(f"{path} is missing but {out} holds finished phases or RSFT steps: restore it, or delete "
                         f"{out} to start the run over")
    if model is not None:
        check_checkpoint_model(os.path.join(out, "weights"), model)
        if os.path.exists(path) or any(Path(out, "evals").glob("*.json")):  # work done: by the model config.json
            check_same_model(out, model)  # names (harness-only has no checkpoint that would say)
    if not os.path.exists(path):
        return None
    state, fix = load_state(out), start_over(out)
    rows = phase_rows(out, state)
    if "weight" in state["kinds"] and not os.path.exists(steps):
        raise ValueError(f"{steps} is missing, but {path} records finished weight phases: {fix}")
    for snapshot in Path(out, "weights").glob("snapshot-*"):  # what another run of the command may adopt
        if (snapshot / "key.json").exists():
            check_checkpoint_files(snapshot, fix)
    for name, iterations in state["archive_iterations"].items():
        if not os.path.isdir(os.path.join(out, name)):
            raise ValueError(f"{os.path.join(out, name)} is missing, but {path} records its search of {iterations} "
                             f"iterations: {fix}")
        check_archive(os.path.join(out, name), fix, iterations, candidates)
    current = os.path.join(out, f"harness_w{state['kinds'].count('weight')}")
    if state["running"] == "harness" and os.path.isdir(current):
        check_archive(current, fix)
    harness = resolved_path(state["harness"], out)
    if harness and not os.path.isfile(harness) and harness not in lost_seeds(out, state):
        raise ValueError(f"{harness} is missing, but {path} names it as the run's harness: {fix}")
    for i in lost_evaluations(out, state) if h0 is not None else ():
        if i <= state["phase"]:
            evaluation_inputs(out, state, rows, i, h0)  # raises if the lost evaluation cannot be rerun
    return state


def phase_rows(out, state):
    """{phase: its eval row} of metrics.jsonl, which must hold every phase that state.json records as finished:
    the summary and the report are built from these rows."""
    rows = {}
    for r in read_rows(out):
        if r.get("event") == "eval":
            rows.setdefault(r["phase"], r)
    path = os.path.join(out, "metrics.jsonl")
    lacking = [str(i) for i in range(state["phase"] + 1) if i not in rows]
    if lacking:
        raise ValueError(f"{path} holds no row for phase {', '.join(lacking)}, which "
                         f"{os.path.join(out, 'state.json')} records as finished: {start_over(out)}")
    for i in range(state["phase"] + 1):
        keys = ("kind", "step", "rollouts", "mean_at_k") + (("winner",) if rows[i].get("kind") == "harness" else ())
        if any(k not in rows[i] for k in keys):
            raise damaged(path, f"its row of phase {i} lacks {', '.join(k for k in keys if k not in rows[i])}",
                          start_over(out))
    return rows


def evaluation_whole(path):
    """A test evaluation evals/<tag>.json is whole: its key, stats and per-task scores, and every trace it counted."""
    try:
        saved = json_object(path, "")
        return isinstance(saved.get("stats"), dict) and "key" in saved and "per_task" in saved and \
            whole_jsonl(str(path)[:-len(".json")] + ".traces.jsonl", saved["stats"].get("test_rollouts"))
    except ValueError:
        return False


def lost_evaluations(out, state):
    """The phases (0 .. the running one) whose evaluation is missing, damaged or has traces missing; the running
    phase's only when it was made (it is redone as the phase ends); without state.json, phase 0's only when it
    was made (no phase has started: the run evaluates it first)."""
    started = os.path.exists(os.path.join(out, "state.json"))
    skipped = {r["phase"] for r in read_rows(out) if r.get("event") == "eval" and r.get("mean_at_k", 0) is None}
    lost = []
    for i in sorted(set(range(state["phase"] + 2)) - skipped):  # skipped: --test-evals ends made none
        path = Path(out, "evals", f"phase_{i}.json")
        made = path.exists() or path.with_name(f"phase_{i}.traces.jsonl").exists()
        if ((started and i <= state["phase"]) or made) and not evaluation_whole(path):
            lost.append(i)
    return lost


def evaluation_inputs(out, state, rows, i, h0):
    """(weights id, adapter folder or None, harness) of finished phase i, from its row and the weights that
    ended it (weights/snapshot-<step>, or the checkpoint at that step): what reruns its evaluation exactly."""
    fix = f"restore {out}/evals/phase_{i}.json and its traces, or delete {out} to start the run over"
    step = rows[i]["step"]
    harness = os.path.abspath(h0)
    for j in range(1, i + 1):
        if rows[j]["kind"] == "harness":
            harness = resolved_path(rows[j]["winner"], out)
    if not (os.path.isfile(harness) or harness in lost_seeds(out, state)):
        raise ValueError(f"{out}/evals/phase_{i}.json is lost, and so is the harness it evaluated: {fix}")
    if step == 0:
        return "base", None, harness
    ckpt = Path(out, "weights", "ckpt")
    folder = Path(out, "weights", f"snapshot-{step:06d}")
    if not (folder / "key.json").exists():
        folder = ckpt.resolve()
    saved = check_checkpoint_files(folder, fix) if folder.exists() else {}
    if saved.get("step") != step:
        raise ValueError(f"{out}/evals/phase_{i}.json is lost, and no snapshot holds the weights of RSFT step {step} "
                         f"it evaluated: {fix}")
    if all(row["skipped"] for row in saved["history"]):
        return "base", None, harness
    return adapter_id(folder / "adapter"), folder / "adapter", harness


def lost_seeds(out, state):
    """The seed harness files (candidates/h0/harness.py) of the run's archives that are lost; repair copies each
    back from a harness with its recorded content: h0, or a candidate of another archive."""
    names = list(state["archive_iterations"]) + [f"harness_w{state['kinds'].count('weight')}"]
    seeds = [Path(out, name, "candidates", "h0", "harness.py") for name in dict.fromkeys(names)]
    return {os.path.abspath(s) for s in seeds if s.parent.joinpath("meta.json").exists() and not s.exists()}


def save_state(out, state):
    write_json(os.path.join(out, "state.json"), state)


# flags that may change between a run and its resumption: those that cannot change a result (lib/cli.py: speed, the
# engine's memory, where the run is written and reported, when a failing machine stops it; a lower --gpu-memory is
# what a refused engine asks for), and --workers, the episodes run at once
RESUMABLE_FLAGS = (*NO_RESULT_FLAGS, "workers")


def check_same_settings(out, flags):
    """A rerun resumes the folder's run only with the settings it was started with: another value of any
    flag would put new results beside old ones under the old config. A config.json that lacks one of the
    command's flags was written by an older whale.py: refused, the run is started over in a fresh folder.
    flags: the command's, as config.json stores them."""
    old = read_json(os.path.join(out, "config.json"))
    if old is None:
        return
    old = {"weight_step": "rsft", **old}  # a folder made before weight steps existed: every weight phase was RSFT
    new = json.loads(json.dumps(flags))  # as stored
    lacking = [f"--{k.replace('_', '-')}" for k in new if k not in old]
    if lacking:
        raise ValueError(f"{out}/config.json was written by an older whale.py (it lacks {', '.join(lacking)}): "
                         f"{move_aside(out)}")
    changed = [k for k in new if k not in RESUMABLE_FLAGS and new[k] != old[k]]
    if changed:
        flags = ", ".join(f"--{k.replace('_', '-')} {old[k]} (now {new[k]})" for k in changed)
        raise ValueError(f"{out} was run with other settings: {flags}: rerun with the folder's settings, or "
                         f"{move_aside(out)}")


def move_aside(out):
    """The fix that works for a folder whale.py will not resume, whatever the command: --out names one run's folder
    and is refused with several --method, so the folder itself moves."""
    return f"move {out} aside (mv {out} {out}.old) or delete it, and rerun to start it over"


def read_rows(out):
    return read_jsonl(os.path.join(out, "metrics.jsonl"), fix="a run killed while writing it? delete that line and rerun")



# the row of a phase whose test evaluation the run skips (--test-evals ends: never the first or the last)
NOT_EVALUATED = {"mean_at_k": None, "test_tasks": 0}


class Ledger:
    """One run's record in its folder: what finished (state.json), the phase rows (metrics.jsonl), the test
    evaluations (evals/), and the donors' work a call with the same key may take. It runs nothing: whale.run asks it
    whether a phase, a search or an evaluation was made (here, or by a donor run), does the work itself when not,
    and records it here. Entering a phase is saved before its work, so a resumed run finishes that phase first;
    leaving it is saved after its evaluation is logged."""

    def __init__(self, out, donors, h0):
        self.out, self.donors, self.h0 = out, list(donors), h0
        self.state = load_state(out)

    # what the record says
    def phase(self):
        """The phases finished."""
        return self.state["phase"]

    def running(self):
        """The kind of the phase a killed run left unfinished, else None."""
        return self.state["running"]

    def last_kind(self):
        return (self.state["kinds"] or [None])[-1]

    def harness(self):
        """The harness the run goes on with: the last harness phase's winner, else h0."""
        return resolved_path(self.state["harness"], self.out) or os.path.abspath(self.h0)

    def rounds_done(self):
        return sum(self.state["archive_iterations"].values())

    def harness_rollouts(self):
        """The harness scoring's rollouts, over every archive (the run's other rollouts are its RSFT steps)."""
        return sum(self.state["harness_rollouts"].values())

    def phase_start(self, step):
        """The RSFT step the running phase began at; `step`, the current one, for a phase not yet entered."""
        return step if self.state["running"] is None else self.state["phase_start_step"]

    # the phases
    def log_start(self, steps, rounds):
        """The run's first row: its budgets."""
        if not any(r.get("event") == "start" for r in read_rows(self.out)):
            append_jsonl(os.path.join(self.out, "metrics.jsonl"), {"event": "start", "weight_steps": steps,
                                                                   "harness_rounds": rounds,
                                                                   "time": time.time()})

    def enter(self, kind, step, key=None):
        """A new phase is remembered before its work starts, so a resumed run finishes it first; step: the RSFT
        step it starts at; key: what a weight phase starts from (its snapshot's key). -> (the step the phase
        began at, its key): a resumed phase's own, else these"""
        if self.state["running"] is None:
            self.state.update(running=kind, phase_start_step=step, phase_key=key)
            self.save()
        return self.state["phase_start_step"], self.state["phase_key"]

    def close_phase(self, kind, harness):
        """The phase is over, the run going on with `harness`: recorded here, saved (save) once its row is
        logged. -> the phase's number"""
        i = self.state["phase"] + 1
        self.state.update(phase=i, kinds=self.state["kinds"] + [kind], running=None, phase_start_step=None,
                          phase_key=None, harness=stored_path(harness, self.out))
        return i

    def log_eval(self, row):
        """A run killed between logging and saving its state logs the same evaluation again on resume: skip it."""
        if not any(r.get("event") == "eval" and r["phase"] == row["phase"] for r in read_rows(self.out)):
            append_jsonl(os.path.join(self.out, "metrics.jsonl"), row)

    def save(self):
        save_state(self.out, self.state)

    def write_summary(self, about, rsft_steps):
        """summary.json: `about` (domain, method, preset, model, k), the best and the final test evaluation of
        the finished run, its totals."""
        phases = [r for r in read_rows(self.out) if r.get("event") == "eval"]
        evals = [r for r in phases if r["mean_at_k"] is not None]  # --test-evals ends: the first and the last
        best = max(evals, key=lambda r: (r["mean_at_k"], -r["rollouts"]))
        summary = {**about, "best_mean_at_k": best["mean_at_k"], "rollouts_to_best": best["rollouts"],
                   "best_phase": best["phase"], "final_mean_at_k": evals[-1]["mean_at_k"],
                   # the final harness without the model, on the same test tasks
                   "final_null_mean_at_k": evals[-1].get("null_mean_at_k"),
                   "total_rollouts": evals[-1]["rollouts"], "phases": len(phases) - 1,
                   "rsft_steps": rsft_steps, "harness_rounds": self.rounds_done(),
                   "final_harness": stored_path(self.harness(), self.out), "test_tasks": evals[-1]["test_tasks"]}
        write_json(os.path.join(self.out, "summary.json"), summary)
        return summary

    # the weights: a donor's snapshot with the same key, the phase's own kept for the others
    def find_snapshot(self, key):
        """The snapshot a donor run made at the end of a weight phase with this key, else None."""
        return find_snapshot(self.donors, key)

    def keep_snapshot(self, weights, step, key):
        """The checkpoint that ends a weight phase, kept as weights/snapshot-<step> for the other runs."""
        snapshot_weights(weights, step, key)

    # the harness archives
    def archive_for(self, weights):
        """-> (the archive a harness phase searches in, the rounds it already holds): the last one if the weights
        have not changed since it ran (whatever the method: no search is repeated or charged twice), else a new
        one, harness_w<weight phases>."""
        last = list(self.state["archive_weights"])[-1:]
        if last and self.state["archive_weights"][last[0]] == weights:
            name = last[0]
        else:
            name = f"harness_w{self.state['kinds'].count('weight')}"
        return name, self.state["archive_iterations"].get(name, 0)

    def take_archive(self, name, key):
        """A new archive: a donor's, copied, if it searched with the same key (the weights, the seed harness, the
        config); the search then replays its rounds as far as it needs."""
        adopt_archive(os.path.join(self.out, name), key, self.donors)

    def record_search(self, name, weights, result):
        """The search's counters of archive `name` (saved with the phase's end)."""
        self.state["archive_weights"][name] = weights
        self.state["archive_iterations"][name] = result["rounds"]
        self.state["harness_rollouts"][name] = result["rollouts"]

    # the test evaluations
    def evaluation(self, tag, weights, harness, config):
        """The stats of evals/<tag>.json: read back when this run made it, copied with its traces when this run or
        a donor made the same one (the weights, the harness's content, the config); None: not made."""
        folder = Path(self.out, "evals")
        path = folder / f"{tag}.json"
        if path.exists():
            return read_json(path)["stats"]
        folder.mkdir(parents=True, exist_ok=True)
        return copy_evaluation(evaluation_key(weights, harness, config), [self.out, *self.donors], path,
                               f"test evaluation ({tag})")

    def new_traces(self, tag):
        """Where an evaluation writes its traces (an evaluation killed midway starts over)."""
        traces = Path(self.out, "evals", f"{tag}.traces.jsonl")
        traces.unlink(missing_ok=True)
        return traces

    def record_evaluation(self, tag, weights, harness, config, result):
        """evals/<tag>.json: the evaluation's key and result ({"stats", "per_task", "sources"}). -> its stats"""
        write_json(Path(self.out, "evals", f"{tag}.json"), {"key": evaluation_key(weights, harness, config),
                                                            **result})  # last: marks it done
        return result["stats"]

    # a damaged folder
    def repair(self):
        """Rebuild, exactly, what check_run_folder found lost or damaged and rebuildable, before the run goes on:
        a seed harness copy, an archive's index (summary.jsonl, frontier.json), weights/metrics.jsonl (the
        checkpoint's history). -> [(phase, weights id, adapter folder or None, harness)] of the test evaluations
        lost, the base model's first: whale evaluates them again (the same weights, harness and seeds give the
        same scores)."""
        out, state = self.out, self.state
        lost = lost_evaluations(out, state)
        for i in lost:
            for name in (f"phase_{i}.json", f"phase_{i}.traces.jsonl"):
                Path(out, "evals", name).unlink(missing_ok=True)
        if not os.path.exists(os.path.join(out, "state.json")):
            return []  # no phase started: phase 0 is evaluated first, as in a fresh run
        sources = [os.path.abspath(self.h0)] + sorted(
            str(p) for run_dir in [out, *self.donors] for p in Path(run_dir).glob("harness_w*/candidates/*/harness.py"))
        for seed in sorted(lost_seeds(out, state)):
            restore_seed(Path(seed).parent.parent.parent, sources, start_over(out))
        running = f"harness_w{state['kinds'].count('weight')}" if state["running"] == "harness" else None
        for name, iterations in state["archive_iterations"].items():
            if name != running:  # a running search rebuilds its own index as it resumes
                rebuild_index(Path(out, name), iterations)
        ckpt = Path(out, "weights", "ckpt")
        if ckpt.exists():
            history = read_json(ckpt / "state.json")["history"]
            try:
                same = read_jsonl(ckpt.parent / "metrics.jsonl") == history
            except ValueError:  # a cut line
                same = False
            if not same:
                write_jsonl(ckpt.parent / "metrics.jsonl", history)
                print(f"{ckpt.parent / 'metrics.jsonl'}: rebuilt from the checkpoint's history")
        rows = phase_rows(out, state)
        redo = [(i, *evaluation_inputs(out, state, rows, i, self.h0)) for i in lost if i <= state["phase"]]
        return sorted(redo, key=lambda r: r[2] is not None)  # an engine: the base model's first


def evaluation_key(weights, harness, config):
    """A test evaluation's key: the weights' id, the harness's content, the test config's hash."""
    return {"weights": weights, "harness": file_sha(harness), "config": config_hash(config)}


# -----------------------------------------------------------------------------
# cross-method reuse: a donor's weight phase, search or evaluation with the same key

def snapshot_weights(weights, step, key):
    """Keep the checkpoint that ends a weight phase as weights/snapshot-<step>/, with key.json saying what
    it holds, so another run of this command can start from it instead of redoing its steps."""
    dst = Path(weights, f"snapshot-{step:06d}")
    if (dst / "key.json").exists():
        return
    shutil.rmtree(dst, ignore_errors=True)
    link_tree(Path(weights, "ckpt").resolve(), dst)
    write_json(dst / "key.json", {"key": key})  # last: it counts now


def find_snapshot(donors, key):
    """The snapshot a donor run made at the end of a weight phase with this key, else None."""
    for donor in donors:
        for key_path in sorted(Path(donor, "weights").glob("snapshot-*/key.json")):
            if read_json(key_path).get("key") == key:
                return key_path.parent
    return None


def adopt_archive(archive, key, donors):
    """Before a harness phase starts a new archive: if a donor run searched with the same key, copy its archive
    (stagewise after weight phases that accepted nothing is harness-only). Real copies, not hard links: the index
    files are rewritten. whale_key.json, which says what the archive searched, is written here, by whale itself
    (a proposer never writes into the run folder)."""
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
