r"""
Before a run: its plan (phases, RSFT steps, proposer rounds, rollouts and hours on one card), or a check of
every resource it needs. It takes whale.py's flags and loads no model, so it answers in seconds.

    python plan.py --domain searchqa --method whale --preset paper
    python plan.py --domain math --preset gpu --method whale weight-only stagewise
    python plan.py --check searchqa math chess --preset gpu --domain searchqa   # run_all.sh's first step
    python plan.py --domain math --preset paper --card 141 --gpus 8 --ranks 8   # a node of 8 H200s, torchrun
    python plan.py --check --preset gpu --domain chess --card 24                 # the check, for a 24 GB card

The plan is the one whale.py would follow (whale.budgets, whale.fixed_phases, under the same flags); the
hours come from lib/ops/time_model.py. --check runs lib/ops/preflight.py: one line per check, 0 when all pass;
then, where those pass, whether each domain's h0 earns anything with the run's model (check_h0): a run whose
base model never succeeds under h0 trains nothing, and hears it here, not an hour later.
"""
import math
import sys

import domains
import rft
import rollout
import whale
from lib.cli import one_line_errors, sampling_of
from lib.common.argtypes import positive_int
from lib.episodes import sandbox
from lib.methods import HARNESS, METHODS
from lib.ops import preflight, time_model
from lib.rules import SUCCESS
from lib.subsets import seeded_sample
from presets import PAPER_TRAIN_SIZES

# check_h0's look: H0_TASKS train tasks x G episodes (--group: as an RSFT step samples them), two RSFT steps' worth
# under the cpu preset. Enough that a calibrated h0 is rarely taken for one that earns nothing: at math's base
# training reward under the cpu preset (6.3 %, docs/cpu-run/README.md), none of 64 is a 1.6 % chance (seeded: the
# same run's check gives the same count; the cpu preset's math h0 got 1 of 64 on 2026-12-03), hence a warning, not a
# failure
H0_TASKS = 16


def add_args(parser):
    g = parser.add_argument_group("the machine the plan is for (the hours; --card and --ranks also for --check)",
                                  lead=True)  # plan.py --help shows it (lib/cli.Parser)
    g.add_argument("--card", type=int, default=None, choices=sorted(time_model.CARDS),
                   help="the card class in GB (lib/ops/time_model.CARDS): the hours are for it (default 80), and "
                        "--check checks the engine and trainer against it instead of this machine's card (no GPU "
                        "needed), e.g. 24 for an RTX 4090; the gpu preset's --micro-batch is fitted to it")
    g.add_argument("--gpus", type=positive_int, default=None,
                   help="cards in all (default: --ranks): the engine's replicas and the trainer ranks share them")
    g.add_argument("--ranks", type=positive_int, default=1,
                   help="trainer ranks: the processes torchrun starts (--nproc_per_node x --nnodes; "
                        "lib/backends/ranks.py)")
    g.add_argument("--nodes", type=positive_int, default=1,
                   help="--check: the nodes the ranks run on (more than one: the run folder must be on a shared "
                        "file system)")
    g = parser.add_argument_group("check instead of plan", lead=True)
    g.add_argument("--check", nargs="*", default=None, choices=sorted(domains.DOMAINS), metavar="DOMAIN",
                   help="check every resource this run needs (and those of the same run on these domains) in "
                        "seconds, before any model loads, then exit: one line per check, 0 when all pass")


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


def print_plan(runs, card_gb=80, gpus=1, ranks=1):
    """Each run's phases, steps, rounds and rollouts (describe) and its estimated hours on `gpus` cards of card_gb
    with `ranks` trainer ranks (time_model) for its own work: the phases an earlier run of the process made are
    reused, not redone (the store, lib/run_folder/store.py; adaptive phases end by their rules, so only the start
    is). -> [estimate, or None for a model the time model lacks]"""
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
        est = time_model.estimate(args, own, n_harness, n_test, card_gb, shared=reused, first=i == 0, gpus=gpus,
                                  ranks=ranks)
        print(time_model.describe(est, card_gb) if est else
              f"no time estimate for --model {args.model} (lib/ops/time_model.py)")
        estimates.append(est)
    if len(runs) > 1 and all(estimates):
        print(f"estimated {sum(e['total'] for e in estimates):.2f} h for these {len(runs)} runs in one "
              f"process (reused: {sum(shared)} of their phases and {len(runs) - 1} start evaluations)")
    if all(estimates):  # run_all.sh's turns: the proposer's hours are another domain's time on the card
        card = sum(e["total"] - e["proposer"] for e in estimates)
        print(f"of them {card:.2f} h on the card and {sum(e['proposer'] for e in estimates):.2f} h of proposer "
              "waits, which run_all.sh's turns give to the other domains' processes (the night with and without "
              "them: python scripts/memory_plan.py)")
    return estimates


def describe(args, name, phases, budget, n_train, n_harness, n_test):
    """The plan's lines: `phases` as whale.fixed_phases gives them, `budget` as whale.budgets does."""
    steps, rounds = budget
    lines = [f"plan: {name} on {args.domain}, preset {args.preset}: {n_train} train prompts, {args.batch} a step "
             f"({n_train / args.batch:.1f} steps an epoch), G = {args.group}; {steps} "
             f"{whale.step_name(args.weight_step)} steps, {rounds} proposer "
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
    """The update of one rollout step by the method's weight step: one optimizer step per --sft-batch trajectories
    it trains on (RSFT keeps those with reward 1), so between 0 (none) and ceil(batch x G / sft_batch)."""
    most = math.ceil(args.batch * args.group / args.sft_batch)
    return (f"  weight step {args.weight_step}: one optimizer step per {args.sft_batch} trajectories it trains on: "
            f"0-{most} optimizer steps per rollout step of {args.batch * args.group:,d} trajectories")


# -----------------------------------------------------------------------------
# --check: can the runs learn?

def check_h0(runs):
    """Whether each domain's h0 earns anything with the run's model: H0_TASKS train tasks (a seeded sample of the
    run's) x G episodes at the run's sampling settings, for the runs that train weights. A weight step
    learns from successes (RSFT keeps only those), so none at all means the weights never move. The hf backend
    only (an engine takes minutes to start: the gpu and paper presets' first step shows it), and not the random
    smoke model (only math's smoke h0 earns with it: README, "The smoke preset trains") or the null one, which
    earns nothing by design. -> one line per domain: ok with the count, or WARN naming the fix"""
    lines, policies, seen = [], {}, set()
    for args in runs:
        if (METHODS[args.method].budgets == HARNESS or args.backend != "hf" or args.model in ("smoke", "null")
                or args.domain in seen):
            continue
        seen.add(args.domain)
        sandbox.apply_args(args)
        rollout.apply_args(args)  # --threads
        if args.model not in policies:
            policies[args.model] = whale.load_policy(args)
        domain = domains.from_args(args)
        tasks = seeded_sample(seeded_sample(domain.load("train"), args.train_limit), H0_TASKS)
        episodes = rollout.run_episodes(domain, args.harness, tasks, policies[args.model], samples=args.group,
                                        seed=args.seed, desc=f"h0 on {args.domain} train tasks",
                                        **sampling_of(args).kwargs())
        won = sum(e["reward"] > SUCCESS for e in episodes)
        said = f"{len(episodes)} episodes of {args.harness} on {len(tasks)} train tasks under --model {args.model}"
        if won:
            lines.append(f"ok   h0 ({args.domain}): {won} of {said} succeed")
        else:
            lines.append(f"WARN h0 ({args.domain}): none of {said} succeeds, so a weight step would train on "
                         f"nothing: give {args.domain} an h0 its model can start from (presets.py CPU, calibrated "
                         f"with scripts/calibrate_cpu_h0.py) or a larger --model")
    return lines


def main(argv=None):
    runs = parse_args(argv)
    with one_line_errors("plan.py"):
        for args in runs:
            if METHODS[args.method].budgets != HARNESS:
                rft.check_weight_step(args.weight_step, args.method)
    if runs[0].check is None:
        if runs[0].data != "paper":  # the paper's sets load slowly, and its presets hold out no test task
            with one_line_errors("plan.py"):
                test = whale.run_config(runs[0], domains.data_flags()).test
                warning = whale.holdout_warning(domains.from_args(runs[0]), test)
            if warning:
                print(warning)
        args = runs[0]
        gpus = args.gpus or args.ranks
        engines = time_model.engine_replicas(gpus, args.ranks)
        workers, each = args.workers or time_model.DEFAULT_WORKERS, time_model.DEFAULT_WORKERS
        if workers < each * engines:
            print(f"--workers {workers} keeps {workers} episodes at once over {engines} engine replicas: "
                  f"--workers {each * engines} gives each its {each} (docs/gpu.md, several GPUs)")
        print_plan(runs, args.card or 80, gpus, args.ranks)
        return
    # each --check domain parsed as its own runs (every --method), with the same flags
    argv = sys.argv[1:] if argv is None else list(argv)
    runs += [run for d in runs[0].check for run in parse_args([*argv, "--domain", d])]
    code = preflight.main(runs, check_harness=domains.check_harness, domain_of=domains.from_args)
    if code == 0:
        with one_line_errors("plan.py"):
            for line in check_h0(runs):
                print(line, flush=True)  # a warning: the run may still be what the user wants (a harness-only one)
    raise SystemExit(code)


if __name__ == "__main__":
    main()
