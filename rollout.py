"""
The batched, sandboxed episode runner and mean@k evaluation (models and backends: engines.py).

    python rollout.py --domain chess --harness harnesses/chess.py --model smoke --split test --k 8 --limit 4 --out out/eval
    python rollout.py --domain searchqa --harness harnesses/searchqa.py --model cpu --k 2 --limit 4 --out out/sq
    python rollout.py --bench --model smoke      # raw batched generate vs the runner: prints `ratio = X`

Algorithm. A harness is untrusted Python: `run(task, llm, tools)`. Each episode runs it in a worker
subprocess that holds no answers and no hidden tool state. The worker talks JSON lines over its own pipes:
it asks for `llm(messages)` or a tool call and waits for the reply. The parent process holds the tasks,
the tools and the model; it answers tool calls from a thread pool and collects the llm() requests of all
episodes, and when every live episode is waiting (or the rest are busy for a while) it samples them all in
ONE batched `backend.generate` call. It records the exact prompt and completion token ids of every call,
kills a worker at its episode's deadline (reward 0, error in the trace) and starts a replacement.
The worker's sandbox: a fresh temp cwd, a clean environment, 2 GB of memory, no file writes, an audit hook
that refuses open(), processes, sockets, ctypes and imports beyond the harness allowlist, and a capped
stdout; a worker runs one episode at a time, each in a fresh namespace.
The parent computes the reward from the returned answer. mean@k = per-task success rate over k samples,
averaged over tasks.
"""
import argparse
import ast
import hashlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

from engines import add_backend_args, chat_ids, load_backend, load_model


def add_sampling_args(p):
    """Sampling and runner flags, shared by every script that runs episodes."""
    # sampling (paper: temperature 1.0, top-k 20) and the runner
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=256, help="cap per llm() call")
    p.add_argument("--deadline", type=float, default=120.0, help="seconds of harness time per episode")
    p.add_argument("--workers", type=int, default=None, help="concurrent episodes (default min(64, episodes))")


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
# the worker: runs harness code in a sandboxed subprocess (python -I -c WORKER rfd wfd)

WORKER = r'''
import builtins, io, json, linecache, os, resource, sys, traceback
import re, math, random, string, collections, itertools, functools, textwrap, dataclasses, typing
ALLOWED = set(sys.argv[3].split(","))
MAX_CHARS, MAX_LINE, STDOUT_KEEP = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
inp, out = os.fdopen(int(sys.argv[1]), "rb"), os.fdopen(int(sys.argv[2]), "wb")

def send(msg):
    out.write(json.dumps(msg).encode() + b"\n")
    out.flush()

def recv():
    line = inp.readline()
    if not line:
        os._exit(0)
    return json.loads(line)

class Capped(io.TextIOBase):
    """stdout/stderr of the harness: keeps the first STDOUT_KEEP characters, counts and drops the rest."""
    def reset(self):
        self.kept, self.dropped = [], 0
    def write(self, s):
        s = str(s)
        room = STDOUT_KEEP - sum(map(len, self.kept))
        self.kept.append(s[:max(room, 0)])
        self.dropped += max(len(s) - max(room, 0), 0)
        return len(s)
    def text(self):
        return "".join(self.kept) + (f"\n[... {self.dropped} more characters dropped]" if self.dropped else "")

# sandbox: memory cap, no new files, no processes, no sockets, no file or directory reads, imports on a list
for lim, val in ((resource.RLIMIT_AS, 2 << 30), (resource.RLIMIT_FSIZE, 0), (resource.RLIMIT_NPROC, 0),
                 (resource.RLIMIT_CORE, 0)):
    try:
        resource.setrlimit(lim, (val, val))
    except (ValueError, OSError):
        pass
capped = Capped()
capped.reset()
sys.stdout = sys.stderr = sys.__stdout__ = sys.__stderr__ = capped
sys.stdin = None
setup = recv()
code = compile(setup["source"], setup["path"], "exec")
linecache.cache[setup["path"]] = (len(setup["source"]), None, setup["source"].splitlines(True), setup["path"])
BLOCKED = ("open", "os.", "subprocess.", "socket.", "ctypes.", "_posixsubprocess", "pty.", "mmap.", "shutil.",
           "glob.", "sqlite3.", "urllib.", "http.", "ftplib.", "smtplib.", "webbrowser.", "syslog.", "fcntl.",
           "resource.", "sys.addaudithook", "cpython.", "marshal.load", "pickle.find_class")

def audit(event, args):
    if event.startswith(BLOCKED):
        raise PermissionError(f"sandbox: {event} is not allowed in a harness")
    if event == "import" and args[0].split(".")[0] not in ALLOWED:
        raise ImportError(f"sandbox: import {args[0]} is not allowed in a harness")

real_import = builtins.__import__

def harness_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level or name.split(".")[0] not in ALLOWED:
        raise ImportError(f"a harness may import only {', '.join(sorted(ALLOWED))}, not {name!r}")
    return real_import(name, globals, locals, fromlist, level)

safe_builtins = dict(builtins.__dict__, __import__=harness_import)
for name in ("open", "input", "breakpoint", "exit", "quit"):
    safe_builtins.pop(name, None)
sys.addaudithook(audit)

def call(msg):
    send(msg)
    reply = recv()
    if "raise" in reply:
        exc = getattr(builtins, reply["raise"], None)
        exc = exc if isinstance(exc, type) and issubclass(exc, Exception) else RuntimeError
        raise exc(reply["message"])
    return reply["value"]

def llm(messages, max_tokens=None):
    if not isinstance(messages, list) or not all(isinstance(m, dict) and m.get("role") in ("system", "user",
            "assistant") and isinstance(m.get("content"), str) for m in messages):
        raise TypeError("llm(messages): messages must be a list of {'role': system|user|assistant, 'content': str}")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise TypeError("llm(max_tokens=...) must be a positive int")
    messages = [{"role": m["role"], "content": m["content"][:MAX_CHARS]} for m in messages]
    return call({"llm": messages, "max_tokens": max_tokens})

class Tools:
    def __init__(self, methods):
        self._methods = methods
    def __getattr__(self, name):
        if name.startswith("_") or name not in self._methods:
            raise AttributeError(f"tools has no method {name!r}; it has {', '.join(self._methods)}")
        def method(*args, **kwargs):
            try:
                json.dumps([args, kwargs])
            except (TypeError, ValueError):
                raise TypeError(f"tools.{name}: arguments must be JSON values") from None
            return call({"tool": name, "args": args, "kwargs": kwargs})
        return method

send({"ready": True})
while True:
    job = recv()
    capped.reset()
    random.seed(job["seed"])
    try:
        ns = {"__name__": "harness", "__file__": setup["path"], "__builtins__": safe_builtins}
        exec(code, ns)
        result = ns["run"](job["task"], llm, Tools(setup["methods"]))
        line = json.dumps({"done": result, "stdout": capped.text()})
        if len(line) > MAX_LINE:
            raise ValueError(f"run() returned {len(line)} characters of JSON; the limit is {MAX_LINE}")
        out.write(line.encode() + b"\n")
        out.flush()
    except BaseException:
        err = traceback.format_exc()
        send({"error": err[-MAX_CHARS:], "stdout": capped.text()})
'''

# -----------------------------------------------------------------------------
# the runner: parent side

MAX_LLM_CALLS = 32        # per episode
MAX_TOOL_CALLS = 64       # per episode
MAX_CHARS = 32_000        # per message content, tool result, error text
MAX_LINE = 4_000_000      # one JSON message from a worker
STDOUT_KEEP = 10_000      # printed characters kept in the trace
MAX_PROMPT_TOKENS = 8192
BATCH_WAIT_S = 0.1        # least time a busy episode may hold back a batch (see Runner.hold_s)


def call_seed(*parts):
    return int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest(), "big") >> 2


def exception_reply(e):
    name = type(e).__name__ if type(e).__module__ == "builtins" else "RuntimeError"
    return {"raise": name, "message": f"{type(e).__name__}: {e}"[:MAX_CHARS]}


class Worker:
    """One sandboxed subprocess that runs one episode at a time; the RPC channel is its own pair of pipes."""

    def __init__(self, source, path, methods):
        p2w_r, self.wfd = os.pipe()
        self.rfd, w2p_w = os.pipe()
        self.cwd = tempfile.mkdtemp(prefix="whale-worker-")
        argv = [sys.executable, "-I", "-c", WORKER, str(p2w_r), str(w2p_w), ",".join(ALLOWED_IMPORTS),
                str(MAX_CHARS), str(MAX_LINE), str(STDOUT_KEEP)]
        with open(os.path.join(self.cwd, "stderr.txt"), "wb") as err:  # startup errors only (RLIMIT_FSIZE=0 later)
            self.proc = subprocess.Popen(argv, pass_fds=(p2w_r, w2p_w), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err, cwd=self.cwd,
                                         env={"PATH": os.environ.get("PATH", "")}, start_new_session=True)
        os.close(p2w_r)
        os.close(w2p_w)
        os.set_blocking(self.wfd, False)
        self.inbuf, self.ready, self.episode = b"", False, None
        self.outbuf = (json.dumps({"source": source, "path": str(path), "methods": list(methods)}) + "\n").encode()

    def startup_error(self):
        try:
            return Path(self.cwd, "stderr.txt").read_text()[-2000:]
        except OSError:
            return ""

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for fd in (self.rfd, self.wfd):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.cwd, ignore_errors=True)


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
        self.source = check_harness(harness_path)
        self.domain, self.path, self.backend, self.seed = domain, str(harness_path), backend, seed
        self.gen_kw = dict(temperature=temperature, top_k=top_k)
        self.max_new_tokens, self.deadline_s, self.n_workers = max_new_tokens, deadline_s, workers
        self.generate_calls = self.llm_calls = 0
        self.last_generate_s = 10.0  # before the first call: let freshly started episodes hold a batch for 1 s

    # -- workers
    def spawn(self):
        w = Worker(self.source, self.path, self.domain.TOOL_METHODS)
        self.workers.append(w)
        self.sel.register(w.rfd, selectors.EVENT_READ, w)
        self.flush(w)

    def retire(self, w):
        self.unwatch(w)
        self.workers.remove(w)
        w.kill()
        if self.todo and len(self.workers) < self.n_workers:
            self.spawn()

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
                self.send(w, {"task": ep.public, "seed": call_seed(self.seed, ep.task["id"], ep.sample, "random")})

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
        if ep.worker.episode is ep:
            ep.worker.episode = None

    def fail(self, ep, error, w):
        """A harness broke a rule or ran out of time: the episode scores 0 and its worker is replaced."""
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
                return self.finish(ep, error=str(msg["error"])[:MAX_CHARS], stdout=stdout)
            return self.finish(ep, result=msg["done"], stdout=stdout)
        if "llm" in msg:
            if len(ep.calls) >= MAX_LLM_CALLS:
                return self.send(w, {"raise": "RuntimeError", "message": f"llm() call limit {MAX_LLM_CALLS} reached"})
            try:
                ids = chat_ids(self.backend.tokenizer, msg["llm"])
            except Exception as e:
                return self.send(w, exception_reply(e))
            if len(ids) > MAX_PROMPT_TOKENS:
                return self.send(w, {"raise": "ValueError",
                                     "message": f"prompt of {len(ids)} tokens; the limit is {MAX_PROMPT_TOKENS}"})
            cap = self.max_new_tokens if msg.get("max_tokens") is None else min(self.max_new_tokens,
                                                                                 int(msg["max_tokens"]))
            ep.request, ep.state, ep.since = (msg["llm"], ids, cap), "llm", now
            self.llm_calls += 1
        elif "tool" in msg:
            name, args, kwargs = msg["tool"], list(msg.get("args", [])), dict(msg.get("kwargs", {}))
            if name not in self.domain.TOOL_METHODS or len(ep.tool_calls) >= MAX_TOOL_CALLS:
                return self.send(w, {"raise": "RuntimeError", "message": f"tool {name!r} not allowed or call limit "
                                                                         f"{MAX_TOOL_CALLS} reached"})
            ep.tool_calls.append({"name": name, "args": args, "kwargs": kwargs, "result": None})
            ep.state, ep.since = "tool", now
            ep.future = self.pool.submit(getattr(ep.tools, name), *args, **kwargs)
            ep.future.add_done_callback(self.wake)
        else:
            self.fail(ep, f"protocol violation: unknown message {str(msg)[:200]}", w)

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
        seeds = [call_seed(self.seed, e.task["id"], e.sample, len(e.calls)) for e in pending]
        start = time.time()
        outs = self.backend.generate(prompts, max_new_tokens=[e.request[2] for e in pending], seeds=seeds,
                                     **self.gen_kw)
        self.generate_calls += 1
        now = time.time()
        self.last_generate_s = now - start
        for e in self.running:  # the parent could not serve them meanwhile: not the harness's time
            if e.state != "llm":
                e.waited += self.last_generate_s
        for e, ids in zip(pending, outs):
            text = self.backend.tokenizer.decode(ids, skip_special_tokens=True)
            e.calls.append({"messages": e.request[0], "prompt_ids": e.request[1], "completion_ids": ids,
                            "completion": text})
            e.waited += now - e.since
            e.state, e.since, e.request = "busy", now, None
            self.send(e.worker, {"value": text})

    def run(self, episodes, desc):
        self.todo, self.running, self.workers = deque(episodes), set(), []
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        self.wake_lock = threading.Lock()
        os.set_blocking(self.wake_r, False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        self.pool = ThreadPoolExecutor(max_workers=8)
        self.bar = tqdm(total=len(episodes), desc=desc, leave=False, dynamic_ncols=True)
        try:
            for _ in range(min(self.n_workers, len(episodes))):
                self.spawn()
            self.loop()
        finally:
            for w in list(self.workers):
                self.unwatch(w)
                w.kill()
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
            if all(w.ready for w in self.workers) or now > warm_until:  # start together: batches stay full
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
            if not self.workers and self.todo:
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
    run_episodes.last_counts = {"generate_calls": runner.generate_calls, "llm_calls": runner.llm_calls}
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
# bench: the runner's overhead over raw batched generation

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
    seconds, tokens, counts = {"a": 0.0, "b": 0.0}, {"a": 0, "b": 0}, {}
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
            seconds["b"] += time.time() - start
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
          f"({counts['generate_calls']} generate calls for {counts['llm_calls']} llm calls)")
    print(f"ratio = {b / a:.3f}")
    return b / a


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
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # what to evaluate
    p.add_argument("--domain", choices=["searchqa", "math", "chess"])
    p.add_argument("--harness", help="harness file, e.g. harnesses/chess.py")
    p.add_argument("--split", default="test", choices=["train", "harness", "test"])
    p.add_argument("--limit", type=int, default=None, help="first N tasks of the split")
    p.add_argument("--k", type=int, default=8, help="samples per task (mean@k)")
    p.add_argument("--out", default=None, help="folder for traces.jsonl and results.json")
    # model and sampling
    p.add_argument("--model", default="smoke", help="smoke | cpu | hub id | local path")
    p.add_argument("--adapter", default=None, help="LoRA adapter folder")
    add_sampling_args(p)
    add_backend_args(p)
    p.add_argument("--seed", type=int, default=0)
    # bench
    p.add_argument("--bench", action="store_true", help="raw batched generate vs the runner, same work")
    p.add_argument("--bench-episodes", type=int, default=64)
    p.add_argument("--bench-calls", type=int, default=4, help="llm() calls per bench episode")
    p.add_argument("--bench-tokens", type=int, default=64, help="tokens per llm() call")
    p.add_argument("--bench-rounds", type=int, default=2, help="alternating rounds of (a) and (b)")
    args = p.parse_args()

    if args.bench:
        bench(adapted_backend(args), episodes=args.bench_episodes, calls=args.bench_calls,
              max_new_tokens=args.bench_tokens, rounds=args.bench_rounds)
        return
    if not args.domain or not args.harness:
        raise SystemExit("rollout.py: pass --domain and --harness (or --bench)")
    try:
        check_harness(args.harness)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(str(e))
    import domains
    domain = domains.get(args.domain)
    tasks = domain.load(args.split)[:args.limit]
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
