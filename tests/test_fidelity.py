"""The paper preset against the official code (docs/fidelity.md): searchqa's harness set as the official builder
draws it; a paper chess candidate changes only what the official contract lets it."""
import argparse
import json
from pathlib import Path

import pytest

import domains
from lib import paper_data
from lib.contract import static_check


def paper_args(*argv):
    p = argparse.ArgumentParser()
    domains.add_args(p)
    return vars(p.parse_args(["--data", "paper", *argv]))


def search_r1_rows(n_nq, n_hotpot):
    """Rows in the schema of PeterJinGo/nq_hotpotqa_train (its verl columns): NQ first, then HotpotQA."""
    return [{"id": f"train_{i}", "question": f"question {i}", "golden_answers": [f"answer {i}"],
             "data_source": "nq" if i < n_nq else "hotpotqa", "ability": "fact-reasoning",
             "prompt": [{"role": "user", "content": f"Answer the given question. Question: question {i}"}],
             "reward_model": {"ground_truth": {"target": [f"answer {i}"]}, "style": "rule"},
             "extra_info": {"index": i, "split": "train"}, "metadata": None} for i in range(n_nq + n_hotpot)]


def searchqa(tmp_path, rows, *argv):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return domains.get("searchqa", paper_args("--searchqa-train", str(path), "--wiki", "unused.jsonl", *argv))


def test_searchqa_harness_set_is_256_nq_rows_of_the_train_set(tmp_path):
    """build_meta_harness_nq_256.py: NQ rows only, a subset of D_weight, 256, seed 42, one per question."""
    domain = searchqa(tmp_path, search_r1_rows(700, 900), "--searchqa-train-size", "1200")
    train, harness = domain.load("train"), domain.load("harness")
    assert len(harness) == 256 and {t["source"] for t in harness} == {"nq"}
    assert {t["source"] for t in train} == {"nq", "hotpotqa"}
    assert {t["id"] for t in harness} <= {t["id"] for t in train}
    assert len({t["question"] for t in harness}) == 256
    assert harness == paper_data.searchqa_harness(train, 256, 42) == domain.load("harness")  # seeded: 42
    assert harness != paper_data.searchqa_harness(train, 256, 0)


def test_searchqa_harness_set_keeps_one_row_per_question_and_all_when_fewer(tmp_path):
    rows = search_r1_rows(6, 4)
    rows[3]["question"] = rows[2]["question"]  # the builder refuses duplicate questions
    harness = searchqa(tmp_path, rows, "--searchqa-train-size", "0").load("harness")
    assert [t["id"] for t in harness] == ["nq-train_0", "nq-train_1", "nq-train_2", "nq-train_4", "nq-train_5"]


def test_searchqa_harness_set_without_nq_rows_is_a_one_line_error(tmp_path):
    domain = searchqa(tmp_path, search_r1_rows(0, 10), "--searchqa-train-size", "0")
    with pytest.raises(ValueError, match="NQ rows of the train set.*pass a --searchqa-train with NQ rows"):
        domain.load("harness")


def test_official_processed_nq_counts_as_nq():
    train = [{"id": f"q{i}", "question": f"q{i}?", "answers": ["a"], "source": s}
             for i, s in enumerate(["searchR1_nq", "searchR1_hotpotqa", "nq"])]
    assert [t["id"] for t in paper_data.searchqa_harness(train)] == ["q0", "q2"]


# -----------------------------------------------------------------------------
# chess: the official contract (the runner owns the loop; a candidate changes the hooks and limits)

H0 = Path(__file__).resolve().parents[1] / "harnesses" / "paper" / "chess.py"


def with_edit(old, new, source=None):
    source = source or H0.read_text()
    assert old in source
    return source.replace(old, new, 1)


def test_a_chess_candidate_may_change_the_official_hooks_and_limits():
    h0 = H0.read_text()
    assert static_check(h0, h0, domain="chess") is None
    for old, new in (('"You solve chess tactics', '"You are a careful chess solver. You solve chess tactics'),
                     ("Do not include explanation.", "Think, then give only the move."),
                     ('rows = ["Task: solve', 'rows = ["Task (one move at a time): solve'),  # the observation
                     ('for pattern in (rf"<move>', 'for pattern in (rf"<move>\\s*<move>({UCI})</move>\\s*</move>", rf"<move>'),
                     ("FORMAT_RETRY_BUDGET = 1", "FORMAT_RETRY_BUDGET = 3"), ("MAX_TURNS = 9", "MAX_TURNS = 18")):
        assert static_check(with_edit(old, new), h0, domain="chess") is None, new
    helper = with_edit("def board_rows(fen):", "def compact(text):\n    return text.strip()\n\n\ndef board_rows(fen):")
    assert static_check(helper, h0, domain="chess") is None


def test_a_chess_candidate_that_changes_the_loop_is_refused_in_one_line():
    h0 = H0.read_text()
    two_calls = with_edit("        reply = llm(messages)\n", "        reply = llm(messages)\n        reply = llm(messages + "
                          "[{'role': 'assistant', 'content': reply}, {'role': 'user', 'content': 'Check it.'}])\n")
    reason = static_check(two_calls, h0, domain="chess")
    assert reason.startswith("runner-owned: changes run (line ") and "\n" not in reason
    assert "change only the other names (chess: the prompts, observation, parse_action, the retry budgets and MAX_TURNS)" in reason
    for candidate, name in ((with_edit("({san}). Continue with the next move.", "({san}). Next move?"), "CONTINUE_MESSAGE"),
                            (h0 + "\n\ndef range(n):\n    return [0] * 50\n", "range"),  # a loop by another name
                            (h0 + "\nrun = lambda task, llm, tools: {'answer': None}\n", "run"),
                            (with_edit("import re\n", "import re\nimport json as re\n"), "re"),
                            (with_edit('UCI = r"', 'UCI = r".*|'), "UCI"),
                            (with_edit('RUNNER_OWNS = ("run", ', 'RUNNER_OWNS = ('), "RUNNER_OWNS")):
        assert static_check(candidate, h0, domain="chess").startswith(f"runner-owned: changes {name} (line "), name


def test_harnesses_without_runner_owns_keep_their_contract():
    """The cpu and smoke chess h0 (harnesses/chess.py) declares nothing: a candidate may still rewrite its run."""
    cpu = (H0.parents[1] / "chess.py").read_text()
    assert "RUNNER_OWNS" not in cpu
    assert static_check(cpu.replace("def run(task, llm, tools):", "def run(task, llm, tools):\n    llm([])", 1), cpu,
                        domain="chess") is None
