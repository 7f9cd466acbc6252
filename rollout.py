"""
The batched, sandboxed episode runner and mean@k evaluation (models and backends: engines.py).

    python rollout.py --domain chess --harness harnesses/chess.py --model smoke --split test --k 8 --limit 4 --out out/eval
    python rollout.py --domain searchqa --harness harnesses/searchqa.py --model cpu --k 2 --limit 4 --out out/sq
    python rollout.py --bench --model smoke      # prints `prefix speedup = X` (shared prefill) and `ratio = X` (runner)

Algorithm. A harness is untrusted Python: `run(task, llm, tools)`. Each episode runs it in its own worker
(worker.py) inside the OS sandbox (sandbox.py: bubblewrap, no project folder, no data, no other process, no
network, and a seccomp filter that allows no second process), so it holds no answers and no hidden tool
state. The worker talks JSON lines over its own pipes: it asks for `llm(messages, max_tokens, stop)` or a
tool call and waits for the reply. The parent process holds the tasks, the tools and the model; it checks
every request, answers tool calls from a thread pool and collects the llm() requests of all episodes, and
when every live episode is waiting (or the rest are busy for a while) it samples them all in ONE batched
`backend.generate` call. It records the exact prompt and completion token ids of every call, and cuts the
reply text after the first stop string. When an episode ends (done, error, its deadline, a forged request:
reward 0, error in the trace) its sandbox is killed with every process and thread in it, and a fresh one
starts in its place: every episode gets a fresh interpreter. Started sandboxes wait in a pool across calls,
so an episode rarely waits for one. Memory: the workers of a run share one budget (WORKER_MEMORY_SHARE of
the machine's RAM, split as each worker's RLIMIT_AS). A worker's stdout is capped; it writes no files.
Seeds: each call's sampling seed and the harness's `random` seed come from (--seed, the episode's index,
task id, sample, call number): the same prompt twice in one batch gets two rollouts, a rerun the same ones.
The parent computes the reward from the returned answer. mean@k = per-task success rate over k samples,
averaged over tasks.
"""
import argparse
import ast
import atexit
import hashlib
import json
import os
import queue
import select
import selectors
import subprocess
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

import sandbox
from lib.cli import Parser, nonnegative_float, nonnegative_int, positive_float, positive_int  # noqa: F401 (moving)
from engines import HFBackend, add_backend_args, chat_ids, load_backend, load_model


# -----------------------------------------------------------------------------
# sampling flags, shared by every script that runs episodes

def add_sampling_args(p):
    """Sampling and runner flags, shared by every script that runs episodes."""
    # sampling (paper: temperature 1.0, top-k 20) and the runner
    p.add_argument("--temperature", type=nonnegative_float, default=1.0, help="0 = greedy")
    p.add_argument("--top-k", type=nonnegative_int, default=20, help="0 = off")
    p.add_argument("--max-new-tokens", type=positive_int, default=256, help="cap per llm() call")
    p.add_argument("--deadline", type=positive_float, default=120.0, help="seconds of harness time per episode")
    p.add_argument("--workers", type=positive_int, default=None, help="concurrent episodes (default min(64, episodes))")
    sandbox.add_args(p)


# -----------------------------------------------------------------------------
# harness checks (in the parent, before any worker starts)

ALLOWED_IMPORTS = ("re", "json", "math", "random", "string", "collections", "itertools", "functools", "textwrap",
                   "dataclasses", "typing")


def check_harness(path):
    """-> the harness source; raises FileNotFoundError / ValueError naming the file, the line and the fix."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such harness file; pass an existing .py file such as harnesses/chess.py")
    source = path.read_text()
    try:
        tree = ast.parse(source, str(path))
    except SyntaxError as e:
        raise ValueError(f"{path}:{e.lineno}: syntax error: {e.msg}; fix the harness so that it compiles") from None
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or "."] if isinstance(node, ast.ImportFrom) and node.level == 0 else \
            ["."] if isinstance(node, ast.ImportFrom) else []
        bad = [n for n in names if n.split(".")[0] not in ALLOWED_IMPORTS]
        if bad:
            raise ValueError(f"{path}:{node.lineno}: imports {bad[0]!r}; a harness may import only "
                             f"{', '.join(ALLOWED_IMPORTS)}")
    if not any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body):
        raise ValueError(f"{path}:1: no top-level function run; define run(task, llm, tools) returning "
                         "{'answer': ...}")
    return source


# -----------------------------------------------------------------------------
# workers: worker.py inside the OS sandbox, one episode each, kept warm in a pool across calls

WORKER_PY = str(Path(__file__).resolve().with_name("worker.py"))
WORKER_MEMORY_SHARE = 0.25  # of the machine's RAM: one budget for all concurrent harness workers together
WORKER_MEMORY_MAX = 2 << 30  # per worker, however few run at once


def worker_memory_bytes(n_workers):
    """Each worker's RLIMIT_AS: the budget split over the run's concurrent workers. The no-fork filter keeps a
    sandbox to one process, so the workers together never pass the budget (idle warm workers run no harness
    code: about 10 MB each)."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(WORKER_MEMORY_MAX, int(ram * WORKER_MEMORY_SHARE) // max(n_workers, 1))


class Worker:
    """worker.py in a fresh sandbox (bwrap: no project, no data, no other process, no network; no fork). It
    serves exactly one episode, so no state carries over; killing bwrap ends every process and thread of it."""

    def __init__(self):
        p2w_r, self.wfd = os.pipe()
        self.rfd, w2p_w = os.pipe()
        self.stderr = tempfile.TemporaryFile()  # start-up errors (bwrap's, the interpreter's); RLIMIT_FSIZE=0 later
        try:
            # no start_new_session: it costs the vfork fast path (a plain fork of a parent holding a model is
            # slow), and killing bwrap reaches everything inside anyway
            self.proc = sandbox.start_one_process(
                [sandbox.python(), "-I", "-S", WORKER_PY, str(p2w_r), str(w2p_w)], files=[WORKER_PY],
                pass_fds=(p2w_r, w2p_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr)
        finally:
            for fd in (p2w_r, w2p_w):
                os.close(fd)
        os.set_blocking(self.wfd, False)
        self.inbuf, self.outbuf, self.ready, self.episode = b"", b"", False, None

    def startup_error(self):
        self.stderr.seek(0)
        return self.stderr.read(4000).decode(errors="replace")[-2000:]

    def kill(self):
        self.proc.kill()  # SIGKILL to bwrap: its pid namespace takes every process and thread inside along
        self.proc.wait()
        for fd in (self.rfd, self.wfd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.stderr.close()


class Pool:
    """Started sandboxed workers kept across run_episodes calls. A background thread starts them, so the event
    loop never waits on a start; a run takes them as it needs them, and orders a fresh one for every worker
    whose episode ended, which then waits here for the next episode or the next call."""

    def __init__(self):
        self.idle, self.errors, self.pending = [], [], 0
        self.lock, self.orders, self.thread = threading.Lock(), queue.SimpleQueue(), None
        self.notify = None  # the running Runner's wake-up, called after every start

    def order(self, n):
        """Start n more workers in the background. The thread lives as long as the process: bwrap's
        --die-with-parent follows the thread that started it, so a short-lived thread would take them along."""
        with self.lock:
            self.pending += max(n, 0)
            if self.thread is None:
                self.thread = threading.Thread(target=self.start_workers, name="whale-sandboxes", daemon=True)
                self.thread.start()
        for _ in range(n):
            self.orders.put(None)

    def start_workers(self):
        while True:
            self.orders.get()
            try:
                w = Worker()
            except Exception as e:  # raised again in the runner's thread, by take()
                w = e
            with self.lock:
                self.pending -= 1
                (self.errors if isinstance(w, Exception) else self.idle).append(w)
            notify = self.notify
            if notify:
                notify()

    def supply(self):
        with self.lock:
            return len(self.idle) + self.pending

    def take(self, n):
        """Up to n started workers, without waiting; warm ones that died while idle are replaced."""
        with self.lock:
            if self.errors:
                raise RuntimeError(f"a harness worker could not start: {self.errors.pop()}")
            dead = [w for w in self.idle if w.proc.poll() is not None]
            alive = [w for w in self.idle if w not in dead]
            taken, self.idle = alive[:n], alive[n:]
        for w in dead:
            w.kill()
        self.order(len(dead))
        return taken

    def put(self, workers):
        with self.lock:
            self.idle = workers + self.idle

    def warm(self, n):
        """At least n started workers, ready (the bench's steady state: as after a run's first call)."""
        self.order(n - self.supply())
        self.wait_ready()

    def wait_ready(self, timeout_s=60.0):
        """Block until every ordered worker has started and said it is ready (the bench charges that wait to
        the runner)."""
        end = time.time() + timeout_s
        while self.pending and time.time() < end:
            time.sleep(0.002)
        for w in list(self.idle):
            while not w.ready and b"\n" not in w.inbuf and select.select([w.rfd], [], [], max(end - time.time(), 0))[0]:
                chunk = os.read(w.rfd, 4096)
                w.inbuf += chunk
                if not chunk:
                    break
            if not w.ready and b"\n" in w.inbuf:
                line, w.inbuf = w.inbuf.split(b"\n", 1)
                w.ready = line == b'{"ready": true}'

    def close(self):
        with self.lock:
            idle, self.idle = self.idle, []
        for w in idle:
            w.kill()


POOL = Pool()
atexit.register(POOL.close)

# -----------------------------------------------------------------------------
# the runner: parent side

MAX_LLM_CALLS = 32        # per episode
MAX_TOOL_CALLS = 64       # per episode
MAX_CHARS = 32_000        # per message content, tool result, error text
MAX_MESSAGES = 256        # per llm() call
MAX_LINE = 4_000_000      # one JSON message from a worker
STDOUT_KEEP = 10_000      # printed characters kept in the trace
MAX_PROMPT_TOKENS = 8192
MAX_STOPS, MAX_STOP_CHARS = 4, 32
BATCH_WAIT_S = 0.1        # least time a busy episode may hold back a batch (see Runner.hold_s)


def call_seed(*parts):
    return int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest(), "big") >> 2


def exception_reply(e):
    name = type(e).__name__ if type(e).__module__ == "builtins" else "RuntimeError"
    return {"raise": name, "message": f"{type(e).__name__}: {e}"[:MAX_CHARS]}


def llm_request(msg, max_new_tokens):
    """-> (messages, token cap, stop list or None) from a worker's llm request, checked in full: the worker's
    own checks are a courtesy that harness code can skip. Raises ValueError on a forged request."""
    messages, max_tokens, stop = msg["llm"], msg.get("max_tokens"), msg.get("stop")
    if set(msg) - {"llm", "max_tokens", "stop"}:
        raise ValueError(f"unknown keys {sorted(set(msg) - {'llm', 'max_tokens', 'stop'})}")
    if not (isinstance(messages, list) and 1 <= len(messages) <= MAX_MESSAGES and all(
            isinstance(m, dict) and set(m) == {"role", "content"} and m["role"] in ("system", "user", "assistant")
            and isinstance(m["content"], str) and len(m["content"]) <= MAX_CHARS for m in messages)):
        raise ValueError(f"llm messages must be 1 to {MAX_MESSAGES} {{role, content}} dicts of at most "
                         f"{MAX_CHARS} characters")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise ValueError(f"llm max_tokens must be None or an int >= 1, not {max_tokens!r}"[:200])
    stop = [stop] if isinstance(stop, str) else stop
    if stop is not None and not (isinstance(stop, list) and len(stop) <= MAX_STOPS and all(
            isinstance(s, str) and 1 <= len(s) <= MAX_STOP_CHARS for s in stop)):
        raise ValueError(f"llm stop must be None, a string or a list of at most {MAX_STOPS} non-empty strings of "
                         f"at most {MAX_STOP_CHARS} characters")
    return messages, max_new_tokens if max_tokens is None else min(max_new_tokens, max_tokens), stop or None


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


class Episode:
    def __init__(self, index, task, sample, public):
        self.index, self.task, self.sample, self.public = index, task, sample, public
        self.calls, self.tool_calls, self.record = [], [], None
        self.tools = self.request = self.future = None
        self.state, self.start, self.since, self.waited = "todo", 0.0, 0.0, 0.0

    def harness_seconds(self, now):
        """Wall time charged to the harness: model time is the runner's, so it is not counted (nor, for the
        episodes outside a batch, the time the parent spent generating and could not answer them)."""
        return now - self.start - self.waited - (now - self.since if self.state == "llm" else 0.0)


class Runner:
    """The parent's event loop over worker pipes, tool threads and batched generation."""

    def __init__(self, domain, harness_path, backend, *, temperature, top_k, max_new_tokens, deadline_s, workers,
                 seed):
        sandbox.check()  # once per process: fails closed, naming --unsafe-no-sandbox
        self.source = check_harness(harness_path)
        self.domain, self.path, self.backend, self.seed = domain, str(harness_path), backend, seed
        self.gen_kw = dict(temperature=temperature, top_k=top_k)
        self.max_new_tokens, self.deadline_s, self.n_workers = max_new_tokens, deadline_s, workers
        self.generate_calls = self.llm_calls = 0
        self.generate_s = 0.0
        self.last_generate_s = 10.0  # before the first call: let freshly started episodes hold a batch for 1 s

    # -- workers
    def watch(self, w):
        self.workers.append(w)
        self.sel.register(w.rfd, selectors.EVENT_READ, w)
        self.flush(w)

    def retire(self, w):
        """A worker's episode is over (or it died): kill its sandbox and order a fresh one in its place."""
        self.unwatch(w)
        self.workers.remove(w)
        w.kill()
        POOL.order(1)

    def refill(self):
        """Take started workers from the pool while episodes wait and slots are free."""
        if self.todo and len(self.workers) < self.n_workers:
            for w in POOL.take(min(self.n_workers - len(self.workers), len(self.todo))):
                self.watch(w)

    def unwatch(self, w):
        for fd in (w.rfd, w.wfd):
            if fd in self.sel.get_map():
                self.sel.unregister(fd)

    def send(self, w, msg):
        w.outbuf += (json.dumps(msg) + "\n").encode()
        self.flush(w)

    def flush(self, w):
        """Non-blocking writes: a harness that stops reading its pipe must not stall the parent."""
        try:
            n = os.write(w.wfd, w.outbuf) if w.outbuf else 0
            w.outbuf = w.outbuf[n:]
        except BlockingIOError:
            pass
        except OSError:
            w.outbuf = b""  # the worker is gone; its EOF is handled on the read side
        watched = w.wfd in self.sel.get_map()
        if w.outbuf and not watched:
            self.sel.register(w.wfd, selectors.EVENT_WRITE, w)
        elif watched and not w.outbuf:
            self.sel.unregister(w.wfd)

    # -- episodes
    def dispatch(self, now):
        for w in self.workers:
            if w.ready and w.episode is None and self.todo:
                ep = self.todo.popleft()
                ep.tools = self.domain.tools(ep.task)
                ep.state, ep.start, ep.since = "busy", now, now
                w.episode, ep.worker = ep, w
                self.running.add(ep)
                self.send(w, {"source": self.source, "path": self.path, "methods": list(self.domain.TOOL_METHODS),
                              "task": ep.public, "seed": call_seed(self.seed, ep.index, ep.task["id"], ep.sample,
                                                                   "random"),
                              "memory_bytes": self.memory_bytes, "allowed": list(ALLOWED_IMPORTS),
                              "max_chars": MAX_CHARS, "max_line": MAX_LINE, "stdout_keep": STDOUT_KEEP})

    def finish(self, ep, error=None, stdout="", result=None):
        if ep.state == "done":
            return
        now = time.time()
        reward, answer = 0.0, None
        if error is None and not (isinstance(result, dict) and "answer" in result):
            error = f"run() returned {json.dumps(result)[:200]}, expected a dict with an 'answer' key"
        if error is None:
            answer = result["answer"]
            try:
                reward = float(self.domain.reward(ep.task, answer, ep.tools))
            except Exception as e:  # the domain promises not to raise; keep the run alive if it does
                error = f"reward failed: {type(e).__name__}: {e}"
        ep.record = {"task_id": ep.task["id"], "sample": ep.sample, "reward": reward, "answer": answer,
                     "error": error, "turns": len(ep.calls), "tokens": sum(len(c["completion_ids"]) for c in ep.calls),
                     "seconds": round(now - ep.start, 3), "calls": ep.calls, "tool_calls": ep.tool_calls,
                     "stdout": stdout}
        ep.state = "done"
        self.running.discard(ep)
        self.bar.update(1)

    def fail(self, ep, error, w):
        """A harness broke a rule or ran out of time: the episode scores 0 and its sandbox is replaced."""
        self.finish(ep, error=error)
        self.retire(w)

    def on_message(self, w, msg, now):
        ep = w.episode
        if not w.ready:
            w.ready = msg.get("ready") is True
            return
        if ep is None or ep.state != "busy":
            return self.fail(ep, "protocol violation: a message while not running", w) if ep else self.retire(w)
        if "done" in msg or "error" in msg:
            stdout = str(msg.get("stdout", ""))[:STDOUT_KEEP + 100]
            if "error" in msg:
                self.finish(ep, error=str(msg["error"])[:MAX_CHARS], stdout=stdout)
            else:
                self.finish(ep, result=msg["done"], stdout=stdout)
            return self.retire(w)  # one episode per sandbox: nothing it left behind reaches the next one
        if "llm" in msg:
            messages, cap, stop = llm_request(msg, self.max_new_tokens)
            if len(ep.calls) >= MAX_LLM_CALLS:
                return self.send(w, {"raise": "RuntimeError", "message": f"llm() call limit {MAX_LLM_CALLS} reached"})
            try:
                ids = chat_ids(self.backend.tokenizer, messages)
            except Exception as e:
                return self.send(w, exception_reply(e))
            if len(ids) > MAX_PROMPT_TOKENS:
                return self.send(w, {"raise": "ValueError",
                                     "message": f"prompt of {len(ids)} tokens; the limit is {MAX_PROMPT_TOKENS}"})
            ep.request, ep.state, ep.since = (messages, ids, cap, stop), "llm", now
            self.llm_calls += 1
        elif "tool" in msg:
            name, args, kwargs = tool_request(msg, self.domain.TOOL_METHODS)
            if len(ep.tool_calls) >= MAX_TOOL_CALLS:
                return self.send(w, {"raise": "RuntimeError", "message": f"tool call limit {MAX_TOOL_CALLS} reached"})
            ep.tool_calls.append({"name": name, "args": args, "kwargs": kwargs, "result": None})
            ep.state, ep.since = "tool", now
            ep.future = self.pool.submit(getattr(ep.tools, name), *args, **kwargs)
            ep.future.add_done_callback(self.wake)
        else:
            raise ValueError(f"unknown message {str(msg)[:200]}")

    def on_tool_done(self, ep, now):
        try:
            value = ep.future.result()
            line = json.dumps(value)
            reply = {"value": value} if len(line) <= MAX_LINE else {"raise": "RuntimeError",
                                                                   "message": "tool result too large"}
        except Exception as e:
            reply = exception_reply(e)
        ep.tool_calls[-1]["result"] = reply.get("value", reply.get("message"))
        ep.state, ep.since, ep.future = "busy", now, None
        self.send(ep.worker, reply)

    def wake(self, future):
        """Tool threads wake the selector; the lock keeps a late tool from writing to a closed (reused) fd."""
        with self.wake_lock:
            if self.wake_w is not None:
                os.write(self.wake_w, b".")

    def hold_s(self):
        """How long a busy episode may hold back a batch: a tenth of a generate call, so waiting for a straggler
        costs little, while missing it would cost it a whole extra call (on a loaded box that is seconds)."""
        return min(max(BATCH_WAIT_S, 0.1 * self.last_generate_s), 5.0)

    def should_generate(self, now):
        """Batch: sample once every live episode waits on the model, or the others have been busy a while."""
        pending = [e for e in self.running if e.state == "llm"]
        return pending and all(e.state == "llm" or now - e.since > self.hold_s() for e in self.running)

    def generate(self):
        pending = sorted((e for e in self.running if e.state == "llm"), key=lambda e: e.index)
        prompts = [e.request[1] for e in pending]
        seeds = [call_seed(self.seed, e.index, e.task["id"], e.sample, len(e.calls)) for e in pending]
        stops = [e.request[3] for e in pending]
        kw = dict(self.gen_kw, stop=stops) if any(stops) else self.gen_kw  # backends without stop= still work
        start = time.time()
        outs = self.backend.generate(prompts, max_new_tokens=[e.request[2] for e in pending], seeds=seeds, **kw)
        self.generate_calls += 1
        now = time.time()
        self.last_generate_s = now - start
        self.generate_s += self.last_generate_s
        for e in self.running:  # the parent could not serve them meanwhile: not the harness's time
            if e.state != "llm":
                e.waited += self.last_generate_s
        for e, ids in zip(pending, outs):
            text = cut_at_stop(self.backend.tokenizer.decode(ids, skip_special_tokens=True), e.request[3])
            e.calls.append({"messages": e.request[0], "prompt_ids": e.request[1], "completion_ids": list(ids),
                            "completion": text, "stop": e.request[3]})
            e.waited += now - e.since
            e.state, e.since, e.request = "busy", now, None
            self.send(e.worker, {"value": text})

    def run(self, episodes, desc):
        self.todo, self.running, self.workers = deque(episodes), set(), []
        self.n_workers = min(self.n_workers, len(episodes))
        self.memory_bytes = worker_memory_bytes(self.n_workers)
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        self.wake_lock = threading.Lock()
        os.set_blocking(self.wake_r, False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        self.pool = ThreadPoolExecutor(max_workers=8)
        self.bar = tqdm(total=len(episodes), desc=desc, leave=False, dynamic_ncols=True)
        POOL.notify = lambda: self.wake(None)
        POOL.order(self.n_workers - POOL.supply())
        try:
            self.loop()
        finally:
            POOL.notify = None
            idle = [w for w in self.workers if w.episode is None and not w.outbuf]
            for w in self.workers:
                self.unwatch(w)
                if w not in idle:
                    w.kill()
            POOL.put(idle)
            self.sel.close()
            with self.wake_lock:
                os.close(self.wake_r)
                os.close(self.wake_w)
                self.wake_w = None
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.bar.close()
        return [ep.record for ep in episodes]

    def loop(self):
        warm_until = time.time() + 120
        while self.todo or self.running:
            now = time.time()
            self.refill()
            ready = len(self.workers) == min(self.n_workers, len(self.todo)) and all(w.ready for w in self.workers)
            if ready or now > warm_until:  # start together: batches stay full
                warm_until = 0
                self.dispatch(now)
            if self.should_generate(now):
                self.generate()
                continue
            for key, events in self.sel.select(timeout=self.timeout(now)):
                self.on_event(key, events)
            now = time.time()
            for ep in list(self.running):
                if ep.state == "tool" and ep.future.done():
                    self.on_tool_done(ep, now)
                elif ep.state != "llm" and ep.harness_seconds(now) > self.deadline_s:
                    self.fail(ep, f"deadline: the harness ran past {self.deadline_s:g} s (model time not counted)",
                              ep.worker)
            if self.todo and not self.workers and not POOL.supply():
                raise RuntimeError("no harness worker could be started")

    def timeout(self, now):
        t = [1.0]
        pending = any(e.state == "llm" for e in self.running)
        for e in self.running:
            if e.state != "llm":
                t.append(e.start + e.waited + self.deadline_s - now)
                if pending and e.since + self.hold_s() > now:  # wake up when it stops holding back the batch
                    t.append(e.since + self.hold_s() - now)
        return max(min(t), 0.001)

    def on_event(self, key, events):
        w = key.data
        if w is None:
            while True:
                try:
                    if not os.read(self.wake_r, 4096):
                        break
                except BlockingIOError:
                    break
            return
        if w not in self.workers:
            return
        if events & selectors.EVENT_WRITE and key.fd == w.wfd:
            return self.flush(w)
        chunk = os.read(w.rfd, 1 << 20)
        if not chunk:
            rc = w.proc.wait()
            if not w.ready:
                raise RuntimeError(f"a harness worker failed to start (exit code {rc}): {w.startup_error()}")
            return self.fail(w.episode, f"the worker died (exit code {rc}), e.g. out of memory", w) \
                if w.episode else self.retire(w)
        w.inbuf += chunk
        while b"\n" in w.inbuf and w in self.workers:
            line, w.inbuf = w.inbuf.split(b"\n", 1)
            try:
                msg = json.loads(line)
                if not isinstance(msg, dict):
                    raise ValueError("not an object")
                self.on_message(w, msg, time.time())
            except Exception as e:  # a harness can write to its pipe directly: forged messages cost its episode
                return self.fail(w.episode, f"protocol violation: {type(e).__name__}: {e}"[:500], w) if w.episode \
                    else self.retire(w)
        if w in self.workers and len(w.inbuf) > MAX_LINE:
            self.fail(w.episode, f"a message over {MAX_LINE} bytes", w) if w.episode else self.retire(w)


def run_episodes(domain, harness_path, tasks, backend, *, samples=1, temperature=1.0, top_k=20, max_new_tokens=256,
                 deadline_s=120.0, workers=None, seed=0, traces_path=None, desc="episodes"):
    """Run the harness on every (task, sample); -> episode dicts, task-major (see INTERFACES.md)."""
    episodes = [Episode(i * samples + s, t, s, domain.public(t)) for i, t in enumerate(tasks)
                for s in range(samples)]
    runner = Runner(domain, harness_path, backend, temperature=temperature, top_k=top_k,
                    max_new_tokens=max_new_tokens, deadline_s=deadline_s, workers=workers or min(64, len(episodes)),
                    seed=seed)
    records = runner.run(episodes, desc) if episodes else []
    run_episodes.last_counts = {"generate_calls": runner.generate_calls, "llm_calls": runner.llm_calls,
                                "generate_s": runner.generate_s}
    if traces_path:
        Path(traces_path).parent.mkdir(parents=True, exist_ok=True)
        with open(traces_path, "a") as f:
            for r in records:
                calls = [{k: v for k, v in c.items() if not k.endswith("_ids")} for c in r["calls"]]
                f.write(json.dumps({**r, "calls": calls}) + "\n")
    return records


def evaluate(domain, harness_path, tasks, backend, k=8, **kw):
    """mean@k: each task's success rate over k samples, averaged over tasks (not pass@k)."""
    start = time.time()
    eps = run_episodes(domain, harness_path, tasks, backend, samples=k, **{"desc": f"mean@{k}", **kw})
    per_task = {}
    for e in eps:
        per_task.setdefault(e["task_id"], []).append(e["reward"])
    per_task = {t: sum(r) / len(r) for t, r in per_task.items()}
    n = max(len(eps), 1)
    return {"mean_at_k": sum(per_task.values()) / max(len(per_task), 1), "k": k, "per_task": per_task,
            "mean_turns": sum(e["turns"] for e in eps) / n, "tokens": sum(e["tokens"] for e in eps),
            "rollouts": len(eps), "errors": sum(e["error"] is not None for e in eps),
            "seconds": round(time.time() - start, 2)}


# -----------------------------------------------------------------------------
# bench: the shared prefill's gain, and the runner's overhead over raw batched generation

BENCH_HARNESS = '''"""Bench: a few llm() calls with a fixed budget, nothing else."""
CALLS = 4
def run(task, llm, tools):
    for i in range(CALLS):
        llm([{"role": "user", "content": task["question"] + " call " + str(i)}])
    return {"answer": None}
'''


class BenchDomain:
    name, TOOL_METHODS = "bench", ()

    def public(self, task):
        return {"question": task["question"]}

    def tools(self, task):
        return None

    def reward(self, task, answer, tools):
        return 0.0


def bench(backend, episodes=64, calls=4, max_new_tokens=64, rounds=2):
    """Same prompts, same lengths (EOS ignored): (a) backend.generate in full batches, (b) through the runner.
    (a) and (b) alternate for `rounds` rounds, so a shared machine's changing load hits both alike."""
    backend.ignore_eos = True
    tasks = [{"id": f"b{i}", "question": f"Question number {i} about the city founded in {1800 + i}?"}
             for i in range(episodes)]
    prompts = [[chat_ids(backend.tokenizer, [{"role": "user", "content": f"{t['question']} call {c}"}])
                for t in tasks] for c in range(calls)]
    backend.generate(prompts[0][:4], max_new_tokens=4)  # warm up
    sandboxed = float("nan") if sandbox.disabled() else start_seconds(sandboxed=True)
    bare = start_seconds(sandboxed=False)
    POOL.warm(episodes)
    seconds, tokens, counts = {"a": 0.0, "b": 0.0, "wait": 0.0}, {"a": 0, "b": 0}, {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "bench_harness.py")
        path.write_text(BENCH_HARNESS.replace("CALLS = 4", f"CALLS = {calls}"))
        for r in range(rounds):
            start = time.time()
            outs = [backend.generate(p, max_new_tokens=max_new_tokens, seeds=list(range(len(p)))) for p in prompts]
            seconds["a"] += time.time() - start
            tokens["a"] += sum(len(o) for batch in outs for o in batch)
            start = time.time()
            eps = run_episodes(BenchDomain(), path, tasks, backend, max_new_tokens=max_new_tokens, workers=episodes,
                               seed=r, desc="bench")
            waited = time.time()
            POOL.wait_ready()  # the fresh sandboxes that replaced this call's: the runner's cost, so counted here
            seconds["b"] += time.time() - start
            seconds["wait"] += time.time() - waited
            tokens["b"] += sum(e["tokens"] for e in eps)
            errors = [e["error"] for e in eps if e["error"]]
            if errors:
                raise RuntimeError(f"bench episode failed: {errors[0]}")
            for key, n in run_episodes.last_counts.items():
                counts[key] = counts.get(key, 0) + n
    backend.ignore_eos = False
    a, b = tokens["a"] / seconds["a"], tokens["b"] / seconds["b"]
    print(f"sequences: {episodes * calls} x {max_new_tokens} tokens ({episodes} episodes x {calls} llm calls), "
          f"{rounds} rounds")
    print(f"direct generate: {tokens['a']} tokens in {seconds['a']:.2f} s = {a:.0f} tokens/s")
    print(f"runner: {tokens['b']} tokens in {seconds['b']:.2f} s = {b:.0f} tokens/s "
          f"({counts['generate_calls']} generate calls for {counts['llm_calls']} llm calls; of the time "
          f"{counts['generate_s']:.2f} s in generate, {seconds['wait']:.2f} s waiting for replacement sandboxes)")
    print(f"worker start + kill ({SANDBOX_TRIAL} at once): {sandboxed * 1000:.0f} ms per episode in the sandbox, "
          f"{bare * 1000:.0f} ms without it")
    print(f"ratio = {b / a:.3f}")
    return b / a


PREFIX_TEXT = ("Passage: The city was founded in 1821 by settlers from the coast, who named the river after the "
               "company that built its first engine. The war ended when the novel's author signed the treaty. ")


def prefix_bench(backend, samples=8, prompt_tokens=300, max_new_tokens=32, rounds=2):
    """G samples of one long prompt (EOS ignored): one shared prefill against a prefill per row, same rows and
    seeds. The two alternate for `rounds` rounds, as in bench."""
    words = (PREFIX_TEXT * prompt_tokens).split()
    for n in range(1, len(words) + 1):  # the shortest passage whose prompt reaches prompt_tokens
        prompt = chat_ids(backend.tokenizer, [{"role": "user", "content": " ".join(words[:n])}])
        if len(prompt) >= prompt_tokens:
            break
    backend.ignore_eos = True
    backend.generate([prompt] * 2, max_new_tokens=2)  # warm up
    seconds = {True: 0.0, False: 0.0}
    for _ in range(rounds):
        for share in (True, False):
            backend.share_prefix = share
            start = time.time()
            backend.generate([prompt] * samples, max_new_tokens=max_new_tokens, seeds=list(range(samples)))
            seconds[share] += time.time() - start
    backend.share_prefix, backend.ignore_eos = True, False
    print(f"prefix: {samples} samples x {max_new_tokens} tokens of one {len(prompt)}-token prompt, {rounds} rounds: "
          f"shared prefill {seconds[True]:.2f} s, a prefill per row {seconds[False]:.2f} s")
    print(f"prefix speedup = {seconds[False] / seconds[True]:.2f}")
    return seconds[False] / seconds[True]


SANDBOX_TRIAL = 16


def start_seconds(sandboxed, n=SANDBOX_TRIAL):
    """Wall seconds per worker to start n at once until all are ready, then kill them: what each episode costs."""
    saved = os.environ.get(sandbox.OPT_OUT)
    os.environ[sandbox.OPT_OUT] = "0" if sandboxed else "1"
    try:
        start, pool = time.time(), Pool()
        pool.idle = [Worker() for _ in range(n)]
        pool.wait_ready()
        pool.close()
        return (time.time() - start) / n
    finally:
        if saved is None:
            del os.environ[sandbox.OPT_OUT]
        else:
            os.environ[sandbox.OPT_OUT] = saved


# -----------------------------------------------------------------------------
# CLI

def adapted_backend(args):
    """The backend for --model with --adapter: the trainer-side model holds it, and the vllm and openai engines load
    it too and pass the canary before the first episode; a bad folder or a refused engine option is one line."""
    if args.adapter and not os.path.isfile(os.path.join(args.adapter, "adapter_config.json")):
        raise SystemExit(f"--adapter {args.adapter}: no adapter_config.json there; pass a LoRA folder such as "
                         "OUT/ckpt/adapter from rft.py")
    model, tok = load_model(args.model, adapter=args.adapter)
    try:
        return load_backend(args, model, tok, adapter=args.adapter)
    except (ValueError, RuntimeError) as e:
        raise SystemExit(str(e).splitlines()[0])


def main():
    import domains
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # what to evaluate
    p.add_argument("--domain", choices=["searchqa", "math", "chess"])
    p.add_argument("--harness", help="harness file, e.g. harnesses/chess.py")
    p.add_argument("--split", default="test", choices=["train", "harness", "test"])
    p.add_argument("--limit", type=positive_int, default=None, help="first N tasks of the split")
    p.add_argument("--k", type=positive_int, default=8, help="samples per task (mean@k)")
    p.add_argument("--out", default=None, help="folder for traces.jsonl and results.json")
    # model and sampling
    p.add_argument("--model", default="smoke", help="smoke | cpu | hub id | local path")
    p.add_argument("--adapter", default=None, help="LoRA adapter folder")
    add_sampling_args(p)
    add_backend_args(p)
    p.add_argument("--seed", type=int, default=0)
    domains.add_args(p)  # --data paper, --math-test-set ...
    # bench
    p.add_argument("--bench", action="store_true",
                   help="shared vs per-row prefill (hf), then raw batched generate vs the runner, same work")
    p.add_argument("--bench-episodes", type=positive_int, default=64)
    p.add_argument("--bench-calls", type=positive_int, default=4, help="llm() calls per bench episode")
    p.add_argument("--bench-tokens", type=positive_int, default=64, help="tokens per llm() call")
    p.add_argument("--bench-rounds", type=positive_int, default=2, help="alternating rounds of (a) and (b)")
    args = p.parse_args()
    sandbox.apply_args(args)
    if args.bench:
        backend = adapted_backend(args)
        if isinstance(backend, HFBackend):  # vllm and openai servers share prefixes on their own
            prefix_bench(backend, rounds=args.bench_rounds)
        bench(backend, episodes=args.bench_episodes, calls=args.bench_calls, max_new_tokens=args.bench_tokens,
              rounds=args.bench_rounds)
        return
    if not args.domain or not args.harness:
        p.error("pass --domain and --harness (or --bench)")
    try:
        check_harness(args.harness)
        domain = domains.get(args.domain, args)
        tasks = domain.load(args.split)[:args.limit]
    except (FileNotFoundError, ValueError, ImportError) as e:
        raise SystemExit(f"rollout.py: error: {e}")
    backend = adapted_backend(args)
    out = Path(args.out) if args.out else None
    traces = None
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(vars(args), indent=1))
        traces = out / "traces.jsonl"
        traces.unlink(missing_ok=True)
    stats = evaluate(domain, args.harness, tasks, backend, k=args.k, temperature=args.temperature,
                     top_k=args.top_k, max_new_tokens=args.max_new_tokens, deadline_s=args.deadline,
                     workers=args.workers, seed=args.seed, traces_path=traces)
    if out:
        (out / "results.json").write_text(json.dumps(stats, indent=1))
    print(f"tasks {len(tasks)}  rollouts {stats['rollouts']}  errors {stats['errors']}  mean turns "
          f"{stats['mean_turns']:.2f}  tokens {stats['tokens']}  seconds {stats['seconds']}")
    print(f"mean@{args.k} = {stats['mean_at_k']:.4f}")


if __name__ == "__main__":
    main()
