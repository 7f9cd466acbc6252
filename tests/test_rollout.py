"""Tests for rollout.py: hostile harnesses, batching, token records, seeds, bad input, real h0 smoke runs.

    python -m pytest -q tests/test_rollout.py
"""
import errno
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import domains  # noqa: E402
import rollout  # noqa: E402
from lib.paper import retriever  # noqa: E402
from lib.episodes import runner, sandbox, worker_pool
from lib.cli import one_line_errors  # noqa: E402
from lib.contract import ALLOWED_IMPORTS, check_harness  # noqa: E402
from lib.backends.hf_backend import HFBackend  # noqa: E402
from lib.backends.models import chat_ids, load_model  # noqa: E402

SECRET = "zebra-secret-4821"


class FakeTools:
    """Hidden state lives here, in the runner process: the secret and a call counter."""

    def __init__(self, task):
        self._secret, self.lookups = task["answer"], 0

    def lookup(self, query):
        self.lookups += 1
        return f"passage about {query}"


class FakeDomain(domains.Domain):
    name = "fake"
    TOOL_METHODS = ("lookup",)

    def load(self, split, n=8):
        return [{"id": f"t{i}", "question": f"q{i}", "answer": f"passage about q{i}"} for i in range(n)]

    def public(self, task):
        return {"question": task["question"]}

    def tools(self, task):
        return FakeTools(task)

    def reward(self, task, answer, tools):
        return float(answer == task["answer"] and tools.lookups >= 1)


class CountingBackend(HFBackend):
    def generate(self, prompts, **kw):
        self.generate_calls = getattr(self, "generate_calls", 0) + 1
        return super().generate(prompts, **kw)


@pytest.fixture(scope="module")
def backend():
    # one torch thread: on 2 shared cores, two spinning OpenMP threads make tiny forwards far slower
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model, tok = load_model("smoke")
    yield CountingBackend(model, tok)
    torch.set_num_threads(threads)


def write(tmp_path, name, source):
    path = tmp_path / name
    path.write_text(source)
    return path


GOOD = '''"""Two llm calls, one tool call; returns the texts it got so the test can compare them with the record."""
import re
def run(task, llm, tools):
    texts = [llm([{"role": "user", "content": task["question"] + " turn " + str(i)}], max_tokens=6) for i in range(2)]
    return {"answer": tools.lookup(task["question"]), "texts": texts}
'''

HOSTILE = '''"""One misbehaviour per task, chosen by the question; other tasks behave."""
import random
def run(task, llm, tools):
    q = task["question"]
    if q == "raise":
        raise RuntimeError("boom")
    if q == "loop":
        while True:
            pass
    if q == "sleep":
        random._os.sys.modules["time"].sleep(1000)
    if q == "garbage":
        return ["not", "a", "dict"]
    if q == "unserialisable":
        return {"answer": {1, 2}}
    if q == "print":
        print("x" * 50_000_000)
        for _ in range(200):
            print("y" * 100_000)
        random._os.write(1, b"z" * 1_000_000)
        return {"answer": "printed"}
    if q == "prints":  # 50,000 print() calls: linear in the output, well inside the deadline
        for i in range(50_000):
            print("line", i)
        return {"answer": "printed"}
    if q == "forge":  # write a malformed request straight to the RPC pipe
        sys = random._os.sys
        random._os.write(int(sys.argv[2]), b'{"tool": "lookup", "args": 5}' + bytes([10]))
        llm([{"role": "user", "content": q}])
    if q == "deep":  # JSON nested past any recursion limit, written to the pipe directly
        random._os.write(int(random._os.sys.argv[2]), b"[" * 200_000 + bytes([10]))
        llm([{"role": "user", "content": q}])
    if q == "max_tokens_0":  # a request the worker would refuse, written to the pipe directly
        random._os.write(int(random._os.sys.argv[2]), b'{"llm": [{"role": "user", "content": "x"}], "max_tokens": 0}'
                         + bytes([10]))
        llm([{"role": "user", "content": q}])
    llm([{"role": "user", "content": q}], max_tokens=4)
    return {"answer": tools.lookup(q)}
'''


def test_hostile_harnesses_cost_only_their_episodes(backend, tmp_path):
    bad = ["raise", "loop", "sleep", "garbage", "unserialisable", "print", "prints", "forge", "deep", "max_tokens_0"]
    tasks = [{"id": b, "question": b, "answer": SECRET} for b in bad] + FakeDomain().load("test", n=4)
    path = write(tmp_path, "hostile.py", HOSTILE)
    eps = rollout.run_episodes(FakeDomain(), path, tasks, backend, max_new_tokens=4, deadline_s=3.0, workers=6)
    by = {e["task_id"]: e for e in eps}
    assert "boom" in by["raise"]["error"]
    # no clock on a shared machine: the error says the deadline, not the harness, ended loop and sleep
    assert "deadline" in by["loop"]["error"] and "deadline" in by["sleep"]["error"]
    assert "expected a dict" in by["garbage"]["error"]
    assert "protocol violation" in by["forge"]["error"] and "RecursionError" in by["deep"]["error"]
    assert "not JSON serializable" in by["unserialisable"]["error"]
    assert by["print"]["error"] is None and by["print"]["answer"] == "printed"
    assert len(by["print"]["stdout"]) < 11_000
    assert by["prints"]["error"] is None, by["prints"]  # 50,000 print() calls within the deadline
    assert by["prints"]["stdout"].startswith("line 0\nline 1\n") and "more characters dropped" in by["prints"]["stdout"]
    assert "protocol violation" in by["max_tokens_0"]["error"] and "max_tokens" in by["max_tokens_0"]["error"]
    assert by["max_tokens_0"]["turns"] == 0  # the forged request never reached the backend
    assert all(by[b]["reward"] == 0.0 for b in bad)
    # the tasks after the hostile ones ran on replaced or reused workers and still work
    assert [by[f"t{i}"]["reward"] for i in range(4)] == [1.0] * 4
    assert all(by[f"t{i}"]["error"] is None and by[f"t{i}"]["turns"] == 1 for i in range(4))


class SlowBackend:
    """Every generate call takes `seconds`: as a big model on a loaded CPU would."""

    def __init__(self, tokenizer, seconds):
        self.tokenizer, self.seconds = tokenizer, seconds

    def generate(self, prompts, **kw):
        time.sleep(self.seconds)
        return [[self.tokenizer.eos_token_id] for _ in prompts]


def test_time_spent_generating_is_not_charged_to_waiting_harnesses(backend, tmp_path):
    # q1 first thinks for 1.3 s, misses the first batch and sends its request while the parent is generating
    path = write(tmp_path, "late.py", '''"""Late starter."""
import random
def run(task, llm, tools):
    if task["question"] == "q1":
        random._os.sys.modules["time"].sleep(1.3)
    llm([{"role": "user", "content": "hi"}])
    return {"answer": tools.lookup(task["question"])}
''')
    eps = rollout.run_episodes(FakeDomain(), path, FakeDomain().load("t", n=2), SlowBackend(backend.tokenizer, 2.0),
                               deadline_s=1.8)
    assert [e["error"] for e in eps] == [None, None] and [e["reward"] for e in eps] == [1.0, 1.0]


def test_concurrent_llm_calls_are_batched(backend, tmp_path):
    path = write(tmp_path, "good.py", GOOD)
    backend.generate_calls = 0
    eps = rollout.run_episodes(FakeDomain(), path, FakeDomain().load("train", n=16), backend, max_new_tokens=6,
                               workers=16)
    llm_calls = sum(e["turns"] for e in eps)
    assert llm_calls == 32 and all(e["reward"] == 1.0 for e in eps)
    assert backend.generate_calls <= 4, (backend.generate_calls, llm_calls)


def test_recorded_tokens_are_what_was_sampled(backend, tmp_path):
    path = write(tmp_path, "echo.py", GOOD.replace('"answer": tools.lookup(task["question"])', '"answer": texts'))
    traces = tmp_path / "traces.jsonl"
    eps = rollout.run_episodes(FakeDomain(), path, FakeDomain().load("train", n=2), backend, samples=2,
                               max_new_tokens=6, traces_path=traces)
    tok = backend.tokenizer
    for e in eps:
        assert e["answer"] == [c["completion"] for c in e["calls"]]  # the harness got exactly the recorded text
        for call in e["calls"]:
            assert call["prompt_ids"] == chat_ids(tok, call["messages"])
            assert tok.decode(call["completion_ids"], skip_special_tokens=True) == call["completion"]
            assert 1 <= len(call["completion_ids"]) <= 6
        assert e["tokens"] == sum(len(c["completion_ids"]) for c in e["calls"])
    rows = [json.loads(line) for line in traces.read_text().splitlines()]
    assert [r["task_id"] for r in rows] == ["t0", "t0", "t1", "t1"]
    assert rows[0]["calls"][0]["completion"] == eps[0]["calls"][0]["completion"]
    assert rows[0]["calls"][0]["messages"][0]["content"] == "q0 turn 0"


def test_same_seed_same_results(backend, tmp_path):
    path = write(tmp_path, "good.py", GOOD)
    tasks = FakeDomain().load("train", n=2)
    runs = [rollout.run_episodes(FakeDomain(), path, tasks, backend, samples=2, max_new_tokens=6, seed=s, workers=w)
            for s, w in ((1, 4), (1, 1), (2, 4))]
    ids = [[c["completion_ids"] for e in r for c in e["calls"]] for r in runs]
    assert ids[0] == ids[1]  # batch composition differs (4 workers vs 1), samples do not
    assert ids[0] != ids[2]


def test_generate_rows_do_not_depend_on_the_batch(backend):
    p = chat_ids(backend.tokenizer, [{"role": "user", "content": "hello"}])
    q = chat_ids(backend.tokenizer, [{"role": "user", "content": "a longer prompt than the other one"}])
    alone = backend.generate([p], max_new_tokens=8, seeds=[5])[0]
    mixed = backend.generate([q, p, q], max_new_tokens=[3, 8, 8], seeds=[1, 5, 2])
    assert mixed[1] == alone and len(mixed[0]) == 3
    greedy = backend.generate([p, p], temperature=0, max_new_tokens=8, seeds=[1, 2])
    assert greedy[0] == greedy[1]


def test_bad_harness_input_names_file_line_and_fix(backend, tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.py: no such harness file"):
        rollout.run_episodes(FakeDomain(), tmp_path / "missing.py", FakeDomain().load("t", 1), backend)
    with pytest.raises(ValueError, match=r"norun.py:1: no top-level function run; define run\(task, llm, tools\)"):
        check_harness(write(tmp_path, "norun.py", "X = 1\n"))
    with pytest.raises(ValueError, match=r"syntax.py:3: syntax error: .*fix the harness"):
        check_harness(write(tmp_path, "syntax.py", "X = 1\n\ndef run(task, llm, tools)\n    pass\n"))
    with pytest.raises(ValueError, match=r"imports.py:2: imports 'os'; a harness may import only re, json"):
        check_harness(write(tmp_path, "imports.py", "import re\nimport os\ndef run(t, l, x): pass\n"))


def test_mean_at_k_is_per_task_success_rate_averaged(backend, tmp_path):
    path = write(tmp_path, "half.py", '''"""Right on even tasks only."""
def run(task, llm, tools):
    tools.lookup("x")
    return {"answer": "passage about " + task["question"] if task["question"] in ("q0", "q2") else "no"}
''')
    stats = rollout.evaluate(FakeDomain(), path, FakeDomain().load("test", n=4), backend, k=3)
    assert stats["mean_at_k"] == 0.5 and stats["k"] == 3 and stats["rollouts"] == 12
    assert stats["per_task"] == {"t0": 1.0, "t1": 0.0, "t2": 1.0, "t3": 0.0}
    assert stats["mean_turns"] == 0 and stats["errors"] == 0


@pytest.mark.parametrize("name", list(domains.DOMAINS))
def test_real_h0_harness_runs_on_smoke(backend, name):
    domains = pytest.importorskip("domains")
    domain = domains.get(name)
    path = Path(__file__).resolve().parents[1] / "harnesses" / f"{name}.py"
    eps = rollout.run_episodes(domain, path, domain.load("test")[:1], backend, max_new_tokens=8, deadline_s=60)
    assert len(eps) == 1
    for e in eps:
        assert e["error"] is None, e["error"]
        assert e["turns"] >= 1 and e["reward"] in (0.0, 1.0)


class ScriptedBackend:
    """Every row gets the ids of one fixed text (it honours no stop string); records what it was asked."""

    def __init__(self, tokenizer, text):
        self.tokenizer, self.ids, self.asked = tokenizer, tokenizer.encode(text, add_special_tokens=False), []

    def generate(self, prompts, *, temperature, top_k, max_new_tokens, seeds, stop=None):
        self.asked.append({"caps": max_new_tokens, "stop": stop})
        return [list(self.ids) for _ in prompts]


STOPS = '''"""Three calls: one stop string, two (the first to complete wins), none."""
def run(task, llm, tools):
    m = [{"role": "user", "content": "q"}]
    return {"answer": [llm(m, max_tokens=5, stop="</search>"), llm(m, stop=["</answer>", "</search>"]), llm(m)]}
'''


def test_stop_strings_end_the_reply_and_reach_the_backend(backend, tmp_path):
    text = "<search>x</search><information>INVENTED</information><answer>y</answer>"
    fake = ScriptedBackend(backend.tokenizer, text)
    ep = rollout.run_episodes(FakeDomain(), write(tmp_path, "stops.py", STOPS), FakeDomain().load("t", 1), fake,
                              max_new_tokens=7)[0]
    assert ep["error"] is None
    assert ep["answer"] == ["<search>x</search>", "<search>x</search>", text]
    assert [c["completion"] for c in ep["calls"]] == ep["answer"]
    assert all(c["completion_ids"] == fake.ids for c in ep["calls"])  # recorded exactly as the backend returned
    assert fake.asked == [{"caps": [5], "stop": [["</search>"]]}, {"caps": [7], "stop": [["</answer>", "</search>"]]},
                          {"caps": [7], "stop": None}]
    assert runner.cut_at_stop("ab</a>cd", ["d", "</a>"]) == "ab</a>" and runner.cut_at_stop("abc", None) == "abc"


BAD_REQUESTS = '''"""'polite' asks through llm() with bad arguments; 'forged' writes a bad stop list to the pipe itself."""
import random
def run(task, llm, tools):
    m = [{"role": "user", "content": "q"}]
    if task["question"] == "forged":
        random._os.write(int(random._os.sys.argv[2]), b'{"llm": [{"role": "user", "content": "q"}], "max_tokens": 3, '
                         b'"stop": ["a", "b", "c", "d", "e"]}' + bytes([10]))
        llm(m)
    refused = []
    for kw in ({"stop": ["a"] * 5}, {"stop": ""}, {"stop": "x" * 33}, {"stop": [1]}, {"max_tokens": 0},
               {"max_tokens": True}, {"max_tokens": 2.0}):
        try:
            llm(m, **kw)
        except TypeError:
            refused.append(sorted(kw)[0])
    return {"answer": refused}
'''


def test_bad_stop_and_max_tokens_are_refused_by_the_worker_and_the_parent(backend, tmp_path):
    fake = ScriptedBackend(backend.tokenizer, "ok")
    tasks = [{"id": q, "question": q, "answer": None} for q in ("polite", "forged")]
    by = {e["task_id"]: e for e in rollout.run_episodes(FakeDomain(), write(tmp_path, "bad.py", BAD_REQUESTS), tasks,
                                                        fake)}
    assert by["polite"]["answer"] == ["stop"] * 4 + ["max_tokens"] * 3 and by["polite"]["turns"] == 0
    assert "protocol violation" in by["forged"]["error"] and "stop" in by["forged"]["error"]
    assert fake.asked == []  # no bad request reached the backend
    with pytest.raises(ValueError, match="max_tokens must be None or an int >= 1"):
        runner.llm_request({"llm": [{"role": "user", "content": "q"}], "max_tokens": 0}, 8)
    with pytest.raises(ValueError, match="messages must be"):
        runner.llm_request({"llm": [{"role": "function", "content": "q"}]}, 8)
    assert runner.llm_request({"llm": [{"role": "user", "content": "q"}], "max_tokens": 99, "stop": "</a>"}, 8) == \
        ([{"role": "user", "content": "q"}], 8, ["</a>"], None)


def test_same_prompt_twice_in_one_batch_gets_different_rollouts(backend, tmp_path):
    path = write(tmp_path, "twice.py", '''"""Samples from the model and from its own random."""
import random
def run(task, llm, tools):
    return {"answer": [llm([{"role": "user", "content": task["question"]}], max_tokens=8), random.random()]}
''')
    task = FakeDomain().load("t", 1)[0]
    eps = rollout.run_episodes(FakeDomain(), path, [task, task], backend, max_new_tokens=8)
    assert eps[0]["calls"][0]["prompt_ids"] == eps[1]["calls"][0]["prompt_ids"]
    assert eps[0]["calls"][0]["completion_ids"] != eps[1]["calls"][0]["completion_ids"]
    assert eps[0]["answer"][1] != eps[1]["answer"][1]
    again = rollout.run_episodes(FakeDomain(), path, [task, task], backend, max_new_tokens=8)
    assert [e["answer"] for e in again] == [e["answer"] for e in eps]  # and both stay reproducible


def test_the_pool_raises_the_open_file_limit_and_serves_descriptors_past_1023():
    """A process started with a soft limit of 256 under a higher hard one: the pool's first order raises the
    soft limit to the hard one, and a worker whose pipes lie above 1,023 (past select's reach) still becomes
    ready through wait_ready."""
    code = """if True:
        import os, resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        from lib.episodes import worker_pool
        pool = worker_pool.Pool()
        pool.order(1)
        pool.wait_ready()  # its start closes the child's pipe ends: once held is open, they would free fds below 1,024
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # the next pipes open above 1,023
        pool.order(1)
        pool.wait_ready()
        want = worker_pool.NR_OPEN if hard == resource.RLIM_INFINITY else hard
        print(resource.getrlimit(resource.RLIMIT_NOFILE)[0] == want, [w.ready for w in pool.idle],
              max(w.rfd for w in pool.idle) > 1023)
        print(pool.errors)  # a start the kernel refused (a loaded machine), to read when this fails
        pool.close()
    """
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[:1] == ["True [True, True] True"], done.stdout + done.stderr[-2000:]


def test_pool_keeps_warm_workers_across_calls_and_uses_each_once(backend, tmp_path):
    path = write(tmp_path, "good.py", GOOD)
    tasks = FakeDomain().load("t", 3)
    rollout.run_episodes(FakeDomain(), path, tasks, backend, max_new_tokens=2, workers=3)
    worker_pool.POOL.wait_ready()  # the replacements start in the background
    warm = worker_pool.POOL.idle[:3]
    assert len(warm) == 3 and all(w.proc.poll() is None for w in warm)
    eps = rollout.run_episodes(FakeDomain(), path, tasks, backend, max_new_tokens=2, workers=3)
    assert [e["reward"] for e in eps] == [1.0] * 3
    assert all(w.proc.poll() is not None for w in warm)  # each served its one episode; its sandbox was killed
    worker_pool.POOL.wait_ready()
    assert len(worker_pool.POOL.idle) >= 3 and not set(map(id, warm)) & set(map(id, worker_pool.POOL.idle))
    dead = worker_pool.POOL.idle[0]  # a warm worker killed from outside is dropped, not handed an episode
    os.kill(dead.proc.pid, signal.SIGKILL)
    dead.proc.wait()
    eps = rollout.run_episodes(FakeDomain(), path, tasks, backend, max_new_tokens=2, workers=3)
    assert [e["reward"] for e in eps] == [1.0] * 3 and dead not in worker_pool.POOL.idle


def test_generate_with_a_cap_below_one_returns_empty_rows(backend):
    p = chat_ids(backend.tokenizer, [{"role": "user", "content": "hello"}])
    assert backend.generate([p], max_new_tokens=0) == [[]]
    out = backend.generate([p, p], max_new_tokens=[0, 3], seeds=[1, 2])
    assert out[0] == [] and len(out[1]) == 3


def test_a_harness_may_import_every_allowed_module_and_gets_a_readable_traceback(backend, tmp_path):
    path = write(tmp_path, "imports.py", f'''"""Imports the whole allowlist, then fails on line 5."""
import {", ".join(ALLOWED_IMPORTS)}
from collections import Counter
def run(task, llm, tools):
    raise ValueError(textwrap.shorten("all " + str(len(Counter("abc"))) + " imported", 40))
''')
    ep = rollout.run_episodes(FakeDomain(), path, FakeDomain().load("t", 1), backend)[0]
    assert "ValueError: all 3 imported" in ep["error"]
    assert 'imports.py", line 5, in run' in ep["error"] and "raise ValueError" in ep["error"]


# -----------------------------------------------------------------------------
# the error budget: episodes lost outside the harness's own code

SEARCHES = '''"""One search, its failure caught as the paper's searchqa harness catches it ("Search error: ...")."""
def run(task, llm, tools):
    try:
        return {"answer": tools.search(task["question"], 1)}
    except Exception as e:
        return {"answer": f"Search error: {e}"}
'''


class RetrieverDomain(FakeDomain):
    """searchqa's real wiki search tool, through a retrieval server at `url`: by default one that refuses every
    connection (port 9). Its retry is sent at once."""
    TOOL_METHODS = ("search",)

    def __init__(self, url="http://127.0.0.1:9/retrieve"):
        self.url = url

    def tools(self, task):
        return domains.WikiSearchTools(retriever.RetrieverClient(self.url, timeout=5, retry_wait=0))


@pytest.fixture
def lone_pool(monkeypatch):
    """A pool of its own, so the test's starts are not served by warm workers of earlier tests."""
    pool = worker_pool.Pool()
    monkeypatch.setattr(runner, "POOL", pool)
    yield pool
    pool.close()


def failing_starts(monkeypatch, pool, n):
    """The first n sandbox starts of `pool` fail as a kernel out of processes would (EAGAIN); the rest, and the
    starts of the shared pool, which may still be replacing an earlier test's workers, start as usual."""
    real, failed = sandbox.start_once, []

    def start_once(*args, **kw):
        if threading.current_thread() is pool.thread and len(failed) < n:
            failed.append(1)
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        return real(*args, **kw)
    monkeypatch.setattr(sandbox, "start_once", start_once)


def test_a_worker_that_cannot_start_is_an_infrastructure_failure(backend, tmp_path, monkeypatch, lone_pool):
    monkeypatch.setattr(rollout.INFRA_ERRORS, "share", 1.0)  # counted, not stopped: the next test stops a run
    failing_starts(monkeypatch, lone_pool, 2)  # the first start and its retry
    retries = sandbox.start_retries
    eps = rollout.run_episodes(FakeDomain(), write(tmp_path, "good.py", GOOD), FakeDomain().load("t", 3), backend,
                               max_new_tokens=2, workers=1)
    lost = [e for e in eps if e["error"]]
    assert len(lost) == 1 and lost[0]["error"].startswith("infrastructure: a harness worker could not start: "
                                                          "[Errno 11] Resource temporarily unavailable")
    assert lost[0]["reward"] == 0.0 and [e["reward"] for e in eps if not e["error"]] == [1.0, 1.0]
    assert rollout.INFRA_ERRORS.counts() == {"infra_failures": 1, "start_retries": 1} and sandbox.start_retries == retries + 1


def test_a_start_that_fails_once_is_retried_and_counted(backend, tmp_path, monkeypatch, lone_pool):
    failing_starts(monkeypatch, lone_pool, 1)
    eps = rollout.run_episodes(FakeDomain(), write(tmp_path, "good.py", GOOD), FakeDomain().load("t", 2), backend,
                               max_new_tokens=2, workers=1)
    assert [e["reward"] for e in eps] == [1.0, 1.0]
    assert rollout.INFRA_ERRORS.counts() == {"infra_failures": 0, "start_retries": 1}


def test_a_tool_server_that_refuses_is_an_infrastructure_failure(backend, tmp_path, monkeypatch):
    monkeypatch.setattr(rollout.INFRA_ERRORS, "share", 1.0)
    eps = rollout.run_episodes(RetrieverDomain(), write(tmp_path, "search.py", SEARCHES), FakeDomain().load("t", 2),
                               backend, max_new_tokens=2)
    # the harness never saw a "Search error" to score: the episode ended as the machine's failure
    assert all(e["error"].startswith("infrastructure: tools.search: retrieval server http://127.0.0.1:9/retrieve "
                                     "failed") and e["answer"] is None and e["reward"] == 0.0 for e in eps), eps
    assert rollout.INFRA_ERRORS.counts()["infra_failures"] == 2


def test_a_malformed_retriever_reply_is_an_infrastructure_failure(backend, tmp_path, monkeypatch):
    """A server that answers, but not as Search-R1's does (here one hit list for every batch of queries): the
    episode is the machine's failure, counted by the budget, never a "Search error" for the harness to read."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps({"result": [[{"document": {"contents": '"A"\nb'}}]] * 5}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(rollout.INFRA_ERRORS, "share", 1.0)
    try:
        url = f"http://127.0.0.1:{server.server_port}/retrieve"
        eps = rollout.run_episodes(RetrieverDomain(url), write(tmp_path, "search.py", SEARCHES),
                                   FakeDomain().load("t", 2), backend, max_new_tokens=2)
    finally:
        server.shutdown()
    assert all(e["error"].startswith(f"infrastructure: tools.search: retrieval server {url} sent a malformed "
                                     "reply (ValueError: 5 hit lists for 1 queries)") and e["reward"] == 0.0
               for e in eps), eps
    assert rollout.INFRA_ERRORS.counts()["infra_failures"] == 2


def test_a_phase_over_the_budget_stops_the_run_with_one_line(backend, tmp_path):
    rollout.INFRA_ERRORS.start_phase("phase 3 (weight)")
    rollout.INFRA_ERRORS.add(40, [])  # earlier calls of the phase: 40 episodes, none lost
    with pytest.raises(SystemExit) as stop, one_line_errors("whale.py"):
        rollout.run_episodes(RetrieverDomain(), write(tmp_path, "search.py", SEARCHES), FakeDomain().load("t", 3),
                             backend, max_new_tokens=2)
    line = str(stop.value)
    assert "\n" not in line and line.startswith("whale.py: error: 3 of 43 episodes of phase 3 (weight) failed outside "
                                                "the harness, over --infra-budget 0.05; the last: tools.search: "
                                                "retrieval server http://127.0.0.1:9/retrieve failed"), line


def test_a_harness_that_raises_is_its_own_failure_and_costs_no_budget(backend, tmp_path):
    raises = 'def run(task, llm, tools):\n    raise ValueError("boom")\n'
    eps = rollout.run_episodes(FakeDomain(), write(tmp_path, "raises.py", raises), FakeDomain().load("t", 4), backend,
                               max_new_tokens=2)
    assert all("ValueError: boom" in e["error"] and not e["error"].startswith("infrastructure")
               and e["reward"] == 0.0 for e in eps)
    assert rollout.INFRA_ERRORS.counts()["infra_failures"] == 0 and rollout.INFRA_ERRORS.episodes == 4  # under the 5 %: no stop


class AlwaysBackend:
    """Every call samples the same short reply."""

    def __init__(self, tokenizer, text="ok"):
        self.tokenizer, self.ids = tokenizer, tokenizer.encode(text, add_special_tokens=False)

    def generate(self, prompts, **kw):
        return [list(self.ids) for _ in prompts]


class MathNamedDomain(FakeDomain):
    name, MODEL_CALLS = "math", domains.Math.MODEL_CALLS

    def reward(self, task, answer, tools):
        return float(answer == "ok")


class LooseDomain(MathNamedDomain):
    """A domain whose cap on model calls is past what the harness below asks."""
    MODEL_CALLS = 24


GREEDY = '''"""Asks for more model calls than any cap; answers with the last non-empty reply, as the paper h0s do."""
def run(task, llm, tools):
    answer, replies = None, 0
    for _ in range(ASKS):
        reply = llm([{"role": "user", "content": task["question"]}])
        if reply:
            answer, replies = reply, replies + 1
    return {"answer": answer, "replies": replies}
'''


def test_a_harness_asking_for_more_model_calls_than_the_cap_ends_at_it(backend, tmp_path):
    """searchqa and math: 16 model calls; the 17th request and later get '' without sampling, so the harness ends
    and is scored on what it has; past MAX_LLM_CALLS requests llm() raises (a harness cannot spin on '')."""
    assert [(d.MODEL_CALLS, d.MAX_RETRIES) for d in (domains.SearchQA, domains.Math, domains.Chess)] == [
        (16, None), (16, None), (18, 10)]
    scripted = AlwaysBackend(backend.tokenizer)
    [ep] = rollout.run_episodes(MathNamedDomain(), write(tmp_path, "greedy.py", "ASKS = 20\n" + GREEDY),
                                MathNamedDomain().load("t", n=1), scripted)
    assert (ep["turns"], ep["capped"], ep["error"], ep["reward"]) == (16, True, None, 1.0)
    [ep] = rollout.run_episodes(MathNamedDomain(), write(tmp_path, "spin.py", "ASKS = 40\n" + GREEDY),
                                MathNamedDomain().load("t", n=1), scripted)
    assert ep["turns"] == 16 and f"llm() call limit {runner.MAX_LLM_CALLS} reached" in ep["error"]
    [ep] = rollout.run_episodes(LooseDomain(), write(tmp_path, "other.py", "ASKS = 20\n" + GREEDY),
                                LooseDomain().load("t", n=1), scripted)  # the cap is the domain's own
    assert ep["turns"] == 20 and not ep["capped"]


RETRYING = '''"""Never gives a legal move: per call, no move (a format failure) or one that is not legal here."""
def run(task, llm, tools):
    illegal = [m for m in ("a1a2", "a2a1", "h1h2", "h2h1") if m not in task["legal_uci"]][0]
    for i in range(40):
        if not llm([{"role": "user", "content": "Your move?"}]):
            return {"answer": None}
        if KINDS[i % len(KINDS)] == "illegal":
            tools.move(illegal)
    return {"answer": None}
'''


@pytest.mark.parametrize("kinds, turns", [(["illegal"], 11), (["format"], 11), (["format", "illegal"], 18)])
def test_a_chess_puzzle_ends_at_10_retries_of_a_kind_or_18_model_calls(backend, tmp_path, kinds, turns):
    import domains
    chess = domains.get("chess")
    path = write(tmp_path, "retrying.py", f"KINDS = {kinds!r}\n" + RETRYING)
    [ep] = rollout.run_episodes(chess, path, chess.load("test")[:1], AlwaysBackend(backend.tokenizer))
    assert (ep["turns"], ep["capped"], ep["error"], ep["reward"]) == (turns, True, None, 0.0)
