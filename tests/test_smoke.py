"""The smoke preset trains: a smoke run's weight phases each make a weight update, so the smoke runs (run_all.sh
SMOKE=1, and CI) execute RSFT's SFT pass, not only its sampling."""
import os
import runpy
import subprocess
import sys

import presets
from test_whale import rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_weight_phase_of_a_smoke_math_run_makes_a_weight_update(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "whale.py", "--domain", "math", "--preset", "smoke", "--method", "whale",
           "--test-limit", "2", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = rows(out / "weights" / "metrics.jsonl")
    evals = [r for r in rows(out / "metrics.jsonl") if r["event"] == "eval"]
    ends = [r["step"] for r in evals if r["kind"] == "weight"]
    assert len(ends) == 2 and ends[-1] == len(steps)  # whale: weight, harness, weight
    for start, end in zip([0] + ends, ends):
        phase = [r for r in steps if start < r["step"] <= end]
        assert any(not r["skipped"] and r["optimizer_steps"] > 0 for r in phase), (start, end, phase)


def test_the_smoke_math_h0_answers_only_with_the_models_operations():
    """harnesses/smoke/math.py never reads the answer: with the null model (a reply of '') it gives none, and its
    answer is the question's numbers joined by the operations the model named."""
    run = runpy.run_path(os.path.join(ROOT, presets.SMOKE["math"]["harness"]))["run"]
    task = {"question": "Leo has 19 books. Then Leo gives away 14 books. How many books does Leo have now?"}
    assert run(task, lambda messages, **kw: "", None)["answer"] is None
    assert run(task, lambda messages, **kw: "so - it is", None)["answer"] == "\\boxed{5}"
    three = {"question": "Maya has 5 buttons. Then Maya buys 6 boxes with 9 buttons in each box."}
    assert run(three, lambda messages, **kw: "+ then *", None)["answer"] == "\\boxed{59}"  # * before +
    replies = iter(["/", "no operation"])
    assert run(three, lambda messages, **kw: next(replies), None)["answer"] is None  # one of the two it needs
