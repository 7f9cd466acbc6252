"""report.py's figures, from the runs it read (lib/report/runs.load_runs): the test curves of every run, each WHALE
run's timeline of weight and harness phases, and per domain and seed the alternation figure (a panel per
method: the training reward of every RSFT step, the harness-set score of every search round and the test
points, on the phases along the rollout axis). What each shows: docs/cpu-run/README.md."""
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from lib.report.intervals import interval  # noqa: E402
from lib.methods import HARNESS, method_of  # noqa: E402

KIND_COLOURS = {"weight": "tab:blue", "harness": "tab:orange"}


def percent_axis(ax):
    """mean@k in %: from 0 (never negative), at least 0-10 so an all-zero line lies visibly on the floor."""
    ax.set_ylim(0, max(10.0, 1.1 * ax.get_ylim()[1]))
    ax.set_ylabel("test mean@k (%)")


def plot_curves(runs, path, domains, methods):
    """A panel per domain, a line per method and seed (a method's seeds share its colour), each with its band."""
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
    """A row per WHALE run and seed: its phases shaded by kind along the rollout axis, the test points on them."""
    whale_runs = [(d, m, seed) for (d, m), seed_runs in runs.items() if method_of(m).ours
                  for seed, run in seed_runs.items() if run["evals"]]
    fig, axes = plt.subplots(max(1, len(whale_runs)), 1,
                             figsize=(10, 2.4 * max(1, len(whale_runs))), squeeze=False)
    for ax, (domain, method, seed) in zip(axes[:, 0], whale_runs):
        run = runs[domain, method][seed]
        shade_phases(ax, run)
        evals = run["evals"]
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


def plot_card(holdings, path):
    """Who held the card when (run_all.sh's turns, lib/run_folder/card.holdings): a row per domain, a bar per
    holding along the night's wall clock, a gap where its proposer wrote; a holding cut by its process's death
    hatched, one still open (the night goes on) drawn to the last row's time."""
    domains = sorted({h["domain"] for h in holdings})
    t0 = min(h["start"] for h in holdings)
    last = max(h["end"] or h["start"] for h in holdings)
    unit, name = (3600, "hours") if last - t0 > 7200 else (60, "minutes")
    fig, ax = plt.subplots(figsize=(10, 0.6 + 0.5 * len(domains)))
    for row, domain in enumerate(domains):
        for h in (h for h in holdings if h["domain"] == domain):
            span = ((h["start"] - t0) / unit, ((h["end"] or last) - h["start"]) / unit)
            ax.broken_barh([span], (row - 0.4, 0.8), facecolors=f"C{row}", hatch="//" if h.get("died") else None)
    ax.set_yticks(range(len(domains)), domains)
    ax.set_xlabel(f"{name} since the first process took the card")
    ax.set_title("who held the card when (a gap: its proposer writing, the card another domain's)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -----------------------------------------------------------------------------
# the alternation figure

def phase_spans(run):
    """[(kind, first rollout, last rollout, RSFT step at the start, the phase's row)] of every phase of
    a run, tested or not (metrics.jsonl's rollouts are cumulative: training + harness scoring)."""
    spans, rollouts, step = [], 0, 0
    for row in run["phases"]:
        if row["kind"] != "start":
            spans.append((row["kind"], rollouts, row["rollouts"], step, row))
        rollouts, step = row["rollouts"], row.get("step", step)
    return spans


def step_points(run):
    """[[(cumulative rollouts, training reward)] per weight phase]: each RSFT step placed on the run's
    axis. weights/metrics.jsonl counts training rollouts only, so a step's place is its phase's start
    plus the training rollouts since that phase began."""
    trained = {r["step"]: r["rollouts"] for r in run["steps"]}
    phases = []
    for kind, start, _, first_step, row in phase_spans(run):
        if kind == "weight":
            before = trained.get(first_step, 0)
            phases.append([(start + r["rollouts"] - before, r["reward"]) for r in run["steps"]
                           if first_step < r["step"] <= row["step"]])
    return phases


def round_points(run):
    """[[(cumulative rollouts, archive best, [the round's candidate scores])] per archive]: a point per
    search round, an archive's first point the re-scoring of the harness it starts from. A phase that
    continues its archive (weights unchanged since the last search: harness-only's, stagewise's) adds
    its rounds to that archive's line."""
    done, lines = {}, {}
    for kind, start, end, _, row in phase_spans(run):
        if kind != "harness" or row.get("archive") not in run["archives"]:
            continue
        candidates = run["archives"][row["archive"]][1].values()
        # a new archive's round 0 re-scores its start, then its rounds 1..n; a continued one goes on
        first = done[row["archive"]] + 1 if row["archive"] in done else 0
        last = done[row["archive"]] = done.get(row["archive"], 0) + row["rounds"]
        spent = start
        for i in range(first, last + 1):
            rows = [r for r in candidates if r.get("iteration") == i]
            spent = min(end, spent + sum(r.get("rollouts") or 0 for r in rows))
            scores = [r["score"] for r in rows if scored(r)]
            best = max([r["score"] for r in candidates if scored(r) and r.get("iteration", 0) <= i],
                       default=None)
            if best is not None:
                lines.setdefault(row["archive"], []).append((spent, best, scores))
    return list(lines.values())


def scored(candidate):
    return candidate.get("valid") and candidate.get("score") is not None


def shade_phases(ax, run):
    """Each phase shaded by its kind, a thin line where it ends (two phases of one kind can follow each
    other: harness-only's, stagewise's)."""
    for kind, start, end, _, _ in phase_spans(run):
        ax.axvspan(start, max(end, start + 1), color=KIND_COLOURS[kind], alpha=0.13, linewidth=0)
        ax.axvline(end, color="grey", linewidth=0.6, alpha=0.6)


def draw_alternation(ax, run):
    """One run's panel: phases shaded, the training reward per RSFT step (blue), the harness-set score
    per search round (orange: the archive best as a line, each candidate a faint dot), the test points
    (black, with their 95 % interval over test tasks)."""
    shade_phases(ax, run)
    for phase in step_points(run):
        if phase:
            xs, ys = zip(*phase)
            ax.plot(xs, [100 * y for y in ys], "-o", color="tab:blue", markersize=3.5)
    for search in round_points(run):
        for x, _, scores in search:
            ax.plot([x] * len(scores), [100 * s for s in scores], ".", color="tab:orange", alpha=0.35)
        ax.plot([p[0] for p in search], [100 * p[1] for p in search], "-s", color="tab:orange",
                markersize=4)
    for row in run["evals"]:
        mean, low, high = interval(row) or (row["mean_at_k"], row["mean_at_k"], row["mean_at_k"])
        ax.errorbar([row["rollouts"]], [100 * mean], yerr=[[100 * (mean - low)], [100 * (high - mean)]],
                    fmt="D", color="black", markersize=5, capsize=3)
        ax.annotate(f"{100 * mean:.1f}", (row["rollouts"], 100 * mean), textcoords="offset points",
                    xytext=(5, 4), fontsize=9)


def plot_alternation(seed_runs, path, title):
    """Two columns of panels, one per method that ran ({method: run} of one domain and seed), WHALE
    first, sharing both axes so WHALE reads against each baseline; one legend for all."""
    methods = sorted(seed_runs, key=lambda m: not method_of(m).ours)  # stable: the method table's order after
    rows = max(1, (len(methods) + 1) // 2)
    height = 2.6 * rows + 1.4
    fig, axes = plt.subplots(rows, 2, figsize=(11, height), sharex=True, sharey=True, squeeze=False)
    for ax, method in zip(axes.flat, methods):
        draw_alternation(ax, seed_runs[method])
        ax.set_title(panel_title(method), fontsize=11)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(methods):]:
        ax.axis("off")
    # the shared scale from 0, as high as the highest point needs (math's scores are low)
    axes[0, 0].set_ylim(0, min(105, max(10.0, 1.15 * axes[0, 0].get_ylim()[1])))
    for ax in axes[:, 0]:
        ax.set_ylabel("% solved")
    for ax in axes.flat[max(0, len(methods) - 2):len(methods)]:  # the lowest panel of each column
        ax.set_xlabel("cumulative rollouts (training + harness scoring)")
        ax.xaxis.set_tick_params(labelbottom=True)
    fig.suptitle(title, fontsize=12)
    fig.legend(handles=legend_handles(), loc="lower center", ncol=3, fontsize=9.5, frameon=False)
    fig.tight_layout(rect=(0, 0.6 / height, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def panel_title(run_name):
    """A panel's title: the run's name and, where it has weight phases, the weight step that trains them (the
    method row's: RSFT's, or a fork's)."""
    method = method_of(run_name)
    return run_name if method.budgets == HARNESS else f"{run_name} (weight step: {method.weight_step})"


def legend_handles():
    line = lambda style, colour, label, **kw: plt.Line2D([], [], linestyle="-" if "-" in style else "",
                                                        marker=style.strip("-"), color=colour, label=label,
                                                        **kw)
    return [Patch(color=KIND_COLOURS["weight"], alpha=0.25, label="weight phase (its panel's weight step)"),
            Patch(color=KIND_COLOURS["harness"], alpha=0.25, label="harness phase (search)"),
            line("-o", "tab:blue", "training reward per weight step", markersize=3.5),
            line("-s", "tab:orange", "harness-set score: archive best after each round", markersize=4),
            line(".", "tab:orange", "harness-set score of each candidate", alpha=0.5),
            line("D", "black", "test mean@k, 95 % CI over test tasks", markersize=5)]
