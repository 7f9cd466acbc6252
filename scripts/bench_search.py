"""
A Meta-Harness round's scoring: its M candidates scored one after another, a runner call each, against all M in
one runner call, their model calls in shared batches (meta_harness.judge, rollout.run_each). The candidates are
the domain's cpu h0 with one SEARCH_SPACE knob changed each, scored on the preset's harness tasks at its
sampling settings; the two sides alternate for --rounds rounds, so a shared machine's changing load hits both
alike. Prints each side's seconds, whether both gave the same episodes, and "speedup = X" (docs/cpu-run/README.md
quotes the measured figures).

    python scripts/bench_search.py --domain searchqa
    python scripts/bench_search.py --domain math --candidates 3 --rounds 2
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import domains  # noqa: E402
import presets  # noqa: E402
import rollout  # noqa: E402
from lib import sandbox  # noqa: E402
from lib.cli import Parser, positive_int  # noqa: E402
from lib.hf_backend import HFBackend  # noqa: E402
from lib.models import load_model  # noqa: E402
from lib.mutate import knob_options, set_knob  # noqa: E402
from lib.subsets import seeded_sample  # noqa: E402
from lib.worker_pool import POOL  # noqa: E402


def candidates(h0, m, folder):
    """m harness files: h0 with its first m knob changes (one each), as a mutate round writes them."""
    source = Path(h0).read_text()
    paths = []
    for i, (knob, _, value) in enumerate(knob_options(source)[:m]):
        path = Path(folder) / f"h1_{i + 1}.py"
        path.write_text(set_knob(source, knob, value))
        paths.append(str(path))
    return paths


def episodes_of(eps):
    return [(e["task_id"], e["sample"], e["answer"], e["reward"]) for e in eps]


def main():
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domain", default="searchqa", choices=["searchqa", "math"])
    p.add_argument("--candidates", type=positive_int, default=3, help="M: candidates a round")
    p.add_argument("--rounds", type=positive_int, default=2, help="alternating rounds of the two sides")
    sandbox.add_args(p)
    args = p.parse_args()
    sandbox.apply_args(args)
    cpu = presets.PRESETS["cpu"]
    domain = domains.get(args.domain, argparse.Namespace(**{k: v for k, v in cpu.items() if k.startswith("math_")}))
    tasks = seeded_sample(domain.load("harness"), cpu["harness_tasks"])
    torch.set_num_threads(cpu["threads"])
    model, tokenizer = load_model("cpu")
    backend = HFBackend(model, tokenizer)
    kw = dict(temperature=cpu["temperature"], top_k=20, max_new_tokens=cpu["max_new_tokens"],
              deadline_s=cpu["deadline"], seed=0)
    seconds, same = {"apart": 0.0, "together": 0.0}, True
    with tempfile.TemporaryDirectory() as tmp:
        paths = candidates(presets.CPU[args.domain]["harness"], args.candidates, tmp)
        POOL.warm(len(tasks) * len(paths))
        for r in range(args.rounds):
            start = time.time()
            apart = [rollout.run_episodes(domain, path, tasks, backend, desc=f"apart {Path(path).stem}", **kw)
                     for path in paths]
            seconds["apart"] += time.time() - start
            start = time.time()
            together = rollout.run_each(domain, paths, tasks, backend, desc="together", **kw)[0]
            seconds["together"] += time.time() - start
            same = same and [episodes_of(e) for e in apart] == [episodes_of(e) for e in together]
    print(f"{args.domain}: {len(paths)} candidates x {len(tasks)} harness tasks, {args.rounds} rounds: one after "
          f"another {seconds['apart']:.1f} s, together {seconds['together']:.1f} s; same episodes: {same}")
    print(f"speedup = {seconds['apart'] / seconds['together']:.2f}")


if __name__ == "__main__":
    main()
