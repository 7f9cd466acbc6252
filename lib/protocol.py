"""The messages between the runner (rollout.py) and a harness worker (lib/harness_process.py): the limits on them and
the parent's checks of every request a worker sends. The worker runs untrusted harness code, which can write
to its pipe directly, so the parent checks each request in full; the worker's own checks are a courtesy.

    messages, cap, stop, tools = llm_request(msg, max_new_tokens)   # ValueError on a forged request
    name, args, kwargs = tool_request(msg, domain.TOOL_METHODS)
"""
import json

MAX_LLM_CALLS = 32        # llm() requests per episode, empty replies included: past it llm() raises
# The official caps on an episode's model calls (docs/protocol.md section 3), enforced by the runner whatever a harness asks:
# searchqa and math clamp a harness's turns to 16; chess allows 18 policy calls and at most 10 retries of each
# kind (a reply with no move, a move not legal). A request past a cap gets '' without sampling, as one past the
# token budget does, so the harness ends the episode and is scored on what it has.
MODEL_CALL_CAPS = {"searchqa": 16, "math": 16, "chess": 18}
MAX_RETRIES = 10          # chess: format retries, and illegal-move retries, each
MAX_TOOL_CALLS = 64       # per episode
MAX_CHARS = 32_000        # per message content, tool result, error text
MAX_MESSAGES = 256        # per llm() call
MAX_LINE = 4_000_000      # one JSON message from a worker
STDOUT_KEEP = 10_000      # printed characters kept in the trace
MAX_PROMPT_TOKENS = 8192  # per llm() call when the run sets no --max-prompt-tokens / --max-model-len
MAX_STOPS, MAX_STOP_CHARS = 4, 32
MAX_TOOLS, MAX_TOOLS_CHARS = 16, 32_000  # function schemas per llm() call, and their JSON size
ROLES = ("system", "user", "assistant", "tool")  # "tool": a tool's result, as native tool calls expect it


class InfrastructureError(RuntimeError):
    """A failure outside the harness's own code: a tool server that did not answer, a sandbox the kernel refused,
    a run over its error budget. A tool raises it instead of returning an error for the harness to read: the
    runner ends the episode as the machine's failure, not the candidate's (rollout.ErrorBudget counts them)."""


def exception_reply(e):
    name = type(e).__name__ if type(e).__module__ == "builtins" else "RuntimeError"
    return {"raise": name, "message": f"{type(e).__name__}: {e}"[:MAX_CHARS]}


def llm_request(msg, max_new_tokens):
    """-> (messages, token cap, stop list or None, tools or None) from a worker's llm request, checked in full: the
    worker's own checks are a courtesy that harness code can skip. Raises ValueError on a forged request."""
    messages, max_tokens, stop, tools = msg["llm"], msg.get("max_tokens"), msg.get("stop"), msg.get("tools")
    if set(msg) - {"llm", "max_tokens", "stop", "tools"}:
        raise ValueError(f"unknown keys {sorted(set(msg) - {'llm', 'max_tokens', 'stop', 'tools'})}")
    if not (isinstance(messages, list) and 1 <= len(messages) <= MAX_MESSAGES and all(
            isinstance(m, dict) and set(m) == {"role", "content"} and m["role"] in ROLES
            and isinstance(m["content"], str) and len(m["content"]) <= MAX_CHARS for m in messages)):
        raise ValueError(f"llm messages must be 1 to {MAX_MESSAGES} {{role, content}} dicts (role one of "
                         f"{', '.join(ROLES)}) of at most {MAX_CHARS} characters")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise ValueError(f"llm max_tokens must be None or an int >= 1, not {max_tokens!r}"[:200])
    stop = [stop] if isinstance(stop, str) else stop
    if stop is not None and not (isinstance(stop, list) and len(stop) <= MAX_STOPS and all(
            isinstance(s, str) and 1 <= len(s) <= MAX_STOP_CHARS for s in stop)):
        raise ValueError(f"llm stop must be None, a string or a list of at most {MAX_STOPS} non-empty strings of "
                         f"at most {MAX_STOP_CHARS} characters")
    cap = max_new_tokens if max_tokens is None else min(max_new_tokens, max_tokens)
    return messages, cap, stop or None, check_tools(tools)


def check_tools(tools):
    """tools: None or a list of OpenAI-style function schemas {"type": "function", "function": {"name": ...}};
    the chat template renders them into the prompt, so their size is capped."""
    if tools is None:
        return None
    if not (isinstance(tools, list) and len(tools) <= MAX_TOOLS and all(
            isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) for t in tools)):
        raise ValueError(f"llm tools must be None or a list of at most {MAX_TOOLS} function schemas "
                         '{"type": "function", "function": {"name": str, ...}}')
    if len(json.dumps(tools)) > MAX_TOOLS_CHARS:
        raise ValueError(f"llm tools: {len(json.dumps(tools))} characters of JSON; the limit is {MAX_TOOLS_CHARS}")
    return tools or None


def tool_request(msg, methods):
    """-> (name, args, kwargs) from a worker's tool request, checked; raises ValueError on a forged one."""
    name, args, kwargs = msg["tool"], msg.get("args", []), msg.get("kwargs", {})
    if set(msg) - {"tool", "args", "kwargs"}:
        raise ValueError(f"unknown keys {sorted(set(msg) - {'tool', 'args', 'kwargs'})}")
    if name not in methods:
        raise ValueError(f"tool {str(name)[:100]!r} is not one of {', '.join(methods)}")
    if not (isinstance(args, list) and isinstance(kwargs, dict) and all(isinstance(k, str) for k in kwargs)):
        raise ValueError("tool args must be a list and kwargs a dict with str keys")
    return name, args, kwargs


def cut_at_stop(text, stop):
    """The reply up to and including the first stop string to complete (the one that ends earliest)."""
    ends = [text.find(s) + len(s) for s in stop or () if s in text]
    return text[:min(ends)] if ends else text
