"""Watching a run: --report-to wandb|tensorboard sends the rows the run folder already holds, live: RSFT reward and
accepted counts per step (weights/metrics.jsonl), the archive-best harness score per iteration of each harness
phase (harness_w<n>/frontier.json), and test mean@k per phase (metrics.jsonl). A thread reads those files every
REPORT_EVERY_S seconds and sends each row once, so the run's loop is untouched and its files stay the truth. By
default (no flag) nothing is sent and neither package is imported.

    with report_to.watch(args.report_to, args.out, vars(args)):   # a no-op without --report-to
        run(...)

Every start of a run is a new wandb run or tensorboard folder, holding the whole history read back from the
files, so a resumed run shows each point once.
"""
import contextlib
import importlib.util
import json
import os
import sys
import threading
import time
from pathlib import Path

PACKAGES = {"wandb": "wandb", "tensorboard": "tensorboard"}  # --report-to: the package it needs
REPORT_EVERY_S = 30.0
RSFT_FIELDS = ("reward", "accept_rate", "prompts_accepted", "examples", "accepted_tokens", "loss", "rollouts", "epoch",
               "lr")
TEST_FIELDS = ("mean_at_k", "step", "rollouts", "harness_score", "rounds", "steps", "test_tasks", "seconds")
AXES = {"rsft": "rsft/step", "harness": "harness/step", "test": "test/phase"}  # each family's x axis


def add_args(parser):
    p = parser.add_argument_group("live metrics")
    p.add_argument("--report-to", default=None, choices=sorted(PACKAGES),
                   help="also send the metrics live: wandb (WANDB_PROJECT, default whale; WANDB_MODE) or tensorboard "
                        "(<out>/tensorboard/); default: the run folder's files only")


def missing(kind):
    """The one-line error when --report-to's package is not installed, else None (nothing is imported)."""
    package = PACKAGES[kind]
    try:
        found = package in sys.modules or importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"--report-to {kind} needs the {package} package: pip install {package}"


# -----------------------------------------------------------------------------
# the rows: read back from the run folder's files, each with a key that identifies it across reads


def read_rows(path):
    """The JSON rows of a .jsonl file; a line still being written (no newline yet, or cut) is left for the next read."""
    rows = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.endswith("\n"):
                    break
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict):
                    rows.append(row)
    return rows


def numbers(row, fields, family):
    """The numeric fields of a row, named family/field (None and booleans left out)."""
    return {f"{family}/{k}": row[k] for k in fields
            if isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool)}


def archives(out):
    """[(n, best_series)] of the run's harness archives harness_w<n>, in order."""
    found = []
    for folder in Path(out).glob("harness_w*"):
        try:
            found.append((int(folder.name[len("harness_w"):]), json.loads((folder / "frontier.json").read_text())))
        except (ValueError, OSError):  # not an archive, or no frontier yet
            continue
    return [(n, frontier.get("best_series", [])) for n, frontier in sorted(found, key=lambda x: x[0])]


def rows(out):
    """[(key, family, x, metrics)] of every row the run folder holds now. The harness axis counts every archive's
    evaluations in order (iteration 0 is the incoming harness re-scored under the current weights)."""
    out = Path(out)
    found = [(("rsft", r["step"]), "rsft", r["step"], numbers(r, RSFT_FIELDS, "rsft"))
             for r in read_rows(out / "weights" / "metrics.jsonl") if "step" in r]
    offset = 0
    for n, series in archives(out):
        found += [(("harness", n, i), "harness", offset + i, {"harness/best": best, "harness/archive": n,
                                                                "harness/iteration": i})
                  for i, best in enumerate(series) if isinstance(best, (int, float))]
        offset += len(series)
    found += [(("test", r["phase"]), "test", r["phase"], numbers(r, TEST_FIELDS, "test"))
              for r in read_rows(out / "metrics.jsonl")
              if r.get("event") == "eval" and "phase" in r and r.get("mean_at_k") is not None]
    return found


# -----------------------------------------------------------------------------
# where they go


class WandbSink:
    def __init__(self, out, flags):
        import wandb
        where = f"{flags['preset']}/{flags['domain']}"
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "whale"), dir=out,
                              name=f"{where}/{Path(out).name}", group=where, config=dict(flags))
        for family, axis in AXES.items():  # each family on its own x axis (wandb's own step must only grow)
            self.run.define_metric(axis)
            self.run.define_metric(f"{family}/*", step_metric=axis)

    def log(self, family, x, metrics):
        self.run.log({**metrics, AXES[family]: x})

    def flush(self):
        pass

    def close(self):
        self.run.finish()


class TensorBoardSink:
    def __init__(self, out, flags):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(log_dir=os.path.join(out, "tensorboard", time.strftime("%Y%m%d-%H%M%S")))

    def log(self, family, x, metrics):
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, x)

    def flush(self):
        self.writer.flush()

    def close(self):
        self.writer.close()


SINKS = {"wandb": WandbSink, "tensorboard": TensorBoardSink}


class Reporter:
    """Sends each row of the run folder once: sync() from a thread every `every` seconds, and once more at close."""

    def __init__(self, out, sink, every=REPORT_EVERY_S):
        self.out, self.sink, self.every = out, sink, every
        self.sent, self.lock, self.stopped = set(), threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self.loop, name="report-to", daemon=True)

    def sync(self):
        with self.lock:
            for key, family, x, metrics in rows(self.out):
                if key not in self.sent and metrics:
                    self.sink.log(family, x, metrics)
                    self.sent.add(key)
            self.sink.flush()

    def safe_sync(self):
        try:
            self.sync()
        except Exception as e:  # reporting never stops a run: its files keep every row
            print(f"report-to: {type(e).__name__}: {e} (the run goes on; its files keep every row)", file=sys.stderr)

    def loop(self):
        while not self.stopped.wait(self.every):
            self.safe_sync()

    def close(self):
        self.stopped.set()
        self.thread.join()
        self.safe_sync()
        self.sink.close()


@contextlib.contextmanager
def watch(kind, out, flags, every=REPORT_EVERY_S):
    """Report the rows of run folder `out` live while the block runs (see the module docstring), to `kind` (wandb,
    tensorboard; None: nothing). flags: the run's, as config.json holds them (wandb's run config)."""
    if not kind:
        yield None
        return
    why = missing(kind)
    if why:
        raise SystemExit(f"whale.py: error: {why}")
    os.makedirs(out, exist_ok=True)
    try:
        sink = SINKS[kind](out, flags)
    except Exception as e:  # e.g. wandb without a login: one line, before the run starts
        raise SystemExit(f"whale.py: error: --report-to {kind} could not start ({type(e).__name__}: {e}); for wandb: "
                         "`wandb login`, or WANDB_MODE=offline") from None
    reporter = Reporter(out, sink, every)
    reporter.thread.start()
    try:
        yield reporter
    finally:
        reporter.close()
