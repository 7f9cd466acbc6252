"""The contract every registered domain keeps, run over domains.DOMAINS: a domain a fork registers is covered
without writing these again (docs/design.md section 5). Its h0 (harnesses/<name>.py) passes the checker and each
value its SEARCH_SPACE offers passes it too; the agent's view given back as the answer earns nothing; a gold
answer earns 1 and an empty one 0; no test task is a training or harness task; a search from h0 runs on the
smoke model. tests/fixtures/tiny_domain.py shows a fork's own domain registered at test time, through every CLI."""
import inspect
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import domains
import meta_harness
from lib import mutate
from lib.contract import check_harness_fits, static_check
from lib.backends.hf_backend import HFBackend
from lib.backends.models import load_model
from lib.subsets import seeded_sample
from tests.fixtures.configs import search_config

ROOT = Path(__file__).resolve().parents[1]
NAMES = list(domains.DOMAINS)


def h0(name):
    return ROOT / "harnesses" / f"{name}.py"


@pytest.mark.parametrize("name", NAMES)
def test_the_h0_and_every_value_its_search_space_offers_pass_the_checker(name):
    domain = domains.get(name)
    source = check_harness_fits(h0(name), name, domain.TOOL_METHODS)
    assert static_check(source, domain=domain) is None
    options = mutate.knob_options(source)
    assert options, "SEARCH_SPACE offers nothing to try"
    for knob, _, value in options:
        assert static_check(mutate.set_knob(source, knob, value), source, domain=domain) is None, (knob, value)


@pytest.mark.parametrize("name", NAMES)
def test_the_view_given_back_earns_nothing_and_the_gold_answer_earns_one(name):
    domain = domains.get(name)
    for task in seeded_sample(domain.load("test"), 5):
        view = json.dumps(domain.public(task))
        assert domain.reward(task, view, domain.tools(task)) == 0.0  # the view holds no answer
        assert domain.reward(task, "", domain.tools(task)) == 0.0
        tools = domain.tools(task)
        assert domain.reward(task, domain.gold_answer(task, tools), tools) == 1.0


@pytest.mark.parametrize("name", NAMES)
def test_no_test_task_is_a_training_or_harness_task(name):
    domain = domains.get(name)
    content = lambda task: json.dumps({k: v for k, v in task.items() if k != "id"}, sort_keys=True)
    test = {content(t) for t in domain.load("test")}
    for split in ("train", "harness"):
        assert not test & {content(t) for t in domain.load(split)}, split
    if domain.HARNESS_FILE:  # a harness split of its own is disjoint from train too
        assert not {content(t) for t in domain.load("harness")} & {content(t) for t in domain.load("train")}


@pytest.fixture(scope="module")
def smoke():
    return HFBackend(*load_model("smoke"))


@pytest.mark.parametrize("name", NAMES)
def test_a_search_from_h0_runs_on_the_smoke_model(tmp_path, smoke, name):
    cfg = search_config(candidates=2, harness_tasks=2, max_new_tokens=8)
    result = meta_harness.search(smoke, domains.get(name), str(h0(name)), tmp_path / "run", cfg, rounds=1)
    assert result["rounds"] == 1 and Path(result["winner"]).is_file()
    rows = [json.loads(line) for line in (tmp_path / "run" / "summary.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["valid"] for r in rows), [r["reason"] for r in rows]


def test_a_domain_registered_at_test_time_runs_through_every_cli(tmp_path, monkeypatch, capsys):
    """What a fork's domain gets from one line in the registry: rollout.py, rft.py, meta_harness.py, whale.py
    (smoke), plan.py (the plan and --check) and report.py, with no other file touched."""
    import report
    import rft
    import rollout
    import plan
    import whale
    from tests.fixtures.tiny_domain import H0, Echo
    monkeypatch.setitem(domains.DOMAINS, "echo", Echo)
    harness = tmp_path / "echo.py"
    harness.write_text(H0)
    common = ["--domain", "echo", "--harness", str(harness), "--model", "smoke"]
    rollout.main([*common, "--limit", "2", "--k", "1", "--out", str(tmp_path / "eval")])
    assert json.loads((tmp_path / "eval" / "results.json").read_text())["mean_at_k"] == 0.0
    rft.main([*common, "--steps", "1", "--batch", "2", "--group", "2", "--out", str(tmp_path / "rft")])
    assert (tmp_path / "rft" / "summary.json").exists()
    meta_harness.main([*common, "--rounds", "1", "--candidates", "1", "--harness-tasks", "2",
                       "--out", str(tmp_path / "mh")])
    assert (tmp_path / "mh" / "archive" / "frontier.json").exists()
    run = ["--domain", "echo", "--method", "whale", "--preset", "smoke", "--harness", str(harness)]
    plan.main(run)
    assert "echo" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        plan.main([*run, "--check", "echo"])
    assert e.value.code == 0
    out = tmp_path / "results" / "smoke" / "echo" / "whale"
    whale.main([*run, "--out", str(out)])
    assert json.loads((out / "summary.json").read_text())["domain"] == "echo"
    report.main(["--preset", "smoke", "--results", str(tmp_path / "results")])
    # its column names what its verifier read (the bundled rule: the harness's answer)
    assert "| method | searchqa | math | chess | echo (on the harness's answer) |" in (
        tmp_path / "results" / "smoke" / "tables.md").read_text()


# -----------------------------------------------------------------------------
# the contract's rules a harness author meets (README "The harness contract", docs/design.md section 3)

def test_a_search_space_key_that_names_no_knob_is_refused_in_one_line(tmp_path):
    """A typo in SEARCH_SPACE: mutate could never set the knob and would skip it without a word, so the checker
    (the runner's gate and the search's verdict alike) refuses it, naming the key and the knobs that exist."""
    from tests.fixtures.tiny_domain import H0
    typo = tmp_path / "typo.py"
    typo.write_text(H0.replace('SEARCH_SPACE = {"MAX_TOKENS"', 'SEARCH_SPACE = {"MAX_TOKEN"'))
    why = "SEARCH_SPACE names 'MAX_TOKEN', which is no knob of this file (a top-level NAME = value); its knobs: " \
          "PROMPT_TEMPLATE, MAX_TOKENS"
    with pytest.raises(ValueError) as e:
        check_harness_fits(typo, "echo", ())
    assert str(e.value) == f"{typo}:4: {why}"
    assert static_check(typo.read_text()) == f"{why} (line 4)"
    assert static_check(H0) is None and mutate.knob_options(H0)  # spelled right, it passes and mutate tries it


def test_a_search_space_that_is_no_literal_dict_of_value_lists_is_refused_in_one_line(tmp_path):
    """mutate reads SEARCH_SPACE with ast.literal_eval: one built by a call, or whose values are no lists, would
    read as empty and leave the offline search nothing to try, so the checker refuses it."""
    from tests.fixtures.tiny_domain import H0
    why = ("SEARCH_SPACE must be a literal dict, {KNOB: [values]}: mutate reads it with ast.literal_eval, so built "
           "any other way it reads as empty (line 4)")
    built = H0.replace('SEARCH_SPACE = {', 'SEARCH_SPACE = dict({', 1).replace('"Say {word}."]}', '"Say {word}."]})')
    assert built != H0 and mutate.knob_options(built) == []  # what mutate would have made of it: nothing
    assert static_check(built) == why
    assert static_check(H0.replace('"MAX_TOKENS": [4, 8]', '"MAX_TOKENS": 4')) == why  # a value, not a list of them
    as_tuple = H0.replace('"MAX_TOKENS": [4, 8]', '"MAX_TOKENS": (4, 8)')  # literal_eval reads it, mutate tries it
    assert static_check(as_tuple) is None and ("MAX_TOKENS", 8, 4) in mutate.knob_options(as_tuple)
    harness = tmp_path / "built.py"
    harness.write_text(built)
    with pytest.raises(ValueError) as e:
        check_harness_fits(harness, "echo", ())
    assert str(e.value) == f"{harness}:4: {why[:-len(' (line 4)')]}"


def test_what_run_returns_beside_the_answer_is_kept_in_the_trace_and_bounded(tmp_path, smoke):
    import rollout
    from lib.episodes.runner import EXTRA_KEEP
    from tests.fixtures.tiny_domain import Echo
    harness = tmp_path / "noted.py"
    harness.write_text('"""Answers the word itself, with what it noted."""\n\n\ndef run(task, llm, tools):\n'
                       '    note = "x" * 5000 if task["word"] == "w201" else {"votes": {task["word"]: 3, "other": 1}}\n'
                       '    return {"answer": task["word"], "note": note}\n')
    eps = rollout.run_episodes(Echo(), harness, Echo().load("test")[:2], smoke, deadline_s=60)
    assert [e["reward"] for e in eps] == [1.0, 1.0]
    assert eps[0]["returned"] == {"note": {"votes": {"w200": 3, "other": 1}}}
    kept = eps[1]["returned"]  # too long for the trace: its first EXTRA_KEEP characters, marked
    assert kept.startswith('{"note": "xxx') and kept.endswith(" ... (cut: 5012 characters)")
    assert len(kept) < EXTRA_KEEP + 40


# -----------------------------------------------------------------------------
# a fork's domain through the whole suite

# the tests of tests/ that iterate over domains.DOMAINS: the parametrized ones by their id (the domain's name, or its
# h0's path), and the two that loop over the registry whole
OVER_THE_REGISTRY = "echo or test_every_h0_fits_its_own_domain_only or test_cli_stats_show_and_errors"


def test_every_test_over_the_registry_passes_for_a_fork_domain(tmp_path):
    """tests/fixtures/tiny_domain.py's domain added as a fork adds one (its line in domains.py's registry, its h0 at
    harnesses/<name>.py), in a copy of the repository: every test of tests/ that iterates over domains.DOMAINS
    runs for it too, and passes, with no test written for it."""
    from tests.fixtures.tiny_domain import H0, Echo
    fork = tmp_path / "fork"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for path in tracked.splitlines():
        if (ROOT / path).is_file():  # as the working tree has it
            (fork / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / path, fork / path)
    (fork / "harnesses" / "echo.py").write_text(H0)
    with open(fork / "domains.py", "a") as f:  # a fork writes its class into domains.py, and its registry line
        f.write(f"\n\n{inspect.getsource(Echo)}\n\nDOMAINS[\"echo\"] = Echo\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "tests", "-k",
                           OVER_THE_REGISTRY], cwd=fork, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:]
    passed = re.findall(r"^PASSED (\S+)", done.stdout, re.MULTILINE)
    ran = sorted(test for test in passed if "echo" in test)
    assert len(ran) >= 12 and {t.split("::")[0] for t in ran} == {
        "tests/test_domains.py", "tests/test_domain_contract.py", "tests/test_rollout.py", "tests/test_null_model.py"}, ran
    assert any("test_every_h0_fits_its_own_domain_only" in t for t in passed)
    assert any("test_cli_stats_show_and_errors" in t for t in passed)
