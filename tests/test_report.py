"""report.py: the bootstrap statistics on inputs with known answers, and the tables and bands built from
result folders laid out as whale.py writes them."""
import json
import os
from pathlib import Path

import matplotlib.axes
import pytest

import report
from lib.report import intervals


def test_a_constant_vector_has_a_zero_width_interval():
    assert intervals.bootstrap_ci([0.25] * 40) == pytest.approx((0.25, 0.25, 0.25))
    assert intervals.bootstrap_ci([1.0]) == (1.0, 1.0, 1.0)


def test_two_values_match_a_hand_computation():
    # [0, 1]: a resample's mean is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4, so the 2.5 % and 97.5 %
    # quantiles are 0 and 1
    assert intervals.bootstrap_ci([0.0, 1.0]) == pytest.approx((0.5, 0.0, 1.0))
    # 50 zeros and 50 ones: the mean of 100 resampled tasks has sd sqrt(0.25 / 100) = 0.05, so the interval
    # is about 0.5 -/+ 1.96 x 0.05
    mean, low, high = intervals.bootstrap_ci([0.0] * 50 + [1.0] * 50)
    assert mean == 0.5 and low == pytest.approx(0.402, abs=0.02) and high == pytest.approx(0.598, abs=0.02)


def test_the_bootstrap_is_seeded():
    values = [0.0, 0.5, 1.0, 1.0, 0.25, 0.0, 0.75]
    assert intervals.bootstrap_ci(values) == intervals.bootstrap_ci(values)
    assert intervals.bootstrap_ci(values, seed=1) != intervals.bootstrap_ci(values, seed=2)
    with pytest.raises(ValueError, match="no values"):
        intervals.bootstrap_ci([])


def test_paired_difference_on_the_same_tasks():
    a = {"t1": 0.0, "t2": 0.5, "t3": 1.0, "t4": 0.25}
    assert intervals.paired_difference(a, dict(a)) == (0.0, 0.0, 0.0, 4)  # identical runs: 0, zero width
    shifted = {t: v + 0.25 for t, v in a.items()}
    assert intervals.paired_difference(shifted, a) == pytest.approx((0.25, 0.25, 0.25, 4))
    # only tasks both scored count; the spread between tasks cancels, unlike two separate intervals
    mean, low, high, n = intervals.paired_difference({**shifted, "extra": 1.0}, a)
    assert n == 4 and low == high == pytest.approx(0.25)
    assert intervals.bootstrap_ci(list(a.values()))[1] < intervals.bootstrap_ci(list(a.values()))[2]


def write_run(root, domain, method, per_phase, k=2):
    """A run folder as whale.py leaves it under root (results/<preset>/ for seed 0, its seed-<n>/ for seed n):
    metrics.jsonl, evals/phase_<n>.json with per-task scores, summary."""
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
    assert set(runs["math", "whale"]) == {0}  # the one-seed layout is seed 0
    table = report.make_table(runs, "cpu")
    _, whale_low, whale_high = intervals.bootstrap_ci(list(whale_final.values()))
    assert f"| whale | not run | final 87.5 [{100 * whale_low:.1f}, 100.0]; best 87.5 [{100 * whale_low:.1f}, 100.0] " \
           "@ 200 | not run |" in table
    assert 70 < 100 * whale_low < 80 and whale_high == 1.0
    assert "| weight-only | not run | final 50.0 [50.0, 50.0]; best 50.0 [50.0, 50.0] @ 100 | not run |" in table
    assert "One seed" in table and "## Final test mean@2 per seed" not in table
    # the baselines are named and fixed (harness-only, weight-only, stagewise-hw: each where it ran), never the
    # better of the single-axis methods
    assert "| math | whale - weight-only | 0 |" in table and "whale - stagewise-hw" not in table
    row = next(line for line in table.splitlines() if line.startswith("| math | whale - harness-only"))
    mean, low, high, n = intervals.paired_difference(whale_final, {t: 0.25 for t in tasks})
    assert mean == 0.625 and n == 8
    assert row == f"| math | whale - harness-only | 0 | +62.5 [{100 * low:+.1f}, {100 * high:+.1f}] | " \
                  f"+62.5 [{100 * low:+.1f}, {100 * high:+.1f}] | 8 |"
    assert "pooled (" not in table  # one seed: its row is the pooled one

    bands = []
    monkeypatch.setattr(matplotlib.axes.Axes, "fill_between", lambda ax, x, low, high, **kw: bands.append((x, low, high)))
    report.plot_curves(runs, str(tmp_path / "curves.png"), report.columns(runs), report.run_names())
    assert (tmp_path / "curves.png").stat().st_size > 0
    whale_band = next(b for b in bands if b[0] == [0, 100, 200])
    assert whale_band[1][:2] == [0.0, 75.0] and whale_band[2][:2] == [0.0, 75.0]  # constant phases: zero width
    assert whale_band[1][2] == pytest.approx(100 * whale_low) and whale_band[2][2] == pytest.approx(100.0)
    report.plot_timeline(runs, str(tmp_path / "timeline.png"))
    assert (tmp_path / "timeline.png").stat().st_size > 0


def test_runs_without_per_task_scores_still_report(tmp_path):
    write_run(tmp_path, "searchqa", "whale", [{"a": 0.0}, {"a": 1.0}])
    (tmp_path / "searchqa" / "whale" / "evals" / "phase_1.json").write_text(json.dumps({"stats": {}}))  # older whale.py
    table = report.make_table(report.load_runs(str(tmp_path)), "smoke")
    assert "| whale | final 100.0; best 100.0 @ 100 | not run | not run |" in table
    assert "Not enough finished runs" in table


def test_the_hierarchical_interval_on_constructed_seeds():
    # one seed: the bootstrap over tasks, draw for draw
    values = [0.0, 0.5, 1.0, 1.0, 0.25, 0.0, 0.75]
    assert intervals.hierarchical_ci([values]) == intervals.bootstrap_ci(values)
    assert intervals.hierarchical_ci([values], seed=3) == intervals.bootstrap_ci(values, seed=3)
    # two seeds whose tasks all score the same: only the seeds vary. A resample draws (0.4, 0.4), a mixed pair or
    # (0.6, 0.6), means 0.4, 0.5, 0.6 with probabilities 1/4, 1/2, 1/4, so the 95 % interval is [0.4, 0.6]
    assert intervals.hierarchical_ci([[0.4] * 10, [0.6] * 10]) == pytest.approx((0.5, 0.4, 0.6))
    assert intervals.hierarchical_ci([[0.3] * 10, [0.7] * 10]) == pytest.approx((0.5, 0.3, 0.7))
    assert intervals.hierarchical_ci([[0.5] * 10, [0.5] * 10]) == pytest.approx((0.5, 0.5, 0.5))
    # the mean weighs seeds equally (not tasks): 2 tasks at 1.0 and 8 at 0.0 give 0.5, not 0.2
    assert intervals.hierarchical_ci([[1.0] * 2, [0.0] * 8])[0] == pytest.approx(0.5)
    # tasks that vary: the interval holds the mean and widens as the seeds move apart
    tasks = [0.0, 1.0] * 10 + [0.5] * 10  # mean 0.5
    widths = []
    for spread in (0.0, 0.1, 0.2, 0.3):
        mean, low, high = intervals.hierarchical_ci([[v - spread for v in tasks], [v + spread for v in tasks]])
        assert mean == pytest.approx(0.5) and low < mean < high
        widths.append(high - low)
    assert widths == sorted(widths) and widths[-1] > widths[0] + 0.3
    # two identical seeds: the task spread is counted, narrower than one seed's (twice the tasks), never zero
    one, two = intervals.hierarchical_ci([tasks]), intervals.hierarchical_ci([tasks, tasks])
    assert 0 < two[2] - two[1] < one[2] - one[1]
    with pytest.raises(ValueError, match="without values"):
        intervals.hierarchical_ci([tasks, []])


def write_search(folder, name, best_series):
    """A harness archive as meta_harness leaves it: frontier.json (with its best-score series), summary.jsonl."""
    archive = folder / name
    archive.mkdir()
    lineage = ["h0"] + ([f"h{len(best_series) - 1}_1"] if best_series[-1] > best_series[0] else [])
    (archive / "frontier.json").write_text(json.dumps({"best_series": best_series, "lineage": lineage}))
    (archive / "summary.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"name": "h0", "parent": None, "changed": "copied"},
        {"name": lineage[-1], "parent": "h0", "changed": "A: 0 -> 1"}]))


def test_seeds_pair_on_final_points_and_pool(tmp_path):
    tasks = [f"t{i}" for i in range(10)]
    const = lambda v: {t: v for t in tasks}
    final = {}  # seed -> (whale's final per-task scores, harness-only's)
    for seed in (0, 1, 2):
        root = tmp_path if seed == 0 else tmp_path / f"seed-{seed}"
        theirs = {t: 0.2 + 0.1 * seed + (0.2 if i % 3 == 0 else 0.0) for i, t in enumerate(tasks)}
        ours = {t: v + 0.1 * (i % 2) + 0.05 * seed for i, (t, v) in enumerate(theirs.items())}
        # whale's best is a middle phase (0.9 everywhere), above its final: the headline must not use it
        write_run(root, "math", "whale", [const(0.0), const(0.9), ours])
        write_run(root, "math", "harness-only", [const(0.0), theirs])
        write_run(root, "math", "weight-only", [const(0.0), const(0.95)])  # better, yet never the baseline
        final[seed] = (ours, theirs)
    runs = report.load_runs(str(tmp_path))
    assert set(runs["math", "whale"]) == {0, 1, 2}
    table = report.make_table(runs, "cpu")
    rows = {line.split(" | ")[2]: line for line in table.splitlines() if line.startswith("| math | whale - harness-only")}
    assert set(rows) == {"0", "1", "2", "pooled (3 seeds)"}
    for seed in (0, 1, 2):
        ours, theirs = final[seed]
        diff = intervals.paired_difference(ours, theirs)
        best = intervals.paired_difference(const(0.9), theirs)
        assert diff[0] == pytest.approx(0.05 + 0.05 * seed)  # 0.1 on half the tasks, + 0.05 x seed
        assert rows[str(seed)] == f"| math | whale - harness-only | {seed} | {report.signed(diff)} | " \
                                  f"{report.signed(best)} | 10 |"
    pooled = intervals.pooled_difference([final[s] for s in (0, 1, 2)])
    assert pooled[0] == pytest.approx(0.1) and pooled[3] == [10, 10, 10]
    assert pooled[1] < 0.1 < pooled[2]
    assert rows["pooled (3 seeds)"].startswith(f"| math | whale - harness-only | pooled (3 seeds) | **{report.signed(pooled)}** |")
    assert rows["pooled (3 seeds)"].endswith(" | 10 + 10 + 10 |")
    # Table 1 is the mean over seeds, each seed's final point listed after it
    whale_cell = report.cell(runs["math", "whale"])
    finals = [sum(final[s][0].values()) / 10 for s in (0, 1, 2)]
    assert whale_cell.startswith(f"final {100 * sum(finals) / 3:.1f} [") and "; best 90.0 [90.0, 90.0] @ 100" in whale_cell
    assert "| whale | not run | " + " / ".join(f"{100 * f:.1f}" for f in finals) + " | not run |" in table
    assert "whale - stagewise-hw" not in table and "stagewise-hw |" not in table  # not run: left out, no error
    # stagewise-hw, once it ran (two seeds here), is the second named baseline
    for seed in (0, 1):
        write_run(tmp_path if seed == 0 else tmp_path / f"seed-{seed}", "math", "stagewise-hw",
                  [const(0.0), final[seed][1]])
    table = report.make_table(report.load_runs(str(tmp_path)), "cpu")
    hw = [line for line in table.splitlines() if line.startswith("| math | whale - stagewise-hw")]
    assert [line.split(" | ")[2] for line in hw] == ["0", "1", "pooled (2 seeds)"]
    assert "| stagewise-hw | not run | final " in table and "(2 of 2" not in table


def test_how_many_seeds_found_a_better_harness(tmp_path):
    tasks = {"t1": 0.0, "t2": 0.0}
    for seed, series in ((0, [0.0, 0.0, 0.25]), (1, [0.0, 0.0, 0.0]), (2, [0.1, 0.3])):
        root = tmp_path if seed == 0 else tmp_path / f"seed-{seed}"
        write_run(root, "math", "harness-only", [tasks, tasks])
        write_search(root / "math" / "harness-only", "harness_w0", series)
        write_run(root, "math", "whale", [tasks, tasks, tasks])
        write_search(root / "math" / "whale", "harness_w1", series)
        write_search(root / "math" / "whale", "harness_w2", [0.5, 0.5])  # the second search: nothing better
        write_run(root, "math", "weight-only", [tasks, tasks])  # no search: no row
    write_run(tmp_path / "seed-3", "math", "harness-only", [tasks])
    (tmp_path / "seed-3" / "math" / "harness-only" / "summary.json").unlink()  # running: not counted
    table = "\n".join(report.search_table(report.load_runs(str(tmp_path))))
    assert "| math | harness-only | 2 of 3 | seed 0: harness_w0 (0.00 -> 0.25); seed 1: none; " \
           "seed 2: harness_w0 (0.10 -> 0.30) |" in table
    assert "| math | whale | 2 of 3 | seed 0: harness_w1 (0.00 -> 0.25); seed 1: none; seed 2: harness_w1" in table
    assert "weight-only" not in table
    assert "No finished run has searched yet." in "\n".join(report.search_table({}))


def test_the_report_reads_the_folders_whale_writes_for_each_seed(tmp_path):
    import whale
    for seed in (0, 2):  # each run where whale.py puts it: results/smoke/[seed-<n>/]<domain>/<method>
        for one in whale.parse_args(["--domain", "math", "--method", "whale", "harness-only", "--preset", "smoke",
                                     "--seed", str(seed)]):
            folder = Path(one.out).relative_to(Path("results", "smoke"))
            write_run(tmp_path / folder.parent.parent, folder.parent.name, folder.name, [{"t1": 0.5 * seed}])
    assert whale.parse_args(["--domain", "math", "--preset", "smoke", "--seed", "2"])[0].out == \
        os.path.join("results", "smoke", "seed-2", "math", "whale")
    assert whale.parse_args(["--domain", "math", "--preset", "smoke"])[0].out == os.path.join("results", "smoke", "math",
                                                                                            "whale")
    # a seed-0/ folder is read as seed 0 too, where the one-seed layout lacks the run
    write_run(tmp_path / "seed-0", "math", "fast-slow", [{"t1": 0.25}])
    write_run(tmp_path / "seed-0", "math", "whale", [{"t1": 0.75}])  # the one-seed layout's run wins
    (tmp_path / "seed-x").mkdir()  # not a seed folder: ignored
    runs = report.load_runs(str(tmp_path))
    assert {key: sorted(seeds) for key, seeds in runs.items()} == {("math", "harness-only"): [0, 2], ("math", "whale"): [0, 2],
                                                                   ("math", "fast-slow"): [0]}
    assert runs["math", "whale"][2]["evals"][0]["mean_at_k"] == 1.0 and runs["math", "whale"][0]["evals"][0]["mean_at_k"] == 0.0
    assert runs["math", "fast-slow"][0]["evals"][0]["mean_at_k"] == 0.25
    assert "Mean over 2 seeds (0, 2)" in report.make_table(runs, "smoke")


def test_what_moved_sums_rsft_and_traces_each_search(tmp_path):
    write_run(tmp_path, "searchqa", "whale", [{"t1": 0.0, "t2": 0.0}, {"t1": 0.5, "t2": 0.5}])
    folder = tmp_path / "searchqa" / "whale"
    (folder / "weights").mkdir()
    (folder / "weights" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 1, "accept_rate": 0.0, "examples": 0}, {"step": 2, "accept_rate": 0.25, "examples": 3},
        {"step": 3, "accept_rate": 0.5, "examples": 5}]))
    archive = folder / "harness_w1"
    archive.mkdir()
    (archive / "frontier.json").write_text(json.dumps({"best_series": [0.0, 0.125, 0.25], "lineage": ["h0", "h1_2", "h2_1"]}))
    (archive / "summary.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"name": "h0", "parent": None, "changed": "copied"}, {"name": "h1_2", "parent": "h0", "changed": "A: 0 -> 1"},
        {"name": "h2_1", "parent": "h1_2", "changed": "B: 0 -> 1"}]))
    table = "\n".join(report.mechanism_table(report.load_runs(tmp_path)))
    # (its metrics.jsonl rows name no RSFT step, so no weight phase is known: "-")
    assert "| searchqa | whale | 0 | 3 | - | - | 0.00 -> 0.50 | harness_w1: 0.00, 0.12, 0.25 " \
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
    assert report.cell({0: {"summary": None, "evals": []}}) == "running (0 phases done)"  # not even the start eval
    assert report.cell({0: {"summary": None, "evals": [{}, {}, {}]}}) == "running (2 phases done)"
    assert report.cell({0: {"summary": None, "evals": [{}, {}]}, 1: {"summary": None, "evals": []}}) == \
        "running (1, 0 phases done)"
    assert report.cell(None) == report.cell({}) == "not run"


def test_a_test_set_of_several_benchmarks_gets_a_column_each_and_their_average(tmp_path):
    """The paper's searchqa test set is 7 x 100 questions: the report gives each benchmark's final mean@k and
    the average of the benchmarks, each with its interval."""
    folder = tmp_path / "paper" / "searchqa" / "whale"
    (folder / "evals").mkdir(parents=True)
    per_task = {f"nq-{i}": float(i < 3) for i in range(4)} | {f"hq-{i}": float(i < 1) for i in range(4)}
    sources = {t: "nq" if t.startswith("nq") else "hotpotqa" for t in per_task}
    rows = [{"event": "eval", "phase": 0, "kind": "start", "step": 0, "rollouts": 0, "mean_at_k": 0.5, "k": 1,
             "test_tasks": 8}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "evals" / "phase_0.json").write_text(json.dumps({"per_task": per_task, "sources": sources}))
    (folder / "summary.json").write_text(json.dumps({"best_phase": 0, "k": 1, "best_mean_at_k": 0.5,
                                                     "rollouts_to_best": 0, "final_mean_at_k": 0.5}))
    runs = report.load_runs(str(tmp_path / "paper"))
    lines = report.benchmark_table(runs, 1)
    assert lines[0] == "## searchqa: final test mean@1 per benchmark, % [95 % CI]"
    assert lines[2] == "| method | hotpotqa | nq | average of benchmarks |"
    whale_row = next(line for line in lines if line.startswith("| whale |"))
    cells = [c.strip() for c in whale_row.strip("|").split("|")]
    assert cells[1].startswith("25.0 [") and cells[2].startswith("75.0 [") and cells[3].startswith("50.0 [")


def test_what_moved_gives_the_training_reward_per_weight_phase_and_quarter():
    """The engagement figures of the cpu preset (issue 30): accepted examples in the first weight phase, the
    training reward per weight phase and over the first and last quarter of the RSFT steps."""
    rates = [0.1, 0.2, 0.3, 0.5, 0.6, 0.9, 0.7, 0.8]
    steps = [{"step": i, "accept_rate": r, "examples": 10 * i} for i, r in enumerate(rates, 1)]
    assert [[r["step"] for r in p] for p in report.weight_phases(steps, [3, 6, 8])] == [[1, 2, 3], [4, 5, 6], [7, 8]]
    assert report.quarters(steps) == pytest.approx((0.15, 0.75))
    run = {"steps": steps, "weight_phase_ends": [3, 6, 8], "archives": {}}
    lines = report.mechanism_table({("math", "weight-only"): {0: run}})
    assert "| math | weight-only | 0 | 8 | 60 / 360 | 0.20 / 0.67 / 0.75 | 0.15 -> 0.75 | - |" in lines
