"""report.py's two figures, from the runs it read (report.load_runs): the test curves of every run,
and each WHALE run's timeline of weight and harness phases."""
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from lib.intervals import interval  # noqa: E402


def percent_axis(ax):
    """mean@k in %: from 0 (never negative), at least 0-10 so an all-zero line lies visibly on the
    floor."""
    ax.set_ylim(0, max(10.0, 1.1 * ax.get_ylim()[1]))
    ax.set_ylabel("test mean@k (%)")


def plot_curves(runs, path, domains, methods):
    """A panel per domain, a line per method and seed (a method's seeds share its colour), each with
    its band."""
    fig, axes = plt.subplots(1, len(domains), figsize=(5 * len(domains), 4), squeeze=False)
    for ax, domain in zip(axes[0], domains):
        for method in methods:
            color = None
            for seed, run in (runs.get((domain, method)) or {}).items():
                if not run["evals"]:
                    continue
                xs = [r["rollouts"] for r in run["evals"]]
                ys = [100 * r["mean_at_k"] for r in run["evals"]]
                line, = ax.plot(xs, ys, marker="o", color=color, label=None if color else method)
                color = line.get_color()
                cis = [interval(r) or (None, np.nan, np.nan) for r in run["evals"]]
                ax.fill_between(xs, [100 * c[1] for c in cis], [100 * c[2] for c in cis],
                                color=color, alpha=0.15, linewidth=0)
        seeds = {seed for (d, _), seed_runs in runs.items() if d == domain for seed in seed_runs}
        ax.set_title(f"{domain} (bands: 95 % CI over test tasks)"
                     + (f", {len(seeds)} seeds" if len(seeds) > 1 else ""))
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
    whale_runs = [(d, m, seed) for (d, m), seed_runs in runs.items() if m.startswith("whale")
                  for seed, run in seed_runs.items() if run["evals"]]
    fig, axes = plt.subplots(max(1, len(whale_runs)), 1,
                             figsize=(10, 2.4 * max(1, len(whale_runs))), squeeze=False)
    colors = {"weight": "tab:blue", "harness": "tab:orange"}
    for ax, (domain, method, seed) in zip(axes[:, 0], whale_runs):
        evals = runs[domain, method][seed]["evals"]
        for prev, row in zip(evals, evals[1:]):
            ax.axvspan(prev["rollouts"], max(row["rollouts"], prev["rollouts"] + 1),
                       color=colors[row["kind"]], alpha=0.25)
        ax.plot([r["rollouts"] for r in evals], [100 * r["mean_at_k"] for r in evals], "k-o")
        percent_axis(ax)
        ax.set_title(f"{domain} / {method} / seed {seed}: weight phases blue, "
                     "harness phases orange")
        ax.set_xlabel("cumulative rollouts")
    if not whale_runs:
        axes[0, 0].text(0.5, 0.5, "no WHALE run yet", ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
