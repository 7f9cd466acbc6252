"""Math h0 of the official runs (krafton-ai/WHALE environments/retool/base_harness.py): native tool calls.

No system prompt; the problem and the fixed \\boxed{} line. The model gets one tool, `code_interpreter(code)`,
through llm(tools=TOOLS), which the runner renders with the model's chat template, so Qwen3.5 sees its native
tool format and calls it with an XML tool call (<tool_call><function=code_interpreter><parameter=code>...).
The code runs as the official tool runs it: the first ```python block if the code holds one, the last line
wrapped in print() unless it starts with print; tools.python returns stdout and stderr, which go back as a
`tool` message after the assistant turn (that turn keeps the text the model wrote), cut to MAX_OUTPUT_CHARS
the way verl cuts a long tool response (head and tail kept). CALLS_PER_TURN tool calls of a turn run (the
official math runs: the first). The episode ends after a turn with no tool call, after MAX_TURNS turns (the
last turn's tool calls are not run), or when the token budget is spent (llm() replies ''). The answer is
the last assistant turn; the reward reads its last \\boxed{}. Parsing the tool calls lives here, so a
candidate can change it.
"""
import re

SYSTEM_PROMPT = ""  # none
USER_TEMPLATE = "{question}\nThe answer format must be: \\boxed{{'The final answer goes here.'}}"
MAX_TURNS = 2
CALLS_PER_TURN = 1  # tool calls of a turn that run (None: all)
MAX_OUTPUT_CHARS = 4096  # a longer tool response keeps its first and last halves

# what the model sees: the code_interpreter schema of the official math training (the ReTool recipe's tool
# config); its timeout and memory limit are tools.python's own (30 s, 1 GB), as the official defaults
TOOLS = [{"type": "function", "function": {
    "name": "code_interpreter",
    "description": "A tool for executing code.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "The code to execute."}},
                   "required": ["code"]}}}]

# literal values only: the offline proposer reads this with ast.literal_eval
SEARCH_SPACE = {
    "MAX_TURNS": [2, 3, 4, 8],
    "CALLS_PER_TURN": [1, None],
    "MAX_OUTPUT_CHARS": [1024, 4096, 16000],
    "SYSTEM_PROMPT": ["", "Solve the problem. You may run Python with the code_interpreter tool to calculate or "
                          "check."],
    "USER_TEMPLATE": ["{question}\nThe answer format must be: \\boxed{{'The final answer goes here.'}}",
                      "{question}\nUse the code_interpreter tool to calculate or check, then put the final answer "
                      "in \\boxed{{}}."],
}


# -----------------------------------------------------------------------------
# the model's tool calls, in Qwen3.5's XML format (what vLLM's qwen3_coder parser reads)

def strip_newline(text):
    """A parameter's value without the one newline the format puts on each side of it."""
    text = text[1:] if text.startswith("\n") else text
    return text[:-1] if text.endswith("\n") else text


def outside_thinking(text):
    """The reply after its thinking: the prompt opens <think> and the reply closes it, so what comes before the
    last </think> (and after a <think> the reply opens itself) is a draft, not a call: a server with a reasoning
    parser hands its tool parser only the content after the thinking."""
    return text.rsplit("</think>", 1)[-1].split("<think>", 1)[0]


def parse_tool_calls(text):
    """[(name, {parameter: text})] for each <tool_call><function=NAME><parameter=P>VALUE</parameter>... of a
    reply outside its thinking, in order; a block, function or parameter left open at the end of the reply still
    counts, and a parameter also ends where the next one starts."""
    calls = []
    for block in re.findall(r"<tool_call>(.*?)(?:</tool_call>|$)", outside_thinking(text), re.DOTALL):
        for name, body in re.findall(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", block, re.DOTALL):
            params = re.findall(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", body, re.DOTALL)
            calls.append((name.strip(), {key.strip(): strip_newline(value) for key, value in params}))
    return calls


# -----------------------------------------------------------------------------
# the tool

def normalize_code(code):
    """The official code_interpreter's input: the first ```python block if there is one, and the last non-empty
    line printed unless it starts with print."""
    blocks = re.findall(r"```python(.*?)```", code, re.DOTALL)
    if blocks:
        code = blocks[0].strip()
    lines = code.split("\n")
    for i in range(len(lines) - 1, -1, -1):
        if lines[i] == "":
            continue
        if not lines[i].startswith("print"):
            lines[i] = f"print({lines[i]})"
        break
    return "\n".join(lines)


def cut_output(text):
    """verl's middle cut of a long tool response."""
    if len(text) <= MAX_OUTPUT_CHARS:
        return text
    half = MAX_OUTPUT_CHARS // 2
    return text[:half] + "...(truncated)..." + text[-half:]


def call_tool(name, params, tools):
    """The tool message's content for one call: the run's output, or what went wrong, as the official env says it."""
    if name != "code_interpreter":
        return f"[unknown tool] {name}"
    if "code" not in params:  # other parameters (the official tool's timeout, language...) are ignored
        return "[tool error] code_interpreter() missing 1 required argument: 'code'"
    try:
        return cut_output(tools.python(normalize_code(params["code"])))
    except Exception as e:
        return f"[tool error] {e}"


# -----------------------------------------------------------------------------
# the episode

def run(task, llm, tools):
    messages = [{"role": "system", "content": SYSTEM_PROMPT}] if SYSTEM_PROMPT else []
    messages.append({"role": "user", "content": USER_TEMPLATE.format(question=task["question"])})
    reply = ""
    for turn in range(MAX_TURNS):
        text = llm(messages, tools=TOOLS)
        if not text:  # the token budget is spent: the last turn sampled is the last assistant turn
            break
        reply = text
        messages.append({"role": "assistant", "content": reply})  # as written, tool calls and thinking included
        calls = parse_tool_calls(reply)
        if not calls or turn == MAX_TURNS - 1:
            break
        for name, params in calls[:CALLS_PER_TURN]:
            messages.append({"role": "tool", "content": call_tool(name, params, tools)})
    return {"answer": reply}
