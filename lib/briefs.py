"""What every proposer reads: the instructions written into its folder each iteration (INSTRUCTIONS), the caps the
domain's caps and brief (each domain's CAPS and BRIEF in domains.py, after the official runs' per-domain proposer
skills, meta_harness/skills/*/SKILL.md; docs/fidelity.md setting 4), the line on llm() written from the harness
contract the runner enforces (llm_interface), the rules of a brief (BRIEFS: the official skills' only, or with
the project's additions for the small cpu models), and what the search does with a candidate's score without the
model (NULL_RULES). lib/proposers.write_instructions fills them in.
"""
import ast
from pathlib import Path

from lib.episodes.runner import MAX_CHARS, MAX_MESSAGES, MAX_STOP_CHARS, MAX_STOPS, MAX_TOOLS, ROLES
from lib.rules import WINNER_RULE

INSTRUCTIONS = """# Meta-Harness: propose better harnesses

You improve the *harness* of a small LLM agent for the `{domain}` domain: the Python file that builds
prompts, manages context, calls tools, loops over turns and parses the final answer. The model weights
are fixed during this search. Each candidate is scored on a fixed harness set drawn from the training
split (1 rollout per task); """ + WINNER_RULE + """.

## The archive (this folder, a copy made for this iteration)
- `summary.jsonl`: one row per candidate (name, iteration, parent, hypothesis, axis, what changed, valid,
  rejection reason, score, mean turns, tokens, rollouts).
- `frontier.json`: the best candidate so far, its lineage and the best-score series per iteration.
- `candidates/<name>/harness.py`: every candidate's code; `meta.json`: its parent and hypothesis;
  `scores.json`: its harness-set score; `traces.jsonl`: one JSON line per episode with every model
  call (messages and completion), every tool call and result, the final answer, reward (1 = correct)
  and any error.
- `notes.md`: what earlier iterations learned.

## The harness contract (a candidate that breaks it is rejected and never scored)
- One self-contained file: a docstring, knobs as top-level UPPER_CASE constants, a `SEARCH_SPACE` literal dict
  (knob -> [values]), and `def run(task, llm, tools)` returning a dict with at least `"answer"`.
- `task` holds only what the agent may see: {public_keys}.
{llm_interface}
- `tools` methods: {tool_methods}. They take and return JSON values.
- Imports only from: {allowed}. No `open`, `exec`, `eval`, `getattr`, `globals`, dunder attributes.
- Caps the runner enforces whatever the harness asks: {caps}. Past a cap `llm()` returns '' (as it
  does once the episode's token budget is spent): end the episode there with the answer you have.
- {scoring}
- Leave the answering to the model: a score is the model's and the harness's together. Code that computes,
  looks up or reads off the answer by itself is not an improvement: {null_rule}{prompt_rule}{prompt_only}

## The {domain} domain
{domain_brief}

## What to do
1. Read the archive first: `summary.jsonl`, `frontier.json`, and traces of recent failures and
   successes (reward 0 and 1) of the best candidates.
2. Append to `notes.md` a section `## iteration {iteration}`: what the last iteration taught, and
   {notes_rule}.
3. Write the candidates below. Each starts as a copy of `{parent}` (the current best); edit it in
   place, or replace it with another candidate's code and set `parent` accordingly. Each candidate
   changes ONE mechanism (a prompt strategy, a parser fix, a retry policy, a context or tool-result
   format, a turn budget), not a sweep of constants{round_rule}{skill_rules}
   In its `meta.json`, fill `hypothesis` ({hypothesis_rule}){axis_rule} and
   `changed` (what you changed); keep the other fields.
4. General changes only: never mention, special-case or guess dataset items or gold answers; never
   change the model, the data, the reward or what a tool does. Touch no file other than the ones
   named here and `notes.md`, and read nothing outside this folder.
5. Only the candidates' `harness.py`, the `parent`, `hypothesis`, `axis` and `changed` of their `meta.json`,
   and `notes.md` are read back. The search validates and scores every candidate itself; anything
   else written here is discarded.

## This iteration ({iteration})
Candidates to write: {targets}
"""


# what the search does with a candidate's score without the model (--null-check; meta_harness.null_check)
NULL_RULES = {
    "refuse": "the candidate a round would accept is scored again with a model that replies '' to every call, "
              "and one that earns more there than its parent (by more than {margin:g}) is rejected.",
    "report": "the candidate a round accepts is scored again with a model that replies '' to every call, and "
              "that score is reported beside its own.",
}



# A brief's rules, per preset (--proposer-brief). official: what the official skills say (paper and gpu presets;
# meta_harness/skills/*/SKILL.md): every skill's one mechanism a candidate and no parameter-only variants here, the
# rest per domain (each domain's SKILL_RULES in domains.py). small-model: the project's two
# additions for the cpu and smoke presets' small models (SmolLM2-135M; the cpu preset lets it write
# 32 tokens a call); their offline proposer (mutate) never reads a brief, so neither was calibrated by a proposer run
# (docs/fidelity.md setting 4).
BRIEFS = {
    "official": {"prompt_rule": "", "round_rule": ""},
    "small-model": {"prompt_rule": "\n- Keep prompts short: the policy is a small model with a small context.",
                    "round_rule": "; mix exploiting the best with exploring new ideas"},
}

# what each keyword of llm() does, in the brief's words; llm_interface raises KeyError for a keyword the harness's
# llm() takes that is not described here, so a new one cannot be left out of the brief
KEYWORDS = {
    "tools": ("None or up to {max_tools} OpenAI-style function schemas (`{{\"type\": \"function\", "
              "\"function\": {{\"name\": ..., \"parameters\": ...}}}}`); the model's chat template renders them "
              "(its native tool-call format) and the reply is the raw text, tool calls included, for the harness "
              "to parse"),
    "max_tokens": "None or a cap on this reply's tokens (the run's own cap still holds)",
    "stop": ("None, a string or a list of at most {max_stops} strings of at most {max_stop_chars} characters: the "
             "reply ends at the first one, which it keeps"),
}


def llm_interface():
    """The brief's lines on llm(), written from the harness contract itself so the two cannot drift: the keywords
    of the llm() a harness is handed (read off lib/episodes/harness_process.py, the worker script, which cannot be
    imported), the roles and limits the runner checks (lib/episodes/runner.py llm_request); tests/test_fidelity.py holds
    the brief to the runner."""
    llm = worker_llm()
    names, signature = [arg.arg for arg in llm.args.args], f"llm({ast.unparse(llm.args)}) -> str"
    roles = "|".join(f'"{role}"' for role in ROLES)
    lines = [f"- `{signature}`: one completion of the policy.",
             f'  - `{names[0]}`: `[{{"role": {roles}, "content": str}}]`, at most {MAX_MESSAGES} messages of at '
             f'most {MAX_CHARS:,} characters; a `"tool"` message gives a tool\'s result back, as native tool calls '
             "expect it."]
    limits = dict(max_tools=MAX_TOOLS, max_stops=MAX_STOPS, max_stop_chars=MAX_STOP_CHARS)
    lines += [f"  - `{name}=`: {KEYWORDS[name].format(**limits)}." for name in names[1:]]
    return "\n".join(lines)


def worker_llm():
    """The syntax tree of the llm() the worker hands a harness (lib/episodes/harness_process.py, make_llm's inner
    llm)."""
    tree = ast.parse((Path(__file__).parent / "episodes" / "harness_process.py").read_text())
    return next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "llm")
