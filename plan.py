r"""
Before a run: its plan (phases, RSFT steps, proposer rounds, rollouts and hours on one card), or a check of
every resource it needs. It takes whale.py's flags and loads no model, so it answers in seconds.

    python plan.py --domain searchqa --method whale --preset paper
    python plan.py --domain math --preset gpu --method whale weight-only stagewise
    python plan.py --check searchqa math chess --preset gpu --domain searchqa   # run_all.sh's first step
    python plan.py --check --preset gpu --domain chess --card-gb 24              # the same, for a 24 GiB card

The plan is the one whale.py would follow (whale.budgets, whale.fixed_phases, under the same flags); the
hours come from lib/ops/time_model.py. --check runs lib/ops/preflight.py: one line per check, 0 when all pass.
"""
import math
import sys

import domains
import whale
from lib.cli import one_line_errors, positive_float
from lib.ops import preflight, time_model
from lib.subsets import seeded_sample
from presets import PAPER_TRAIN_SIZES


def add_args(parser):
    g = parser.add_argument_group("check instead of plan")
    g.add_argument("--check", nargs="*", default=None, choices=sorted(domains.DOMAINS), metavar="DOMAIN",
                   help="check every resource this run needs (and those of the same run on these domains) in "
                        "seconds, before any model loads, then exit: one line per check, 0 when all pass")
    g.add_argument("--card-gb", type=positive_float, default=None, metavar="GiB",
                   help="--check the engine and trainer against a card of this many GiB instead of this machine's "
                        "(no GPU needed), e.g. 24 for an RTX 4090; the gpu preset's --micro-batch is fitted to it")


def parse_args(argv=None):
    return whale.parse_args(argv, more_args=add_args, description=__doc__)


# -----------------------------------------------------------------------------
# the plan

def plan_sizes(args):
    """(train prompts, harness tasks, test tasks) of a run, from the data sizes alone (no model is loaded)."""
    if args.data == "paper":
        n_train = min(PAPER_TRAIN_SIZES[args.domain],
                      args.train_limit or PAPER_TRAIN_SIZES[args.domain])
        n_test = {"searchqa": len(args.searchqa_test_sets.split(",")) * args.searchqa_test_per_set,
                  "math": 60, "chess": args.chess_test_size}[args.domain]
        return n_train, args.harness_tasks, min(n_test, args.test_limit or n_test)
    domain = domains.from_args(args)
    n_train = len(seeded_sample(domain.load("train"), args.train_limit))
    n_harness = len(seeded_sample(domain.load("harness"), args.harness_tasks))
    return n_train, n_harness, len(whale.test_tasks(domain, whale.run_config(args, domains.data_flags()).test))


def print_plan(runs, card_gb=80):
    """Each run's phases, steps, rounds and rollouts (describe) and its estimated hours on one card of card_gb
    (time_model) for its own work: the phases an earlier run of the process made are reused, not redone
    (lib/run_folder/ledger.py; adaptive phases end by their rules, so only the start is). -> [estimate, or None for a
    model the time model lacks]"""
    sizes = plan_sizes(runs[0])  # every run of a command has the same data
    n_train, n_harness, n_test = sizes
    data_flags = domains.data_flags()
    configs = [whale.run_config(args, data_flags) for args in runs]
    phases = [whale.fixed_phases(cfg, n_train) for cfg in configs]
    shared = [0] * len(runs)
    if runs[0].schedule == "fixed":
        shared = time_model.shared_phases([(a.method, p) for a, p in zip(runs, phases)])
    estimates = []
    for i, (args, cfg, own, reused) in enumerate(zip(runs, configs, phases, shared)):
        print("\n".join(describe(args, whale.method_name(args), own, whale.budgets(cfg, n_train), *sizes)))
        if i:
            made = {0: "", 1: " and phase 1"}.get(reused, f" and phases 1-{reused}")
            print(f"  reused from the runs before it in this process: phase 0's evaluation{made}")
        est = time_model.estimate(args, own, n_harness, n_test, card_gb, shared=reused, first=i == 0)
        print(time_model.describe(est, card_gb) if est else
              f"no time estimate for --model {args.model} (lib/ops/time_model.py)")
        estimates.append(est)
    if len(runs) > 1 and all(estimates):
        print(f"estimated {sum(e['total'] for e in estimates):.2f} h for these {len(runs)} runs in one "
              f"process (reused: {sum(shared)} of their phases and {len(runs) - 1} start evaluations)")
    return estimates


def describe(args, name, phases, budget, n_train, n_harness, n_test):
    """The plan's lines: `phases` as whale.fixed_phases gives them, `budget` as whale.budgets does."""
    steps, rounds = budget
    lines = [f"plan: {name} on {args.domain}, preset {args.preset}: {n_train} train prompts, {args.batch} a step "
             f"({n_train / args.batch:.1f} steps an epoch), G = {args.group}; {steps} RSFT steps, {rounds} proposer "
             f"rounds of M = {args.candidates} on {n_harness} harness tasks; schedule {args.schedule}",
             sft_line(args)]
    score = n_harness * args.harness_samples  # one scoring of one harness
    trained = scored = 0
    last = None
    for i, (kind, size) in enumerate(phases, 1):
        if kind == "weight":
            n = size * args.batch * args.group
            trained += n
            lines.append(f"  phase {i:2d}  weight   {f'{size} steps':29s}{n:10,d} rollouts")
            last = kind
            continue
        # a new archive (its seed re-scored) unless the last phase searched under the same weights (the ledger's
        # archive_for; the plan counts every weight phase as moving the weights)
        fresh = last != "harness"
        last = kind
        n = fresh * score + size * args.candidates * (score + 1)  # + one smoke episode per candidate
        scored += n
        what = f"{'re-score + ' if fresh else ''}{size} rounds"
        lines.append(f"  phase {i:2d}  harness  {what:29s}{n:10,d} rollouts (of them {size * args.candidates} "
                     "smoke episodes)")
    if args.schedule == "adaptive":
        lines.append("  (adaptive: phases end by their rules, within these budgets; a harness phase makes "
                     f"{args.harness_min_rounds}-{args.harness_max_rounds} rounds)")
    weight = [n for kind, n in phases if kind == "weight"]
    harness = [n for kind, n in phases if kind == "harness"]
    lines.append(f"{len(weight)} weight phases ({' + '.join(map(str, weight)) or 0} steps), {len(harness)} harness "
                 f"phases ({' + '.join(map(str, harness)) or 0} rounds)")
    evals = len(phases) + 1 if args.test_evals == "every" else 2  # ends: before and after
    lines.append(f"total: {trained + scored:,d} rollouts ({trained:,d} training, {scored:,d} harness scoring); test "
                 f"evaluation, not counted: {evals} x {n_test} tasks x k = {args.k} = {evals * n_test * args.k:,d}")
    return lines


def sft_line(args):
    """The SFT update of one rollout step: one optimizer step per --sft-batch accepted trajectories (RSFT keeps
    those with reward 1), so between 0 (nothing accepted) and ceil(batch x G / sft_batch) optimizer steps."""
    most = math.ceil(args.batch * args.group / args.sft_batch)
    return (f"  SFT: one optimizer step per {args.sft_batch} accepted trajectories: 0-{most} optimizer steps per "
            f"rollout step of {args.batch * args.group:,d} trajectories")


def main(argv=None):
    runs = parse_args(argv)
    if runs[0].check is None:
        if runs[0].data != "paper":  # the paper's sets load slowly, and its presets hold out no test task
            with one_line_errors("plan.py"):
                test = whale.run_config(runs[0], domains.data_flags()).test
                warning = whale.holdout_warning(domains.from_args(runs[0]), test)
            if warning:
                print(warning)
        print_plan(runs)
        return
    # each --check domain parsed as its own run, with the same flags
    argv = sys.argv[1:] if argv is None else list(argv)
    runs += [parse_args([*argv, "--domain", d])[0] for d in runs[0].check]
    raise SystemExit(preflight.main(runs, check_harness=domains.check_harness, domain_of=domains.from_args))


if __name__ == "__main__":
    main()
