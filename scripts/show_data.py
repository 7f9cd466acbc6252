"""
The bundled domains at a glance: every split's size, and tasks as a harness sees them, then the gold.

    python scripts/show_data.py stats                          # every split's size per domain
    python scripts/show_data.py show chess --split test -n 3   # tasks, then the gold answer
    python scripts/show_data.py show searchqa --data paper     # the paper's sets (add_args' flags)
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from domains import DOMAINS, MATH_TEST_SETS, SPLITS, add_args, data_of, get, read_jsonl  # noqa: E402
from lib.cli import Parser, one_line_errors  # noqa: E402
from lib.common.argtypes import positive_int  # noqa: E402
from lib.subsets import seeded_sample  # noqa: E402


def print_stats():
    print(f"{'domain':10s} {'train':>7s} {'harness':>8s} {'test':>6s}")
    for name in DOMAINS:
        d = get(name)
        print(f"{name:10s} " + " ".join(f"{len(d.load(s)):>{w}d}"
                                        for s, w in zip(SPLITS, (7, 8, 6))))
    generated = read_jsonl(MATH_TEST_SETS["generated"])
    print(f"math test, --math-test-set generated: {len(generated)} problems")
    docs = read_jsonl("searchqa_corpus.jsonl")
    print(f"searchqa corpus: {len(docs)} documents")


def show(name, split, n, data=None):
    d = get(name, data)
    for task in seeded_sample(d.load(split), n):
        print(f"--- {name}/{split} {task['id']}")
        for key, value in d.public(task).items():
            text = value if isinstance(value, str) else json.dumps(value)
            print(f"{key}:\n{text}" if "\n" in text else f"{key}: {text}")
        print(f"gold: {d.gold(task)}")


def main(argv=None):
    parser = Parser(description="Inspect the bundled domains.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("stats", help="every split's size per domain")
    p = sub.add_parser("show", help="tasks as a harness sees them, then the gold answer")
    p.add_argument("domain")
    p.add_argument("--split", default="test")
    p.add_argument("-n", type=positive_int, default=3)
    add_args(p)  # `show DOMAIN --data paper` reads the paper's sets
    args = parser.parse_args(argv)
    with one_line_errors("show_data.py"):
        if args.command == "stats":
            print_stats()
        else:
            show(args.domain, args.split, args.n, data_of(args))


if __name__ == "__main__":
    main()
