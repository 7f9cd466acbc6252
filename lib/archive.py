"""The Meta-Harness archive as files, read and appended to by both the search and its proposers: one row per
candidate folder (candidates/<name>/meta.json and scores.json) and the proposer-call log (costs.jsonl). The
candidate folders are its truth; the index (summary.jsonl, frontier.json) is rebuilt from them, by the search
as it goes (write_index).

    rows, frontier = write_index(run_dir, iterations)   # frontier["best"], ["score"], ["best_series"], ...
    best = pick_best(rows)                              # the winner (lib/rules.py: the one ranking rule)
"""
import os
import shutil
from pathlib import Path

from lib.common.json_files import (append_jsonl, damaged, json_object, read_json, read_jsonl, sha256, whole_jsonl,
                                   write_json, write_jsonl)
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



def restore_seed(run_dir, sources, fix):
    """The seed's harness.py copied back from the first of `sources` that holds its recorded content (the
    sha256 in its meta.json), exactly as add_seed copied it."""
    d = Path(run_dir) / "candidates" / "h0"
    sha = read_json(d / "meta.json").get("seed_sha256")
    source = next((s for s in sources if sha and os.path.isfile(s) and sha256(s) == sha), None)
    if source is None:
        raise ValueError(f"{d / 'harness.py'} is missing, and no harness at hand holds the seed it was: {fix}")
    shutil.copy(source, d / "harness.py")
    print(f"{d / 'harness.py'}: lost, copied back from {source} (the same content)")


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


def check_archive(run_dir, fix, iterations=None, candidates=None):
    """The archive as a whole, before a search resumes or a finished one is read: every valid candidate has its
    harness.py, every score its scores.json and all the traces it counted; given the iterations finished and
    the candidates per iteration, each of their candidates is there and judged. Raises naming the file and
    `fix`. -> whether the seed's harness.py is lost (restore_seed copies it back)."""
    run_dir = Path(run_dir)
    seed_lost = False
    for meta_path in sorted((run_dir / "candidates").glob("*/meta.json")):
        d, meta = meta_path.parent, json_object(meta_path, fix)
        if meta.get("valid") and not (d / "harness.py").is_file():
            if meta.get("proposer") != "seed":
                raise ValueError(f"{d / 'harness.py'} is missing, but {meta_path} says it is a valid candidate: {fix}")
            seed_lost = True
        if (d / "scores.json").exists():
            scores = json_object(d / "scores.json", fix, keys=("score", "mean_turns", "rollouts"))
            if not whole_jsonl(d / "traces.jsonl", scores["rollouts"]):
                raise damaged(d / "traces.jsonl", f"not the {scores['rollouts']} episodes of its score", fix)
    for it in range(iterations + 1 if iterations is not None else 0):
        for name in ["h0"] if it == 0 else [f"h{it}_{j}" for j in range(1, candidates + 1)]:
            d = run_dir / "candidates" / name
            meta = json_object(d / "meta.json", fix)
            if meta.get("valid") is None:
                raise damaged(d / "meta.json", f"iteration {it} is finished, but {name} was never judged", fix)
            if meta["valid"] and not (d / "scores.json").exists():
                raise ValueError(f"{d / 'scores.json'} is missing, but iteration {it} is finished: {fix}")
    return seed_lost
