"""What a first project on a laptop meets before its run: every CLI takes --threads and the cpu preset picks the
count from the cores it may use; plan.py --check warns in one line when h0 earns nothing with the run's model (a
weight step would train on nothing); rollout.py --show prints each episode's trace."""
import os

import pytest

import meta_harness
import plan
import presets
import rft
import rollout
import whale
from test_layout import parser_flags


def test_every_cli_takes_threads_and_the_cpu_preset_leaves_half_the_cores(monkeypatch):
    for main in (whale.main, plan.main, rft.main, rollout.main, meta_harness.main):
        assert "threads" in parser_flags(main, monkeypatch), main.__module__
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})  # a 2-core laptop
    assert presets.cpu_threads() == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert presets.cpu_threads() == 4
    [args] = whale.parse_args(["--domain", "math", "--preset", "cpu"])
    assert args.threads == presets.PRESETS["cpu"]["threads"]  # the preset's count, chosen at import
    [args] = whale.parse_args(["--domain", "math", "--preset", "cpu", "--threads", "3"])
    assert args.threads == 3  # a flag given still wins


def fake_episodes(won):
    """rollout.run_episodes as check_h0 calls it, `won` of the episodes succeeding."""
    def run(domain, harness, tasks, policy, samples=1, **kw):
        episodes = [{"task_id": t["id"], "reward": 0.0} for t in tasks for _ in range(samples)]
        for e in episodes[:won]:
            e["reward"] = 1.0
        return episodes
    return run


@pytest.mark.parametrize("won", [0, 3])
def test_check_warns_in_one_line_when_h0_earns_nothing_with_the_runs_model(monkeypatch, capsys, won):
    """countdown under the cpu preset: its bundled h0 earned 0 of 128 train episodes with SmolLM2-135M
    (scripts/calibrate_cpu_h0.py, presets.py CPU); here the model's episodes are stand-ins."""
    monkeypatch.setattr(whale, "load_policy", lambda args: object())
    monkeypatch.setattr(rollout, "run_episodes", fake_episodes(won))
    runs = whale.parse_args(["--domain", "countdown", "--preset", "cpu", "--method", "harness-only", "whale"])
    lines = plan.check_h0(runs)
    said = f"{16 * 4} episodes of {runs[0].harness} on 16 train tasks under --model cpu"  # 16 tasks x G = 4
    if won:
        assert lines == [f"ok   h0 (countdown): 3 of {said} succeed"]
    else:
        assert lines == [f"WARN h0 (countdown): none of {said} succeeds, so a weight step would train on nothing: "
                         "give countdown an h0 its model can start from (presets.py CPU, calibrated with "
                         "scripts/calibrate_cpu_h0.py) or a larger --model"]
    # a harness-only run trains no weights, and the smoke model earns nothing by design: no line for either
    assert plan.check_h0(runs[:1]) == []
    assert plan.check_h0(whale.parse_args(["--domain", "countdown", "--preset", "smoke"])) == []


def test_show_prints_each_episodes_trace(capsys):
    rollout.main(["--domain", "countdown", "--harness", "harnesses/countdown.py", "--model", "smoke", "--split",
                  "train", "--limit", "2", "--k", "1", "--max-new-tokens", "4", "--show"])
    out = capsys.readouterr().out
    assert out.count("\n== cd-") + out.startswith("== cd-") == 2 and out.count("  call 1 reply: ") == 2
    assert "Numbers: " in out and "reward 0.0" in out
