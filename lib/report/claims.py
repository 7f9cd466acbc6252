"""The paper's three claims, each answered on the runs report.py read (lib/report/runs.load_runs): tables.md's
claims section (HOW says how a verdict is reached)."""
import os

from lib.common.json_files import read_jsonl
from lib.report.intervals import paired_difference, pooled_difference, signed
from lib.methods import CLAIM_I, CLAIM_II, CLAIM_III, METHODS, method_of, run_names
from lib.report.runs import FINAL, domains_of, finished, paired_scores, points

HOLDS, FAILS, UNSURE = "holds", "does not hold", "cannot tell at this size"
# runs that score every test task alike (none learned anything the test tells apart: +0.0 [+0.0, +0.0]) refute
# nothing: a claim about which one is better cannot be told from them
ALIKE = "cannot be told (the runs compared score every test task alike)"
CLAIMS = {
    "i": "WHALE beats weight-only, harness-only and Fast-Slow Training (fast-slow) in every domain.",
    "ii": "Either component can be the bottleneck: harness search alone matches weight-only's score with far "
          "fewer rollouts in searchqa, and improves math only after a weight update.",
    "iii": "Small interleaved updates beat stagewise training (all weight phases, then all harness phases) in "
           "accuracy and in rollout cost.",
}
HOW = ("Each claim in one line, then what the runs measured for it and the verdict: **holds** where the 95 % "
       "interval of the difference the claim is about lies above 0, **does not hold** where it lies at or below "
       "0 (or the claim's rollout half fails), **cannot tell at this size** where it straddles 0, **cannot be told** "
       "where the two runs score every test task alike (runs that did not learn); a claim made "
       "of parts (domains, seeds) holds where every part holds and does not hold where any part does not. "
       "Test differences are on final points (each run's last evaluation, chosen without looking at the test "
       "set), per task on the same tasks and seed, in points, pooled over the seeds both runs finished (a "
       "hierarchical bootstrap, as in the comparison table).")


def whale_runs():
    """The run names the claims are about: WHALE, then adaptive WHALE (the method table's `ours`)."""
    return [m for m in run_names() if method_of(m).ours]


def verdict_of(difference):
    """The verdict on "ours beats theirs" from a paired difference (mean, low, high, ...); None: no
    per-task scores to tell by."""
    if difference is None:
        return UNSURE
    if difference[1] == difference[2] == 0:
        return ALIKE
    return HOLDS if difference[1] > 0 else FAILS if difference[2] <= 0 else UNSURE


def combined(verdicts):
    """A claim made of parts: holds if every part holds, does not hold if any part does not."""
    verdicts = [v.split(" (")[0] for v in verdicts]  # "does not hold (more rollouts)" does not hold
    if FAILS in verdicts:
        return FAILS
    if verdicts and all(v == ALIKE.split(" (")[0] for v in verdicts):
        return ALIKE
    return HOLDS if verdicts and all(v == HOLDS for v in verdicts) else UNSURE


def final_difference(ours, theirs):
    """The final-point difference ours - theirs ({seed: run} each) over the seeds both finished: paired
    on one seed, pooled (hierarchical) over several; None without common seeds or per-task scores."""
    ours, theirs = finished(ours), finished(theirs)
    pairs = [paired_scores(ours[s], theirs[s], FINAL) for s in sorted(set(ours) & set(theirs))]
    if not pairs or not all(pairs):
        return None
    return paired_difference(*pairs[0]) if len(pairs) == 1 else pooled_difference(pairs)


def final_row(run):
    return points(run)[FINAL]


def claims_section(runs):
    """tables.md's claims section: a paragraph per claim, its verdict, what it rests on."""
    seeds = sorted({s for seed_runs in runs.values() for s in finished(seed_runs)})
    lines = ["## The paper's three claims, one by one", "",
             f"Computed on seed{'s' if len(seeds) != 1 else ''} {', '.join(map(str, seeds)) or '-'}, "
             f"the seeds that finished. {HOW}", ""]
    whales = [m for m in whale_runs() if any((d, m) in runs for d in domains_of(runs))] or whale_runs()[:1]
    for method in whales:
        lines += beats_baselines(runs, method)
    lines += bottleneck(runs)
    for method in whales:
        lines += beats_stagewise(runs, method)
    return lines


# -----------------------------------------------------------------------------
# (i) WHALE against the single-axis methods and FST

def beats_baselines(runs, method):
    baselines = CLAIM_I
    lines = ["| domain | " + " | ".join(f"{method} - {b}" for b in baselines) + " | verdict |",
             "|---|" + "---|" * (len(baselines) + 1)]
    verdicts = []
    for domain in domains_of(runs):
        if not finished(runs.get((domain, method))):
            continue
        found = [final_difference(runs[domain, method], runs.get((domain, b))) for b in baselines]
        verdicts.append(combined(verdict_of(d) for d in found))
        lines.append(f"| {domain} | " + " | ".join(signed(d) if d else "not run" for d in found)
                     + f" | {verdicts[-1]} |")
    return claim_lines("i", method, combined(verdicts), lines if verdicts else [])


def claim_lines(claim, method, verdict, table):
    """The claim in one line (adaptive WHALE's: a pointer to WHALE's), its verdict, its table."""
    said = CLAIMS[claim] if method in METHODS else f"The same for {method}."  # an adaptive run: the same claim
    return ([f"**({claim}) {said}** Verdict: **{verdict}**.", ""]
            + (table or ["Not enough finished runs."]) + [""])


# -----------------------------------------------------------------------------
# (iii) WHALE against stagewise: accuracy and rollouts

def beats_stagewise(runs, method):
    lines = ["| domain | comparison | final difference [95 % CI] | rollouts in all (mean over seeds) | "
             f"{method} reached the other's final score at, per seed | verdict |", "|---|---|---|---|---|---|"]
    verdicts = []
    for domain in domains_of(runs):
        for other in CLAIM_III:  # stagewise, then stagewise-hw: a reference, harness phases first
            ours, theirs = finished(runs.get((domain, method))), finished(runs.get((domain, other)))
            if not (set(ours) & set(theirs)):
                continue
            cost = [mean_rollouts(ours), mean_rollouts(theirs)]
            verdict = verdict_of(final_difference(ours, theirs))
            if verdict == HOLDS and cost[0] > cost[1]:
                verdict = FAILS + " (more rollouts)"
            if other == CLAIM_III[0]:
                verdicts.append(verdict)
            reached = [first_reach(ours[s], final_row(theirs[s])["mean_at_k"]) for s in sorted(set(ours) & set(theirs))]
            lines.append(f"| {domain} | {method} - {other}{' (reference)' if other != CLAIM_III[0] else ''} | "
                         f"{signed(final_difference(ours, theirs))} | {cost[0]:,.0f} / {cost[1]:,.0f} | "
                         + " / ".join("never" if r is None else f"{r:,}" for r in reached) + f" | {verdict} |")
    return claim_lines("iii", method, combined(verdicts), lines if verdicts else [])


def mean_rollouts(seed_runs):
    """The mean over seeds of the rollouts a run spent in all (training + harness scoring)."""
    return sum(final_row(run)["rollouts"] for run in seed_runs.values()) / len(seed_runs)


# -----------------------------------------------------------------------------
# (ii) either component the bottleneck

def bottleneck(runs):
    reach, reach_verdicts = harness_reach_rows(runs)
    search, search_verdicts = search_after_weights_rows(runs)
    # the paper's claim is about searchqa (harness search suffices) and math (it needs trained weights)
    parts = [combined(reach_verdicts["searchqa"]) if "searchqa" in reach_verdicts else "searchqa not run",
             combined(search_verdicts["math"]) if "math" in search_verdicts else "math not run"]
    lines = [f"**(ii) {CLAIMS['ii']}** Verdict: **{combined(parts)}** (the first half, in searchqa: {parts[0]}; "
             f"the second, in math: {parts[1]}; the other domains' rows are for reference).", "",
             "Harness-only against weight-only's final test score, per seed: the rollouts harness-only "
             "spent to reach it at its first test point at or above it (its test points are only those the "
             "run evaluated: with --test-evals ends, before and after training).", ""]
    lines += reach or ["Not enough finished runs (harness-only and weight-only under one seed).", ""]
    lines += ["", "Did a harness search beat its start (the harness-set score of the archive's best against "
              "its h0, per task on the harness set; the best is picked on those tasks, so the gain is "
              "biased upwards) under the base weights (harness-only's harness_w0) and after n weight phases "
              "(harness_w<n>, n >= 1, of WHALE's searches)?", ""]
    return lines + (search or ["No harness searches.", ""]) + [""]


def harness_reach_rows(runs):
    """Per domain and seed: weight-only's final score and rollouts, harness-only's, the rollouts at which
    harness-only first reached weight-only's final score, the paired difference of the two final points."""
    lines = ["| domain | seed | weight-only final @ rollouts | harness-only final @ rollouts | harness-only - "
             "weight-only | harness-only reached it | verdict |", "|---|---|---|---|---|---|---|"]
    verdicts = {}
    for domain in domains_of(runs):
        harness, weights = (finished(runs.get((domain, m))) for m in CLAIM_II)
        for seed in sorted(set(weights) & set(harness)):
            target, theirs = final_row(weights[seed]), final_row(harness[seed])
            reached = first_reach(harness[seed], target["mean_at_k"])
            scores = paired_scores(harness[seed], weights[seed], FINAL)
            difference = paired_difference(*scores) if scores else None
            verdict = reach_verdict(reached, target["rollouts"], difference)
            if target["mean_at_k"] <= weights[seed]["evals"][0]["mean_at_k"]:
                verdict = UNSURE + " (weight-only ends where it began)"  # nothing to reach
            verdicts.setdefault(domain, []).append(verdict)
            lines.append(f"| {domain} | {seed} | {at(target)} | {at(theirs)} | {signed(difference)} | "
                         + (f"at {reached:,} rollouts" if reached is not None else "never") + f" | {verdict} |")
    return (lines if verdicts else []), verdicts


def reach_verdict(reached, budget, difference):
    """Harness search alone matches weight-only with fewer rollouts: it reached weight-only's final score
    before weight-only had spent its rollouts; it does not where it got there only later, or never and
    its final point is below weight-only's."""
    if reached is not None:
        return HOLDS if reached < budget else FAILS + " (not fewer rollouts)"
    return FAILS if verdict_of(difference) == FAILS else UNSURE


def first_reach(run, score):
    """The rollouts of a run's first test point at or above `score`; None: none was."""
    return next((r["rollouts"] for r in sorted(run["evals"], key=lambda r: r["rollouts"])
                 if r["mean_at_k"] >= score), None)


def at(row):
    return f"{100 * row['mean_at_k']:.1f} @ {row['rollouts']:,}"


def search_after_weights_rows(runs):
    """Per domain and seed: the gain of harness-only's search under the base weights (harness_w0) and of
    each WHALE search after a weight phase (harness_w1, ...)."""
    lines = ["| domain | seed | under the base weights: harness_w0 (harness-only) | after a weight phase | "
             "verdict |", "|---|---|---|---|---|"]
    verdicts = {}
    for domain in domains_of(runs):
        before = finished(runs.get((domain, CLAIM_II[0])))  # harness-only: its search under the base weights
        for seed, run in sorted(before.items()):
            after = [(m, name, gain(r, name)) for m in whale_runs()
                     for r in [finished(runs.get((domain, m))).get(seed)] if r
                     for name in r["archives"] if name != "harness_w0"]
            if "harness_w0" not in run["archives"] or not after:
                continue
            start = gain(run, "harness_w0")
            verdict = search_verdict(start, [g for _, _, g in after])
            verdicts.setdefault(domain, []).append(verdict)
            later = "; ".join(f"{m} {name}: {show_gain(g)}" for m, name, g in after)
            lines.append(f"| {domain} | {seed} | {show_gain(start)} | {later} | {verdict} |")
    return (lines if verdicts else []), verdicts


def search_verdict(before, after):
    """The search improves only after a weight update: no clear gain under the base weights, a clear one
    after a weight phase; a clear gain under the base weights refutes it."""
    if verdict_of(before[2]) == HOLDS:
        return FAILS
    return HOLDS if any(verdict_of(g[2]) == HOLDS for g in after) else UNSURE


def gain(run, archive):
    """(h0's harness-set score, the archive best's, their per-task difference best - h0 with its interval,
    or None where the traces are gone) of one harness search."""
    frontier, rows = run["archives"][archive]
    start, best = rows.get("h0", {}).get("score") or 0.0, frontier.get("score") or 0.0
    if frontier.get("best", "h0") == "h0":
        return start, start, (0.0, 0.0, 0.0, None)
    a, b = (harness_set_scores(run, archive, name) for name in (frontier["best"], "h0"))
    return start, best, paired_difference(a, b) if a and b else None


def harness_set_scores(run, archive, candidate):
    """{task: mean reward} of one candidate on the harness set, from its traces."""
    rewards = {}
    path = os.path.join(run["folder"], archive, "candidates", candidate, "traces.jsonl")
    for row in read_jsonl(path):
        rewards.setdefault(row["task_id"], []).append(row.get("reward") or 0.0)
    return {task: sum(r) / len(r) for task, r in rewards.items()}


def show_gain(g):
    """h0's score -> the best's (the difference [95 % CI]), in the harness-set scores' own units as the
    search table has them."""
    start, best, difference = g
    if best <= start:
        return f"{start:.2f}, none better"
    if difference is None:
        return f"{start:.2f} -> {best:.2f} (no traces)"
    return f"{start:.2f} -> {best:.2f} ({difference[0]:+.2f} [{difference[1]:+.2f}, {difference[2]:+.2f}])"
