"""The claims section (lib/report/claims.py) and the alternation figure (lib/report/plots.py) on a hand-made run folder
where every verdict is known: searchqa, where WHALE wins and harness search alone suffices, and math, where WHALE is
level with weight-only, harness-only never catches up, and only the search after a weight phase finds a better
harness."""
import json

import matplotlib.axes

import report
from lib.report import claims, intervals, plots
from lib.report.intervals import signed

TASKS = [f"t{i}" for i in range(8)]


def const(value):
    return {t: value for t in TASKS}


def halves(low, high):
    """Half the test tasks at `low`, half at `high`."""
    return {t: low if i % 2 else high for i, t in enumerate(TASKS)}


def write_run(root, domain, method, phases, steps=(), archives=None):
    """A run folder as whale.py leaves it. phases: (kind, rollouts, per-task test scores or None: not tested,
    detail) after the start, tested with h0 = 0 everywhere; steps: (step, training rollouts, reward);
    archives: {name: {candidate: (iteration, {harness task: reward})}}."""
    folder = root / domain / method
    (folder / "evals").mkdir(parents=True)
    (folder / "weights").mkdir()
    rows = []
    for phase, (kind, rollouts, per_task, detail) in enumerate([("start", 0, const(0.0), {})] + list(phases)):
        mean = None if per_task is None else sum(per_task.values()) / len(per_task)
        rows.append({"event": "eval", "phase": phase, "kind": kind, "rollouts": rollouts, "mean_at_k": mean,
                     **detail})
        if per_task is not None:
            (folder / "evals" / f"phase_{phase}.json").write_text(json.dumps({"per_task": per_task}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "weights" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "rollouts": n, "reward": r, "accept_rate": r, "examples": 1}) + "\n"
        for s, n, r in steps))
    for name, candidates in (archives or {}).items():
        write_archive(folder / name, candidates)
    tested = [r for r in rows if r["mean_at_k"] is not None]
    best = max(tested, key=lambda r: (r["mean_at_k"], -r["rollouts"]))
    (folder / "summary.json").write_text(json.dumps({
        "k": 2, "best_phase": best["phase"], "best_mean_at_k": best["mean_at_k"],
        "rollouts_to_best": best["rollouts"], "final_mean_at_k": tested[-1]["mean_at_k"]}))


def write_archive(archive, candidates):
    """summary.jsonl, frontier.json and each candidate's traces (one episode per harness task, 5 rollouts a
    candidate)."""
    rows = []
    for name, (iteration, rewards) in candidates.items():
        (archive / "candidates" / name).mkdir(parents=True)
        (archive / "candidates" / name / "traces.jsonl").write_text("".join(
            json.dumps({"task_id": t, "sample": 0, "reward": r}) + "\n" for t, r in rewards.items()))
        rows.append({"name": name, "iteration": iteration, "parent": None if name == "h0" else "h0",
                     "valid": True, "score": sum(rewards.values()) / len(rewards), "rollouts": 5,
                     "changed": "A: 0 -> 1"})
    best = max(rows, key=lambda r: r["score"])  # h0 first: it wins ties
    (archive / "summary.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (archive / "frontier.json").write_text(json.dumps({
        "best": best["name"], "score": best["score"], "lineage": ["h0", best["name"]][:1 + (best["name"] != "h0")],
        "best_series": [rows[0]["score"], best["score"]]}))


HARNESS_TASKS = [f"h{i}" for i in range(8)]
NOTHING = {t: 0.0 for t in HARNESS_TASKS}
EVERYTHING = {t: 1.0 for t in HARNESS_TASKS}


def weight_phases(final, rollouts=200):
    """Two weight phases of two RSFT steps (50 rollouts each), tested after the last."""
    return [("weight", rollouts // 2, None, {"step": 2}), ("weight", rollouts, final, {"step": 4})]


def alternation(final, rollouts, archive_scores, mid=None):
    """WHALE: weight (2 steps), harness (1 round, 10 rollouts), weight (2 steps); an archive of h0 and one round."""
    phases = [("weight", 100, mid, {"step": 2}),
              ("harness", 110, None, {"step": 2, "rounds": 1, "archive": "harness_w1"}),
              ("weight", rollouts, final, {"step": 4})]
    steps = [(1, 50, 0.1), (2, 100, 0.2), (3, 150, 0.3), (4, 200, 0.4)]
    return phases, steps, {"harness_w1": {"h0": (0, NOTHING), "h1_1": (1, archive_scores)}}


def make_runs(root):
    steps = [(1, 50, 0.1), (2, 100, 0.2), (3, 150, 0.3), (4, 200, 0.4)]
    # searchqa: harness-only reaches weight-only's 0.5 at 100 rollouts (weight-only spends 200) and its search
    # beats h0 under the base weights; WHALE ends at 0.9, above every baseline
    write_run(root, "searchqa", "weight-only", weight_phases(const(0.5)), steps)
    write_run(root, "searchqa", "harness-only", [("harness", 100, const(0.5), {"rounds": 1,
                                                                               "archive": "harness_w0"})],
              archives={"harness_w0": {"h0": (0, NOTHING), "h1_1": (1, EVERYTHING)}})
    write_run(root, "searchqa", "fast-slow", weight_phases(const(0.5)), steps)
    write_run(root, "searchqa", "stagewise", weight_phases(const(0.5)), steps)
    write_run(root, "searchqa", "whale", *alternation(const(0.9), 200, NOTHING))
    write_run(root, "searchqa", "whale-adaptive", *alternation(const(0.25), 200, NOTHING))
    # math: WHALE (0.75 on half the tasks, 0.25 on the others) is level with weight-only (0.5), ahead of
    # harness-only (0.25, never reaching weight-only) and stagewise (0.25) but spends more rollouts than
    # stagewise; fast-slow did not run; only WHALE's search (after a weight phase) beats its h0
    write_run(root, "math", "weight-only", weight_phases(const(0.5)), steps)
    write_run(root, "math", "harness-only", [("harness", 100, const(0.25), {"rounds": 1,
                                                                            "archive": "harness_w0"})],
              archives={"harness_w0": {"h0": (0, NOTHING), "h1_1": (1, NOTHING)}})
    write_run(root, "math", "stagewise", weight_phases(const(0.25)), steps)
    write_run(root, "math", "whale", *alternation(halves(0.25, 0.75), 300, EVERYTHING))
    return report.load_runs(str(root))


def paragraphs(section):
    """{claim's tag, e.g. '(i)' or '(i) whale-adaptive': (its verdict, its table rows by first two cells)}."""
    found, tag = {}, None
    for line in section:
        if line.startswith("**("):
            name = line[3:].split(")")[0]
            tag = f"({name})" + (" whale-adaptive" if "whale-adaptive" in line.split("**")[1] else "")
            found[tag] = (line.split("Verdict: **")[1].split("**")[0], {})
        elif tag and line.startswith("| ") and not line.startswith("| domain"):
            cells = line.strip("| ").split(" | ")
            found[tag][1].setdefault((cells[0], cells[1]), cells)
    return found


def test_each_claim_gets_the_verdict_its_runs_imply(tmp_path):
    section = claims.claims_section(make_runs(tmp_path))
    found = paragraphs(section)
    assert "Computed on seed 0," in section[2]
    # (i): searchqa holds (+40 points over weight-only, harness-only and fast-slow, every task); math cannot tell
    # (level with weight-only, fast-slow not run); adaptive WHALE is below every baseline in searchqa
    verdict, rows = found["(i)"]
    assert verdict == claims.UNSURE
    assert rows["searchqa", "+40.0 [+40.0, +40.0]"][-1] == claims.HOLDS
    math = next(cells for key, cells in rows.items() if key[0] == "math")
    ahead = intervals.paired_difference(halves(0.25, 0.75), const(0.25))  # +0.5 on half the tasks
    assert ahead[1] > 0 and math[2] == signed(ahead) and math[3] == "not run" and math[-1] == claims.UNSURE
    assert math[1].startswith("+0.0 [-") and not math[1].endswith(", +0.0]")  # straddles 0
    assert found["(i) whale-adaptive"][0] == claims.FAILS
    # (ii): harness-only reached weight-only's score at 100 of weight-only's 200 rollouts in searchqa (holds);
    # in math it never did and stays below (does not hold, for reference); math's search beat its start only
    # after a weight phase (holds), searchqa's already under the base weights (does not hold, for reference)
    verdict, rows = found["(ii)"]
    assert verdict == claims.HOLDS
    assert rows["searchqa", "0"][5:] == ["at 100 rollouts", claims.HOLDS]
    assert rows["math", "0"][4:] == ["-25.0 [-25.0, -25.0]", "never", claims.FAILS]
    search = [line for line in section if line.startswith("| math | 0 | 0.00, none better")]
    assert search == ["| math | 0 | 0.00, none better | whale harness_w1: 0.00 -> 1.00 (+1.00 [+1.00, +1.00]) | "
                      "holds |"]
    assert any(line.startswith("| searchqa | 0 | 0.00 -> 1.00 (+1.00 [+1.00, +1.00]) |")
               and line.endswith(f"| {claims.FAILS} |") for line in section)
    # (iii): searchqa holds (+40, the same 200 rollouts); math is ahead in accuracy, but with 300 rollouts
    # against stagewise's 200: the claim as a whole does not hold
    verdict, rows = found["(iii)"]
    assert verdict == claims.FAILS
    assert rows["searchqa", "whale - stagewise"][2:] == ["+40.0 [+40.0, +40.0]", "200 / 200", "200", claims.HOLDS]
    assert rows["math", "whale - stagewise"][3:] == ["300 / 200", "300", claims.FAILS + " (more rollouts)"]
    assert found["(iii) whale-adaptive"][0] == claims.FAILS


def test_the_report_carries_the_claims_and_the_alternation_figures(tmp_path, monkeypatch):
    runs = make_runs(tmp_path)
    assert "## The paper's three claims, one by one" in report.make_table(runs, "cpu")
    # every RSFT step and every harness round lands on the rollout axis: WHALE's steps 3 and 4 come after its
    # harness phase (110 rollouts), so at 110 + 50 and 110 + 100; its round 0 re-scores h0 (5 rollouts)
    whale = runs["math", "whale"][0]
    assert plots.step_points(whale) == [[(50, 0.1), (100, 0.2)], [(160, 0.3), (210, 0.4)]]
    assert plots.round_points(whale) == [[(105, 0.0, [0.0]), (110, 1.0, [1.0])]]
    spans = []
    monkeypatch.setattr(matplotlib.axes.Axes, "axvspan", lambda ax, a, b, **kw: spans.append((a, b, kw["color"])))
    names = report.write_alternation(runs, str(tmp_path))
    assert names == ["alternation-searchqa.png", "alternation-math.png"]
    assert all((tmp_path / name).stat().st_size > 0 for name in names)
    assert (100, 110, "tab:orange") in spans and (110, 300, "tab:blue") in spans  # math's whale, both kinds
    # the timeline draws the harness phase that --test-evals ends left untested
    spans.clear()
    report.plot_timeline(runs, str(tmp_path / "timeline.png"))
    assert (100, 110, "tab:orange") in spans


def test_runs_scored_alike_on_every_task_cannot_tell_a_claim():
    """+0.0 [+0.0, +0.0]: the runs compared score every test task alike (runs that did not learn), which refutes
    nothing: the verdict is that it cannot be told, never that the claim does not hold."""
    from lib.report.claims import ALIKE, FAILS, HOLDS, UNSURE, combined, verdict_of
    assert verdict_of((0.0, 0.0, 0.0, 50)) == ALIKE and ALIKE.startswith("cannot be told")
    assert combined([ALIKE, ALIKE]) == ALIKE and combined([ALIKE, HOLDS]) == UNSURE
    assert verdict_of((-1.0, -2.0, -0.5, 50)) == FAILS and combined([ALIKE, FAILS]) == FAILS
