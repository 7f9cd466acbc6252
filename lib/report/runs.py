"""The result folders whale.py writes, read back for report.py and its figures and claims (lib/report/plots.py,
lib/report/claims.py): every seed's <domain>/<method>/ runs, each with its test evaluations, RSFT steps, phases and
harness archives. It only reads."""
import os
import re

from lib.common.json_files import read_json, read_jsonl
from lib.methods import run_names


def seed_folders(root):
    """{seed: the folders that may hold its <domain>/<method>/ runs, first found first read}: root
    itself is seed 0 (whale.py's folder for --seed 0, and every run made before seeds),
    root/seed-<n>/ is seed n."""
    seeds = {0: [root]}
    for name in sorted(os.listdir(root)):
        match = re.fullmatch(r"seed-(\d+)", name)
        if match and os.path.isdir(os.path.join(root, name)):
            seeds.setdefault(int(match.group(1)), []).append(os.path.join(root, name))
    return dict(sorted(seeds.items()))


def load_runs(root, domains):
    """{(domain, method): {seed: run}} for every finished or running folder of the named domains (in that
    order), a run being {"summary": ..., "evals": [...], "phases": [...], "steps": [...], "archives": {...},
    "folder": ...}; each eval row carries its per-task scores ("per_task", None for runs made before whale.py
    stored them)."""
    runs = {}
    for seed, bases in seed_folders(root).items():
        for domain in domains:
            for method in run_names():  # the method table's (lib/methods.py)
                folder = next((f for f in (os.path.join(b, domain, method) for b in bases)
                               if os.path.exists(os.path.join(f, "metrics.jsonl"))), None)
                if folder is not None:
                    runs.setdefault((domain, method), {})[seed] = load_run(folder)
    return runs


def skipped_folders(root, runs, domains):
    """[(folder, why)] of the run folders under root, any seed (<domain>/<name>/ holding a config.json or a
    metrics.jsonl), that `runs` (load_runs(root, domains)) did not read, so that none is left out without a
    word: another domain's, a method name this module does not list, a run with no metrics.jsonl yet, or a
    second folder of a seed's run."""
    read = {run["folder"] for seed_runs in runs.values() for run in seed_runs.values()}
    skipped = []
    for seed, bases in seed_folders(root).items():
        for base in bases:
            for domain in sorted(os.listdir(base)):
                if not os.path.isdir(os.path.join(base, domain)) or re.fullmatch(r"seed-\d+", domain):
                    continue
                for name in sorted(os.listdir(os.path.join(base, domain))):
                    folder = os.path.join(base, domain, name)
                    if folder in read or not any(os.path.isfile(os.path.join(folder, f))
                                                 for f in ("config.json", "metrics.jsonl")):
                        continue
                    why = (f"{domain} is not a registered domain (domains.DOMAINS)" if domain not in domains
                           else f"{name} is not a run of a method in the method table (lib/methods.py)"
                           if name not in run_names() else
                           "no metrics.jsonl: the run wrote no phase yet"
                           if not os.path.isfile(os.path.join(folder, "metrics.jsonl"))
                           else f"seed {seed}'s {domain}/{name} was read from another folder")
                    skipped.append((folder, why))
    return skipped


def domains_of(runs):
    """The domains of `runs`, in the order they were loaded."""
    return list(dict.fromkeys(d for d, _ in runs))


def load_run(folder):
    phases = [r for r in read_jsonl(os.path.join(folder,
                                                 "metrics.jsonl")) if r.get("event") == "eval"]
    # phases --test-evals ends skipped: none
    evals = [r for r in phases if r.get("mean_at_k") is not None]
    for row in evals:
        scores = read_json(os.path.join(folder, "evals", f"phase_{row['phase']}.json"), {})
        row["per_task"], row["sources"] = scores.get("per_task"), scores.get("sources") or {}
    return {"summary": read_summary(folder, evals),
            "evals": evals,
            # every phase, tested or not: the figures draw the phases --test-evals ends leaves
            # without a test score
            "phases": phases,
            "steps": read_jsonl(os.path.join(folder, "weights", "metrics.jsonl")),
            "weight_phase_ends": [r["step"] for r in phases if r.get("kind") == "weight"
                                  and "step" in r],
            "archives": read_archives(folder),
            "folder": folder}


def read_summary(folder, evals):
    """A run's summary.json (None while it runs); a damaged one is an error naming it and the fix."""
    path = os.path.join(folder, "summary.json")
    fix = ("rerun the run's whale.py command (a finished run only writes its summary again), then "
           "report.py")
    try:
        summary = read_json(path, {})
    except ValueError:
        raise ValueError(f"damaged run file {path}: {fix}") from None
    keys = ("k", "best_phase", "best_mean_at_k", "rollouts_to_best", "final_mean_at_k")
    if summary != {} and not (isinstance(summary, dict) and all(k in summary for k in keys)
                              and summary["best_phase"] in {r["phase"] for r in evals}):
        raise ValueError(f"damaged run file {path} (not the summary of the phases in "
                         f"metrics.jsonl): {fix}")
    return summary or None


def read_archives(folder):
    """{archive name: (frontier.json, {candidate: its summary row})} of a run's harness searches."""
    names = sorted(n for n in os.listdir(folder) if re.fullmatch(r"harness_w\d+", n) and
                   os.path.exists(os.path.join(folder, n, "frontier.json")))
    return {n: (read_json(os.path.join(folder, n, "frontier.json"), {}),
                {r["name"]: r for r in read_jsonl(os.path.join(folder, n,
                                                               "summary.jsonl"))}) for n in names}


def finished(seed_runs):
    """{seed: run} of the runs that wrote their summary."""
    return {seed: run for seed, run in (seed_runs or {}).items() if run["summary"]}



BEST, FINAL = 0, 1  # the two points of a run, in the order points() gives them


def points(run):
    """(best, final) eval rows of a finished run: the summary's best phase and the last evaluation."""
    by_phase = {r["phase"]: r for r in run["evals"]}
    return by_phase[run["summary"]["best_phase"]], run["evals"][-1]



def paired_scores(ours, theirs, point):
    """(ours, theirs) per-task scores at `point` (FINAL or BEST) of two finished runs; None if either lacks them."""
    a, b = points(ours)[point], points(theirs)[point]
    return (a["per_task"], b["per_task"]) if a.get("per_task") and b.get("per_task") else None

