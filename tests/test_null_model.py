"""--model null, the model that cannot answer: every reply is '', so a harness scored under it earns only what its
own code solves. The bundled and cpu h0s earn nothing; harnesses that answer by themselves (a regex over the
searchqa passage, a math problem computed in Python: tests/fixtures/cheats/) do."""
import json
import shutil
from pathlib import Path

import pytest

import domains
import meta_harness
import rollout
from lib.common.json_files import write_json
from lib.backends.hf_backend import HFBackend, NullModelBackend
from lib.backends.models import load_model
from lib.subsets import seeded_sample
from tests.fixtures.configs import search_config

CHEATS = Path(__file__).resolve().parent / "fixtures" / "cheats"


@pytest.fixture(scope="module")
def smoke():
    return HFBackend(*load_model("smoke"))


@pytest.fixture(scope="module")
def null():
    model, tok = load_model("null")
    return NullModelBackend(tok, model)


def score(domain, harness, backend, n=8, split="harness"):
    tasks = seeded_sample(domain.load(split), n)
    return rollout.evaluate(domain, str(harness), tasks, backend, k=1, max_new_tokens=64, deadline_s=60)


def test_the_null_model_replies_the_empty_string_at_no_model_time(null):
    ids = null.generate(["a", "b", "c"], max_new_tokens=[5, 0, 9])
    assert ids == [[null.tokenizer.eos_token_id], [], [null.tokenizer.eos_token_id]]
    assert null.tokenizer.decode(ids[0], skip_special_tokens=True) == ""


@pytest.mark.parametrize("harness", [f"harnesses/{name}.py" for name in domains.DOMAINS]
                         + ["harnesses/cpu/searchqa.py", "harnesses/cpu/math.py", "harnesses/smoke/math.py"])
def test_every_shipped_h0_earns_nothing_without_the_model(null, harness):
    name = Path(harness).stem
    stats = score(domains.get(name), harness, null)
    assert stats["mean_at_k"] == 0.0 and stats["mean_turns"] >= 1, stats  # it asked the model, got ''


@pytest.mark.parametrize("domain, cheat", [("searchqa", "searchqa_regex.py"), ("math", "math_compute.py")])
def test_a_harness_that_answers_by_itself_scores_without_the_model(null, domain, cheat):
    stats = score(domains.get(domain), CHEATS / cheat, null, n=16)
    assert stats["mean_at_k"] > 0.25, stats


@pytest.mark.parametrize("domain", list(domains.DOMAINS))
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


def proposed(run_dir, name, source):
    """A round's candidate as a proposer leaves it in the archive (lib/mutate.py writes there the same way)."""
    d = run_dir / "candidates" / name
    d.mkdir(parents=True)
    shutil.copy(source, d / "harness.py")
    write_json(d / "meta.json", {"parent": "h0", "hypothesis": "read the answer off the task", "changed": "all",
                                 "proposer": "command", "iteration": 1, "proposed": True, "valid": None,
                                 "reason": None})


@pytest.mark.parametrize("domain, cheat", [("searchqa", "searchqa_regex.py"), ("math", "math_compute.py")])
def test_the_search_refuses_a_winner_that_answers_by_itself(tmp_path, smoke, capsys, domain, cheat):
    """h1_1 beats h0 under the (random) smoke model only because its code answers: the search scores it again
    under the null model, refuses it in one line, and h0 stays. With --null-check report it wins, its score
    without the model kept."""
    d = domains.get(domain)
    for check in ("refuse", "report"):
        run_dir = tmp_path / check
        proposed(run_dir, "h1_1", CHEATS / cheat)
        cfg = search_config(candidates=1, harness_tasks=8, null_check=check)
        result = meta_harness.search(smoke, d, f"harnesses/{domain}.py", run_dir, cfg, rounds=1)
        scores = json.loads((run_dir / "candidates" / "h1_1" / "scores.json").read_text())
        null = json.loads((run_dir / "candidates" / "h1_1" / "null_scores.json").read_text())["score"]
        assert scores["score"] > 0.25 and null > 0.25, (scores, null)
        meta = json.loads((run_dir / "candidates" / "h1_1" / "meta.json").read_text())
        if check == "refuse":
            assert Path(result["winner"]).parent.name == "h0" and meta["valid"] is False
            assert meta["reason"] == (f"h1_1 scores {null:.2f} without the model (its parent h0 0.00, --null-margin "
                                      "0.05; scored on the harness's answer): the harness answers by itself")
            assert f"  h1_1: refused, {meta['reason']}" in capsys.readouterr().out
        else:
            assert Path(result["winner"]).parent.name == "h1_1" and meta["valid"] is True
