"""Why harness-set episodes fail, in kinds any domain shares, as the offline proposer reads them from an archive's
traces (what a coding agent would look for first). A failed episode (reward <= lib/rules.SUCCESS) is of the first kind
that fits, in this order:
    erred       the harness raised, broke a rule or ran past its deadline
    cut         nothing could be read as an answer, and the last model call stopped at its token cap
    no_answer   nothing could be read as an answer (the domain's own reading: math's last \\boxed{}, ...)
    no_tool     an answer, but the tool was never called or the answer appears in none of its results
    wrong       an answer read from a tool result, and still wrong
Only what the trace holds is used (the model's calls and answer, tool calls and results, the reward); never a
gold answer. A harness file may declare SKILL = {kind: [knob, ...]}: the SEARCH_SPACE knobs its author
would change first for each kind."""

from collections import Counter

from lib.common.json_files import read_jsonl
from lib.rules import SUCCESS

FAILURE_KINDS = ("erred", "cut", "no_answer", "no_tool", "wrong")


def failure_kind(episode):
    """The kind of a failed episode's failure, None when it succeeded (reward > lib/rules.SUCCESS)."""
    if episode.get("reward", 0.0) > SUCCESS:
        return None
    if episode.get("error"):
        return "erred"
    answer = extracted(episode)
    if not answer:
        calls = episode.get("calls") or []
        last = calls[-1] if calls else {}
        at_cap = last.get("max_tokens") is not None and last.get("tokens", 0) >= last["max_tokens"]
        return "cut" if at_cap or episode.get("out_of_tokens") else "no_answer"
    results = [str(call.get("result")) for call in episode.get("tool_calls") or []]
    if not any(answer.lower() in result.lower() for result in results):
        return "no_tool"
    return "wrong"


def extracted(episode):
    """The answer as the reward reads it (the runner's `extracted`; older traces: the answer if it is text)."""
    answer = episode["extracted"] if "extracted" in episode else episode.get("answer")
    return answer.strip() if isinstance(answer, str) else None


def failure_counts(traces_path):
    """Counter {kind: failed episodes} of a traces.jsonl (an unreadable or missing file counts nothing)."""
    try:
        episodes = read_jsonl(traces_path)
    except ValueError:
        return Counter()
    return Counter(kind for kind in map(failure_kind, episodes) if kind)


def kinds_by_frequency(counts):
    """The kinds seen, most frequent first (ties in FAILURE_KINDS order)."""
    return sorted((k for k in FAILURE_KINDS if counts[k]), key=lambda k: (-counts[k], FAILURE_KINDS.index(k)))


def skill_problem(skill, space):
    """Why a declared SKILL cannot be used with this SEARCH_SPACE (one line), else None."""
    if not isinstance(skill, dict):
        return "SKILL must be a literal dict {failure kind: [SEARCH_SPACE knob, ...]}"
    for kind, knobs in skill.items():
        if kind not in FAILURE_KINDS:
            return f"SKILL names failure kind {kind!r}; the kinds are {', '.join(FAILURE_KINDS)}"
        if not isinstance(knobs, (list, tuple)):
            return f"SKILL[{kind!r}] must be a list of SEARCH_SPACE knobs"
        for knob in knobs:
            if knob not in (space or {}):
                return f"SKILL[{kind!r}] names knob {knob!r}, which is not in SEARCH_SPACE"
    return None
