"""The Meta-Harness archive as files, read and appended to by both the search and its proposers: one row per
candidate folder (candidates/<name>/meta.json and scores.json) and the proposer-call log (costs.jsonl).
The index built from them (summary.jsonl, frontier.json) is the search's own: meta_harness.write_index."""

from pathlib import Path

from lib.files import append_jsonl, read_json, read_jsonl


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
                     "hypothesis": meta.get("hypothesis", ""), "changed": meta.get("changed", "")})
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
