"""Nothing a student runs or asks for vanishes without a word: report.py names every run folder it did not put in a
table and shows the adaptive runs of every method; a --test-holdout that leaves a small test split is one line in
plan.py and whale.py, and one that leaves none is refused."""
import pytest

import plan
import report
import whale
from tests.fixtures.tiny_domain import H0, Echo
from tests.test_report import write_run


def test_the_report_names_every_run_folder_it_left_out_of_the_tables(tmp_path, capsys):
    preset = tmp_path / "cpu"
    write_run(preset, "math", "whale", [{"t1": 0.0}, {"t1": 0.5}])
    write_run(preset, "math", "stagewise-adaptive", [{"t1": 0.0}, {"t1": 1.0}])  # an adaptive run of any method
    write_run(preset, "math", "my-method", [{"t1": 0.0}])  # a method the report does not list
    write_run(preset, "units", "whale", [{"t1": 0.0}])  # a domain that is not registered
    (preset / "math" / "weight-only").mkdir()
    (preset / "math" / "weight-only" / "config.json").write_text("{}")  # started, no phase written
    write_run(preset / "seed-0", "math", "whale", [{"t1": 0.25}])  # seed 0 again: the one-seed layout's is read
    (preset / "math" / "notes").mkdir()  # no run folder: not listed
    report.main(["--preset", "cpu", "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert "| stagewise-adaptive |" in (preset / "tables.md").read_text()
    assert [line for line in out.splitlines() if line.startswith("not in the tables")] == [
        f"not in the tables: {preset}/math/my-method (my-method is not a run of a method in the method table "
        "(lib/methods.py))",
        f"not in the tables: {preset}/math/weight-only (no metrics.jsonl: the run wrote no phase yet)",
        f"not in the tables: {preset}/units/whale (units is not a registered domain (domains.DOMAINS))",
        f"not in the tables: {preset}/seed-0/math/whale (seed 0's math/whale was read from another folder)"]


def test_without_a_left_out_folder_the_report_says_nothing_more(tmp_path, capsys):
    write_run(tmp_path / "cpu", "math", "whale", [{"t1": 0.0}])
    report.main(["--preset", "cpu", "--results", str(tmp_path)])
    assert "not in the tables" not in capsys.readouterr().out


class Small(Echo):
    """A domain with a test split of 64 tasks, as a student's fork may have."""
    name = "small"
    SIZES = {"train": 64, "harness": 8, "test": 64}


@pytest.fixture
def small(tmp_path, monkeypatch):
    import domains
    monkeypatch.setitem(domains.DOMAINS, "small", Small)
    harness = tmp_path / "small.py"
    harness.write_text(H0)
    return ["--domain", "small", "--harness", str(harness), "--method", "whale", "--preset", "cpu", "--model", "smoke",
            "--out", str(tmp_path / "run")]


def test_a_holdout_that_leaves_a_small_test_split_is_one_line(small, capsys):
    plan.main(small)
    out = capsys.readouterr().out
    line = ("--test-holdout 50 leaves 14 of small's 64 test tasks, fewer than --test-limit 50: the test evaluation "
            "runs on those 14 (lower --test-holdout, or give the domain more test tasks)")
    assert line in out.splitlines() and "x 14 tasks" in out
    plan.main([*small, "--test-holdout", "10"])  # 54 left: the 50 asked for
    assert "--test-holdout" not in capsys.readouterr().out
    runs = whale.parse_args(small)
    assert whale.check_inputs(runs).name == "small" and line in capsys.readouterr().out


def test_a_holdout_that_leaves_no_test_task_is_refused(small, capsys):
    with pytest.raises(SystemExit) as e:
        plan.main([*small, "--test-holdout", "64"])
    assert str(e.value) == ("plan.py: error: --test-holdout 64 leaves none of small's 64 test tasks: lower "
                            "--test-holdout below 64")
    runs = whale.parse_args([*small, "--test-holdout", "70"])
    with pytest.raises(ValueError, match=r"^--test-holdout 70 leaves none of small's 64 test tasks"):
        whale.check_inputs(runs)
