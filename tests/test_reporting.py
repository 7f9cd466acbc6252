"""--report-to: the run folder's rows sent live to wandb or tensorboard, checked with stand-in modules injected
into sys.modules (no network, no real wandb or tensorboard)."""
import importlib.machinery
import json
import sys
import time
import types
from types import SimpleNamespace

import pytest

import whale
import domains
from lib import cli
from lib.run_folder import report_to


class StandInWandb(types.ModuleType):
    """wandb's init / define_metric / log / finish, recorded."""

    def __init__(self):
        super().__init__("wandb")
        self.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # libraries ask find_spec("wandb")
        self.runs = []

    def init(self, **kw):
        run = SimpleNamespace(kw=kw, logged=[], axes={}, finished=False)
        run.define_metric = lambda name, step_metric=None: run.axes.__setitem__(name, step_metric)
        run.log = lambda row: run.logged.append(row)
        run.finish = lambda: setattr(run, "finished", True)
        self.runs.append(run)
        return run


@pytest.fixture
def wandb(monkeypatch):
    module = StandInWandb()
    monkeypatch.setitem(sys.modules, "wandb", module)
    return module


@pytest.fixture
def tensorboard(monkeypatch):
    scalars, writers = [], []

    class SummaryWriter:
        def __init__(self, log_dir):
            writers.append(log_dir)

        def add_scalar(self, name, value, step):
            scalars.append((name, value, step))

        def flush(self):
            pass

        def close(self):
            writers.append("closed")

    package = types.ModuleType("tensorboard")
    package.__spec__ = importlib.machinery.ModuleSpec("tensorboard", None)
    monkeypatch.setitem(sys.modules, "tensorboard", package)
    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = SummaryWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    return scalars, writers


def write_run(out, steps=2, half_line=False):
    """A run folder as whale.py leaves it: RSFT rows, two harness archives, eval rows (a cut last line optional)."""
    (out / "weights").mkdir(parents=True, exist_ok=True)
    (out / "weights" / "metrics.jsonl").write_text("".join(json.dumps(
        {"step": s, "reward": s / 10, "accept_rate": 0.5, "prompts_accepted": s, "examples": 3 * s, "loss": None,
         "skipped": False, "rollouts": 8 * s, "lr": 1e-4}) + "\n" for s in range(1, steps + 1)))
    for n, series in ((1, [0.25, 0.5]), (3, [0.5, 0.5, 0.75])):
        (out / f"harness_w{n}").mkdir(exist_ok=True)
        (out / f"harness_w{n}" / "frontier.json").write_text(json.dumps({"best_series": series}))
    rows = [{"event": "start", "weight_steps": 4}, {"event": "eval", "phase": 0, "kind": "start", "step": 0,
                                                    "rollouts": 0, "mean_at_k": 0.125, "k": 8},
            {"event": "eval", "phase": 1, "kind": "harness", "step": 0, "rollouts": 16, "mean_at_k": 0.25,
             "harness_score": 0.5, "rounds": 1, "winner": "x.py"}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (out / "metrics.jsonl").write_text(text + ('{"event": "eval", "pha' if half_line else ""))


def test_rows_reads_every_family_and_leaves_a_line_being_written(tmp_path):
    write_run(tmp_path, half_line=True)
    got = report_to.rows(tmp_path)
    assert [(k, x) for k, _, x, _ in got] == [
        (("rsft", 1), 1), (("rsft", 2), 2),
        (("harness", 1, 0), 0), (("harness", 1, 1), 1), (("harness", 3, 0), 2), (("harness", 3, 1), 3),
        (("harness", 3, 2), 4), (("test", 0), 0), (("test", 1), 1)]
    rsft = got[1][3]
    assert rsft == {"rsft/reward": 0.2, "rsft/accept_rate": 0.5, "rsft/prompts_accepted": 2, "rsft/examples": 6,
                    "rsft/rollouts": 16, "rsft/lr": 1e-4}  # loss None and the flag `skipped` left out
    assert got[-1][3] == {"test/mean_at_k": 0.25, "test/step": 0, "test/rollouts": 16, "test/harness_score": 0.5,
                          "test/rounds": 1}
    assert report_to.rows(tmp_path / "nothing yet") == []


def watched(out, report_to):
    """watch's arguments for a smoke math run in `out`."""
    return report_to, str(out), {"report_to": report_to, "preset": "smoke", "domain": "math", "method": "whale"}


def test_wandb_gets_each_row_once_live_and_on_its_own_axis(tmp_path, wandb):
    write_run(tmp_path, steps=1)
    with report_to.watch(*watched(tmp_path, "wandb"), every=3600) as reporter:
        run = wandb.runs[0]
        assert run.kw["project"] == "whale" and run.kw["name"] == f"smoke/math/{tmp_path.name}"
        assert run.axes["rsft/*"] == "rsft/step" and run.axes["test/*"] == "test/phase"
        reporter.sync()
        assert len(run.logged) == 1 + 5 + 2 and run.logged[0] == {
            "rsft/reward": 0.1, "rsft/accept_rate": 0.5, "rsft/prompts_accepted": 1, "rsft/examples": 3,
            "rsft/rollouts": 8, "rsft/lr": 1e-4, "rsft/step": 1}
        write_run(tmp_path, steps=3)  # two more RSFT steps land: only they are sent
        reporter.sync()
        assert [r["rsft/step"] for r in run.logged[8:]] == [2, 3]
        assert not run.finished
    assert run.finished and len(run.logged) == 10  # the last sync at close sent nothing twice


def test_the_thread_sends_rows_while_the_run_goes_on(tmp_path, wandb):
    with report_to.watch(*watched(tmp_path, "wandb"), every=0.05):
        write_run(tmp_path, steps=2)  # written after the start, as a running phase does
        deadline = time.time() + 10
        while len(wandb.runs[0].logged) < 9 and time.time() < deadline:
            time.sleep(0.05)
        assert len(wandb.runs[0].logged) == 9 and not wandb.runs[0].finished


def test_tensorboard_scalars_per_family_axis(tmp_path, tensorboard):
    scalars, writers = tensorboard
    write_run(tmp_path, steps=2)
    with report_to.watch(*watched(tmp_path, "tensorboard"), every=3600):
        pass
    assert writers[0].startswith(str(tmp_path / "tensorboard")) and writers[-1] == "closed"
    assert ("rsft/reward", 0.2, 2) in scalars and ("harness/best", 0.75, 4) in scalars
    assert ("test/mean_at_k", 0.25, 1) in scalars


def test_missing_package_is_one_line_and_the_default_imports_nothing(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    monkeypatch.setattr(report_to.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit, match=r"^whale.py: error: --report-to wandb needs the wandb package: pip install wandb$"):
        with report_to.watch(*watched(tmp_path, "wandb")):
            pass
    assert report_to.missing("tensorboard") == "--report-to tensorboard needs the tensorboard package: pip install tensorboard"
    with report_to.watch(*watched(tmp_path, None)) as reporter:
        assert reporter is None and "wandb" not in sys.modules


def test_a_failing_sink_never_stops_the_run(tmp_path, wandb, capsys):
    write_run(tmp_path)
    def unreachable(row):
        raise ConnectionError("wandb.ai unreachable")

    with report_to.watch(*watched(tmp_path, "wandb"), every=3600) as reporter:
        wandb.runs[0].log = unreachable
        reporter.safe_sync()
    assert "report-to: ConnectionError: wandb.ai unreachable (the run goes on" in capsys.readouterr().err


def test_whale_run_reports_rsft_steps_harness_rounds_and_test_phases(tmp_path, wandb):
    out = tmp_path / "run"
    whale.main(["--domain", "math", "--method", "whale", "--preset", "smoke", "--out", str(out), "--report-to", "wandb"])
    run = wandb.runs[0]
    assert run.finished and run.kw["config"]["report_to"] == "wandb"
    steps = [r["rsft/step"] for r in run.logged if "rsft/step" in r]
    phases = [r["test/phase"] for r in run.logged if "test/phase" in r]
    rows = [json.loads(line) for line in (out / "weights" / "metrics.jsonl").read_text().splitlines()]
    assert sorted(steps) == [r["step"] for r in rows] and len(steps) >= 2
    assert sorted(phases) == list(range(len(phases))) and len(phases) >= 3
    assert any("harness/best" in r for r in run.logged)
    watched, plain = (whale.parse_args(["--domain", "math", "--preset", "smoke", *extra])[0]
                      for extra in (["--report-to", "wandb"], []))
    # watching a run changes none of its results: no config (so no reuse or resume key) names the flags
    assert cli.run_config(watched, domains.data_flags()) == cli.run_config(plain, domains.data_flags())
