"""The offline `mutate` proposer composes: coordinate ascent from the archive best, from each best every knob
before any twice, and the knob changes that raised a score combined. A fake scorer stands in for the runner (fast, exact)."""
import ast
import json
import textwrap
from pathlib import Path

import pytest

import domains
import meta_harness as mh
from fixtures import stand_ins
from fixtures.configs import search_config

ALL = {"A": [0, 1], "B": [0, 1], "C": [0, 1], "D": [0, 1], "E": [0, 1], "F": [0, 1], "PROMPT": ["Answer: ", "Reply: "]}


# two knobs that each add score (A, B), four that do nothing, one prompt string
SEED = textwrap.dedent('''\
    """Fake harness for the mutate tests."""
    A = 0
    B = 0
    C = 0
    D = 0
    E = 0
    F = 0
    PROMPT = "Answer: "


    def run(task, llm, tools):
        return {"answer": llm([{"role": "user", "content": PROMPT + task["question"]}])}
    ''') + f"\n\nSEARCH_SPACE = {ALL!r}\n"


def knobs(path):
    return {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse(Path(path).read_text()).body
            if isinstance(n, ast.Assign) and n.targets[0].id != "SEARCH_SPACE"}


class FakeDomain(domains.Domain):
    name, TOOL_METHODS = "fake", ()

    def load(self, split):
        return [{"id": f"t{i}", "question": f"q{i}"} for i in range(2)]

    def public(self, task):
        return {"question": task["question"]}


class FakeRollout:
    """score = 0.1 + gain x (A + B), + prompt_gain with the other PROMPT; or score(knobs) when given."""

    def __init__(self, gain=0.2, prompt_gain=0.0, score=None):
        self.gain, self.prompt_gain, self.score = gain, prompt_gain, score

    def run_episodes(self, domain, harness_path, tasks, backend, **kw):
        return [{"task_id": tasks[0]["id"], "reward": 0.0, "error": None, "turns": 1}]

    def evaluate(self, domain, harness_path, tasks, backend, k=1, traces_path=None, **kw):
        if stand_ins.without_model(backend, tasks, k):
            return stand_ins.without_model(backend, tasks, k)
        v = knobs(harness_path)
        score = 0.1 + self.gain * (v["A"] + v["B"]) + self.prompt_gain * (v["PROMPT"] != "Answer: ")
        score = self.score(v) if self.score else score
        Path(traces_path).write_text("")
        return {"mean_at_k": score, "k": k, "per_task": {}, "mean_turns": 1.0, "tokens": 1, "rollouts": len(tasks),
                "errors": 0, "seconds": 0.0}


def search(work, monkeypatch, iterations, candidates=2, fake=None, **over):
    """Meta-Harness with mutate in work/run; -> (result, the proposals' summary rows, the archive folder)"""
    fake = fake or FakeRollout()
    work.mkdir(parents=True, exist_ok=True)
    seed = work / "seed.py"
    seed.write_text(SEED)
    args = search_config(candidates=candidates, max_new_tokens=8, **over)
    monkeypatch.setattr(mh.rollout, "run_episodes", fake.run_episodes)
    monkeypatch.setattr(mh.rollout, "evaluate", fake.evaluate)
    result = mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), work / "run", args, iterations)
    proposals = [r for r in map(json.loads, open(work / "run" / "summary.jsonl")) if r["iteration"] > 0]
    return result, proposals, work / "run"


def test_mutate_reaches_the_combination_of_two_good_knobs_within_budget(tmp_path, monkeypatch):
    # 7 knobs with one other value each, 2 candidates per iteration: every knob is tried by iteration 4, and a
    # knob found good stays in the best that later steps start from, so A = B = 1 is reached by then
    result, proposals, run_dir = search(tmp_path, monkeypatch, iterations=4)
    assert result["score"] == pytest.approx(0.5)
    assert knobs(result["winner"])["A"] == 1 and knobs(result["winner"])["B"] == 1
    assert len(json.loads((run_dir / "frontier.json").read_text())["lineage"]) >= 3  # h0 -> one -> both


def test_mutate_climbs_a_chain_of_knobs_that_each_pay_only_after_the_one_before(tmp_path, monkeypatch):
    # as searchqa on SmolLM2-135M: the example pays a little alone, search-first only with the example, the
    # first-line answer only with both. From every new best the knobs are tried again in SEARCH_SPACE order
    # (--mutate-order listed), so 3 candidates per iteration climb it in 3 iterations (counting tries over the
    # whole archive would spend iterations 2 and 3 on the untried knobs D, E, F instead)
    chain = lambda v: 0.1 * v["A"] + 0.2 * v["A"] * v["B"] + 0.3 * v["A"] * v["B"] * v["C"]
    result, proposals, run_dir = search(tmp_path, monkeypatch, iterations=3, candidates=3, fake=FakeRollout(score=chain),
                                        mutate_order="listed")
    assert result["score"] == pytest.approx(0.6)
    assert {k: knobs(result["winner"])[k] for k in "ABC"} == {"A": 1, "B": 1, "C": 1}
    lineage = json.loads((run_dir / "frontier.json").read_text())["lineage"]
    assert len(lineage) == 4  # h0 -> A -> A, B -> A, B, C


def test_mutate_tries_every_knob_once_before_any_twice(tmp_path, monkeypatch):
    _, proposals, _ = search(tmp_path, monkeypatch, iterations=6, fake=FakeRollout(gain=0.0))  # nothing improves
    steps = [r["changed"] for r in proposals if ";" not in r["changed"]]  # one-knob steps (not compositions)
    assert len({change.split(":")[0] for change in steps[:7]}) == 7


def test_mutate_crosses_a_plateau_by_combining_the_changes_that_left_the_score_equal(tmp_path, monkeypatch):
    # as searchqa on SmolLM2-135M under h0: every single fix scores 0, only A and B together pay
    both = lambda v: 0.5 * v["A"] * v["B"]
    result, proposals, run_dir = search(tmp_path, monkeypatch, iterations=2, candidates=2, fake=FakeRollout(score=both),
                                        mutate_order="listed")
    assert [r["changed"] for r in proposals[:2]] == ["A: 0 -> 1", "B: 0 -> 1"]  # SEARCH_SPACE order, both 0
    assert proposals[2]["changed"] == "A: 0 -> 1; B: 0 -> 1" and proposals[2]["score"] == pytest.approx(0.5)
    assert "alone each left it equal" in proposals[2]["hypothesis"]
    assert result["score"] == pytest.approx(0.5)


def test_mutate_composes_changes_that_each_raised_the_score(tmp_path, monkeypatch):
    # iteration 1 with 7 candidates changes every knob once from h0: A and B each raise the score; the one
    # candidate of iteration 2 is then the best of them with the other one added, not another single step
    _, proposals, run_dir = search(tmp_path, monkeypatch, iterations=1, candidates=7)
    assert sorted(r["changed"].split(":")[0] for r in proposals) == sorted(ALL)
    result, proposals, run_dir = search(tmp_path, monkeypatch, iterations=2, candidates=1)
    composed = next(r for r in proposals if r["name"] == "h2_1")
    assert composed["score"] == pytest.approx(0.5) and result["winner"].endswith("h2_1/harness.py")
    assert knobs(run_dir / "candidates" / "h2_1" / "harness.py") == {**knobs(run_dir / "candidates" / "h0" / "harness.py"),
                                                                     "A": 1, "B": 1}
    assert composed["parent"] in [r["name"] for r in proposals if r["changed"] in ("A: 0 -> 1", "B: 0 -> 1")]


def test_mutate_is_deterministic_per_archive_and_respects_prompt_only(tmp_path, monkeypatch):
    def sources(run_dir):
        return [(d / "harness.py").read_text() for d in sorted((run_dir / "candidates").iterdir())
                if (d / "harness.py").exists()]
    one = search(tmp_path / "x", monkeypatch, iterations=3)[2]
    two = search(tmp_path / "y", monkeypatch, iterations=3)[2]
    assert sources(one) == sources(two)  # the same archive name and seed: the same proposals
    result, proposals, _ = search(tmp_path / "z", monkeypatch, iterations=2, fake=FakeRollout(prompt_gain=0.3),
                                  prompt_only=True)
    assert [r["changed"] for r in proposals if r["valid"]] == ["PROMPT: 'Answer: ' -> 'Reply: '"]  # strings only
    assert result["score"] == pytest.approx(0.4)


def first_round(work, monkeypatch, **over):
    """The knobs iteration 1 steps, in order, when it has a candidate for every knob (nothing improves)."""
    _, proposals, _ = search(work, monkeypatch, iterations=1, candidates=len(ALL), fake=FakeRollout(gain=0.0), **over)
    return [r["changed"].split(":")[0] for r in proposals]


def test_mutate_draws_its_knob_order_from_the_seed(tmp_path, monkeypatch):
    from lib.mutate import search_order
    rank = lambda order: list(dict.fromkeys(knob for knob, _ in sorted(order, key=order.get)))
    assert rank(search_order(SEED, 0)) == rank(search_order(SEED, 0))  # a function of the seed: resumes the same
    assert len({tuple(rank(search_order(SEED, seed))) for seed in range(5)}) > 1
    assert rank(search_order(SEED, 0, "listed")) == list(ALL) == rank(search_order(SEED, 7, "listed"))
    assert sorted(search_order(SEED, 3)) == sorted(search_order(SEED, 3, "listed"))  # a reordering: every value kept
    # through the search: iteration 1 tries every knob once, in the seed's order
    seeded = [first_round(tmp_path / f"s{seed}", monkeypatch, seed=seed) for seed in (0, 1)]
    assert seeded[0] == rank(search_order(SEED, 0)) and seeded[1] == rank(search_order(SEED, 1))
    assert seeded[0] != seeded[1] and sorted(seeded[0]) == sorted(ALL)
    assert first_round(tmp_path / "again", monkeypatch, seed=0) == seeded[0]
    assert first_round(tmp_path / "listed", monkeypatch, seed=1, mutate_order="listed") == list(ALL)


# --mutate-order traces: the parent's harness-set traces, sorted into failure kinds (lib/failures.py), choose
# which knobs its SKILL says to try first; within a kind the seed orders them
SKILL = {"no_tool": ["E", "F"], "cut": ["C", "D"], "wrong": ["A"]}
EPISODES = {  # one failed episode of each kind, as the runner writes it (no gold answer anywhere)
    "erred": {"reward": 0.0, "error": "deadline", "answer": None, "extracted": None, "calls": [], "tool_calls": []},
    "cut": {"reward": 0.0, "error": None, "answer": "x = 12 +", "extracted": None,
            "calls": [{"completion": "x = 12 +", "tokens": 32, "max_tokens": 32}], "tool_calls": []},
    "no_answer": {"reward": 0.0, "error": None, "answer": None, "extracted": None,
                  "calls": [{"completion": "I think", "tokens": 3, "max_tokens": 32}], "tool_calls": []},
    "no_tool": {"reward": 0.0, "error": None, "answer": "Paris", "extracted": "Paris",
                "calls": [{"completion": "Paris", "tokens": 2, "max_tokens": 32}],
                "tool_calls": [{"name": "search", "result": ["Tarsk is a city."]}]},
    "wrong": {"reward": 0.0, "error": None, "answer": "Tarsk", "extracted": "Tarsk",
              "calls": [{"completion": "Tarsk", "tokens": 2, "max_tokens": 32}],
              "tool_calls": [{"name": "search", "result": ["Tarsk is a city."]}]},
}


class TracingRollout(FakeRollout):
    """Every episode fails as `kind`; nothing changes the score, so only the traces can order the knobs."""

    def __init__(self, kind):
        super().__init__(gain=0.0)
        self.kind = kind

    def evaluate(self, domain, harness_path, tasks, backend, k=1, traces_path=None, **kw):
        stats = super().evaluate(domain, harness_path, tasks, backend, k=k, traces_path=traces_path, **kw)
        Path(traces_path).write_text("".join(json.dumps({"task_id": t["id"], **EPISODES[self.kind]}) + "\n"
                                             for t in tasks))
        return stats


def traced_round(work, monkeypatch, kind, seed=0, skill=SKILL, candidates=2):
    """The knobs iteration 1 steps from h0, in order, when every h0 episode fails as `kind`."""
    monkeypatch.setitem(globals(), "SEED", skilled(skill))  # the seed harness search() writes
    _, proposals, _ = search(work, monkeypatch, iterations=1, candidates=candidates, fake=TracingRollout(kind),
                             seed=seed, mutate_order="traces")
    monkeypatch.undo()
    return [r["changed"].split(":")[0] for r in proposals], proposals


def skilled(skill=SKILL, source=SEED):
    return source + f"\nSKILL = {skill!r}\n"


def test_failure_kinds_of_episodes():
    from lib.failures import failure_kind
    assert {kind: failure_kind(e) for kind, e in EPISODES.items()} == {kind: kind for kind in EPISODES}
    assert failure_kind({**EPISODES["wrong"], "reward": 1.0}) is None  # a success is no failure
    assert failure_kind({**EPISODES["no_tool"], "tool_calls": []}) == "no_tool"  # the tool never called


def test_traces_order_tries_first_the_skill_knobs_for_the_failure_kind_the_traces_show(tmp_path, monkeypatch):
    for kind in ("no_tool", "cut"):
        for seed in (0, 1, 2):
            knobs, proposals = traced_round(tmp_path / f"{kind}{seed}", monkeypatch, kind, seed)
            assert sorted(knobs) == sorted(SKILL[kind])  # both candidates: that kind's knobs
            assert f"as {kind}" in proposals[0]["hypothesis"]  # and the proposal says why
    # within a kind the seed orders the knobs: both orders occur over a few seeds, each resumes the same
    firsts = {traced_round(tmp_path / f"order{seed}", monkeypatch, "no_tool", seed, candidates=1)[0][0]
              for seed in range(6)}
    assert firsts == {"E", "F"}
    # the kind's knobs first, then the next: with 4 candidates and one kind seen, the other two follow the seed
    knobs, _ = traced_round(tmp_path / "four", monkeypatch, "wrong", candidates=3)
    assert knobs[0] == "A" and "A" not in knobs[1:]


def test_traces_order_falls_back_to_the_seeded_order_without_a_skill_for_that_kind(tmp_path, monkeypatch):
    from lib.mutate import search_order
    rank = lambda order: list(dict.fromkeys(knob for knob, _ in sorted(order, key=order.get)))
    knobs, _ = traced_round(tmp_path / "erred", monkeypatch, "erred", candidates=3)  # SKILL has nothing for erred
    assert knobs == rank(search_order(skilled(), 0))[:3]


def test_a_skill_naming_a_knob_outside_search_space_is_refused_in_one_line(tmp_path):
    from lib.contract import check_harness, static_check
    bad = SEED + '\nSKILL = {"no_tool": ["E", "TOP_K"]}\n'
    reason = static_check(bad)
    assert reason == "SKILL['no_tool'] names knob 'TOP_K', which is not in SEARCH_SPACE (line 17)"
    assert static_check(SEED + '\nSKILL = {"slow": ["E"]}\n').startswith("SKILL names failure kind 'slow'")
    assert static_check(skilled()) is None
    path = tmp_path / "h.py"
    path.write_text(bad)
    with pytest.raises(ValueError) as e:
        check_harness(path)
    assert str(e.value) == f"{path}:17: SKILL['no_tool'] names knob 'TOP_K', which is not in SEARCH_SPACE"
