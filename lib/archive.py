"""The Meta-Harness archive as files, read and appended to by both the search and its proposers: one row per
candidate folder (candidates/<name>/meta.json and scores.json) and the proposer-call log (costs.jsonl). The
candidate folders are its truth; the index (summary.jsonl, frontier.json) is rebuilt from them, by the search
as it goes (write_index).

    rows, frontier = write_index(run_dir, iterations)   # frontier["best"], ["score"], ["best_series"], ...
    best = pick_best(rows)                              # the winner (lib/rules.py: the one ranking rule)
"""
from pathlib import Path

from lib.common.json_files import append_jsonl, read_json, read_jsonl, write_json, write_jsonl
from lib.rules import pick_best


def candidate_rows(run_dir):
    """One row per proposed candidate, in the order they were made."""
    rows = []
    for d in sorted((Path(run_dir) / "candidates").glob("*/meta.json")):
        d = d.parent
        try:
            meta = read_json(d / "meta.json")
        except ValueError:  # a stray folder an agent wrote; ours are always valid JSON
            continue
        if not isinstance(meta, dict) or not meta.get("proposed") or "iteration" not in meta:
            continue
        scores = read_json(d / "scores.json", {})
        rows.append({"name": d.name, "iteration": meta["iteration"], "parent": meta.get("parent"),
                     "proposer": meta.get("proposer"), "valid": meta.get("valid"), "reason": meta.get("reason"),
                     "score": scores.get("score"), "mean_turns": scores.get("mean_turns"),
                     "tokens": scores.get("tokens"), "errors": scores.get("errors"),
                     "rollouts": scores.get("rollouts", 0) + meta.get("smoke_rollouts", 0),
                     "hypothesis": meta.get("hypothesis", ""), "axis": meta.get("axis", ""),
                     "changed": meta.get("changed", "")})
    return sorted(rows, key=lambda r: (r["iteration"], len(r["name"]), r["name"]))


def log_cost(run_dir, row):
    """One row per proposer call: seconds, tokens, dollars where reported, the error if it failed."""
    append_jsonl(Path(run_dir) / "costs.jsonl", row)


def proposer_costs(run_dir):
    """The proposer calls so far and their summed seconds, tokens and dollars."""
    path = Path(run_dir) / "costs.jsonl"
    rows = read_jsonl(path)
    keys = ("seconds", "prompt_tokens", "completion_tokens", "cost_usd")
    return {"calls": len(rows), **{k: round(sum(r.get(k) or 0 for r in rows), 4) for k in keys}}


def best_series_of(rows, iterations):
    """The archive-best score after iterations 0 (the seed) .. `iterations`."""
    return [pick_best([r for r in rows if r["iteration"] <= i])["score"] for i in range(iterations + 1)]


def lineage(rows, name):
    by_name, chain = {r["name"]: r for r in rows}, []
    while name in by_name and name not in chain:
        chain.append(name)
        name = by_name[name]["parent"]
    return chain[::-1]


def write_index(run_dir, iterations):
    """Rebuild summary.jsonl and frontier.json from the candidate folders (so resume stays consistent)."""
    rows, frontier = index_of(run_dir, iterations)
    write_jsonl(Path(run_dir) / "summary.jsonl", rows)  # atomic: a report reading a running search sees whole rows
    write_json(Path(run_dir) / "frontier.json", frontier)
    return rows, frontier


def index_of(run_dir, iterations):
    """(summary rows, frontier) of the archive as of `iterations`."""
    rows = candidate_rows(run_dir)
    done = [r for r in rows if r["iteration"] <= iterations]  # as of this iteration (resume replays)
    best = pick_best(done)
    frontier = {"best": best["name"], "score": best["score"], "mean_turns": best["mean_turns"],
                "harness": f"candidates/{best['name']}/harness.py", "lineage": lineage(rows, best["name"]),
                "iterations": iterations, "best_series": best_series_of(rows, iterations),
                "candidates": len(done), "valid": sum(bool(r["valid"]) for r in done),
                "rollouts": sum(r["rollouts"] for r in done),
                "proposer": proposer_costs(run_dir)}
    return rows, frontier
