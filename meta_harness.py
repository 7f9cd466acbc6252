"""
Meta-Harness: search over harness code under fixed policy weights (the harness phase of WHALE,
and on its own the harness-only baseline).

    python meta_harness.py --domain searchqa --harness harnesses/searchqa.py --model smoke \
        --iterations 2 --candidates 3 --proposer mutate --out runs/mh
    python meta_harness.py ... --proposer command --proposer-cmd "my-agent --dir {workdir} --task {instructions}" \
        --proposer-ro /opt/my-agent                        # what the sandboxed command may read besides {workdir}
    python meta_harness.py ... --proposer claude          # Claude Code CLI in print mode, as the paper did
    python meta_harness.py ... --proposer openai --proposer-url http://localhost:8000/v1 --proposer-model M

Algorithm. The seed harness h0 is scored once on the harness set (a fixed subset of the train split,
1 rollout per task). Each iteration asks a proposer for M new candidate files, validates each one
before any rollout (it parses, defines run(task, llm, tools), imports only allowed modules, uses no
exec/open/dunder tricks, with --prompt-only differs from its parent only in string constants, and
survives one smoke episode), scores the valid ones on the harness set and adds everything to the
archive. The accepted harness is the best harness-set score in the archive, ties going to fewer mean
turns. The search stops after a fixed number of iterations, or when the archive best has not improved
for P iterations after at least N iterations (the paper's patience rule).

The run folder is the archive and the search's own truth. A proposer never works in it: it gets a copy of
the harness-set material (code, meta, scores, traces, summary, frontier, notes) in a fresh folder outside
the run folder, runs there in its own session inside the OS sandbox (sandbox.py: it sees that folder and
nothing of the project, the data or the run's evals/), and afterwards the search takes back only each new
candidate's harness.py (size-capped, no symlinks), its parent / hypothesis / changed as short text, and
notes.md. Validity and scores are always the search's own. A proposer call that fails (the CLI reports an
error, a timeout, an API error after retries) is retried; --proposer-max-failures in a row stop the search.
    INSTRUCTIONS.md                  what the proposer was asked to do this iteration
    candidates/<name>/harness.py     the candidate (h0 is the seed; h<iteration>_<j> the proposals)
    candidates/<name>/meta.json      parent, hypothesis, what changed, proposer, iteration, valid, reason
    candidates/<name>/scores.json    harness-set score, mean turns, tokens, rollouts, errors, seconds
    candidates/<name>/traces.jsonl   the harness-set episodes (messages, completions, tool calls, reward)
    summary.jsonl                    one row per candidate
    frontier.json                    the best so far, its lineage, the best-score series, the costs
    setup.json                       the harness-set task ids and sampling settings every score used
    costs.jsonl                      one row per proposer call: seconds, tokens, dollars where reported
    notes.md                         what agent proposers learned, iteration by iteration
Rerunning the same command resumes: a candidate with a scores.json is never scored again.
"""
import argparse
import ast
import json
import os
import random
import re
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from email.utils import parsedate_to_datetime
from pathlib import Path

import domains
import engines
import rollout
import sandbox
from rollout import Parser, nonnegative_int, positive_float, positive_int

ALLOWED_IMPORTS = ("re", "json", "math", "random", "string", "collections", "itertools", "functools",
                   "textwrap", "dataclasses", "typing")
# names that reach files, code execution or the interpreter's internals; the runner sandboxes harness
# code anyway, this catches the obvious attempts before any rollout is spent
FORBIDDEN_NAMES = ("open", "exec", "eval", "compile", "__import__", "globals", "locals", "vars", "getattr",
                   "setattr", "delattr", "breakpoint", "input", "__builtins__", "__loader__", "__spec__")
MAX_HARNESS_CHARS = 100_000
PROPOSERS = ("mutate", "command", "claude", "openai")
# what a proposer sees (a copy) and what the search takes back from it (capped)
ARCHIVE_FILES = ("summary.jsonl", "frontier.json", "notes.md", "setup.json")
CANDIDATE_FILES = ("harness.py", "meta.json", "scores.json", "traces.jsonl")
MAX_HARNESS_BYTES = 4 * MAX_HARNESS_CHARS  # utf-8: up to 4 bytes a character
MAX_META_BYTES = 64_000
MAX_FIELD_CHARS = 2_000  # hypothesis, changed
MAX_NOTES_CHARS = 200_000
MAX_OUTPUT_BYTES = 8_000_000  # a proposer's stdout / stderr kept
# Claude Code: file tools only (no shell, no web); the variables its login may come from
CLAUDE_TOOLS = "Read,Write,Edit,Glob,Grep"
CLAUDE_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "CLAUDE_CODE_OAUTH_TOKEN")
# OpenAI-compatible API: statuses worth a retry (as the OpenAI SDK: these and every 5xx), how long to wait at most
RETRY_STATUS = (408, 409, 429)
OPENAI_RETRIES = 4
MAX_RETRY_WAIT_S = 120.0


def add_args(p):
    # harness search (shared with whale.py)
    p.add_argument("--candidates", type=positive_int, default=3, help="M: candidates proposed per iteration")
    p.add_argument("--harness-tasks", type=positive_int, default=None,
                   help="score on the first N harness-set tasks (default all)")
    p.add_argument("--harness-samples", type=positive_int, default=1,
                   help="rollouts per harness-set task when scoring")
    p.add_argument("--prompt-only", action="store_true", help="candidates may change only string constants (FST)")
    # proposer
    p.add_argument("--proposer", default="mutate", choices=PROPOSERS)
    p.add_argument("--proposer-cmd", default=None,
                   help="command template for --proposer command: {workdir}, {instructions}")
    p.add_argument("--proposer-url", default="http://localhost:8000/v1", help="OpenAI-compatible base URL")
    p.add_argument("--proposer-model", default=None, help="model name for openai / claude proposers")
    p.add_argument("--proposer-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    p.add_argument("--proposer-timeout", type=positive_float, default=1800.0,
                   help="seconds per proposer call (command, claude: the whole process tree; openai: per request)")
    p.add_argument("--proposer-max-failures", type=positive_int, default=3,
                   help="stop the search after this many failed proposer calls in a row")
    p.add_argument("--proposer-ro", action="append", default=[], metavar="PATH",
                   help="a file or folder the command proposer may read in its sandbox (its script, install, "
                        "config); repeatable")
    p.add_argument("--proposer-prompt-tokens", type=positive_int, default=24000,
                   help="openai prompt budget (chars/4 estimate)")


# -----------------------------------------------------------------------------
# acceptance and stopping (pure)

def pick_best(rows):
    """The row with the best score; ties go to fewer mean turns, then to the earlier row."""
    scored = [r for r in rows if r.get("score") is not None]
    if not scored:
        raise ValueError("pick_best: no scored candidate in the archive; score the seed harness first")
    return scored[max(range(len(scored)), key=lambda i: (scored[i]["score"], -scored[i]["mean_turns"], -i))]


def should_stop_harness_phase(best_series, patience, min_iters):
    """best_series[0] is the seed's score, best_series[i] the archive best after iteration i.
    Stop once at least min_iters iterations ran and the best has not improved for `patience` iterations."""
    iters = len(best_series) - 1
    if iters < max(min_iters, patience, 1):
        return False
    return max(best_series[-patience:]) <= best_series[-patience - 1] if patience > 0 else True


# -----------------------------------------------------------------------------
# the archive

def read_json(path, default=None):
    """The JSON in path (default when there is none); a damaged file is an error naming it and the fix."""
    path = Path(path)
    if not path.exists():
        return default
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"damaged run file {path} ({'empty' if not path.read_text().strip() else e.msg}): restore "
                         "it, or start this run over in a fresh --out") from None


def check_run_files(folder):
    """Every JSON file of a run folder parses (read_json's error otherwise), checked before any work starts."""
    for path in sorted(Path(folder).glob("**/*.json")):
        if path.name != "config.json":  # rewritten at every start
            read_json(path)


def write_json(path, obj):
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)  # atomic, so a killed run never leaves half a file behind


def candidate_rows(run_dir):
    """One row per proposed candidate, in the order they were made."""
    rows = []
    for d in sorted((Path(run_dir) / "candidates").glob("*/meta.json")):
        d = d.parent
        try:
            meta = read_json(d / "meta.json")
        except ValueError:  # a stray folder an agent wrote; ours are always valid JSON
            continue
        if not isinstance(meta, dict) or not meta.get("proposed") or "iteration" not in meta:
            continue
        scores = read_json(d / "scores.json", {})
        rows.append({"name": d.name, "iteration": meta["iteration"], "parent": meta.get("parent"),
                     "proposer": meta.get("proposer"), "valid": meta.get("valid"), "reason": meta.get("reason"),
                     "score": scores.get("score"), "mean_turns": scores.get("mean_turns"),
                     "tokens": scores.get("tokens"), "errors": scores.get("errors"),
                     "rollouts": scores.get("rollouts", 0) + meta.get("smoke_rollouts", 0),
                     "hypothesis": meta.get("hypothesis", ""), "changed": meta.get("changed", "")})
    return sorted(rows, key=lambda r: (r["iteration"], len(r["name"]), r["name"]))


def best_series_of(rows, iterations):
    """The archive-best score after iterations 0 (the seed) .. `iterations`."""
    return [pick_best([r for r in rows if r["iteration"] <= i])["score"] for i in range(iterations + 1)]


def lineage(rows, name):
    by_name, chain = {r["name"]: r for r in rows}, []
    while name in by_name and name not in chain:
        chain.append(name)
        name = by_name[name]["parent"]
    return chain[::-1]


def proposer_costs(run_dir):
    path = Path(run_dir) / "costs.jsonl"
    rows = [json.loads(l) for l in open(path)] if path.exists() else []
    keys = ("seconds", "prompt_tokens", "completion_tokens", "cost_usd")
    return {"calls": len(rows), **{k: round(sum(r.get(k) or 0 for r in rows), 4) for k in keys}}


def write_index(run_dir, iterations):
    """Rebuild summary.jsonl and frontier.json from the candidate folders (so resume stays consistent)."""
    rows = candidate_rows(run_dir)
    tmp = Path(run_dir) / "summary.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, Path(run_dir) / "summary.jsonl")  # atomic: a report reading a running search sees whole rows
    done = [r for r in rows if r["iteration"] <= iterations]  # as of this iteration (resume replays)
    best = pick_best(done)
    frontier = {"best": best["name"], "score": best["score"], "mean_turns": best["mean_turns"],
                "harness": f"candidates/{best['name']}/harness.py", "lineage": lineage(rows, best["name"]),
                "iterations": iterations, "best_series": best_series_of(rows, iterations),
                "candidates": len(done), "valid": sum(bool(r["valid"]) for r in done),
                "rollouts": sum(r["rollouts"] for r in done),
                "proposer": proposer_costs(run_dir)}
    write_json(Path(run_dir) / "frontier.json", frontier)
    return rows, frontier


def log_cost(run_dir, row):
    with open(Path(run_dir) / "costs.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


# -----------------------------------------------------------------------------
# validation (before any rollout)

def static_check(source, parent_source=None, prompt_only=False):
    """None when the candidate may be run, else the reason it is rejected."""
    if not source or not source.strip():
        return "no code: the candidate file is missing or empty"
    if len(source) > MAX_HARNESS_CHARS:
        return f"too large: {len(source)} characters (max {MAX_HARNESS_CHARS})"
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return f"syntax error: line {e.lineno}: {e.msg}"
    runs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    if not runs or [a.arg for a in runs[-1].args.args] != ["task", "llm", "tools"] or runs[-1].args.vararg \
            or runs[-1].args.kwonlyargs or runs[-1].args.kwarg or runs[-1].args.posonlyargs:
        return "no run: the file must define a top-level def run(task, llm, tools)"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad = [a.name for a in node.names if a.name.split(".")[0] not in ALLOWED_IMPORTS]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            bad = [] if module.split(".")[0] in ALLOWED_IMPORTS else [module]
        else:
            bad = []
        if bad:
            return f"forbidden import: {bad[0]} (allowed: {', '.join(ALLOWED_IMPORTS)})"
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            return f"forbidden name: {node.id} (line {node.lineno})"
        if isinstance(node, ast.Attribute) and node.attr.startswith("__") and node.attr.endswith("__"):
            return f"forbidden attribute: .{node.attr} (line {node.lineno})"
    if prompt_only and parent_source is not None and strings_blanked(source) != strings_blanked(parent_source):
        return ("prompt-only violation: the candidate changes more than its parent's prompt text (top-level "
                "*_PROMPT / *_TEMPLATE string constants and docstrings)")
    return None


PROMPT_KNOBS = ("PROMPT", "TEMPLATE")  # a prompt knob's name is one of these or ends in _PROMPT / _TEMPLATE


def strings_blanked(source):
    """The syntax tree with its prompt text blanked, so two files compare equal iff they differ only in prompt
    text (--prompt-only, FST). Prompt text is (1) the value of a top-level prompt knob: `NAME = "..."`, a single
    string literal, NAME being PROMPT, TEMPLATE or UPPER_CASE ending in _PROMPT or _TEMPLATE; (2) docstrings,
    which code cannot read without a new name (and so a rejected change). Every other literal (regexes, tag
    names, dict keys, SEARCH_SPACE, strings inside functions) must stay as the parent has it."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id.isupper() and node.targets[0].id.split("_")[-1] in PROMPT_KNOBS \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            node.value.value = ""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
                and isinstance(node.body[0].value.value, str):
            node.body[0].value.value = ""
    return ast.dump(tree, include_attributes=False)


def normalized(source):
    """The code without formatting and comments, for duplicate checks (None when it does not parse)."""
    try:
        return ast.dump(ast.parse(source))
    except SyntaxError:
        return None


def validate(cand_dir, rows, backend, domain, tasks, args, policy_kw):
    """Static checks, duplicate check, then one smoke episode; writes valid/reason into meta.json."""
    meta = read_json(cand_dir / "meta.json")
    path = cand_dir / "harness.py"
    source = path.read_text() if path.exists() else ""
    parents = {r["name"]: r for r in rows if r["valid"]}
    try:  # a 2,000-term expression parses, then overflows the recursion of ast.dump; 6,000 overflow ast.parse
        if meta.get("parent") not in parents:
            reason = f"unknown parent {meta.get('parent')!r}: meta.json parent must name a valid archive candidate"
        else:
            parent_source = (cand_dir.parent / meta["parent"] / "harness.py").read_text()
            reason = static_check(source, parent_source, args.prompt_only)
        if reason is None:
            same = [r["name"] for r in rows if r["name"] != cand_dir.name and r["valid"]
                    and normalized((cand_dir.parent / r["name"] / "harness.py").read_text()) == normalized(source)]
            reason = f"duplicate of {same[0]}: no change to score" if same else None
    except RecursionError:
        reason = "too deeply nested: checking the code exceeded Python's recursion limit"
    if reason is None:
        try:
            ep = rollout.run_episodes(domain, str(path), tasks[:1], backend, samples=1,
                                      desc=f"smoke {cand_dir.name}", **policy_kw)[0]
            meta["smoke_rollouts"] = 1
            error = ep.get("error")
        except ValueError as e:  # the runner's own harness checks
            error = str(e)
        reason = f"smoke episode failed: {str(error)[:300]}" if error else None
    meta.update(valid=reason is None, reason=reason)
    write_json(cand_dir / "meta.json", meta)
    return meta


def score(cand_dir, backend, domain, tasks, args, policy_kw):
    traces = cand_dir / "traces.jsonl"
    traces.unlink(missing_ok=True)  # a scoring run killed midway starts over
    stats = rollout.evaluate(domain, str(cand_dir / "harness.py"), tasks, backend, k=args.harness_samples,
                             traces_path=str(traces), desc=f"score {cand_dir.name}", **policy_kw)
    scores = {"score": stats["mean_at_k"], "mean_turns": stats["mean_turns"], "tokens": stats["tokens"],
              "rollouts": stats["rollouts"], "errors": stats["errors"], "seconds": round(stats["seconds"], 2),
              "tasks": len(tasks), "samples": args.harness_samples}
    write_json(cand_dir / "scores.json", scores)
    return scores


# -----------------------------------------------------------------------------
# proposers: each fills candidates/<name>/harness.py and meta.json for the names it is given

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
- Stay within the caps: at most 16 turns (SearchQA), 18 (chess), 10 retries; keep prompts short, the
  policy is a small model with a small context.{prompt_only}

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


def write_instructions(run_dir, domain, names, parent, iteration, args):
    example = domain.public(domain.load("harness")[0])
    prompt_only = ("\n- PROMPT-ONLY RUN: change only string constants (prompts, formats); any other change "
                   "to the code is rejected.") if args.prompt_only else ""
    text = INSTRUCTIONS.format(domain=domain.name, public_keys=", ".join(f"`{k}`" for k in example),
                               tool_methods=", ".join(f"`{m}`" for m in domain.TOOL_METHODS),
                               allowed=", ".join(ALLOWED_IMPORTS), prompt_only=prompt_only, iteration=iteration,
                               parent=parent, targets=", ".join(f"`candidates/{n}/harness.py`" for n in names))
    path = Path(run_dir) / "INSTRUCTIONS.md"
    path.write_text(text)
    return path


def prepare(run_dir, names, parent, iteration, proposer):
    """Fresh folders for the new candidates: a copy of the parent and a meta.json to fill in."""
    for name in names:
        d = Path(run_dir) / "candidates" / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        shutil.copy(Path(run_dir) / "candidates" / parent / "harness.py", d / "harness.py")
        write_json(d / "meta.json", {"parent": parent, "hypothesis": "", "changed": "", "proposer": proposer,
                                     "iteration": iteration, "proposed": False, "valid": None, "reason": None})


def finish(run_dir, name, **fields):
    d = Path(run_dir) / "candidates" / name
    meta = read_json(d / "meta.json", {})
    meta.update(fields, proposed=True)
    write_json(d / "meta.json", meta)


# -----------------------------------------------------------------------------
# untrusted proposers (command, claude, openai) work on a copy; the search takes back only harness.py files

class ProposalFailed(Exception):
    """A proposer call that produced nothing usable (its error message); the iteration is asked again."""


def propose_in_copy(run_dir, names, rows, iteration, domain, args):
    """Ask the proposer for `names` in a fresh copy of the archive outside the run folder, then take back only
    the new candidates' harness.py files and text fields. Returns None, or the proposer's error message."""
    scratch = Path(tempfile.mkdtemp(prefix="whale-proposer-"))  # holds the copy, the proposer's output, settings
    work = scratch / "archive"
    try:
        copy_archive(run_dir, work, rows)
        parent = pick_best(rows)["name"]
        prepare(work, names, parent, iteration, args.proposer)
        write_instructions(work, domain, names, parent, iteration, args)
        shutil.copyfile(work / "INSTRUCTIONS.md", run_dir / "INSTRUCTIONS.md")  # for the record
        try:
            if args.proposer == "openai":
                propose_openai(work, run_dir, names, rows, iteration, args)
            else:
                propose_agent(work, scratch, run_dir, names, iteration, args)
        except ProposalFailed as e:
            return str(e)
        take_candidates(work, run_dir, names, parent, iteration, args.proposer)
        take_notes(work, run_dir)
        return None
    finally:
        remove_tree(scratch)


def copy_archive(run_dir, work, rows):
    """The proposer's view: harness-set material only (no evals, metrics or anything of the test split)."""
    (work / "candidates").mkdir(parents=True)
    for name in ARCHIVE_FILES:
        if (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, work / name)
    for r in rows:
        src, dst = run_dir / "candidates" / r["name"], work / "candidates" / r["name"]
        dst.mkdir()
        for name in CANDIDATE_FILES:
            if (src / name).is_file():
                shutil.copyfile(src / name, dst / name)


def take_candidates(work, run_dir, names, parent, iteration, proposer):
    """Each asked-for candidate's harness.py and text fields go into the archive, with our own bookkeeping;
    scores, validity and every other file the proposer wrote stay behind."""
    for name in names:
        rel = f"candidates/{name}/harness.py"
        try:
            source, reason = read_untrusted(work, rel, MAX_HARNESS_BYTES), None
        except FileNotFoundError:
            source, reason = None, None  # validate() says "no code"
        except ValueError as e:
            source, reason = None, str(e)
        except OSError as e:  # e.g. its folder replaced by a file
            source, reason = None, f"{rel}: {e.strerror}"
        fields = untrusted_fields(work, name)
        d = run_dir / "candidates" / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        if source is not None:
            (d / "harness.py").write_text(source)
        write_json(d / "meta.json", {"parent": fields.get("parent") or parent,
                                     "hypothesis": fields.get("hypothesis", ""), "changed": fields.get("changed", ""),
                                     "proposer": proposer, "iteration": iteration, "proposed": True,
                                     "valid": None if reason is None else False, "reason": reason})


def untrusted_fields(work, name):
    """parent / hypothesis / changed from the proposer's meta.json, as short strings (anything else: absent)."""
    try:
        meta = json.loads(read_untrusted(work, f"candidates/{name}/meta.json", MAX_META_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(meta, dict):
        return {}
    caps = {"parent": 100, "hypothesis": MAX_FIELD_CHARS, "changed": MAX_FIELD_CHARS}
    return {k: meta[k].strip()[:cap] for k, cap in caps.items() if isinstance(meta.get(k), str)}


def take_notes(work, run_dir):
    try:
        notes = read_untrusted(work, "notes.md", 4 * MAX_NOTES_CHARS)
    except (OSError, ValueError):
        return
    (run_dir / "notes.md").write_text(notes[-MAX_NOTES_CHARS:])  # the newest sections are at the end


def read_untrusted(root, rel, limit):
    """The text of a file a proposer wrote under root: a regular file reached without symlinks, at most
    `limit` bytes, utf-8. Raises FileNotFoundError when absent, ValueError naming what is wrong."""
    path = root
    for part in Path(rel).parts:
        path = path / part
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            raise ValueError(f"{rel}: {path.relative_to(root)} is a symlink (never followed)")
    if not stat.S_ISREG(mode):
        raise ValueError(f"{rel}: not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with open(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"too large: {rel} has more than {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{rel}: not utf-8 text") from None


def remove_tree(path):
    """rmtree, after unlocking the folders a proposer made unreadable (chmod 000); symlinks are not followed."""
    for root, dirs, _ in os.walk(path):  # top-down: each folder is unlocked before it is walked into
        for d in dirs:
            if not os.path.islink(os.path.join(root, d)):
                os.chmod(os.path.join(root, d), 0o700)
    shutil.rmtree(path, ignore_errors=True)


def run_in_sandbox(argv, cwd, out_dir, timeout):
    """Run a proposer in its own session; its output goes to files, so a child that keeps stdout open cannot
    hang the search. On timeout the process group dies, and with it bwrap, whose pid namespace takes every
    process the proposer started (double-forked or not). -> (rc or "timeout", stdout, stderr)"""
    with open(out_dir / "stdout", "wb") as out, open(out_dir / "stderr", "wb") as err:
        proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # stragglers in its session (all of them without the sandbox)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    return rc, tail(out_dir / "stdout"), tail(out_dir / "stderr")


def tail(path, limit=MAX_OUTPUT_BYTES):
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - limit))
        return f.read().decode("utf-8", errors="replace")


def propose_agent(work, scratch, run_dir, names, iteration, args):
    """command / claude: a CLI edits the candidate folders of `work`, in the sandbox with the network (it calls
    an API) and `work` as its only writable folder. Raises ProposalFailed when the call failed."""
    if args.proposer == "claude":
        argv, ro, env = claude_command(work, scratch, run_dir, args)
    else:
        cmd = args.proposer_cmd.format(workdir=shlex.quote(str(work)),
                                       instructions=shlex.quote(str(work / "INSTRUCTIONS.md")))
        argv, ro = ["/bin/sh", "-c", cmd], args.proposer_ro
        env = {k: os.environ[k] for k in [args.proposer_key_env] if k in os.environ}
    print(f"proposer {args.proposer} (sandboxed, in {work}): {shlex.join(argv)}")
    t0 = time.time()
    rc, out, err = run_in_sandbox(sandbox.wrap(argv, ro=ro, rw=[work], net=True, cwd=str(work), env=env),
                                  work, scratch, args.proposer_timeout)
    cost = {"iteration": iteration, "proposer": args.proposer, "candidates": names, "rc": rc,
            "seconds": round(time.time() - t0, 2)}
    if rc == "timeout":
        error = f"timed out after {args.proposer_timeout:g}s (--proposer-timeout)"
    elif args.proposer == "claude":
        error, usage = claude_result(out)
        cost.update(usage)
        error = error or (None if rc == 0 else f"exit {rc}: {(err or out).strip()[-300:]}")
    else:
        error = None if rc == 0 else f"exit {rc}: {(err or out).strip()[-300:] or 'no output'}"
    log_cost(run_dir, {**cost, "error": error})
    if error:
        raise ProposalFailed(error)


def claude_command(work, scratch, run_dir, args):
    """argv, read-only paths and environment for Claude Code in print mode, confined to `work`.
    Every flag checked against `claude --help` of Claude Code 2.1.197."""
    real = os.path.realpath(shutil.which("claude"))
    install = os.path.dirname(real)
    if os.path.basename(install) == "bin" and os.path.isfile(os.path.join(install, "..", "package.json")):
        install = os.path.dirname(install)  # the npm package (bin/claude.exe, its install script, vendor files)
    settings = scratch / "claude-settings.json"  # outside `work`: the agent cannot edit its own permissions
    write_json(settings, claude_settings(work, run_dir))
    argv = [real, "-p", "Read INSTRUCTIONS.md in the current directory and do what it says.",
            "--output-format", "json",            # one result object: is_error, subtype, result, usage, cost
            "--settings", str(settings),          # the scoped permissions below
            "--setting-sources", "user",          # no project settings from the folder it can write to
            "--tools", CLAUDE_TOOLS,              # the built-in tools it has at all: no Bash, no web
            "--permission-mode", "dontAsk",       # what is not allowed is denied, never asked
            "--strict-mcp-config",                # no MCP servers from the user's config (they skip permissions)
            "--no-session-persistence"]
    argv += ["--model", args.proposer_model] if args.proposer_model else []
    home = os.path.expanduser("~")
    config = os.environ.get("CLAUDE_CONFIG_DIR")
    logins = [os.path.join(home, ".claude"), os.path.join(home, ".claude.json")] + ([config] if config else [])
    node = shutil.which("node")  # an npm install of an older CLI runs on node
    node_dir = [os.path.dirname(os.path.realpath(node))] if node else []
    ro = [install, settings, *node_dir] + [p for p in logins if os.path.exists(p)]
    env = {"HOME": home, "PATH": ":".join(node_dir + ["/usr/local/bin", "/usr/bin", "/bin"]),
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           **{k: os.environ[k] for k in CLAUDE_ENV + ("CLAUDE_CONFIG_DIR",) if k in os.environ}}
    return argv, ro, env


def claude_settings(work, run_dir):
    """Claude Code settings for the proposer, checked against the published schema
    (https://json.schemastore.org/claude-code-settings.json) and Claude Code 2.1.197: its file tools read and
    edit only `work` ("//" starts an absolute path in a rule; Edit rules cover Write); anything else is
    refused without asking (dontAsk); the project and the run folder are denied by name too; no shell, no web,
    no hooks, no bypass, no memory kept between runs. The sandbox is the boundary; this keeps the agent's own
    tools inside it as well (tests/test_meta_harness.py runs the real CLI against a scripted model to show it)."""
    deny = ["Bash", "WebFetch", "WebSearch"]
    for place in {str(Path(__file__).resolve().parent), str(Path(run_dir).resolve())}:
        if not str(work).startswith(place + os.sep):
            deny += [f"Read(/{place}/**)", f"Edit(/{place}/**)"]
    return {"$schema": "https://json.schemastore.org/claude-code-settings.json",
            "permissions": {"allow": [f"Read(/{work}/**)", f"Edit(/{work}/**)"], "deny": sorted(deny),
                            "defaultMode": "dontAsk", "disableBypassPermissionsMode": "disable",
                            "additionalDirectories": []},
            "disableAllHooks": True, "autoMemoryEnabled": False}


def claude_result(stdout):
    """(error or None, usage) from `claude -p --output-format json`. A result is read, not assumed: is_error,
    a subtype other than success, an empty result or output that is not a result object are failures."""
    try:
        res = json.loads(stdout)
    except (ValueError, RecursionError):
        return f"output is not JSON: {stdout.strip()[:200]!r}", {}
    if not isinstance(res, dict) or res.get("type") != "result":
        return f"output is not a result object: {stdout.strip()[:200]!r}", {}
    usage = res.get("usage") if isinstance(res.get("usage"), dict) else {}
    number = lambda v: v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0
    fields = {"prompt_tokens": sum(number(usage.get(k)) for k in ("input_tokens", "cache_creation_input_tokens",
                                                                   "cache_read_input_tokens")),
              "completion_tokens": number(usage.get("output_tokens")), "cost_usd": number(res.get("total_cost_usd")),
              "turns": number(res.get("num_turns")), "permission_denials": len(res.get("permission_denials") or []),
              "models": sorted(res["modelUsage"]) if isinstance(res.get("modelUsage"), dict) else []}
    result = res.get("result") if isinstance(res.get("result"), str) else ""
    message = (result or "; ".join(map(str, res.get("errors") or [])))[:500] or "no message"
    if res.get("subtype") != "success":
        return f"{res.get('subtype')}: {message}", fields
    if res.get("is_error"):
        return message, fields
    if not result.strip():
        return "empty result", fields
    return None, fields


def failure_advice(args):
    if args.proposer == "claude":
        return "log in to Claude Code (run `claude`, then /login) or set ANTHROPIC_API_KEY"
    if args.proposer == "openai":
        return f"check that the server at {args.proposer_url} answers (and the key in ${args.proposer_key_env})"
    return "run --proposer-cmd by hand on a copy of the archive to see why (costs.jsonl has its output)"


def propose_mutate(run_dir, names, rows, iteration, args):
    """Offline coordinate ascent over the SEARCH_SPACE knobs from the archive best, so improvements add up.
    Each candidate is the first of these that is new to the archive and that static_check accepts:
    1. compose: the best with every knob change that raised some candidate's score over its parent's and that
       the best lacks (per knob the change with the largest gain); while none has, every change that left a
       score equal (plateaus are crossed by combinations);
    2. step: the best with one knob set to another value: the knob least tried from that parent first and
       within it the least-tried value, so from each best every knob is tried once before any knob twice;
       ties in SEARCH_SPACE order, which is the harness author's priority (the fixes for the failures its
       docstring names first, prompt wording last); when the best has no new step left, the next best's steps.
    Deterministic: a resumed run proposes the same."""
    cand_root = Path(run_dir) / "candidates"
    rows = rows + [r for r in candidate_rows(run_dir) if r["iteration"] == iteration and r["name"] not in names]
    sources = {r["name"]: (cand_root / r["name"] / "harness.py").read_text() for r in rows
               if (cand_root / r["name"] / "harness.py").exists()}
    changes = {r["name"]: knob_changes(sources[r["name"]], sources[r["parent"]]) for r in rows
               if r["name"] in sources and r["parent"] in sources}
    parents = {r["name"]: r["parent"] for r in rows}
    knob_tries = Counter((parents[n], knob) for n, change in changes.items() for knob in change)
    value_tries = Counter((parents[n], knob, repr(value)) for n, change in changes.items()
                          for knob, value in change.items())
    seen = {normalized(source) for source in sources.values()}
    ranked = sorted((r for r in rows if r["score"] is not None and r["name"] in sources),
                    key=lambda r: (-r["score"], r["mean_turns"]))
    gains, improved = best_changes(rows, changes)
    for name in names:
        options = mutate_options(ranked, sources, gains, knob_tries, value_tries)
        parent, source = next(((p, s) for p, s in options if normalized(s) not in seen
                               and static_check(s, sources[p], args.prompt_only) is None), (None, None))
        prepare(run_dir, [name], parent or ranked[0]["name"], iteration, "mutate")
        if parent is None:
            finish(run_dir, name, hypothesis="", changed="nothing: every knob value (that --prompt-only allows) "
                                                          "from every candidate is in the archive already")
            (cand_root / name / "harness.py").unlink()
            continue
        old, change = knob_values(sources[parent]), knob_changes(source, sources[parent])
        seen.add(normalized(source))
        knob_tries.update((parent, knob) for knob in change)
        value_tries.update((parent, knob, repr(value)) for knob, value in change.items())
        (cand_root / name / "harness.py").write_text(source)
        changed = "; ".join(f"{knob}: {old.get(knob)!r} -> {value!r}" for knob, value in change.items())
        what = "; ".join(f"{knob} = {value!r} instead of {old.get(knob)!r}" for knob, value in change.items())
        why = " (each of these raised a score on its own)" if improved else " (together: alone each left it equal)"
        finish(run_dir, name, parent=parent, changed=changed, hypothesis=f"{what} raises the harness-set score of "
               f"{parent}" + (why if len(change) > 1 else ""))
    log_cost(run_dir, {"iteration": iteration, "proposer": "mutate", "candidates": names, "seconds": 0.0})


def mutate_options(ranked, sources, gains, knob_tries, value_tries):
    """(parent, source) in mutate's order of preference: the best with all of `gains`, then one-knob steps from
    the best (the knob least tried from it, then its least-tried value, ties in SEARCH_SPACE order), then from
    the next best..."""
    best = ranked[0]["name"]
    composed, knobs = sources[best], knob_values(sources[best])
    for knob, value in gains.items():
        composed = set_knob(composed, knob, value) if knob in knobs else composed
    yield best, composed
    for r in ranked:
        parent = r["name"]
        options = sorted(knob_options(sources[parent]),  # stable: ties keep SEARCH_SPACE order
                         key=lambda o: (knob_tries[parent, o[0]], value_tries[parent, o[0], repr(o[2])]))
        for knob, _, value in options:
            yield parent, set_knob(sources[parent], knob, value)


def best_changes(rows, changes):
    """({knob: value}, improved): the knob changes that raised a candidate's score over its parent's, per knob
    the one with the largest gain (the earliest among equal gains), improved = True. While no change has
    raised a score, the changes that left it equal instead (improved = False): on a plateau (a small model
    scoring 0 under every single fix) knobs can pay only together."""
    scores = {r["name"]: r["score"] for r in rows if r["score"] is not None}
    gains, neutral = {}, {}
    for r in rows:
        if r["name"] in changes and r["name"] in scores and scores.get(r["parent"]) is not None:
            gain = scores[r["name"]] - scores[r["parent"]]
            for knob, value in changes[r["name"]].items():
                if gain > 0 and gain > gains.get(knob, (0, None))[0]:
                    gains[knob] = (gain, value)
                elif abs(gain) < 1e-12:
                    neutral.setdefault(knob, (0, value))
    return {knob: value for knob, (gain, value) in sorted((gains or neutral).items())}, bool(gains)


def knob_values(source):
    """{name: literal value (None if not a literal)} of a harness file's top-level assignments; {} if it
    does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                values[node.targets[0].id] = None
    return values


def knob_options(source):
    """(knob, current value, other value) for every SEARCH_SPACE entry of a harness file."""
    values = knob_values(source)
    space = values.get("SEARCH_SPACE") or {}
    return [(k, values[k], v) for k, vs in space.items() if k in values for v in vs if v != values[k]]


def knob_changes(source, parent_source):
    """{knob: value in source} for the SEARCH_SPACE knobs whose value differs from the parent's."""
    new, old = knob_values(source), knob_values(parent_source)
    space = {**(old.get("SEARCH_SPACE") or {}), **(new.get("SEARCH_SPACE") or {})}
    return {k: new[k] for k in space if k in new and k in old and new[k] != old[k]}


def set_knob(source, knob, value):
    """Rewrite the top-level `knob = ...` assignment (its exact span on the syntax tree) to `knob = value`."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and getattr(node.targets[0], "id", None) == knob:
            lines = source.splitlines(keepends=True)
            start, end = node.lineno - 1, node.end_lineno - 1
            head, tail = lines[start][:node.col_offset], lines[end][node.end_col_offset:]
            return "".join(lines[:start]) + f"{head}{knob} = {value!r}{tail}" + "".join(lines[end + 1:])
    raise ValueError(f"set_knob: no top-level assignment to {knob}; SEARCH_SPACE names a knob the file lacks")


def propose_openai(work, run_dir, names, rows, iteration, args):
    """Any OpenAI-compatible chat endpoint: one request per candidate; the reply's python block is the file.
    Runs in-process (only text comes back) and fills the candidate folders of `work` like an agent would."""
    parent = pick_best(rows)["name"]
    instructions = (work / "INSTRUCTIONS.md").read_text()
    url = args.proposer_url.rstrip("/") + "/chat/completions"
    made = []
    for name in names:
        prompt = openai_prompt(work, rows, instructions, name, made, args.proposer_prompt_tokens)
        body = {"model": args.proposer_model or "default", "messages": [{"role": "user", "content": prompt}]}
        t0, error, usage = time.time(), None, {}
        try:
            res = post_json(url, body, os.environ.get(args.proposer_key_env), args)
            reply, usage = res["choices"][0]["message"]["content"] or "", res.get("usage") or {}
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            error = f"unexpected reply from {url}: no choices[0].message.content ({type(e).__name__})"
        except ProposalFailed as e:
            error = str(e)
        log_cost(run_dir, {"iteration": iteration, "proposer": "openai", "candidates": [name],
                           "seconds": round(time.time() - t0, 2), "prompt_tokens": usage.get("prompt_tokens"),
                           "completion_tokens": usage.get("completion_tokens"), "error": error})
        if error:
            raise ProposalFailed(error)
        code, d = python_block(reply), work / "candidates" / name
        if code is None:
            (d / "harness.py").unlink()
        else:
            (d / "harness.py").write_text(code)
        claimed = field(reply, "parent")
        finish(work, name, hypothesis=field(reply, "hypothesis"), changed=field(reply, "changed"),
               parent=claimed if claimed in {r["name"] for r in rows} else parent)
        made.append(f"{name}: {field(reply, 'hypothesis')}")


def post_json(url, body, key, args):
    """POST with a timeout per request; 429, 5xx and network errors are retried with backoff (the server's
    Retry-After when it sends one). Errors a retry cannot fix stop the search with the fix; ProposalFailed
    when the retries run out."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = json.dumps(body).encode()
    for attempt in range(OPENAI_RETRIES + 1):
        wait = min(2.0 ** attempt, MAX_RETRY_WAIT_S)
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers),
                                        timeout=args.proposer_timeout) as resp:
                text = resp.read()
            try:
                return json.loads(text)
            except (ValueError, RecursionError):
                raise ProposalFailed(f"the reply from {url} is not JSON: {text[:200]!r}") from None
        except urllib.error.HTTPError as e:
            failure = f"HTTP {e.code} from {url}: {api_message(e)}"
            if e.code not in RETRY_STATUS and e.code < 500:
                fatal_http_error(e.code, failure, args)
            wait = retry_after(e.headers.get("Retry-After"), wait)
        except (urllib.error.URLError, OSError) as e:  # refused, reset, timed out
            failure = f"no answer from {url}: {getattr(e, 'reason', e)}"
        if attempt < OPENAI_RETRIES:
            print(f"proposer openai: {failure}; retry {attempt + 1}/{OPENAI_RETRIES} in {wait:g}s")
            time.sleep(wait)
    raise ProposalFailed(f"{failure} (after {OPENAI_RETRIES} retries)")


def api_message(err):
    """The error message of an API error body ({"error": {"message": ...}}, vLLM's {"message": ...}, or text)."""
    text = err.read(20_000).decode("utf-8", errors="replace")
    try:
        body = json.loads(text)
        inner = body.get("error", body) if isinstance(body, dict) else {}
        message = inner.get("message") if isinstance(inner, dict) else inner
        return str(message or text)[:300].strip()
    except (ValueError, RecursionError):
        return text[:300].strip() or err.reason


def fatal_http_error(status, failure, args):
    """401 / 403 / 404 / a prompt beyond the model's context: no retry helps, say what to change."""
    if status in (401, 403):
        raise SystemExit(f"proposer openai: {failure}. Set the API key in ${args.proposer_key_env} "
                         f"(--proposer-key-env names the variable)")
    if status == 404:
        raise SystemExit(f"proposer openai: {failure}. Check --proposer-url (the base URL, ending in /v1) "
                         f"and --proposer-model")
    if status in (400, 413) and any(w in failure.lower() for w in ("context", "too long", "too large", "maximum")):
        raise SystemExit(f"proposer openai: {failure}. The prompt is larger than the model's context: lower "
                         f"--proposer-prompt-tokens (now {args.proposer_prompt_tokens})")
    raise ProposalFailed(failure)


def retry_after(header, default):
    """Seconds to wait from a Retry-After header (seconds or an HTTP date), capped; `default` without one."""
    if not header:
        return default
    try:
        seconds = float(header)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(header).timestamp() - time.time()
        except (TypeError, ValueError):
            return default
    return min(max(seconds, 0.0), MAX_RETRY_WAIT_S)


def python_block(reply):
    blocks = re.findall(r"```(?:python|py)[ \t]*\n(.*?)```", reply, re.S)
    return max(blocks, key=len) if blocks else None


def field(reply, name):
    m = re.search(rf"^[\s*#-]*{name}[\s*]*:\s*(.+)$", reply, re.I | re.M)
    return m.group(1).strip().strip("*` ") if m else ""


def openai_prompt(run_dir, rows, instructions, name, made, budget_tokens):
    """Instructions, archive summary, the best candidates' code and sampled traces, within budget (chars/4)."""
    cand_root, budget = Path(run_dir) / "candidates", budget_tokens * 4
    ranked = sorted((r for r in rows if r["score"] is not None), key=lambda r: (-r["score"], r["mean_turns"]))
    ask = (f"\nReply with lines `Parent: <name>`, `Hypothesis: ...`, `Changed: ...`, then the complete new "
           f"file for candidate {name} in one ```python block.\n")
    if made:
        ask += "Already proposed this iteration (pick a different mechanism):\n" + "\n".join(made) + "\n"
    summary = "\n".join(json.dumps({k: r[k] for k in ("name", "parent", "valid", "reason", "score", "mean_turns",
                                                          "hypothesis", "changed")}) for r in rows)
    parts = [instructions, ask, "## summary.jsonl\n" + summary[-budget // 4:]]
    for r in ranked[:2]:
        parts.append(f"## candidates/{r['name']}/harness.py (score {r['score']})\n```python\n"
                     + (cand_root / r["name"] / "harness.py").read_text() + "```")
    used = sum(map(len, parts))
    for trace in sample_traces(cand_root / ranked[0]["name"] / "traces.jsonl", seed=name):
        if used + len(trace) > budget:
            break
        parts.append(trace)
        used += len(trace)
    return "\n\n".join(parts)[:budget]


def sample_traces(path, seed, n_fail=3, n_ok=2, cut=600):
    """A few failed and successful episodes, compacted for a prompt."""
    if not path.exists():
        return []
    eps = [json.loads(l) for l in open(path)]
    rng = random.Random(seed)
    fail, ok = [e for e in eps if e.get("reward", 0) <= 0.5], [e for e in eps if e.get("reward", 0) > 0.5]
    picked = rng.sample(fail, min(n_fail, len(fail))) + rng.sample(ok, min(n_ok, len(ok)))
    out = []
    for e in picked:
        lines = [f"## trace {e.get('task_id')} reward={e.get('reward')} turns={e.get('turns')} error={e.get('error')}"]
        for c in e.get("calls", []):
            lines.append("PROMPT (last message): " + str(c.get("messages", [{}])[-1].get("content", ""))[:cut])
            lines.append("COMPLETION: " + str(c.get("completion", ""))[:cut])
        for t in e.get("tool_calls", []):
            args, result = json.dumps(t.get("args"))[:200], json.dumps(t.get("result"))[:cut]
            lines.append(f"TOOL {t.get('name')}({args}) -> {result}")
        lines.append(f"ANSWER: {json.dumps(e.get('answer'))[:200]}")
        out.append("\n".join(lines))
    return out


# -----------------------------------------------------------------------------
# the search

def harness_tasks(domain, args):
    tasks = domain.load("harness")
    return tasks[: args.harness_tasks] if args.harness_tasks else tasks


def policy_kwargs(args):
    return dict(temperature=args.temperature, top_k=args.top_k, max_new_tokens=args.max_new_tokens,
                deadline_s=args.deadline, workers=args.workers, seed=args.seed)


def add_seed(run_dir, seed_harness, seed_name):
    d = Path(run_dir) / "candidates" / seed_name
    if (d / "meta.json").exists():
        return
    if not Path(seed_harness).is_file():
        raise FileNotFoundError(f"seed harness {seed_harness} not found: pass the path of a harness file")
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(seed_harness, d / "harness.py")
    write_json(d / "meta.json", {"parent": None, "hypothesis": "the seed harness",
                                 "changed": f"copied from {seed_harness}",
                                 "proposer": "seed", "iteration": 0, "proposed": True, "valid": True, "reason": None})


def check_setup(run_dir, domain, tasks, args, policy_kw):
    """Scores are only comparable under one harness set and one sampling setup: a resumed run must match."""
    setup = {"domain": domain.name, "tasks": [t["id"] for t in tasks], "samples": args.harness_samples,
             "prompt_only": args.prompt_only, **{k: v for k, v in policy_kw.items() if k != "workers"}}
    old = read_json(run_dir / "setup.json")
    if old is not None and old != setup:
        diff = ", ".join(k for k in setup if old.get(k) != setup[k])
        raise ValueError(f"{run_dir} was scored under another setup ({diff} differ): rerun with the same "
                         f"flags or use a fresh run folder")
    write_json(run_dir / "setup.json", setup)


def search(backend, domain, seed_harness, run_dir, args, iterations=None, stop=None, seed_name="h0"):
    """Meta-Harness under fixed weights. stop(best_series) -> bool ends the search early (see
    should_stop_harness_phase); `iterations` caps it (default args.iterations)."""
    if args.proposer == "command" and not args.proposer_cmd:
        raise ValueError("--proposer command needs --proposer-cmd 'CLI ... {workdir}'")
    if args.proposer == "claude" and shutil.which("claude") is None:
        raise SystemExit("--proposer claude: no `claude` on PATH; install Claude Code "
                         "(npm install -g @anthropic-ai/claude-code) or use --proposer command / openai")
    if args.proposer in ("command", "claude"):
        try:
            sandbox.check()  # these proposers run only inside it (or with the documented opt-out)
        except sandbox.SandboxError as e:
            raise SystemExit(str(e))
    iterations = args.iterations if iterations is None else iterations
    run_dir = Path(run_dir)
    (run_dir / "candidates").mkdir(parents=True, exist_ok=True)
    tasks, kw, M = harness_tasks(domain, args), policy_kwargs(args), args.candidates
    print(f"meta-harness: {domain.name}, {len(tasks)} harness tasks x {args.harness_samples} samples, proposer "
          f"{args.proposer}; budget: {iterations} iterations x {M} = {iterations * M} proposals, at most "
          f"{(iterations * M + 1) * len(tasks) * args.harness_samples + iterations * M} rollouts "
          f"(scoring plus one smoke episode per candidate) -> {run_dir}")
    check_setup(run_dir, domain, tasks, args, kw)
    add_seed(run_dir, seed_harness, seed_name)
    if not (run_dir / "candidates" / seed_name / "scores.json").exists():
        score(run_dir / "candidates" / seed_name, backend, domain, tasks, args, kw)
    rows, frontier = write_index(run_dir, 0)
    done = failures = 0
    for it in range(1, iterations + 1):
        names = [f"h{it}_{j}" for j in range(1, M + 1)]
        while todo := [n for n in names if not read_json(run_dir / "candidates" / n / "meta.json", {}).get("proposed")]:
            t0 = time.time()
            if args.proposer == "mutate":  # trusted, offline: writes its candidates into the archive itself
                propose_mutate(run_dir, todo, rows, it, args)
                error = None
            else:
                error = propose_in_copy(run_dir, todo, rows, it, domain, args)
            if error is None:
                failures = 0
                print(f"iteration {it}: proposed {len(todo)} candidates in {time.time() - t0:.1f}s")
                continue
            failures += 1
            print(f"iteration {it}: proposer {args.proposer} failed ({failures}/{args.proposer_max_failures} "
                  f"in a row): {error}")
            if failures >= args.proposer_max_failures:
                raise SystemExit(f"meta_harness: proposer {args.proposer} failed {failures} times in a row, last: "
                                 f"{error}. To go on, {failure_advice(args)}, then rerun the same command (it "
                                 f"resumes at iteration {it})")
        for name in names:
            d = run_dir / "candidates" / name
            meta = read_json(d / "meta.json")
            if meta["valid"] is None:
                meta = validate(d, candidate_rows(run_dir), backend, domain, tasks, args, kw)
            if meta["valid"] and not (d / "scores.json").exists():
                s = score(d, backend, domain, tasks, args, kw)
                print(f"  {name}: score {s['score']:.4f}, mean turns {s['mean_turns']:.2f}  ({meta['changed']})")
            elif not meta["valid"]:
                print(f"  {name}: rejected, {meta['reason']}")
        rows, frontier = write_index(run_dir, it)
        done = it
        print(f"iteration {it}: best {frontier['best']} = {frontier['score']:.4f}, series {frontier['best_series']}")
        if stop is not None and stop(frontier["best_series"]):
            break
    return {"winner": str((run_dir / frontier["harness"]).resolve()), "score": frontier["score"],
            "rollouts": frontier["rollouts"], "iterations": done, "best_series": frontier["best_series"],
            "proposer": frontier["proposer"]}


# -----------------------------------------------------------------------------

def main(argv=None):
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # what to run
    p.add_argument("--domain", required=True, help="searchqa, math or chess")
    p.add_argument("--harness", required=True, help="the seed harness file (h0)")
    p.add_argument("--model", default="smoke", help="smoke | cpu | hub id | local path")
    p.add_argument("--out", required=True, help="run folder: the archive (rerun to resume)")
    # stopping
    p.add_argument("--iterations", type=nonnegative_int, default=6, help="at most this many iterations")
    p.add_argument("--patience", type=nonnegative_int, default=0,
                   help="stop when the best has not improved for P iterations (0: off)")
    p.add_argument("--min-iterations", type=nonnegative_int, default=6,
                   help="with --patience: run at least N iterations")
    rollout.add_sampling_args(p)
    p.add_argument("--seed", type=int, default=0)
    add_args(p)
    engines.add_backend_args(p)
    domains.add_args(p)
    args = p.parse_args(argv)
    if args.proposer == "command" and not args.proposer_cmd:
        raise SystemExit("--proposer command needs --proposer-cmd 'CLI ... {workdir}' (a command template)")
    if not os.path.isfile(args.harness):
        raise SystemExit(f"harness file {args.harness} not found: pass --harness PATH, e.g. harnesses/{args.domain}.py")
    try:
        domain = domains.get(args.domain, args)
        domain.load("harness")  # a malformed data file is an error now, before any model is loaded
        check_run_files(args.out)
        sandbox.apply_args(args)
    except (ValueError, FileNotFoundError, ImportError, sandbox.SandboxError) as e:
        raise SystemExit(f"meta_harness.py: error: {e}")
    os.makedirs(args.out, exist_ok=True)
    write_json(Path(args.out) / "config.json", vars(args))
    stop = (lambda s: should_stop_harness_phase(s, args.patience, args.min_iterations)) if args.patience else None
    t0 = time.time()
    model, tok = engines.load_model(args.model)
    result = search(engines.load_backend(args, model, tok), domain, args.harness, args.out, args, stop=stop)
    print(json.dumps(result))
    print(f"h0 score {read_json(Path(args.out) / 'candidates' / 'h0' / 'scores.json')['score']:.4f}, "
          f"winner {Path(result['winner']).parent.name} score {result['score']:.4f}, {result['rollouts']} rollouts, "
          f"{time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
