"""
Calibrate a cpu h0: under the base weights, at the cpu preset's sampling settings (whale.py PRESETS["cpu"]:
temperature 0.6, top-k 20, 32 new tokens a call, ...), a harness's training reward and its harness-set score,
and why its failed episodes fail. Never the test split. --preset smoke: the same for a smoke h0, on the random
smoke model at the smoke preset's settings (presets.py SMOKE).

    python scripts/calibrate_cpu_h0.py --domain searchqa --harness harnesses/cpu/searchqa.py --out results-calib/sq.json
    python scripts/calibrate_cpu_h0.py --domain math --harness harnesses/math.py \
        --variant "" "ANSWER_FROM_OUTPUT=#1" "EXAMPLES=#3 ANSWER_FROM_OUTPUT=#1" --out results-calib/math.json
    python scripts/calibrate_cpu_h0.py --preset smoke --domain math --harness harnesses/smoke/math.py --out results-calib/smoke-math.json

Each --variant is the harness with some knobs set: KNOB=#i takes SEARCH_SPACE[KNOB][i], KNOB=LITERAL a Python
literal; "" is the harness as it is. Per variant:
    train    the preset's training prompts (--train-limit, a seeded sample; --train-prompts N of them) x G
             (--group) samples: the training reward is the share of rollouts with reward > lib/rules.SUCCESS, as rft.py
             counts accepted episodes; with all 64 x 4 it is the reward RSFT's first epoch would see
    harness  the preset's harness set (--harness-tasks x --harness-samples): its score, mean@1, is what
             meta_harness.py would give this harness as a candidate
and for both the failure kinds of lib/failures.py. The model is loaded once for all variants. --out: one JSON
report, a row per variant (report.py's style: plain numbers, their counts, the settings they were made under).
"""
import argparse
import ast
import json
import os
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import domains  # noqa: E402
import meta_harness  # noqa: E402
import rollout  # noqa: E402
from lib.cli import sampling_of  # noqa: E402
import whale  # noqa: E402
from lib.episodes import sandbox  # noqa: E402
from lib.failures import failure_kind  # noqa: E402
from lib.mutate import knob_values, set_knob  # noqa: E402
from lib.backends.policy import load_policy  # noqa: E402
from lib.rules import SUCCESS  # noqa: E402
from lib.subsets import seeded_sample  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domain", required=True, choices=("searchqa", "math", "countdown", "chess"))
    p.add_argument("--preset", default="cpu", choices=("cpu", "smoke"),
                   help="whose model, sampling and sizes (the smoke preset's h0s: presets.py SMOKE)")
    p.add_argument("--harness", required=True, help="the harness file the variants start from")
    p.add_argument("--variant", nargs="+", default=[""], help='knob settings, e.g. "SEARCH_FIRST=#1 TOP_K=3"')
    p.add_argument("--train-prompts", type=int, default=None, help="first N of the preset's training prompts")
    p.add_argument("--splits", nargs="+", default=["train", "harness"], choices=("train", "harness"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="the JSON report")
    args = p.parse_args(argv)
    # every other setting is the preset's, exactly as whale.py resolves it for this domain
    preset = whale.parse_args(["--domain", args.domain, "--preset", args.preset, "--method", "weight-only",
                               "--harness", args.harness, "--seed", str(args.seed)])[0]
    return args, preset


def variant_source(source, spec):
    """The harness source with the knobs of `spec` set ("KNOB=#i KNOB=LITERAL ..."); -> (source, {knob: value})."""
    space, changes = knob_values(source).get("SEARCH_SPACE") or {}, {}
    for item in spec.split():
        knob, value = item.split("=", 1)
        changes[knob] = space[knob][int(value[1:])] if value.startswith("#") else ast.literal_eval(value)
        source = set_knob(source, knob, changes[knob])
    return source, changes


def measure(domain, path, tasks, samples, policy, preset, desc):
    """Run the harness on tasks x samples; -> the figures calibration needs."""
    t0 = time.time()
    eps, counts = rollout.run_and_count(domain, path, tasks, policy, samples=samples, seed=preset.seed, desc=desc,
                                        **sampling_of(preset, workers=None).kwargs())
    kinds = {}
    for e in eps:
        kind = failure_kind(e)
        if kind:
            kinds[kind] = kinds.get(kind, 0) + 1
    per_task = {}
    for e in eps:
        per_task.setdefault(e["task_id"], []).append(e["reward"])
    return {"tasks": len(tasks), "samples": samples, "rollouts": len(eps),
            "reward": round(sum(e["reward"] > SUCCESS for e in eps) / len(eps), 4),
            "mean_at_k": round(sum(sum(r) / len(r) for r in per_task.values()) / len(per_task), 4),
            "tasks_solved": sum(any(r > SUCCESS for r in rs) for rs in per_task.values()),
            "failure_kinds": kinds, "mean_turns": round(sum(e["turns"] for e in eps) / len(eps), 2),
            "tokens": sum(e["tokens"] for e in eps), "llm_calls": counts["llm_calls"],
            "generate_calls": counts["generate_calls"], "seconds": round(time.time() - t0, 1)}


def main(argv=None):
    args, preset = parse_args(argv)
    sandbox.apply_args(preset)
    rollout.apply_args(preset)
    domain = domains.from_args(preset)
    train = seeded_sample(domain.load("train"), preset.train_limit)[:args.train_prompts]
    harness_set = meta_harness.harness_tasks(domain, preset)
    t0 = time.time()
    policy = load_policy(preset)
    load_s = round(time.time() - t0, 1)
    source, rows = Path(args.harness).read_text(), []
    with tempfile.TemporaryDirectory() as tmp:
        for i, spec in enumerate(args.variant):
            text, changes = variant_source(source, spec)
            path = Path(tmp, f"variant_{i}.py")
            path.write_text(text)
            row = {"harness": args.harness, "variant": spec, "changes": changes}
            if "train" in args.splits:
                row["train"] = measure(domain, path, train, preset.group, policy, preset, f"train {spec or 'as is'}")
            if "harness" in args.splits:
                row["harness_set"] = measure(domain, path, harness_set, preset.harness_samples, policy, preset,
                                             f"harness {spec or 'as is'}")
            rows.append(row)
            print(json.dumps({"variant": spec or "as is",
                              **{split: {k: row[key][k] for k in ("rollouts", "reward", "failure_kinds", "seconds")}
                                 for split, key in (("train", "train"), ("harness", "harness_set")) if key in row}}))
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({
                "domain": args.domain, "model": preset.model, "seed": args.seed, "model_load_s": load_s,
                "settings": {k: getattr(preset, k) for k in ("temperature", "top_k", "max_new_tokens", "train_limit",
                                                             "group", "harness_tasks", "harness_samples",
                                                             "math_max_steps", "threads")},
                "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
