"""report.py: the bootstrap statistics on inputs with known answers, and the tables and bands built from
result folders laid out as whale.py writes them."""
import json

import matplotlib.axes
import pytest

import report


def test_a_constant_vector_has_a_zero_width_interval():
    assert report.bootstrap_ci([0.25] * 40) == pytest.approx((0.25, 0.25, 0.25))
    assert report.bootstrap_ci([1.0]) == (1.0, 1.0, 1.0)


def test_two_values_match_a_hand_computation():
    # [0, 1]: a resample's mean is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4, so the 2.5 % and 97.5 %
    # quantiles are 0 and 1
    assert report.bootstrap_ci([0.0, 1.0]) == pytest.approx((0.5, 0.0, 1.0))
    # 50 zeros and 50 ones: the mean of 100 resampled tasks has sd sqrt(0.25 / 100) = 0.05, so the interval
    # is about 0.5 -/+ 1.96 x 0.05
    mean, low, high = report.bootstrap_ci([0.0] * 50 + [1.0] * 50)
    assert mean == 0.5 and low == pytest.approx(0.402, abs=0.02) and high == pytest.approx(0.598, abs=0.02)


def test_the_bootstrap_is_seeded():
    values = [0.0, 0.5, 1.0, 1.0, 0.25, 0.0, 0.75]
    assert report.bootstrap_ci(values) == report.bootstrap_ci(values)
    assert report.bootstrap_ci(values, seed=1) != report.bootstrap_ci(values, seed=2)
    with pytest.raises(ValueError, match="no values"):
        report.bootstrap_ci([])


def test_paired_difference_on_the_same_tasks():
    a = {"t1": 0.0, "t2": 0.5, "t3": 1.0, "t4": 0.25}
    assert report.paired_difference(a, dict(a)) == (0.0, 0.0, 0.0, 4)  # identical runs: 0, zero width
    shifted = {t: v + 0.25 for t, v in a.items()}
    assert report.paired_difference(shifted, a) == pytest.approx((0.25, 0.25, 0.25, 4))
    # only tasks both scored count; the spread between tasks cancels, unlike two separate intervals
    mean, low, high, n = report.paired_difference({**shifted, "extra": 1.0}, a)
    assert n == 4 and low == high == pytest.approx(0.25)
    assert report.bootstrap_ci(list(a.values()))[1] < report.bootstrap_ci(list(a.values()))[2]


def write_run(root, domain, method, per_phase, k=2):
    """A run folder as whale.py leaves it: metrics.jsonl, evals/phase_<n>.json with per-task scores, summary."""
    folder = root / domain / method
    (folder / "evals").mkdir(parents=True)
    rows = []
    for phase, per_task in enumerate(per_phase):
        mean = sum(per_task.values()) / len(per_task)
        rows.append({"event": "eval", "phase": phase, "kind": "start" if phase == 0 else "weight",
                     "rollouts": 100 * phase, "mean_at_k": mean, "test_tasks": len(per_task)})
        (folder / "evals" / f"phase_{phase}.json").write_text(json.dumps({"stats": {"mean_at_k": mean},
                                                                          "per_task": per_task}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    best = max(rows, key=lambda r: (r["mean_at_k"], -r["rollouts"]))
    (folder / "summary.json").write_text(json.dumps({"k": k, "best_phase": best["phase"], "best_mean_at_k": best["mean_at_k"],
                                                     "rollouts_to_best": best["rollouts"],
                                                     "final_mean_at_k": rows[-1]["mean_at_k"]}))


def test_tables_and_bands_come_from_the_per_task_scores(tmp_path, monkeypatch):
    tasks = [f"t{i}" for i in range(8)]
    h0 = {t: 0.0 for t in tasks}
    write_run(tmp_path, "math", "weight-only", [h0, {t: 0.5 for t in tasks}])
    write_run(tmp_path, "math", "harness-only", [h0, {t: 0.25 for t in tasks}])
    whale_final = {t: 1.0 if i < 6 else 0.5 for i, t in enumerate(tasks)}
    write_run(tmp_path, "math", "whale", [h0, {t: 0.75 for t in tasks}, whale_final])
    runs = report.load_runs(str(tmp_path))
    table = report.make_table(runs, "cpu")
    _, whale_low, whale_high = report.bootstrap_ci(list(whale_final.values()))
    assert f"| whale | not run | 87.5 [{100 * whale_low:.1f}, 100.0] @ 200; final 87.5 [{100 * whale_low:.1f}, 100.0] " \
           "| not run |" in table
    assert 70 < 100 * whale_low < 80 and whale_high == 1.0
    assert "| weight-only | not run | 50.0 [50.0, 50.0] @ 100; final 50.0 [50.0, 50.0] | not run |" in table
    # the baseline is weight-only (final 50 > 25); the difference per task is 0.5 or 0, mean 0.375
    row = next(line for line in table.splitlines() if line.startswith("| math | whale - weight-only"))
    mean, low, high, n = report.paired_difference(whale_final, {t: 0.5 for t in tasks})
    assert mean == 0.375 and n == 8
    assert row == f"| math | whale - weight-only | +37.5 [{100 * low:+.1f}, {100 * high:+.1f}] | " \
                  f"+37.5 [{100 * low:+.1f}, {100 * high:+.1f}] | 8 |"

    bands = []
    monkeypatch.setattr(matplotlib.axes.Axes, "fill_between", lambda ax, x, low, high, **kw: bands.append((x, low, high)))
    report.plot_curves(runs, str(tmp_path / "curves.png"))
    assert (tmp_path / "curves.png").stat().st_size > 0
    whale_band = next(b for b in bands if b[0] == [0, 100, 200])
    assert whale_band[1][:2] == [0.0, 75.0] and whale_band[2][:2] == [0.0, 75.0]  # constant phases: zero width
    assert whale_band[1][2] == pytest.approx(100 * whale_low) and whale_band[2][2] == pytest.approx(100.0)


def test_runs_without_per_task_scores_still_report(tmp_path):
    write_run(tmp_path, "searchqa", "whale", [{"a": 0.0}, {"a": 1.0}])
    (tmp_path / "searchqa" / "whale" / "evals" / "phase_1.json").write_text(json.dumps({"stats": {}}))  # older whale.py
    table = report.make_table(report.load_runs(str(tmp_path)), "smoke")
    assert "| whale | 100.0 @ 100; final 100.0 | not run | not run |" in table
    assert "Not enough finished runs" in table


def test_what_moved_sums_rsft_and_traces_each_search(tmp_path):
    write_run(tmp_path, "searchqa", "whale", [{"t1": 0.0, "t2": 0.0}, {"t1": 0.5, "t2": 0.5}])
    folder = tmp_path / "searchqa" / "whale"
    (folder / "weights").mkdir()
    (folder / "weights" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 1, "reward": 0.0, "examples": 0}, {"step": 2, "reward": 0.25, "examples": 3},
        {"step": 3, "reward": 0.5, "examples": 5}]))
    archive = folder / "harness_w1"
    archive.mkdir()
    (archive / "frontier.json").write_text(json.dumps({"best_series": [0.0, 0.125, 0.25], "lineage": ["h0", "h1_2", "h2_1"]}))
    (archive / "summary.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"name": "h0", "parent": None, "changed": "copied"}, {"name": "h1_2", "parent": "h0", "changed": "A: 0 -> 1"},
        {"name": "h2_1", "parent": "h1_2", "changed": "B: 0 -> 1"}]))
    table = "\n".join(report.mechanism_table(report.load_runs(tmp_path)))
    assert "| searchqa | whale | 3 | 8 | 0.00 -> 0.50 | harness_w1: 0.00, 0.12, 0.25 " \
           "(h0 -> h1_2 [A: 1] -> h2_1 [B: 1]) |" in table
    long = {"changed": "A: 0 -> 1; EXAMPLES: [] -> " + repr([["Where was Ann Vo born?", "Ann Vo was born in Tarsk."]])}
    assert report.trajectory({"lineage": ["h0", "h1"]}, {"h0": {}, "h1": {**long, "parent": "h0"}}) == \
        "h0 -> h1 [A: 1; EXAMPLES: [['Where was Ann Vo born?', 'Ann Vo w...]"
    # a value holding "; ", and a proposer's free text (no "->", a "|" that would break the table row)
    odd = {"h1": {"changed": "USER_TEMPLATE: 'Q' -> 'a; b'; MAX_TURNS: 2 -> 3", "parent": "h0"},
           "h2": {"changed": "rewrote the parser | kept the prompt", "parent": "h1"}}
    assert report.trajectory({"lineage": ["h0", "h1", "h2"]}, odd) == \
        "h0 -> h1 [USER_TEMPLATE: 'a; b'; MAX_TURNS: 3] -> h2 [rewrote the parser   kept the prompt]"


def test_a_running_cell_counts_the_phases_done():
    assert report.cell({"summary": None, "evals": []}) == "running (0 phases done)"  # not even the start eval
    assert report.cell({"summary": None, "evals": [{}, {}, {}]}) == "running (2 phases done)"
