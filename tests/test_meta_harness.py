"""Meta-Harness search: acceptance, stopping, validation, the four proposers, the archive and resume.
Most tests score candidates with a fake rollout module (fast, deterministic); one runs the real runner
on the smoke model end to end."""
import dataclasses
import hashlib
import http.server
import json
import os
import shutil
import textwrap
import threading
from pathlib import Path

import pytest

import domains
import meta_harness as mh
from fixtures import stand_ins
from fixtures.configs import search_config
from lib import contract, mutate, openai_proposer, proposers
from lib.episodes import cgroups, sandbox, switches
from lib.run_folder.store import only_command

SEED = textwrap.dedent('''\
    """Fake harness for tests: one model call."""
    PROMPT = "Answer briefly: "
    MAX_TURNS = 1
    STYLE = "plain"
    SEARCH_SPACE = {"MAX_TURNS": [1, 2, 3], "STYLE": ["plain", "tagged"]}


    def run(task, llm, tools):
        reply = llm([{"role": "user", "content": PROMPT + task["question"]}])
        return {"answer": reply}
    ''')


class FakeDomain(domains.Domain):
    name, TOOL_METHODS = "fake", ("search",)

    def load(self, split):
        assert split == "harness", "the search must only ever read the harness split"
        return [{"id": f"t{i}", "question": f"q{i}", "answers": [f"gold{i}"]} for i in range(4)]

    def public(self, task):
        return {"question": task["question"]}


class FakeRollout:
    """Runs the harness in-process with a canned llm; score = 0.1 * MAX_TURNS (+0.05 when STYLE is tagged)."""

    def __init__(self):
        self.evaluated, self.smoked = [], []

    def run_episodes(self, domain, harness_path, tasks, backend, *, samples=1, desc="", **kw):
        self.smoked.append(harness_path)
        ns = {}
        try:
            exec(Path(harness_path).read_text(), ns)
            ns["run"](domain.public(tasks[0]), lambda messages, max_tokens=None: "ok", None)
            error = None
        except Exception as e:
            error = repr(e)
        return [{"task_id": tasks[0]["id"], "sample": 0, "reward": 0.0, "error": error, "turns": 1}]

    def evaluate(self, domain, harness_path, tasks, backend, k=1, traces_path=None, desc="", **kw):
        if stand_ins.without_model(backend, tasks, k):
            return stand_ins.without_model(backend, tasks, k)
        self.evaluated.append(Path(harness_path).parent.name)
        ns = {}
        exec(Path(harness_path).read_text(), ns)
        score = 0.1 * ns["MAX_TURNS"] + (0.05 if ns.get("STYLE") == "tagged" else 0.0)
        with open(traces_path, "a") as f:
            for t in tasks:
                f.write(json.dumps({"task_id": t["id"], "reward": float(score > 0.15), "turns": 1, "error": None,
                                    "answer": "ok", "calls": [{"messages": [{"role": "user", "content": t["question"]}],
                                                               "completion": "ok"}], "tool_calls": []}) + "\n")
        return {"mean_at_k": score, "k": k, "per_task": {}, "mean_turns": float(ns["MAX_TURNS"]), "tokens": 10 * len(tasks),
                "rollouts": len(tasks) * k, "errors": 0, "seconds": 0.01}


def make_args(**over):
    return search_config(**over)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    fr = FakeRollout()
    monkeypatch.setattr(mh, "rollout", fr)
    seed = tmp_path / "seed.py"
    seed.write_text(SEED)
    return fr, seed, tmp_path / "run"


def rows_of(run_dir):
    return {r["name"]: r for r in map(json.loads, open(run_dir / "summary.jsonl"))}


# -----------------------------------------------------------------------------
# pure functions

def test_pick_best_prefers_score_then_fewer_turns():
    rows = [{"name": "a", "score": 0.5, "mean_turns": 3.0}, {"name": "b", "score": 0.7, "mean_turns": 4.0},
            {"name": "c", "score": 0.7, "mean_turns": 2.0}, {"name": "d", "score": None, "mean_turns": None},
            {"name": "e", "score": 0.7, "mean_turns": 2.0}]
    assert mh.pick_best(rows)["name"] == "c"  # tie on score -> fewer turns; full tie -> the earlier
    assert mh.pick_best(rows[:2])["name"] == "b"
    with pytest.raises(ValueError):
        mh.pick_best([{"name": "x", "score": None}])


def test_stop_rule_patience_and_minimum():
    stop = mh.should_stop_harness_phase
    assert not stop([0.1, 0.2, 0.2, 0.2], patience=2, min_iters=6)     # only 3 iterations ran
    assert stop([0.1] + [0.2] * 6, patience=2, min_iters=6)            # 6 ran, flat for 2
    assert not stop([0.1, 0.1, 0.1, 0.1, 0.1, 0.2, 0.3], 2, 6)         # still improving
    assert not stop([0.1, 0.1, 0.1, 0.1, 0.1, 0.2, 0.2], 2, 6)         # flat for only 1
    assert stop([0.1, 0.1, 0.1, 0.1, 0.1, 0.2, 0.2, 0.2], 2, 6)
    assert stop([0.0, 0.0, 0.0], patience=2, min_iters=0)


def test_static_check_reasons():
    check = contract.static_check
    assert check(SEED) is None
    assert check("").startswith("no code")
    assert check("def run(task, llm, tools)\n    pass").startswith("syntax error: line 1")
    assert check("def go(task, llm, tools):\n    return {}").startswith("no run")
    assert check("def run(task, llm):\n    return {}").startswith("no run")
    assert check("import os\n" + SEED).startswith("forbidden import: os")
    assert check("from subprocess import run as r\n" + SEED).startswith("forbidden import: subprocess")
    # chess: a chess library or an engine is the official skill's hard ban, named as such
    assert check("import chess\n" + SEED).startswith("forbidden import: chess")
    import domains
    chess = domains.get("chess")
    assert check("import chess.engine\n" + SEED, domain=chess) == (
        "chess engine: imports chess.engine; a chess harness relays the model's move and never chooses one (no chess "
        "library, engine or move search)")
    assert check("from subprocess import run\n" + SEED, domain=chess).startswith("chess engine: imports subprocess")
    assert check("import os\n" + SEED, domain=chess).startswith("forbidden import: os")
    assert check("import collections.abc\n" + SEED) is None
    assert check(SEED + "\nx = open('/etc/passwd')\n").startswith("forbidden name: open")
    assert check(SEED + "\nx = ().__class__.__bases__\n").startswith("forbidden attribute: .__")
    assert check(SEED.replace("Answer briefly", "Think, then answer"), SEED, prompt_only=True) is None
    assert check(SEED.replace("MAX_TURNS = 1", "MAX_TURNS = 2"), SEED, prompt_only=True).startswith("prompt-only")


def test_set_knob_rewrites_only_that_assignment():
    src = mutate.set_knob(SEED, "STYLE", "tagged")
    assert 'STYLE = \'tagged\'' in src and src.replace("STYLE = 'tagged'", 'STYLE = "plain"') == SEED
    assert sorted(mutate.knob_options(SEED)) == [("MAX_TURNS", 1, 2), ("MAX_TURNS", 1, 3), ("STYLE", "plain", "tagged")]


# -----------------------------------------------------------------------------
# the search with a fake scorer

def test_mutate_archive_and_resume_never_rescore(fake):
    fr, seed, run_dir = fake
    res = mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir, make_args(candidates=2), rounds=2)
    assert fr.evaluated == ["h0", "h1_1", "h1_2", "h2_1", "h2_2"]
    assert res["rounds"] == 2 and len(res["best_series"]) == 3
    assert res["best_series"] == sorted(res["best_series"]) and res["score"] == max(res["best_series"])
    assert res["rollouts"] == 5 * 4 + 4  # 5 scorings of 4 tasks + one smoke episode per proposal
    rows = rows_of(run_dir)
    sources = [(run_dir / "candidates" / n / "harness.py").read_text() for n in rows]
    assert len(set(sources)) == len(sources), "mutate proposed a duplicate"
    frontier = json.loads((run_dir / "frontier.json").read_text())
    assert frontier["lineage"][0] == "h0" and frontier["lineage"][-1] == frontier["best"]
    assert Path(res["winner"]).read_text() == (run_dir / "candidates" / frontier["best"] / "harness.py").read_text()
    for n, r in rows.items():
        if n != "h0":
            assert r["hypothesis"] and r["changed"] and r["parent"] in rows and r["valid"]

    # rerun with one more iteration: nothing already scored is scored again
    fr.evaluated.clear()
    res2 = mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir, make_args(candidates=2), rounds=3)
    assert fr.evaluated and all(n.startswith("h3_") for n in fr.evaluated) and res2["rounds"] == 3
    assert res2["best_series"][:3] == res["best_series"]


def test_patience_stop_ends_search_early(fake):
    """PROMPT changes no score: after the best knob values the rounds score valid candidates that gain nothing,
    and the search stops at the first round the patience rule allows."""
    fr, seed, run_dir = fake
    seed.write_text(SEED.replace('"STYLE": ["plain", "tagged"]', '"STYLE": ["plain", "tagged"], '
                                 '"PROMPT": ["Answer briefly: ", "A: ", "Reply: ", "Say: ", "Answer: ", "Q: "]'))
    stop = (0, 2, 3)  # from the first round: patience 2, at least 3 rounds (mh.phase_stalled)
    res = mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir, make_args(candidates=1), rounds=12, stop=stop)
    rows = [r for r in rows_of(run_dir).values() if r["iteration"]]
    assert all(r["valid"] for r in rows) and res["rounds"] < 12
    series = res["best_series"]
    assert mh.phase_stalled(series, *stop)
    assert not any(mh.phase_stalled(series[:t + 1], *stop) for t in range(1, res["rounds"]))


def test_a_round_without_a_valid_candidate_does_not_stop_the_search(fake):
    """As the official search (it `continue`s before its patience check): a round whose candidates were all refused
    counts as a round but never ends the search; here one knob with one other value leaves mutate nothing new after
    round 1. The stop rule holds from round 2 on, yet all 4 rounds run."""
    fr, seed, run_dir = fake
    seed.write_text(SEED.replace('"MAX_TURNS": [1, 2, 3], ', ""))
    stop = (0, 1, 2)  # patience 1, at least 2 rounds: stalled from round 2 on
    res = mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir, make_args(candidates=1), rounds=4, stop=stop)
    valid = {r["iteration"]: r["valid"] for r in rows_of(run_dir).values()}
    assert valid[1] and not any(valid[t] for t in (2, 3, 4))
    assert res["rounds"] == 4
    assert all(mh.phase_stalled(res["best_series"][:t + 1], *stop) for t in (2, 3, 4))


STAND_IN = textwrap.dedent('''\
    """Stands in for a coding-agent CLI: edits every fresh candidate in place, one defect each."""
    import json, pathlib, sys
    work = pathlib.Path(sys.argv[1])
    assert "Candidates to write" in (work / "INSTRUCTIONS.md").read_text()
    edits = [
        lambda s: s.replace("Answer briefly", "Think step by step, then answer"),   # valid prompt change
        lambda s: "",                                                              # no code
        lambda s: s.replace("def run(task, llm, tools):", "def run(task, llm, tools)"),  # syntax error
        lambda s: s.replace("def run(", "def go("),                                # no run
        lambda s: "import os\\n" + s,                                              # forbidden import
        lambda s: s.replace("MAX_TURNS = 1", "MAX_TURNS = 3"),                     # not prompt-only
        lambda s: s.replace('task["question"]', 'task["no_such_key"]'),   # a dict key: not prompt text
    ]
    fresh = sorted(p.parent for p in work.glob("candidates/*/meta.json") if not json.loads(p.read_text())["proposed"])
    for d, edit in zip(fresh, edits):
        (d / "harness.py").write_text(edit((d / "harness.py").read_text()))
        meta = json.loads((d / "meta.json").read_text())
        meta.update(hypothesis="a stand-in edit", changed=f"edit {d.name}")
        (d / "meta.json").write_text(json.dumps(meta))
    with open(work / "notes.md", "a") as f:
        f.write("## iteration\\nstand-in\\n")
    ''')


def test_command_proposer_and_every_rejection_reason(fake, tmp_path):
    fr, seed, run_dir = fake
    agent = tmp_path / "agent.py"
    agent.write_text(STAND_IN)
    args = make_args(candidates=7, proposer="command", prompt_only=True, proposer_ro=[str(agent)],
                     proposer_cmd=f"{sandbox.python()} {agent} {{workdir}}")
    res = mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir, args, rounds=2)
    assert res["rounds"] == 2  # the run goes on past rejections
    rows = rows_of(run_dir)
    reasons = [rows[f"h1_{j}"]["reason"] or "" for j in range(1, 8)]
    expected = ["", "no code", "syntax error", "no run", "forbidden import", "prompt-only violation",
                "prompt-only violation"]
    assert [r.split(":")[0] for r in reasons] == expected
    assert rows["h1_1"]["valid"] and rows["h1_1"]["score"] is not None and rows["h1_1"]["hypothesis"] == "a stand-in edit"
    assert "Think step by step" in (run_dir / "candidates" / "h1_1" / "harness.py").read_text()
    assert fr.evaluated.count("h1_1") == 1 and not any(n.startswith("h1_") and n != "h1_1" for n in fr.evaluated)
    assert all(rows[f"h1_{j}"]["rollouts"] == 0 for j in range(2, 8))  # rejected before any rollout
    assert rows["h2_1"]["reason"].startswith("duplicate of h1_1")  # same edit again: not rescored
    costs = [json.loads(l) for l in open(run_dir / "costs.jsonl")]
    assert [c["rc"] for c in costs] == [0, 0] and all(c["seconds"] >= 0 for c in costs)
    assert (run_dir / "notes.md").exists()
    # without --prompt-only the last two edits pass the static checks; the dict key then fails its smoke episode
    args = dataclasses.replace(args, prompt_only=False)
    mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), tmp_path / "free", args, rounds=1)
    rows = rows_of(tmp_path / "free")
    assert rows["h1_6"]["valid"] and rows["h1_7"]["reason"].startswith("smoke episode failed")
    assert rows["h1_7"]["rollouts"] == 1  # only its smoke episode


class ChatServer(http.server.BaseHTTPRequestHandler):
    """Loopback chat-completions endpoint (127.0.0.1 only). Each request takes the next reply: a string is a
    200 completion with that content, (status, headers, body) an API error, ("sleep", s) no answer for s."""
    replies, requests = [], []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ChatServer.requests.append((self.path, self.headers.get("Authorization"), body))
        reply = ChatServer.replies[(len(ChatServer.requests) - 1) % len(ChatServer.replies)]
        if isinstance(reply, str):
            reply = (200, {}, {"choices": [{"message": {"role": "assistant", "content": reply}}],
                               "usage": {"prompt_tokens": 1000, "completion_tokens": 50}})
        if reply[0] == "sleep":
            threading.Event().wait(reply[1])  # not time.sleep, which a test may stub out
            return
        status, headers, payload = reply
        out = (json.dumps(payload) if isinstance(payload, dict) else payload).encode()
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", **headers}.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


@pytest.fixture
def chat_server():
    """-> the base URL of a fresh loopback ChatServer; set ChatServer.replies before searching."""
    ChatServer.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ChatServer)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()
    server.server_close()


def test_openai_proposer_against_loopback_server(fake, monkeypatch, chat_server):
    fr, seed, run_dir = fake
    code = SEED.replace("MAX_TURNS = 1", "MAX_TURNS = 2")
    ChatServer.replies = [f"Parent: h0\nHypothesis: two turns help\nChanged: MAX_TURNS 2\n```python\n{code}```",
                          "I would change the prompt, but here is no code."]
    monkeypatch.setenv("TEST_KEY", "sk-test")
    args = make_args(candidates=2, proposer="openai", proposer_url=chat_server,
                     proposer_model="m", proposer_key_env="TEST_KEY", proposer_prompt_tokens=3000)
    res = mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir, args, rounds=1)
    path, auth, body = ChatServer.requests[0]
    assert path == "/v1/chat/completions" and auth == "Bearer sk-test" and body["model"] == "m"
    prompt = body["messages"][0]["content"]
    assert "summary.jsonl" in prompt and "def run(task, llm, tools)" in prompt and "## trace" in prompt
    assert len(prompt) <= 3000 * 4 and "gold0" not in prompt  # within budget; no gold answers
    rows = rows_of(run_dir)
    assert rows["h1_1"]["valid"] and rows["h1_1"]["hypothesis"] == "two turns help" and rows["h1_1"]["score"] == 0.2
    assert (run_dir / "candidates" / "h1_1" / "harness.py").read_text() == code
    assert rows["h1_2"]["reason"].startswith("no code") and res["score"] == 0.2
    frontier = json.loads((run_dir / "frontier.json").read_text())
    assert frontier["proposer"]["calls"] == 2 and frontier["proposer"]["prompt_tokens"] == 2000
    assert frontier["proposer"]["completion_tokens"] == 100


# realistic error bodies: OpenAI's {"error": {...}} and vLLM's {"object": "error", ...}
RATE_LIMITED = {"error": {"message": "Rate limit reached for gpt-4.1 in organization org-x on tokens per min (TPM): "
                                     "Limit 30000, Used 29950, Requested 1200. Please try again in 3s.",
                          "type": "tokens", "param": None, "code": "rate_limit_exceeded"}}
OVERLOADED = {"error": {"message": "The server is overloaded or not ready yet.", "type": "server_error",
                        "param": None, "code": None}}
BAD_KEY = {"error": {"message": "Incorrect API key provided: sk-test. You can find your API key at "
                                "https://platform.openai.com/account/api-keys.", "type": "invalid_request_error",
                     "param": None, "code": "invalid_api_key"}}
NO_MODEL = {"error": {"message": "The model `m` does not exist or you do not have access to it.",
                      "type": "invalid_request_error", "param": None, "code": "model_not_found"}}
TOO_LONG = {"error": {"message": "This model's maximum context length is 8192 tokens. However, your messages "
                                 "resulted in 12043 tokens. Please reduce the length of the messages.",
                      "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}
VLLM_TOO_LONG = {"object": "error", "message": "This model's maximum context length is 2048 tokens. However, you "
                 "requested 9000 tokens (8990 in the messages, 10 in the completion). Please reduce the length of "
                 "the messages or completion.", "type": "BadRequestError", "param": None, "code": 400}


def openai_args(url, **over):
    return make_args(candidates=1, proposer="openai", proposer_url=url, proposer_model="m",
                     proposer_key_env="TEST_KEY", **over)


def test_openai_retries_429_and_5xx_honouring_retry_after(fake, monkeypatch, chat_server):
    fr, seed, run_dir = fake
    slept = []
    monkeypatch.setattr(openai_proposer.time, "sleep", slept.append)
    code = SEED.replace("MAX_TURNS = 1", "MAX_TURNS = 2")
    ChatServer.replies = [(429, {"Retry-After": "3"}, RATE_LIMITED), (503, {}, OVERLOADED),
                          (502, {}, "<html><body><h1>502 Bad Gateway</h1></body></html>"),
                          f"Hypothesis: two turns\n```python\n{code}```"]
    mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir, openai_args(chat_server), rounds=1)
    assert slept == [3.0, 2.0, 4.0]  # Retry-After, then exponential backoff
    assert len(ChatServer.requests) == 4 and rows_of(run_dir)["h1_1"]["score"] == 0.2
    costs = [json.loads(l) for l in open(run_dir / "costs.jsonl")]
    assert len(costs) == 1 and costs[0]["error"] is None and costs[0]["prompt_tokens"] == 1000


@pytest.mark.parametrize("status, body, fix", [
    (401, BAD_KEY, r"HTTP 401 .*Incorrect API key provided.*\$TEST_KEY"),
    (404, NO_MODEL, r"HTTP 404 .*does not exist.*--proposer-url"),
    (400, TOO_LONG, r"maximum context length is 8192.*lower --proposer-prompt-tokens \(now 24000\)"),
    (400, VLLM_TOO_LONG, r"maximum context length is 2048.*lower --proposer-prompt-tokens"),
    (413, "Request Entity Too Large", r"HTTP 413 .*Request Entity Too Large.*--proposer-prompt-tokens")])
def test_openai_errors_no_retry_can_fix_stop_with_the_fix(fake, chat_server, status, body, fix):
    fr, seed, run_dir = fake
    ChatServer.replies = [(status, {}, body)]
    with pytest.raises(SystemExit, match=fix):
        mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir, openai_args(chat_server), rounds=1)
    assert len(ChatServer.requests) == 1  # never retried


def test_openai_timeout_per_request_then_the_failure_limit(fake, monkeypatch, chat_server):
    fr, seed, run_dir = fake
    monkeypatch.setattr(openai_proposer.time, "sleep", lambda s: None)
    ChatServer.replies = [("sleep", 2.0)]
    # no clock: "timed out" on each of the 10 requests says the 0.2 s timeout, not the 2 s server, ended them
    with pytest.raises(SystemExit, match=r"proposer openai failed 2 times in a row, last: no answer from .*timed "
                                         r"out \(after 4 retries\)\. To go on, check that the server"):
        mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir,
                  openai_args(chat_server, proposer_timeout=0.2, proposer_max_failures=2), rounds=1)
    assert len(ChatServer.requests) == 10
    assert not (run_dir / "candidates" / "h1_1").exists()  # a failed call leaves the iteration to the rerun


# -----------------------------------------------------------------------------
# Claude Code: a stand-in `claude` on PATH printing the real JSON shapes (Claude Code 2.1.197), and the real CLI

CLAUDE_STAND_IN = textwrap.dedent('''\
    """Stands in for Claude Code 2.1.197 in print mode: checks what it was given, edits h1_1, prints a result."""
    import json, os, pathlib, sys
    mode = (pathlib.Path(__file__).parent / "mode").read_text().strip()
    usage = {"input_tokens": 30, "cache_creation_input_tokens": 9000, "cache_read_input_tokens": 81000,
             "output_tokens": 4200, "server_tool_use": {"web_search_requests": 0, "web_fetch_requests": 0},
             "service_tier": "standard"}
    common = {"duration_ms": 51234, "duration_api_ms": 49000, "num_turns": 14, "stop_reason": "end_turn",
              "session_id": "5f0c7a1e-0000-4000-8000-000000000000", "total_cost_usd": 0.6123, "usage": usage,
              "modelUsage": {"claude-opus-4-8": {"inputTokens": 30, "outputTokens": 4200}},
              "permission_denials": [], "uuid": "0e8e2c55-0000-4000-8000-000000000000"}
    def result(code=0, **fields):
        print(json.dumps({"type": "result", **fields, **common}))
        sys.exit(code)
    args, work = sys.argv[1:], pathlib.Path.cwd()
    settings = json.loads(pathlib.Path(args[args.index("--settings") + 1]).read_text())
    problems = [f"{flag} missing" for flag in ("-p", "--output-format", "--tools", "--permission-mode")
                if flag not in args]
    problems += ["Bash is a tool"] * ("Bash" in args[args.index("--tools") + 1])
    scoped = [f"Read(/{work}/**)", f"Edit(/{work}/**)"]
    problems += ["settings not scoped"] * (settings["permissions"]["allow"] != scoped)
    problems += ["the project is visible"] * os.path.exists(sys.argv[0].rsplit("/bin/", 1)[0] + "/seed.py")
    if problems:
        result(1, subtype="success", is_error=True, result="; ".join(problems))
    if mode == "success":
        h = work / "candidates" / "h1_1" / "harness.py"
        h.write_text(h.read_text().replace("MAX_TURNS = 1", "MAX_TURNS = 2"))
        (work / "candidates" / "h1_1" / "meta.json").write_text(json.dumps({"parent": "h0", "hypothesis": "two turns",
                                                                          "changed": "MAX_TURNS 1 -> 2"}))
        result(0, subtype="success", is_error=False, result="Wrote candidates/h1_1.")
    if mode == "not_logged_in":  # exactly what 2.1.197 prints without a login (it exits 1; the issue saw 0)
        result(1, subtype="success", is_error=True, api_error_status=None, result="Not logged in · Please run /login")
    if mode == "max_turns":
        result(0, subtype="error_max_turns", is_error=True, errors=["Reached maximum number of turns (30)"])
    if mode == "empty":
        result(0, subtype="success", is_error=False, result="")
    print("TypeError: Cannot read properties of undefined (reading 'map')")  # a crash, not JSON
    sys.exit(1)
    ''')


# the stand-in checks that it cannot see the project, which only holds inside the OS sandbox
needs_sandbox = pytest.mark.skipif(switches.disabled(), reason=f"{switches.OPT_OUT}=1: no OS boundary to test")
# claude has a network (its API): refused under --allow-weak-bounds (tests/test_kernel_bounds.py shows it)
needs_cgroup = pytest.mark.skipif(not switches.disabled() and not cgroups.cgroup_parents(),
                                  reason="no writable cgroup: a proposer with a network is refused")


@pytest.fixture
def claude_stand_in(tmp_path, monkeypatch):
    """Puts the stand-in first on PATH; -> a function that sets its mode."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "claude").write_text(f"#!{sandbox.python()}\n" + CLAUDE_STAND_IN)
    (bin_dir / "claude").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return lambda mode: (bin_dir / "mode").write_text(mode)


@needs_sandbox
@needs_cgroup
def test_claude_success_takes_the_candidate_and_records_usage(fake, claude_stand_in):
    fr, seed, run_dir = fake
    claude_stand_in("success")
    mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir, make_args(candidates=1, proposer="claude"), rounds=1)
    row = rows_of(run_dir)["h1_1"]
    assert row["valid"] and row["score"] == 0.2 and row["hypothesis"] == "two turns"
    cost = json.loads((run_dir / "costs.jsonl").read_text())
    assert cost["error"] is None and cost["rc"] == 0 and cost["turns"] == 14 and cost["models"] == ["claude-opus-4-8"]
    assert (cost["prompt_tokens"], cost["completion_tokens"], cost["cost_usd"]) == (90030, 4200, 0.6123)


@needs_sandbox
@pytest.mark.parametrize("mode, message", [
    ("not_logged_in", "Not logged in · Please run /login"),
    ("max_turns", r"error_max_turns: Reached maximum number of turns \(30\)"),
    ("empty", "empty result"),
    ("crash", "output is not JSON: \"TypeError: Cannot read properties")])
@needs_cgroup
def test_claude_failures_are_read_and_stop_the_search(fake, claude_stand_in, capsys, mode, message):
    fr, seed, run_dir = fake
    claude_stand_in(mode)
    args = make_args(candidates=1, proposer="claude", proposer_max_failures=2)
    with pytest.raises(SystemExit, match=f"proposer claude failed 2 times in a row, last: {message}.*log in to Claude "
                                         f"Code .* or set ANTHROPIC_API_KEY.*resumes at iteration 1"):
        mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir, args, rounds=3)
    costs = [json.loads(l) for l in open(run_dir / "costs.jsonl")]
    assert len(costs) == 2 and all(c["error"] and c["iteration"] == 1 for c in costs)
    assert "failed (1/2 in a row)" in capsys.readouterr().out
    assert fr.evaluated == ["h0"] and not (run_dir / "candidates" / "h1_1").exists()


@needs_cgroup
def test_failures_count_only_in_a_row(fake, monkeypatch):
    """fail, fail, success, fail, fail, success with a limit of 3: the search runs to its end."""
    fr, seed, run_dir = fake
    script = iter(["fail", "fail", "ok", "fail", "fail", "ok"])

    def fake_run(argv, cwd, out_dir, timeout, *bounds, **kw):  # -> (rc, a bound reached, stdout, stderr)
        if next(script) == "fail":
            return 1, None, json.dumps({"type": "result", "subtype": "success", "is_error": True,
                                        "result": "API Error: 529 Overloaded"}), ""
        return 0, None, json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "done"}), ""
    monkeypatch.setattr(proposers, "run_in_sandbox", fake_run)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/" + name)  # meta_harness and lib.proposers
    res = mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir, make_args(candidates=1, proposer="claude"), rounds=2)
    assert res["rounds"] == 2
    assert [c["error"] for c in map(json.loads, open(run_dir / "costs.jsonl"))] == \
        ["API Error: 529 Overloaded"] * 2 + [None] + ["API Error: 529 Overloaded"] * 2 + [None]


@pytest.mark.skipif(shutil.which("claude") is None, reason="Claude Code is not installed")
@needs_cgroup
def test_real_claude_cli_without_login_ends_the_search_with_its_message(fake, tmp_path, monkeypatch):
    fr, seed, run_dir = fake
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no login, whatever the machine has
    for var in proposers.CLAUDE_ENV + ("CLAUDE_CONFIG_DIR",):
        monkeypatch.delenv(var, raising=False)
    args = make_args(candidates=1, proposer="claude", proposer_max_failures=2, proposer_timeout=20)
    with pytest.raises(SystemExit, match="failed 2 times in a row, last: Not logged in · Please run /login. To go on, "
                                         "log in to Claude Code"):
        mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir, args, rounds=1)
    costs = [json.loads(l) for l in open(run_dir / "costs.jsonl")]
    assert [c["error"] for c in costs] == ["Not logged in · Please run /login"] * 2


# -----------------------------------------------------------------------------
# meta_harness.py's command: its progress lives in its store (OUT/store), never in OUT/archive

class Killed(BaseException):
    """A kill: no handler of the project's catches it."""


@pytest.fixture
def cli(monkeypatch):
    """meta_harness.py's command on searchqa's seed harness with mutate, no model loaded, every score a fake one (the
    candidate's code, hashed). -> (run(out, rounds, *flags) -> OUT/archive's frontier, the calls: the rounds the
    proposer was asked for, the candidates scored, and `kill`: the candidate whose scoring is killed)"""
    calls = {"proposed": [], "scored": [], "kill": None}

    def evaluate(domain, harness_path, tasks, backend, k=1, traces_path=None, desc="", **kw):
        name = Path(harness_path).parent.name
        if name == calls["kill"]:
            raise Killed
        if stand_ins.without_model(backend, tasks, k):
            return stand_ins.without_model(backend, tasks, k)
        calls["scored"].append(name)
        score = int(hashlib.sha256(Path(harness_path).read_bytes()).hexdigest()[:4], 16) / 65536
        Path(traces_path).write_text("".join(json.dumps({"task_id": t["id"], "reward": score}) + "\n"
                                             for t in tasks for _ in range(k)))
        return {"mean_at_k": score, "k": k, "per_task": {}, "mean_turns": 1.0, "tokens": 0, "rollouts": len(tasks) * k,
                "errors": 0, "seconds": 0.0}

    def run_episodes(domain, harness_path, tasks, backend, **kw):  # every smoke episode passes
        return [{"task_id": tasks[0]["id"], "sample": 0, "reward": 0.0, "error": None, "turns": 1}]

    def propose(run_dir, names, rows, iteration, domain, cfg):
        calls["proposed"].append(iteration)
        return real_propose(run_dir, names, rows, iteration, domain, cfg)

    real_propose = mh.propose
    monkeypatch.setattr(mh.rollout, "evaluate", evaluate)
    monkeypatch.setattr(mh.rollout, "run_episodes", run_episodes)
    monkeypatch.setattr(mh, "propose", propose)
    monkeypatch.setattr(mh, "load_policy", lambda args: stand_ins.BACKEND)

    def run(out, rounds, *flags):
        mh.main(["--domain", "searchqa", "--harness", "harnesses/searchqa.py", "--model", "smoke", "--proposer",
                 "mutate", "--candidates", "2", "--harness-tasks", "2", "--rounds", str(rounds), "--out", str(out),
                 *flags])
        return json.loads((out / "archive" / "frontier.json").read_text())
    return run, calls


def test_a_killed_search_redoes_only_its_round_from_the_store_and_ends_as_an_unkilled_one(cli, tmp_path):
    """A command killed while it scores round 2, its archive then damaged (a finished round's scores.json deleted,
    frontier.json emptied): the rerun takes round 1 from the store without a proposer call or a score, does round 2
    again, and ends with the unkilled run's archive."""
    run, calls = cli
    unkilled = run(tmp_path / "unkilled", 2)
    round_2 = [name for name in calls["scored"] if name.startswith("h2_")]
    out = tmp_path / "killed"
    calls["kill"] = "h2_1"
    with pytest.raises(Killed):
        run(out, 2)
    (out / "archive" / "candidates" / "h1_1" / "scores.json").unlink()
    (out / "archive" / "frontier.json").write_text("")
    calls.update(kill=None, proposed=[], scored=[])
    resumed = run(out, 2)
    assert calls["proposed"] == [2] and calls["scored"] == round_2
    assert {**resumed, "proposer": None} == {**unkilled, "proposer": None}
    assert resumed["proposer"]["calls"] == unkilled["proposer"]["calls"] == 2
    assert rows_of(out / "archive") == rows_of(tmp_path / "unkilled" / "archive")


def test_an_archive_edited_in_the_run_folder_is_not_believed(cli, tmp_path, capsys):
    """OUT/archive is only the store's copy: a rerun copies the store's archive over an edited score and seed, and
    computes nothing again; with other settings (no item of theirs) it says in one line that it starts over."""
    run, calls = cli
    out = tmp_path / "mh"
    first = run(out, 1)
    scores = out / "archive" / "candidates" / "h1_1" / "scores.json"
    seed = out / "archive" / "candidates" / "h0" / "harness.py"
    stored = scores.read_text(), seed.read_text()
    scores.write_text(json.dumps({**json.loads(stored[0]), "score": 1.0}))
    seed.write_text(stored[1] + "# edited\n")
    calls.update(proposed=[], scored=[])
    assert run(out, 1) == first
    assert calls == {"proposed": [], "scored": [], "kill": None}
    assert (scores.read_text(), seed.read_text()) == stored
    capsys.readouterr()
    run(out, 1, "--harness-samples", "2")
    assert f"{out}/store holds no search of this seed harness, these settings and code: searching from round 0" in \
        capsys.readouterr().out
    assert calls["proposed"] == [1] and calls["scored"][0] == "h0"


def test_a_second_command_on_the_run_folder_is_refused_in_one_line(cli, tmp_path):
    run, calls = cli
    out = tmp_path / "mh"
    with only_command(out / "store"):  # the first command, still running
        with pytest.raises(SystemExit, match=f"^meta_harness.py: error: {out}/store is in use by another command"):
            run(out, 1)
    assert calls["scored"] == [] and not (out / "archive").exists()


def test_an_archive_that_is_a_link_an_older_layout_or_an_unconfined_search_is_never_taken(cli, tmp_path, monkeypatch,
                                                                                          capsys):
    """OUT/archive that is a link to another run's archive is removed (the link, not what it points to) and the search
    runs from the store, never in the other folder; a folder of the layout before the store (OUT/candidates,
    OUT/frontier.json) is said in one line and not read; a search run under --unsafe-no-sandbox keeps its work in
    OUT/store-unconfined, which a command in the sandbox never takes."""
    run, calls = cli
    other = run(tmp_path / "other", 1)
    out = tmp_path / "mh"
    out.mkdir()
    (out / "archive").symlink_to(tmp_path / "other" / "archive")
    (out / "frontier.json").write_text(json.dumps(other))  # the older layout's index
    calls.update(proposed=[], scored=[])
    capsys.readouterr()
    assert run(out, 1) == other
    assert calls["proposed"] == [1] and calls["scored"][0] == "h0"  # done here, not taken from the linked archive
    assert not (out / "archive").is_symlink() and (tmp_path / "other" / "archive" / "frontier.json").exists()
    assert f"{out}/candidates and the files beside it are an archive of the older layout, not read" in \
        capsys.readouterr().out

    unconfined = tmp_path / "unconfined"
    monkeypatch.setenv(switches.OPT_OUT, "1")
    run(unconfined, 1)
    assert list((unconfined / "store-unconfined").glob("search/*/key.json"))
    assert not list((unconfined / "store").glob("search/*/key.json"))
    monkeypatch.delenv(switches.OPT_OUT)
    calls.update(proposed=[], scored=[])
    run(unconfined, 1)
    assert calls["proposed"] == [1]  # in the sandbox: the unconfined search's rounds are not taken


# -----------------------------------------------------------------------------
# end to end on the smoke model with the real runner

def test_end_to_end_smoke_mutate(tmp_path, capsys):
    out = tmp_path / "mh"
    mh.main(["--domain", "searchqa", "--harness", "harnesses/searchqa.py", "--model", "smoke", "--iterations", "2",
             "--candidates", "3", "--proposer", "mutate", "--harness-tasks", "4", "--max-new-tokens", "8",
             "--out", str(out)])
    assert "budget: 2 rounds x 3 = 6 proposals" in capsys.readouterr().out
    archive = out / "archive"
    rows = rows_of(archive)
    assert list(rows) == ["h0", "h1_1", "h1_2", "h1_3", "h2_1", "h2_2", "h2_3"]
    for name, r in rows.items():
        d = archive / "candidates" / name
        meta = json.loads((d / "meta.json").read_text())
        assert {"parent", "hypothesis", "changed", "proposer", "iteration", "valid", "reason"} <= set(meta)
        if r["valid"]:
            scores = json.loads((d / "scores.json").read_text())
            assert 0.0 <= scores["score"] <= 1.0 and scores["rollouts"] == 4 and scores["mean_turns"] >= 1
            traces = [json.loads(l) for l in open(d / "traces.jsonl")]
            assert len(traces) == 4 and not any({"answers", "solution"} & set(t) for t in traces)
    frontier = json.loads((archive / "frontier.json").read_text())
    assert frontier["best"] in rows and len(frontier["best_series"]) == 3 and frontier["lineage"][0] == "h0"
    assert json.loads((out / "config.json").read_text())["proposer"] == "mutate"


class FakeAnthropicApi(http.server.BaseHTTPRequestHandler):
    """A scripted model behind the Anthropic Messages API (127.0.0.1, streamed as server-sent events): one tool
    call per turn, chosen by how many tool results the conversation holds; results are kept for the test."""
    steps, results = [], []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        done = [b for m in body.get("messages", []) if m["role"] == "user" and isinstance(m["content"], list)
                for b in m["content"] if b.get("type") == "tool_result"]
        if body.get("tools") and done:
            text = done[-1]["content"] if isinstance(done[-1]["content"], str) else \
                " ".join(c.get("text", "") for c in done[-1]["content"])
            FakeAnthropicApi.results.append((len(done), bool(done[-1].get("is_error")), text))
        step = len(done) if body.get("tools") else len(FakeAnthropicApi.steps)
        if step < len(FakeAnthropicApi.steps):
            name, tool_input = FakeAnthropicApi.steps[step]
            block, delta = {"type": "tool_use", "id": f"toolu_{step:02d}", "name": name, "input": {}}, \
                {"type": "input_json_delta", "partial_json": json.dumps(tool_input)}
        else:
            block, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": "Wrote candidates/h1_1."}
        events = [{"type": "message_start", "message": {
                       "id": f"msg_{step}", "type": "message", "role": "assistant", "model": body.get("model", "m"),
                       "content": [], "stop_reason": None, "stop_sequence": None,
                       "usage": {"input_tokens": 100, "output_tokens": 1}}},
                  {"type": "content_block_start", "index": 0, "content_block": block},
                  {"type": "content_block_delta", "index": 0, "delta": delta},
                  {"type": "content_block_stop", "index": 0},
                  {"type": "message_delta", "delta": {"stop_reason": "tool_use" if block["type"] == "tool_use"
                                                      else "end_turn", "stop_sequence": None},
                   "usage": {"output_tokens": 20}},
                  {"type": "message_stop"}]
        out = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


@pytest.mark.skipif(shutil.which("claude") is None, reason="Claude Code is not installed")
@needs_cgroup
def test_real_claude_cli_tools_stay_in_the_proposer_folder(fake, tmp_path, monkeypatch):
    """The real CLI, its settings and flags as the search passes them, against a scripted model: file tools work
    in its folder; reads and writes elsewhere, and a shell, are refused; the search takes the edited candidate."""
    fr, seed, run_dir = fake
    scratch = tmp_path / "scratch"  # the proposer's folder, known in advance so the script can name it
    scratch.mkdir()
    monkeypatch.setattr(proposers.tempfile, "mkdtemp", lambda prefix: str(scratch))
    work = scratch / "archive"
    FakeAnthropicApi.steps = [
        ("Glob", {"pattern": "**/*.py"}),
        ("Read", {"file_path": f"{work}/candidates/h1_1/harness.py"}),
        ("Edit", {"file_path": f"{work}/candidates/h1_1/harness.py", "old_string": "MAX_TURNS = 1",
                  "new_string": "MAX_TURNS = 2"}),
        ("Grep", {"pattern": "MAX_TURNS", "path": f"{work}/candidates"}),
        ("Read", {"file_path": str(mh.Path(mh.__file__).parent / "data" / "searchqa_test.jsonl")}),
        ("Read", {"file_path": "/etc/hosts"}),
        ("Write", {"file_path": "/tmp/evil.txt", "content": "x"}),
        ("Glob", {"pattern": "**/*", "path": "/usr/lib"}),
        ("Bash", {"command": "id"})]
    FakeAnthropicApi.results = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeAnthropicApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{server.server_port}")
    args = make_args(candidates=1, proposer="claude", proposer_max_failures=1, proposer_timeout=60)
    try:
        mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir, args, rounds=1)
    finally:
        server.shutdown()
    refused = [i for i, is_error, _ in FakeAnthropicApi.results if is_error]
    assert refused == [5, 6, 7, 8, 9], FakeAnthropicApi.results  # allowed: Glob, Read, Edit, Grep in its folder
    assert "denied by your permission settings" in FakeAnthropicApi.results[4][2]  # the project, by its deny rule
    assert all("don't ask mode" in text for _, _, text in FakeAnthropicApi.results[5:8])  # not allowed: refused
    assert "No such tool available: Bash" in FakeAnthropicApi.results[8][2]
    row, cost = rows_of(run_dir)["h1_1"], json.loads((run_dir / "costs.jsonl").read_text())
    assert row["valid"] and row["score"] == 0.2 and cost["error"] is None and cost["permission_denials"] == 3


def test_a_chess_candidate_importing_chess_is_refused_before_any_rollout(tmp_path, monkeypatch):
    """validate(): the chess h0 with `import chess` added is rejected with one line, and no episode is run."""
    import domains
    from types import SimpleNamespace
    h0 = (Path(__file__).resolve().parents[1] / "harnesses" / "paper" / "chess.py").read_text()
    for name, source in (("h0", h0), ("h1_1", h0.replace("import re\n", "import re\nimport chess\n"))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "harness.py").write_text(source)
    mh.write_json(tmp_path / "h1_1" / "meta.json", {"parent": "h0"})
    monkeypatch.setattr(mh.rollout, "run_episodes", lambda *a, **kw: pytest.fail("a refused candidate runs no episode"))
    meta = mh.validate(tmp_path / "h1_1", [{"name": "h0", "valid": True}], None, domains.get("chess"), [],
                       SimpleNamespace(prompt_only=False), {})
    assert meta["valid"] is False and meta["reason"].startswith("chess engine: imports chess;")
    assert "\n" not in meta["reason"] and "smoke_rollouts" not in meta


def test_each_domain_gets_its_own_brief_and_caps(tmp_path):
    """After the official per-domain skills: chess's hard bans, searchqa's and math's axes; the runner's caps."""
    import domains
    from types import SimpleNamespace
    text = {}
    for name in ("searchqa", "math", "chess"):
        folder = tmp_path / name
        folder.mkdir()
        path = proposers.write_instructions(folder, domains.get(name), ["h1_1"], "h0", 1,
                                            SimpleNamespace(prompt_only=False, null_check="refuse", null_margin=0.05,
                                                            proposer_brief="official"))
        text[name] = path.read_text()
        assert f"## The {name} domain\n" in text[name]
        # every domain's proposer is told that the answering is the model's, and how that is checked
        assert ("Leave the answering to the model" in text[name] and "scored again with a model that replies '' "
                "to every call, and one that earns more there than its parent (by more than 0.05) is rejected"
                in text[name].replace("\n  ", " "))
    assert "never turn a legal wrong move of the model into another move" in text["chess"]
    assert "no chess library (`import chess` is refused) and no engine" in text["chess"]
    assert "at most 18 model calls a puzzle, and at most 10 retries of each kind" in text["chess"]
    assert "- C. query rewriting before a search" in text["searchqa"] and "- A." not in text["chess"]
    assert "at most 16 model calls an episode" in text["searchqa"] and "\\boxed{...}" in text["math"]
