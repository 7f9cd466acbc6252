"""
WHALE: Weight-Harness Alternating LEarning, and the four baselines it is compared with.

    python whale.py --domain math --method whale --preset smoke
    python whale.py --domain searchqa --method whale --schedule adaptive --preset cpu
    python whale.py --domain chess --method weight-only --preset paper
    python whale.py --domain math --method harness-only weight-only stagewise fast-slow whale --preset cpu

The agent is weights (a LoRA adapter on the base model) plus a harness (a Python file). A run is a
sequence of phases, each followed by a mean@k evaluation on the test split:

    weight phase   online RSFT (rft.py) under the current harness
    harness phase  Meta-Harness search (meta_harness.py) under the current weights; the winner goes on

Budgets, the same totals for every method under both schedules:
    weight budget   S = round(epochs x |train| / batch) RSFT steps
    harness budget  H = I x ceil(S / s) iterations, s = round(phase_epochs x |train| / batch) the length of
                    a fixed weight phase: I iterations for every fixed weight phase
A method spends its budgets in this order, until both are spent:
    whale         weight, harness, weight, harness, ...
    weight-only   RSFT for the whole weight budget under h0 (no harness budget)
    harness-only  Meta-Harness for the whole harness budget under the base weights (no weight budget)
    stagewise     all weight phases, then all harness phases
    fast-slow     the WHALE alternation, but the proposer may change only h0's prompt strings (FST)
(whale and fast-slow: once one budget is spent, the rest of the other follows.) The schedule decides
where a phase ends, never how much a method gets in all:
    fixed      a weight phase is s steps, a harness phase I iterations (the last ones what is left)
    adaptive   a weight phase ends when its windowed training reward has set no new phase-best for
               --adaptive-epochs (also its minimum length), a harness phase when its archive best has not
               improved for --harness-patience iterations after --harness-min-iterations (at most
               --harness-max-iterations); either ends early when its budget is spent
Harness phases with no weight phase between them search one archive (the weights did not change), each
phase adding its own iterations.

Several methods in one command run one after another in one process, each in its own folder, and never
compute the same thing twice: a weight phase whose steps another run of the command already made (same
settings, same harness content at every step: whale, weight-only, stagewise and fast-slow all start with
the same phase under h0) starts from that run's snapshot; a test evaluation of the same weights
(adapter content hash; an adapter no RSFT step updated is the base model) and harness (content hash)
under the same settings is copied, not redone; so is a harness search from the same harness under the
same weights and settings (stagewise after weight phases that accepted nothing is harness-only's search).

Everything lands in results/<preset>/<domain>/<method>/: config.json, metrics.jsonl (one row per
event, with the cumulative RSFT step and rollouts = training + harness scoring; test evaluation is not
counted), weights/ (the RSFT checkpoint, and snapshot-<step>/ at the end of every weight phase, hard
links of it), harness_w<n>/ (the harness archive after n weight phases), evals/ (test scores per task
and traces, never shown to the proposer), state.json, summary.json.
Rerunning the same command resumes: finished steps, iterations and evaluations are never redone, and
the resumed run ends where an uninterrupted one would have, phase for phase.
"""
import argparse
import gc
import hashlib
import json
import math
import os
import re
import shutil
import time
from pathlib import Path

import torch

import domains
import engines
import meta_harness
import rft
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
    # cpu: calibrated on SmolLM2-135M (README, "Calibrating the cpu preset"): 50 test tasks x k = 4 tell
    # 0.25 from 0.58 apart; lr 3e-4 moves the training reward within 4 steps (1e-4 stays flat); math tests on
    # the held-out generated problems (1-2 steps), as the GSM8K originals are beyond this model, and trains on
    # the same difficulty; temperature 0.6, as at 1.0 this model's code rarely runs (math with worked examples:
    # 0.06 at 1.0, 0.14 at 0.6); an adaptive harness phase runs at least 2 iterations, as every single fix
    # scores 0 and only the second composes them
    "cpu": dict(model="cpu", threads=2, epochs=1.0, phase_epochs=0.5, harness_iterations=2, train_limit=64,
                test_limit=50, k=4, batch=8, group=4, minibatch=8, lr=3e-4, candidates=3, harness_tasks=24,
                max_new_tokens=32, temperature=0.6, deadline=300.0, adaptive_epochs=0.25, harness_patience=1,
                harness_min_iterations=2, harness_max_iterations=3, math_test_set="generated", math_max_steps=2),
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
    p = rollout.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    p.add_argument("--threads", type=rollout.positive_int, default=None,
                   help="torch CPU threads; 1 on 2-core machines, where the harness workers need the other core")
    # budgets
    p.add_argument("--epochs", type=rollout.positive_float, default=None, help="total weight-training budget in train epochs")
    p.add_argument("--phase-epochs", type=rollout.positive_float, default=None,
                   help="E: epochs per weight phase (fixed schedule)")
    p.add_argument("--harness-iterations", type=rollout.positive_int, default=None,
                   help="I: harness iterations per harness phase")
    p.add_argument("--train-limit", type=rollout.positive_int, default=None,
                   help="use only the first N train tasks (small presets)")
    # adaptive schedule (paper: window = min length = patience = 0.2 epoch; P_h = 2, at least 6 iterations)
    p.add_argument("--adaptive-epochs", type=rollout.positive_float, default=0.2,
                   help="weight phase window, minimum length and patience")
    p.add_argument("--harness-patience", type=rollout.nonnegative_int, default=2)
    p.add_argument("--harness-min-iterations", type=rollout.nonnegative_int, default=6)
    p.add_argument("--harness-max-iterations", type=rollout.positive_int, default=12)
    # evaluation
    p.add_argument("--k", type=rollout.positive_int, default=None, help="samples per test task for mean@k")
    p.add_argument("--test-limit", type=rollout.positive_int, default=None, help="evaluate on the first N test tasks")
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
    if first.data == "paper":  # the bundled math sets' choices do not apply to the paper's data
        preset.pop("math_test_set", None), preset.pop("math_max_steps", None)
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


def method_name(args):
    return f"{args.method}-adaptive" if args.schedule == "adaptive" else args.method


# -----------------------------------------------------------------------------
# the plan: budgets, the order of the phases, and where each phase ends

def steps_for(epochs, n_train, batch):
    return max(1, round(epochs * n_train / batch))


def budgets(args, n_train):
    """(RSFT steps, harness iterations) this method spends in all; see the docstring for the rule."""
    steps = steps_for(args.epochs, n_train, args.batch)
    iterations = args.harness_iterations * math.ceil(steps / steps_for(args.phase_epochs, n_train, args.batch))
    return (0 if args.method == "harness-only" else steps), (0 if args.method == "weight-only" else iterations)


def next_phase(method, last, steps_left, iterations_left):
    """The kind of the next phase, or None when both budgets are spent. whale and fast-slow alternate,
    weight first; every other method spends its weight budget before its harness budget."""
    if steps_left > 0 and iterations_left > 0 and method in ("whale", "fast-slow"):
        return "harness" if last == "weight" else "weight"
    return "weight" if steps_left > 0 else "harness" if iterations_left > 0 else None


def weight_phase_over(rewards, schedule, max_steps, window):
    """Whether the running weight phase ends after these training rewards (one per RSFT step). Fixed:
    after max_steps. Adaptive: when the windowed mean reward has set no new phase-best for `window`
    steps, after at least `window` steps (paper: window = minimum length = patience = 0.2 epoch), or
    after max_steps (the weight budget)."""
    if len(rewards) >= max_steps:
        return True
    return schedule == "adaptive" and rft.should_stop_weight_phase(rewards, window, window, window)


# -----------------------------------------------------------------------------
# run state: a small JSON file so a killed run picks up where it stopped

def load_state(out):
    """phase: phases finished; kinds: their kinds; running: the kind of the phase under way (None between
    phases); phase_start_step: the RSFT step a running weight phase started at; archive_iterations and
    harness_rollouts: per harness archive, as of the last finished phase."""
    fresh = {"phase": 0, "kinds": [], "running": None, "harness": None, "phase_start_step": None,
             "archive_iterations": {}, "harness_rollouts": {}}
    path = os.path.join(out, "state.json")
    state = {**fresh, **meta_harness.read_json(path, {})}
    if len(state["kinds"]) != state["phase"]:
        raise SystemExit(f"whale: {path} was written by an older whale.py (no phase kinds): rerun in a fresh --out "
                         f"or delete {out}")
    return state


def check_run_folder(out):
    """A damaged run folder is an error naming the file and the fix, before any work: never a silent restart.
    state.json is written before the first RSFT step and after phase 1's evaluation, so RSFT steps or a phase-2
    evaluation without it mean it was lost."""
    meta_harness.check_run_files(out)
    rft.check_checkpoint(os.path.join(out, "weights"))
    path = os.path.join(out, "state.json")
    steps = os.path.join(out, "weights", "ckpt")
    phases = [r["phase"] for r in read_rows(out) if r.get("event") == "eval"]
    if not os.path.exists(path) and (os.path.exists(steps) or max(phases, default=0) >= 2):
        raise ValueError(f"{path} is missing but {out} holds finished phases or RSFT steps: restore it, or delete "
                         f"{out} to start the run over")


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
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise ValueError(f"damaged run file {path}: line {lineno} is not JSON (a run killed while writing "
                                 "it?): delete that line and rerun") from None
    return rows


# -----------------------------------------------------------------------------
# reuse: what determines a result, and copies that a kill never leaves half made

# flags that shape a run's plan but not what one RSFT step or one evaluation computes
PLAN_FLAGS = ("method", "out", "schedule", "preset", "prompt_only", "harness", "epochs", "phase_epochs",
              "harness_iterations", "adaptive_epochs", "harness_patience", "harness_min_iterations",
              "harness_max_iterations")


def result_settings(args):
    """Every other flag: work is reused only when all of them match (as JSON, the way it is stored)."""
    return json.loads(json.dumps({k: v for k, v in sorted(vars(args).items()) if k not in PLAN_FLAGS}))


def file_sha(path):
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return f"missing: {path}"  # matches nothing, so nothing is reused


def weights_id(trainer):
    """The policy's weights, for the evaluation cache: the base model (also a fresh LoRA adapter, whose B is
    zero, and one whose every RSFT step accepted nothing and so never updated it), or the content hash of the
    current adapter."""
    if trainer is None or all(row["skipped"] for row in trainer.history):
        return "base"
    adapter = Path(trainer.out_dir, "ckpt", "adapter")
    return "adapter " + adapter_config_sha(adapter / "adapter_config.json")[:32] + \
        file_sha(adapter / "adapter_model.safetensors")[:32]


def adapter_config_sha(path):
    """The hash of a peft adapter config as a canonical JSON: peft writes target_modules from a set, in an
    order that differs from one save of the same adapter to the next."""
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return f"missing: {path}"
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def step_harnesses(trainer):
    """The content hash of the harness each RSFT step so far ran under."""
    return [file_sha(row["harness"]) for row in trainer.history]


def link_tree(src, dst, copy_function=None):
    """dst as a copy of the folder src, made of hard links (files are never rewritten in place here; pass
    copy_function=shutil.copy2 for real copies), in a temporary folder renamed at the end, so a kill leaves
    either nothing or the whole copy."""
    tmp = Path(str(dst) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, copy_function=copy_function or link_or_copy)
    os.replace(tmp, dst)


def link_file(src, dst):
    """dst as a hard link of (or a copy of) src, put in place in one rename."""
    tmp = Path(str(dst) + ".tmp")
    tmp.unlink(missing_ok=True)
    link_or_copy(src, tmp)
    os.replace(tmp, dst)


def link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:  # another file system, or none that has hard links
        shutil.copy2(src, dst)


def snapshot_weights(args, trainer):
    """Keep the checkpoint that ends a weight phase as weights/snapshot-<step>/, with key.json saying what
    it holds, so another run of this command can start from it instead of redoing its steps."""
    dst = Path(args.out, "weights", f"snapshot-{trainer.step_count:06d}")
    if (dst / "key.json").exists():
        return
    shutil.rmtree(dst, ignore_errors=True)
    link_tree(Path(args.out, "weights", "ckpt").resolve(), dst)
    key = {"settings": result_settings(args), "harnesses": step_harnesses(trainer)}
    meta_harness.write_json(dst / "key.json", key)  # last: a snapshot counts once its key is there


def find_snapshot(args, trainer, harness, donors, phase_over, start):
    """The donor snapshot furthest along this weight phase: made under the same settings, its steps those
    of this trainer so far followed by steps under `harness` only, and not past where this phase ends."""
    mine, sha, settings = step_harnesses(trainer), file_sha(harness), result_settings(args)
    found, reach = None, len(mine)
    for donor in donors:
        for key_path in sorted(Path(donor, "weights").glob("snapshot-*/key.json")):
            key = meta_harness.read_json(key_path)
            steps = key["harnesses"]
            if len(steps) <= reach or key["settings"] != settings or steps[:len(mine)] != mine \
                    or any(s != sha for s in steps[len(mine):]):
                continue
            rewards = [r["reward"] for r in meta_harness.read_json(key_path.parent / "state.json")["history"]][start:]
            if not any(phase_over(rewards[:n]) for n in range(len(mine) - start, len(steps) - start)):
                found, reach = key_path.parent, len(steps)
    return found


def adopt_snapshot(args, trainer, snapshot, domain, train):
    """Make `snapshot` this run's RSFT checkpoint (as if its steps had run here) and a trainer on it."""
    weights = Path(args.out, "weights")
    state = meta_harness.read_json(snapshot / "state.json")
    folder = weights / f"ckpt-{state['step']:06d}"
    shutil.rmtree(folder, ignore_errors=True)
    link_tree(snapshot, folder)
    link = weights / "ckpt.new"
    link.unlink(missing_ok=True)
    link.symlink_to(folder.name)
    os.replace(link, weights / "ckpt")  # the same atomic switch as rft.RSFT.save
    tmp = weights / "metrics.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in state["history"]))
    os.replace(tmp, weights / "metrics.jsonl")
    backend = trainer.backend
    backend.model = backend.model.unload()  # the base model without the adapter: RSFT loads the checkpoint's
    print(f"weights: RSFT steps {trainer.step_count + 1}-{state['step']} taken from {snapshot}")
    return rft.RSFT(args, backend, domain, weights, train=train)


# -----------------------------------------------------------------------------
# phases

def run_weight_phase(args, trainer, harness, state, steps, n_train, donors, domain, train):
    """RSFT steps under `harness` until this phase ends (see the docstring); resumes mid-phase from the
    trainer's history and takes finished steps from a donor run where one made exactly these. -> trainer"""
    start = state["phase_start_step"]
    cap = steps - start if args.schedule == "adaptive" else min(steps_for(args.phase_epochs, n_train, args.batch),
                                                                steps - start)
    window = steps_for(args.adaptive_epochs, n_train, args.batch)
    phase_over = lambda rewards: weight_phase_over(rewards, args.schedule, cap, window)
    snapshot = find_snapshot(args, trainer, harness, donors, phase_over, start)
    if snapshot is not None:
        trainer = adopt_snapshot(args, trainer, snapshot, domain, train)
    rewards = [row["reward"] for row in trainer.history if row["step"] > start]
    while not phase_over(rewards):
        rewards.append(trainer.step(harness)["reward"])
    return trainer


def run_harness_phase(args, backend, domain, harness, archive, before, cap):
    """Meta-Harness from `harness` under the current weights in `archive`, which already holds `before`
    iterations; this phase adds at most `cap`. Fixed: all of them. Adaptive: until the archive best has
    stalled (patience, minimum) counted from this phase's start. Returns search()'s result."""
    stop = None
    if args.schedule == "adaptive":
        stop = lambda series: len(series) - 1 > before and meta_harness.should_stop_harness_phase(
            series[before:], args.harness_patience, args.harness_min_iterations)
    return meta_harness.search(backend, domain, harness, archive, args, iterations=before + cap, stop=stop)


def adopt_archive(args, archive, harness, weights, donors):
    """Before a harness phase starts a new archive: if a donor run searched from the same harness under the
    same weights and settings (stagewise after weight phases that accepted nothing is harness-only), copy its
    archive; search() then replays what it needs of it and goes on from there. Real copies, not hard links:
    the index files are rewritten. whale_key.json, which says what the archive searched, is written here, by
    whale itself (a proposer never writes into the run folder)."""
    key = {"weights": weights, "seed": file_sha(harness), "prompt_only": args.prompt_only,
           "settings": result_settings(args)}
    if not os.path.exists(os.path.join(archive, "whale_key.json")):
        for donor in sorted(p for run_dir in donors for p in Path(run_dir).glob("harness_w*")
                            if re.fullmatch(r"harness_w\d+", p.name)):  # not a copy a kill left half-made
            if meta_harness.read_json(donor / "whale_key.json", {}) == key:
                shutil.rmtree(archive, ignore_errors=True)  # what a kill before the key left
                link_tree(donor, archive, copy_function=shutil.copy2)
                print(f"harness phase: the same search as {donor}, copied")
                break
        os.makedirs(archive, exist_ok=True)
        meta_harness.write_json(os.path.join(archive, "whale_key.json"), key)


def evaluate_test(args, backend, domain, harness, tag, weights, donors):
    """mean@k on the test split with the score of every task, in evals/<tag>.json. A resumed run reads it
    back; the same evaluation (weights, harness content, settings) made earlier by this run or a donor run
    is copied with its traces instead of redone."""
    folder = Path(args.out, "evals")
    path = folder / f"{tag}.json"
    if path.exists():
        return meta_harness.read_json(path)["stats"]
    folder.mkdir(parents=True, exist_ok=True)
    key = {"weights": weights, "harness": file_sha(harness), "settings": result_settings(args)}
    for run_dir in [args.out, *donors]:
        for other in sorted(Path(run_dir, "evals").glob("*.json")):
            saved = meta_harness.read_json(other)
            if saved.get("key") == key:
                traces = other.with_name(other.name[:-len(".json")] + ".traces.jsonl")
                if traces.exists():
                    link_file(traces, folder / f"{tag}.traces.jsonl")
                meta_harness.write_json(path, {**saved, "copied_from": str(other)})  # last: marks it done
                print(f"test mean@{args.k} ({tag}): the same as {other}, copied")
                return saved["stats"]
    traces = folder / f"{tag}.traces.jsonl"
    traces.unlink(missing_ok=True)  # an evaluation killed midway starts over
    tasks = domain.load("test")[: args.test_limit]
    stats = rollout.evaluate(domain, harness, tasks, backend, k=args.k, temperature=args.temperature,
                             top_k=args.top_k, max_new_tokens=args.max_new_tokens, deadline_s=args.deadline,
                             seed=args.seed, traces_path=str(traces), desc=f"test mean@{args.k} ({tag})")
    # prefixed so they never clash with the run's own counters (test rollouts are not part of the cost)
    per_task = stats["per_task"]
    stats = {"mean_at_k": stats["mean_at_k"], "k": stats["k"], "test_tasks": len(per_task),
             **{f"test_{name}": stats[name] for name in ("rollouts", "mean_turns", "tokens", "errors", "seconds")}}
    meta_harness.write_json(path, {"key": key, "stats": stats, "per_task": per_task})
    return stats


# -----------------------------------------------------------------------------

def main(argv=None):
    runs = parse_args(argv)
    try:
        sandbox.apply_args(runs[0])
        for args in runs:
            check_run_folder(args.out)
    except (ValueError, sandbox.SandboxError) as e:
        raise SystemExit(f"whale.py: error: {e}")
    for args in runs:
        try:
            run(args, donors=[other.out for other in runs if other.out != args.out])
        except engines.EngineError as e:  # an engine that failed or serves stale weights (the canary)
            raise SystemExit(f"whale.py: error: {e}")
        gc.collect()  # the finished run's model and optimizer go before the next run loads its own


def run(args, donors=()):
    """One method's run; `donors` are the folders of the other runs of this command, whose finished weight
    phases and evaluations this run reuses where they are exactly its own."""
    os.makedirs(args.out, exist_ok=True)
    meta_harness.write_json(os.path.join(args.out, "config.json"), vars(args))
    print(f"whale: {method_name(args)} on {args.domain}, preset {args.preset} -> {args.out}")
    print(json.dumps(vars(args), indent=None))

    try:
        domain = domains.get(args.domain, args)
        train = domain.load("train")[: args.train_limit]
        domain.load("test")  # a malformed data file is an error now, before any model is loaded
    except (ValueError, FileNotFoundError, ImportError) as e:
        raise SystemExit(f"whale.py: error: {e}")
    steps, iterations = budgets(args, len(train))
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = engines.load_model(args.model, dtype=torch.bfloat16 if args.bf16 else None)
    try:
        backend = engines.load_backend(args, model, tok)
    except ValueError as e:  # an engine option the platform refuses (e.g. --vllm-sleep on CPU)
        raise SystemExit(f"whale.py: error: {e}")
    trainer = rft.RSFT(args, backend, domain, os.path.join(args.out, "weights"), train=train) if steps else None
    state = load_state(args.out)
    harness = state["harness"] or os.path.abspath(args.harness)

    def step_count():
        return trainer.step_count if trainer else 0

    def rollouts():
        return (trainer.rollouts if trainer else 0) + sum(state["harness_rollouts"].values())

    if not any(r.get("event") == "start" for r in read_rows(args.out)):
        log_row(args.out, {"event": "start", "weight_steps": steps, "harness_iterations": iterations,
                           "time": time.time()})
    stats = evaluate_test(args, backend, domain, harness, "phase_0", weights_id(trainer), donors)
    log_eval_once(args.out, {"event": "eval", "phase": 0, "kind": "start", "step": 0, "rollouts": 0, **stats})

    while True:
        iterations_done = sum(state["archive_iterations"].values())
        kind = state["running"] or next_phase(args.method, (state["kinds"] or [None])[-1], steps - step_count(),
                                              iterations - iterations_done)
        if kind is None:
            break
        if state["running"] is None:  # a new phase: remember it, so a resumed run finishes this one first
            state.update(running=kind, phase_start_step=step_count())
            save_state(args.out, state)
        i, t0 = state["phase"] + 1, time.time()
        if kind == "weight":
            trainer = run_weight_phase(args, trainer, harness, state, steps, len(train), donors, domain, train)
            snapshot_weights(args, trainer)
            detail = {"steps": trainer.step_count - state["phase_start_step"], "epoch": trainer.epoch_progress}
        else:
            archive = f"harness_w{state['kinds'].count('weight')}"
            before = state["archive_iterations"].get(archive, 0)
            if before == 0:
                adopt_archive(args, os.path.join(args.out, archive), harness, weights_id(trainer), donors)
            cap = args.harness_max_iterations if args.schedule == "adaptive" else args.harness_iterations
            result = run_harness_phase(args, backend, domain, harness, os.path.join(args.out, archive), before,
                                       min(cap, iterations - iterations_done))
            harness = result["winner"]
            state["archive_iterations"][archive] = result["iterations"]
            state["harness_rollouts"][archive] = result["rollouts"]
            detail = {"iterations": result["iterations"] - before, "archive": archive,
                      "harness_score": result["score"], "winner": harness}
        state.update(phase=i, kinds=state["kinds"] + [kind], running=None, phase_start_step=None, harness=harness)
        stats = evaluate_test(args, backend, domain, harness, f"phase_{i}", weights_id(trainer), donors)
        log_eval_once(args.out, {"event": "eval", "phase": i, "kind": kind, "step": step_count(),
                                 "rollouts": rollouts(), "seconds": time.time() - t0, **detail, **stats})
        save_state(args.out, state)
        print(f"phase {i} {kind}: test mean@{args.k} = {stats['mean_at_k']:.4f}, RSFT steps {step_count()}/{steps}, "
              f"harness iterations {sum(state['archive_iterations'].values())}/{iterations}, rollouts {rollouts()}")

    write_summary(args, read_rows(args.out), harness, step_count(), sum(state["archive_iterations"].values()))


def write_summary(args, rows, harness, steps, iterations):
    evals = [r for r in rows if r.get("event") == "eval"]
    best = max(evals, key=lambda r: (r["mean_at_k"], -r["rollouts"]))
    summary = {"domain": args.domain, "method": method_name(args), "preset": args.preset, "model": args.model,
               "k": args.k, "best_mean_at_k": best["mean_at_k"], "rollouts_to_best": best["rollouts"],
               "best_phase": best["phase"], "final_mean_at_k": evals[-1]["mean_at_k"],
               "total_rollouts": evals[-1]["rollouts"], "phases": len(evals) - 1, "rsft_steps": steps,
               "harness_iterations": iterations, "final_harness": harness, "test_tasks": evals[-1]["test_tasks"]}
    meta_harness.write_json(os.path.join(args.out, "summary.json"), summary)
    print(f"best mean@{args.k} = {summary['best_mean_at_k']:.4f} after {summary['rollouts_to_best']} rollouts; "
          f"final {summary['final_mean_at_k']:.4f}")


if __name__ == "__main__":
    main()
