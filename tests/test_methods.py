"""The method table (lib/methods.py) is the one place a method is defined: a method a fork registers at test time
runs through whale.py (smoke), plan.py and report.py with no other file touched."""
import json

from fixtures.tiny_method import STAGEWISE_FST
from lib import methods


def test_a_method_registered_at_test_time_runs_through_whale_plan_and_report(tmp_path, monkeypatch, capsys):
    import plan
    import report
    import whale
    monkeypatch.setitem(methods.METHODS, STAGEWISE_FST.name, STAGEWISE_FST)
    monkeypatch.chdir(tmp_path)
    harness = tmp_path / "h0.py"
    harness.write_text((whale.Path(__file__).parents[1] / "harnesses" / "math.py").read_text())
    run = ["--domain", "math", "--preset", "smoke", "--method", "stagewise-fst", "--harness", str(harness),
           "--test-limit", "2", "--harness-tasks", "2"]
    plan.main(run)
    printed = capsys.readouterr().out
    # stagewise's plan: 2 weight phases of 2 steps, then the harness phase (a fresh archive: h0 re-scored)
    assert "plan: stagewise-fst on math" in printed and "2 weight phases (2 + 2 steps), 1 harness phases" in printed
    assert "re-score + 1 rounds" in printed
    whale.main(run)
    out = tmp_path / "results" / "smoke" / "math" / "stagewise-fst"
    assert json.loads((out / "config.json").read_text())["prompt_only"] is True  # the row's prompt_only reached it
    phases = [r["kind"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
              if r["event"] == "eval"]
    assert phases == ["start", "weight", "weight", "harness"]
    assert json.loads((out / "summary.json").read_text())["method"] == "stagewise-fst"
    report.main(["--preset", "smoke", "--results", str(tmp_path / "results")])
    table = (tmp_path / "results" / "smoke" / "tables.md").read_text()
    assert "| stagewise-fst | " in table
