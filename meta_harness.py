"""
Meta-Harness: search over harness code under fixed policy weights (the harness phase of WHALE,
and on its own the harness-only baseline).

    python meta_harness.py --domain searchqa --harness harnesses/searchqa.py --model smoke \
        --iterations 2 --candidates 3 --proposer mutate --out runs/mh
    python meta_harness.py ... --proposer command --proposer-cmd "my-agent --dir {workdir} --task {instructions}"
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

The run folder is the archive and also the proposer's working directory, so it holds harness-set
material only (never test tasks, gold answers or test scores):
    INSTRUCTIONS.md                  what the proposer is asked to do this iteration
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
import subprocess
import time
import urllib.request
from collections import Counter
from pathlib import Path

import domains
import engines
import rollout
import sandbox

ALLOWED_IMPORTS = ("re", "json", "math", "random", "string", "collections", "itertools", "functools",
                   "textwrap", "dataclasses", "typing")
# names that reach files, code execution or the interpreter's internals; the runner sandboxes harness
# code anyway, this catches the obvious attempts before any rollout is spent
FORBIDDEN_NAMES = ("open", "exec", "eval", "compile", "__import__", "globals", "locals", "vars", "getattr",
                   "setattr", "delattr", "breakpoint", "input", "__builtins__", "__loader__", "__spec__")
MAX_HARNESS_CHARS = 100_000
PROPOSERS = ("mutate", "command", "claude", "openai")
CLAUDE_TOOLS = "Read,Write,Edit,Glob,Grep"


def add_args(p):
    # harness search (shared with whale.py)
    p.add_argument("--candidates", type=int, default=3, help="M: candidates proposed per iteration")
    p.add_argument("--harness-tasks", type=int, default=None,
                   help="score on the first N harness-set tasks (default all)")
    p.add_argument("--harness-samples", type=int, default=1, help="rollouts per harness-set task when scoring")
    p.add_argument("--prompt-only", action="store_true", help="candidates may change only string constants (FST)")
    # proposer
    p.add_argument("--proposer", default="mutate", choices=PROPOSERS)
    p.add_argument("--proposer-cmd", default=None,
                   help="command template for --proposer command: {workdir}, {instructions}")
    p.add_argument("--proposer-url", default="http://localhost:8000/v1", help="OpenAI-compatible base URL")
    p.add_argument("--proposer-model", default=None, help="model name for openai / claude proposers")
    p.add_argument("--proposer-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    p.add_argument("--proposer-timeout", type=float, default=1800.0, help="seconds per proposer call")
    p.add_argument("--proposer-prompt-tokens", type=int, default=24000, help="openai prompt budget (chars/4 estimate)")


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
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else default


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
    with open(Path(run_dir) / "summary.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    best = pick_best([r for r in rows if r["iteration"] <= iterations])  # as of this iteration (resume replays)
    frontier = {"best": best["name"], "score": best["score"], "mean_turns": best["mean_turns"],
                "harness": f"candidates/{best['name']}/harness.py", "lineage": lineage(rows, best["name"]),
                "iterations": iterations, "best_series": best_series_of(rows, iterations),
                "candidates": len(rows), "valid": sum(bool(r["valid"]) for r in rows),
                "rollouts": sum(r["rollouts"] for r in rows), "proposer": proposer_costs(run_dir)}
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
        return "prompt-only violation: the candidate changes more than string constants of its parent"
    return None


def strings_blanked(source):
    """The syntax tree with every string constant replaced, so two files compare equal iff they differ
    only in string constants (f-string text may change, f-string expressions may not)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
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
    if meta.get("parent") not in parents:
        reason = f"unknown parent {meta.get('parent')!r}: meta.json parent must name a valid archive candidate"
    else:
        parent_source = (cand_dir.parent / meta["parent"] / "harness.py").read_text()
        reason = static_check(source, parent_source, args.prompt_only)
    if reason is None:
        same = [r["name"] for r in rows if r["name"] != cand_dir.name and r["valid"]
                and normalized((cand_dir.parent / r["name"] / "harness.py").read_text()) == normalized(source)]
        reason = f"duplicate of {same[0]}: no change to score" if same else None
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

## The archive (this folder)
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


def run_command(cmd, cwd, timeout, shell):
    """Run an agent CLI in its own process group, so a timeout kills everything it started."""
    proc = subprocess.Popen(cmd, cwd=cwd, shell=shell, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return "timeout", out, err


def propose_agent(run_dir, names, rows, iteration, domain, args):
    """command / claude: the agent edits the pre-made candidate folders in place."""
    parent = pick_best(rows)["name"]
    prepare(run_dir, names, parent, iteration, args.proposer)
    instructions = write_instructions(run_dir, domain, names, parent, iteration, args)
    t0 = time.time()
    if args.proposer == "claude":
        cmd = ["claude", "-p", f"Read {instructions.name} in the current directory and do what it says.",
               "--allowedTools", CLAUDE_TOOLS, "--output-format", "json"]
        cmd += ["--model", args.proposer_model] if args.proposer_model else []
        rc, out, err = run_command(cmd, run_dir, args.proposer_timeout, shell=False)
    else:
        cmd = args.proposer_cmd.format(workdir=shlex.quote(str(Path(run_dir).resolve())),
                                       instructions=shlex.quote(str(instructions.resolve())))
        rc, out, err = run_command(cmd, run_dir, args.proposer_timeout, shell=True)
    cost = {"iteration": iteration, "proposer": args.proposer, "candidates": names, "rc": rc,
            "seconds": round(time.time() - t0, 2), **claude_usage(out)}
    log_cost(run_dir, cost)
    if rc != 0:
        print(f"proposer {args.proposer} returned {rc}: {(err or out).strip()[-300:]}")
    for name in names:  # keep the agent's parent / hypothesis / changed; the bookkeeping fields are ours
        path = Path(run_dir) / "candidates" / name / "meta.json"
        try:
            meta = read_json(path)
        except ValueError:
            meta = None
        meta = meta if isinstance(meta, dict) else {"parent": parent, "hypothesis": "", "changed": ""}
        meta.update(proposer=args.proposer, iteration=iteration, proposed=True, valid=None, reason=None)
        write_json(path, meta)


def claude_usage(stdout):
    """Tokens and dollars from `claude --output-format json`; empty for other CLIs."""
    try:
        res = json.loads(stdout)
        usage = res.get("usage", {})
        return {"prompt_tokens": sum(usage.get(k, 0) for k in ("input_tokens", "cache_creation_input_tokens",
                                                                "cache_read_input_tokens")),
                "completion_tokens": usage.get("output_tokens", 0), "cost_usd": res.get("total_cost_usd")}
    except (ValueError, AttributeError, TypeError):
        return {}


def propose_mutate(run_dir, names, rows, iteration, args):
    """Offline: the archive best with one SEARCH_SPACE knob set to another value. Least-tried knobs go first
    (a knob that never mattered should not crowd out one never tried); no duplicates if avoidable."""
    cand_root = Path(run_dir) / "candidates"
    tried = Counter(r["changed"].split(":")[0] for r in rows if r["proposer"] == "mutate")  # "KNOB: a -> b"
    seen = {normalized((cand_root / r["name"] / "harness.py").read_text()) for r in rows if r["valid"]}
    ranked = sorted((r for r in rows if r["score"] is not None), key=lambda r: (-r["score"], r["mean_turns"]))
    for name in names:
        # seeded per archive and name: a resumed run proposes the same thing, the next phase's archive not
        rng = random.Random(f"{args.seed}-{Path(run_dir).name}-{name}")
        options = []
        for r in ranked:
            source = (cand_root / r["name"] / "harness.py").read_text()
            # with --prompt-only only string knobs may change (a harness without any has nothing to offer)
            opts = [o for o in knob_options(source) if isinstance(o[2], str) or not args.prompt_only]
            rng.shuffle(opts)
            opts.sort(key=lambda o: tried[o[0]])  # stable: random order among equally tried knobs
            options += [(r["name"], source, knob, old, new) for knob, old, new in opts]
        fresh = [o for o in options if normalized(set_knob(o[1], o[2], o[4])) not in seen]
        prepare(run_dir, [name], ranked[0]["name"], iteration, "mutate")
        if not (fresh or options):
            finish(run_dir, name, hypothesis="", changed="nothing: no SEARCH_SPACE knob (string knob with "
                                                          "--prompt-only) left to mutate")
            (cand_root / name / "harness.py").unlink()
            continue
        parent, source, knob, old, new = (fresh or options)[0]
        new_source = set_knob(source, knob, new)
        seen.add(normalized(new_source))
        tried[knob] += 1
        (cand_root / name / "harness.py").write_text(new_source)
        finish(run_dir, name, parent=parent, changed=f"{knob}: {old!r} -> {new!r}",
               hypothesis=f"{knob} = {new!r} instead of {old!r} raises the harness-set score of {parent}")
    log_cost(run_dir, {"iteration": iteration, "proposer": "mutate", "candidates": names, "seconds": 0.0})


def knob_options(source):
    """(knob, current value, other value) for every SEARCH_SPACE entry of a harness file."""
    tree = ast.parse(source)
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                values[node.targets[0].id] = None
    space = values.get("SEARCH_SPACE") or {}
    return [(k, values[k], v) for k, vs in space.items() if k in values for v in vs if v != values[k]]


def set_knob(source, knob, value):
    """Rewrite the top-level `knob = ...` assignment (its exact span on the syntax tree) to `knob = value`."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and getattr(node.targets[0], "id", None) == knob:
            lines = source.splitlines(keepends=True)
            start, end = node.lineno - 1, node.end_lineno - 1
            head, tail = lines[start][:node.col_offset], lines[end][node.end_col_offset:]
            return "".join(lines[:start]) + f"{head}{knob} = {value!r}{tail}" + "".join(lines[end + 1:])
    raise ValueError(f"set_knob: no top-level assignment to {knob}; SEARCH_SPACE names a knob the file lacks")


def propose_openai(run_dir, names, rows, iteration, domain, args):
    """Any OpenAI-compatible chat endpoint: one request per candidate; the reply's python block is the file."""
    parent = pick_best(rows)["name"]
    instructions = write_instructions(run_dir, domain, names, parent, iteration, args)
    key = os.environ.get(args.proposer_key_env)
    made = []
    for name in names:
        prepare(run_dir, [name], parent, iteration, "openai")
        prompt = openai_prompt(run_dir, rows, instructions.read_text(), name, made, args.proposer_prompt_tokens)
        body = {"model": args.proposer_model or "default", "messages": [{"role": "user", "content": prompt}]}
        req = urllib.request.Request(args.proposer_url.rstrip("/") + "/chat/completions",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        t0 = time.time()
        try:
            with urllib.request.urlopen(req, timeout=args.proposer_timeout) as resp:
                res = json.loads(resp.read())
            reply, usage = res["choices"][0]["message"]["content"] or "", res.get("usage") or {}
        except (OSError, ValueError, KeyError, IndexError) as e:
            reply, usage = "", {}
            print(f"proposer openai: request for {name} failed: {e}")
        log_cost(run_dir, {"iteration": iteration, "proposer": "openai", "candidates": [name],
                           "seconds": round(time.time() - t0, 2), "prompt_tokens": usage.get("prompt_tokens"),
                           "completion_tokens": usage.get("completion_tokens")})
        d = Path(run_dir) / "candidates" / name
        (d / "reply.md").write_text(reply)
        code = python_block(reply)
        if code is None:
            (d / "harness.py").unlink()
        else:
            (d / "harness.py").write_text(code)
        claimed = field(reply, "parent")
        finish(run_dir, name, hypothesis=field(reply, "hypothesis"), changed=field(reply, "changed"),
               parent=claimed if claimed in {r["name"] for r in rows} else parent)
        made.append(f"{name}: {field(reply, 'hypothesis')}")


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
    done = 0
    for it in range(1, iterations + 1):
        names = [f"h{it}_{j}" for j in range(1, M + 1)]
        todo = [n for n in names if not read_json(run_dir / "candidates" / n / "meta.json", {}).get("proposed")]
        if todo:
            t0 = time.time()
            if args.proposer == "mutate":
                propose_mutate(run_dir, todo, rows, it, args)
            elif args.proposer == "openai":
                propose_openai(run_dir, todo, rows, it, domain, args)
            else:
                propose_agent(run_dir, todo, rows, it, domain, args)
            print(f"iteration {it}: proposed {len(todo)} candidates in {time.time() - t0:.1f}s")
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
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # what to run
    p.add_argument("--domain", required=True, help="searchqa, math or chess")
    p.add_argument("--harness", required=True, help="the seed harness file (h0)")
    p.add_argument("--model", default="smoke", help="smoke | cpu | hub id | local path")
    p.add_argument("--out", required=True, help="run folder: the archive (rerun to resume)")
    # stopping
    p.add_argument("--iterations", type=int, default=6, help="at most this many iterations")
    p.add_argument("--patience", type=int, default=0,
                   help="stop when the best has not improved for P iterations (0: off)")
    p.add_argument("--min-iterations", type=int, default=6, help="with --patience: run at least N iterations")
    rollout.add_sampling_args(p)
    p.add_argument("--seed", type=int, default=0)
    add_args(p)
    engines.add_backend_args(p)
    domains.add_args(p)
    args = p.parse_args(argv)
    sandbox.apply_args(args)
    if args.proposer == "command" and not args.proposer_cmd:
        raise SystemExit("--proposer command needs --proposer-cmd 'CLI ... {workdir}' (a command template)")
    if not os.path.isfile(args.harness):
        raise SystemExit(f"harness file {args.harness} not found: pass --harness PATH, e.g. harnesses/{args.domain}.py")
    try:
        domain = domains.get(args.domain, args)
    except ValueError as e:
        raise SystemExit(str(e))
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
