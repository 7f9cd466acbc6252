"""The method table (lib/methods.py) is the one place a method is defined: a method a fork registers at test time
runs through whale.py (smoke), plan.py and report.py with no other file touched; so does a weight step registered
in rft.WEIGHT_STEPS and named by a row (tests/fixtures/tiny_weight_step.py)."""
import json

import pytest

from fixtures.tiny_method import STAGEWISE_FST
from fixtures.tiny_weight_step import H0, WHALE_PG, Digits, GroupBaseline
from lib import methods


def test_a_method_registered_at_test_time_runs_through_whale_plan_and_report(tmp_path, monkeypatch, capsys):
    import plan
    import report
    import whale
    monkeypatch.setitem(methods.METHODS, STAGEWISE_FST.name, STAGEWISE_FST)
    monkeypatch.chdir(tmp_path)
    harness = tmp_path / "h0.py"
    harness.write_text((whale.Path(__file__).parents[1] / "harnesses" / "math.py").read_text())
    run = ["--domain", "math", "--preset", "smoke", "--method", "stagewise-fst", "--harness", str(harness),
           "--test-limit", "2", "--harness-tasks", "2"]
    plan.main(run)
    printed = capsys.readouterr().out
    # stagewise's plan: 2 weight phases of 2 steps, then the harness phase (a fresh archive: h0 re-scored)
    assert "plan: stagewise-fst on math" in printed and "2 weight phases (2 + 2 steps), 1 harness phases" in printed
    assert "re-score + 1 rounds" in printed
    whale.main(run)
    out = tmp_path / "results" / "smoke" / "math" / "stagewise-fst"
    assert json.loads((out / "config.json").read_text())["prompt_only"] is True  # the row's prompt_only reached it
    phases = [r["kind"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
              if r["event"] == "eval"]
    assert phases == ["start", "weight", "weight", "harness"]
    assert json.loads((out / "summary.json").read_text())["method"] == "stagewise-fst"
    report.main(["--preset", "smoke", "--results", str(tmp_path / "results")])
    table = (tmp_path / "results" / "smoke" / "tables.md").read_text()
    assert "| stagewise-fst | " in table


def register_weight_step(monkeypatch):
    """The fixture's weight step, its method row and its smoke-sized domain, as a fork writes them."""
    import domains
    import rft
    monkeypatch.setitem(rft.WEIGHT_STEPS, "pg", GroupBaseline)
    monkeypatch.setitem(methods.METHODS, WHALE_PG.name, WHALE_PG)
    monkeypatch.setitem(domains.DOMAINS, "digits", Digits)


def test_a_weight_step_registered_at_test_time_runs_through_whale_plan_and_report(tmp_path, monkeypatch, capsys):
    """whale and whale-pg in one command: the same phases, but whale-pg's weight phases are its own (never whale's
    snapshot), its step updates the adapter on the successes of a smoke-sized run, and plan.py and the report
    name its step."""
    import plan
    import report
    import whale
    from lib.report.plots import panel_title
    from lib.run_folder.files import file_sha
    register_weight_step(monkeypatch)
    monkeypatch.chdir(tmp_path)
    harness = tmp_path / "h0.py"
    harness.write_text(H0)
    run = ["--domain", "digits", "--preset", "smoke", "--method", "whale", "whale-pg", "--harness", str(harness)]
    plan.main(run)
    printed = capsys.readouterr().out
    assert "weight step rsft:" in printed and "weight step pg:" in printed
    # whale-pg shares whale's start evaluation, never its weight phase (the time model's sharing rule)
    assert printed.count("reused from the runs before it in this process: phase 0's evaluation\n") == 1
    whale.main(run)
    printed = capsys.readouterr().out
    assert "taken from" not in printed  # no weight phase of one step is taken for the other
    out = tmp_path / "results" / "smoke" / "digits"
    steps = [json.loads(line) for line in (out / "whale-pg" / "weights" / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 4 and any(not r["skipped"] and r["loss"] is not None for r in steps)  # it learned
    assert sum(r["accept_rate"] for r in steps) > 0  # the smoke model's random replies succeed now and then
    state = json.loads((out / "whale-pg" / "weights" / "ckpt" / "state.json").read_text())
    assert state["weight_step"] == "pg" and json.loads((out / "whale-pg" / "config.json").read_text())[
        "weight_step"] == "pg"
    adapter = lambda m: file_sha(out / m / "weights" / "ckpt" / "adapter" / "adapter_model.safetensors")
    assert adapter("whale") != adapter("whale-pg")
    report.main(["--preset", "smoke", "--results", str(tmp_path / "results")])
    table = (tmp_path / "results" / "smoke" / "tables.md").read_text()
    assert "| whale-pg | " in table and "| method | searchqa | math | chess | digits (on the harness's answer) |" in table
    assert panel_title("whale-pg") == "whale-pg (weight step: pg)" and panel_title("harness-only") == "harness-only"


def test_two_methods_with_different_weight_steps_never_share_a_weight_phase(monkeypatch):
    """The weight phase's key (whale.py) holds the step through lib/cli.RSFTConfig, and the time model's sharing
    rule (plan.py's estimate) counts a phase shared only between methods of one step."""
    import whale
    from lib.cli import config_hash, run_config
    from lib.ops import time_model
    register_weight_step(monkeypatch)
    runs = whale.parse_args(["--domain", "math", "--preset", "smoke", "--method", "whale", "whale-pg"])
    ours, theirs = (run_config(args, {}) for args in runs)
    assert (ours.rsft.weight_step, theirs.rsft.weight_step) == ("rsft", "pg")
    assert config_hash(ours.rsft) != config_hash(theirs.rsft)  # whale.run's weight phase key: its "config"
    same = {k: v for k, v in vars(runs[1]).items() if k not in ("method", "out", "weight_step")}
    assert same == {k: v for k, v in vars(runs[0]).items() if k not in ("method", "out", "weight_step")}
    phases = whale.fixed_phases(ours, 8)
    assert time_model.shared_phases([("whale", phases), ("whale-pg", phases)]) == [0, 0]
    assert time_model.shared_phases([("whale", phases), ("whale", phases)]) == [0, len(phases)]


def test_an_experimental_row_stays_out_of_run_alls_table_and_runs_when_asked(monkeypatch, capsys):
    import plan
    import presets
    table = presets.table_methods()  # run_all.sh's table: the project's rows and any a fork added
    register_weight_step(monkeypatch)
    assert "whale-pg" in methods.METHODS and presets.table_methods() == table  # the others, in order
    plan.main(["--domain", "math", "--preset", "smoke", "--method", "whale-pg"])
    assert "plan: whale-pg on math" in capsys.readouterr().out


def test_a_weight_step_not_registered_is_one_line_before_any_model(monkeypatch, capsys):
    import rft
    import whale
    monkeypatch.setitem(methods.METHODS, "whale-ppo", methods.Method("whale-ppo", methods.ALTERNATE, methods.BOTH,
                                                                     weight_step="ppo"))
    with pytest.raises(SystemExit) as e:
        whale.main(["--domain", "math", "--preset", "smoke", "--method", "whale-ppo"])
    assert str(e.value.code) == ("whale.py: error: method whale-ppo names weight step 'ppo', which rft.WEIGHT_STEPS "
                                 f"does not register (it has {', '.join(rft.WEIGHT_STEPS)}): add "
                                 "WEIGHT_STEPS['ppo'] = YourStep in rft.py (README \"Adding a weight algorithm\")")


def test_a_weight_steps_weights_scale_each_trajectorys_nll_and_rsft_keeps_its_plain_mean():
    """weigh's weights reach the loss: each example's NLL times its trajectory's weight (the group baseline's
    advantages here), while RSFT's weights of 1 leave the loss as it was (the same sum)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    import rft
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    ex = [([5, 6, 7], [10, 11]), ([1, 2], [3])]
    with torch.no_grad():
        one = [rft.completion_nll(model, [e]).item() for e in ex]
        assert rft.completion_nll(model, ex, [0.5, -2.0]).item() == pytest.approx(0.5 * one[0] - 2.0 * one[1],
                                                                                   rel=1e-5)
        assert rft.completion_nll(model, ex, [1.0, 1.0]).item() == pytest.approx(sum(one), rel=1e-5)
    episodes = [{"task_id": t, "reward": r} for t, r in (("a", 1.0), ("a", 0.0), ("a", 0.0), ("b", 1.0), ("b", 1.0))]
    weighed = GroupBaseline.weigh(None, episodes)  # group b scored alike: it teaches nothing
    assert [(e["task_id"], round(w, 4)) for e, w in weighed] == [("a", 0.6667), ("a", -0.3333), ("a", -0.3333)]
    assert rft.RSFT.weigh(None, episodes) == [(e, 1.0) for e in episodes if e["reward"] == 1.0]
    assert rft.RSFT.loss_weights([1.0, 1.0]) is None and rft.RSFT.loss_weights([1.0, -0.5]) == [1.0, -0.5]
