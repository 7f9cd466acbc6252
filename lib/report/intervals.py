"""Percentile bootstrap intervals over test tasks, and over seeds then test tasks (report.py's tables).

    mean, low, high = bootstrap_ci(per_task_scores)                 # one evaluation
    mean, low, high = hierarchical_ci([seed0_scores, seed1_scores])   # one evaluation per seed
    mean, low, high, n = paired_difference(ours, theirs)            # per-task dicts, on the tasks both scored
    mean, low, high = interval(eval_row)                            # a metrics.jsonl row with its "per_task"
"""
import numpy as np


def bootstrap_ci(values, resamples=2000, seed=0, level=0.95):
    """(mean, low, high): the mean of `values` and its percentile bootstrap interval, resampling the values
    (one per test task) with replacement."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("bootstrap_ci: no values (an evaluation without per-task scores?)")
    means = x[np.random.default_rng(seed).integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(x.mean()), float(low), float(high)


def hierarchical_ci(groups, resamples=2000, seed=0, level=0.95):
    """(mean, low, high): the mean over seeds of each seed's mean over its tasks (`groups`: one list of per-task
    values per seed) and its two-stage percentile bootstrap interval. Each resample draws the seeds with
    replacement, then each drawn seed's tasks with replacement (afresh for a seed drawn twice), so the
    interval counts the spread between runs as well as between tasks. With one seed it is bootstrap_ci's,
    draw for draw."""
    xs = [np.asarray(g, dtype=float) for g in groups]
    if not xs or any(x.size == 0 for x in xs):
        raise ValueError("hierarchical_ci: a seed without values (an evaluation without per-task scores?)")
    rng, n = np.random.default_rng(seed), len(xs)
    # the task means of every seed for every slot of every resample, drawn before the seeds: (seeds, resamples, slots)
    means = np.stack([x[rng.integers(0, x.size, size=(resamples, n, x.size))].mean(axis=2) for x in xs])
    picks = rng.integers(0, n, size=(resamples, n))
    stats = means[picks, np.arange(resamples)[:, None], np.arange(n)[None, :]].mean(axis=1)
    low, high = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return float(np.mean([x.mean() for x in xs])), float(low), float(high)


def paired_difference(a, b, **kw):
    """(mean, low, high, tasks) of the per-task difference a - b over the tasks both scored: pairing on the
    same tasks removes the spread between tasks, which two separate intervals would count twice."""
    tasks = sorted(set(a) & set(b))
    return (*bootstrap_ci([a[t] - b[t] for t in tasks], **kw), len(tasks))


def pooled_difference(pairs, **kw):
    """(mean, low, high, tasks per seed) of the per-task difference a - b pooled over seeds, `pairs` holding
    one (a, b) of per-task scores per seed: the hierarchical interval over the seeds' paired differences."""
    common = [sorted(set(a) & set(b)) for a, b in pairs]
    return (*hierarchical_ci([[a[t] - b[t] for t in tasks] for (a, b), tasks in zip(pairs, common)], **kw),
            [len(tasks) for tasks in common])


def interval(row):
    """(mean, low, high) of one evaluation, or None when its per-task scores were not stored."""
    return bootstrap_ci(list(row["per_task"].values())) if row.get("per_task") else None


def seeds_interval(rows):
    """(mean, low, high) over seeds and tasks of one evaluation per seed; without per-task scores in any of
    them, (mean over seeds, None, None)."""
    if all(row.get("per_task") for row in rows):
        return hierarchical_ci([list(row["per_task"].values()) for row in rows])
    return float(np.mean([row["mean_at_k"] for row in rows])), None, None


def benchmarks_ci(rows, names, resamples=2000, seed=0, level=0.95):
    """(mean, low, high) of the average over benchmarks of each benchmark's mean, over seeds: each resample draws the
    seeds with replacement, then each benchmark's tasks within each drawn seed."""
    by = [[np.asarray([v for t, v in row["per_task"].items() if row["sources"].get(t) == name],
                      dtype=float)
           for name in names] for row in rows]
    rng = np.random.default_rng(seed)
    stats = [np.mean([np.mean([x[rng.integers(0, x.size, x.size)].mean() for x in by[i]])
                      for i in rng.integers(0, len(by), len(by))]) for _ in range(resamples)]
    low, high = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    mean = np.mean([[x.mean() for x in seed_rows] for seed_rows in by])
    return float(mean), float(low), float(high)


def percent(ci):
    mean, low, high = ci
    if low is None:
        return f"{100 * mean:.1f}"
    return f"{100 * mean:.1f} [{100 * low:.1f}, {100 * high:.1f}]"


def signed(difference):
    """A paired difference in points [95 % CI]; None: the runs stored no per-task scores."""
    if difference is None:
        return "no per-task scores"
    mean, low, high = difference[:3]
    return f"{100 * mean:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"
