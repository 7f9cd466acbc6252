"""whale.py: the phase plan, the switching rules on fixed reward series, and resuming a killed run."""
import difflib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import domains
import meta_harness
import rft
import plan
import presets
import whale
from fixtures import stand_ins
from lib.episodes import switches
from lib.run_folder import files, ledger
from lib.run_folder import store as store_module
from lib.cli import run_config
from lib.backends.hf_backend import NullModelBackend
from lib.run_folder.card import NO_TURNS
from lib.run_folder.ledger import Ledger
from lib.run_folder.store import Store, check_stored
from lib.methods import METHODS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kinds(args, n_train):
    return [kind for kind, _ in whale.fixed_phases(args, n_train)]


def test_every_method_gets_the_same_budgets_in_its_own_order():
    # smoke: 8 prompts at batch 2 = 4 steps in 2 phases of 2; I = 2 (the re-score + 1 round); harness-only gets
    # (I - 1) x 2 rounds, the alternating methods (I - 1) x (2 - 1): a harness phase between two weight phases
    args = whale.parse_args(["--domain", "math", "--preset", "smoke", "--method", *METHODS])
    budget = {a.method: whale.budgets(a, 8) for a in args}
    expected = {"whale": (4, 1), "fast-slow": (4, 1), "stagewise": (4, 1), "stagewise-hw": (4, 1),
                "weight-only": (4, 0), "harness-only": (0, 2)}
    assert list(budget) == list(METHODS) and {m: budget[m] for m in expected} == expected  # a fork's rows beside
    order = {a.method: kinds(a, 8) for a in args}
    expected = {"whale": ["weight", "harness", "weight"], "fast-slow": ["weight", "harness", "weight"],
                "stagewise": ["weight", "weight", "harness"], "stagewise-hw": ["harness", "weight", "weight"],
                "weight-only": ["weight", "weight"], "harness-only": ["harness", "harness"]}
    assert {m: order[m] for m in expected} == expected
    # 10 prompts, --phase-epochs 0.4: 5 steps in phases of 2, 2, 1; I = 3: 2 rounds a phase, 2 x 2 in all
    args = whale.parse_args(["--domain", "math", "--preset", "smoke", "--phase-epochs", "0.4", "--harness-iterations",
                             "3", "--method", *METHODS])
    phases = {a.method: whale.fixed_phases(a, 10) for a in args}
    assert phases["whale"] == [("weight", 2), ("harness", 2), ("weight", 2), ("harness", 2), ("weight", 1)]
    assert phases["stagewise"] == [("weight", 2), ("weight", 2), ("weight", 1), ("harness", 2), ("harness", 2)]
    assert phases["harness-only"] == [("harness", 2)] * 3
    # whale ends after a weight phase, whatever rounds are left (an adaptive run's leftover)
    assert whale.next_phase("whale", "weight", 0, 5) is None
    assert whale.next_phase("whale", "weight", 3, 0) == "weight"


def test_the_paper_plan_is_the_official_schedule(capsys):
    """docs/protocol.md section 6: 74 / 70 / 64 steps an epoch, 4 / 6 / 4 epochs, E = 0.6 epoch, I = 6 = re-score + 5 rounds,
    harness-only 40 / 60 / 40 rounds."""
    expect = {"searchqa": ([44] * 6 + [32], 6, 40), "math": ([42] * 10, 9, 60), "chess": ([38] * 6 + [28], 6, 40)}
    for domain, (weight, harness_phases, harness_only) in expect.items():
        [args] = whale.parse_args(["--domain", domain, "--preset", "paper"])
        n = plan.PAPER_TRAIN_SIZES[domain]
        phases = whale.fixed_phases(args, n)
        assert [s for k, s in phases if k == "weight"] == weight, domain
        assert [s for k, s in phases if k == "harness"] == [5] * harness_phases, domain
        assert phases[-1][0] == "weight" and sum(weight) == {"searchqa": 296, "math": 420, "chess": 256}[domain]
        [only] = whale.parse_args(["--domain", domain, "--preset", "paper", "--method", "harness-only"])
        assert whale.budgets(only, n) == (0, harness_only)
    plan.main(["--domain", "searchqa", "--preset", "paper", "--method", "whale"])
    out = capsys.readouterr().out
    assert "296 RSFT steps" in out and "7 weight phases (44 + 44 + 44 + 44 + 44 + 44 + 32 steps)" in out
    assert "6 harness phases (5 + 5 + 5 + 5 + 5 + 5 rounds)" in out and out.count("re-score + 5 rounds") == 6


def test_fixed_weight_phase_ends_after_its_steps_whatever_the_reward():
    rising = [0.1, 0.2, 0.3, 0.4, 0.5]
    assert not rft.weight_phase_over(rising[:2], "fixed", 3, window=1)
    assert rft.weight_phase_over(rising[:3], "fixed", 3, window=1)
    assert not rft.weight_phase_over([0.5, 0.5], "fixed", 3, window=1)  # a plateau does not end it


def test_adaptive_weight_phase_ends_on_a_plateau_not_while_improving():
    window, cap = 2, 100
    rising = [0.1 * i for i in range(1, 12)]
    for n in range(len(rising) + 1):
        assert not rft.weight_phase_over(rising[:n], "adaptive", cap, window)
    plateau = [0.1, 0.3, 0.5, 0.5, 0.4, 0.4, 0.3]
    ended = [n for n in range(len(plateau) + 1) if rft.weight_phase_over(plateau[:n], "adaptive", cap, window)]
    assert ended and ended[0] > window  # never before the minimum phase length
    assert rft.weight_phase_over(plateau, "adaptive", cap, window)
    assert rft.weight_phase_over(rising[:3], "adaptive", 3, window)  # the weight budget caps it


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
    assert args.model == "smoke" and args.batch == 2 and args.group == presets.SMOKE["math"]["group"]  # math's own
    assert args.out == os.path.join("results", "smoke", "math", "whale")
    [fst] = whale.parse_args(["--domain", "chess", "--preset", "paper", "--method", "fast-slow"])
    assert fst.prompt_only and fst.model == "Qwen/Qwen3.5-4B" and fst.group == 8 and fst.batch == 256
    [adaptive] = whale.parse_args(["--domain", "math", "--preset", "smoke", "--schedule", "adaptive"])
    assert adaptive.out.endswith("whale-adaptive")
    runs = whale.parse_args(["--domain", "math", "--method", "harness-only", "whale", "harness-only", "--schedule", "adaptive"])
    assert [os.path.basename(r.out) for r in runs] == ["harness-only-adaptive", "whale-adaptive"]  # each once
    [cpu] = whale.parse_args(["--domain", "math", "--preset", "cpu"])  # the calibrated sizes reach the run
    assert (cpu.lr, cpu.test_limit, cpu.k, cpu.temperature) == (3e-4, 50, 4, 0.6)
    assert (cpu.math_test_set, cpu.math_max_steps) == ("generated", 2)
    assert (cpu.harness, cpu.mutate_order, cpu.test_evals) == ("harnesses/cpu/math.py", "traces", "ends")
    kinds = [kind for kind, _ in whale.fixed_phases(cpu, cpu.train_limit)]  # the paper's proportions
    assert kinds == ["weight", "harness", "weight", "harness", "weight"]
    [chess] = whale.parse_args(["--domain", "chess", "--preset", "cpu"])  # chess keeps its one h0
    assert chess.harness == "harnesses/chess.py"
    [cpu_paper] = whale.parse_args(["--domain", "math", "--preset", "cpu", "--data", "paper"])  # the paper's data:
    assert (cpu_paper.math_test_set, cpu_paper.math_max_steps) == ("gsm8k", None)  # no bundled-only choices
    domains.from_args(cpu_paper)


def test_bad_flags_name_the_fix(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:  # the harness file: checked with the inputs, before any model loads
        whale.main(["--domain", "math", "--preset", "smoke", "--harness", "nope.py", "--out", str(tmp_path / "run")])
    assert str(e.value.code).startswith("whale.py: error: nope.py: no such harness file")
    with pytest.raises(SystemExit):
        whale.parse_args(["--domain", "maths"])
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        whale.parse_args(["--domain", "math", "--method", "whale", "stagewise", "--out", "x"])
    assert "--out names one run folder" in capsys.readouterr().err


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
    assert [r["phase"] for r in evals] == [0, 1, 2, 3]  # weight, harness, weight: it ends after a weight phase
    assert [r["rollouts"] for r in evals] == sorted(r["rollouts"] for r in evals)
    assert [r["step"] for r in evals] == [0, 2, 2, 4]  # cumulative RSFT steps: 2 per weight phase
    summary = json.loads((out / "summary.json").read_text())
    assert summary["phases"] == 3 and summary["total_rollouts"] == evals[-1]["rollouts"]



# -----------------------------------------------------------------------------
# whole runs on the smoke model with a stand-in runner: rewards that depend only on the harness knobs, the
# task, the sample and the seed, so every run is exactly repeatable and RSFT really updates the adapter

HARNESS = '''"""Test harness: the stand-in runner never runs it; its MAX_TURNS decides the reward."""
PROMPT = "Answer: "
STYLE = "plain"
MAX_TURNS = 1
SEARCH_SPACE = {"PROMPT": ["Answer: ", "Reply: "], "STYLE": ["plain", "tagged"], "MAX_TURNS": [1, 2]}


def run(task, llm, tools):
    return {"answer": llm([{"role": "user", "content": PROMPT + task["question"]}])}
'''


def fake_episodes(domain, harness_path, tasks, backend, *, samples=1, seed=0, traces_path=None, h0_reward=0.5, **kw):
    source = open(harness_path).read()
    p = 0.6 if "MAX_TURNS = 2" in source else h0_reward
    p = 0.0 if isinstance(backend, NullModelBackend) else p  # these harnesses leave the answering to the model
    episodes = []
    for task in tasks:
        for s in range(samples):
            h = int(hashlib.sha256(f"{task['id']}/{s}/{seed}".encode()).hexdigest(), 16)
            call = {"messages": [], "completion": "ok", "prompt_ids": [1 + h % 7, 2, 3], "completion_ids": [4 + h % 5, 9]}
            episodes.append({"task_id": task["id"], "sample": s, "reward": float(h % 100 < 100 * p), "answer": "ok",
                             "error": None, "turns": 1, "tokens": 2, "seconds": 0.0, "calls": [call], "tool_calls": []})
    if traces_path:
        with open(traces_path, "a") as f:
            f.writelines(json.dumps({**e, "calls": []}) + "\n" for e in episodes)
    return episodes


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """-> (argv for a small smoke run, the trainer folders of every RSFT step actually executed)"""
    monkeypatch.setattr(whale.rollout, "run_episodes", fake_episodes)
    executed, step = [], whale.rft.RSFT.step
    monkeypatch.setattr(whale.rft.RSFT, "step", lambda self, harness: executed.append(self.folder.parents[1].name)
                        or step(self, harness))
    harness = tmp_path / "h0.py"
    harness.write_text(HARNESS)
    argv = ["--domain", "math", "--preset", "smoke", "--harness", str(harness), "--test-limit", "3", "--k", "2",
            "--harness-tasks", "3", "--candidates", "2", "--group", "2", "--math-max-steps", "4"]  # not the smoke
    # preset's math sizes (presets.SMOKE: G = 4 on one-step problems), but the G = 2 on problems of 1-4 steps that
    # these tests count in
    return argv, executed


def record(out):
    """What a run computed, without timings and folder names: files become their content hashes."""
    drop = ("seconds", "time", "test_seconds", "sample_s", "train_s", "copied_from")
    paths = ("winner", "harness", "final_harness")  # stored relative to the run folder when inside it
    content = lambda v: files.file_sha(os.path.join(out, v)) if os.path.isfile(os.path.join(out, v)) else v
    clean = lambda row: {k: content(v) if k in paths else clean(v) if isinstance(v, dict) else
                         [clean(r) for r in v] if isinstance(v, list) and v and isinstance(v[0], dict) else v
                         for k, v in row.items() if k not in drop}
    evals = {p.name: clean(json.loads(p.read_text())) for p in sorted((out / "evals").glob("*.json"))}
    steps = [clean(r) for r in rows(out / "weights" / "metrics.jsonl")] if (out / "weights").exists() else []
    adapter = out / "weights" / "ckpt" / "adapter" / "adapter_model.safetensors"
    return {"metrics": [clean(r) for r in rows(out / "metrics.jsonl")], "evals": evals, "steps": steps,
            "summary": clean(json.loads((out / "summary.json").read_text())),
            "adapter": files.file_sha(adapter) if adapter.exists() else None}


def assert_same_record(got, want, what):
    """got == want, else the failure shows the lines of the two records that differ (pytest's own diff of
    nested dicts is cut before it reaches them)."""
    if got != want:
        lines = lambda r: json.dumps(r, indent=1, sort_keys=True).splitlines(keepends=True)
        diff = "".join(difflib.unified_diff(lines(want), lines(got), "expected", "got", n=3))
        pytest.fail(f"{what}: the records differ\n{diff[:8000]}")


def test_methods_in_one_command_compute_shared_weight_phases_once_and_match_separate_runs(tmp_path, fake,
                                                                                         monkeypatch):
    argv, executed = fake
    methods = ["weight-only", "stagewise", "fast-slow", "whale"]
    for method in methods:  # each alone, in folders (and stores beside them) that know nothing of each other
        whale.main(argv + ["--method", method, "--out", str(tmp_path / "alone" / method / "run")])
    assert len(executed) == 4 * 4  # 1 epoch of 8 prompts at batch 2, for each method
    executed.clear()
    (tmp_path / "together").mkdir()
    monkeypatch.chdir(tmp_path / "together")
    evaluate_test, evaluated = whale.evaluate_test, []
    monkeypatch.setattr(whale, "evaluate_test", lambda *a: evaluated.append(1) or evaluate_test(*a))
    whale.main(argv + ["--method", *methods])
    runs = {m: tmp_path / "together" / "results" / "smoke" / "math" / m for m in methods}
    for method in methods:
        assert_same_record(record(runs[method]), record(tmp_path / "alone" / method / "run"), method)
    # every distinct RSFT step (the harness content of it and of every step before it) ran once, no more
    prefixes = {tuple(r["harness"] for r in rows(runs[m] / "weights" / "metrics.jsonl")[:n])  # the content's sha256
                for m in methods for n in range(1, 5)}
    assert len(executed) == len(prefixes) < 4 * 4
    assert executed[:4] == ["weight-only"] * 4 and "stagewise" not in executed  # stagewise: weight-only's phases
    distinct = {json.dumps(json.loads(p.read_text())["key"]) for m in methods for p in (runs[m] / "evals").glob("*.json")}
    assert len(evaluated) == len(distinct)  # each distinct (weights, harness, settings) evaluated once


def test_runs_on_one_policy_compute_what_they_compute_on_fresh_ones(tmp_path, fake, monkeypatch):
    """An engine keeps its GPU until its process ends, so the runs of a command on an engine share one policy:
    a run that starts where another left it (its adapter trained, served) computes exactly what it computes on a
    freshly loaded model, and the backend is told to serve the base weights at each run's start."""
    argv, _ = fake
    methods = ["whale", "weight-only"]
    for method in methods:
        whale.main(argv + ["--method", method, "--out", str(tmp_path / "alone" / method / "run")])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(whale, "store_root", lambda out, unconfined=False: os.path.join(out, "store"))  # a store per run: no reuse
    runs = whale.parse_args(argv + ["--method", *methods])
    policy = whale.load_policy(runs[0])
    served_base = []
    policy.backend.serve_base = lambda: served_base.append(policy.has_adapter)
    domain = whale.domains.get("math")
    for args in runs:  # each run computes all of its own phases
        whale.run(run_config(args, whale.domains.data_flags()), domain, whale.start_run(args, policy), NO_TURNS,
                  Store(whale.store_root(args.out)))
    assert served_base == [False] * 4  # at each run's start and its trainer's, after the adapter was dropped
    for method in methods:
        assert_same_record(record(tmp_path / "results" / "smoke" / "math" / method),
                           record(tmp_path / "alone" / method / "run"), method)


class Interrupt(Exception):
    pass


def interrupt(monkeypatch, owner, name, call, before=False):
    """owner.name raises Interrupt at its call number `call`: before doing its work, or right after."""
    real, count = getattr(owner, name), []

    def wrapped(*a, **kw):
        count.append(1)
        if before and len(count) == call:
            raise Interrupt(name)
        out = real(*a, **kw)
        if len(count) == call:
            raise Interrupt(name)
        return out
    monkeypatch.setattr(owner, name, wrapped)


def test_a_search_under_weights_that_never_moved_is_copied_from_the_run_that_made_it(tmp_path, fake, monkeypatch):
    # h0 earns nothing, so stagewise's weight phases accept nothing and its search runs under the base
    # weights from h0: harness-only's search, which it copies instead of redoing
    argv, _ = fake
    argv = argv + ["--harness-iterations", "3"]  # 2 rounds: enough for the search to find the better harness
    scored = []
    monkeypatch.setattr(whale.rollout, "run_episodes", lambda *a, **kw: scored.append(kw.get("desc", "")) or
                        fake_episodes(*a, h0_reward=0.0, **kw))
    whale.main(argv + ["--method", "stagewise", "--out", str(tmp_path / "alone" / "run")])
    assert sum("score" in d for d in scored) > 0
    scored.clear()
    whale.main(argv + ["--method", "harness-only", "--out", str(tmp_path / "harness-only" / "run")])
    searched_by_harness_only = sum("score" in d for d in scored)
    scored.clear()
    (tmp_path / "together").mkdir()
    monkeypatch.chdir(tmp_path / "together")
    whale.main(argv + ["--method", "harness-only", "stagewise"])
    runs = tmp_path / "together" / "results" / "smoke" / "math"
    assert sum("score" in d for d in scored) == searched_by_harness_only  # harness-only's search only
    assert_same_record(record(runs / "stagewise"), record(tmp_path / "alone" / "run"), "stagewise")
    keys = lambda run: [json.dumps(r["stored"]["search"], sort_keys=True) for r in rows(runs / run / "metrics.jsonl")
                        if r.get("kind") == "harness"]
    assert keys("stagewise") and set(keys("stagewise")) <= set(keys("harness-only"))  # harness-only's search, taken
    assert json.loads((runs / "stagewise" / "summary.json").read_text())["best_mean_at_k"] > 0


def test_a_run_interrupted_anywhere_resumes_to_the_same_result(tmp_path, fake, monkeypatch):
    argv, executed = fake
    whale.main(argv + ["--out", str(tmp_path / "whole" / "run")])
    executed.clear()
    out = tmp_path / "interrupted" / "run"  # its own store: nothing taken from the whole run's
    points = [(whale.meta_harness, "search", 1, False),  # phase 2's search done, its row not written
              (whale.rft.RSFT, "step", 1, False),  # phase 3's first step made, not stored: made again
              (whale, "test_evaluation", 1, True),  # phase 3's steps stored, not evaluated
              (Ledger, "log_phase", 1, False)]  # phase 3's row written, no summary yet
    for owner, name, call, before in points:
        with monkeypatch.context() as m:
            interrupt(m, owner, name, call, before)
            with pytest.raises(Interrupt, match=name):
                whale.main(argv + ["--out", str(out)])
    whale.main(argv + ["--out", str(out)])
    assert_same_record(record(out), record(tmp_path / "whole" / "run"), "resumed run")
    assert len(executed) == 5  # the one step killed before it was stored, made again; no other
    assert [r["phase"] for r in rows(out / "metrics.jsonl") if r["event"] == "eval"] == [0, 1, 2, 3]


def test_a_run_killed_in_a_step_a_round_or_an_evaluation_goes_on_from_its_rows_and_the_store_alone(tmp_path, fake,
                                                                                                  monkeypatch):
    """Killed inside a weight phase (its second step made, not stored), inside a search (the seed scored, the
    proposer asked) and inside a test evaluation, every file of its folder deleted each time but metrics.jsonl and
    config.json: the rerun gets the rows, evaluations, step rows, weights and summary of the unkilled run, redoing
    at most the step, the round and the evaluation it was killed in."""
    argv, executed = fake
    proposals, evaluations = [], []
    propose, evaluate = whale.meta_harness.propose, whale.evaluate_test
    monkeypatch.setattr(whale.meta_harness, "propose", lambda *a: proposals.append(1) or propose(*a))
    monkeypatch.setattr(whale, "evaluate_test", lambda *a: evaluations.append(1) or evaluate(*a))
    whale.main(argv + ["--out", str(tmp_path / "whole" / "run")])
    whole = len(executed), len(proposals), len(evaluations)
    executed.clear(), proposals.clear(), evaluations.clear()
    out = tmp_path / "killed" / "run"  # its own store: nothing taken from the whole run's
    points = [(whale.rft.RSFT, "step", 2, False),  # phase 1's second step made, the store has its first
              (whale.meta_harness, "propose", 1, False),  # phase 2: h0 re-scored and stored, round 1 proposed
              (whale, "evaluate_test", 1, False)]  # the next evaluation it makes, made, not written
    for owner, name, call, before in points:
        with monkeypatch.context() as m:
            interrupt(m, owner, name, call, before)
            with pytest.raises(Interrupt, match=name):
                whale.main(argv + ["--out", str(out)])
        for path in out.iterdir():  # all but the rows and the config
            if path.name not in ("metrics.jsonl", "config.json"):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    whale.main(argv + ["--out", str(out)])
    assert_same_record(record(out), record(tmp_path / "whole" / "run"), "the killed run")
    assert (len(executed), len(proposals), len(evaluations)) == (whole[0] + 1, whole[1] + 1, whole[2] + 1)


def test_adaptive_schedule_spends_the_same_budgets_and_each_harness_phase_adds_iterations(tmp_path, fake,
                                                                                         monkeypatch):
    argv, executed = fake
    monkeypatch.chdir(tmp_path)
    methods = ["weight-only", "harness-only", "stagewise", "whale"]
    argv += ["--harness-iterations", "3", "--harness-min-iterations", "1", "--harness-patience", "1",
             "--harness-max-iterations", "3"]
    for schedule in ("fixed", "adaptive"):
        whale.main(argv + ["--method", *methods, "--schedule", schedule])
    for name in [*methods, *(m + "-adaptive" for m in methods)]:
        out = tmp_path / "results" / "smoke" / "math" / name
        summary = json.loads((out / "summary.json").read_text())
        method = name.replace("-adaptive", "")
        assert summary["rsft_steps"] == (0 if method == "harness-only" else 4), name
        rounds = {"weight-only": 0, "harness-only": 4, "stagewise": 2, "whale": 2}[method]  # (I - 1) x phases
        if name.endswith("-adaptive") and method == "whale":  # it ends after a weight phase: rounds may be left
            assert 1 <= summary["harness_rounds"] <= rounds, name
        else:
            assert summary["harness_rounds"] == rounds, name
        evals = [r for r in rows(out / "metrics.jsonl") if r["event"] == "eval"]
        assert summary["phases"] == len(evals) - 1
        harness_phases = [r for r in evals if r["kind"] == "harness"]
        assert sum(r["rounds"] for r in harness_phases) == summary["harness_rounds"]
        assert all(r["rounds"] >= 1 for r in harness_phases)  # every harness phase adds its own
        for archive in {r["archive"] for r in harness_phases}:
            frontier = json.loads((out / archive / "frontier.json").read_text())
            assert frontier["iterations"] == sum(r["rounds"] for r in harness_phases if r["archive"] == archive)
    stagewise = [r["kind"] for r in rows(tmp_path / "results/smoke/math/stagewise-adaptive/metrics.jsonl")
                 if r["event"] == "eval"][1:]
    assert "harness" in stagewise and stagewise == sorted(stagewise, reverse=True)  # weight phases, then harness
    harness_only = json.loads((tmp_path / "results/smoke/math/harness-only-adaptive/summary.json").read_text())
    assert harness_only["phases"] >= 2  # the patience of 1 ends a phase that does not improve
    before = record(tmp_path / "results/smoke/math/harness-only-adaptive")
    whale.main(argv + ["--method", "harness-only", "--schedule", "adaptive"])  # a finished run stays as it is
    assert record(tmp_path / "results/smoke/math/harness-only-adaptive") == before


def test_an_evaluation_is_reused_only_when_weights_harness_and_settings_match(tmp_path, monkeypatch):
    made = []

    def evaluate(domain, harness, tasks, backend, k=1, traces_path=None, **kw):
        if isinstance(backend, NullModelBackend):  # the same tasks without the model: nothing earned
            return {"mean_at_k": 0.0, "k": k, "per_task": {"a": 0.0, "b": 0.0}}
        made.append((harness, k))
        open(traces_path, "a").write('{"task_id": "a"}\n' * 2 * k)  # one trace per rollout
        return {"mean_at_k": 0.5, "k": k, "per_task": {"a": 1.0, "b": 0.0}, "mean_turns": 1.0, "tokens": 4,
                "rollouts": 2 * k, "errors": 0, "seconds": 0.1}

    class Domain(domains.Domain):
        def load(self, split):
            return [{"id": "a"}, {"id": "b"}]

    monkeypatch.setattr(whale.rollout, "evaluate", evaluate)
    harness, other = tmp_path / "h.py", tmp_path / "h2.py"
    harness.write_text(HARNESS)
    other.write_text(HARNESS.replace("Answer: ", "Reply: "))
    a, b = (whale.parse_args(["--domain", "math", "--preset", "smoke", "--k", "2", "--out", str(tmp_path / n)])[0]
            for n in "ab")
    def evaluate_test(args, harness, tag, weights):  # a, b and c share the store beside their folders
        cfg = run_config(args, whale.domains.data_flags())
        return whale.test_evaluation(Store(whale.store_root(args.out)), cfg, stand_ins.BACKEND, Domain(), tag, weights,
                                     harness)[0]

    stats = evaluate_test(a, str(harness), "phase_0", "base")
    saved = json.loads((tmp_path / "a" / "evals" / "phase_0.json").read_text())
    assert saved["per_task"] == {"a": 1.0, "b": 0.0} and saved["stats"] == stats and len(made) == 1
    assert evaluate_test(a, str(harness), "phase_0", "base") == stats and len(made) == 1
    # another run: the same evaluation is taken from the store with its traces, not redone
    assert evaluate_test(b, str(harness), "phase_0", "base") == stats
    assert len(made) == 1 and (tmp_path / "b" / "evals" / "phase_0.traces.jsonl").read_text() == '{"task_id": "a"}\n' * 4
    # and within the run: the same state after a later phase
    evaluate_test(a, str(harness), "phase_1", "base")
    assert len(made) == 1
    # other weights, another harness content, or other settings: evaluated anew
    evaluate_test(b, str(harness), "phase_1", "adapter 1234")
    evaluate_test(b, str(other), "phase_2", "base")
    c = whale.parse_args(["--domain", "math", "--preset", "smoke", "--k", "3", "--out", str(tmp_path / "c")])[0]
    evaluate_test(c, str(harness), "phase_0", "base")
    assert made == [(str(harness), 2), (str(harness), 2), (str(other), 2), (str(harness), 3)]


def test_a_later_command_takes_finished_phases_from_the_store(tmp_path, fake, monkeypatch, capsys):
    """The store beside the run folders (results/<preset>/<domain>/store) serves every later command on the same
    domain, preset and seed: stagewise's weight phases are weight-only's (the same start, harness and settings), so
    a stagewise command after a weight-only one trains nothing and evaluates nothing those phases ended with."""
    argv, executed = fake
    monkeypatch.chdir(tmp_path)
    whale.main(argv + ["--method", "weight-only"])
    assert executed == ["weight-only"] * 4
    executed.clear()
    capsys.readouterr()
    whale.main(argv + ["--method", "stagewise"])
    out = capsys.readouterr().out
    runs = tmp_path / "results" / "smoke" / "math"
    assert executed == []  # both weight phases taken from the store
    stagewise, weight_only = record(runs / "stagewise"), record(runs / "weight-only")
    assert stagewise["steps"] == weight_only["steps"] and stagewise["adapter"] == weight_only["adapter"]
    for i in range(3):  # h0 under the weights weight-only made: its evaluations, the same files
        assert f"test evaluation (phase_{i}): the same as " in out
        assert (runs / "stagewise" / "evals" / f"phase_{i}.json").read_bytes() == \
            (runs / "weight-only" / "evals" / f"phase_{i}.json").read_bytes()


def test_a_damaged_stored_item_is_computed_again_never_used(tmp_path, fake, monkeypatch, capsys):
    """A stored item that fails its check is removed and computed again from the same inputs (the same seeds give
    the same result): here the weights that end weight-only's first phase (their adapter cut) and its first test
    evaluation (its traces cut), found damaged by a later command."""
    argv, executed = fake
    monkeypatch.chdir(tmp_path)
    whale.main(argv + ["--method", "weight-only"])
    store = tmp_path / "results" / "smoke" / "math" / "store"
    [first] = [p.parent for p in store.glob("weights/*/key.json")
               if json.loads(p.read_text())["about"]["rows"][-1]["step"] == 2]
    adapter = first / "adapter" / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:-1000])
    [h0] = [p.parent for p in store.glob("evaluation/*/key.json")
            if json.loads(p.read_text())["about"]["tag"] == "phase_0"]
    (h0 / "traces.jsonl").write_text((h0 / "traces.jsonl").read_text().splitlines(keepends=True)[0])
    executed.clear()
    capsys.readouterr()
    whale.main(argv + ["--method", "stagewise"])
    out = capsys.readouterr().out
    assert f"{first}: damaged (" in out and f"{h0}: damaged (" in out
    assert executed == ["stagewise"] * 2  # the first phase trained again; the second phase's weights then found
    runs = tmp_path / "results" / "smoke" / "math"
    stagewise, weight_only = record(runs / "stagewise"), record(runs / "weight-only")
    assert stagewise["steps"] == weight_only["steps"] and stagewise["adapter"] == weight_only["adapter"]
    assert stagewise["evals"]["phase_0.json"] == weight_only["evals"]["phase_0.json"]  # evaluated again, the same
    assert "test evaluation (phase_0): the same as " not in out
    for item in (first, h0):
        check_stored(item, json.loads((item / "key.json").read_text())["key"])  # stored again, as put


def test_a_resume_keeps_the_h0_it_started_with_and_redoes_its_phase_in_progress_under_edited_code(
        tmp_path, fake, monkeypatch, capsys):
    """A run killed midway, resumed: with another h0 content it is refused in one line (phase 0 evaluated the older
    one); under edited code its finished phases are taken under the code that made them (their rows hold the keys in
    full), and the phase in progress starts over under the new code (its steps so far are the older code's: the new
    code's key finds none of them), so no item mixes the two. Under --unsafe-no-sandbox a run keeps its work in a
    store of its own, beside the shared one."""
    argv, executed = fake
    out = tmp_path / "run"
    h0 = tmp_path / "h0.py"
    interrupt(monkeypatch, whale.rft.RSFT, "step", 3)  # inside weight-only's second phase, its first step done
    with pytest.raises(Interrupt):
        whale.main(argv + ["--method", "weight-only", "--out", str(out)])
    monkeypatch.undo()  # the real step again (and the fixture's stand-ins, set anew)
    monkeypatch.setattr(whale.rollout, "run_episodes", fake_episodes)
    step = whale.rft.RSFT.step
    monkeypatch.setattr(whale.rft.RSFT, "step", lambda self, harness: executed.append(self.step_count + 1)
                        or step(self, harness))
    store = tmp_path / "store"
    items = lambda: sorted(p.parent.name for p in store.glob("*/*/key.json"))
    made = items()
    assert {p.parent.parent.name for p in store.glob("*/*/key.json")} == {"weights", "evaluation"}

    source = h0.read_text()
    h0.write_text(source + "# edited\n")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit) as e:
        whale.main(argv + ["--method", "weight-only", "--out", str(out)])
    assert str(e.value.code) == (f"whale.py: error: {h0} changed since {out} started: restore it, or move {out} "
                                 f"aside (mv {out} {out}.old) or delete it, and rerun to start it over")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before and items() == made
    h0.write_text(source)

    monkeypatch.setattr(store_module, "code_sha", lambda: "edited")
    executed.clear()
    whale.main(argv + ["--method", "weight-only", "--out", str(out)])
    assert executed == [3, 4]  # phase 2 from its start, under the new code; phase 1 taken under the older code's key
    codes = {json.loads(p.read_text())["key"]["code"] for p in store.glob("*/*/key.json")}
    assert "edited" in codes and len(codes) == 2  # phase 1 under the code that made it, phase 2 under the new one
    assert json.loads((out / "summary.json").read_text())["rsft_steps"] == 4

    monkeypatch.setenv(switches.OPT_OUT, "1")  # the opt-out (its sandbox is not needed: the episodes are made up)
    made = items()
    capsys.readouterr()
    whale.main(argv + ["--method", "stagewise", "--out", str(tmp_path / "stagewise")])
    assert f"store: {tmp_path / 'store-unconfined'} (--unsafe-no-sandbox" in capsys.readouterr().out
    assert items() == made and list((tmp_path / "store-unconfined").glob("*/*/key.json"))


def test_a_run_unconfined_keeps_its_own_store_and_another_width_redoes_only_its_phase_in_progress(
        tmp_path, fake, monkeypatch, capsys):
    """A run started under --unsafe-no-sandbox keeps its work in store-unconfined beside the shared store (harness
    code runs unconfined in it: the shared store is never read or written), and resumes only the same way; one killed at
    --workers 2 and resumed at 3 redoes its phase in progress at the new width (the weights' key holds it)."""
    argv, _ = fake
    store = tmp_path / "store"
    items = lambda: sorted(p.parent.name for p in store.glob("*/*/key.json"))

    def killed(out, *flags):
        interrupt(monkeypatch, whale.rft.RSFT, "step", 3)  # inside weight-only's second phase
        with pytest.raises(Interrupt):
            whale.main(argv + ["--method", "weight-only", "--out", str(out), *flags])
        monkeypatch.undo()  # the real step, the sandbox again (and the fixture's stand-in episodes, set anew)
        monkeypatch.setattr(whale.rollout, "run_episodes", fake_episodes)

    out = tmp_path / "unconfined"
    monkeypatch.setenv(switches.OPT_OUT, "1")  # the opt-out (the episodes are made up: no sandbox needed)
    killed(out)
    with pytest.raises(SystemExit) as e:  # resumed in the sandbox: refused before any model loads
        whale.main(argv + ["--method", "weight-only", "--out", str(out)])
    assert str(e.value.code) == (f"whale.py: error: {out} was started with --unsafe-no-sandbox: resume it the same "
                                 f"way, or move {out} aside (mv {out} {out}.old) or delete it, and rerun to start it "
                                 "over")
    monkeypatch.setenv(switches.OPT_OUT, "1")
    capsys.readouterr()
    whale.main(argv + ["--method", "weight-only", "--out", str(out)])
    assert f"store: {tmp_path / 'store-unconfined'} (--unsafe-no-sandbox" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["rsft_steps"] == 4 and items() == []
    monkeypatch.delenv(switches.OPT_OUT)

    out = tmp_path / "width"
    killed(out, "--workers", "2")
    whale.main(argv + ["--method", "weight-only", "--out", str(out), "--workers", "3"])
    assert json.loads((out / "summary.json").read_text())["rsft_steps"] == 4
    # phase 1's weights at width 2, phase 2's at width 3: the step 3 made at width 2 was never stored
    assert len(list(store.glob("weights/*/key.json"))) == 2
    before = (out / "metrics.jsonl").read_bytes()
    whale.main(argv + ["--method", "weight-only", "--out", str(out), "--workers", "3"])
    assert (out / "metrics.jsonl").read_bytes() == before


def test_a_store_serves_one_command_at_a_time(tmp_path, fake):
    """While a command holds the store of a domain, preset and seed, a second one is refused in one line and writes
    nothing; once the first ends, however it ends, the second runs."""
    argv, _ = fake
    out = tmp_path / "run"
    with store_module.only_command(whale.store_root(out)):  # the first command, still running
        with pytest.raises(SystemExit) as e:
            whale.main(argv + ["--method", "weight-only", "--out", str(out)])
        assert str(e.value.code) == (f"whale.py: error: {tmp_path / 'store'} is in use by another command: wait for it "
                                     "to end, or run this one in another folder (whale.py: another --seed or --out)")
        assert not (out / "metrics.jsonl").exists()
    whale.main(argv + ["--method", "weight-only", "--out", str(out)])
    assert (out / "summary.json").exists()


def test_a_stored_item_is_whole_or_absent(tmp_path, monkeypatch):
    """An item is built in a temporary folder and renamed into place: a put killed before the rename leaves no item
    (find: None, so the work is done again) and its folder goes when the next command takes the store; the next put
    makes a whole one; an item cut afterwards is removed by find."""
    (tmp_path / "evaluation.json").write_text(json.dumps({"stats": {"test_rollouts": 2}, "per_task": {"a": 1.0}}))
    (tmp_path / "traces.jsonl").write_text('{"task_id": "a"}\n' * 2)
    parts = {name: tmp_path / name for name in ("evaluation.json", "traces.jsonl")}
    store, key = Store(tmp_path / "store"), {"weights": "base", "harness": "h", "config": "c"}

    def killed(*a):
        raise Interrupt("killed before the rename")
    with monkeypatch.context() as m:
        m.setattr(os, "replace", killed)
        with pytest.raises(Interrupt):
            store.put("evaluation", key, parts, about={"tag": "phase_0"})
    assert store.find("evaluation", key) is None and not store.item("evaluation", key).exists()
    [cut] = (tmp_path / "store" / "evaluation").glob("*.tmp-*")  # the killed put's folder, until the next command
    with store_module.only_command(tmp_path / "store"):
        assert not cut.exists()
    item = store.put("evaluation", key, parts, about={"tag": "phase_0"})
    assert store.find("evaluation", key) == item and json.loads((item / "key.json").read_text())["key"]["code"]
    (item / "traces.jsonl").write_text('{"task_id": "a"}\n')  # the stored one cut
    assert store.find("evaluation", key) is None and not item.exists()


def test_weights_id_ignores_the_order_peft_writes_target_modules_in(tmp_path):
    # peft saves target_modules from a set: the same adapter saved twice may list them in another order
    a, b, c = (tmp_path / n for n in "abc")
    a.write_text(json.dumps({"r": 16, "target_modules": ["q_proj", "v_proj", "o_proj"]}))
    b.write_text(json.dumps({"target_modules": ["o_proj", "q_proj", "v_proj"], "r": 16}))
    c.write_text(json.dumps({"r": 8, "target_modules": ["q_proj", "v_proj", "o_proj"]}))
    assert files.adapter_config_sha(a) == files.adapter_config_sha(b) != files.adapter_config_sha(c)
    assert files.adapter_config_sha(tmp_path / "none").startswith("missing: ")


def test_fast_slow_under_weights_that_never_moved_continues_its_archive_and_charges_nothing_twice(
        tmp_path, fake, monkeypatch):
    # h0 earns nothing, so fast-slow's weight phases accept nothing: its three harness phases (4 weight phases
    # of 1 step) all run under the base weights and so continue one archive, each adding its own round
    argv, _ = fake
    scored = []
    monkeypatch.setattr(whale.rollout, "run_episodes", lambda *a, **kw: scored.append(kw.get("desc", "")) or
                        fake_episodes(*a, h0_reward=0.0, **kw))
    out = tmp_path / "fst"
    whale.main(argv + ["--method", "fast-slow", "--phase-epochs", "0.25", "--out", str(out)])
    evals = [r for r in rows(out / "metrics.jsonl") if r["event"] == "eval"]
    harness = [r for r in evals if r["kind"] == "harness"]
    assert [r["archive"] for r in harness] == ["harness_w1"] * 3 and [r["rounds"] for r in harness] == [1, 1, 1]
    assert not (out / "harness_w2").exists() and not (out / "harness_w3").exists()
    candidates = sorted((out / "harness_w1" / "candidates").iterdir())
    assert [c.name for c in candidates] == ["h0", "h1_1", "h1_2", "h2_1", "h2_2", "h3_1", "h3_2"]
    sources = [(c / "harness.py").read_bytes() for c in candidates if (c / "harness.py").exists()]
    assert len(sources) == 2 and len(set(sources)) == 2  # h0 and its one prompt variant, never proposed again
    seed_scorings = [d for d in scored if "score" in d and "h0" in d]
    assert len(seed_scorings) == 1  # the seed is scored once, not once per phase
    assert harness[-1]["archive_rollouts"] == 3 + 4  # the seed once (3 tasks), h1_1 (3 + its smoke run)
    assert evals[-1]["rollouts"] == 4 * 2 * 2 + 7  # 4 RSFT steps of 2 prompts x G = 2, plus the search


def test_a_rerun_with_other_settings_is_refused_with_one_line(tmp_path, fake, capsys):
    argv, _ = fake
    out = tmp_path / "run"
    whale.main(argv + ["--method", "weight-only", "--out", str(out)])
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit) as e:
        whale.main(argv + ["--method", "weight-only", "--out", str(out), "--k", "3", "--temperature", "0.2"])
    assert str(e.value.code) == (f"whale.py: error: {out} was run with other settings: --k 2 (now 3), --temperature "
                                 f"1.0 (now 0.2): rerun with the folder's settings, or move {out} aside "
                                 f"(mv {out} {out}.old) or delete it, and rerun to start it over")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # nothing rewritten
    # what cannot change a result may change (lib/cli.NO_RESULT_FLAGS): the speed, the engine's memory share
    whale.main(argv + ["--method", "weight-only", "--out", str(out), "--threads", "2", "--gpu-memory", "0.3"])


def test_the_refusals_fix_works_as_written_with_several_methods(tmp_path, fake, monkeypatch):
    """--out is refused with several --method, so a refused resume of a several-method command names a fix that
    works there: move the folder aside (as written: mv OUT OUT.old) and rerun, which starts that run over."""
    argv, _ = fake
    monkeypatch.chdir(tmp_path)
    methods = ["--method", "weight-only", "whale"]
    whale.main(argv + methods)
    moved = []
    for _ in range(3):
        try:
            whale.main(argv + methods + ["--k", "3"])
            break
        except SystemExit as e:
            fix = str(e.code).split("or move ")[1]
            out = fix.split(" aside (mv ")[0]
            assert fix.startswith(f"{out} aside (mv {out} {out}.old) or delete it, and rerun to start it over")
            subprocess.run(["mv", out, f"{out}.old"], check=True)  # the fix, as written
            moved.append(os.path.basename(out))
    assert moved == ["weight-only", "whale"]  # each refused folder in turn, then the command runs
    for method in ("weight-only", "whale"):
        config = json.loads((tmp_path / "results" / "smoke" / "math" / method / "config.json").read_text())
        assert config["k"] == 3 and (tmp_path / "results" / "smoke" / "math" / f"{method}.old").is_dir()


def test_a_folder_from_before_weight_steps_resumes_as_rsft(tmp_path, fake):
    """config.json gained weight_step with issue 60: a folder without it was RSFT's and resumes as such."""
    argv, _ = fake
    out = tmp_path / "run"
    whale.main(argv + ["--method", "weight-only", "--out", str(out)])
    config = json.loads((out / "config.json").read_text())
    assert config.pop("weight_step") == "rsft"
    (out / "config.json").write_text(json.dumps(config))
    [args] = whale.parse_args(argv + ["--method", "weight-only", "--out", str(out)])
    ledger.check_same_settings(str(out), vars(args))  # resumes
    with pytest.raises(ValueError, match=r"--weight-step rsft \(now pg\)"):
        ledger.check_same_settings(str(out), {**vars(args), "weight_step": "pg"})


def test_a_folder_of_an_older_whale_is_refused_and_changes_nothing(tmp_path, fake):
    """A config.json or metrics.jsonl written before a flag or a row key existed (here: --minibatch before it
    became --micro-batch, phase rows that name no store item) is refused in one line, never resumed under a guess."""
    argv, _ = fake
    out = tmp_path / "run"
    whale.main(argv + ["--method", "weight-only", "--out", str(out)])
    config, metrics = (out / "config.json").read_text(), (out / "metrics.jsonl").read_text()
    older_config = json.loads(config)
    older_config["minibatch"] = older_config.pop("micro_batch")
    older_rows = [{k: v for k, v in r.items() if k != "stored"} for r in rows(out / "metrics.jsonl")]
    jsonl = lambda rs: "".join(json.dumps(r) + "\n" for r in rs)
    for name, older, lacks in (("config.json", json.dumps(older_config), "--micro-batch"),
                               ("metrics.jsonl", jsonl(older_rows), "stored")):
        (out / name).write_text(older)
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
        with pytest.raises(SystemExit) as e:
            whale.main(argv + ["--method", "weight-only", "--out", str(out)])
        assert str(e.value.code) == (f"whale.py: error: {out}/{name} was written by an older whale.py (it lacks "
                                     f"{lacks}): move {out} aside (mv {out} {out}.old) or delete it, and "
                                     "rerun to start it over")
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # nothing rewritten
        (out / name).write_text(config if name == "config.json" else metrics)
    whale.main(argv + ["--method", "weight-only", "--out", str(out)])  # the folder's own files resume


def test_acceptance_is_strict_against_the_incoming_harness_re_scored_under_the_new_weights(tmp_path, fake,
                                                                                         monkeypatch):
    best = lambda *rows: meta_harness.pick_best([dict(zip(("name", "score", "mean_turns"), r)) for r in rows])["name"]
    assert best(("h0", 0.5, 2.0), ("h1_1", 0.5, 2.0)) == "h0"  # a tie stays with the incumbent
    assert best(("h0", 0.5, 2.0), ("h1_1", 0.5, 1.5)) == "h1_1"  # the same score in fewer turns wins
    assert best(("h0", 0.5, 1.0), ("h1_1", 0.4, 1.0), ("h1_2", 0.6, 3.0)) == "h1_2"  # only a higher score beats it
    # each harness phase under new weights starts a fresh archive whose h0 is the incoming winner, re-scored
    argv, _ = fake
    out = tmp_path / "run"
    monkeypatch.setattr(whale.rollout, "run_episodes", lambda *a, **kw: fake_episodes(*a, h0_reward=0.9, **kw))
    whale.main(argv + ["--method", "whale", "--phase-epochs", "0.25", "--out", str(out)])  # every step trains
    harness = [r for r in rows(out / "metrics.jsonl") if r.get("kind") == "harness"]
    fresh = [(before, after) for before, after in zip(harness, harness[1:]) if after["archive"] != before["archive"]]
    assert harness[0]["archive"] == "harness_w1" and fresh  # (a weight phase that accepted nothing continues)
    for before, after in fresh:
        seed = out / after["archive"] / "candidates" / "h0"
        assert (seed / "harness.py").read_bytes() == (out / before["winner"]).read_bytes()  # stored relative to out
        assert json.loads((seed / "scores.json").read_text())["rollouts"] == 3  # scored again, under new weights


def test_test_evals_ends_evaluates_the_start_and_the_last_phase_only_and_resumes(tmp_path, fake, monkeypatch):
    # the cpu preset's --test-evals ends: intermediate points are left out, never final tasks; the final point and
    # the training are those of a run that evaluates every phase
    argv, _ = fake
    whale.main(argv + ["--out", str(tmp_path / "every" / "run")])
    ends = argv + ["--test-evals", "ends", "--out", str(tmp_path / "ends" / "run")]
    with monkeypatch.context() as m:
        interrupt(m, Ledger, "log_phase", 2)  # phase 1 logged without an evaluation
        with pytest.raises(Interrupt):
            whale.main(ends)
    whale.main(ends)
    assert sorted(p.name for p in (tmp_path / "ends" / "run" / "evals").glob("*.json")) == ["phase_0.json",
                                                                                             "phase_3.json"]
    evaluated = [r["mean_at_k"] is not None for r in rows(tmp_path / "ends" / "run" / "metrics.jsonl")
                 if r["event"] == "eval"]
    assert evaluated == [True, False, False, True]
    every, end = (json.loads((tmp_path / name / "run" / "summary.json").read_text()) for name in ("every", "ends"))
    assert end["final_mean_at_k"] == every["final_mean_at_k"] and end["phases"] == every["phases"] == 3
    assert record(tmp_path / "ends" / "run")["steps"] == record(tmp_path / "every" / "run")["steps"]


def test_whale_points_an_old_plan_or_check_flag_to_plan_py(capsys):
    for flag in ("--plan", "--check"):
        with pytest.raises(SystemExit):
            whale.parse_args(["--domain", "math", "--preset", "smoke", flag])
        assert capsys.readouterr().err.strip().endswith(
            "error: --plan and --check are plan.py's: python plan.py with the same flags (the plan without --plan)")
