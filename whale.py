r"""
WHALE: Weight-Harness Alternating LEarning, and the five baselines it is compared with.

    python whale.py --domain math --method whale --preset smoke
    python plan.py --domain searchqa --method whale --preset paper   # the budget, no model (plan.py)
    python whale.py --domain searchqa --method whale --schedule adaptive --preset cpu
    python whale.py --domain chess --method weight-only --preset paper
    python whale.py --domain math --preset cpu \
        --method harness-only weight-only stagewise stagewise-hw fast-slow whale

The agent is weights (a LoRA adapter on the base model) plus a harness (a Python file). A run is a
sequence of phases, each followed by a mean@k evaluation on the test split:

    weight phase   online RSFT steps (rft.py) under the current harness (or the weight step the method's
                   row names: rft.WEIGHT_STEPS)
    harness phase  Meta-Harness rounds (meta_harness.py) under the current weights; its winner goes on

run() below is the whole loop, top to bottom; the phases follow it, the command line is at the bottom. The methods
and their budget rules are one table, lib/methods.py; the budget algebra and the adaptive schedule: docs/design.md
section 2; `python plan.py` (whale.py's flags) prints a run's phases, steps, rounds and rollouts, no model loaded.
Several methods in one command run one after another in one process.

A run's progress lives in two places: its rows (metrics.jsonl, one per finished phase: lib/run_folder/ledger.py)
and the store beside the run folders (lib/run_folder/store.py), which keeps every RSFT step's checkpoint, every
search round's archive and every test evaluation under the key of exactly what made it. Every phase looks its work
up there before it does any, so no method and no later command on the same domain, preset and seed computes a step,
a round or an evaluation twice, and a killed run, rerun with the same command, goes on from its rows and the store
alone, redoing at most the step, round or evaluation it was in (docs/design.md sections 8 and 9).
"""
import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch

import domains
import meta_harness
import rft
import rollout
from lib import methods
from lib.archive import write_index
from lib.backends import ranks
from lib.backends.hf_backend import NullModelBackend
from lib.backends.policy import add_backend_args, load_policy
from lib.cli import Parser, check_out, config_hash, conflicting_flags, one_line_errors, run_config
from lib.common.argtypes import nonnegative_int, positive_float, positive_int, seed_int
from lib.common.json_files import read_json, write_json, write_jsonl
from lib.episodes import sandbox, switches
from lib.methods import next_phase
from lib.ops import preflight
from lib.run_folder import report_to
from lib.run_folder.card import Card
from lib.run_folder.files import copy_file, file_sha, remove, stored_path
from lib.run_folder.ledger import NOT_EVALUATED, Ledger, check_run_folder, check_same_settings
from lib.run_folder.store import Store, about, copy_item, only_command, store_in
from lib.subsets import seeded_sample
from presets import PRESETS, flags_beyond, parse_with_preset


# -----------------------------------------------------------------------------
# the run: phase after phase, each followed by a test evaluation

def run(cfg, domain, policy, card, store):
    """One method's run, as the method reads: h0's test evaluation, then phase after phase by the method table
    (lib/methods.next_phase), each followed by its test evaluation and its row. weight_phase, harness_phase and
    test_evaluation each look their work up in the store (what any run on this domain, preset and seed made from the
    same inputs, this run before a kill included) and store what they make, a step, a round or an evaluation at a
    time. A rerun copies the finished phases' files back from the store items its rows name (restore), and enters
    the phase it was in again, which goes on from the store. card: the lease on the GPU this process holds
    (lib/run_folder/card.py), given back while a search's proposer writes."""
    train = seeded_sample(domain.load("train"), cfg.rsft.train_limit)
    steps, rounds = budgets(cfg, len(train))
    ledger = Ledger(cfg.out, cfg.harness)
    ledger.log_start(steps, rounds, unconfined=switches.disabled())
    restore(store, ledger)
    trainer = start_trainer(cfg, store, ledger, policy, domain, train) if steps else rft.NoSteps()
    errors = rollout.INFRA_ERRORS  # the infrastructure-error budget: counted per phase, its counts in every row
    card.method = method_name(cfg)  # what the lease's rows say this process holds it for

    if not ledger.rows:  # phase 0: h0 under the base weights
        errors.start_phase("phase 0 (start)")
        card.phase = "0 start"
        stats, key = test_evaluation(store, cfg, policy, domain, "phase_0", "base", ledger.harness)
        ledger.log_phase({"kind": "start", "step": 0, "weights": "base", "rollouts": 0, "stored": {"evaluation": key},
                          **stats, **errors.counts()})

    while kind := next_phase(cfg.method, ledger.last_kind, steps - trainer.step_count, rounds - ledger.rounds):
        i = ledger.phase + 1
        errors.start_phase(f"phase {i} ({kind})")
        card.phase = f"{i} {kind}"
        started = time.time()
        if kind == "weight":  # RSFT steps under the current harness, until the schedule ends the phase
            trainer, row = weight_phase(cfg, store, ledger, trainer, len(train), steps)
            harness = ledger.harness
        else:  # Meta-Harness rounds from the current harness under the current weights; its winner goes on
            harness, row = harness_phase(cfg, store, ledger, policy, domain, trainer.weights_id, rounds, card)
        rounds_done = ledger.rounds + row.get("rounds", 0)

        # the phase's end: its test evaluation (--test-evals ends: the last phase's only), then its row
        stats = NOT_EVALUATED
        if cfg.test_evals == "every" or not next_phase(cfg.method, kind, steps - trainer.step_count,
                                                       rounds - rounds_done):
            stats, row["stored"]["evaluation"] = test_evaluation(store, cfg, policy, domain, f"phase_{i}",
                                                                 trainer.weights_id, harness)
        rollouts = trainer.rollouts + ledger.harness_rollouts(row)  # test rollouts not counted
        ledger.log_phase({"kind": kind, "step": trainer.step_count, "weights": trainer.weights_id,
                          "rollouts": rollouts, "seconds": time.time() - started, **row, **stats, **errors.counts()})
        score = "not evaluated (--test-evals ends)" if stats is NOT_EVALUATED else f"{stats['mean_at_k']:.4f}"
        print(f"phase {i} {kind}: test mean@{stats.get('k', '-')} = {score}, {step_name(cfg.rsft.weight_step)} steps "
              f"{trainer.step_count}/{steps}, harness rounds {rounds_done}/{rounds}, rollouts {rollouts}")

    summary = ledger.write_summary({"domain": cfg.domain, "method": method_name(cfg), "preset": cfg.preset,
                                    "model": cfg.model, "k": cfg.k, "verifier": domain.verifier(),
                                    "scoring": domain.scoring_rule(), "trainer_ranks": ranks.count()})
    null = summary["final_null_mean_at_k"]
    print(f"best mean@{cfg.k} = {summary['best_mean_at_k']:.4f} after {summary['rollouts_to_best']} "
          f"rollouts; final {summary['final_mean_at_k']:.4f}"
          + ("" if null is None else f"; the final harness without the model {null:.4f}")
          + f" (scored on {summary['scoring']})")


# -----------------------------------------------------------------------------
# the phases: each looks its work up in the store, else does it and stores it

def weight_phase(cfg, store, ledger, trainer, n_train, steps):
    """Weight steps under the current harness until the schedule ends the phase, the checkpoint stored after every
    step under the phase's key (the weights and step it starts from, the harness's content, the settings with the
    weight step, the trainer's rank count, which changes the update's float sums). The store's item of this very
    phase, whole or as far as a killed run took it, is taken: its steps are not run again. -> (the trainer, the
    row's detail)"""
    harness, start = ledger.harness, trainer.step_count
    rule = weight_rule(cfg, n_train, steps - start)
    key = store.full_key({"weights": trainer.weights_id, "step": start, "harness": file_sha(harness),
                          "config": config_hash({"rsft": cfg.rsft, "rule": rule}), "ranks": ranks.count()})
    item = store.find("weights", key)
    rows = about(item)["rows"] if item is not None else []
    if item is not None:  # this phase was run before, in this run or another: its weights after those steps
        trainer = type(trainer)(cfg.rsft, trainer.policy, trainer.domain, trainer.folder, trainer.train, item)
        print(f"weights: {step_name(cfg.rsft.weight_step)} steps {start + 1}-{trainer.step_count} taken from the "
              f"store ({item})")
    write_step_rows(cfg.out, ledger.step_rows + rows)
    while not rft.weight_phase_over([row["reward"] for row in rows], **rule):
        rows.append(trainer.step(harness))
        store.put("weights", key, trainer.folder, about={"run": os.path.abspath(cfg.out), "rows": rows})
        write_step_rows(cfg.out, ledger.step_rows + rows)
    return trainer, {"steps": len(rows), "epoch": trainer.epoch_progress, "step_rows": rows,
                     "stored": {"weights": key}}


def harness_phase(cfg, store, ledger, policy, domain, weights, rounds, card):
    """Meta-Harness rounds from the current harness under the current weights, its archive stored after every round
    under the search's key: the weights, the seed harness's content and the search settings of a new archive, or
    for weights unchanged since the last search (ledger.archive_for), that search's key, since this one continues its
    archive: an item of its own, so the item a finished row names is never replaced. The store's archive of the same
    search, made by any run or by this one before a kill, is copied into the run folder and its rounds are not run
    again. The search gives the card back while its proposer writes (card.away). -> (its winner, the row's detail)"""
    archive, before, last = ledger.archive_for(weights)
    if last is None:  # a new archive, seeded with the run's harness
        key = store.full_key({"weights": weights, "seed": file_sha(ledger.harness), "config": config_hash(cfg.search)})
    else:  # the last search's archive, continued
        key = store.full_key({"continues": last, "config": config_hash(cfg.search)})
    folder = Path(cfg.out, archive)
    remove(folder)  # what a killed round left: the store holds every finished round
    own = store.find("search", key)
    item = own or (stored(store, "search", last, cfg.out) if last else None)
    if item is not None:
        copy_item(item, folder)
        print(f"harness phase: {about(item)['rounds']} rounds of this search taken from the store ({item})")
    total = before + min(harness_phase_cap(cfg), rounds - ledger.rounds)  # the archive's rounds at the phase's end
    result = meta_harness.search(policy, domain, ledger.harness, str(folder), cfg.search, total,
                                 stop=harness_stop(cfg, before), card=card, store=store, key=key)
    if own is None and item is not None and result["rounds"] <= about(item)["rounds"]:
        # no round beyond the last search's, so the search put nothing under this key: its own item, for its row
        store.put("search", key, folder, about={"rounds": result["rounds"], "candidates": cfg.search.candidates})
    return result["winner"], {"rounds": result["rounds"] - before, "archive": archive,
                              "archive_rounds": result["rounds"], "archive_rollouts": result["rollouts"],
                              "harness_score": result["score"],
                              "winner": stored_path(result["winner"], cfg.out), "stored": {"search": key}}


def test_evaluation(store, cfg, policy, domain, tag, weights, harness):
    """evals/<tag>.json and its traces: the store's evaluation of the same weights, harness content and test
    settings, else evaluated here (evaluate_test; one killed midway starts over) and stored. -> (its stats, its key)"""
    key = store.full_key({"weights": weights, "harness": file_sha(harness), "config": config_hash(cfg.test)})
    path = Path(cfg.out, "evals", f"{tag}.json")
    traces = path.with_name(f"{tag}.traces.jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    item = store.find("evaluation", key)
    if item is None:
        traces.unlink(missing_ok=True)
        write_json(path, {"key": key, **evaluate_test(policy, domain, harness, cfg.test, traces)})
        store.put("evaluation", key, {"evaluation.json": path, "traces.jsonl": traces},
                  about={"run": os.path.abspath(cfg.out), "tag": tag})
    else:
        print(f"test evaluation ({tag}): the same as {item} (the store), taken")
        copy_evaluation(item, path)
    return read_json(path)["stats"], key


# -----------------------------------------------------------------------------
# a rerun: where the rows left the run, from the store

def restore(store, ledger):
    """The files of the run's finished phases, copied again from the store items its rows name, over whatever the
    folder holds (deleted, edited or cut by a kill: the store is the run's memory): each test evaluation, each archive
    as its last row left it, and the step rows' view. The trainer's checkpoint comes from the store too
    (start_trainer)."""
    archives = {row["archive"]: row for row in ledger.rows if "archive" in row}  # each archive's last row
    for name, row in archives.items():
        remove(Path(ledger.out, name))
        copy_item(stored(store, "search", row["stored"]["search"], ledger.out), Path(ledger.out, name))
        write_index(Path(ledger.out, name), row["archive_rounds"])  # as of the row (a stored search may hold more)
    for row in ledger.rows:
        if "evaluation" in row["stored"]:
            path = Path(ledger.out, "evals", f"phase_{row['phase']}.json")
            path.parent.mkdir(parents=True, exist_ok=True)
            copy_evaluation(stored(store, "evaluation", row["stored"]["evaluation"], ledger.out), path)
    if ledger.step_rows:
        write_step_rows(ledger.out, ledger.step_rows)


def start_trainer(cfg, store, ledger, policy, domain, train):
    """The weight step's trainer where the last finished weight phase left it (its checkpoint from the store), else
    a fresh one on the base weights."""
    weight_rows = [row for row in ledger.rows if row["kind"] == "weight"]
    checkpoint = stored(store, "weights", weight_rows[-1]["stored"]["weights"], cfg.out) if weight_rows else None
    return rft.WEIGHT_STEPS[cfg.rsft.weight_step](cfg.rsft, policy, domain, Path(cfg.out, "weights", "ckpt"), train,
                                                  checkpoint)


def stored(store, kind, key, out):
    """The store's item that a row of `out` names, else one line naming the fix."""
    item = store.find(kind, key)
    if item is None:
        raise ValueError(f"{out}/metrics.jsonl names {store.item(kind, key)}, which the store no longer holds "
                         f"(deleted, or made by another version of the code): move {out} aside (mv {out} {out}.old) "
                         "and rerun to start the run over")
    return item


def copy_evaluation(item, path):
    copy_file(item / "traces.jsonl", path.with_name(path.name.replace(".json", ".traces.jsonl")))
    copy_file(item / "evaluation.json", path)  # last: the run's evaluation is there


def write_step_rows(out, rows):
    """weights/metrics.jsonl: every weight step's row so far, for a reader and --report-to (the rows are the truth)."""
    Path(out, "weights").mkdir(parents=True, exist_ok=True)
    write_jsonl(Path(out, "weights", "metrics.jsonl"), rows)


# -----------------------------------------------------------------------------
# the plan: budgets, the order of the phases, and where each phase ends

def steps_for(epochs, n_train, batch):
    return max(1, round(epochs * n_train / batch))


def budgets(cfg, n_train):
    """(RSFT steps, proposer rounds) this method spends in all: the method table's rule (lib/methods.budgets) on
    S = round(epochs x |train| / batch) steps in ceil(S / s) fixed weight phases of s steps."""
    steps = steps_for(cfg.epochs, n_train, cfg.batch)
    phases = math.ceil(steps / steps_for(cfg.phase_epochs, n_train, cfg.batch))
    return methods.budgets(cfg.method, steps, phases, cfg.harness_iterations, cfg.harness_only_rounds)


def harness_phase_cap(cfg):
    if cfg.schedule == "adaptive":
        return cfg.harness_max_rounds
    return cfg.harness_iterations - 1


def fixed_phases(cfg, n_train):
    """[(kind, RSFT steps or proposer rounds)] of a run under the fixed schedule (an adaptive run's
    phases end by its rules, within the same budgets)."""
    steps, rounds = budgets(cfg, n_train)
    phase_steps, cap = steps_for(cfg.phase_epochs, n_train,
                                 cfg.batch), cfg.harness_iterations - 1
    phases, last = [], None
    while kind := next_phase(cfg.method, last, steps, rounds):
        size = min(phase_steps, steps) if kind == "weight" else min(cap, rounds)
        steps, rounds = (steps - size, rounds) if kind == "weight" else (steps, rounds - size)
        phases.append((kind, size))
        last = kind
    return phases


def store_root(out, unconfined=False):
    """The store beside the run folder: results/<preset>[/seed-<n>]/<domain>/store, shared by every method; for a
    command under --unsafe-no-sandbox store-unconfined beside it (store.store_in), and the shared one is neither read
    nor written."""
    return store_in(os.path.dirname(os.path.abspath(out)), unconfined)


def step_name(weight_step):
    """How the output names a weight step's steps: RSFT steps, or a fork's step by its registered name."""
    return "RSFT" if weight_step == "rsft" else weight_step


def weight_rule(cfg, n_train, steps_left):
    """Where a weight phase ends (rft.weight_phase_over): fixed, after s steps; adaptive, by its
    patience window; either within the steps left at its start."""
    cap = steps_left if cfg.schedule == "adaptive" else min(
        steps_for(cfg.phase_epochs, n_train, cfg.batch), steps_left)
    return {"schedule": cfg.schedule, "max_steps": cap,
            "window": steps_for(cfg.adaptive_epochs, n_train, cfg.batch)}


def harness_stop(cfg, before):
    """Where an adaptive harness phase ends early (meta_harness.phase_stalled): the archive best stalled for
    --harness-patience rounds after --harness-min-rounds, counted from the phase's start, after the archive's
    `before` rounds of earlier phases. None: fixed, every round of its cap."""
    return (before, cfg.harness_patience, cfg.harness_min_rounds) if cfg.schedule == "adaptive" else None


# -----------------------------------------------------------------------------
# the test split

def test_tasks(domain, test):
    """The seeded sample of test.test_limit test tasks, none of the first test.test_holdout."""
    tasks = domain.load("test")
    return seeded_sample(tasks, test.test_limit,
                         exclude={t["id"] for t in tasks[: test.test_holdout]})


def holdout_warning(domain, test):
    """One line when --test-holdout leaves fewer test tasks than --test-limit asks for (a domain's small test
    split would otherwise shrink the evaluation without a word), else None; a holdout that leaves none is a
    ValueError."""
    if not test.test_holdout:
        return None
    tasks = domain.load("test")
    n, left = len(tasks), len(tasks) - len({t["id"] for t in tasks[: test.test_holdout]})
    if left <= 0:
        raise ValueError(f"--test-holdout {test.test_holdout} leaves none of {domain.name}'s {n} test tasks: lower "
                         f"--test-holdout below {n}")
    if test.test_limit and left < test.test_limit:
        return (f"--test-holdout {test.test_holdout} leaves {left} of {domain.name}'s {n} test tasks, fewer than "
                f"--test-limit {test.test_limit}: the test evaluation runs on those {left} (lower --test-holdout, "
                "or give the domain more test tasks)")
    return None


def evaluate_test(policy, domain, harness, test, traces):
    """mean@k on the test split with the score of every task, its episodes in `traces`. -> {"stats",
    "per_task", "sources"} (what evals/<tag>.json holds beside its key)"""
    tasks = test_tasks(domain, test)
    stats = rollout.evaluate(domain, harness, tasks, policy, k=test.k, **test.sampling.kwargs(),
                             seed=test.seed, traces_path=str(traces),
                             desc=f"test mean@{test.k} ({Path(traces).name.split('.')[0]})")
    # what the harness earns by itself on the same tasks and seeds: reported beside the score, never credited
    null = rollout.evaluate(domain, harness, tasks, NullModelBackend(policy.tokenizer), k=test.k,
                            **test.sampling.kwargs(), seed=test.seed, desc="without the model")
    # prefixed so they never clash with the run's own counters (test rollouts are not part of the
    # cost)
    per_task = stats["per_task"]
    stats = {"mean_at_k": stats["mean_at_k"], "k": stats["k"], "test_tasks": len(per_task),
             "null_mean_at_k": null["mean_at_k"], "scoring": domain.scoring_rule(),
             **{f"test_{name}": stats[name]
                for name in ("rollouts", "mean_turns", "tokens", "errors", "seconds")}}
    # the report's per-benchmark columns
    sources = {t["id"]: t["source"] for t in tasks if "source" in t}
    return {"stats": stats, "per_task": per_task, "sources": sources}


# -----------------------------------------------------------------------------
# the command line: its flags, its inputs checked, its folders and model

def parse_args(argv=None, more_args=None, description=__doc__):
    """-> one Namespace per --method: the preset's defaults, overridden by any flag given (plan.py's parse)."""
    return parse_command(argv, more_args, description)[0]


def parse_command(argv=None, more_args=None, description=__doc__):
    """-> (one Namespace per --method, the flags given beyond the preset: presets.flags_beyond). more_args(parser) adds
    another command's own flags (plan.py's), after the method's."""
    p = parser(more_args, description)
    if more_args is None and {"--plan", "--check"} & set(sys.argv[1:] if argv is None else argv):
        p.error("--plan and --check are plan.py's: python plan.py with the same flags (the plan without --plan)")
    args = parse_with_preset(p, argv, card=card_gib)  # the preset's defaults, any flag given over them
    # before the defaults below fill the unset ones in; the run's first line names the method, schedule and folder
    beyond = flags_beyond(p, args, shown=("domain", "method", "schedule", "preset", "out"))
    args.harness = args.harness or os.path.join("harnesses", f"{args.domain}.py")
    check_args(args, p)
    return [run_args(args, method) for method in dict.fromkeys(args.method)], beyond  # each once, in order


def parser(more_args=None, description=__doc__):
    """whale.py's flags. --help shows the method's own (what to run, budgets, the adaptive schedule, the test
    evaluation) and names the other groups (RSFT, the harness search and its proposer, the engine, the data and
    judge, the sandbox, live metrics); --help-all shows them all.

        python whale.py --help
    """
    p = Parser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter, short_help=True)
    g = p.add_argument_group("what to run", lead=True)
    g.add_argument("--domain", required=True, choices=sorted(domains.DOMAINS))
    g.add_argument("--method", nargs="+", default=[methods.DEFAULT], choices=list(methods.METHODS),
                   help="one or more methods, run one after another in this process (the imports "
                        "and h0's test evaluation are paid once)")
    g.add_argument("--schedule", default="fixed", choices=("fixed", "adaptive"))
    g.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    g.add_argument("--out", default=None,
                   help="run folder (default results/<preset>/<domain>/<method>; "
                        "results/<preset>/seed-<n>/<domain>/<method> for --seed n, n != 0)")
    g.add_argument("--model", default=None,
                   help="smoke | cpu | null (replies '' to every call) | hub id | local path (default: the preset's)")
    g.add_argument("--harness", default=None,
                   help="starting harness h0 (default harnesses/<domain>.py; "
                        "the paper and gpu presets: harnesses/paper/<domain>.py)")
    g.add_argument("--seed", type=seed_int, default=0)
    g = p.add_argument_group("budgets (the same totals for every method)", lead=True)
    g.add_argument("--epochs", type=positive_float, default=None,
                   help="total weight-training budget in train epochs")
    g.add_argument("--phase-epochs", type=positive_float, default=None,
                   help="E: epochs per weight phase (fixed schedule)")
    g.add_argument("--harness-iterations", type=positive_int, default=None,
                   help="I: per harness phase, the re-scoring of the incoming harness plus I - 1 "
                        "proposer rounds")
    g.add_argument("--harness-only-rounds", "--harness-only-iterations",
                   dest="harness_only_rounds", type=positive_int, default=None,
                   help="harness-only's proposer rounds (default (I - 1) x the number of fixed "
                        "weight phases)")
    g.add_argument("--train-limit", type=positive_int, default=None,
                   help="use a seeded sample of N train tasks (small presets)")
    g = p.add_argument_group("adaptive schedule (paper: window = min length = patience = 0.2 "
                             "epoch; P_h = 2, 5 to 15 rounds; every preset sets them)", lead=True)
    g.add_argument("--adaptive-epochs", type=positive_float, default=0.2,
                   help="weight phase window, minimum length and patience")
    g.add_argument("--harness-patience", type=nonnegative_int, default=2,
                   help="rounds without a new archive best")
    g.add_argument("--harness-min-rounds", "--harness-min-iterations",
                   dest="harness_min_rounds", type=nonnegative_int, default=5,
                   help="proposer rounds a harness phase makes at least")
    g.add_argument("--harness-max-rounds", "--harness-max-iterations",
                   dest="harness_max_rounds", type=positive_int, default=15,
                   help="proposer rounds a harness phase makes at most")
    g = p.add_argument_group("test evaluation", lead=True)
    g.add_argument("--k", type=positive_int, default=None, help="samples per test task for mean@k")
    g.add_argument("--test-limit", type=positive_int, default=None,
                   help="evaluate on a seeded sample of N test tasks")
    g.add_argument("--test-holdout", type=nonnegative_int, default=0,
                   help="never draw the first N test tasks (the cpu preset: the 50 looked at while "
                        "it was built)")
    g.add_argument("--test-evals", default="every", choices=("every", "ends"),
                   help="every: test mean@k before training and after every phase; ends: before "
                        "training and after the last phase only (fewer intermediate points, never "
                        "fewer final tasks)")
    if more_args:
        more_args(p)
    # named in --help, listed in --help-all: the weight phase, the harness phase, the engine, the data and the judge,
    # the sandbox, live metrics
    rft.add_args(p)  # RSFT: the rollout step and its sampling, the SFT update, LoRA
    meta_harness.add_args(p)  # the harness search and its proposer
    add_backend_args(p)
    domains.add_args(p)
    rollout.add_sandbox_args(p)  # the sandbox's switches, the runner's error budget
    meta_harness.add_sandbox_args(p)
    report_to.add_args(p)
    return p


def card_gib(first):
    """The GiB of the card a gpu preset run trains on, which presets.parse_with_preset fits the preset's micro-batch
    to (first: the parse's first pass): plan.py --check --card N (a card class of N GB, which
    lib/ops/time_model.CARDS takes as N GiB), else this process's current GPU (a trainer rank's own: main sets it
    first, ranks.set_device); None without one, and for the other presets, which keep theirs."""
    if first.preset != "gpu":
        return None
    if getattr(first, "card", None):
        return first.card
    return torch.cuda.mem_get_info()[1] / 2 ** 30 if torch.cuda.is_available() else None


def run_args(args, method):
    """The flags of one method's run: the shared ones plus its method, folder and FST switch."""
    one = argparse.Namespace(**vars(args))
    one.method = method
    # seed 0 keeps the one-seed layout: a finished one-seed run is seed 0 of a multi-seed one
    seed_dir = os.path.join(args.preset, f"seed-{args.seed}") if args.seed else args.preset
    one.out = args.out or os.path.join("results", seed_dir, args.domain, method_name(one))
    one.prompt_only = args.prompt_only or methods.METHODS[method].prompt_only  # FST: prompt strings only
    one.weight_step = methods.METHODS[method].weight_step  # what trains its weight phases (rft.WEIGHT_STEPS)
    return one


def check_args(args, parser):
    if args.out and len(args.method) > 1:
        parser.error("--out names one run folder: give a single --method, or drop --out")
    if args.harness_iterations < 2:
        parser.error(f"--harness-iterations {args.harness_iterations}: I counts the re-scoring of "
                     "the incoming harness, so a harness phase with proposer rounds needs I >= 2")
    if conflicting_flags(args):
        parser.error(conflicting_flags(args))


def method_name(cfg):
    return f"{cfg.method}-adaptive" if cfg.schedule == "adaptive" else cfg.method


def main(argv=None):
    ranks.set_device()  # this rank's card before anything reads one: the preset's fit to it (card_gib), the preflight
    runs, beyond = parse_command(argv)
    if ranks.rank():  # under torchrun, a rank other than 0: its share of every RSFT update (lib/backends/ranks.py)
        preflight.launch(runs, "whale.py")  # its card's checks, before the model loads
        with ranks.following("whale.py", runs[0].model, runs[0].out):
            rollout.apply_args(runs[0])  # --threads (auto: this rank's own choice)
            rft.follow(runs[0].model, runs[0].bf16, runs[0].threads)
        return
    # bad input, a damaged run folder, a refused engine: one line; rank 0 of torchrun runs the loop as one process does
    with one_line_errors("whale.py"), ranks.leading(runs[0].model, runs[0].out):
        rollout.apply_args(runs[0])  # first: --threads auto's choice is the run's first line
        for args in runs[1:]:
            args.threads = runs[0].threads  # one choice for the process's runs
        sandbox.apply_args(runs[0])
        domain = check_inputs(runs)
        # what plan.py --check checks, for every method of this command, before any model loads: the engine's server,
        # the proposer, the card the trainer trains on beside whatever shares it
        preflight.launch(runs, "whale.py", domains.check_harness, domains.from_args)
        # the runs of a command share one store (one --out, or results/<preset>/<domain>/<method> side by side),
        # held for the whole command before any model loads: one command at a time (store.only_command). Made now, it
        # holds the code as this command found it, not as it is after the model's minutes of loading.
        store = Store(store_root(runs[0].out, unconfined=switches.disabled()))
        if switches.disabled():
            print(f"store: {store.root} (--unsafe-no-sandbox: the shared store is neither read nor written)")
        # WHALE_CARD (run_all.sh's turns): the lease on the GPU that the night's domain processes share, held from
        # before the model loads to the end but for the proposer's waits (lib/run_folder/card.py); unset: no turns
        card = Card(os.environ.get("WHALE_CARD"), domain.name)
        with only_command(store_root(runs[0].out), store.root), card.held():  # a run unconfined holds both
            # an engine keeps its GPU memory until its process ends, so the runs of a command share one
            # policy (and engine), each starting from the base weights; hf loads a fresh model per run
            policy = load_policy(runs[0]) if runs[0].backend != "hf" else None
            data_flags = domains.data_flags()
            for args in runs:
                with report_to.watch(args.report_to, args.out, vars(args)):  # --report-to: its files' rows, live
                    run(run_config(args, data_flags), domain, start_run(args, policy, beyond), card, store)
                # the finished run's optimizer and graphs go before the next run starts
                rft.hand_back_memory()


def check_inputs(runs):
    """Every input refused before any model loads or any run file is written: domains.check_inputs
    (the data, the harness against its domain, the engine, the model), then the proposer and each
    run folder (its rows, h0 unchanged, the same settings). -> the domain, its data loaded (the paper's sets are
    slow to load twice)"""
    args = runs[0]
    ranks.check_launch(args.backend)
    domain, train = domains.check_inputs(args, "train")
    train = seeded_sample(train, args.train_limit)
    domain.load("test")  # a malformed data file is an error now, before any model is loaded
    data_flags = domains.data_flags()
    warning = holdout_warning(domain, run_config(args, data_flags).test)
    if warning:
        print(warning)
    for one in runs:
        check_out(one.out)
        cfg = run_config(one, data_flags)
        steps, rounds = budgets(cfg, len(train))
        if steps:
            rft.check_weight_step(cfg.rsft.weight_step, one.method)
            rft.check_batch(one.batch, len(train), domain.name)
        if rounds:
            meta_harness.check_proposer(cfg.search)
        check_run_folder(one.out, one.harness, switches.disabled())
        check_same_settings(one.out, vars(one))
    return domain


def start_run(args, policy=None, beyond=()):
    """The run folder and its config.json (every setting: those a resume must keep), before the model loads; its
    first lines: the run, then the flags given beyond the preset (beyond: parse_command's).
    -> the policy the run starts from, on the base weights: the command's shared one, else a model
    loaded for this run"""
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "config.json"), vars(args))
    print(f"whale: {method_name(args)} on {args.domain}, preset {args.preset} -> {args.out}")
    print(f"flags beyond the preset: {' '.join(beyond) or 'none'} (every setting: {args.out}/config.json)")
    if policy is None:
        return load_policy(args)
    policy.to_base()
    return policy


if __name__ == "__main__":
    main()
