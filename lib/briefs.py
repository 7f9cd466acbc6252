"""What every proposer reads: the instructions written into its folder each iteration (INSTRUCTIONS), the caps the
runner enforces (CAPS), and each domain's brief (DOMAIN_BRIEFS), after the official runs' per-domain proposer
skills (meta_harness/skills/*/SKILL.md; docs/fidelity.md setting 4). lib/proposers.write_instructions fills them in.
"""

INSTRUCTIONS = """# Meta-Harness: propose better harnesses

You improve the *harness* of a small LLM agent for the `{domain}` domain: the Python file that builds
prompts, manages context, calls tools, loops over turns and parses the final answer. The model weights
are fixed during this search. Each candidate is scored on a fixed harness set drawn from the training
split (1 rollout per task); the best score wins, ties go to fewer mean turns.

## The archive (this folder, a copy made for this iteration)
- `summary.jsonl`: one row per candidate (name, iteration, parent, hypothesis, what changed, valid,
  rejection reason, score, mean turns, tokens, rollouts).
- `frontier.json`: the best candidate so far, its lineage and the best-score series per iteration.
- `candidates/<name>/harness.py`: every candidate's code; `meta.json`: its parent and hypothesis;
  `scores.json`: its harness-set score; `traces.jsonl`: one JSON line per episode with every model
  call (messages and completion), every tool call and result, the final answer, reward (1 = correct)
  and any error.
- `notes.md`: what earlier iterations learned.

## The harness contract (a candidate that breaks it is rejected and never scored)
- One self-contained file: a docstring, knobs as top-level UPPER_CASE constants, a `SEARCH_SPACE` dict,
  and `def run(task, llm, tools)` returning a dict with at least `"answer"`.
- `task` holds only what the agent may see: {public_keys}.
- `llm(messages, max_tokens=None) -> str`; messages are `[{{"role": "system"|"user"|"assistant", "content": str}}]`.
- `tools` methods: {tool_methods}. They take and return JSON values.
- Imports only from: {allowed}. No `open`, `exec`, `eval`, `getattr`, `globals`, dunder attributes.
- Caps the runner enforces whatever the harness asks: {caps}. Past a cap `llm()` returns '' (as it
  does once the episode's token budget is spent): end the episode there with the answer you have.
- Leave the answering to the model: a score is the model's and the harness's together. Code that computes,
  looks up or reads off the answer by itself is not an improvement: {null_rule}
- Keep prompts short: the policy is a small model with a small context.{prompt_only}

## The {domain} domain
{domain_brief}

## What to do
1. Read the archive first: `summary.jsonl`, `frontier.json`, and traces of recent failures and
   successes (reward 0 and 1) of the best candidates.
2. Append to `notes.md` a section `## iteration {iteration}`: what the last iteration taught, and
   falsifiable hypotheses about why episodes fail.
3. Write the candidates below. Each starts as a copy of `{parent}` (the current best); edit it in
   place, or replace it with another candidate's code and set `parent` accordingly. Each candidate
   changes ONE mechanism (a prompt strategy, a parser fix, a retry policy, a context or tool-result
   format, a turn budget), not a sweep of constants; mix exploiting the best with exploring new ideas.
   In its `meta.json`, fill `hypothesis` (falsifiable: what will change in the score and why) and
   `changed` (what you changed); keep the other fields.
4. General changes only: never mention, special-case or guess dataset items or gold answers; never
   change the model, the data, the reward or what a tool does. Touch no file other than the ones
   named here and `notes.md`, and read nothing outside this folder.
5. Only the candidates' `harness.py`, the `parent`, `hypothesis` and `changed` of their `meta.json`,
   and `notes.md` are read back. The search validates and scores every candidate itself; anything
   else written here is discarded.

## This iteration ({iteration})
Candidates to write: {targets}
"""


# what the search does with a candidate's score without the model (--null-check; meta_harness.check_without_model)
NULL_RULES = {
    "refuse": "the candidate a round would accept is scored again with a model that replies '' to every call, "
              "and one that earns more there than its parent (by more than {margin:g}) is rejected.",
    "report": "the candidate a round accepts is scored again with a model that replies '' to every call, and "
              "that score is reported beside its own.",
}


CAPS = {"searchqa": "at most 16 model calls an episode", "math": "at most 16 model calls an episode",
        "chess": "at most 18 model calls a puzzle, and at most 10 retries of each kind (a reply that names no "
                 "single valid move, a move that is not legal)"}

# Each domain's brief, after the official runs' per-domain proposer skills (meta_harness/skills/*/SKILL.md)
DOMAIN_BRIEFS = {
    "searchqa": """Multi-turn factual question answering over an encyclopedia through `tools.search` (a retriever over
a fixed corpus, not a web search engine); the reward is exact match of the final answer, after normalisation,
with any gold answer. Good candidates change a mechanism; pick an axis other than the last iterations' ones:
- A. the system prompt's structure (e.g. plan, search, verify, then answer);
- B. the user template;
- C. query rewriting before a search (decomposition, entity extraction, dropping filler words);
- D. retrieval parameters (passages per search, words per passage), together with how they are used;
- E. what the harness says back after a turn (how results are shown, a nudge when the model neither searches
  nor answers, feedback on a repeated query);
- F. the turn budget and when to stop.
Combining mechanisms of earlier candidates is fine, as are published patterns (ReAct, self-ask, IRCoT). Never
branch on question text, entities or the benchmark a question comes from. Where the harness gives the model a
tool schema (`TOOLS`), keep its name and its first parameter: the weights are trained under it.""",
    "math": """Math problems, with `tools.python` to run code; the reward reads the last `\\boxed{...}` of the final
answer and compares it with the gold answer as a string. Good candidates change a mechanism; pick an axis other
than the last iterations' ones:
- A. the system prompt's structure (e.g. plan, compute, check, answer);
- B. the user template: keep the problem as it is and keep the boxed-answer requirement;
- C. how the model's code is taken (which block, printing the last value);
- D. how the interpreter's output and errors are shown, and the nudges after an error;
- E. recovery when the model neither calls the tool nor answers;
- F. the turn budget and when to stop.
Never branch on problem text, numbers of a given problem or the dataset it comes from. Where the harness gives
the model a tool schema (`TOOLS`), keep its name and its first parameter (`code`).""",
    "chess": """Chess puzzles: at each turn the model must name the one move of the puzzle's line; `tools.move` plays
it, then the opponent's reply. A legal move other than the line's ends the puzzle with 0.
The harness is a communication layer only. Hard bans (a candidate that breaks one is worthless even if it
scores):
- no chess library (`import chess` is refused) and no engine, tablebase or move search of any kind;
- no minimax, mate search, ranking of captures or checks, piece values, move ordering, or any other rule that
  chooses, ranks or filters moves;
- never turn a legal wrong move of the model into another move: a legal wrong move is the model's failure
  and stays final;
- no puzzle ids, positions, lines, ratings or themes written into the code.
What a candidate may do: present the visible position better (board, FEN, legal moves, history, the last
reply), parse the model's reply more robustly (tags, brackets, a bare move, promotion case, ambiguity),
check a move only against the legal moves shown, and retry a malformed or illegal move with short, clear
feedback. Weak changes: a word or punctuation, or a retry budget alone without better feedback.
Where the harness lists `RUNNER_OWNS` (the paper and gpu presets' chess h0, as the official runner), those names
are the runner's: its loop, the conversation and the verifier's messages stay exactly as they are, and a
candidate that changes one is refused; the prompts, the observation, the parser, the retry budgets and
MAX_TURNS are yours.""",
}
