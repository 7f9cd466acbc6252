"""SearchQA h0 of the official runs (krafton-ai/WHALE environments/search_r1/base_harness.py): native tool calls.

A short system prompt and "Question: ..."; the model gets one tool, `search(query_list, topk, max_doc_tokens)`,
through llm(tools=TOOLS), which the runner renders with the model's chat template, so Qwen3.5 sees its native
tool format and answers with XML tool calls (<tool_call><function=search><parameter=query_list>...). Each
call runs the first query of its query_list and returns the top TOP_K passages (topk forced to 1, whatever
the model asks) as JSON {"result": "Doc 1 (Title: ...)\\n..."}, each document cut to max_doc_tokens (the
model may set it; the official retriever counts Qwen3.5 tokens, the sandbox has no tokenizer, so the cut is
in words, WORDS_PER_TOKEN per token). The result goes back as a `tool` message after the assistant turn,
which keeps the text the model wrote. The episode ends after a turn with no tool call, after MAX_TURNS
turns (the last turn's tool calls are not run), or when the token budget is spent (llm() replies ''). The
answer is the innermost <answer>...</answer> of the last assistant turn (the last closing tag and the
nearest opening tag before it). Parsing the tool calls lives here, so a candidate can change it.
"""
import json
import re

SYSTEM_PROMPT = "Answer factual questions using search when needed."
USER_TEMPLATE = ("Question: {question}\nUse the search tool if needed. Put the final answer only inside "
                 "<answer>...</answer>.")
MAX_TURNS = 2
TOP_K = 1  # passages per search, regardless of the topk the model supplies
MAX_DOC_TOKENS = 200  # per-document cap when the model gives none (or a bad one)
WORDS_PER_TOKEN = 0.75  # the cap counts whitespace words: about 0.75 English words per token
CALLS_PER_TURN = None  # None: every tool call of a turn runs, in order (the official runs allow 999)

# what the model sees: the h0's search signature and docstring as a function schema
TOOLS = [{"type": "function", "function": {
    "name": "search",
    "description": "Searches for relevant information and returns exactly one passage.",
    "parameters": {"type": "object", "properties": {
        "query_list": {"type": "array", "items": {"type": "string"},
                       "description": "A list containing exactly one semantic query."},
        "topk": {"type": "integer", "default": TOP_K, "description": "Ignored. The experiment hard-forces topk=1."},
        "max_doc_tokens": {"type": "integer", "default": MAX_DOC_TOKENS,
                           "description": "Per-doc token cap applied by the retriever service."}},
        "required": ["query_list", "topk", "max_doc_tokens"], "additionalProperties": False}}}]

# literal values only: the offline proposer reads this with ast.literal_eval
SEARCH_SPACE = {
    "MAX_TURNS": [2, 3, 4, 8],
    "TOP_K": [1, 3, 5],
    "MAX_DOC_TOKENS": [100, 200, 400],
    "CALLS_PER_TURN": [None, 1],
    "SYSTEM_PROMPT": ["Answer factual questions using search when needed.",
                      "Answer the question. Search first, then answer with a few words copied from the passage.",
                      ""],
    "USER_TEMPLATE": ["Question: {question}\nUse the search tool if needed. Put the final answer only inside "
                      "<answer>...</answer>.",
                      "Question: {question}\nSearch for the answer, then put only the answer, a few words, inside "
                      "<answer>...</answer>."],
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


def typed(value, schema):
    """A parameter's text as the type its schema names (arrays and objects as JSON), as the qwen3_coder parser
    converts it; the text itself where it does not convert."""
    kind = schema.get("type")
    try:
        if kind == "integer":
            return int(value.strip())
        if kind == "number":
            return float(value.strip())
        if kind == "boolean":
            return {"true": True, "false": False}[value.strip().lower()]
        if kind in ("array", "object"):
            return json.loads(value)
    except (ValueError, KeyError):
        pass
    return value


def arguments(name, params):
    schema = next((t["function"]["parameters"]["properties"] for t in TOOLS if t["function"]["name"] == name), {})
    return {key: typed(value, schema.get(key, {})) for key, value in params.items()}


# -----------------------------------------------------------------------------
# the tool

def result(text):
    return json.dumps({"result": text}, ensure_ascii=False)


def cut_words(text, n):
    words = text.split()
    return " ".join(words[:n])


def document(i, passage, max_doc_tokens):
    """One passage ("Title: text", as tools.search returns them) in the official layout; a wiki-18 title keeps its
    quotes, and may hold ": " itself ('"Star Wars: Episode IV": text')."""
    cut = passage.find('": ') + 1 if passage.startswith('"') else passage.find(": ")
    title, text = (passage[:cut], passage[cut + 2:]) if cut > 0 else ("", passage)
    return f"Doc {i} (Title: {title})\n{cut_words(text, max(1, round(max_doc_tokens * WORDS_PER_TOKEN)))}"


def search(tools, query_list, topk=TOP_K, max_doc_tokens=MAX_DOC_TOKENS):
    """The official search tool over tools.search: the first query only, TOP_K passages (topk is ignored); a
    failed search comes back to the model as text, never retried."""
    if isinstance(query_list, str):  # one bare query (the official code would read its first character)
        query_list = [query_list]
    queries = [str(q).strip() for q in query_list if str(q).strip()] if isinstance(query_list, list) else []
    if not queries:
        return result("Error: 'query_list' is missing, empty, or not a list in parameters.")
    try:
        max_doc_tokens = int(max_doc_tokens)
    except (TypeError, ValueError):
        max_doc_tokens = MAX_DOC_TOKENS
    max_doc_tokens = max_doc_tokens if max_doc_tokens > 0 else MAX_DOC_TOKENS
    try:
        passages = tools.search(queries[0], TOP_K)
    except Exception as e:
        return result(f"Search error: {e}")
    if not passages:
        return result("No search results found.")
    return result("\n\n".join(document(i, p, max_doc_tokens) for i, p in enumerate(passages, 1)))


def call_tool(name, params, tools):
    """The tool message's content for one call: the tool's result, or what went wrong, as the official env says it."""
    if name != "search":
        return f"[unknown tool] {name}"
    try:
        return search(tools, **arguments(name, params))
    except TypeError as e:  # a missing or unknown parameter
        return f"[tool error] {e}"


# -----------------------------------------------------------------------------
# the episode

def last_answer(text):
    """The innermost <answer>...</answer>: the last closing tag and the nearest opening tag before it."""
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    return text[start + len("<answer>"):end].strip() if start >= 0 else None


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
    return {"answer": last_answer(reply)}
