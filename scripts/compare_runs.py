r"""
Two results/ trees compared file by file, but for wall-clock fields and paths: what a change that must not
change behaviour (a refactor) is checked with.

    python scripts/compare_runs.py results-before/smoke results/smoke
    python scripts/compare_runs.py A B --loss-rtol 1e-4    # the SFT loss: float sums in another order

Compared: every metrics.jsonl, summary.json, evals/*.json (stats and per-task scores), and each archive's
summary.jsonl, frontier.json and candidates/*/scores.json and harness.py. Ignored: keys that hold times or
paths (seconds, *_s, time, copied_from, final_harness, winner, harness paths, the seed's "copied from"),
and the reuse keys (their format is the code's). Exit status 1 when anything
differs, each difference one line.
"""
import argparse
import json
import math
import sys
from pathlib import Path

IGNORED = {"seconds", "time", "copied_from", "test_seconds", "sample_s", "train_s", "harness", "winner",
           "final_harness", "path", "key"}  # key: what reuse compares, its format is the code's
PATTERNS = ("metrics.jsonl", "summary.json", "evals/*.json", "harness_w*/summary.jsonl",
            "harness_w*/frontier.json", "harness_w*/candidates/*/scores.json",
            "harness_w*/candidates/*/harness.py", "weights/metrics.jsonl")


def rows(path):
    if path.suffix == ".py":
        return [path.read_text()]
    text = path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" \
        else [json.loads(text)]


def differences(a, b, where, loss_rtol):
    """The places where a and b differ, ignoring IGNORED keys; `loss` within loss_rtol."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = (set(a) | set(b)) - IGNORED
        return [d for k in sorted(keys, key=str)
                for d in differences(a.get(k), b.get(k), f"{where}.{k}", loss_rtol)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]", loss_rtol)]
    if isinstance(a, str) and isinstance(b, str) and a.startswith("copied from ") and b.startswith("copied from "):
        return []  # the seed's meta names the checkout it was copied from
    if where.endswith(".loss") and isinstance(a, float) and isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=loss_rtol) else [f"{where}: {a} != {b}"]
    return [] if a == b else [f"{where}: {str(a)[:80]} != {str(b)[:80]}"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--loss-rtol", type=float, default=1e-4, help="relative tolerance on SFT losses")
    args = p.parse_args()
    a, b = Path(args.a), Path(args.b)
    names = lambda root: {str(f.relative_to(root)) for pat in PATTERNS for f in root.glob(f"**/{pat}")}
    only = names(a) ^ names(b)
    found = [f"only in {args.a if n in names(a) else args.b}: {n}" for n in sorted(only)]
    both = sorted(names(a) & names(b))
    for name in both:
        found += differences(rows(a / name), rows(b / name), name, args.loss_rtol)
    print("\n".join(found) if found else f"{len(both)} files the same (but for times and paths)")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
