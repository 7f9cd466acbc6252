"""The one way this project takes fewer tasks than a set holds: a seeded sample that keeps each source's share,
never the first N (a set's first rows are often one source: Search-R1's train file starts with NQ, the seven
test sets come one after another).

    seeded_sample(tasks, 50)                                     # 50 tasks, the same 50 on every run
    seeded_sample(tasks, 50, exclude={t["id"] for t in tasks[:50]})   # 50 others
"""
import random

SAMPLE_SEED = 0  # fixed, not the run's --seed: two seeds of a method, and two methods, see the same tasks


def seeded_sample(tasks, n, seed=SAMPLE_SEED, key="source", exclude=()):
    """n of `tasks`, drawn with `seed`, each value of task[key] keeping its share of the set (largest
    remainders; tasks without the key are one group), returned in the set's own order. All of them (less
    `exclude`) when n is None or not below their number. `exclude`: ids never drawn."""
    tasks = [t for t in tasks if t.get("id") not in exclude] if exclude else list(tasks)
    if n is None or n >= len(tasks):
        return tasks
    groups = {}
    for i, task in enumerate(tasks):
        groups.setdefault(str(task.get(key)), []).append(i)
    shares = {g: n * len(idx) / len(tasks) for g, idx in groups.items()}
    quota = {g: int(share) for g, share in shares.items()}
    # the seats left over go to the largest remainders; a tie goes to the group met first (a stable sort)
    for g in sorted(groups, key=lambda g: quota[g] - shares[g])[: n - sum(quota.values())]:
        quota[g] += 1
    picked = []
    for g, idx in groups.items():  # a generator per group: one group's draw does not move another's
        picked += random.Random(f"{seed}:{key}:{g}").sample(idx, quota[g])
    return [tasks[i] for i in sorted(picked)]
