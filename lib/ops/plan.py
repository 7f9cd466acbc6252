"""whale.py --plan: a run's phases, RSFT steps, proposer rounds and rollouts, from its flags and data sizes alone."""
import math

from lib.ops import time_model


def describe(args, name, phases, budget, n_train, n_harness, n_test):
    """The plan's lines: `phases` as whale.fixed_phases gives them, `budget` as whale.budgets does."""
    steps, rounds = budget
    lines = [f"plan: {name} on {args.domain}, preset {args.preset}: {n_train} train prompts, {args.batch} a step "
             f"({n_train / args.batch:.1f} steps an epoch), G = {args.group}; {steps} RSFT steps, {rounds} proposer "
             f"rounds of M = {args.candidates} on {n_harness} harness tasks; schedule {args.schedule}",
             sft_line(args)]
    score = n_harness * args.harness_samples  # one scoring of one harness
    trained = scored = 0
    archives = set()
    for i, (kind, size) in enumerate(phases, 1):
        if kind == "weight":
            n = size * args.batch * args.group
            trained += n
            lines.append(f"  phase {i:2d}  weight   {f'{size} steps':29s}{n:10,d} rollouts")
            continue
        fresh = args.method in ("whale", "fast-slow") or not archives  # new weights: a new archive
        archives.add(i if fresh else min(archives))
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
    evals = len(phases) + 1 if getattr(args, "test_evals", "every") == "every" else 2  # ends: before and after
    lines.append(f"total: {trained + scored:,d} rollouts ({trained:,d} training, {scored:,d} harness scoring); test "
                 f"evaluation, not counted: {evals} x {n_test} tasks x k = {args.k} = {evals * n_test * args.k:,d}")
    return lines


def sft_line(args):
    """The SFT update of one rollout step: one optimizer step per --sft-batch accepted trajectories (RSFT keeps
    those with reward 1), so between 0 (nothing accepted) and ceil(batch x G / sft_batch) optimizer steps."""
    most = math.ceil(args.batch * args.group / args.sft_batch)
    return (f"  SFT: one optimizer step per {args.sft_batch} accepted trajectories: 0-{most} optimizer steps per "
            f"rollout step of {args.batch * args.group:,d} trajectories")


def print_runs(runs, names, phases, budgets, sizes, card_gb):
    """Each run's plan (describe) and its estimated hours on one card of card_gb (time_model) for its
    own work: the phases an earlier run of the process made are reused, not redone (lib/memo.py;
    adaptive phases end by their rules, so only the start is). -> [estimate, or None]"""
    _, n_harness, n_test = sizes
    shared = [0] * len(runs)
    if runs[0].schedule == "fixed":
        shared = time_model.shared_phases([(a.method, p) for a, p in zip(runs, phases)])
    estimates = []
    for i, (args, name, own, budget, reused) in enumerate(zip(runs, names, phases, budgets, shared)):
        print("\n".join(describe(args, name, own, budget, *sizes)))
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
