"""--model null, the model that cannot answer: every reply is '', so a harness scored under it earns only what its
own code solves. The bundled and cpu h0s earn nothing; harnesses that answer by themselves (a regex over the
searchqa passage, a math problem computed in Python: tests/fixtures/cheats/) do."""
import json
from pathlib import Path

import pytest

import domains
import rollout
from lib.hf_backend import NullModelBackend
from lib.models import load_model
from lib.subsets import seeded_sample

CHEATS = Path(__file__).resolve().parent / "fixtures" / "cheats"


@pytest.fixture(scope="module")
def null():
    return NullModelBackend(*load_model("null"))


def score(domain, harness, backend, n=8, split="harness"):
    tasks = seeded_sample(domain.load(split), n)
    return rollout.evaluate(domain, str(harness), tasks, backend, k=1, max_new_tokens=64, deadline_s=60)


def test_the_null_model_replies_the_empty_string_at_no_model_time(null):
    ids = null.generate(["a", "b", "c"], max_new_tokens=[5, 0, 9])
    assert ids == [[null.tokenizer.eos_token_id], [], [null.tokenizer.eos_token_id]]
    assert null.tokenizer.decode(ids[0], skip_special_tokens=True) == ""


@pytest.mark.parametrize("harness", ["harnesses/searchqa.py", "harnesses/math.py", "harnesses/chess.py",
                                     "harnesses/cpu/searchqa.py", "harnesses/cpu/math.py"])
def test_every_shipped_h0_earns_nothing_without_the_model(null, harness):
    name = Path(harness).stem
    stats = score(domains.get(name), harness, null)
    assert stats["mean_at_k"] == 0.0 and stats["mean_turns"] >= 1, stats  # it asked the model, got ''


@pytest.mark.parametrize("domain, cheat", [("searchqa", "searchqa_regex.py"), ("math", "math_compute.py")])
def test_a_harness_that_answers_by_itself_scores_without_the_model(null, domain, cheat):
    stats = score(domains.get(domain), CHEATS / cheat, null, n=16)
    assert stats["mean_at_k"] > 0.25, stats


@pytest.mark.parametrize("domain", ["searchqa", "math", "chess"])
def test_rollout_py_takes_model_null_on_every_domain(tmp_path, domain):
    out = tmp_path / domain
    rollout.main(["--domain", domain, "--harness", f"harnesses/{domain}.py", "--model", "null", "--limit", "2",
                  "--k", "1", "--max-new-tokens", "8", "--out", str(out)])
    assert json.loads((out / "results.json").read_text())["mean_at_k"] == 0.0


def test_the_null_model_needs_no_engine():
    with pytest.raises(SystemExit) as e:
        rollout.main(["--domain", "math", "--harness", "harnesses/math.py", "--model", "null", "--backend", "vllm"])
    assert str(e.value.code) == ("rollout.py: error: --model null replies '' without any engine: use --backend hf, "
                                 "not --backend vllm")
