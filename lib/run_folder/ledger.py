"""One run's record: the rows of its metrics.jsonl, one per finished phase, appended after the phase's test
evaluation. The rows are the run's state: the phases finished and their kinds, the step, the weights and the
harness the run goes on with, the proposer rounds and rollouts spent, each archive's weights and rounds, and the full
key of every store item a phase made ("stored"). A run killed midway appends nothing for the phase it was in, so a
rerun enters the same phase again (the method table names it from the same rows), and that phase goes on from the
store (lib/run_folder/store.py), which holds its last step or round; whale.restore copies the files of finished
phases back from the store, over whatever the folder holds. The rows, config.json and the store are all a rerun needs.

    ledger = Ledger(out, h0)
    ledger.step, ledger.harness, ledger.rounds, ledger.step_rows  # where the last finished phase left the run
    ledger.archive_for(weights)                                   # (archive, its rounds, its key): continued or new
    ledger.log_start(steps, rounds, unconfined); ledger.log_phase(row); ledger.write_summary(about)

Before a rerun, check_run_folder and check_same_settings check its rows, h0 and its settings."""
import json
import os
import time

from lib.cli import NO_RESULT_FLAGS
from lib.common.json_files import append_jsonl, read_json, read_jsonl, write_json
from lib.run_folder.files import file_sha, start_over, stored_path

# the row of a phase whose test evaluation the run skips (--test-evals ends: never the first or the last)
NOT_EVALUATED = {"mean_at_k": None, "test_tasks": 0}


class Ledger:
    def __init__(self, out, h0):
        self.out, self.h0 = out, os.path.abspath(h0)
        path = os.path.join(out, "metrics.jsonl")
        rows = read_jsonl(path, fix="a run killed while writing it? delete that line and rerun")
        # the start row (the budgets, h0's content, whether harness and proposer code run unconfined), None before it
        self.start = next((r for r in rows if r.get("event") == "start"), None)
        self.rows = [r for r in rows if r.get("event") == "eval"]
        old = [r for r in self.rows if "stored" not in r]
        if old:  # rows from before a run's progress lived in the store: they name no store item
            raise ValueError(f"{path} was written by an older whale.py (it lacks stored): {move_aside(out)}")
        if [r["phase"] for r in self.rows] != list(range(len(self.rows))):
            raise ValueError(f"damaged run file {path} (its phase rows are not 0, 1, 2, ...): {start_over(out)}")

    # where the last finished phase left the run
    @property
    def phase(self):
        return len(self.rows) - 1

    @property
    def last_kind(self):
        return self.rows[-1]["kind"] if len(self.rows) > 1 else None

    @property
    def step(self):
        return self.rows[-1]["step"] if self.rows else 0

    @property
    def harness(self):
        """The harness the run goes on with: the last harness phase's winner, else h0."""
        winners = [r["winner"] for r in self.rows if r["kind"] == "harness"]
        return os.path.abspath(os.path.join(self.out, winners[-1])) if winners else self.h0

    @property
    def step_rows(self):
        """Every finished weight phase's step rows, in order."""
        return [step for r in self.rows for step in r.get("step_rows", [])]

    @property
    def rounds(self):
        return sum(r["rounds"] for r in self.rows if r["kind"] == "harness")

    def harness_rollouts(self, row):
        """The harness scoring's rollouts over every archive as of `row`, the one of the phase ending now (each
        harness row holds its archive's rollouts so far)."""
        rows = self.rows + [row]
        return sum({r["archive"]: r["archive_rollouts"] for r in rows if "archive" in r}.values())

    def archive_for(self, weights):
        """-> (the archive a harness phase searches in, the rounds it holds, its store key): the last one if the
        weights have not changed since it ran (no search is repeated or charged twice), else a new one,
        harness_w<weight phases>, with no rounds and no key yet."""
        last = [r for r in self.rows if r["kind"] == "harness"][-1:]
        if last and last[0]["weights"] == weights:
            return last[0]["archive"], last[0]["archive_rounds"], last[0]["stored"]["search"]
        return f"harness_w{sum(r['kind'] == 'weight' for r in self.rows)}", 0, None

    # what the run writes
    def log_start(self, steps, rounds, unconfined):
        """The start row, at the run's first start: the budgets, h0's content and whether harness and proposer code
        run unconfined (--unsafe-no-sandbox), which a resume must find unchanged (check_run_folder)."""
        if self.start is None:
            self.start = {"event": "start", "weight_steps": steps, "harness_rounds": rounds, "h0": file_sha(self.h0),
                          "unconfined": unconfined, "time": time.time()}
            append_jsonl(os.path.join(self.out, "metrics.jsonl"), self.start)

    def log_phase(self, row):
        """A finished phase's row, its test evaluation done: from now on the run goes on from it."""
        row = {"event": "eval", "phase": len(self.rows), **row}
        append_jsonl(os.path.join(self.out, "metrics.jsonl"), row)
        self.rows.append(row)

    def write_summary(self, about):
        """summary.json: `about` (domain, method, preset, model, k, ...), the best and the final test evaluation of
        the finished run, its totals."""
        evals = [r for r in self.rows if r["mean_at_k"] is not None]  # --test-evals ends: the first and the last
        best = max(evals, key=lambda r: (r["mean_at_k"], -r["rollouts"]))
        summary = {**about, "best_mean_at_k": best["mean_at_k"], "rollouts_to_best": best["rollouts"],
                   "best_phase": best["phase"], "final_mean_at_k": evals[-1]["mean_at_k"],
                   # the final harness without the model, on the same test tasks
                   "final_null_mean_at_k": evals[-1].get("null_mean_at_k"),
                   "total_rollouts": evals[-1]["rollouts"], "phases": self.phase,
                   "rsft_steps": self.step, "harness_rounds": self.rounds,
                   "final_harness": stored_path(self.harness, self.out), "test_tasks": evals[-1]["test_tasks"]}
        write_json(os.path.join(self.out, "summary.json"), summary)
        return summary


def check_run_folder(out, h0, unconfined):
    """The run folder before any work or model: its rows read back (a damaged row is one line naming the fix), h0's
    content the one the run started with (phase 0 evaluated it), and harness and proposer code run as they did then:
    a run under --unsafe-no-sandbox keeps its work in a store of its own, one in the sandbox in the shared one
    (whale.store_root), and a resume never mixes the two. Every other file a rerun needs it copies back from the store
    (whale.restore)."""
    start = Ledger(out, h0).start
    if start is None:
        return
    if start["h0"] != file_sha(h0):
        raise ValueError(f"{h0} changed since {out} started: restore it, or {move_aside(out)}")
    if start["unconfined"] != unconfined:
        flag = "with --unsafe-no-sandbox" if start["unconfined"] else "in the sandbox (without --unsafe-no-sandbox)"
        raise ValueError(f"{out} was started {flag}: resume it the same way, or {move_aside(out)}")


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
