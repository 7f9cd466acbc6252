"""docs/fidelity.md from docs/fidelity.json, so the page and the table cannot disagree: the table's prose (header,
the settings checked twice, the deviations, footer) and a generated table of every row, with the count of rows
official and stated. tests/test_fidelity.py fails when the committed page is not this script's output.

    python scripts/fidelity_doc.py           # writes docs/fidelity.md
    python scripts/fidelity_doc.py --check   # exit 1 when docs/fidelity.md is not what the table makes
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE, PAGE = ROOT / "docs" / "fidelity.json", ROOT / "docs" / "fidelity.md"
DOMAINS = ("searchqa", "math", "chess")
WHALE = "krafton-ai/WHALE"


def counts(rows):
    """The closing sentence of the count: every row is official or stated (a row with neither fails the test)."""
    official = sum(r["status"] == "official" for r in rows)
    stated = sum(r["status"] == "stated" for r in rows)
    return (f"The table holds {len(rows)} rows: {official} official, {stated} stated, "
            f"{len(rows) - official - stated} unstated.")


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def value(v):
    """A value as the page shows it: one per domain where the row differs by domain."""
    if isinstance(v, dict) and v and set(v) <= set(DOMAINS):
        return "; ".join(f"{d}: {value(x)}" for d, x in v.items())
    return "`" + json.dumps(v, ensure_ascii=False) + "`"


def source(s):
    repo = "" if s.get("repo", WHALE) == WHALE else s["repo"] + " "
    return f"{repo}{s.get('file')}@{s.get('commit', '')[:7]}:{s.get('line')}"


def reason(row, deviations):
    if row["status"] == "official":
        return "official" + (f": {row['note']}" if row.get("note") else "")
    text = row["reason"]
    if row.get("doc") and deviations.get(row["doc"]) == text:
        text = f"as \"{row['doc']}\" above"
    return "stated: " + text + (f" ({row['note']})" if row.get("note") else "")


def setting_rows(table):
    deviations = {d["setting"]: d["why"] for d in table["deviations"]}
    lines = ["| setting | where | ours | official | source | status |", "|---|---|---|---|---|---|"]
    for r in table["settings"]:
        covers = f" (and {', '.join(r['covers'])})" if r.get("covers") else ""
        lines.append(f"| {cell(r['setting'] + covers)} | {r['where']} | {cell(value(r['ours']))} | "
                     f"{cell(value(r['official']))} | {cell(', '.join(map(source, r['source'])) or '-')} | "
                     f"{cell(reason(r, deviations))} |")
    return lines


def render(table):
    """The page: header (its count line filled in), the settings checked twice, the deviations, every row, the
    constants that change no result, footer."""
    rows = table["settings"]
    out = [line.replace("{count}", counts(rows)) for line in table["header"]]
    out += ["| # | setting | official (file) | ours (paper, gpu) |", "|---|---|---|---|"]
    out += [f"| {c['n']} | {c['setting']} | {c['official']} | {c['ours']} |" for c in table["checked"]]
    out += ["", "## The paper preset: deviations, and why", "| setting | here | official | why |", "|---|---|---|---|"]
    out += [f"| {d['setting']} | {d['here']} | {d['official']} | {d['why']} |" for d in table["deviations"]]
    out += ["", "## Every setting of a paper run", "",
            "Generated from [fidelity.json](fidelity.json) (`python scripts/fidelity_doc.py`). where: `config`, a key "
            "of the config.json a `--preset paper` run writes (the same in every domain unless shown per domain); "
            "`constant`, a module constant (`module:NAME`); `code`, a rule `tests/test_fidelity.py` reads off the "
            "code. A source is the official file at its commit and line (krafton-ai/WHALE unless another repository "
            "is named). " + counts(rows), ""]
    out += setting_rows(table)
    out += ["", "## Constants that change no result", "",
            "Every other upper-case constant of the run's modules (`tests/test_fidelity.py` lists them from the "
            "code), and why it cannot change a result (`module.*`: a whole package; `module:*`: a whole module). "
            "The h0 files' constants (harnesses/paper/) are the `harness` row's: each file is the port of the official h0 "
            "(settings 2 and 11), and a candidate may change them.", "",
            "| constant | why no result |", "|---|---|"]
    out += [f"| {cell(name)} | {cell(why)} |" for name, why in table["result_free"].items()]
    out += [""] + table["footer"]
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description="write docs/fidelity.md from docs/fidelity.json")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the page is not the table's")
    args = parser.parse_args(argv)
    table = json.loads(TABLE.read_text())
    text = render(table)
    if args.check:
        if PAGE.read_text() != text:
            print("docs/fidelity.md is not what docs/fidelity.json makes: run python scripts/fidelity_doc.py",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}: {counts(table['settings'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
