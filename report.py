"""
Tables and plots from the result folders that whale.py writes. It only reads results.

    python report.py --preset cpu       # reads results/cpu/, writes results/cpu/tables.md and *.png

Runs of --seed 0 are read from results/<preset>/<domain>/<method>/ (or seed-0/<domain>/<method>/),
runs of --seed n from results/<preset>/seed-<n>/<domain>/<method>/.
Table 1: per method and domain, the final test mean@k (the last evaluation, chosen without looking
at the test set) and beside it the best over training (the best evaluation, picked on the test set)
with the rollouts spent to reach it, each the mean over seeds with a 95 % interval from a
hierarchical bootstrap: resample the seeds, then the test tasks within each resampled seed (2,000
resamples of the per-task scores in evals/phase_<n>.json, seed 0; with one seed, a bootstrap over
test tasks). Then the paper's three claims, each with what the runs measured and a verdict (holds /
does not hold / cannot tell at this size; lib/report/claims.py). With several seeds, each seed's final
point follows. The paired comparison: WHALE (and
adaptive WHALE) minus fixed, named baselines (harness-only, weight-only, stagewise-hw, each where it
ran), the mean per-task difference on the same tasks under the same seed, per seed and pooled over
seeds, on the final points (the headline) and on the best points (labelled). Then in how many seeds
each method's search found a harness better than the one it started from, and what RSFT and the
searches did. Under the paper preset the paper's numbers stand beside ours. Plots: curves.png (test
mean@k against cumulative rollouts, a panel per domain, a line per method and seed, its 95 %
interval over test tasks as a band), timeline.png (each WHALE run's phases along the rollout axis,
with mean@k where it was tested), card.png (run_all.sh's turns: which domain's process held the card when,
from results/<preset>/card.jsonl) and per domain and seed alternation-<domain>[-seed-<n>].png (a panel
per method: its phases, the training reward of every RSFT step, the harness-set score of every search
round, the test points with their intervals; lib/report/plots.py).
"""
import argparse
import os
import re
from statistics import fmean

import numpy as np

import domains
from lib.report import runs as run_folders
from lib.report.claims import claims_section
from lib.cli import Parser, one_line_errors
from lib.report.intervals import (benchmarks_ci, hierarchical_ci, paired_difference, percent, pooled_difference,
                                  seeds_interval, signed)
from lib.report.plots import plot_alternation, plot_card, plot_curves, plot_timeline
from lib.run_folder import card
from lib.methods import ADAPTIVE, METHODS, method_of, run_names
from lib.report.runs import BEST, FINAL, domains_of, finished, paired_scores, points  # noqa: F401


def baselines():
    """The comparison's fixed baselines (lib/methods.py says why each), in the method table's order."""
    return [name for name, m in METHODS.items() if m.baseline]


def ours():
    """The runs compared against the baselines: the method's, then its adaptive schedule's."""
    return [name for name in run_names() if method_of(name).ours]


def paper_scores():
    """The paper's Table 1, best mean@8 in % (SearchQA / Math / Chess, docs/design.md section 2), per run name."""
    scores = {name: m.paper for name, m in METHODS.items() if m.paper}
    return {**scores, **{name + ADAPTIVE: m.paper_adaptive for name, m in METHODS.items() if m.paper_adaptive}}


def load_runs(root):
    """Every registered domain's runs under root (lib/report/runs.py), in the registry's order."""
    return run_folders.load_runs(root, list(domains.DOMAINS))


def method_header(names):
    """A table's two header lines: a method column, then one per name."""
    return ["| method | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]


def verified_columns(runs):
    """columns(runs), each with the verifier its runs' summary.json names (searchqa: exact match or the LLM
    judge) and what it read (the scoring rule: the model's last message, the harness's answer, chess's moves
    played), so a table scored by exact match is never read as the paper's judged one, nor one scored on the
    harness's answer as the official verifier's; a summary of an older run names neither."""
    return [verified(runs, domain) for domain in columns(runs)]


def verified(runs, domain):
    named = lambda key: sorted({run["summary"][key] for (d, _), seed_runs in runs.items() if d == domain
                                for run in seed_runs.values() if (run["summary"] or {}).get(key)})
    found = named("verifier") + [f"on {rule}" for rule in named("scoring")]
    return f"{domain} ({'; '.join(found)})" if found else domain


def columns(runs):
    """The domains a table shows: the registry's that ran, and those it always reports (REPORTED: "not run")."""
    ran = domains_of(runs)
    return [name for name, cls in domains.DOMAINS.items() if cls.REPORTED or name in ran]


# -----------------------------------------------------------------------------
# tables

def cell(seed_runs):
    """Table 1's cell for one method and domain: final, then best over training @ rollouts, over the
    seeds that finished."""
    if not seed_runs:
        return "not run"
    done = finished(seed_runs)
    if not done:  # evals[0] is the start, not a phase
        phases = ", ".join(str(max(len(run["evals"]) - 1, 0)) for run in seed_runs.values())
        return f"running ({phases} phases done)"
    best, final = zip(*(points(run) for run in done.values()))
    rollouts = round(np.mean([row["rollouts"] for row in best]))
    text = (f"final {percent(seeds_interval(final))}; best {percent(seeds_interval(best))} "
            f"@ {rollouts:,}")
    return text + (f" ({len(done)} of {len(seed_runs)} seeds done)" if len(done) < len(seed_runs)
                   else "")


def seed_list(runs):
    return sorted({seed for seed_runs in runs.values() for seed in seed_runs})


def make_table(runs, preset):
    k = next((r["summary"]["k"] for seed_runs in runs.values() for r in seed_runs.values()
              if r["summary"]), 8)
    seeds = seed_list(runs)
    if len(seeds) > 1:
        over = (f"Mean over {len(seeds)} seeds ({', '.join(map(str, seeds))}); intervals: "
                "hierarchical bootstrap, resampling the seeds, then the test tasks within each "
                "(2,000 resamples, seed 0).")
    else:
        over = ("One seed; intervals: percentile bootstrap over test tasks (2,000 resamples, "
                "seed 0).")
    lines = [f"# Results: preset `{preset}`", "",
             f"Final test mean@{k} in % [95 % CI] (the last evaluation: chosen without looking at "
             f"the test set); best over training in % [95 % CI] (the best evaluation: picked on "
             f"the test set, so biased upwards) @ rollouts to reach it. Rollouts = training + "
             f"harness scoring; test evaluation is not counted. {over}",
             "",
             *method_header(verified_columns(runs))]
    for method in shown_methods(runs):
        lines.append(f"| {method} | " + " | ".join(cell(runs.get((d, method)))
                                                   for d in columns(runs)) + " |")
    lines += ["", "Test sets: " + ", ".join(f"{d}: {tasks_of(runs, d)} tasks" for d in columns(runs)), ""]
    lines += without_model_table(runs, k)
    lines += claims_section(runs)
    if len(seeds) > 1:
        lines += per_seed_table(runs, seeds, k)
    lines += benchmark_table(runs, k)
    lines += comparison_table(runs)
    lines += search_table(runs)
    lines += mechanism_table(runs)
    lines += infrastructure_table(runs)
    if preset == "paper":
        lines += ["", "The paper's numbers (best mean@8 %; searchqa judged by gpt-5.4-mini, the official "
                  "docs/data.md section 5):", "",
                  *method_header(paper_scores()[ours()[0]])]
        for method, values in paper_scores().items():
            lines.append(f"| {method} | " + " | ".join("-" if v is None else f"{v:.2f}"
                                                       for v in values.values()) + " |")
    return "\n".join(lines) + "\n"


def without_model_table(runs, k):
    """Each final harness's test mean@k without the model (--model null: '' to every call) beside its score, on
    the same tasks and seeds: what its own code earns, which no score should contain."""
    lines = [f"## Final test mean@{k} and the final harness without the model", "",
             "In %, mean over the finished seeds: the score / the same harness on the same tasks under the null "
             "model (every reply ''), both scored by the rule its column names. A harness that answers by itself "
             "shows here; - where an older run did not measure it.", "",
             *method_header(verified_columns(runs))]
    for method in shown_methods(runs):
        cells = []
        for domain in columns(runs):
            finals = [points(run)[FINAL] for run in finished(runs.get((domain, method))).values()]
            nulls = [r.get("null_mean_at_k") for r in finals]
            score = f"{100 * fmean(r['mean_at_k'] for r in finals):.1f}" if finals else "not run"
            null = f"{100 * fmean(nulls):.1f}" if finals and None not in nulls else "-"
            cells.append(f"{score} / {null}" if finals else score)
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines + [""]


def benchmark_table(runs, k):
    """Per domain whose test tasks come from several benchmarks (the paper's searchqa: 7 x 100),
    each method's final mean@k per benchmark and their average, over the seeds and tasks."""
    lines = []
    for domain in columns(runs):
        done = {m: finished(runs.get((domain, m))) for m in shown_methods(runs)}
        finals = {m: [run["evals"][-1] for run in d.values()] for m, d in done.items() if d}
        names = sorted({s for rows in finals.values() for row in rows
                        for s in row["sources"].values()})
        if len(names) < 2:
            continue
        lines += [f"## {domain}: final test mean@{k} per benchmark, % [95 % CI]", "",
                  *method_header([*names, "average of benchmarks"])]
        for method, rows in finals.items():
            per = [percent(hierarchical_ci([[v for t, v in row["per_task"].items()
                                             if row["sources"].get(t) == name]
                                            for row in rows])) for name in names]
            all_ci = percent(benchmarks_ci(rows, names))
            lines.append(f"| {method} | " + " | ".join(per) + f" | {all_ci} |")
        lines.append("")
    return lines


def shown_methods(runs):
    """The run names, less the optional ones (the adaptive runs, stagewise-hw, experimental rows) where no domain
    ran them."""
    return [m for m in run_names() if not (m.endswith(ADAPTIVE) or method_of(m).optional or method_of(m).experimental)
            or any((d, m) in runs for d in domains_of(runs))]


def per_seed_table(runs, seeds, k):
    """Each seed's final mean@k, so a reader sees the spread between runs, seed by seed."""
    lines = [f"## Final test mean@{k} per seed", "",
             f"In %, seeds {' / '.join(map(str, seeds))}; - where that seed has not finished.", "",
             *method_header(columns(runs))]
    for method in shown_methods(runs):
        cells = []
        for domain in columns(runs):
            done = finished(runs.get((domain, method)))
            cells.append(" / ".join(f"{100 * points(done[s])[1]['mean_at_k']:.1f}" if s in done
                                    else "-" for s in seeds)
                         if done else "not run")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines + [""]


def comparison_table(runs):
    """WHALE (and adaptive WHALE) minus each fixed baseline, per task under the same seed: per seed, then pooled over
    the seeds both finished; the final points first (the headline), the best points beside them."""
    lines = ["## WHALE against fixed baselines", "",
             "Mean per-task difference in test mean@k (percentage points) on the same tasks under "
             "the same seed, with its 95 % interval: per seed a bootstrap over test tasks, pooled "
             "a hierarchical bootstrap over seeds, then tasks. The headline is the final points "
             "(each run's last evaluation, chosen without looking at the test set); best over "
             "training (each run's best evaluation, picked on the test set) "
             f"stands beside it. The baselines are fixed, not picked by a test score: "
             f"{', '.join(baselines())}.", "",
             "| domain | comparison | seed | final: difference [95 % CI] | best over training: "
             "difference [95 % CI] | tasks |", "|---|---|---|---|---|---|"]
    rows = 0
    for domain in columns(runs):
        for method in ours():
            for baseline in baselines():
                found = comparison_rows(domain, f"{method} - {baseline}",
                                        finished(runs.get((domain, method))),
                                        finished(runs.get((domain, baseline))))
                lines += found
                rows += len(found)
    if not rows:
        return lines[:2] + [f"Not enough finished runs: it needs {ours()[0]} and one of "
                            f"{', '.join(baselines())} under the "
                            "same seed."]
    return lines


def comparison_rows(domain, label, ours, theirs):
    """A row per seed both {seed: run} finished, then the pooled row (with more than one such seed)."""
    seeds = sorted(set(ours) & set(theirs))
    scores = {point: [paired_scores(ours[s], theirs[s],
                                    point) for s in seeds] for point in (FINAL, BEST)}
    lines = []
    for i, seed in enumerate(seeds):
        final, best = (paired_difference(*scores[p][i]) if scores[p][i] else None
                       for p in (FINAL, BEST))
        tasks = final[3] if final else "-"
        cells = [domain, label, seed, signed(final), signed(best), tasks]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    if len(seeds) > 1:
        final, best = (pooled_difference(scores[p]) if all(scores[p]) else None
                       for p in (FINAL, BEST))
        lines.append(f"| {domain} | {label} | pooled ({len(seeds)} seeds) | **{signed(final)}** | "
                     f"{signed(best)} | {' + '.join(map(str, final[3])) if final else '-'} |")
    return lines


def better_harnesses(run):
    """[(archive, its h0's harness-set score, its best's)] for each search of a run that found a
    harness beating the one it started from (its h0): the archive best is not h0 and scores above
    it. None: no search."""
    if not run["archives"]:
        return None
    series = [(name,
               frontier.get("best_series") or [0.0]) for name, (frontier,
                                                                _) in run["archives"].items()]
    return [(name, scores[0], scores[-1]) for name, scores in series if scores[-1] > scores[0]]


def search_table(runs):
    """In how many seeds each method's harness search found a better harness than its start."""
    lines = ["", "## Did the search find a better harness?", "",
             "Per method, the finished seeds in which a harness search found a harness that beats "
             "its start (the archive's h0: h0 itself, or the harness the phase began from) on the "
             "harness set; then per seed the archives (harness_w<n>: searched after n weight "
             "phases) that did, h0's score -> the best's.", "",
             "| domain | method | seeds with a better harness | per seed |", "|---|---|---|---|"]
    header = len(lines)
    for key in ordered(runs):
        found = {seed: better_harnesses(run) for seed, run in finished(runs[key]).items()}
        found = {seed: archives for seed, archives in found.items() if archives is not None}
        if found:
            per_seed = "; ".join(f"seed {seed}: " + (", ".join(f"{name} ({start:.2f} -> {best:.2f})"
                                                               for name, start, best in archives)
                                                               or "none")
                                 for seed, archives in found.items())
            lines.append(f"| {key[0]} | {key[1]} | {sum(map(bool, found.values()))} of "
                         f"{len(found)} | {per_seed} |")
    return lines if len(lines) > header else lines[:3] + ["No finished run has searched yet."]


def ordered(runs):
    """The (domain, method) keys of `runs` in the tables' domain order, then the method table's."""
    return [(d, m) for d in columns(runs) for m in run_names() if (d, m) in runs]


def mechanism_table(runs):
    """What each axis did: RSFT's accepted examples and training reward, each harness search's
    harness-set score from its seed to its best and the knob changes that led there."""
    lines = ["", "## What moved", "",
             "RSFT: steps, accepted examples in the first weight phase and in all, the training "
             "reward (the share of rollouts with reward 1) per weight phase, and over the first "
             "and the last quarter of the steps. Harness search: per archive (harness_w<n>: "
             "searched after n weight phases), the harness-set score of its seed and after each "
             "iteration, and the best candidate's lineage.", "",
             "| domain | method | seed | RSFT steps | accepted: first phase / all | train reward "
             "per weight phase | first -> last quarter | harness searches |",
             "|---|---|---|---|---|---|---|---|"]
    for domain, method in ordered(runs):
        for seed, run in runs[domain, method].items():
            steps = run["steps"]
            phases, first, last = weight_phases(steps, run["weight_phase_ends"]), *quarters(steps)
            reward = " / ".join(f"{fmean(r['accept_rate'] for r in p):.2f}" for p in phases) or "-"
            accepted = (f"{sum(r.get('examples', 0) for r in phases[0])} / "
                        f"{sum(r.get('examples', 0) for r in steps)}"
                        if phases else "-")
            searches = "; ".join(f"{name}: " + ", ".join(f"{x:.2f}"
                                                         for x in frontier["best_series"])
                                 + " (" + trajectory(frontier, rows) + ")"
                                 for name, (frontier, rows) in run["archives"].items())
            moved = f"{first:.2f} -> {last:.2f}" if steps else "-"
            lines.append(f"| {domain} | {method} | {seed} | {len(steps)} | {accepted} | {reward} | "
                         f"{moved} | {searches or '-'} |")
    return lines


def weight_phases(steps, ends):
    """The RSFT step rows of each weight phase, split at the steps where the run's weight phases ended."""
    phases, start = [], 0
    for end in ends:
        phases.append([r for r in steps if start < r["step"] <= end])
        start = end
    return [p for p in phases if p]


def quarters(steps):
    """(training reward over the first quarter of the steps, over the last quarter), a quarter at least a step."""
    if not steps:
        return None, None
    n = max(1, len(steps) // 4)
    return fmean(r["accept_rate"] for r in steps[:n]), fmean(r["accept_rate"] for r in steps[-n:])


def infrastructure_table(runs):
    """The phases with episodes lost outside the harness's own code (scored 0, within the run's
    --infra-budget) or with worker starts tried twice: nothing when there were none, so a clean
    table reads as before."""
    rows = [(domain, method, seed,
             r) for domain, method in ordered(runs) for seed, run in runs[domain, method].items()
            for r in run["evals"] if r.get("infra_failures") or r.get("start_retries")]
    if not rows:
        return []
    lines = ["", "## Infrastructure failures", "",
             "Per phase (its test evaluation included): episodes lost outside the harness's code "
             "(a worker that did not start, a tool server that did not answer; each scored 0), and "
             "sandbox starts tried again.", "",
             "| domain | method | seed | phase | episodes lost | starts retried |",
             "|---|---|---|---|---|---|"]
    for domain, method, seed, r in rows:
        lines.append(f"| {domain} | {method} | {seed} | {r['phase']} ({r['kind']}) | "
                     f"{r.get('infra_failures', 0)} | {r.get('start_retries', 0)} |")
    return lines


def trajectory(frontier, rows, width=40):
    """The best candidate's lineage with each step's knob change, e.g. h0 -> h1_2 [SEARCH_FIRST: False -> True]; a new
    value longer than `width` characters is cut (the archive's summary.jsonl has it whole)."""
    def cut(text):
        return text if len(text) <= width else text[:width - 3] + "..."

    # "KNOB: old -> new; KNOB2: ..." -> "KNOB: new; KNOB2: ..."; other text just cut
    def short(changed):
        parts = [part.rpartition(" -> ") for part in re.split(r"; (?=[A-Z][A-Z_0-9]*: )", changed)]
        return "; ".join(head.split(":")[0] + ": " + cut(new) if sep else cut(new)
                         for head, sep, new in parts)
    text = " -> ".join(name + (f" [{short(rows[name]['changed'])}]" if name in rows
                               and rows[name].get("parent") else "")
                       for name in frontier.get("lineage", []))
    return re.sub(r"[|\n]", " ", text)  # a proposer's free text must not break the table row


def tasks_of(runs, domain):
    sizes = {r["evals"][0].get("test_tasks") for (d, _), seed_runs in runs.items() if d == domain
             for r in seed_runs.values() if r["evals"]}
    return "/".join(str(s) for s in sorted(x for x in sizes if x is not None)) or "-"


# -----------------------------------------------------------------------------
# plots

def main(argv=None):
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cpu")
    p.add_argument("--results", default="results", help="the results root folder")
    args = p.parse_args(argv)
    with one_line_errors("report.py"):
        write_report(args)


def write_report(args):
    root = os.path.join(args.results, args.preset)
    fill = (f"run `PRESET={args.preset} bash run_all.sh` (or `python whale.py --preset "
            f"{args.preset} --domain D "
            "--method M`) first")
    if not os.path.isdir(root):
        raise ValueError(f"no results in {root}: {fill}")
    runs = load_runs(root)
    if not runs:
        raise ValueError(f"no runs in {root} (no <domain>/<method>/metrics.jsonl): {fill}")
    table = make_table(runs, args.preset)
    with open(os.path.join(root, "tables.md"), "w") as f:
        f.write(table)
    plot_curves(runs, os.path.join(root, "curves.png"), columns(runs), run_names())
    plot_timeline(runs, os.path.join(root, "timeline.png"))
    figures = write_alternation(runs, root)
    held = card.holdings(os.path.join(root, "card.lock"))  # run_all.sh's turns on the card, where it took them
    if held:
        plot_card(held, os.path.join(root, "card.png"))
        figures.append("card.png")
    print(table)
    print(f"wrote {root}/tables.md, curves.png, timeline.png, {', '.join(figures)}")
    for folder, why in run_folders.skipped_folders(root, runs, list(domains.DOMAINS)):
        print(f"not in the tables: {folder} ({why})")


def write_alternation(runs, root):
    """An alternation figure per domain and seed that ran: alternation-<domain>.png for seed 0,
    alternation-<domain>-seed-<n>.png for seed n. -> their names"""
    names = []
    for domain in columns(runs):
        for seed in seed_list(runs):
            seed_runs = {m: runs[domain, m][seed] for m in run_names() if seed in runs.get((domain, m), {})}
            if seed_runs:
                names.append(f"alternation-{domain}" + (f"-seed-{seed}" if seed else "") + ".png")
                plot_alternation(seed_runs, os.path.join(root, names[-1]),
                                 f"{domain}, seed {seed}: each phase along the rollouts it spent")
    return names


if __name__ == "__main__":
    main()
