"""
Tables and plots from the result folders that whale.py writes. It only reads results.

    python report.py --preset cpu          # reads results/cpu/, writes results/cpu/tables.md and *.png

Table 1's shape: best test mean@k per method and domain (the best point over training, the paper's
figure) with the rollouts spent to reach it, and beside it the final mean@k (the point chosen without
looking at the test set). Under the paper preset the paper's numbers stand beside ours.
Plots: curves.png (test mean@k against cumulative rollouts, a panel per domain, a line per method)
and timeline.png (each WHALE run's phases along the rollout axis, with mean@k after each phase).
"""
import argparse
import json
import os

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

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
    """{(domain, method): {"summary": ..., "evals": [...]}} for every finished or running folder."""
    runs = {}
    for domain in DOMAINS:
        for method in METHODS:
            folder = os.path.join(root, domain, method)
            metrics = os.path.join(folder, "metrics.jsonl")
            if not os.path.exists(metrics):
                continue
            with open(metrics) as f:
                rows = [json.loads(line) for line in f if line.strip()]
            summary_path = os.path.join(folder, "summary.json")
            summary = json.load(open(summary_path)) if os.path.exists(summary_path) else None
            runs[domain, method] = {"summary": summary, "evals": [r for r in rows if r.get("event") == "eval"]}
    return runs


def cell(run):
    if run is None:
        return "not run"
    s = run["summary"]
    if s is None:
        return f"running ({len(run['evals']) - 1} phases)"
    return f"{100 * s['best_mean_at_k']:.2f} @ {s['rollouts_to_best']:,} (final {100 * s['final_mean_at_k']:.2f})"


def make_table(runs, preset):
    k = next((r["summary"]["k"] for r in runs.values() if r["summary"]), 8)
    lines = [f"# Results: preset `{preset}`", "",
             f"Best test mean@{k} in % @ rollouts to reach it (final mean@{k} in brackets). "
             "Rollouts = training + harness scoring; test evaluation is not counted.", "",
             "| method | " + " | ".join(DOMAINS) + " |", "|---|" + "---|" * len(DOMAINS)]
    for method in METHODS:
        if not any((d, method) in runs for d in DOMAINS) and method == "whale-adaptive":
            continue
        lines.append(f"| {method} | " + " | ".join(cell(runs.get((d, method))) for d in DOMAINS) + " |")
    if preset == "paper":
        lines += ["", "The paper's numbers (best mean@8 %):", "",
                  "| method | " + " | ".join(DOMAINS) + " |", "|---|" + "---|" * len(DOMAINS)]
        for method, values in PAPER.items():
            lines.append(f"| {method} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in values) + " |")
    lines += ["", "Test sets: " + ", ".join(f"{d}: {tasks_of(runs, d)} tasks" for d in DOMAINS)]
    return "\n".join(lines) + "\n"


def tasks_of(runs, domain):
    sizes = {r["evals"][0].get("test_tasks") for (d, _), r in runs.items() if d == domain and r["evals"]}
    return "/".join(str(s) for s in sorted(x for x in sizes if x is not None)) or "-"


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
                ax.plot(xs, ys, marker="o", label=method)
        ax.set_title(domain)
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
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cpu")
    p.add_argument("--results", default="results", help="the results root folder")
    args = p.parse_args(argv)
    root = os.path.join(args.results, args.preset)
    if not os.path.isdir(root):
        raise SystemExit(f"report: no results in {root}: run `bash run_all.sh` (or whale.py --preset {args.preset}) first")
    runs = load_runs(root)
    table = make_table(runs, args.preset)
    with open(os.path.join(root, "tables.md"), "w") as f:
        f.write(table)
    plot_curves(runs, os.path.join(root, "curves.png"))
    plot_timeline(runs, os.path.join(root, "timeline.png"))
    print(table)
    print(f"wrote {root}/tables.md, curves.png, timeline.png")


if __name__ == "__main__":
    main()
