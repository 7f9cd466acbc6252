"""
WHALE: Weight-Harness Alternating LEarning, and the four baselines it is compared with.

    python whale.py --domain math --method whale --preset smoke
    python whale.py --domain searchqa --method whale --schedule adaptive --preset cpu
    python whale.py --domain chess --method weight-only --preset paper
    python whale.py --domain math --method harness-only weight-only stagewise fast-slow whale --preset cpu

The agent is weights (a LoRA adapter on the base model) plus a harness (a Python file). A run is a
sequence of phases, each followed by a mean@k evaluation on the test split:

    weight phase   online RSFT (rft.py) under the current harness, for E epochs of the train split
                   (fixed schedule) or until the windowed training reward stops improving (adaptive)
    harness phase  Meta-Harness search (meta_harness.py) under the current weights, for I iterations
                   (fixed) or until the archive best stops improving (adaptive); the winner goes on

Methods, all with the same weight budget (--epochs) and harness budget (iterations per phase x phases):
    whale         weight, harness, weight, harness, ...
    weight-only   RSFT for the whole budget under h0
    harness-only  Meta-Harness for the whole budget under the base weights
    stagewise     all weight phases, then all harness phases
    fast-slow     the WHALE alternation, but the proposer may change only h0's prompt strings (FST)
Several methods in one command run one after another in one process, each in its own folder, and share
the phase-0 evaluation (h0 under the base weights), which is the same for all of them.

Everything lands in results/<preset>/<domain>/<method>/: config.json, metrics.jsonl (one row per
event, with the cumulative RSFT step and rollouts = training + harness scoring; test evaluation is not
counted), weights/ (adapter checkpoints), harness_w<n>/ (the harness archive after n weight phases),
evals/ (test traces, never shown to the proposer), state.json, summary.json.
Rerunning the same command resumes: finished phases and evaluations are never redone.
"""
import argparse
import gc
import json
import math
import os
import shutil
import time

import torch

import domains
import meta_harness
import rft
import engines
import rollout
import sandbox

METHODS = ("whale", "weight-only", "harness-only", "stagewise", "fast-slow")

# Named bundles of defaults; any flag given on the command line wins. smoke only checks the wiring
# (all 18 runs in minutes); cpu is sized from measured SmolLM2-135M speed on 2 cores (README); paper
# follows DESIGN.md section 2 (E = 0.6 epoch, I = 6, G = 8, 256 prompts, M = 3 on 256 harness tasks).
PRESETS = {
    "smoke": dict(model="smoke", threads=1, epochs=1.0, phase_epochs=0.5, harness_iterations=1, train_limit=8,
                  test_limit=4, k=1, batch=2, group=2, minibatch=8, candidates=2, harness_tasks=2,
                  max_new_tokens=8, deadline=60.0, adaptive_epochs=0.5, harness_patience=1,
                  harness_min_iterations=1, harness_max_iterations=2),
    "cpu": dict(model="cpu", threads=2, epochs=1.0, phase_epochs=0.5, harness_iterations=1, train_limit=24,
                test_limit=8, k=2, batch=6, group=2, minibatch=8, candidates=2, harness_tasks=6,
                max_new_tokens=32, deadline=300.0, adaptive_epochs=0.5, harness_patience=1,
                harness_min_iterations=1, harness_max_iterations=2),
    # paper: --minibatch is the micro-batch of one forward/backward (the optimizer step still covers the
    # whole accepted set); 2 fits a 24 GB card with a 248k vocabulary (scripts/memory_plan.py)
    "paper": dict(model=None, threads=None, data="paper", backend="vllm", vllm_sleep=True, bf16=True,
                  grad_checkpointing=True, epochs=1.8, phase_epochs=0.6, harness_iterations=6,
                  train_limit=None, test_limit=None, k=8, batch=256, group=8, minibatch=2, candidates=3,
                  harness_tasks=256, proposer="claude", max_new_tokens=1024, deadline=600.0, adaptive_epochs=0.2,
                  harness_patience=2, harness_min_iterations=6, harness_max_iterations=12),
}
PAPER_MODELS = {"searchqa": "Qwen/Qwen3.5-2B", "math": "Qwen/Qwen3.5-2B", "chess": "Qwen/Qwen3.5-4B"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # what to run
    p.add_argument("--domain", required=True, choices=sorted(domains.DOMAINS))
    p.add_argument("--method", nargs="+", default=["whale"], choices=METHODS,
                   help="one or more methods, run one after another in this process (the imports and h0's "
                        "test evaluation are paid once)")
    p.add_argument("--schedule", default="fixed", choices=("fixed", "adaptive"))
    p.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    p.add_argument("--out", default=None, help="run folder (default results/<preset>/<domain>/<method>)")
    p.add_argument("--model", default=None, help="smoke | cpu | hub id | local path (default: the preset's)")
    p.add_argument("--harness", default=None, help="starting harness h0 (default harnesses/<domain>.py)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads; 1 on 2-core machines, where the harness workers need the other core")
    # budgets
    p.add_argument("--epochs", type=float, default=None, help="total weight-training budget in train epochs")
    p.add_argument("--phase-epochs", type=float, default=None, help="E: epochs per weight phase (fixed schedule)")
    p.add_argument("--harness-iterations", type=int, default=None, help="I: harness iterations per harness phase")
    p.add_argument("--train-limit", type=int, default=None, help="use only the first N train tasks (small presets)")
    # adaptive schedule (paper: window = min length = patience = 0.2 epoch; P_h = 2, at least 6 iterations)
    p.add_argument("--adaptive-epochs", type=float, default=0.2, help="weight phase window, minimum length and patience")
    p.add_argument("--harness-patience", type=int, default=2)
    p.add_argument("--harness-min-iterations", type=int, default=6)
    p.add_argument("--harness-max-iterations", type=int, default=12)
    # evaluation
    p.add_argument("--k", type=int, default=None, help="samples per test task for mean@k")
    p.add_argument("--test-limit", type=int, default=None, help="evaluate on the first N test tasks")
    p.add_argument("--seed", type=int, default=0)
    domains.add_args(p)
    engines.add_backend_args(p)
    rft.add_args(p)
    meta_harness.add_args(p)
    # two passes: the first learns the preset and domain, the second lets any given flag override it
    first = p.parse_args(argv)
    preset = dict(PRESETS[first.preset])
    if first.preset == "paper":
        preset["model"] = PAPER_MODELS[first.domain]
    p.set_defaults(**preset)
    args = p.parse_args(argv)
    args.harness = args.harness or os.path.join("harnesses", f"{args.domain}.py")
    check_args(args, p)
    return [run_args(args, method) for method in dict.fromkeys(args.method)]  # each method once, in order


def run_args(args, method):
    """The flags of one method's run: the shared ones plus its method, folder and FST switch."""
    one = argparse.Namespace(**vars(args))
    one.method = method
    one.out = args.out or os.path.join("results", args.preset, args.domain, method_name(one))
    one.prompt_only = args.prompt_only or method == "fast-slow"  # FST: prompt strings only
    return one


def check_args(args, parser):
    if args.out and len(args.method) > 1:
        parser.error("--out names one run folder: give a single --method, or drop --out")
    if args.backend == "vllm" and len(args.method) > 1:  # a vllm engine keeps its GPU memory until the process ends
        parser.error("--backend vllm runs one method per command: give a single --method")
    if not os.path.isfile(args.harness):
        parser.error(f"harness file {args.harness} not found: pass --harness PATH or run from the repo root")
    if args.epochs <= 0 or args.phase_epochs <= 0:
        parser.error("--epochs and --phase-epochs must be > 0")
    if args.harness_iterations < 1:
        parser.error("--harness-iterations must be >= 1")


def method_name(args):
    return f"{args.method}-adaptive" if args.schedule == "adaptive" else args.method


def plan_phases(method, n_alternations):
    """The phase kinds in order, e.g. whale with 2 alternations -> weight, harness, weight, harness."""
    if method in ("whale", "fast-slow"):
        return ["weight", "harness"] * n_alternations
    if method == "stagewise":
        return ["weight"] * n_alternations + ["harness"] * n_alternations
    if method == "weight-only":
        return ["weight"] * n_alternations
    return ["harness"] * n_alternations


# -----------------------------------------------------------------------------
# run state: a small JSON file so a killed run picks up where it stopped

def load_state(out):
    fresh = {"phase": 0, "harness": None, "harness_rollouts": {}, "phase_start_step": None}
    return meta_harness.read_json(os.path.join(out, "state.json"), fresh)


def save_state(out, state):
    meta_harness.write_json(os.path.join(out, "state.json"), state)


def log_row(out, row):
    with open(os.path.join(out, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def log_eval_once(out, row):
    """A run killed between logging and saving its state logs the same evaluation again on resume: skip it."""
    if not any(r.get("event") == "eval" and r["phase"] == row["phase"] for r in read_rows(out)):
        log_row(out, row)


def read_rows(out):
    path = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# -----------------------------------------------------------------------------
# phases

def steps_for(epochs, n_train, batch):
    return max(1, round(epochs * n_train / batch))


def weight_phase_over(rewards, schedule, max_steps, window):
    """Whether the running weight phase ends after these training rewards (one per RSFT step). Fixed:
    after max_steps. Adaptive: when the windowed mean reward has set no new phase-best for `window`
    steps, after at least `window` steps (paper: window = minimum length = patience = 0.2 epoch)."""
    if len(rewards) >= max_steps:
        return True
    return schedule == "adaptive" and rft.should_stop_weight_phase(rewards, window, window, window)


def run_weight_phase(args, trainer, harness, state, n_train):
    """RSFT steps under `harness` until weight_phase_over; resumes mid-phase from the trainer's history."""
    if state["phase_start_step"] is None:
        state["phase_start_step"] = trainer.step_count
        save_state(args.out, state)
    start = state["phase_start_step"]
    budget_left = steps_for(args.epochs, n_train, args.batch) - start
    phase_steps = steps_for(args.phase_epochs, n_train, args.batch) if args.schedule == "fixed" else budget_left
    window = steps_for(args.adaptive_epochs, n_train, args.batch)
    rewards = [row["reward"] for row in trainer.history if row["step"] > start]
    while not weight_phase_over(rewards, args.schedule, min(phase_steps, budget_left), window):
        rewards.append(trainer.step(harness)["reward"])


def harness_archive(phases, index, iterations_per_phase):
    """(folder, total iterations) of harness phase `index`: harness phases with no weight phase between
    them share one archive (the weights did not change), which grows by I iterations per phase."""
    before = phases[:index]
    last_weight = max((j for j, kind in enumerate(before) if kind == "weight"), default=-1)
    return f"harness_w{before.count('weight')}", iterations_per_phase * (index - last_weight)


def run_harness_phase(args, backend, domain, harness, phase_dir, iterations):
    """Meta-Harness from `harness` under the current weights; returns search()'s result. Fixed: `iterations`
    iterations. Adaptive: until the archive best stalls (patience, minimum), at most --harness-max-iterations."""
    stop = None
    if args.schedule == "adaptive":
        iterations = args.harness_max_iterations
        stop = lambda series: meta_harness.should_stop_harness_phase(series, args.harness_patience, args.harness_min_iterations)
    return meta_harness.search(backend, domain, harness, phase_dir, args, iterations=iterations, stop=stop)


def evaluate_test(args, backend, domain, harness, tag):
    """mean@k on the test split, cached in evals/<tag>.json so a resumed run never redoes it."""
    path = os.path.join(args.out, "evals", f"{tag}.json")
    if os.path.exists(path):
        return meta_harness.read_json(path)["stats"]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tasks = domain.load("test")[: args.test_limit]
    stats = rollout.evaluate(domain, harness, tasks, backend, k=args.k, temperature=args.temperature,
                             top_k=args.top_k, max_new_tokens=args.max_new_tokens, deadline_s=args.deadline,
                             seed=args.seed, traces_path=os.path.join(args.out, "evals", f"{tag}.traces.jsonl"),
                             desc=f"test mean@{args.k} ({tag})")
    # prefixed so they never clash with the run's own counters (test rollouts are not part of the cost)
    stats = {"mean_at_k": stats["mean_at_k"], "k": stats["k"], "test_tasks": len(stats["per_task"]),
             **{f"test_{key}": stats[key] for key in ("rollouts", "mean_turns", "tokens", "errors", "seconds")}}
    meta_harness.write_json(path, {"settings": eval_settings(args, harness), "stats": stats})
    return stats


def eval_settings(args, harness):
    """Everything a test evaluation depends on besides the weights: a shared evaluation must match it all."""
    keys = ("model", "data", "test_limit", "k", "temperature", "top_k", "max_new_tokens", "deadline", "seed")
    return {"harness": os.path.abspath(harness), **{key: getattr(args, key) for key in keys}}


# -----------------------------------------------------------------------------

def main(argv=None):
    runs = parse_args(argv)
    sandbox.apply_args(runs[0])
    for args in runs:
        share_start_eval(runs[0].out, args)
        run(args)
        gc.collect()  # the finished run's model and optimizer go before the next run loads its own


def share_start_eval(src, args):
    """Phase 0 is h0 under the base weights, the same for every method of one command: evaluate it once and
    copy it to the other runs (only if it was made with their settings)."""
    src_json, dst = os.path.join(src, "evals", "phase_0.json"), os.path.join(args.out, "evals")
    if src == args.out or not os.path.exists(src_json) or os.path.exists(os.path.join(dst, "phase_0.json")):
        return
    if meta_harness.read_json(src_json)["settings"] != eval_settings(args, args.harness):
        return
    os.makedirs(dst, exist_ok=True)
    for name in ("phase_0.traces.jsonl", "phase_0.json"):  # the .json last: its presence marks the evaluation done
        if os.path.exists(os.path.join(src, "evals", name)):
            shutil.copy(os.path.join(src, "evals", name), os.path.join(dst, name + ".tmp"))
            os.replace(os.path.join(dst, name + ".tmp"), os.path.join(dst, name))


def run(args):
    os.makedirs(args.out, exist_ok=True)
    meta_harness.write_json(os.path.join(args.out, "config.json"), vars(args))
    print(f"whale: {method_name(args)} on {args.domain}, preset {args.preset} -> {args.out}")
    print(json.dumps(vars(args), indent=None))

    domain = domains.get(args.domain, args)
    train = domain.load("train")[: args.train_limit]
    # adaptive phases end early, so plan as many alternations as the shortest weight phase allows;
    # the run stops at the first weight phase that finds the weight budget spent
    shortest = args.phase_epochs if args.schedule == "fixed" else args.adaptive_epochs
    n_alternations = max(1, math.ceil(args.epochs / shortest - 1e-9))
    phases = plan_phases(args.method, n_alternations)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = engines.load_model(args.model, dtype=torch.bfloat16 if args.bf16 else None)
    backend = engines.load_backend(args, model, tok)
    trainer = rft.RSFT(args, backend, domain, os.path.join(args.out, "weights"), train=train) \
        if "weight" in phases else None
    state = load_state(args.out)
    harness = state["harness"] or os.path.abspath(args.harness)

    def rollouts():
        return (trainer.rollouts if trainer else 0) + sum(state["harness_rollouts"].values())

    if not any(r.get("event") == "start" for r in read_rows(args.out)):
        log_row(args.out, {"event": "start", "phases": phases, "time": time.time()})
    stats = evaluate_test(args, backend, domain, harness, "phase_0")
    log_eval_once(args.out, {"event": "eval", "phase": 0, "kind": "start", "step": 0, "rollouts": 0, **stats})

    while state["phase"] < len(phases):
        i, kind = state["phase"] + 1, phases[state["phase"]]
        t0 = time.time()
        if kind == "weight" and trainer.step_count >= steps_for(args.epochs, len(train), args.batch):
            break  # adaptive schedule: the weight budget is spent
        if kind == "weight":
            run_weight_phase(args, trainer, harness, state, len(train))
            detail = {"steps": trainer.step_count - state["phase_start_step"], "epoch": trainer.epoch_progress}
        else:
            folder, iterations = harness_archive(phases, i - 1, args.harness_iterations)
            result = run_harness_phase(args, backend, domain, harness, os.path.join(args.out, folder), iterations)
            harness = result["winner"]
            state["harness_rollouts"][folder] = result["rollouts"]
            detail = {"iterations": result["iterations"], "harness_score": result["score"], "winner": harness}
        state.update(phase=i, harness=harness, phase_start_step=None)
        stats = evaluate_test(args, backend, domain, harness, f"phase_{i}")
        log_eval_once(args.out, {"event": "eval", "phase": i, "kind": kind, "step": trainer.step_count if trainer else 0,
                                 "rollouts": rollouts(), "seconds": time.time() - t0, **detail, **stats})
        save_state(args.out, state)
        print(f"phase {i}/{len(phases)} {kind}: test mean@{args.k} = {stats['mean_at_k']:.4f}, rollouts {rollouts()}")

    write_summary(args, read_rows(args.out), harness)


def write_summary(args, rows, harness):
    evals = [r for r in rows if r.get("event") == "eval"]
    best = max(evals, key=lambda r: (r["mean_at_k"], -r["rollouts"]))
    summary = {"domain": args.domain, "method": method_name(args), "preset": args.preset, "model": args.model,
               "k": args.k, "best_mean_at_k": best["mean_at_k"], "rollouts_to_best": best["rollouts"],
               "best_phase": best["phase"], "final_mean_at_k": evals[-1]["mean_at_k"],
               "total_rollouts": evals[-1]["rollouts"], "phases": len(evals) - 1, "final_harness": harness,
               "test_tasks": evals[-1]["test_tasks"]}
    meta_harness.write_json(os.path.join(args.out, "summary.json"), summary)
    print(f"best mean@{args.k} = {summary['best_mean_at_k']:.4f} after {summary['rollouts_to_best']} rollouts; "
          f"final {summary['final_mean_at_k']:.4f}")


if __name__ == "__main__":
    main()
