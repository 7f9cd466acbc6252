"""The paper preset against the official code (docs/fidelity.md): searchqa's harness set as the official builder
draws it; a paper chess candidate changes only what the official contract lets it."""
import argparse
import json
from pathlib import Path

import pytest

import domains
from lib.paper import paper_data
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


# -----------------------------------------------------------------------------
# issue 49: the proposer's brief against the harness contract, the paper preset's retriever, the verifier on record

LLM_MESSAGES = [{"role": "user", "content": "q"}]
# a value the runner accepts for each keyword of llm(); a keyword the worker's llm() gains without one here fails
# the test below, as it would fail the brief (lib/briefs.py KEYWORDS)
KEYWORD_VALUES = {"tools": [{"type": "function", "function": {"name": "search"}}], "max_tokens": 5,
                  "stop": ["</answer>"]}


def written_brief(tmp_path, brief, domain="searchqa"):
    from types import SimpleNamespace
    from lib import proposers
    folder = tmp_path / brief
    folder.mkdir(parents=True)
    cfg = SimpleNamespace(prompt_only=False, null_check="refuse", null_margin=0.05, proposer_brief=brief)
    return proposers.write_instructions(folder, domains.get(domain), ["h1_1"], "h0", 1, cfg).read_text()


def test_the_brief_names_every_keyword_and_role_the_runner_accepts(tmp_path):
    """The brief's llm() lines against the contract the runner enforces (lib/episodes/runner.py llm_request) and the
    worker's llm() (lib/episodes/harness_process.py): each keyword and role the runner accepts is in INSTRUCTIONS.md,
    under every brief; it once said llm(messages, max_tokens=None) with three roles."""
    from lib import briefs
    from lib.episodes import runner
    keywords = [arg.arg for arg in briefs.worker_llm().args.args][1:]
    assert {"tools", "stop", "max_tokens"} <= set(keywords)
    with pytest.raises(ValueError, match="unknown keys"):  # the runner checks its keys: the list below is its own
        runner.llm_request({"llm": LLM_MESSAGES, "temperature": 0.5}, 16)
    for brief in briefs.BRIEFS:
        text = written_brief(tmp_path, brief)
        assert f"`llm(messages, {', '.join(f'{k}=None' for k in keywords)}) -> str`" in text
        for keyword in keywords:
            runner.llm_request({"llm": LLM_MESSAGES, keyword: KEYWORD_VALUES[keyword]}, 16)  # accepted
            assert f"  - `{keyword}=`: " in text, (brief, keyword)
        for role in runner.ROLES:
            runner.llm_request({"llm": [{"role": role, "content": "x"}]}, 16)  # accepted
            assert f'"{role}"' in text.split("`messages`", 1)[1].split("\n", 1)[0], (brief, role)
        assert f"at most {runner.MAX_STOPS} strings of at most {runner.MAX_STOP_CHARS} characters" in text


def test_the_paper_and_gpu_briefs_hold_the_official_rules_only(tmp_path):
    """The project's two rules for a small policy are in the cpu and smoke presets' brief only (docs/fidelity.md
    setting 4); each domain's brief holds its official skill's rules, and no other: searchqa's "if the last 3
    iterations explored the same axis, pick different ones" and distinct hypotheses on different axes; math's
    skill has no rule on axes or on how a round's candidates differ; chess's none on hypotheses or stopping."""
    from presets import PRESETS
    assert {name: PRESETS[name]["proposer_brief"] for name in PRESETS} == {
        "smoke": "small-model", "cpu": "small-model", "gpu": "official", "paper": "official"}
    rules = {"searchqa": ("if the last 3 iterations explored the same axis, pick different ones",
                          "distinct hypotheses on different axes", "one falsifiable hypothesis tied to a failure",
                          "Do not stop early"),
             "math": ("one falsifiable hypothesis tied to a failure", "Do not stop early"),
             "chess": ("one concrete mechanism chosen from the failures the traces show",)}
    for domain, own_rules in rules.items():
        official = written_brief(tmp_path / domain, "official", domain).replace("\n   ", " ").replace("\n", " ")
        small = written_brief(tmp_path / domain, "small-model", domain).replace("\n   ", " ").replace("\n", " ")
        for own in ("Keep prompts short", "exploring new ideas"):
            assert own not in official and own in small
        for rule in ("changes ONE mechanism", "not a sweep of constants", *own_rules):
            assert rule in official and rule in small, (domain, rule)
        others = {rule for d, rs in rules.items() if d != domain for rule in rs} - set(own_rules)
        for rule in (*others, "other than the last iterations", "different mechanisms"):
            assert rule not in official, (domain, rule)


@pytest.mark.parametrize("flags", [["--wiki", "wiki-18.jsonl"], ["--wiki-limit", "1000"]])
def test_the_paper_preset_refuses_bm25_without_its_flag(flags, capsys):
    """--wiki / --wiki-limit under --preset paper: one line naming the official retriever and the flag; with
    --paper-with-bm25 the plan runs; the gpu preset is not refused; the flag enters no reuse key."""
    import plan
    run = ["--domain", "searchqa", "--method", "whale", *flags, "--preset", "paper"]
    with pytest.raises(SystemExit) as e:
        plan.main(run)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err
    assert "not the official retriever (Search-R1's e5 server" in err and "add --paper-with-bm25" in err
    plan.main([*run, "--paper-with-bm25"])
    assert "296 RSFT steps" in capsys.readouterr().out
    plan.main([*run[:-1], "gpu"])
    assert "preset gpu" in capsys.readouterr().out
    assert "paper_with_bm25" not in domains.data_flags() and "wiki" in domains.data_flags()


def test_summary_json_and_the_table_header_name_the_verifier(tmp_path, monkeypatch):
    """A searchqa run records the verifier it was scored by (here the LLM judge, stood in: no request is sent) and
    what it read (the scoring rule) in summary.json, and report.py's table headers show both, the null model's
    table's too; without --judge-url it is exact match."""
    import report
    import whale
    from lib.paper import judge
    monkeypatch.setattr(judge.Judge, "ask", lambda self, prompt: 0)
    assert domains.get("searchqa").verifier() == "exact match"
    out = tmp_path / "results" / "smoke" / "searchqa" / "weight-only"
    whale.main(["--domain", "searchqa", "--method", "weight-only", "--preset", "smoke", "--epochs", "0.5",
                "--out", str(out), "--judge-url", "http://127.0.0.1:9/v1", "--judge-model", "judge-m"])
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["verifier"], summary["scoring"]) == ("LLM judge judge-m", "the harness's answer")
    report.main(["--preset", "smoke", "--results", str(tmp_path / "results")])
    tables = (tmp_path / "results" / "smoke" / "tables.md").read_text()
    # the score's table and the null model's both name the verifier and what it read (the smoke preset's data is
    # the bundled one: the harness's answer)
    header = "| method | searchqa (LLM judge judge-m; on the harness's answer) | math | chess |"
    assert tables.count(header) == 2
    assert tables.index(header, tables.index("the final harness without the model")) > 0


def test_another_judge_prompt_is_read_from_a_file(tmp_path, monkeypatch):
    """--judge-prompt FILE replaces the project's wording (the official text, say); a file without the three fields
    is a one-line error; the verdict cache keeps each prompt's verdicts apart."""
    from lib.paper import judge
    sent = []
    monkeypatch.setattr(judge.Judge, "post", lambda self, prompt: sent.append(prompt) or "CORRECT")
    path = tmp_path / "v11.txt"
    path.write_text("Judge.\nQuestion: {question}\nReference answer(s): {gold}\nPredicted answer: {prediction}\n")
    flags = argparse.Namespace(judge_url="http://127.0.0.1:9/v1", judge_model="m", judge_key_env=None,
                               judge_prompt=str(path))
    mine = judge.judge_from_flags(flags, str(tmp_path / "run"))
    assert mine.verdict("Who?", ["Homer", "Homère"], "Homer", fallback=0) == 1
    assert sent == ["Judge.\nQuestion: Who?\nReference answer(s): Homer | Homère\nPredicted answer: Homer\n"]
    default = judge.judge_from_flags(argparse.Namespace(**{**vars(flags), "judge_prompt": None}), str(tmp_path / "run"))
    assert default.cache == {} and judge.Judge("u", "m", cache_path=str(tmp_path / "run" / "judge_cache.jsonl"),
                                               prompt=path.read_text()).cache == {("Who?", "Homer"): 1}
    path.write_text("Question: {question}\nPredicted answer: {prediction}\n")
    with pytest.raises(ValueError, match=r"--judge-prompt .*v11.txt: no \{gold\} in it"):
        judge.read_prompt(str(path))


# -----------------------------------------------------------------------------
# what the verifier reads: the model's last message under the paper's data (the official verifiers)

REWRITER = '''"""A candidate that rewrites what it returns: its model's first answer, or with FIXED its own."""
FIXED = None


def run(task, llm, tools):
    first = llm([{"role": "user", "content": task["question"]}])
    llm([{"role": "user", "content": "Check it and answer again."}])
    return {"answer": FIXED if FIXED is not None else first.split("<answer>")[-1].split("</answer>")[0]}
'''


class Replies:
    """A backend replying with the given texts in turn (each episode asks twice: the first reply, the last)."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts = tokenizer, texts

    def generate(self, prompts, *, max_new_tokens, seeds, **_):
        return [self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False) for _ in prompts]


def picked(reply):
    """What REWRITER returns of a reply (without FIXED)."""
    return reply.split("<answer>")[-1].split("</answer>")[0]


def scored(domain, harness, texts, tokenizer, task):
    """The episode's record of `harness` on `task` under a model replying `texts`."""
    import rollout
    from lib.backends.hf_backend import NullModelBackend
    backend = Replies(tokenizer, list(texts)) if texts is not None else NullModelBackend(tokenizer)
    [record] = rollout.run_episodes(domain, str(harness), [task], backend, max_new_tokens=64)
    return record


@pytest.mark.parametrize("name, task, first, last, rewritten", [
    # searchqa: an <answer> of an earlier turn, and the innermost <answer> of the last one (official: the last
    # </answer> and the nearest <answer> before it)
    ("searchqa", {"id": "q1", "question": "Capital of Zorbia?", "answers": ["Quelm"]},
     "<answer>Quelm</answer>", "It could be <answer>Ost <answer>Varn</answer>", "Quelm"),
    # math: the last \boxed{} in the last 100 characters of the last message; the harness boxes a value itself
    ("math", {"id": "m1", "question": "6 x 7?", "answer": "42"},
     "It is \\boxed{42}.", "Recounting: \\boxed{41}.", "\\boxed{42}"),
])
def test_under_the_paper_data_a_rewritten_answer_scores_as_the_models_last_message(tmp_path, name, task, first,
                                                                                    last, rewritten):
    """A candidate that returns the model's first reply, or an answer of its own, earns with --data paper exactly
    what the model's last message earns (here 0: its last reply is wrong), and the record keeps the answer it
    returned and names the rule; with the bundled data (the cpu and smoke presets) the returned answer is scored,
    as before (here 1). Under the null model the harness's own answer earns nothing under the paper's rule."""
    from transformers import AutoTokenizer
    from lib.backends.models import build_smoke, cached
    tokenizer = AutoTokenizer.from_pretrained(cached("smoke-v2", build_smoke))
    paper, bundled = domains.get(name, paper_args()), domains.get(name)
    if name == "searchqa":
        paper.retriever = None  # no search is made: the tools need no retriever
    assert (paper.scoring, bundled.scoring) == ("last-message", "answer")
    for fixed in (None, rewritten):
        harness = tmp_path / f"rewriter_{fixed is None}.py"
        harness.write_text(REWRITER.replace("FIXED = None", f"FIXED = {fixed!r}"))
        mine = scored(paper, harness, [first, last], tokenizer, task)
        assert mine["reward"] == 0.0 and mine["scoring"] == "the model's last message"
        assert mine["answer"] == (fixed or picked(first))  # recorded beside, not scored
        assert mine["extracted"] == {"searchqa": "Varn", "math": "41"}[name]
        theirs = scored(bundled, harness, [first, last], tokenizer, task)
        assert theirs["reward"] == 1.0 and theirs["scoring"] == "the harness's answer"
        # the same last message right: the paper's rule scores it, whatever the harness returns
        right = scored(paper, harness, [last, first], tokenizer, task)
        assert right["reward"] == 1.0 and right["answer"] == (fixed or picked(last))
    own = scored(paper, harness, None, tokenizer, task)  # FIXED: the harness answers by itself
    assert own["reward"] == 0.0 and scored(bundled, harness, None, tokenizer, task)["reward"] == 1.0


def test_the_scoring_rule_is_the_flag_or_the_datas_and_chess_plays_its_moves():
    assert domains.get("math", paper_args("--scoring", "answer")).scoring_rule() == "the harness's answer"
    assert domains.get("math", {"scoring": "last-message"}).scoring_rule() == "the model's last message"
    assert domains.get("chess", paper_args()).scoring_rule() == domains.get("chess").scoring_rule() == \
        "the moves played"
    assert domains.innermost_answer("<answer>foo<answer></answer>") == ""  # as the official _inner_most_extract
    assert domains.innermost_answer("<answer>a</answer> then </answer>") == "a</answer> then"
    assert domains.innermost_answer("no tags</answer>") is None


# -----------------------------------------------------------------------------
# the fidelity table (docs/fidelity.json) against presets.py, the code and docs/fidelity.md

ROOT = Path(__file__).resolve().parents[1]
PAPER_DOMAINS = ("searchqa", "math", "chess")
# the settings that live in the code, not the preset: each row's value per domain, read off the code now
CODE_SETTINGS = {
    "scoring": lambda d: domains.get(d, paper_args()).scoring_rule(),
    "math_box_tail": lambda d: domains.MATH_TAIL_CHARS,
    "searchqa_verifier": lambda d: domains.get(d, paper_args()).verifier(),
    "model_calls_cap": lambda d: domains.DOMAINS[d].MODEL_CALLS,
    "retry_cap": lambda d: domains.DOMAINS[d].MAX_RETRIES,
    "success_threshold": lambda d: __import__("lib.rules", fromlist=["SUCCESS"]).SUCCESS,
    "search_top_k_cap": lambda d: domains.MAX_SEARCH_K,
    "search_query_cut": lambda d: domains.MAX_QUERY_CHARS,
    "brief_axis_rule": lambda d: "last 3 iterations explored the same axis" in " ".join(
        domains.DOMAINS[d].BRIEF.split()),
    "brief_different_axes": lambda d: "different axes" in domains.DOMAINS[d].SKILL_RULES,
}


def per_domain(value):
    return value if isinstance(value, dict) else {d: value for d in PAPER_DOMAINS}


def fidelity_problems(doc=None):
    """Every disagreement between presets.py (and the code), docs/fidelity.json and docs/fidelity.md (or `doc`, its
    text), one line each."""
    import presets
    import whale
    table = json.loads((ROOT / "docs" / "fidelity.json").read_text())["settings"]
    doc = doc if doc is not None else (ROOT / "docs" / "fidelity.md").read_text()
    runs = {d: vars(whale.parse_args(["--domain", d, "--preset", "paper"])[0]) for d in PAPER_DOMAINS}
    problems = []
    keys = set(presets.PRESETS["paper"]).union(*(presets.PAPER[d] for d in PAPER_DOMAINS))
    listed = {r["setting"] for r in table if r["where"] == "preset"}
    problems += [f"{key}: a paper preset setting with no row in docs/fidelity.json" for key in sorted(keys - listed)]
    problems += [f"{key}: a code setting with no reader in CODE_SETTINGS" for key in
                 sorted({r["setting"] for r in table if r["where"] == "code"} - set(CODE_SETTINGS))]
    for row in table:
        name, ours, official = row["setting"], per_domain(row["ours"]), per_domain(row["official"])
        for d, value in ours.items():
            now = runs[d][name] if row["where"] == "preset" else CODE_SETTINGS.get(name, lambda d: value)(d)
            if now != value:
                problems.append(f"{name} ({d}): the code has {now!r}, docs/fidelity.json {value!r}")
        if row.get("port"):  # our h0 file is the port of the official one: its docstring names that file
            for d, path in ours.items():
                first = (ROOT / path).read_text().splitlines()[0]
                if official[d].split("/", 2)[2] not in first:
                    problems.append(f"{name} ({d}): {path} does not name {official[d]} in its first line")
        elif row["status"] == "official" and ours != {d: official[d] for d in ours}:
            problems.append(f"{name}: ours {row['ours']!r}, official {row['official']!r}, but status official: state "
                            "it (status stated and a docs/fidelity.md row) or make it the official value")
        if row["status"] == "stated" and f"\n| {row.get('doc')} |" not in doc:
            problems.append(f"{name}: status stated, but docs/fidelity.md has no row '| {row.get('doc')} |'")
        if row["status"] not in ("official", "stated"):
            problems.append(f"{name}: status {row['status']!r} is neither official nor stated")
        for source in row["source"] or [None]:
            if not (source and source.get("file") and len(source.get("commit", "")) == 40
                    and (isinstance(source.get("line"), int) and source["line"] > 0 or source.get("anchor"))):
                problems.append(f"{name}: a source needs a file, a 40-digit commit and a line (or an anchor): {source}")
    counts = {s: sum(r["status"] == s for r in table) for s in ("official", "stated")}
    count = (f"The table holds {len(table)} settings of the paper preset: {counts['official']} as official, "
             f"{counts['stated']} stated, 0 unstated.")
    if count not in " ".join(doc.split()):
        problems.append(f"docs/fidelity.md does not say: {count}")
    return problems


def test_the_fidelity_table_presets_and_doc_agree():
    """docs/fidelity.json lists every setting of the paper preset (presets.py PRESETS["paper"], PAPER[domain], and
    the code's settings it names) with our value as the code has it, the official value and its source (file, commit,
    line); an official row's values are equal, a stated one has its row in docs/fidelity.md, whose count of the rows
    is right."""
    assert fidelity_problems() == []


@pytest.mark.parametrize("change", ["preset", "code", "doc"])
def test_the_fidelity_check_fails_when_one_side_changes(monkeypatch, change):
    """One preset value (the paper's top-k), one code constant (the search cap), a stated row's reason or the doc's
    count changed alone: the check names it."""
    import presets
    if change == "preset":
        monkeypatch.setitem(presets.PRESETS["paper"], "top_k", 40)
        assert fidelity_problems() == ["top_k (searchqa): the code has 40, docs/fidelity.json 20",
                                       "top_k (math): the code has 40, docs/fidelity.json 20",
                                       "top_k (chess): the code has 40, docs/fidelity.json 20"]
    elif change == "code":
        monkeypatch.setattr(domains, "MAX_SEARCH_K", 1)
        assert fidelity_problems() == ["search_top_k_cap (searchqa): the code has 1, docs/fidelity.json 10"]
    else:
        doc = (ROOT / "docs" / "fidelity.md").read_text()
        [problem] = fidelity_problems(doc.replace("| gradient checkpointing |", "| checkpointing |"))
        assert problem == ("grad_checkpointing: status stated, but docs/fidelity.md has no row "
                           "'| gradient checkpointing |'")
        [problem] = fidelity_problems(doc.replace(" 13 stated", " 12 stated"))
        assert problem.startswith("docs/fidelity.md does not say: The table holds 56 settings")
