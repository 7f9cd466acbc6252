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
# the fidelity table (docs/fidelity.json): the paper run's whole config and every constant that can change a
# result, each row's value read off the code, official rows citing a line, stated rows their reason; docs/fidelity.md
# generated from it (scripts/fidelity_doc.py)

import ast
import importlib

ROOT = Path(__file__).resolve().parents[1]
PAPER_DOMAINS = ("searchqa", "math", "chess")
# the modules on a paper run's path whose upper-case constants (module level and class level) the table accounts for
RUN_MODULES = ("whale.py", "rft.py", "rollout.py", "meta_harness.py", "domains.py", "presets.py", "lib/**/*.py")


def optimizer_defaults(d):
    """AdamW's settings as rft.py builds the optimizer (torch's defaults where it passes none)."""
    import torch
    import rft
    cfg = argparse.Namespace(lr=1e-5, weight_decay=0.01, warmup=0)
    optimizer, _ = rft.new_optimizer(torch.nn.Linear(2, 2), cfg)
    return optimizer.defaults


def judge_body(d):
    """The request body the LLM judge sends (no request leaves: the transport is stood in)."""
    from lib.paper import judge
    sent, request_json = [], judge.web.request_json
    judge.web.request_json = lambda url, body, **kw: sent.append(body) or {"choices": [{"message": {"content": "x"}}]}
    try:
        judge.Judge("http://127.0.0.1:9/v1", "m").post("p")
    finally:
        judge.web.request_json = request_json
    return sent[0]


def retriever_failure(d):
    """How the paper's retriever client fails: its timeout, its retries, then what the episode gets."""
    from lib.paper.retriever import RetrieverClient
    client = RetrieverClient("http://127.0.0.1:9/retrieve")
    return {"timeout_s": client.timeout, "retries": 0 if client.retry_wait is None else 1,
            "then": "infrastructure error"}


def script_phase(d):
    """The harness phase `meta_harness.py --preset paper` runs: the preset's settings its flags take (SCRIPT_FLAGS)."""
    import presets
    settings = presets.preset_defaults("paper", d, "paper", None)
    return {flag: settings[key] for key, flag in presets.SCRIPT_FLAGS.items()}


def written_brief_text(d, brief="official"):
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        return " ".join(written_brief(Path(tmp), brief, d).split())


# the rules that live in the code (where "code"): each row's value per domain, read off the code now
CODE_SETTINGS = {
    "scoring_rule": lambda d: domains.get(d, paper_args()).scoring_rule(),
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
    "adamw_betas": lambda d: list(optimizer_defaults(d)["betas"]),
    "adamw_eps": lambda d: optimizer_defaults(d)["eps"],
    "judge_temperature": lambda d: judge_body(d)["temperature"],
    "retriever_failure": retriever_failure,
    "math_training_window": lambda d: (f"{domains.get(d, paper_args()).scoring_rule()}, its last "
                                       f"{domains.MATH_TAIL_CHARS} characters"),
    "meta_harness_script_phase": script_phase,
    "candidate_axis": lambda d: "`axis` (the letter" in written_brief_text(d),
    "brief_chess_wording": lambda d: "falsifiable" in written_brief_text(d),
    "harness_contract": lambda d: list(__import__("lib.contract", fromlist=["x"]).ALLOWED_IMPORTS),
    "proposer_tools": lambda d: __import__("lib.proposers", fromlist=["x"]).CLAUDE_TOOLS,
    "winner_rule": lambda d: __import__("lib.rules", fromlist=["x"]).WINNER_RULE,
    "math_tool_output": lambda d: domains.get(d, paper_args()).tools(None).max_chars,
    "math_tool": lambda d: {"timeout_s": domains.PYTHON_TIMEOUT_S,
                            "memory_bytes": __import__("lib.episodes.python_tool", fromlist=["x"]).PYTHON_MEMORY_BYTES},
}


def per_domain(value):
    return value if isinstance(value, dict) and value and set(value) <= set(PAPER_DOMAINS) else \
        {d: value for d in PAPER_DOMAINS}


def plain(value):
    """A value as JSON holds it (tuples as lists), so the code's and the table's compare."""
    return json.loads(json.dumps(value))


def run_constants():
    """Every upper-case constant of RUN_MODULES: 'module:NAME' and 'module:Class.NAME', found in the source."""
    names = []
    for pattern in RUN_MODULES:
        for path in sorted(ROOT.glob(pattern)):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.parse(path.read_text()).body:
                scopes = [("", [node])] + ([(node.name + ".", node.body)] if isinstance(node, ast.ClassDef) else [])
                for prefix, body in scopes:
                    for stmt in body:
                        targets = stmt.targets if isinstance(stmt, ast.Assign) else \
                            [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
                        for t in (e for target in targets for e in ast.walk(target)):
                            if isinstance(t, ast.Name) and t.id.isupper() and not t.id.startswith("_"):
                                names.append(f"{module}:{prefix}{t.id}")
    return sorted(set(names))


def constant_value(name):
    module, attr = name.split(":")
    value = importlib.import_module(module)
    for part in attr.split("."):
        value = getattr(value, part)
    return value


# a constant a row covers has its value in the row's `values` when its JSON is at most this long (a number, a flag,
# a dataset's name, a short rule); longer ones (the briefs, FOLDER's script, the presets' whole table) are what the
# row's text describes. The worker's script runs at import: its constants (the sandbox's guards, a machine's path)
# stay names under harness_contract.
SHORT_VALUE = 200
WORKER_SCRIPT = "lib.episodes.harness_process:"


def covered_values(row):
    """{constant the row covers: its value now} for those short enough to be in the row."""
    values = {}
    for name in row.get("covers", ()):
        if not name.startswith(WORKER_SCRIPT):
            value = plain(constant_value(name))
            if len(json.dumps(value)) <= SHORT_VALUE:
                values[name] = value
    return values


def result_free(name, free):
    """The reason `name` changes no result: its own entry, its module's ('module:*') or a package's ('pkg.*')."""
    module = name.split(":")[0]
    packages = [".".join(module.split(".")[:i]) + ".*" for i in range(1, module.count(".") + 1)]
    for key in (name, module + ":*", *packages):
        if key in free:
            return free[key]
    return None


def source_problem(name, source):
    if not (source.get("file") and len(source.get("commit", "")) == 40 and isinstance(source.get("line"), int)
            and source["line"] > 0):
        return f"{name}: a source needs a file, a 40-digit commit and a line: {source}"
    return None


def fidelity_problems(table=None, doc=None):
    """Every disagreement between the code, docs/fidelity.json (or `table`) and docs/fidelity.md (or `doc`, its
    text), one line each, naming the setting."""
    import whale
    sys_path_scripts()
    import fidelity_doc
    table = table if table is not None else json.loads((ROOT / "docs" / "fidelity.json").read_text())
    doc = doc if doc is not None else (ROOT / "docs" / "fidelity.md").read_text()
    rows, problems = table["settings"], []
    runs = {d: vars(whale.parse_args(["--domain", d, "--preset", "paper"])[0]) for d in PAPER_DOMAINS}
    keys = set().union(*(runs[d] for d in PAPER_DOMAINS))
    config_rows = {r["setting"] for r in rows if r["where"] == "config"}
    problems += [f"{key}: a key of a paper run's config.json with no row in docs/fidelity.json"
                 for key in sorted(keys - config_rows)]
    problems += [f"{key}: a config row, but no paper run's config.json has it" for key in sorted(config_rows - keys)]
    problems += [f"{r['setting']}: a code row with no reader in CODE_SETTINGS" for r in rows
                 if r["where"] == "code" and r["setting"] not in CODE_SETTINGS]
    deviations = {d["setting"] for d in table["deviations"]}
    for row in rows:
        name, ours, official = row["setting"], per_domain(row["ours"]), per_domain(row["official"])
        for d, value in ours.items():
            if row["where"] == "config":
                now = runs[d].get(name)
            elif row["where"] == "constant":
                now = constant_value(name)
            else:
                now = CODE_SETTINGS.get(name, lambda d: value)(d)
            if plain(now) != plain(value):
                problems.append(f"{name} ({d}): the code has {plain(now)!r}, docs/fidelity.json {value!r}")
        if row["status"] == "official":
            if row.get("port"):  # our h0 file is the port of the official one: its docstring names that file
                for d, path in ours.items():
                    if official[d].split("/", 2)[2] not in (ROOT / path).read_text().splitlines()[0]:
                        problems.append(f"{name} ({d}): {path} does not name {official[d]} in its first line")
            elif plain(ours) != plain({d: official[d] for d in ours}):
                problems.append(f"{name}: ours {row['ours']!r}, official {row['official']!r}, but status official: "
                                "state it (status stated, with its reason) or make it the official value")
            if not row["source"]:
                problems.append(f"{name}: status official, but no official file, commit and line")
        elif row["status"] == "stated":
            if not (isinstance(row.get("reason"), str) and row["reason"].strip()):
                problems.append(f"{name}: status stated, but no reason in docs/fidelity.json")
        else:
            problems.append(f"{name}: status {row['status']!r} is neither official nor stated")
        values, kept = covered_values(row), row.get("values", {})
        for covered in sorted(set(values) | set(kept)):
            now, table_value = values.get(covered, "no value"), kept.get(covered, "no value")
            if now != table_value:
                problems.append(f"{covered} (covered by {name}): the code has {now!r}, docs/fidelity.json "
                                f"{table_value!r}")
        if row.get("doc") and row["doc"] not in deviations:
            problems.append(f"{name}: doc {row['doc']!r} names no deviation of docs/fidelity.json")
        problems += [p for p in (source_problem(name, s) for s in row["source"]) if p]
    rowed = {r["setting"] for r in rows if r["where"] == "constant"}
    covered = {c for r in rows for c in r.get("covers", ())}
    free = table["result_free"]
    found = run_constants()
    for name in found:
        if name not in rowed | covered and not (result_free(name, free) or "").strip():
            problems.append(f"{name}: a constant of the run's code with no row, no row covering it and no reason "
                            "it changes no result (docs/fidelity.json result_free)")
    problems += [f"{name}: in docs/fidelity.json, but no such constant in the run's code"
                 for name in sorted((rowed | covered | {k for k in free if not k.endswith("*")}) - set(found))]
    if doc != fidelity_doc.render(table):
        problems.append("docs/fidelity.md is not what docs/fidelity.json makes: run python scripts/fidelity_doc.py")
    return problems


def sys_path_scripts():
    import sys
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))


def test_the_fidelity_table_is_the_paper_runs_whole_config_and_matches_the_code():
    """docs/fidelity.json has a row for every key of the config.json a --preset paper run writes (each domain) and
    accounts for every upper-case constant of the run's modules (a row, a row that covers it, or a reason it changes
    no result); each row's value is the code's; an official row equals the official value and cites its file,
    commit and line; a stated row carries its reason; docs/fidelity.md is the table rendered."""
    assert fidelity_problems() == []


def table_with(edit):
    table = json.loads((ROOT / "docs" / "fidelity.json").read_text())
    edit(table)
    return table


def row_of(table, name):
    return next(r for r in table["settings"] if r["setting"] == name)


@pytest.mark.parametrize("change", ["lora_alpha", "top_p", "harness_set_seed", "retry_wait", "covered", "reason",
                                    "line", "config_key", "constant", "doc"])
def test_the_fidelity_check_fails_naming_the_setting(monkeypatch, change):
    """One value changed in the code (rft.py's LoRA alpha default, the engines' top-p, math's harness-set seed, the
    retriever's retry wait, a constant a row covers), a stated row's reason emptied, an official row's line
    dropped, a config key or a constant without a row, or the page edited: the check names it."""
    import rft
    from lib.backends import engines
    doc = (ROOT / "docs" / "fidelity.md").read_text()
    if change == "lora_alpha":
        add_args = rft.add_args

        def alpha_64(parser, *a, **kw):
            add_args(parser, *a, **kw)
            parser.set_defaults(lora_alpha=64)
        monkeypatch.setattr(rft, "add_args", alpha_64)
        assert fidelity_problems() == [f"lora_alpha ({d}): the code has 64, docs/fidelity.json 32"
                                       for d in PAPER_DOMAINS]
    elif change == "top_p":
        monkeypatch.setattr(engines, "TOP_P", 0.9)
        assert fidelity_problems() == [f"lib.backends.engines:TOP_P ({d}): the code has 0.9, docs/fidelity.json 1.0"
                                       for d in PAPER_DOMAINS]
    elif change == "harness_set_seed":
        monkeypatch.setattr(domains, "HARNESS_SET_SEED", 42)
        problems = fidelity_problems()
        assert problems == [f"domains:HARNESS_SET_SEED ({d}): the code has 42, docs/fidelity.json 0"
                            for d in PAPER_DOMAINS]
    elif change == "retry_wait":  # the table's prose says "sent once more after 5 s": the value is a row's, checked
        from lib.paper import retriever
        monkeypatch.setattr(retriever, "RETRY_WAIT_S", 10.0)
        assert fidelity_problems() == [f"lib.paper.retriever:RETRY_WAIT_S ({d}): the code has 10.0, docs/fidelity.json "
                                       "5.0" for d in PAPER_DOMAINS]
    elif change == "covered":  # a constant a row covers (chess: a reply cut by the token budget scores 0)
        monkeypatch.setattr(domains.Chess, "OUT_OF_TOKENS_SCORES_ZERO", False)
        assert fidelity_problems() == ["domains:Chess.OUT_OF_TOKENS_SCORES_ZERO (covered by episode_tokens): the code "
                                       "has False, docs/fidelity.json True"]
    elif change == "reason":
        table = table_with(lambda t: row_of(t, "lora_alpha").update(reason=" "))
        assert fidelity_problems(table, doc)[0] == "lora_alpha: status stated, but no reason in docs/fidelity.json"
    elif change == "line":
        table = table_with(lambda t: row_of(t, "top_k")["source"][0].pop("line"))
        assert fidelity_problems(table, doc)[0].startswith("top_k: a source needs a file, a 40-digit commit and a line")
    elif change == "config_key":
        table = table_with(lambda t: t["settings"].remove(row_of(t, "lora_dropout")))
        assert fidelity_problems(table, doc)[0] == ("lora_dropout: a key of a paper run's config.json with no row in "
                                                    "docs/fidelity.json")
    elif change == "constant":
        table = table_with(lambda t: t["settings"].remove(row_of(t, "lib.paper.judge:ATTEMPTS")))
        assert fidelity_problems(table, doc)[0].startswith("lib.paper.judge:ATTEMPTS: a constant of the run's code")
    else:
        [problem] = fidelity_problems(doc=doc.replace("| lora_alpha |", "| lora alpha |"))
        assert problem == "docs/fidelity.md is not what docs/fidelity.json makes: run python scripts/fidelity_doc.py"


def test_a_candidates_axis_is_kept_in_the_archive_and_shown_to_the_proposer(tmp_path):
    """The official proposer records an axis per candidate (the searchqa and math skills' pending_eval.json,
    evolution_summary.jsonl); here a candidate's meta.json `axis` is taken back from the proposer, kept in the
    archive's summary.jsonl and asked for by the searchqa and math briefs (their lettered axes), not chess's."""
    from lib import archive, proposers
    work, run = tmp_path / "work", tmp_path / "run"
    (work / "candidates" / "h1_1").mkdir(parents=True)
    (work / "candidates" / "h1_1" / "harness.py").write_text("def run(task, llm, tools):\n    return {}\n")
    (work / "candidates" / "h1_1" / "meta.json").write_text(json.dumps(
        {"parent": "h0", "hypothesis": "h", "axis": " C ", "changed": "c"}))
    proposers.take_candidates(work, None, run, ["h1_1"], "h0", 1, "claude")
    (run / "candidates" / "h0").mkdir()
    (run / "candidates" / "h0" / "meta.json").write_text(json.dumps({"proposed": True, "iteration": 0, "valid": True}))
    (run / "candidates" / "h0" / "scores.json").write_text(json.dumps({"score": 0.5, "mean_turns": 1.0}))
    rows, _ = archive.write_index(run, 1)
    assert [(r["name"], r["axis"]) for r in rows] == [("h0", ""), ("h1_1", "C")]
    assert '"axis": "C"' in (run / "summary.jsonl").read_text()
    for d, asked in (("searchqa", True), ("math", True), ("chess", False)):
        text = written_brief_text(d)
        assert ("`axis` (the letter, A-F, of the axis below it explores)" in text) == asked, d
        assert "summary.jsonl`: one row per candidate (name, iteration, parent, hypothesis, axis," in text


def test_chess_brief_words_the_chess_skills_workflow():
    """The chess skill asks to separate the failures and choose one concrete mechanism, never for falsifiable
    hypotheses; searchqa's and math's skills ask for them."""
    chess = written_brief_text("chess")
    assert "falsifiable" not in chess
    assert "which failures the traces show (malformed output, illegal output, legal wrong moves" in chess
    assert "fill `hypothesis` (the one mechanism and the failures it should reduce)" in chess
    for d in ("searchqa", "math"):
        assert "falsifiable hypotheses about why episodes fail" in written_brief_text(d)


def test_the_python_tool_hands_the_paper_h0_its_whole_output_to_cut():
    """With the paper's data the python tool returns up to PAPER_TOOL_OUTPUT_CHARS, so the paper math h0's own cut
    (4,096 characters, head and tail, as the official training's) is the one that holds; it returned 2,000 before,
    the bundled data's cut, which still holds there (cpu, smoke)."""
    code = "print('a' * 3000 + 'b' * 3000)"
    paper = domains.get("math", paper_args()).tools(None).python(code)
    assert paper == "a" * 3000 + "b" * 3000 + "\n"
    bundled = domains.get("math").tools(None).python(code)
    assert bundled.startswith("a" * 2000 + "\n... [output cut at 2000 chars]")
