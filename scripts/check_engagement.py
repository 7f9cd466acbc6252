"""
Do both axes engage under a preset? weight-only's RSFT and harness-only's search with exactly whale.py's budgets
and settings, judged on the training reward and the harness-set scores only: no test task is run.

    python scripts/check_engagement.py --domain searchqa --seed 0 --out results-calib/engage
    python scripts/check_engagement.py --domain math --seed 1 --out results-calib/engage -- --epochs 2

Flags after `--` go to whale.py as given (the preset is --preset cpu unless they say otherwise). Per run folder
OUT/seed-<n>/<domain>/<method>/ (rerun to resume, as whale.py), and OUT/seed-<n>/<domain>/engagement.json:
    weight-only   accepted episodes and examples in its first weight phase; the mean training reward of its
                  first and last quarter of RSFT steps: it engages when the first phase accepted some and the
                  last quarter is above the first
    harness-only  h0's harness-set score and the archive best after its rounds: it engages when the best is above h0
harness-only runs first, under the base weights; weight-only then adds its adapter to the same model.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import meta_harness  # noqa: E402
import report  # noqa: E402
import rft  # noqa: E402
import rollout  # noqa: E402
import whale  # noqa: E402
from lib.episodes import sandbox  # noqa: E402
from lib.cli import run_config  # noqa: E402
from lib.subsets import seeded_sample  # noqa: E402


def harness_only(cfg, policy, domain, n_train, out):
    _, rounds = whale.budgets(cfg, n_train)
    t0 = time.time()
    result = meta_harness.search(policy, domain, os.path.abspath(cfg.harness), out / "harness_w0", cfg.search,
                                 rounds)
    h0 = json.loads((out / "harness_w0" / "candidates" / "h0" / "scores.json").read_text())["score"]
    return {"rounds": rounds, "h0_score": h0, "best_score": result["score"], "best_series": result["best_series"],
            "winner": Path(result["winner"]).parent.name, "rollouts": result["rollouts"],
            "engaged": result["score"] > h0, "seconds": round(time.time() - t0, 1)}


def weight_only(cfg, policy, domain, train, out):
    steps, _ = whale.budgets(cfg, len(train))
    phase = whale.steps_for(cfg.phase_epochs, len(train), cfg.batch)
    trainer = rft.RSFT(cfg.rsft, policy, domain, out / "weights" / "ckpt", train)
    t0 = time.time()
    rows = [trainer.step(os.path.abspath(cfg.harness)) for _ in range(steps)]
    rewards = [r["accept_rate"] for r in rows]  # the share of successful rollouts (lib/rules.SUCCESS)
    first, last = report.quarters(rows)  # the table's own rule (report.py's What moved)
    accepted = [round(r["accept_rate"] * cfg.batch * cfg.rsft.group) for r in rows]
    return {"steps": steps, "phase_steps": phase, "rewards": [round(r, 4) for r in rewards],
            "accepted_episodes": accepted, "first_phase_accepted": sum(accepted[:phase]),
            "first_phase_examples": sum(r["examples"] for r in rows[:phase]),
            "first_quarter": round(first, 4), "last_quarter": round(last, 4),
            "engaged": sum(accepted[:phase]) > 0 and last > first, "rollouts": trainer.rollouts,
            "sample_s": round(sum(r["sample_s"] for r in rows), 1), "train_s": round(sum(r["train_s"] for r in rows), 1),
            "seconds": round(time.time() - t0, 1)}


def main():
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domain", required=True)
    p.add_argument("--seed", default="0")
    p.add_argument("--out", required=True)
    p.add_argument("--method", nargs="+", default=["harness-only", "weight-only"],
                   choices=("harness-only", "weight-only"))
    ours = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    runs = whale.parse_args(["--domain", ours.domain, "--seed", ours.seed, "--preset", "cpu", *extra,
                             "--method", *ours.method])
    sandbox.apply_args(runs[0])
    rollout.apply_args(runs[0])  # --threads too
    domain = whale.domains.from_args(runs[0])
    train = seeded_sample(domain.load("train"), runs[0].train_limit)
    policy = whale.load_policy(runs[0])
    folder = Path(ours.out, f"seed-{ours.seed}", ours.domain)
    report_path = folder / "engagement.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    for args in runs:
        rollout.INFRA_ERRORS.start_phase(args.method)  # each method's episodes, a budget phase of their own
        out = folder / args.method
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(vars(args), indent=1))
        cfg = run_config(args, whale.domains.data_flags())
        if args.method == "harness-only":
            report["harness-only"] = harness_only(cfg, policy, domain, len(train), out)
        else:
            report["weight-only"] = weight_only(cfg, policy, domain, train, out)
        report["harness"] = args.harness
        report_path.write_text(json.dumps(report, indent=1) + "\n")
        print(json.dumps({args.method: {k: v for k, v in report[args.method].items() if not isinstance(v, list)}}))


if __name__ == "__main__":
    main()
