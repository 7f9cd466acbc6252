"""whale.py: the phase plan, the switching rules on fixed reward series, and resuming a killed run."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import meta_harness
import whale

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_plan_phases_per_method():
    assert whale.plan_phases("whale", 2) == ["weight", "harness", "weight", "harness"]
    assert whale.plan_phases("fast-slow", 1) == ["weight", "harness"]
    assert whale.plan_phases("stagewise", 2) == ["weight", "weight", "harness", "harness"]
    assert whale.plan_phases("weight-only", 3) == ["weight"] * 3
    assert whale.plan_phases("harness-only", 2) == ["harness"] * 2


def test_harness_phases_without_weight_change_share_one_growing_archive():
    stagewise = whale.plan_phases("stagewise", 2)
    assert whale.harness_archive(stagewise, 2, 6) == ("harness_w2", 6)
    assert whale.harness_archive(stagewise, 3, 6) == ("harness_w2", 12)
    alternating = whale.plan_phases("whale", 2)
    assert whale.harness_archive(alternating, 1, 6) == ("harness_w1", 6)
    assert whale.harness_archive(alternating, 3, 6) == ("harness_w2", 6)
    assert whale.harness_archive(["harness", "harness"], 1, 3) == ("harness_w0", 6)


def test_fixed_weight_phase_ends_after_its_steps_whatever_the_reward():
    rising = [0.1, 0.2, 0.3, 0.4, 0.5]
    assert not whale.weight_phase_over(rising[:2], "fixed", 3, window=1)
    assert whale.weight_phase_over(rising[:3], "fixed", 3, window=1)
    assert not whale.weight_phase_over([0.5, 0.5], "fixed", 3, window=1)  # a plateau does not end it


def test_adaptive_weight_phase_ends_on_a_plateau_not_while_improving():
    window, cap = 2, 100
    rising = [0.1 * i for i in range(1, 12)]
    for n in range(len(rising) + 1):
        assert not whale.weight_phase_over(rising[:n], "adaptive", cap, window)
    plateau = [0.1, 0.3, 0.5, 0.5, 0.4, 0.4, 0.3]
    ended = [n for n in range(len(plateau) + 1) if whale.weight_phase_over(plateau[:n], "adaptive", cap, window)]
    assert ended and ended[0] > window  # never before the minimum phase length
    assert whale.weight_phase_over(plateau, "adaptive", cap, window)
    assert whale.weight_phase_over(rising[:3], "adaptive", 3, window)  # the weight budget caps it


def test_adaptive_harness_phase_needs_min_iterations_then_patience():
    stop = lambda series: meta_harness.should_stop_harness_phase(series, patience=2, min_iters=6)
    # best_series[0] is the seed's score, then the archive best after each iteration
    flat = [0.3] * 8
    assert not stop(flat[:6])  # 5 iterations: below the minimum
    assert stop(flat[:7])  # 6 iterations, no improvement for 2
    improving = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    assert not any(stop(improving[:n]) for n in range(1, 9))
    late = [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.2, 0.2]
    assert not stop(late[:7]) and not stop(late[:8])


def test_preset_defaults_and_overrides():
    [args] = whale.parse_args(["--domain", "math", "--preset", "smoke", "--batch", "2"])
    assert args.model == "smoke" and args.batch == 2 and args.group == whale.PRESETS["smoke"]["group"]
    assert args.out == os.path.join("results", "smoke", "math", "whale")
    [fst] = whale.parse_args(["--domain", "chess", "--preset", "paper", "--method", "fast-slow"])
    assert fst.prompt_only and fst.model == "Qwen/Qwen3.5-4B" and fst.group == 8 and fst.batch == 256
    [adaptive] = whale.parse_args(["--domain", "math", "--preset", "smoke", "--schedule", "adaptive"])
    assert adaptive.out.endswith("whale-adaptive")
    runs = whale.parse_args(["--domain", "math", "--method", "harness-only", "whale", "harness-only", "--schedule", "adaptive"])
    assert [os.path.basename(r.out) for r in runs] == ["harness-only-adaptive", "whale-adaptive"]  # each once


def test_several_methods_in_one_command_get_their_own_runs(tmp_path):
    runs = whale.parse_args(["--domain", "math", "--preset", "smoke", "--method", "whale", "fast-slow", "--k", "3"])
    assert [(r.method, os.path.basename(r.out), r.prompt_only, r.k) for r in runs] == \
        [("whale", "whale", False, 3), ("fast-slow", "fast-slow", True, 3)]
    # h0's test evaluation is copied from the first run when it was made with the same settings, and never
    # over a run's own
    runs[0].out, runs[1].out = str(tmp_path / "a"), str(tmp_path / "b")
    first = runs[0].out
    (tmp_path / "a" / "evals").mkdir(parents=True)
    saved = lambda args, score: json.dumps({"settings": whale.eval_settings(args, args.harness), "stats": {"mean_at_k": score}})
    (tmp_path / "a" / "evals" / "phase_0.traces.jsonl").write_text("{}\n")
    other = whale.parse_args(["--domain", "math", "--preset", "smoke", "--k", "4"])[0]
    (tmp_path / "a" / "evals" / "phase_0.json").write_text(saved(other, 0.2))  # made with k = 4, not 3
    whale.share_start_eval(first, runs[1])
    assert not (tmp_path / "b" / "evals" / "phase_0.json").exists()
    (tmp_path / "a" / "evals" / "phase_0.json").write_text(saved(runs[0], 0.5))
    whale.share_start_eval(first, runs[1])
    assert json.loads((tmp_path / "b" / "evals" / "phase_0.json").read_text())["stats"] == {"mean_at_k": 0.5}
    assert (tmp_path / "b" / "evals" / "phase_0.traces.jsonl").read_text() == "{}\n"
    (tmp_path / "a" / "evals" / "phase_0.json").write_text(saved(runs[0], 0.9))
    whale.share_start_eval(first, runs[1])
    assert json.loads((tmp_path / "b" / "evals" / "phase_0.json").read_text())["stats"] == {"mean_at_k": 0.5}


def test_bad_flags_name_the_fix(capsys):
    with pytest.raises(SystemExit):
        whale.parse_args(["--domain", "math", "--harness", "nope.py"])
    assert "nope.py" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        whale.parse_args(["--domain", "maths"])
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        whale.parse_args(["--domain", "math", "--method", "whale", "stagewise", "--out", "x"])
    assert "--out names one run folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        whale.parse_args(["--domain", "math", "--method", "whale", "stagewise", "--backend", "vllm"])
    assert "one method per command" in capsys.readouterr().err


def rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_killed_run_resumes_without_redoing_work(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "whale.py", "--domain", "math", "--method", "whale", "--preset", "smoke",
           "--out", str(out), "--test-limit", "2", "--k", "1", "--train-limit", "8", "--batch", "2",
           "--group", "2", "--harness-tasks", "2", "--max-new-tokens", "8"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    step_rows = out / "weights" / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if step_rows.exists() and rows(step_rows):
            break  # the first RSFT step of the first weight phase is checkpointed: kill mid-phase
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first_eval = (out / "evals" / "phase_0.json").stat().st_mtime
    steps_before = [r["step"] for r in rows(step_rows)]

    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [r["step"] for r in rows(step_rows)]
    assert steps[: len(steps_before)] == steps_before and steps == list(range(1, len(steps) + 1))  # none redone
    assert len(steps) == 4  # 1 epoch of 8 prompts at batch 2
    assert (out / "evals" / "phase_0.json").stat().st_mtime == first_eval  # the first evaluation was kept
    evals = [r for r in rows(out / "metrics.jsonl") if r["event"] == "eval"]
    assert [r["phase"] for r in evals] == [0, 1, 2, 3, 4]
    assert [r["rollouts"] for r in evals] == sorted(r["rollouts"] for r in evals)
    assert [r["step"] for r in evals] == [0, 2, 2, 4, 4]  # cumulative RSFT steps: 2 per weight phase
    summary = json.loads((out / "summary.json").read_text())
    assert summary["phases"] == 4 and summary["total_rollouts"] == evals[-1]["rollouts"]


def test_one_command_runs_each_method_in_its_folder_and_evaluates_h0_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the runs land in tmp_path/results/smoke/math/<method>
    tags = []
    evaluate = whale.rollout.evaluate
    monkeypatch.setattr(whale.rollout, "evaluate", lambda *a, **kw: tags.append(kw["desc"]) or evaluate(*a, **kw))
    whale.main(["--domain", "math", "--preset", "smoke", "--method", "weight-only", "harness-only",
                "--harness", os.path.join(ROOT, "harnesses", "math.py"), "--test-limit", "1", "--epochs", "0.5"])
    tests = [t for t in tags if t.startswith("test")]  # (harness scoring evaluates too)
    assert tests == ["test mean@1 (phase_0)", "test mean@1 (phase_1)", "test mean@1 (phase_1)"]  # h0 once
    for method, kind in (("weight-only", "weight"), ("harness-only", "harness")):
        out = tmp_path / "results" / "smoke" / "math" / method
        evals = [r for r in rows(out / "metrics.jsonl") if r["event"] == "eval"]
        assert [(r["phase"], r["kind"]) for r in evals] == [(0, "start"), (1, kind)]
        assert json.loads((out / "config.json").read_text())["method"] == method
        assert (out / "summary.json").exists()
