"""The official protocol's data limits and verifiers (docs/protocol.md sections 1 and 4) on small cases: seeded
stratified limits, SearchQA's sources, and the LLM judge against a local stand-in of an OpenAI-compatible server.
(The math and chess verifier cases are in test_domains.py, the hub data rules in test_gpu_path.py.)"""
import argparse
import http.server
import json
import threading
from types import SimpleNamespace

import pytest

import domains
import meta_harness
from lib.paper import judge
from lib.subsets import seeded_sample
from scripts import show_data

# -----------------------------------------------------------------------------
# seeded, stratified limits


def tasks_of(counts):
    """Tasks of several sources, one source after another (as Search-R1's files and the seven test sets are)."""
    return [{"id": f"{source}-{i}", "source": source} for source, n in counts.items() for i in range(n)]


def test_seeded_sample_keeps_each_sources_share_and_is_never_the_first_n():
    tasks = tasks_of({"nq": 400, "hotpotqa": 500, "bamboogle": 100})
    picked = seeded_sample(tasks, 50)
    assert len(picked) == 50 and len({t["id"] for t in picked}) == 50
    assert [sum(t["source"] == s for t in picked) for s in ("nq", "hotpotqa", "bamboogle")] == [20, 25, 5]
    assert picked != tasks[:50]
    assert picked == seeded_sample(tasks, 50)  # deterministic
    assert picked != seeded_sample(tasks, 50, seed=1)
    positions = [tasks.index(t) for t in picked]
    assert positions == sorted(positions)  # in the set's order
    # largest remainders: 7 of thirds -> 3, 2, 2 (the tie goes to the source met first)
    thirds = seeded_sample(tasks_of({"a": 10, "b": 10, "c": 10}), 7)
    assert [sum(t["source"] == s for t in thirds) for s in "abc"] == [3, 2, 2]
    # each source is drawn with its own generator: a source's picks do not depend on the others
    alone = seeded_sample(tasks_of({"nq": 400, "hotpotqa": 500}), 45)  # nq's quota is 20 here too
    assert [t for t in alone if t["source"] == "nq"] == [t for t in picked if t["source"] == "nq"]


def test_seeded_sample_without_sources_all_and_exclude():
    plain = [{"id": str(i)} for i in range(100)]
    picked = seeded_sample(plain, 10)
    assert len(picked) == 10 and picked != plain[:10] and picked == seeded_sample(plain, 10)
    assert seeded_sample(plain, None) == plain and seeded_sample(plain, 500) == plain
    # the cpu preset's test tasks, disjoint from the first 50: exclude their ids
    others = seeded_sample(plain, 30, exclude={t["id"] for t in plain[:50]})
    assert len(others) == 30 and all(int(t["id"]) >= 50 for t in others)
    assert seeded_sample(plain, None, exclude={"0"}) == plain[1:]


def test_limit_call_sites_take_the_seeded_sample(capsys):
    d = domains.get("searchqa")
    harness = d.load("harness")
    args = SimpleNamespace(harness_tasks=24)
    assert meta_harness.harness_tasks(d, args) == seeded_sample(harness, 24) != harness[:24]
    assert meta_harness.harness_tasks(d, SimpleNamespace(harness_tasks=None)) == harness
    show_data.show("math", "test", 3)
    shown = [line.split()[-1] for line in capsys.readouterr().out.splitlines() if line.startswith("--- ")]
    assert shown == [t["id"] for t in seeded_sample(domains.get("math").load("test"), 3)]
    for script in ("whale.py", "rollout.py", "meta_harness.py"):  # no first-N slice is left at a limit flag
        source = open(script).read()
        assert "[: args.test_limit]" not in source and "[: args.train_limit]" not in source
        assert "[:args.limit]" not in source and "[: args.harness_tasks]" not in source


def test_searchqa_tasks_name_their_source():
    d = domains.get("searchqa")
    for split in domains.SPLITS:
        assert {t["source"] for t in d.load(split)} == {"synthetic"}
    test = d.load("test")
    picked = seeded_sample(test, 50)
    assert picked != test[:50] and {t["hops"] for t in picked} == {1, 2}

# -----------------------------------------------------------------------------
# the LLM judge against a stand-in OpenAI-compatible server


def judge_server(replies, log):
    """A chat completions endpoint that answers with the next of `replies`: a text, or an HTTP status code."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            log.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
            reply = replies.pop(0) if len(replies) > 1 else replies[0]
            if isinstance(reply, int):
                payload, code = b'{"error": "overloaded"}', reply
            else:
                payload, code = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant",
                                                                                 "content": reply}}]}).encode(), 200
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def sleeps(monkeypatch):
    waited = []
    monkeypatch.setattr(judge.time, "sleep", waited.append)  # the backoff, recorded instead of slept
    return waited


def judged_searchqa(server, tmp_path, monkeypatch, *extra):
    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-test")
    p = argparse.ArgumentParser()
    domains.add_args(p)
    args = p.parse_args(["--judge-url", f"http://127.0.0.1:{server.server_port}/v1", "--judge-model", "judge-m",
                         "--judge-key-env", "TEST_JUDGE_KEY", *extra])
    return domains.get("searchqa", vars(args), out=str(tmp_path / "run"))


TASK = {"id": "q1", "question": "Who wrote the Iliad?", "answers": ["Homer", "Homeros"]}


def test_judge_request_shape_and_verdicts(tmp_path, monkeypatch, sleeps):
    log = []
    server = judge_server(["CORRECT", "INCORRECT.", "correct, it names the same poet"], log)
    try:
        d = judged_searchqa(server, tmp_path, monkeypatch)
        assert d.reward(TASK, "the poet Homer", None) == 1.0  # not an exact match: the judge decides
        assert d.reward(TASK, "Homer", None) == 0.0  # an exact match the judge rejects
        assert d.reward(TASK, "Homer (the bard)", None) == 1.0  # the reply's first word is the verdict
        request = log[0]
        assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer sk-test"
        body = request["body"]
        assert set(body) == {"model", "messages", "temperature", "max_completion_tokens"}
        assert body["model"] == "judge-m" and body["temperature"] == 0.0 and body["max_completion_tokens"] == 256
        [message] = body["messages"]
        assert message["role"] == "user"
        assert "Question: Who wrote the Iliad?" in message["content"]
        assert "Reference answer(s): Homer | Homeros" in message["content"]
        assert "Predicted answer: the poet Homer" in message["content"]
        assert "CORRECT or INCORRECT" in message["content"] and not sleeps
    finally:
        server.shutdown()


def test_judge_caches_each_verdict_in_memory_and_on_disk(tmp_path, monkeypatch, sleeps):
    log = []
    server = judge_server(["CORRECT"], log)
    try:
        d = judged_searchqa(server, tmp_path, monkeypatch)
        assert d.reward(TASK, "the poet Homer", None) == 1.0 and len(log) == 1
        assert d.reward(TASK, "the poet Homer", None) == 1.0 and len(log) == 1  # the second call asks nothing
        assert d.reward({**TASK, "question": "Who wrote the Odyssey?"}, "the poet Homer", None) == 1.0
        assert len(log) == 2  # per (question, answer)
        cache = tmp_path / "run" / "judge_cache.jsonl"
        assert [json.loads(line)["verdict"] for line in cache.read_text().splitlines()] == [1, 1]
        again = judged_searchqa(server, tmp_path, monkeypatch)  # a resumed run reads the verdicts back
        assert again.reward(TASK, "the poet Homer", None) == 1.0 and len(log) == 2
        other = judged_searchqa(server, tmp_path, monkeypatch, "--judge-model", "other-m")
        assert other.reward(TASK, "the poet Homer", None) == 1.0 and len(log) == 3  # another model's: asked
    finally:
        server.shutdown()


def test_judge_retries_then_falls_back_to_exact_match(tmp_path, monkeypatch, sleeps, capsys):
    log = []
    server = judge_server([500], log)
    try:
        d = judged_searchqa(server, tmp_path, monkeypatch)
        assert d.reward(TASK, "homer.", None) == 1.0  # every attempt failed: exact match (normalised) decides
        assert len(log) == 3 and sleeps == [1.0, 2.0]  # 3 attempts, a backoff of 1 s then 2 s
        assert d.reward(TASK, "the poet Homer", None) == 0.0 and len(log) == 6  # a fallback is not cached
        assert "exact match used" in capsys.readouterr().out
        assert not (tmp_path / "run" / "judge_cache.jsonl").exists()
    finally:
        server.shutdown()
    log = []
    server = judge_server(["I think so", 503, "INCORRECT"], log)  # unparseable, then an error, then a verdict
    sleeps.clear()
    try:
        d = judged_searchqa(server, tmp_path, monkeypatch)
        assert d.reward(TASK, "Homer", None) == 0.0 and len(log) == 3 and sleeps == [1.0, 2.0]
    finally:
        server.shutdown()
    unreachable = judge.Judge("http://127.0.0.1:9/v1", "m", timeout=2)
    assert unreachable.verdict("q", ["a"], "a", fallback=1.0) == 1 and unreachable.requests == 3


def test_judge_is_not_asked_without_an_answer(tmp_path, monkeypatch, sleeps):
    log = []
    server = judge_server(["CORRECT"], log)
    try:
        d = judged_searchqa(server, tmp_path, monkeypatch)
        for answer in [None, "", "   ", ["Homer"], {"a": 1}]:
            assert d.reward(TASK, answer, None) == 0.0
        assert log == []
    finally:
        server.shutdown()


def test_judge_off_by_default_and_parsing():
    assert domains.get("searchqa").judge is None
    p = argparse.ArgumentParser()
    domains.add_args(p)
    args = p.parse_args([])
    assert args.judge_url is None and args.judge_model == "gpt-5.4-mini" and judge.judge_from_flags(args) is None
    assert domains.get("math", vars(args)).reward({"answer": "7"}, "\\boxed{7}") == 1.0
    assert [judge.parse_verdict(t) for t in ["CORRECT", " incorrect", "**CORRECT**", "Correctly", "", None]] == \
        [1, 0, 1, None, None, None]
    assert judge.chat_url("http://h/v1/") == "http://h/v1/chat/completions"
    assert judge.chat_url("http://h/v1/chat/completions") == "http://h/v1/chat/completions"
