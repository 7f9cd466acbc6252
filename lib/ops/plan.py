"""whale.py --plan: a run's phases, RSFT steps, proposer rounds and rollouts, from its flags and data sizes alone."""
import math


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
                     f"{args.harness_min_iterations}-{args.harness_max_iterations} rounds)")
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
