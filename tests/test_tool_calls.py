"""Native tool calls and the generation rules of docs/protocol.md section 2 through the real runner: a chat template in
Qwen3.5's format (tools rendered in the system turn, XML tool calls, tool results as <tool_response> user turns,
enable_thinking opening a <think> block), the paper h0s (harnesses/paper/), the episode's token budget, the prompt
limit and the model length, and the paper preset's settings.

    python -m pytest -q tests/test_tool_calls.py
"""
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

import rollout
import whale
from domains import Domain
from lib.episodes import runner
from lib.cli import sampling_of
from lib.backends.models import CHATML, build_smoke, cached, chat_ids, load_model, thinking_switch
from tests.fixtures.qwen35 import QWEN35_TINY, build_qwen35_tiny, qwen35_tokenizer

ROOT = Path(__file__).resolve().parents[1]
PAPER_SEARCHQA, PAPER_MATH = ROOT / "harnesses" / "paper" / "searchqa.py", ROOT / "harnesses" / "paper" / "math.py"


SEARCH_CALL = ("I should look this up.\n</think>\n\n<tool_call>\n<function=search>\n<parameter=query_list>\n"
               '["capital of Zorbia", "second query"]\n</parameter>\n<parameter=topk>\n3\n</parameter>\n'
               "<parameter=max_doc_tokens>\n4\n</parameter>\n</function>\n</tool_call>")
ANSWER = "The passage names it.\n</think>\n\n<answer>Quelm</answer>"
PASSAGE = "Zorbia: Zorbia is a country whose capital is Quelm, on the river Ost."


@pytest.fixture(scope="module")
def qwen_tok():
    """The smoke tokenizer with a Qwen3.5-format template; its think and tool tags are added tokens that are not
    special, as in Qwen3.5's vocabulary, so decoding keeps them."""
    return qwen35_tokenizer()


class ChatBackend:
    """Replies with the given texts in order, one per sampled row, cut to the row's cap as a real backend would;
    records the caps it was given."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.caps = tokenizer, list(texts), []

    def generate(self, prompts, *, temperature, top_k, max_new_tokens, seeds, stop=None):
        self.caps.append(list(max_new_tokens))
        return [self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False)[:cap] for cap in max_new_tokens]


class SearchTools:
    def __init__(self):
        self.queries = []

    def search(self, query, k=1):
        self.queries.append((query, k))
        return [PASSAGE]


class SearchDomain(Domain):
    name = "searchqa"
    TOOL_METHODS = ("search",)

    def public(self, task):
        return {"question": task["question"]}

    def tools(self, task):
        return SearchTools()

    def reward(self, task, answer, tools):
        return float(answer == task["answer"])


class ChessNamedDomain(SearchDomain):
    """The same episode under chess's rule: the official runs force the reward to 0 when the tokens run out."""
    name, OUT_OF_TOKENS_SCORES_ZERO = "chess", True


TASK = {"id": "z1", "question": "What is the capital of Zorbia?", "answer": "Quelm"}


def run(domain, path, backend, tasks=(TASK,), **kw):
    return rollout.run_episodes(domain, path, list(tasks), backend, max_new_tokens=512, thinking="on", **kw)


def test_thinking_switch_and_the_qwen35_format(qwen_tok):
    smoke = AutoTokenizer.from_pretrained(cached("smoke-v2", build_smoke))
    assert thinking_switch(qwen_tok, "auto") is True and thinking_switch(smoke, "auto") is None
    assert thinking_switch(qwen_tok, "off") is False and thinking_switch(smoke, "on") is True
    m = [{"role": "user", "content": "hi"}]
    text = lambda **kw: qwen_tok.decode(chat_ids(qwen_tok, m, **kw))
    assert text(thinking=True).endswith("<|im_start|>assistant\n<think>\n")
    assert text(thinking=False).endswith("<think>\n\n</think>\n\n") and text() == text(thinking=False)
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    assert '<tools>\n{"type": "function", "function": {"name": "search"' in text(tools=tools)
    # templates without the switch or tool support (smoke, cpu) render exactly as before
    assert chat_ids(smoke, m, tools=tools, thinking=None) == smoke(smoke.apply_chat_template(
        m, add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"]
    assert smoke.chat_template == CHATML


def test_searchqa_h0_calls_search_natively_and_answers(qwen_tok):
    backend = ChatBackend(qwen_tok, [SEARCH_CALL, ANSWER])
    [ep] = run(SearchDomain(), PAPER_SEARCHQA, backend)
    assert ep["error"] is None and ep["answer"] == "Quelm" and ep["reward"] == 1.0 and ep["turns"] == 2
    first, second = ep["calls"]
    tools = load_tools(PAPER_SEARCHQA)
    # the prompt is the template with the schema, thinking on; the ids are exactly what was rendered and sampled
    assert first["prompt_ids"] == chat_ids(qwen_tok, first["messages"], tools=tools, thinking=True)
    prompt = qwen_tok.decode(first["prompt_ids"])
    assert json.dumps(tools[0]) in prompt and prompt.endswith("<think>\n")
    assert first["completion_ids"] == qwen_tok.encode(SEARCH_CALL, add_special_tokens=False)
    assert first["completion"] == SEARCH_CALL  # the tags survive decoding: the harness parses the raw text
    # the second prompt: the assistant turn as written, then the result as a tool message; first query only,
    # top-1 whatever the model asked, the document cut to the model's max_doc_tokens (4 tokens: 3 words)
    assert second["messages"][:-2] == first["messages"]
    assert second["messages"][-2] == {"role": "assistant", "content": SEARCH_CALL}
    result = {"result": "Doc 1 (Title: Zorbia)\nZorbia is a"}
    assert second["messages"][-1] == {"role": "tool", "content": json.dumps(result)}
    assert [(c["name"], c["args"]) for c in ep["tool_calls"]] == [("search", ["capital of Zorbia", 1])]
    prompt = qwen_tok.decode(second["prompt_ids"])
    assert "<|im_start|>user\n<tool_response>\n" + json.dumps(result) + "\n</tool_response><|im_end|>" in prompt
    assert "<think>\nI should look this up.\n</think>\n\n<tool_call>\n<function=search>" in prompt
    assert second["prompt_ids"] == chat_ids(qwen_tok, second["messages"], tools=tools, thinking=True)


def load_tools(path):
    ns = {}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    return ns["TOOLS"]


def test_the_budget_cuts_each_call_and_then_ends_the_episode(qwen_tok):
    first = len(qwen_tok.encode(SEARCH_CALL, add_special_tokens=False))
    # the second call gets what is left of the budget: 3 tokens, so no answer (the harness's cap cannot raise it)
    backend = ChatBackend(qwen_tok, [SEARCH_CALL, ANSWER])
    [ep] = run(SearchDomain(), PAPER_SEARCHQA, backend, episode_tokens=first + 3)
    assert backend.caps == [[first + 3], [3]] and len(ep["calls"][1]["completion_ids"]) == 3
    assert ep["answer"] is None and ep["reward"] == 0.0 and ep["tokens"] == first + 3 and not ep["out_of_tokens"]
    # spent by the first call: the second gets '' without sampling, and the episode ends on the first turn,
    # scored as official (searchqa: its answer counts; chess: forced to 0)
    both = SEARCH_CALL.replace("<tool_call>", "<answer>Quelm</answer>\n<tool_call>")
    spent = len(qwen_tok.encode(both, add_special_tokens=False))
    for domain, reward in ((SearchDomain(), 1.0), (ChessNamedDomain(), 0.0)):
        backend = ChatBackend(qwen_tok, [both])
        [ep] = run(domain, PAPER_SEARCHQA, backend, episode_tokens=spent)
        assert backend.caps == [[spent]] and ep["turns"] == 1 and ep["out_of_tokens"] and ep["error"] is None
        assert ep["answer"] == "Quelm" and ep["reward"] == reward


PROBE = '''"""Asks with a cap of its own above the budget, then with a prompt the model length cannot hold."""
def run(task, llm, tools):
    a = llm([{"role": "user", "content": "q"}], max_tokens=1000)
    b = llm([{"role": "user", "content": "q " * int(task["question"])}], max_tokens=1000)
    return {"answer": [a, b]}
'''


def test_the_prompt_limit_and_the_model_length(qwen_tok, tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    prompt = len(chat_ids(qwen_tok, [{"role": "user", "content": "q"}], thinking=True))
    # the model length cuts the cap to what fits after the prompt; a later prompt that leaves no room gets ''
    backend = ChatBackend(qwen_tok, ["a b c d e f g h", "never"])
    [ep] = run(SearchDomain(), path, backend, tasks=[{"id": "p", "question": "400", "answer": None}],
               max_model_len=prompt + 5)
    assert backend.caps == [[5]] and ep["answer"][1] == "" and ep["out_of_tokens"] and ep["turns"] == 1
    # the first prompt of an episode over --max-prompt-tokens is refused, as verl's truncation='error'
    [ep] = run(SearchDomain(), path, ChatBackend(qwen_tok, []), max_prompt_tokens=prompt - 1)
    assert f"prompt of {prompt} tokens; the limit is {prompt - 1}" in ep["error"] and ep["turns"] == 0


def test_math_h0_runs_code_through_its_tool(qwen_tok):
    domains = pytest.importorskip("domains")
    call = ("Compute it.\n</think>\n\n<tool_call>\n<function=code_interpreter>\n<parameter=code>\n"
            "```python\nx = 6 * 7\nx\n```\n</parameter>\n</function>\n</tool_call>")
    backend = ChatBackend(qwen_tok, [call, "It is 42.\n</think>\n\n\\boxed{42}"])
    task = {"id": "m1", "question": "What is 6 times 7?", "answer": "42"}
    [ep] = run(domains.get("math"), PAPER_MATH, backend, tasks=[task])
    assert ep["error"] is None and ep["reward"] == 1.0 and ep["answer"].endswith("\\boxed{42}")
    assert ep["tool_calls"][0]["name"] == "python" and ep["tool_calls"][0]["args"] == ["x = 6 * 7\nprint(x)"]
    first, second = ep["calls"]
    assert first["messages"] == [{"role": "user", "content": "What is 6 times 7?\nThe answer format must be: "
                                                            "\\boxed{'The final answer goes here.'}"}]
    assert second["messages"][-1] == {"role": "tool", "content": "42\n"}
    assert '"name": "code_interpreter"' in qwen_tok.decode(first["prompt_ids"])


def test_tool_call_parsing_lives_in_the_harness():
    ns = {}
    exec(compile(PAPER_SEARCHQA.read_text(), "searchqa", "exec"), ns)
    two = "<tool_call>\n<function=search>\n<parameter=query_list>\n[\"a\"]\n</parameter>\n</function>\n</tool_call>" \
          "<tool_call><function=search><parameter=query_list>b<parameter=topk>2"  # the second left open
    assert ns["parse_tool_calls"](two) == [("search", {"query_list": '["a"]'}), ("search", {"query_list": "b",
                                                                                            "topk": "2"})]
    assert ns["arguments"]("search", {"query_list": '["a"]', "topk": "2"}) == {"query_list": ["a"], "topk": 2}
    assert ns["arguments"]("search", {"query_list": "not json"}) == {"query_list": "not json"}
    assert ns["parse_tool_calls"]("no call here <function=search>") == []
    assert ns["last_answer"]("<answer>a</answer> <answer>x <answer>b</answer>") == "b"
    assert ns["last_answer"]("<answer>open") is None
    assert ns["call_tool"]("lookup", {}, None) == "[unknown tool] lookup"
    # wiki-18's titles keep their quotes (the official "Doc 1 (Title: "Paris")"), a ": " inside one included
    assert ns["document"](1, '"Star Wars: Episode IV": A 1977 film.', 200) == \
        'Doc 1 (Title: "Star Wars: Episode IV")\nA 1977 film.'
    assert ns["document"](2, "Zorbia: A country.", 200) == "Doc 2 (Title: Zorbia)\nA country."
    assert ns["document"](3, "no title here", 200) == "Doc 3 (Title: )\nno title here"
    assert ns["call_tool"]("search", {}, None).startswith("[tool error]")


def test_protocol_checks_tools_and_the_tool_role():
    m = [{"role": "system", "content": "s"}, {"role": "tool", "content": "r"}]
    tool = {"type": "function", "function": {"name": "f"}}
    assert runner.llm_request({"llm": m, "tools": [tool]}, 8) == (m, 8, None, [tool])
    assert runner.llm_request({"llm": m, "tools": []}, 8)[3] is None
    for bad in ("f", [{"name": "f"}], [tool] * (runner.MAX_TOOLS + 1),
                [{"type": "function", "function": {"name": "f", "description": "x" * runner.MAX_TOOLS_CHARS}}]):
        with pytest.raises(ValueError, match="tools"):
            runner.llm_request({"llm": m, "tools": bad}, 8)
    with pytest.raises(ValueError, match="messages must be"):
        runner.llm_request({"llm": [{"role": "tool", "content": "r", "tool_call_id": "1"}]}, 8)


BAD_TOOLS = '''"""Bad tools arguments: through llm() (the worker refuses), to the pipe itself (the parent refuses)."""
import random
def run(task, llm, tools):
    m = [{"role": "user", "content": "q"}]
    if task["question"] == "forged":
        random._os.write(int(random._os.sys.argv[2]), b'{"llm": [{"role": "user", "content": "q"}], "tools": [1]}'
                         + bytes([10]))
        llm(m)
    refused = []
    for args in (("not a list",), (128,), ([1],)):
        try:
            llm(m, *args)
        except TypeError as e:
            refused.append("max_tokens is a keyword" in str(e))
    return {"answer": refused}
'''


def test_bad_tools_are_refused_by_the_worker_and_the_parent(qwen_tok, tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(BAD_TOOLS)
    tasks = [{"id": q, "question": q, "answer": None} for q in ("polite", "forged")]
    backend = ChatBackend(qwen_tok, [])
    by = {e["task_id"]: e for e in run(SearchDomain(), path, backend, tasks=tasks)}
    assert by["polite"]["answer"] == [True] * 3 and by["polite"]["turns"] == 0
    assert "protocol violation" in by["forged"]["error"] and "tools" in by["forged"]["error"]
    assert backend.caps == []


@pytest.mark.parametrize("name", ["searchqa", "math", "chess"])
def test_paper_h0_runs_on_the_smoke_model(name):
    """The smoke model's ChatML template has no tool format: the paper h0s still run (garbage in, no crash)."""
    domains = pytest.importorskip("domains")
    from lib.backends.hf_backend import HFBackend
    model, tok = load_model("smoke")
    domain = domains.get(name)
    eps = rollout.run_episodes(domain, ROOT / "harnesses" / "paper" / f"{name}.py", domain.load("test")[:2],
                               HFBackend(model, tok), max_new_tokens=8, episode_tokens=12, deadline_s=60)
    assert [e["error"] for e in eps] == [None, None] and all(1 <= e["turns"] <= 2 for e in eps)
    assert all(e["tokens"] <= 12 for e in eps)


def test_paper_preset_generation_settings():
    for domain, harness, budget, prompt in (("searchqa", "harnesses/paper/searchqa.py", 8192, 2048),
                                            ("math", "harnesses/paper/math.py", 8192, 2048),
                                            ("chess", "harnesses/paper/chess.py", 8129, 4096)):
        [args] = whale.parse_args(["--domain", domain, "--preset", "paper"])
        assert (args.harness, args.episode_tokens, args.max_prompt_tokens) == (harness, budget, prompt)
        assert (args.thinking, args.max_model_len, args.max_new_tokens) == ("on", 32768, 8192)
        assert (args.temperature, args.top_k) == (1.0, 20)  # rollouts, harness scoring and test alike
        kw = sampling_of(args).kwargs()
        assert (kw["thinking"], kw["episode_tokens"], kw["max_model_len"]) == ("on", budget, 32768)
    for preset, harness in (("smoke", "harnesses/searchqa.py"), ("cpu", "harnesses/cpu/searchqa.py")):
        [args] = whale.parse_args(["--domain", "searchqa", "--preset", preset])  # no budget, the template's thinking
        assert (args.harness, args.episode_tokens, args.thinking) == (harness, None, "auto")


def test_the_tiny_qwen35_loads_as_the_hub_checkpoints_do_and_its_lora_trains():
    """The paper dry run's model: saved as Qwen3_5ForConditionalGeneration (the hub layout), loaded by load_model
    as Qwen3_5ForCausalLM with three Gated DeltaNet layers and a full-attention one; all-linear LoRA reaches the
    Gated DeltaNet projections, and SFT updates through them lower the loss on an example."""
    import torch
    from types import SimpleNamespace
    import rft

    from lib.backends.policy import add_lora
    from safetensors.torch import load_file
    folder = cached(QWEN35_TINY, build_qwen35_tiny)
    model, tok = load_model(folder)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    saved = load_file(f"{folder}/model.safetensors")["model.language_model.embed_tokens.weight"]
    assert torch.equal(model.get_input_embeddings().weight, saved)  # the checkpoint's weights, not a fresh init
    assert model.config.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    prompt = chat_ids(tok, [{"role": "user", "content": "Question: What is the capital of Zorbia?"}], thinking=False)
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    model = add_lora(model, SimpleNamespace(lora_targets="all-linear", lora_rank=4, lora_alpha=8, lora_dropout=0.0))
    adapted = {n.split(".lora_A")[0].split(".")[-1] for n, _ in model.named_parameters() if "lora_A" in n}
    assert {"in_proj_qkv", "in_proj_z", "out_proj", "q_proj", "down_proj"} <= adapted
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    example = [(prompt, tok("<answer>Quelm</answer><|im_end|>", add_special_tokens=False)["input_ids"])]
    losses = [rft.sft_update(model, opt, [example], 1, 1, 1.0)[0] for _ in range(4)]
    assert losses[-1] < losses[0]


PAPER_CHESS = ROOT / "harnesses" / "paper" / "chess.py"
FOOLS_MATE = {"id": "fool", "fen": "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",
              "moves": ["f2f3", "e7e5", "g2g4", "d8h4"]}  # the trigger f3, then e5 g4 Qh4#


def chess_domain(marks):
    domains = pytest.importorskip("domains")
    return domains.get("chess", {"chess_san_marks": marks})


def test_paper_chess_h0_carries_the_conversation_across_moves_with_the_official_san(qwen_tok):
    """The official runner's messages: system, each earlier reply and the verifier's answer, the current position;
    the legal moves' SAN as python-chess writes it (Qh4# keeps its mark) under --chess-san-marks."""
    backend = ChatBackend(qwen_tok, ["Open the diagonal.\n</think>\n\n<move>e7e5</move>",
                                     "Mate.\n</think>\n\n<move>d8h4</move>"])
    [ep] = run(chess_domain(True), PAPER_CHESS, backend, tasks=[FOOLS_MATE])
    assert ep["error"] is None and ep["reward"] == 1.0 and ep["turns"] == 2
    first, second = (c["messages"] for c in ep["calls"])
    assert [m["role"] for m in first] == ["system", "user"] and first[0]["content"].startswith(
        "You solve chess tactics by choosing one legal move at a time.")
    position = first[1]["content"]
    assert position.startswith("Solve the current chess puzzle position.\n\nTask: solve the chess puzzle one move at "
                               "a time.\nSide to move: Black\nFEN: rnbqkbnr/pppppppp/8/8/8/5P2/PPPPP1PP/RNBQKBNR b")
    assert "Board:\n8 r n b q k b n r\n7 p p p p p p p p\n" in position and "\n  a b c d e f g h\n" in position
    assert "Last opponent reply" not in position and "Puzzle move number: 1\nLegal moves:\n- [a7a5] SAN=a5\n" in position
    assert position.endswith("Return exactly one move as <move>uci</move>, for example <move>e2e4</move>.\n"
                             "Do not include explanation.")
    # the conversation goes on: the first reply and the verifier's message stay, then the new position
    assert [m["role"] for m in second] == ["system", "assistant", "user", "user"]
    assert second[1]["content"] == "Open the diagonal.\n</think>\n\n<move>e7e5</move>"
    assert second[2]["content"] == "Correct. Opponent replied g2g4 (g4). Continue with the next move."
    now = second[3]["content"]
    assert "Last opponent reply: g2g4\nYour accepted moves so far: e7e5\nPuzzle move number: 2\n" in now
    assert "- [d8h4] SAN=Qh4#\n" in now and "- [f8b4] SAN=Bb4\n" in now
    # the bundled presets' view: the same move without its mark
    backend = ChatBackend(qwen_tok, ["<move>e7e5</move>", "<move>d8h4</move>"])
    [ep] = run(chess_domain(False), PAPER_CHESS, backend, tasks=[FOOLS_MATE])
    assert "- [d8h4] SAN=Qh4\n" in ep["calls"][1]["messages"][-1]["content"] and ep["reward"] == 1.0


def test_paper_chess_h0_retries_once_per_kind_with_the_verifier_feedback(qwen_tok):
    backend = ChatBackend(qwen_tok, ["<move>e7e4</move>", "e7e5 or e7e6?", "<move>e7e5</move>", "<move>a7a6</move>"])
    [ep] = run(chess_domain(True), PAPER_CHESS, backend, tasks=[FOOLS_MATE])
    assert ep["turns"] == 4 and ep["reward"] == 0.0 and ep["answer"] == "a7a6"  # a legal wrong move ends it
    illegal = ('The parsed move "e7e4" is not legal in the current board. Choose one move from the visible legal '
               "moves and reply only as <move>uci</move>.")
    unread = ('The verifier could not parse exactly one UCI move from "__ambiguous_multiple_moves__". Reply with '
              "exactly one move, e.g. <move>e2e4</move>, and no explanation.")
    second, third, fourth = (c["messages"] for c in ep["calls"][1:])
    assert second[2] == {"role": "user", "content": illegal}
    assert second[3]["content"].endswith("Feedback from verifier:\n" + illegal + "\n\nReturn exactly one move as "
                                         "<move>uci</move>, for example <move>e2e4</move>.\nDo not include explanation.")
    assert third[4] == {"role": "user", "content": unread} and "Feedback from verifier:\n" + unread in third[5]["content"]
    assert "Feedback from verifier" not in fourth[-1]["content"] and len(fourth) == 8
    # a second illegal move after the one retry ends the puzzle
    backend = ChatBackend(qwen_tok, ["<move>e7e4</move>", "<move>e7e3</move>"])
    [ep] = run(chess_domain(True), PAPER_CHESS, backend, tasks=[FOOLS_MATE])
    assert ep["turns"] == 2 and ep["answer"] == "e7e3" and ep["reward"] == 0.0


def test_a_tool_call_drafted_while_thinking_is_not_run(qwen_tok):
    ns = {}
    exec(compile(PAPER_MATH.read_text(), "math", "exec"), ns)
    draft = "<tool_call>\n<function=code_interpreter>\n<parameter=code>\nprint(1)\n</parameter>\n</function>\n</tool_call>"
    assert ns["parse_tool_calls"](f"Maybe {draft}? No.\n</think>\n\n\\boxed{{2}}") == []
    assert ns["parse_tool_calls"](f"ok\n</think>\n\n{draft}") == [("code_interpreter", {"code": "print(1)"})]
    assert ns["parse_tool_calls"](f"<think>\nplan: {draft}") == []  # a think the reply opens itself, left open
    # a whole episode: the drafted search is not run, the answer after the thinking ends it on the first turn
    drafted = SEARCH_CALL.replace("</think>\n\n<tool_call>", "<tool_call>").replace(
        "</tool_call>", "</tool_call>\nNo, I know it.\n</think>\n\n<answer>Quelm</answer>")
    [ep] = run(SearchDomain(), PAPER_SEARCHQA, ChatBackend(qwen_tok, [drafted]))
    assert ep["tool_calls"] == [] and ep["turns"] == 1 and ep["answer"] == "Quelm" and ep["reward"] == 1.0
