r"""
Meta-Harness: search over harness code under fixed policy weights (the harness phase of WHALE,
and on its own the harness-only baseline).

    python meta_harness.py --domain searchqa --harness harnesses/searchqa.py --model smoke \
        --rounds 2 --candidates 3 --proposer mutate --out runs/mh
    python meta_harness.py ... --proposer command \
        --proposer-cmd "my-agent --dir {workdir} --task {instructions}" \
        --proposer-ro /opt/my-agent         # what the sandboxed command may read besides {workdir}
    python meta_harness.py ... --proposer claude    # Claude Code in print mode, as the paper did
    python meta_harness.py ... --proposer openai --proposer-url http://localhost:8000/v1 \
        --proposer-model M
    python meta_harness.py --domain math --harness my_math.py --preset cpu --rounds 2 --out runs/mh
        # --preset: whale.py's preset (presets.py) for the flags this script has (model, sampling,
        # data, harness set, candidates, proposer, and its adaptive harness phase as --rounds, --patience,
        # --min-rounds: presets.SCRIPT_FLAGS); any flag given still wins

Algorithm. The seed harness h0 is scored once on the harness set (a fixed subset of the train split,
1 rollout per task). Each iteration asks a proposer for M new candidate files, validates each one
before any rollout (it parses, defines run(task, llm, tools), imports only allowed modules, uses no
exec/open/dunder tricks, with --prompt-only differs from its parent only in string constants, and
survives one smoke episode), scores the valid ones on the harness set and adds everything to the
archive. The accepted harness is the best harness-set score in the archive, ties going to fewer
mean turns, then to the earlier candidate. The search stops after a fixed number of iterations, or when
the archive best has not improved for P iterations after at least N iterations (the paper's patience rule,
checked, as officially, only after an iteration that scored a valid candidate); not, as the
official chess search does, once a candidate scores 1.0 on the harness set: every method spends its
whole budget of rounds here.

The archive folder is the search's own truth while it runs. A proposer never works in it: it gets a
copy of the harness-set material (code, meta, scores, traces, summary, frontier, notes) in a fresh
folder outside the run folder, runs there in its own session inside the OS sandbox (lib/episodes/sandbox.py:
it sees that folder and nothing of the project, the data or the run's evals/), and afterwards the
search takes back only each new candidate's harness.py (size-capped, no symlinks), its parent /
hypothesis / axis / changed as short text, and notes.md. Validity and scores are always the search's own. A
proposer call that fails (the CLI reports an error, a timeout, an API error after retries) is
retried; --proposer-max-failures in a row stop the search. (Officially math retries too, while
searchqa spends the iteration and chess aborts the run: here every domain retries, so a method's
rounds never depend on how often the proposer's service failed.)
    config.json                              this command's flags
    store/search/<sha256 of its key>/        the archive after the seed's score and after every round (the resume)
    archive/INSTRUCTIONS.md                  what the proposer was asked to do this iteration
    archive/candidates/<name>/harness.py     the candidate (h0 is the seed; h<iteration>_<j> the proposals)
    archive/candidates/<name>/meta.json      parent, hypothesis, axis, change, proposer, iteration, valid, reason
    archive/candidates/<name>/scores.json    harness-set score, mean turns, tokens, rollouts, errors, time
    archive/candidates/<name>/traces.jsonl   the harness-set episodes (messages, completions, tools, reward)
    archive/summary.jsonl                    one row per candidate
    archive/frontier.json                    the best so far, its lineage, the best-score series, the costs
    archive/setup.json                       the harness-set task ids and sampling settings every score used
    archive/costs.jsonl                      one row per proposer call: seconds, tokens, dollars if known
    archive/notes.md                         what agent proposers learned, iteration by iteration
Rerunning the same command resumes from the store alone (lib/run_folder/store.py): the archive of the same seed
harness, settings and code is copied into a fresh archive/ and the search goes on after its last finished round (a
killed round is done again; what archive/ held is never read). Another --model is refused; other settings start over.
"""
import argparse
import json
import shutil
import time
from pathlib import Path

import domains
import rollout
from lib.archive import candidate_rows, write_index
from lib.backends.hf_backend import NullModelBackend
from lib.backends.policy import add_backend_args, load_policy
from lib.briefs import BRIEFS
from lib.cli import Parser, check_out, config_hash, conflicting_flags, inputs_of, one_line_errors, search_config
from lib.common.argtypes import nonnegative_int, positive_float, positive_int, seed_int, unit_interval
from lib.common.json_files import read_json, write_json
from lib.contract import normalized, static_check
from lib.episodes import sandbox, switches
from lib.mutate import propose_mutate
from lib.openai_proposer import propose_openai
from lib.proposers import (PROPOSER_MAX_FILE_MB, PROPOSER_MAX_PROCS, PROPOSER_MAX_WRITTEN_MB, PROPOSER_MEMORY_MB,
                           failure_advice, propose_agent, propose_in_copy, refuse_weak_network)
from lib.rules import pick_best
from lib.run_folder.card import NO_TURNS
from lib.run_folder.files import check_same_model, file_sha, remove
from lib.run_folder.store import Store, about, copy_item, only_command, store_in
from lib.subsets import seeded_sample
from presets import add_preset_arg, parse_with_preset

PROPOSERS = ("mutate", "command", "claude", "openai")
NULL_MARGIN = 0.05  # default --null-margin: one lucky task in 20 (an empty reply that happens to be read as right)


def add_args(parser):
    p = parser.add_argument_group("harness search (shared with whale.py)")
    p.add_argument("--candidates", type=positive_int, default=3,
                   help="M: candidates proposed per round")
    p.add_argument("--harness-tasks", type=positive_int, default=None,
                   help="score on a seeded sample of N harness-set tasks (default all)")
    p.add_argument("--harness-samples", type=positive_int, default=1,
                   help="rollouts per harness-set task when scoring")
    p.add_argument("--prompt-only", action="store_true",
                   help="candidates may change only string constants (FST)")
    p.add_argument("--null-check", default="refuse", choices=("refuse", "report"),
                   help="the candidate a round would accept is scored again under the null model (every "
                        "reply ''): refuse it when it earns more than its parent does there plus "
                        "--null-margin, or only report that score (the paper preset: the official "
                        "protocol has no such rule)")
    p.add_argument("--null-margin", type=unit_interval, default=NULL_MARGIN,
                   help="how much more than its parent a candidate may earn without the model")
    p = parser.add_argument_group("proposer")
    p.add_argument("--proposer", default="mutate", choices=PROPOSERS)
    p.add_argument("--proposer-brief", default="official", choices=sorted(BRIEFS),
                   help="the brief's rules: official (the official skills': the paper and gpu presets), or "
                        "small-model (plus the project's two for a small policy: short prompts, exploring; the "
                        "cpu and smoke presets; lib/briefs.py)")
    p.add_argument("--mutate-order", default="seeded", choices=("seeded", "listed", "traces"),
                   help="mutate's knob order: seeded (drawn from --seed), listed (SEARCH_SPACE "
                        "order), traces (the knobs the harness's SKILL declares for the failure "
                        "kind most frequent in the parent's harness-set traces first, seeded "
                        "within a kind)")
    p.add_argument("--proposer-cmd", default=None,
                   help="command template for --proposer command: {workdir}, {instructions}")
    p.add_argument("--proposer-url", default="http://localhost:8000/v1",
                   help="OpenAI-compatible base URL")
    p.add_argument("--proposer-model", default=None,
                   help="model name for openai / claude proposers")
    p.add_argument("--proposer-key-env", default="OPENAI_API_KEY",
                   help="environment variable holding the API key")
    p.add_argument("--proposer-timeout", type=positive_float, default=1800.0,
                   help="seconds per proposer call (command, claude: the whole process tree; "
                        "openai: per request)")
    p.add_argument("--proposer-max-failures", type=positive_int, default=3,
                   help="stop the search after this many failed proposer calls in a row")
    p.add_argument("--proposer-ro", action="append", default=[], metavar="PATH",
                   help="a file or folder the command proposer may read in its sandbox (its "
                        "script, install, config); repeatable")
    p.add_argument("--proposer-prompt-tokens", type=positive_int, default=24000,
                   help="openai prompt budget (chars/4 estimate)")


def add_sandbox_args(parser):
    """The proposer sandbox's bounds (command, claude), a group of their own: whale.py --help names it, --help-all
    lists it."""
    p = parser.add_argument_group("proposer sandbox (command, claude: past a bound, that call is one failed "
                                  "proposal with its reason)")
    p.add_argument("--proposer-network", default=None, choices=("none", "endpoint", "host"),
                   help="none: no network (command's default); endpoint: only its API and --proposer-allow-host, "
                        "through an allow-listed proxy, never the host's loopback or private addresses (claude's "
                        "default); host: the host's whole network (only if you accept that)")
    p.add_argument("--proposer-allow-host", action="append", default=[], metavar="HOST[:PORT]",
                   help="an endpoint the proposer may reach (port 443 unless given); repeatable")
    p.add_argument("--proposer-memory-mb", type=positive_int, default=PROPOSER_MEMORY_MB,
                   help="memory of the proposer's whole sandbox (a cgroup; else RLIMIT_AS per process)")
    p.add_argument("--proposer-max-procs", type=positive_int, default=PROPOSER_MAX_PROCS,
                   help="tasks (processes and threads) of its sandbox (a cgroup's pids.max)")
    p.add_argument("--proposer-max-file-mb", type=positive_int, default=PROPOSER_MAX_FILE_MB,
                   help="any one file it writes, its stdout and stderr included (RLIMIT_FSIZE)")
    p.add_argument("--proposer-max-written-mb", type=positive_int, default=PROPOSER_MAX_WRITTEN_MB,
                   help="everything it writes in its folder, and its /tmp's size")


# -----------------------------------------------------------------------------
# stopping (pure; the best candidate: lib/rules.pick_best)

def should_stop_harness_phase(best_series, patience, min_iters):
    """best_series[0] is the seed's score, best_series[i] the archive best after iteration i.
    Stop once at least min_iters iterations ran and the best has not improved for `patience` iterations."""
    iters = len(best_series) - 1
    if iters < max(min_iters, patience, 1):
        return False
    return max(best_series[-patience:]) <= best_series[-patience - 1] if patience > 0 else True


def phase_stalled(best_series, before, patience, min_iters):
    """should_stop_harness_phase over the rounds after the archive's first `before` (a harness phase that
    continues an archive counts from its own start)."""
    return len(best_series) - 1 > before and should_stop_harness_phase(best_series[before:], patience, min_iters)


# -----------------------------------------------------------------------------
# validation (before any rollout: the harness contract of lib/contract.py, then one smoke episode)
# and scoring

def validate(cand_dir, rows, backend, domain, tasks, cfg, policy_kw):
    """Static checks, duplicate check, then one smoke episode; writes valid/reason in meta.json."""
    meta = read_json(cand_dir / "meta.json")
    path = cand_dir / "harness.py"
    source = path.read_text() if path.exists() else ""
    parents = {r["name"]: r for r in rows if r["valid"]}
    code = lambda name: normalized((cand_dir.parent / name / "harness.py").read_text())
    # a 2,000-term expression parses, then overflows ast.dump's recursion; 6,000 overflow ast.parse
    try:
        if meta.get("parent") not in parents:
            reason = (f"unknown parent {meta.get('parent')!r}: meta.json parent must name a valid "
                      "archive candidate")
        else:
            parent_source = (cand_dir.parent / meta["parent"] / "harness.py").read_text()
            reason = static_check(source, parent_source, cfg.prompt_only, domain)
        if reason is None:
            same = [r["name"] for r in rows if r["name"] != cand_dir.name and r["valid"]
                    and code(r["name"]) == normalized(source)]
            reason = f"duplicate of {same[0]}: no change to score" if same else None
    except RecursionError:
        reason = "too deeply nested: checking the code exceeded Python's recursion limit"
    if reason is None:
        try:
            ep = rollout.run_episodes(domain, str(path), tasks[:1], backend, samples=1,
                              desc=f"smoke {cand_dir.name}", **policy_kw)[0]
            meta["smoke_rollouts"] = 1
            error = ep.get("error")
        except ValueError as e:  # the runner's own harness checks
            error = str(e)
        reason = f"smoke episode failed: {error_tail(error)}" if error else None
    meta.update(valid=reason is None, reason=reason)
    write_json(cand_dir / "meta.json", meta)
    return meta


def error_tail(error, limit=300):
    """The end of an episode's error, where a traceback's exception line is (its head is only 'Traceback')."""
    text = str(error).strip()
    return text if len(text) <= limit else "... " + text[-limit:]


def score(cand_dir, backend, domain, tasks, cfg, policy_kw):
    traces = cand_dir / "traces.jsonl"
    traces.unlink(missing_ok=True)  # a scoring run killed midway starts over
    stats = rollout.evaluate(domain, str(cand_dir / "harness.py"), tasks, backend, k=cfg.harness_samples,
                     traces_path=str(traces), desc=f"score {cand_dir.name}", **policy_kw)
    scores = {"score": stats["mean_at_k"], "mean_turns": stats["mean_turns"],
              "tokens": stats["tokens"], "rollouts": stats["rollouts"], "errors": stats["errors"],
              "seconds": round(stats["seconds"], 2), "tasks": len(tasks),
              "samples": cfg.harness_samples, "scoring": domain.scoring_rule()}
    write_json(cand_dir / "scores.json", scores)
    return scores


def null_check(run_dir, iteration, backend, domain, tasks, cfg, policy_kw):
    """The candidate this round would accept, scored again on the harness set under the null model
    (NullModelBackend: '' to every call): what its own code earns, which is never the agent's. With --null-check
    refuse, one that earns more than its parent there plus --null-margin is refused (its reason in meta.json,
    one line printed) and the next best is checked; with report, the score is only kept (null_scores.json)."""
    null = NullModelBackend(backend.tokenizer)
    while True:
        rows = [r for r in candidate_rows(run_dir) if r["iteration"] <= iteration]
        best = pick_best(rows)
        if best["iteration"] != iteration or (cfg.null_check == "report" and (
                run_dir / "candidates" / best["name"] / "null_scores.json").exists()):
            return  # the incumbent stays, or the winner's score is kept
        names = {r["name"] for r in rows}
        parent = best["parent"] if best["parent"] in names else next(r["name"] for r in rows if r["parent"] is None)
        own = null_score(run_dir / "candidates" / best["name"], null, domain, tasks, cfg, policy_kw)
        base = null_score(run_dir / "candidates" / parent, null, domain, tasks, cfg, policy_kw)
        if cfg.null_check == "report" or own <= base + cfg.null_margin:
            return
        meta_path = run_dir / "candidates" / best["name"] / "meta.json"
        reason = (f"{best['name']} scores {own:.2f} without the model (its parent {parent} {base:.2f}, "
                  f"--null-margin {cfg.null_margin:g}; scored on {domain.scoring_rule()}): the harness "
                  "answers by itself")
        write_json(meta_path, {**read_json(meta_path), "valid": False, "reason": reason})
        print(f"  {best['name']}: refused, {reason}")


def null_score(cand_dir, null, domain, tasks, cfg, policy_kw):
    """A candidate's harness-set mean@k under the null model, kept in its null_scores.json (the search's file: a
    proposer's work never reaches it)."""
    path = cand_dir / "null_scores.json"
    if not path.exists():
        stats = rollout.evaluate(domain, str(cand_dir / "harness.py"), tasks, null, k=cfg.harness_samples,
                         desc=f"{cand_dir.name} without the model", **policy_kw)
        write_json(path, {"score": stats["mean_at_k"], "tasks": len(tasks), "samples": cfg.harness_samples,
                          "scoring": domain.scoring_rule()})
    return read_json(path)["score"]


# -----------------------------------------------------------------------------
# proposing: each proposer fills candidates/<name>/harness.py and meta.json for the names it is
# given

def propose(run_dir, names, rows, iteration, domain, cfg):
    """Ask the proposer of --proposer for `names`. -> None, or the proposer's error (the call is asked again)."""
    if cfg.proposer == "mutate":  # trusted, offline: writes its candidates into the archive itself
        propose_mutate(run_dir, names, rows, iteration, cfg)
        return None
    parent = pick_best(rows)["name"]  # each new candidate starts as a copy of the archive best
    if cfg.proposer == "openai":
        ask = lambda work, _: propose_openai(work, run_dir, names, rows, parent, iteration, cfg)
    else:
        ask = lambda work, scratch: propose_agent(work, scratch, run_dir, names, iteration, cfg)
    return propose_in_copy(run_dir, names, rows, parent, iteration, domain, cfg, ask)


def propose_iteration(run_dir, names, rows, iteration, domain, cfg, failures):
    """Ask until every one of `names` is proposed (a call retried after a failure asks only for
    the rest; a rerun after a kill asks for the whole round again: the store holds finished rounds only).
    `failures`: the failed calls in a row before; -> those after. --proposer-max-failures of them in
    a row stop the search."""
    proposed = lambda n: read_json(run_dir / "candidates" / n / "meta.json", {}).get("proposed")
    while todo := [n for n in names if not proposed(n)]:
        t0 = time.time()
        error = propose(run_dir, todo, rows, iteration, domain, cfg)
        if error is None:
            failures = 0
            print(f"iteration {iteration}: proposed {len(todo)} candidates in "
                  f"{time.time() - t0:.1f}s")
            continue
        failures += 1
        print(f"iteration {iteration}: proposer {cfg.proposer} failed "
              f"({failures}/{cfg.proposer_max_failures} in a row): {error}")
        if failures >= cfg.proposer_max_failures:
            raise SystemExit(f"meta_harness: proposer {cfg.proposer} failed {failures} times in a "
                             f"row, last: {error}. To go on, {failure_advice(cfg)}, then rerun "
                             f"the same command (it resumes at iteration {iteration})")
    return failures


# -----------------------------------------------------------------------------
# the search

def policy_kwargs(cfg):
    """run_episodes' and evaluate's sampling keywords: the config's sampling and seed."""
    return dict(cfg.sampling.kwargs(), seed=cfg.seed)


def harness_tasks(domain, cfg):
    tasks = domain.load("harness")
    return seeded_sample(tasks, cfg.harness_tasks or None)


def add_seed(run_dir, seed_harness):
    d = Path(run_dir) / "candidates" / "h0"
    if (d / "meta.json").exists():
        return
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(seed_harness, d / "harness.py")
    write_json(d / "meta.json", {"parent": None, "hypothesis": "the seed harness",
                                 "changed": f"copied from {seed_harness}",
                                 "seed_sha256": file_sha(d / "harness.py"), "proposer": "seed",
                                 "iteration": 0, "proposed": True, "valid": True, "reason": None})


def search_setup(domain, tasks, cfg):
    """What every score of an archive was made under: the harness set and the sampling (not the runner's width)."""
    sampling = {k: v for k, v in policy_kwargs(cfg).items() if k != "workers"}
    return {"domain": domain.name, "tasks": [t["id"] for t in tasks],
            "samples": cfg.harness_samples, "prompt_only": cfg.prompt_only, **sampling}


def check_proposer(cfg):
    """The proposer can run at all (its command, its CLI, the sandbox it runs in), before any work."""
    if cfg.proposer == "command" and not cfg.proposer_cmd:
        raise ValueError("--proposer command needs --proposer-cmd 'CLI ... {workdir}'")
    if cfg.proposer == "claude" and shutil.which("claude") is None:
        raise ValueError("--proposer claude: no `claude` on PATH; install Claude Code "
                         "(npm install -g @anthropic-ai/claude-code) or use --proposer command / "
                         "openai")
    if cfg.proposer in ("command", "claude"):
        sandbox.check()  # these proposers run only inside it (or with the documented opt-out)
        refuse_weak_network(cfg)  # no cgroup: a proposer with a network has no bound on its TCP buffers


def validate_and_score(run_dir, name, backend, domain, tasks, cfg, policy_kw):
    """Validate a proposed candidate (once, by a smoke episode), then score it when valid (once)."""
    d = run_dir / "candidates" / name
    meta = read_json(d / "meta.json")
    if meta["valid"] is None:
        meta = validate(d, candidate_rows(run_dir), backend, domain, tasks, cfg, policy_kw)
    if meta["valid"] and not (d / "scores.json").exists():
        s = score(d, backend, domain, tasks, cfg, policy_kw)
        print(f"  {name}: score {s['score']:.4f}, mean turns {s['mean_turns']:.2f}  "
              f"({meta['changed']})")
    elif not meta["valid"]:
        print(f"  {name}: rejected, {meta['reason']}")


def search(policy, domain, seed_harness, run_dir, cfg, rounds, stop=None, card=NO_TURNS, store=None, key=None):
    """Meta-Harness under fixed weights, `rounds` proposer rounds (an archive that holds some already goes through
    them again without a proposer call or a score: write_index as of each, and the stop rule). stop: (rounds before,
    patience, min rounds) ends the search early (phase_stalled), None never. cfg: a cli.SearchConfig. card: the lease
    on the GPU (lib/run_folder/card.py), given back while the proposer writes. store, key: whale.py's store, or the
    CLI's OUT/store, where the archive is put after the seed's score and after every round it did not hold yet
    (a rerun goes on from there). -> {"winner", "score", "rollouts", "rounds" (held now), "best_series", "proposer"}"""
    run_dir = Path(run_dir)
    (run_dir / "candidates").mkdir(parents=True, exist_ok=True)
    tasks, M = harness_tasks(domain, cfg), cfg.candidates
    kw = policy_kwargs(cfg)
    held = read_json(run_dir / "frontier.json", {"iterations": -1})["iterations"]  # the rounds it holds already
    print(f"meta-harness: {domain.name}, {len(tasks)} harness tasks x {cfg.harness_samples} "
          f"samples, proposer {cfg.proposer}; budget: {rounds} rounds x {M} = "
          f"{rounds * M} proposals, at most "
          f"{(rounds * M + 1) * len(tasks) * cfg.harness_samples + rounds * M} rollouts "
          f"(scoring plus one smoke episode per candidate) -> {run_dir}")
    write_json(run_dir / "setup.json", search_setup(domain, tasks, cfg))  # what every score here is made under
    add_seed(run_dir, seed_harness)
    if not (run_dir / "candidates" / "h0" / "scores.json").exists():
        score(run_dir / "candidates" / "h0", policy, domain, tasks, cfg, kw)
    rows, frontier = write_index(run_dir, 0)
    if store is not None and held < 0:
        store.put("search", key, run_dir, about={"rounds": 0, "candidates": M})
    done = failures = 0
    for it in range(1, rounds + 1):
        names = [f"h{it}_{j}" for j in range(1, M + 1)]
        with card.away(policy):  # the proposer needs no card: another process's turn on it, this engine asleep
            failures = propose_iteration(run_dir, names, rows, it, domain, cfg, failures)  # propose
        for name in names:  # validate, score
            validate_and_score(run_dir, name, policy, domain, tasks, cfg, kw)
        null_check(run_dir, it, policy, domain, tasks, cfg, kw)
        rows, frontier = write_index(run_dir, it)  # accept: the archive best
        if store is not None and it > held:
            store.put("search", key, run_dir, about={"rounds": it, "candidates": M})
        done = it
        print(f"iteration {it}: best {frontier['best']} = {frontier['score']:.4f}, series "
              f"{frontier['best_series']}")
        # as the official search (meta_harness_*.py `continue`s before its patience check): a round whose
        # candidates were all refused still counts as a round, but only a round that scored one may stop the search
        scored = any(r["valid"] for r in rows if r["iteration"] == it)
        if stop is not None and scored and phase_stalled(frontier["best_series"], *stop):
            break
    return {"winner": str((run_dir / frontier["harness"]).resolve()), "score": frontier["score"],
            "rollouts": frontier["rollouts"], "rounds": done,
            "best_series": frontier["best_series"], "proposer": frontier["proposer"]}


# -----------------------------------------------------------------------------

def main(argv=None):
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, short_help=True)
    # what to run
    p.add_argument("--domain", required=True, choices=list(domains.DOMAINS))
    p.add_argument("--harness", required=True, help="the seed harness file (h0)")
    p.add_argument("--model", default="smoke", help="smoke | cpu | null (replies '' to every call) | hub id | local path")
    p.add_argument("--out", required=True, help="run folder: archive/ and the store/ it resumes from (rerun to resume)")
    # stopping
    p.add_argument("--rounds", "--iterations", dest="rounds", type=nonnegative_int, default=6,
                   help="at most this many proposer rounds (of --candidates each)")
    p.add_argument("--patience", type=nonnegative_int, default=0,
                   help="stop when the best has not improved for P rounds (0: off)")
    p.add_argument("--min-rounds", "--min-iterations", dest="min_rounds", type=nonnegative_int,
                   default=6, help="with --patience: run at least N rounds")
    p.add_argument("--seed", type=seed_int, default=0)
    add_preset_arg(p)
    # named in --help, listed in --help-all
    rollout.add_sampling_args(p.add_argument_group("sampling"))
    add_args(p)
    add_backend_args(p)
    domains.add_args(p)
    rollout.add_sandbox_args(p)
    add_sandbox_args(p)
    args = parse_with_preset(p, argv)  # the preset's defaults, any flag given over them
    if args.proposer == "command" and not args.proposer_cmd:
        p.error("--proposer command needs --proposer-cmd 'CLI ... {workdir}' (a command template)")
    if conflicting_flags(args):
        p.error(conflicting_flags(args))
    with one_line_errors("meta_harness.py"):
        search_cli(args)


def search_cli(args):
    """meta_harness.py's run: every check before the model loads (bad input, another model), then the search. Its
    progress lives in a store in the run folder (OUT/store; under --unsafe-no-sandbox OUT/store-unconfined): the archive
    after the seed's score and after every round, under the key of the seed harness's content, the search's settings
    (the model and sampling among them) and the harness set's tasks, found again by a rerun, which copies it into a
    fresh OUT/archive and goes on after its last round (another --rounds goes on from the same rounds). OUT/archive's
    own files are never trusted for resume."""
    rollout.apply_args(args)  # first: --threads auto's choice is the run's first line
    sandbox.apply_args(args)
    check_out(args.out)
    check_same_model(args.out, args.model)  # its rounds so far were another model's: refused, not started over
    domain, _ = domains.check_inputs(args, "harness")
    cfg = search_config(args, inputs_of(args, domains.data_flags()))
    check_proposer(cfg)
    store = Store(store_in(args.out, unconfined=switches.disabled()))
    # the harness set's task ids too: under --data paper a data file of the same name may hold other tasks
    key = {"seed": file_sha(args.harness), "config": config_hash(cfg),
           "tasks": [t["id"] for t in harness_tasks(domain, cfg)]}
    with only_command(store_in(args.out), store.root):  # a second command on this folder is refused in one line
        archive = Path(args.out, "archive")
        item = store.find("search", key)
        if item is None and archive.exists():  # not silently: the archive there is replaced below
            print(f"meta_harness.py: {store.root} holds no search of this seed harness, these settings and code: "
                  "searching from round 0")
        if Path(args.out, "frontier.json").exists():  # a folder meta_harness.py wrote before it kept a store
            print(f"meta_harness.py: {args.out}/candidates and the files beside it are an archive of the older layout, "
                  f"not read: this command's archive is {archive} (move the older files aside)")
        remove(archive)  # what a killed round left: the store holds every finished round
        if item is not None:
            copy_item(item, archive)
            print(f"meta_harness.py: {about(item)['rounds']} rounds taken from the store ({item})")
        write_json(Path(args.out, "config.json"), vars(args))
        stop = (0, args.patience, args.min_rounds) if args.patience else None
        t0 = time.time()
        result = search(load_policy(args), domain, args.harness, archive, cfg, args.rounds, stop=stop, store=store,
                        key=key)
    print(json.dumps(result))
    h0 = read_json(archive / "candidates" / "h0" / "scores.json")["score"]
    print(f"h0 score {h0:.4f}, "
          f"winner {Path(result['winner']).parent.name} score {result['score']:.4f}, "
          f"{result['rollouts']} rollouts, {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
