"""The offline `mutate` proposer: coordinate ascent over a harness's knobs (its top-level UPPER_CASE constants,
and SEARCH_SPACE, the values each may take), from the archive best. Trusted and deterministic, it writes
its candidates straight into the archive. The knob helpers read and rewrite a harness file on its syntax
tree, so a rewritten file differs from its parent only in that one assignment."""

import ast
import hashlib
import random
from collections import Counter
from pathlib import Path

from lib.archive import candidate_rows, log_cost
from lib.contract import normalized, static_check
from lib.failures import FAILURE_KINDS, failure_counts, kinds_by_frequency
from lib.proposers import finish, prepare
from lib.rules import rank


def propose_mutate(run_dir, names, rows, iteration, cfg):
    """Offline coordinate ascent over the SEARCH_SPACE knobs from the archive best, so improvements add up.
    Each candidate is the first of these that is new to the archive and that static_check accepts:
    1. compose: the best with every knob change that raised some candidate's score over its parent's and that
       the best lacks (per knob the change with the largest gain); while none has, every change that left a
       score equal (plateaus are crossed by combinations);
    2. step: the best with one knob set to another value: the knob least tried from that parent first and
       within it the least-tried value, so from each best every knob is tried once before any knob twice;
       ties in the search order (search_order: by default drawn from --seed, with --mutate-order listed
       SEARCH_SPACE's own order); when the best has no new step left, the next best's steps.
       With --mutate-order traces, among the knobs tried equally often from a parent, first those its harness
       file's SKILL declares for the failure kind most frequent in that parent's harness-set traces, then
       the next kind's (lib/failures.py; skill_focus), then the rest; within a kind the seeded order.
    Deterministic: a resumed run proposes the same."""
    cand_root = Path(run_dir) / "candidates"
    rows = rows + [r for r in candidate_rows(run_dir) if r["iteration"] == iteration and r["name"] not in names]
    sources = {r["name"]: (cand_root / r["name"] / "harness.py").read_text() for r in rows
               if (cand_root / r["name"] / "harness.py").exists()}
    changes = {r["name"]: knob_changes(sources[r["name"]], sources[r["parent"]]) for r in rows
               if r["name"] in sources and r["parent"] in sources}
    parents = {r["name"]: r["parent"] for r in rows}
    knob_tries = Counter((parents[n], knob) for n, change in changes.items() for knob in change)
    value_tries = Counter((parents[n], knob, repr(value)) for n, change in changes.items()
                          for knob, value in change.items())
    seen = {normalized(source) for source in sources.values()}
    ranked = rank(r for r in rows if r["name"] in sources)  # any scored one with a file, refused or not
    gains, improved = best_changes(rows, changes)
    seed_name = next(r["name"] for r in rows if r["parent"] is None)
    order = search_order(sources[seed_name], cfg.seed, cfg.mutate_order)
    # each ranked candidate's (skill focus, failure counts), from its harness-set traces (--mutate-order traces)
    traced = cfg.mutate_order == "traces"
    focus = {r["name"]: skill_focus(sources[r["name"]], cand_root / r["name"] / "traces.jsonl") if traced
             else ({}, Counter()) for r in ranked}
    for name in names:
        options = mutate_options(ranked, sources, gains, knob_tries, value_tries, order, focus)
        parent, source = next(((p, s) for p, s in options if normalized(s) not in seen
                               and static_check(s, sources[p], cfg.prompt_only) is None), (None, None))
        prepare(run_dir, [name], parent or ranked[0]["name"], iteration, "mutate")
        if parent is None:
            finish(run_dir, name, hypothesis="", changed="nothing: every knob value (that --prompt-only allows) "
                                                          "from every candidate is in the archive already")
            (cand_root / name / "harness.py").unlink()
            continue
        old, change = knob_values(sources[parent]), knob_changes(source, sources[parent])
        seen.add(normalized(source))
        knob_tries.update((parent, knob) for knob in change)
        value_tries.update((parent, knob, repr(value)) for knob, value in change.items())
        (cand_root / name / "harness.py").write_text(source)
        changed = "; ".join(f"{knob}: {old.get(knob)!r} -> {value!r}" for knob, value in change.items())
        what = "; ".join(f"{knob} = {value!r} instead of {old.get(knob)!r}" for knob, value in change.items())
        why = " (each of these raised a score on its own)" if improved else " (together: alone each left it equal)"
        finish(run_dir, name, parent=parent, changed=changed, hypothesis=f"{what} raises the harness-set score of "
               f"{parent}" + (why if len(change) > 1 else read_why(focus[parent], change)))
    log_cost(run_dir, {"iteration": iteration, "proposer": "mutate", "candidates": names, "seconds": 0.0})


def search_order(seed_source, seed, order="seeded"):
    """{(knob, repr(value)): rank}: the order in which ties between untried knob values are broken. "listed":
    SEARCH_SPACE's order, the harness author's priority. "seeded": the knobs, and each knob's values, shuffled
    by --seed, so no one chose the order the search finds things in. Drawn from the seed and the archive's
    seed harness (not the archive's folder name), so an archive copied into another run goes on in its order."""
    space = [(knob, list(values)) for knob, values in (knob_values(seed_source).get("SEARCH_SPACE") or {}).items()]
    if order == "seeded" or order == "traces":  # traces: the seeded order within each failure kind
        rng = random.Random(f"{seed}/{hashlib.sha256(seed_source.encode()).hexdigest()}")
        rng.shuffle(space)
        for _, values in space:
            rng.shuffle(values)
    elif order != "listed":
        raise ValueError(f"mutate: unknown search order {order!r}: choose seeded, listed or traces")
    return {(knob, repr(value)): i for i, (knob, value) in enumerate((k, v) for k, vs in space for v in vs)}


def skill_focus(source, traces_path):
    """({knob: the failure kind it is tried for}, failure counts) of one candidate: its harness-set traces sorted
    into failure kinds, and for each kind, most frequent first, the knobs its file's SKILL declares for it (a
    knob declared for several kinds goes with the most frequent). Reads only the archive's own traces."""
    counts = failure_counts(traces_path)
    skill = knob_values(source).get("SKILL")
    skill = skill if isinstance(skill, dict) else {}
    focus = {}
    for kind in kinds_by_frequency(counts):
        for knob in skill.get(kind, []):
            focus.setdefault(knob, kind)
    return focus, counts


def read_why(focus_counts, change):
    """The hypothesis's reason for a one-knob step chosen from the traces ("" when they did not choose it)."""
    focus, counts = focus_counts
    knob = next(iter(change))
    if knob not in focus:
        return ""
    kind = focus[knob]
    return (f": {sum(counts.values())} of its harness-set episodes failed, {counts[kind]} as {kind} "
            f"(lib/failures.py), and its SKILL lists {knob} for {kind}")


def mutate_options(ranked, sources, gains, knob_tries, value_tries, order, focus):
    """(parent, source) in mutate's order of preference: the best with all of `gains`, then one-knob steps from the best
    (the knob least tried from it, then the knobs for its most frequent failure kind (focus: {parent: skill_focus};
    none unless --mutate-order traces), then its least-tried value, ties in `order`), then from the next best..."""
    best = ranked[0]["name"]
    composed, knobs = sources[best], knob_values(sources[best])
    for knob, value in gains.items():
        composed = set_knob(composed, knob, value) if knob in knobs else composed
    yield best, composed
    for r in ranked:
        parent = r["name"]
        knob_kinds, counts = focus[parent]
        kinds = kinds_by_frequency(counts)
        kind_rank = lambda knob: kinds.index(knob_kinds[knob]) if knob in knob_kinds else len(FAILURE_KINDS)
        options = sorted(knob_options(sources[parent]),  # stable: a knob h0 lacks keeps its own listed place
                         key=lambda o: (knob_tries[parent, o[0]], kind_rank(o[0]), value_tries[parent, o[0], repr(o[2])],
                                        order.get((o[0], repr(o[2])), len(order))))
        for knob, _, value in options:
            yield parent, set_knob(sources[parent], knob, value)


def best_changes(rows, changes):
    """({knob: value}, improved): the knob changes that raised a candidate's score over its parent's, per knob
    the one with the largest gain (the earliest among equal gains), improved = True. While no change has
    raised a score, the changes that left it equal instead (improved = False): on a plateau (a small model
    scoring 0 under every single fix) knobs can pay only together."""
    scores = {r["name"]: r["score"] for r in rows if r["score"] is not None}
    gains, neutral = {}, {}
    for r in rows:
        if r["name"] in changes and r["name"] in scores and scores.get(r["parent"]) is not None:
            gain = scores[r["name"]] - scores[r["parent"]]
            for knob, value in changes[r["name"]].items():
                if gain > 0 and gain > gains.get(knob, (0, None))[0]:
                    gains[knob] = (gain, value)
                elif abs(gain) < 1e-12:
                    neutral.setdefault(knob, (0, value))
    return {knob: value for knob, (gain, value) in sorted((gains or neutral).items())}, bool(gains)


def knob_values(source):
    """{name: literal value (None if not a literal)} of a harness file's top-level assignments; {} if it
    does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                values[node.targets[0].id] = None
    return values


def knob_options(source):
    """(knob, current value, other value) for every SEARCH_SPACE entry of a harness file."""
    values = knob_values(source)
    space = values.get("SEARCH_SPACE") or {}
    return [(k, values[k], v) for k, vs in space.items() if k in values for v in vs if v != values[k]]


def knob_changes(source, parent_source):
    """{knob: value in source} for the SEARCH_SPACE knobs whose value differs from the parent's."""
    new, old = knob_values(source), knob_values(parent_source)
    space = {**(old.get("SEARCH_SPACE") or {}), **(new.get("SEARCH_SPACE") or {})}
    return {k: new[k] for k in space if k in new and k in old and new[k] != old[k]}


def set_knob(source, knob, value):
    """Rewrite the top-level `knob = ...` assignment (its exact span on the syntax tree) to `knob = value`."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and getattr(node.targets[0], "id", None) == knob:
            lines = source.splitlines(keepends=True)
            start, end = node.lineno - 1, node.end_lineno - 1
            head, tail = lines[start][:node.col_offset], lines[end][node.end_col_offset:]
            return "".join(lines[:start]) + f"{head}{knob} = {value!r}{tail}" + "".join(lines[end + 1:])
    raise ValueError(f"set_knob: no top-level assignment to {knob}; SEARCH_SPACE names a knob the file lacks")
