"""
Tables and plots from the result folders that whale.py writes. It only reads results.

    python report.py --preset cpu          # reads results/cpu/, writes results/cpu/tables.md and *.png

Table 1's shape: best test mean@k per method and domain (the best point over training, the paper's
figure) with the rollouts spent to reach it, and beside it the final mean@k (the point chosen without
looking at the test set). Every figure carries a 95 % confidence interval, bootstrapped over the test
tasks (2,000 resamples of the per-task scores in evals/phase_<n>.json, seed 0). A second table compares
WHALE with the best single-axis method (the better of weight-only and harness-only by final mean@k): the
mean per-task difference on the same tasks, with its bootstrap interval. Under the paper preset the
paper's numbers stand beside ours.
Plots: curves.png (test mean@k against cumulative rollouts, a panel per domain, a line per method, its
95 % interval as a band) and timeline.png (each WHALE run's phases along the rollout axis, with mean@k
after each phase).
"""
import argparse
import os
import re

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from lib.cli import Parser, one_line_errors
from lib.io import read_json, read_jsonl

DOMAINS = ("searchqa", "math", "chess")
METHODS = ("harness-only", "weight-only", "stagewise", "fast-slow", "whale", "whale-adaptive")
# mean@8 %, SearchQA / Math / Chess (DESIGN.md section 2)
PAPER = {
    "harness-only": (38.29, 0.42, 19.82),
    "weight-only": (38.27, 15.42, 22.17),
    "fast-slow": (35.34, 17.92, 25.68),
    "whale": (48.34, 24.79, 29.83),
    "whale-adaptive": (52.82, 26.46, None),
}


def load_runs(root):
    """{(domain, method): {"summary": ..., "evals": [...]}} for every finished or running folder; each eval row
    carries its per-task scores ("per_task", None for runs made before whale.py stored them)."""
    runs = {}
    for domain in DOMAINS:
        for method in METHODS:
            folder = os.path.join(root, domain, method)
            metrics = os.path.join(folder, "metrics.jsonl")
            if not os.path.exists(metrics):
                continue
            evals = [r for r in read_jsonl(metrics) if r.get("event") == "eval"]
            for row in evals:
                scores = read_json(os.path.join(folder, "evals", f"phase_{row['phase']}.json"), {})
                row["per_task"] = scores.get("per_task")
            runs[domain, method] = {"summary": read_summary(folder, evals),
                                    "evals": evals,
                                    "steps": read_jsonl(os.path.join(folder, "weights", "metrics.jsonl")),
                                    "archives": read_archives(folder)}
    return runs


def read_summary(folder, evals):
    """A run's summary.json (None while it runs); a damaged one is an error naming it and the fix."""
    path = os.path.join(folder, "summary.json")
    fix = "rerun the run's whale.py command (a finished run only writes its summary again), then report.py"
    try:
        summary = read_json(path, {})
    except ValueError:
        raise ValueError(f"damaged run file {path}: {fix}") from None
    keys = ("k", "best_phase", "best_mean_at_k", "rollouts_to_best", "final_mean_at_k")
    if summary != {} and not (isinstance(summary, dict) and all(k in summary for k in keys)
                              and summary["best_phase"] in {r["phase"] for r in evals}):
        raise ValueError(f"damaged run file {path} (not the summary of the phases in metrics.jsonl): {fix}")
    return summary or None


def read_archives(folder):
    """{archive name: (frontier.json, {candidate: its summary row})} of a run's harness searches."""
    names = sorted(n for n in os.listdir(folder) if re.fullmatch(r"harness_w\d+", n) and
                   os.path.exists(os.path.join(folder, n, "frontier.json")))
    return {n: (read_json(os.path.join(folder, n, "frontier.json"), {}),
                {r["name"]: r for r in read_jsonl(os.path.join(folder, n, "summary.jsonl"))}) for n in names}


# -----------------------------------------------------------------------------
# statistics: percentile bootstrap over test tasks

def bootstrap_ci(values, resamples=2000, seed=0, level=0.95):
    """(mean, low, high): the mean of `values` and its percentile bootstrap interval, resampling the values
    (one per test task) with replacement."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("bootstrap_ci: no values (an evaluation without per-task scores?)")
    means = x[np.random.default_rng(seed).integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(x.mean()), float(low), float(high)


def paired_difference(a, b, **kw):
    """(mean, low, high, tasks) of the per-task difference a - b over the tasks both scored: pairing on the
    same tasks removes the spread between tasks, which two separate intervals would count twice."""
    tasks = sorted(set(a) & set(b))
    return (*bootstrap_ci([a[t] - b[t] for t in tasks], **kw), len(tasks))


def interval(row):
    """(mean, low, high) of one evaluation, or None when its per-task scores were not stored."""
    return bootstrap_ci(list(row["per_task"].values())) if row.get("per_task") else None


# -----------------------------------------------------------------------------
# tables

def points(run):
    """(best, final) eval rows of a finished run: the summary's best phase and the last evaluation."""
    by_phase = {r["phase"]: r for r in run["evals"]}
    return by_phase[run["summary"]["best_phase"]], run["evals"][-1]


def percent(row):
    ci = interval(row)
    if ci is None:
        return f"{100 * row['mean_at_k']:.1f}"
    return f"{100 * ci[0]:.1f} [{100 * ci[1]:.1f}, {100 * ci[2]:.1f}]"


def cell(run):
    if run is None:
        return "not run"
    if run["summary"] is None:
        return f"running ({max(len(run['evals']) - 1, 0)} phases done)"  # evals[0] is the start, not a phase
    best, final = points(run)
    return f"{percent(best)} @ {best['rollouts']:,}; final {percent(final)}"


def make_table(runs, preset):
    k = next((r["summary"]["k"] for r in runs.values() if r["summary"]), 8)
    lines = [f"# Results: preset `{preset}`", "",
             f"Best test mean@{k} in % [95 % CI] @ rollouts to reach it; final mean@{k} in % [95 % CI]. "
             "Rollouts = training + harness scoring; test evaluation is not counted. Intervals: percentile "
             "bootstrap over test tasks (2,000 resamples, seed 0).", "",
             "| method | " + " | ".join(DOMAINS) + " |", "|---|" + "---|" * len(DOMAINS)]
    for method in METHODS:
        if not any((d, method) in runs for d in DOMAINS) and method == "whale-adaptive":
            continue
        lines.append(f"| {method} | " + " | ".join(cell(runs.get((d, method))) for d in DOMAINS) + " |")
    lines += ["", "Test sets: " + ", ".join(f"{d}: {tasks_of(runs, d)} tasks" for d in DOMAINS), ""]
    lines += comparison_table(runs)
    lines += mechanism_table(runs)
    if preset == "paper":
        lines += ["", "The paper's numbers (best mean@8 %):", "",
                  "| method | " + " | ".join(DOMAINS) + " |", "|---|" + "---|" * len(DOMAINS)]
        for method, values in PAPER.items():
            lines.append(f"| {method} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in values) + " |")
    return "\n".join(lines) + "\n"


def comparison_table(runs):
    """WHALE (and adaptive WHALE) minus the best single-axis method, per task, at the final and best points."""
    lines = ["## WHALE against the best single-axis method", "",
             "Mean per-task difference in test mean@k (percentage points) on the same tasks, with its 95 % "
             "bootstrap interval; the baseline is the better of weight-only and harness-only by final mean@k.", "",
             "| domain | comparison | final: difference [95 % CI] | best: difference [95 % CI] | tasks |",
             "|---|---|---|---|---|"]
    rows = 0
    for domain in DOMAINS:
        finished = {m: runs[domain, m] for m in METHODS if runs.get((domain, m)) and runs[domain, m]["summary"]}
        single = [m for m in ("weight-only", "harness-only") if m in finished]
        if not single:
            continue
        baseline = max(single, key=lambda m: finished[m]["summary"]["final_mean_at_k"])
        for method in ("whale", "whale-adaptive"):
            if method not in finished:
                continue
            cells, tasks = [], "-"
            for ours, theirs in zip(points(finished[method]), points(finished[baseline])):
                if not (ours.get("per_task") and theirs.get("per_task")):
                    cells.append("no per-task scores")
                    continue
                mean, low, high, tasks = paired_difference(ours["per_task"], theirs["per_task"])
                cells.append(f"{100 * mean:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]")
            lines.append(f"| {domain} | {method} - {baseline} | {cells[1]} | {cells[0]} | {tasks} |")
            rows += 1
    return lines if rows else lines[:2] + ["Not enough finished runs: it needs whale and weight-only or harness-only."]


def mechanism_table(runs):
    """What each axis did: RSFT's accepted examples and training reward, each harness search's harness-set
    score from its seed to its best and the knob changes that led there."""
    lines = ["", "## What moved", "",
             "RSFT: steps, accepted examples in all, training reward of the first and last step. Harness search: "
             "per archive (harness_w<n>: searched after n weight phases), the harness-set score of its seed and "
             "after each iteration, and the best candidate's lineage.", "",
             "| domain | method | RSFT steps | accepted | train reward first -> last | harness searches |",
             "|---|---|---|---|---|---|"]
    for (domain, method), run in runs.items():
        steps = run["steps"]
        reward = f"{steps[0]['reward']:.2f} -> {steps[-1]['reward']:.2f}" if steps else "-"
        searches = "; ".join(f"{name}: " + ", ".join(f"{x:.2f}" for x in frontier["best_series"])
                             + " (" + trajectory(frontier, rows) + ")"
                             for name, (frontier, rows) in run["archives"].items())
        lines.append(f"| {domain} | {method} | {len(steps)} | {sum(r.get('examples', 0) for r in steps)} | {reward} "
                     f"| {searches or '-'} |")
    return lines


def trajectory(frontier, rows, width=40):
    """The best candidate's lineage with each step's knob change, e.g. h0 -> h1_2 [SEARCH_FIRST: False -> True];
    a new value longer than `width` characters is cut (the archive's summary.jsonl has it whole)."""
    def cut(text):
        return text if len(text) <= width else text[:width - 3] + "..."

    def short(changed):  # "KNOB: old -> new; KNOB2: ..." -> "KNOB: new; KNOB2: ..."; other text just cut
        parts = [part.rpartition(" -> ") for part in re.split(r"; (?=[A-Z][A-Z_0-9]*: )", changed)]
        return "; ".join(head.split(":")[0] + ": " + cut(new) if sep else cut(new) for head, sep, new in parts)
    text = " -> ".join(name + (f" [{short(rows[name]['changed'])}]" if name in rows and rows[name].get("parent") else "")
                       for name in frontier.get("lineage", []))
    return re.sub(r"[|\n]", " ", text)  # a proposer's free text must not break the table row


def tasks_of(runs, domain):
    sizes = {r["evals"][0].get("test_tasks") for (d, _), r in runs.items() if d == domain and r["evals"]}
    return "/".join(str(s) for s in sorted(x for x in sizes if x is not None)) or "-"


# -----------------------------------------------------------------------------
# plots

def percent_axis(ax):
    """mean@k in %: from 0 (never negative), at least 0-10 so an all-zero line lies visibly on the floor."""
    ax.set_ylim(0, max(10.0, 1.1 * ax.get_ylim()[1]))
    ax.set_ylabel("test mean@k (%)")


def plot_curves(runs, path):
    fig, axes = plt.subplots(1, len(DOMAINS), figsize=(5 * len(DOMAINS), 4), squeeze=False)
    for ax, domain in zip(axes[0], DOMAINS):
        for method in METHODS:
            run = runs.get((domain, method))
            if run and run["evals"]:
                xs = [r["rollouts"] for r in run["evals"]]
                ys = [100 * r["mean_at_k"] for r in run["evals"]]
                line, = ax.plot(xs, ys, marker="o", label=method)
                cis = [interval(r) or (None, np.nan, np.nan) for r in run["evals"]]
                ax.fill_between(xs, [100 * c[1] for c in cis], [100 * c[2] for c in cis], color=line.get_color(),
                                alpha=0.15, linewidth=0)
        ax.set_title(f"{domain} (bands: 95 % CI over test tasks)")
        percent_axis(ax)
        ax.set_xlabel("cumulative rollouts (training + harness scoring)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not run", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_timeline(runs, path):
    whale_runs = [(d, m) for (d, m) in runs if m.startswith("whale") and runs[d, m]["evals"]]
    fig, axes = plt.subplots(max(1, len(whale_runs)), 1, figsize=(10, 2.4 * max(1, len(whale_runs))), squeeze=False)
    colors = {"weight": "tab:blue", "harness": "tab:orange"}
    for ax, key in zip(axes[:, 0], whale_runs):
        evals = runs[key]["evals"]
        for prev, row in zip(evals, evals[1:]):
            ax.axvspan(prev["rollouts"], max(row["rollouts"], prev["rollouts"] + 1), color=colors[row["kind"]], alpha=0.25)
        ax.plot([r["rollouts"] for r in evals], [100 * r["mean_at_k"] for r in evals], "k-o")
        percent_axis(ax)
        ax.set_title(f"{key[0]} / {key[1]}: weight phases blue, harness phases orange")
        ax.set_xlabel("cumulative rollouts")
    if not whale_runs:
        axes[0, 0].text(0.5, 0.5, "no WHALE run yet", ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cpu")
    p.add_argument("--results", default="results", help="the results root folder")
    args = p.parse_args(argv)
    with one_line_errors("report.py"):
        write_report(args)


def write_report(args):
    root = os.path.join(args.results, args.preset)
    fill = (f"run `PRESET={args.preset} bash run_all.sh` (or `python whale.py --preset {args.preset} --domain D "
            "--method M`) first")
    if not os.path.isdir(root):
        raise ValueError(f"no results in {root}: {fill}")
    runs = load_runs(root)
    if not runs:
        raise ValueError(f"no runs in {root} (no <domain>/<method>/metrics.jsonl): {fill}")
    table = make_table(runs, args.preset)
    with open(os.path.join(root, "tables.md"), "w") as f:
        f.write(table)
    plot_curves(runs, os.path.join(root, "curves.png"))
    plot_timeline(runs, os.path.join(root, "timeline.png"))
    print(table)
    print(f"wrote {root}/tables.md, curves.png, timeline.png")


if __name__ == "__main__":
    main()
