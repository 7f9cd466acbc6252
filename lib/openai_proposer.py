"""The `openai` proposer: any OpenAI-compatible chat endpoint, one request per candidate, the reply's python
block being the file. It runs in-process (only text comes back) inside propose_in_copy's fresh copy of the
archive, and fills its candidate folders as an agent would. Requests time out, and errors a retry can fix
(429, 5xx, the network) are retried with backoff; the others stop the search naming the flag to change."""

import json
import os
import random
import re
import time
from email.utils import parsedate_to_datetime
from pathlib import Path

from lib.paper import web
from lib.archive import log_cost
from lib.common.text import valid_text
from lib.proposers import ProposalFailed, finish
from lib.rules import SUCCESS, rank

# OpenAI-compatible API: statuses worth a retry (as the OpenAI SDK: these and every 5xx), how long to wait at most
RETRY_STATUS = (408, 409, 429)
OPENAI_RETRIES = 4
MAX_RETRY_WAIT_S = 120.0


def count(value):
    """A token count from a server's reply, or None: nothing else of it reaches costs.jsonl."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def propose_openai(work, run_dir, names, rows, parent, iteration, cfg):
    """Any OpenAI-compatible chat endpoint: one request per candidate; the reply's python block is the file.
    Runs in-process (only text comes back) and fills the candidate folders of `work` like an agent would;
    a reply that names no archive candidate as its parent gets `parent` (the archive best)."""
    instructions = (work / "INSTRUCTIONS.md").read_text()
    url = cfg.proposer_url.rstrip("/") + "/chat/completions"
    made = []
    for name in names:
        prompt = openai_prompt(work, rows, instructions, name, made, cfg.proposer_prompt_tokens)
        body = {"model": cfg.proposer_model or "default", "messages": [{"role": "user", "content": prompt}]}
        t0, error, usage = time.time(), None, {}
        try:
            res = post_json(url, body, os.environ.get(cfg.proposer_key_env), cfg)
            reply, usage = res["choices"][0]["message"]["content"] or "", res.get("usage") or {}
            if not (isinstance(reply, str) and isinstance(usage, dict)):  # a server's odd value: this call's error
                raise TypeError("content is not a string or usage not an object")
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            error = f"unexpected reply from {url}: no choices[0].message.content ({type(e).__name__})"
        except ProposalFailed as e:
            error = str(e)
        log_cost(run_dir, {"iteration": iteration, "proposer": "openai", "candidates": [name],
                           "seconds": round(time.time() - t0, 2), "prompt_tokens": count(usage.get("prompt_tokens")),
                           "completion_tokens": count(usage.get("completion_tokens")), "error": error})
        if error:
            raise ProposalFailed(error)
        code, d = python_block(reply), work / "candidates" / name
        if code is None:
            (d / "harness.py").unlink()
        else:  # as bytes: a lone surrogate stays one that no text holds, and take_candidates rejects the file
            (d / "harness.py").write_bytes(code.encode("utf-8", "surrogatepass"))  # (not UTF-8 text), this one's error
        reply = valid_text(reply)  # its fields are printed and kept
        claimed = field(reply, "parent")
        finish(work, name, hypothesis=field(reply, "hypothesis"), changed=field(reply, "changed"),
               parent=claimed if claimed in {r["name"] for r in rows} else parent)
        made.append(f"{name}: {field(reply, 'hypothesis')}")


def post_json(url, body, key, cfg):
    """POST with a timeout per request; 429, 5xx and network errors are retried with backoff (the server's
    Retry-After when it sends one). Errors a retry cannot fix stop the search with the fix; ProposalFailed
    when the retries run out."""
    for attempt in range(OPENAI_RETRIES + 1):
        wait = min(2.0 ** attempt, MAX_RETRY_WAIT_S)
        try:
            text = web.request(url, body, key=key, timeout=cfg.proposer_timeout)
            try:
                return json.loads(text)
            except (ValueError, RecursionError):
                raise ProposalFailed(f"the reply from {url} is not JSON: {text[:200]!r}") from None
        except web.HTTPError as e:
            failure = f"HTTP {e.code} from {url}: {api_message(e)}"
            if e.code not in RETRY_STATUS and e.code < 500:
                fatal_http_error(e.code, failure, cfg)
            wait = retry_after(e.headers.get("Retry-After"), wait)
        except (web.URLError, OSError) as e:  # refused, reset, timed out
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
        return valid_text(str(message or text)[:300].strip())
    except (ValueError, RecursionError):
        return text[:300].strip() or err.reason


def fatal_http_error(status, failure, cfg):
    """401 / 403 / 404 / a prompt beyond the model's context: no retry helps, say what to change."""
    if status in (401, 403):
        raise SystemExit(f"proposer openai: {failure}. Set the API key in ${cfg.proposer_key_env} "
                         f"(--proposer-key-env names the variable)")
    if status == 404:
        raise SystemExit(f"proposer openai: {failure}. Check --proposer-url (the base URL, ending in /v1) "
                         f"and --proposer-model")
    if status in (400, 413) and any(w in failure.lower() for w in ("context", "too long", "too large", "maximum")):
        raise SystemExit(f"proposer openai: {failure}. The prompt is larger than the model's context: lower "
                         f"--proposer-prompt-tokens (now {cfg.proposer_prompt_tokens})")
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
    ranked = rank(rows)
    ask = (f"\nReply with lines `Parent: <name>`, `Hypothesis: ...`, `Changed: ...`, then the complete new "
           f"file for candidate {name} in one ```python block.\n")
    if made:
        ask += "Already proposed this iteration (pick a different mechanism):\n" + "\n".join(made) + "\n"
    summary = "\n".join(json.dumps({k: r[k] for k in ("name", "parent", "valid", "reason", "score", "mean_turns",
                                                          "hypothesis", "axis", "changed")}) for r in rows)
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
    fail, ok = [e for e in eps if e.get("reward", 0) <= SUCCESS], [e for e in eps if e.get("reward", 0) > SUCCESS]
    picked = rng.sample(fail, min(n_fail, len(fail))) + rng.sample(ok, min(n_ok, len(ok)))
    out = []
    for e in picked:
        lines = [f"## trace {e.get('task_id')} reward={e.get('reward')} turns={e.get('turns')} error={e.get('error')}"]
        for c in e.get("calls", []):
            lines.append("PROMPT (last message): " + str(c.get("messages", [{}])[-1].get("content", ""))[:cut])
            lines.append("COMPLETION: " + str(c.get("completion", ""))[:cut])
        for t in e.get("tool_calls", []):
            cfg, result = json.dumps(t.get("cfg"))[:200], json.dumps(t.get("result"))[:cut]
            lines.append(f"TOOL {t.get('name')}({cfg}) -> {result}")
        lines.append(f"ANSWER: {json.dumps(e.get('answer'))[:200]}")
        out.append("\n".join(lines))
    return out
