"""The paper preset against the official code (docs/fidelity.md): searchqa's harness set as the official builder
draws it."""
import argparse
import json

import pytest

import domains
from lib import paper_data


def paper_args(*argv):
    p = argparse.ArgumentParser()
    domains.add_args(p)
    return p.parse_args(["--data", "paper", *argv])


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
