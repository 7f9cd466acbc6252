"""Native tool calls and the generation rules of PROTOCOL section 2 through the real runner: a chat template in
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
from lib import protocol
from lib.models import CHATML, QWEN35_TINY, build_smoke, cached, chat_ids, load_model, qwen35_tokenizer, thinking_switch

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


class SearchDomain:
    name = "searchqa"
    TOOL_METHODS = ("search",)

    def public(self, task):
        return {"question": task["question"]}

    def tools(self, task):
        return SearchTools()

    def reward(self, task, answer, tools):
        return float(answer == task["answer"])


class ChessNamedDomain(SearchDomain):
    """The same episode under the name whose reward the official runs force to 0 when the tokens run out."""
    name = "chess"


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
    assert ns["call_tool"]("search", {}, None).startswith("[tool error]")


def test_protocol_checks_tools_and_the_tool_role():
    m = [{"role": "system", "content": "s"}, {"role": "tool", "content": "r"}]
    tool = {"type": "function", "function": {"name": "f"}}
    assert protocol.llm_request({"llm": m, "tools": [tool]}, 8) == (m, 8, None, [tool])
    assert protocol.llm_request({"llm": m, "tools": []}, 8)[3] is None
    for bad in ("f", [{"name": "f"}], [tool] * (protocol.MAX_TOOLS + 1),
                [{"type": "function", "function": {"name": "f", "description": "x" * protocol.MAX_TOOLS_CHARS}}]):
        with pytest.raises(ValueError, match="tools"):
            protocol.llm_request({"llm": m, "tools": bad}, 8)
    with pytest.raises(ValueError, match="messages must be"):
        protocol.llm_request({"llm": [{"role": "tool", "content": "r", "tool_call_id": "1"}]}, 8)


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


@pytest.mark.parametrize("name", ["searchqa", "math"])
def test_paper_h0_runs_on_the_smoke_model(name):
    """The smoke model's ChatML template has no tool format: the paper h0s still run (garbage in, no crash)."""
    domains = pytest.importorskip("domains")
    from lib.hf_backend import HFBackend
    model, tok = load_model("smoke")
    domain = domains.get(name)
    eps = rollout.run_episodes(domain, ROOT / "harnesses" / "paper" / f"{name}.py", domain.load("test")[:2],
                               HFBackend(model, tok), max_new_tokens=8, episode_tokens=12, deadline_s=60)
    assert [e["error"] for e in eps] == [None, None] and all(1 <= e["turns"] <= 2 for e in eps)
    assert all(e["tokens"] <= 12 for e in eps)


def test_paper_preset_generation_settings():
    for domain, harness, budget, prompt in (("searchqa", "harnesses/paper/searchqa.py", 8192, 2048),
                                            ("math", "harnesses/paper/math.py", 8192, 2048),
                                            ("chess", "harnesses/chess.py", 8129, 4096)):
        [args] = whale.parse_args(["--domain", domain, "--preset", "paper"])
        assert (args.harness, args.episode_tokens, args.max_prompt_tokens) == (harness, budget, prompt)
        assert (args.thinking, args.max_model_len, args.max_new_tokens) == ("on", 32768, 8192)
        assert (args.temperature, args.top_k) == (1.0, 20)  # rollouts, harness scoring and test alike
        kw = rollout.sampling_kwargs(args)
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
    from lib.models import build_qwen35_tiny
    from lib.policy import add_lora
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
