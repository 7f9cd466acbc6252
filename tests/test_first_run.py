"""What a first project on a laptop meets before its run: every CLI takes --threads and the cpu preset picks the
count from the cores it may use; plan.py --check warns in one line when h0 earns nothing with the run's model (a
weight step would train on nothing); rollout.py --show prints each episode's trace."""
import os

import pytest
import torch

import meta_harness
import plan
import presets
import rft
import rollout
import whale
from test_layout import parser_flags


def test_every_cli_takes_threads_and_the_cpu_preset_chooses_at_its_start(monkeypatch):
    for main in (whale.main, plan.main, rft.main, rollout.main, meta_harness.main):
        assert "threads" in parser_flags(main, monkeypatch), main.__module__
    [args] = whale.parse_args(["--domain", "math", "--preset", "cpu"])
    assert args.threads == "auto"  # chosen when the run starts (rollout.apply_args), not when presets is imported
    [args] = whale.parse_args(["--domain", "math", "--preset", "cpu", "--threads", "3"])
    assert args.threads == 3  # a flag given still wins


def stat_file(tmp_path, name, ticks):
    """A /proc/stat with one cpuN line per core: ticks[n] = (user, idle) clock ticks of core n."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{n} {user} 0 0 {idle} 0 0 0 0 0 0" for n, (user, idle) in enumerate(ticks)]
    path = tmp_path / name
    path.write_text("\n".join(lines + ["intr 1 2 3", "ctxt 5"]) + "\n")
    return str(path)


def test_threads_fit_what_the_machine_is_doing(tmp_path):
    # two cores, 50 ticks on each between the readings (half a second at 100 Hz)
    before = presets.cpu_times({0, 1}, stat_file(tmp_path, "before", [(1000, 5000), (2000, 6000)]))
    assert before == (3000, 14000)
    idle = presets.cpu_times({0, 1}, stat_file(tmp_path, "idle", [(1000, 5050), (2000, 6050)]))
    busy = presets.cpu_times({0, 1}, stat_file(tmp_path, "busy", [(1050, 5000), (2000, 6050)]))  # a busy loop
    ours = presets.cpu_times({0, 1}, stat_file(tmp_path, "ours", [(1040, 5010), (2000, 6050)]))  # our own 40 ticks
    assert presets.busy_cores(before, idle, 0, 2) == 0.0
    assert presets.busy_cores(before, busy, 0, 2) == 1.0
    assert presets.busy_cores(before, ours, 40, 2) == 0.0  # this process's own time is not another's
    assert presets.cpu_threads(2, 0.0) == 2  # idle 2-core machine: both cores
    assert presets.cpu_threads(2, 1.0) == 1  # another process holds a core: one
    assert presets.cpu_threads(2, 2.0) == 1  # never none
    assert presets.cpu_threads(8, 0.3) == 8 and presets.cpu_threads(8, 2.6) == 5
    # a core outside this process's affinity (a container's share) counts for nothing
    assert presets.cpu_times({1}, stat_file(tmp_path, "one", [(9, 9), (2000, 6000)])) == (2000, 8000)


@pytest.mark.parametrize("busy, threads", [(0, 2), (50, 1)])
def test_threads_auto_is_chosen_at_the_start_and_said_in_one_line(monkeypatch, capsys, busy, threads):
    readings = iter([(3000, 14000), (3000 + busy, 14100)])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(presets, "cpu_times", lambda cores: next(readings))
    monkeypatch.setattr(presets, "SAMPLE_S", 0.0)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # the suite keeps its own count
    [args] = whale.parse_args(["--domain", "math", "--preset", "cpu"])
    rollout.apply_args(args)
    assert args.threads == threads
    line = capsys.readouterr().out
    assert line == (f"torch threads: {threads} (2 cores this process may use, {busy / 50:.1f} of them busy with other "
                    "processes; --threads N sets it)\n")


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
    # a harness-only run trains no weights, and the random smoke model is not asked: no line for either
    assert plan.check_h0(runs[:1]) == []
    assert plan.check_h0(whale.parse_args(["--domain", "countdown", "--preset", "smoke"])) == []


def test_show_prints_each_episodes_trace(capsys):
    rollout.main(["--domain", "countdown", "--harness", "harnesses/countdown.py", "--model", "smoke", "--split",
                  "train", "--limit", "2", "--k", "1", "--max-new-tokens", "4", "--show"])
    out = capsys.readouterr().out
    assert out.count("\n== cd-") + out.startswith("== cd-") == 2 and out.count("  call 1 reply: ") == 2
    assert "Numbers: " in out and "reward 0.0" in out


def test_results_do_not_depend_on_the_thread_count():
    """The cpu model's shapes (SmolLM2-135M's widths, two of its layers, seeded weights): its logits and every
    gradient of a training step are the same, bit for bit, at 1 and 2 torch threads, so --threads auto changes the
    time of a run and never its table."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                         num_hidden_layers=2, vocab_size=49152, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, config.vocab_size, (4, 48))
    runs, before = [], torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            model.zero_grad()
            out = model(ids, labels=ids)
            out.loss.backward()
            runs.append([out.logits.detach(), *(p.grad.clone() for p in model.parameters())])
    finally:
        torch.set_num_threads(before)
    assert len(runs[0]) > 10 and all(torch.equal(a, b) for a, b in zip(*runs))
