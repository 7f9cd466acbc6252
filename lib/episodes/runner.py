"""The episode runner, parent side: one event loop over the harness workers' pipes, the tool threads and
batched generation, behind rollout.run_episodes (the algorithm: rollout.py's docstring).

    runner = Runner(domain, harness_path, policy, temperature=1.0, top_k=20, max_new_tokens=256, deadline_s=120,
                    workers=64, seed=0)
    records = runner.run([Episode(i, task, 0, domain.public(task)) for i, task in enumerate(tasks)], "episodes")
"""
import hashlib
import json
import os
import selectors
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

from lib.episodes import cgroups, sandbox, switches
from lib.contract import ALLOWED_IMPORTS, check_harness
from lib.backends.models import chat_ids, thinking_switch
from lib.common.errors import InfrastructureError
from lib.common.text import valid_text
from lib.episodes.worker_pool import POOL, WORKER_TASKS, worker_memory_bytes


# -----------------------------------------------------------------------------
# the messages between the runner and a harness worker (lib/episodes/harness_process.py): the limits on them and the
# parent's checks of every request a worker sends. The worker runs untrusted harness code, which can write to its
# pipe directly, so the parent checks each request in full; the worker's own checks are a courtesy.
#     messages, cap, stop, tools = llm_request(msg, max_new_tokens)   # ValueError on a forged request
#     name, args, kwargs = tool_request(msg, domain.TOOL_METHODS)

MAX_LLM_CALLS = 32        # llm() requests per episode, empty replies included: past it llm() raises
MAX_TOOL_CALLS = 64       # per episode
MAX_CHARS = 32_000        # per message content, tool result, error text
MAX_MESSAGES = 256        # per llm() call
MAX_LINE = 4_000_000      # one JSON message from a worker
MAX_DEPTH = 64            # lists and dicts nested in one message (what run() returns, a tool's arguments)
STDOUT_KEEP = 10_000      # printed characters kept in the trace
EXTRA_KEEP = 2_000        # characters (as JSON) kept in the trace of what run() returned beside 'answer'
TRACE_RECORD_BYTES = 1_000_000  # one episode's line in traces.jsonl, everything included (trace_line)
MAX_PROMPT_TOKENS = 8192  # per llm() call when the run sets no --max-prompt-tokens / --max-model-len
MAX_STOPS, MAX_STOP_CHARS = 4, 32
MAX_TOOLS, MAX_TOOLS_CHARS = 16, 32_000  # function schemas per llm() call, and their JSON size
ROLES = ("system", "user", "assistant", "tool")  # "tool": a tool's result, as native tool calls expect it


def check_depth(value, limit=MAX_DEPTH):
    """Raise ValueError where value nests lists and dicts more than `limit` deep. Walked with a stack, never by
    recursion: a value a worker sends is decoded once (json refuses past the interpreter's recursion limit, as a
    RecursionError the caller catches), and past this check no json.dumps or repr of it can recurse too deep."""
    stack = [(value, 1)] if isinstance(value, (list, dict)) else []
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            raise ValueError(f"a value nested more than {limit} deep (lists and dicts)")
        items = value.values() if isinstance(value, dict) else value
        stack.extend((v, depth + 1) for v in items if isinstance(v, (list, dict)))


def exception_reply(e):
    name = type(e).__name__ if type(e).__module__ == "builtins" else "RuntimeError"
    return {"raise": name, "message": f"{type(e).__name__}: {e}"[:MAX_CHARS]}


def llm_request(msg, max_new_tokens):
    """-> (messages, token cap, stop list or None, tools or None) from a worker's llm request, checked in full: the
    worker's own checks are a courtesy that harness code can skip. Raises ValueError on a forged request."""
    messages, max_tokens, stop, tools = msg["llm"], msg.get("max_tokens"), msg.get("stop"), msg.get("tools")
    if set(msg) - {"llm", "max_tokens", "stop", "tools"}:
        raise ValueError(f"unknown keys {sorted(set(msg) - {'llm', 'max_tokens', 'stop', 'tools'})}")
    if not (isinstance(messages, list) and 1 <= len(messages) <= MAX_MESSAGES and all(
            isinstance(m, dict) and set(m) == {"role", "content"} and m["role"] in ROLES
            and isinstance(m["content"], str) and len(m["content"]) <= MAX_CHARS for m in messages)):
        raise ValueError(f"llm messages must be 1 to {MAX_MESSAGES} {{role, content}} dicts (role one of "
                         f"{', '.join(ROLES)}) of at most {MAX_CHARS} characters")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise ValueError(f"llm max_tokens must be None or an int >= 1, not {max_tokens!r}"[:200])
    stop = [stop] if isinstance(stop, str) else stop
    if stop is not None and not (isinstance(stop, list) and len(stop) <= MAX_STOPS and all(
            isinstance(s, str) and 1 <= len(s) <= MAX_STOP_CHARS for s in stop)):
        raise ValueError(f"llm stop must be None, a string or a list of at most {MAX_STOPS} non-empty strings of "
                         f"at most {MAX_STOP_CHARS} characters")
    cap = max_new_tokens if max_tokens is None else min(max_new_tokens, max_tokens)
    return messages, cap, stop or None, check_tools(tools)


def check_tools(tools):
    """tools: None or a list of OpenAI-style function schemas {"type": "function", "function": {"name": ...}};
    the chat template renders them into the prompt, so their size is capped."""
    if tools is None:
        return None
    if not (isinstance(tools, list) and len(tools) <= MAX_TOOLS and all(
            isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) for t in tools)):
        raise ValueError(f"llm tools must be None or a list of at most {MAX_TOOLS} function schemas "
                         '{"type": "function", "function": {"name": str, ...}}')
    if len(json.dumps(tools)) > MAX_TOOLS_CHARS:
        raise ValueError(f"llm tools: {len(json.dumps(tools))} characters of JSON; the limit is {MAX_TOOLS_CHARS}")
    return tools or None


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


# -----------------------------------------------------------------------------
# the runner

BATCH_WAIT_S = 0.1        # least time a busy episode may hold back a batch (see Runner.hold_s)


def call_seed(*parts):
    """A seed from the parts, the same in every process (unlike hash(), which is salted per process)."""
    return int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest(), "big") >> 2


class Episode:
    def __init__(self, index, task, sample, public):
        self.index, self.task, self.sample, self.public = index, task, sample, public
        self.calls, self.tool_calls, self.record = [], [], None
        self.asked, self.out_of_tokens = 0, False  # llm() requests so far; whether one found no tokens left
        self.capped = False  # whether a request went past the domain's caps on model calls (its MODEL_CALLS)
        self.retries = {"format": 0, "illegal": 0}  # chess: the model calls that failed to give a legal move
        self.checked = self.tools_seen = 0  # chess: model calls and tool calls already counted in retries
        self.tools = self.request = self.future = None
        self.state, self.start, self.since, self.waited = "todo", 0.0, 0.0, 0.0

    def harness_seconds(self, now):
        """Wall time charged to the harness: model time is the runner's, so it is not counted (nor, for the
        episodes outside a batch, the time the parent spent generating and could not answer them)."""
        return now - self.start - self.waited - (now - self.since if self.state == "llm" else 0.0)


class Runner:
    """The parent's event loop over worker pipes, tool threads and batched generation."""

    def __init__(self, domain, harness_path, backend, *, temperature, top_k, max_new_tokens, deadline_s, workers,
                 seed, thinking="auto", episode_tokens=None, max_prompt_tokens=None, max_model_len=None,
                 traces_path=None):
        sandbox.check()  # once per process: fails closed, naming --unsafe-no-sandbox
        self.source = check_harness(harness_path)
        self.domain, self.path, self.backend, self.seed = domain, str(harness_path), backend, seed
        self.traces_path = traces_path  # each episode's trace_line appended as it finishes, in episode order
        self.gen_kw = dict(temperature=temperature, top_k=top_k)
        self.max_new_tokens, self.deadline_s, self.n_workers = max_new_tokens, deadline_s, workers
        self.thinking = thinking_switch(backend.tokenizer, thinking)
        self.episode_tokens = episode_tokens
        self.max_prompt_tokens = max_prompt_tokens or MAX_PROMPT_TOKENS
        # the model length bounds prompt + completion; unknown (no --max-model-len), room for any first prompt and
        # a full cap
        self.window = max_model_len or MAX_PROMPT_TOKENS + max_new_tokens
        self.generate_calls = self.llm_calls = 0
        self.generate_s = 0.0
        self.infra_errors = []  # why each episode lost outside the harness's own code was lost
        self.last_generate_s = 10.0  # before the first call: let freshly started episodes hold a batch for 1 s

    # -- workers
    def watch(self, w):
        self.workers.append(w)
        self.sel.register(w.rfd, selectors.EVENT_READ, w)
        w.flush(self.sel)

    def retire(self, w):
        """A worker's episode is over (or it died): kill its sandbox and order a fresh one in its place."""
        w.unwatch(self.sel)
        self.workers.remove(w)
        w.kill()
        POOL.order(1)

    def refill(self):
        """Take started workers from the pool while episodes wait and slots are free. Each start that failed (twice:
        sandbox.start_one_process) costs a waiting episode, so a machine that cannot start workers ends the run's
        episodes instead of waiting forever, and a fresh start takes its place."""
        for error in POOL.failed_starts():
            if self.todo:
                self.lose(self.todo.popleft(), f"a harness worker could not start: {error}")
                POOL.order(1)
        if self.todo and len(self.workers) < self.n_workers:
            for w in POOL.take(min(self.n_workers - len(self.workers), len(self.todo))):
                self.watch(w)

    def send(self, w, msg):
        w.outbuf += (json.dumps(msg) + "\n").encode()
        w.flush(self.sel)

    # -- episodes
    def dispatch(self, now):
        for w in self.workers:
            if w.ready and w.episode is None and self.todo:
                ep = self.todo.popleft()
                ep.tools = self.domain.tools(ep.task)
                ep.state, ep.start, ep.since = "busy", now, now
                w.episode, ep.worker = ep, w
                self.running.add(ep)
                w.limit_memory(self.memory_bytes)  # the sandbox as a whole, beside the worker's own RLIMIT_AS
                self.send(w, {"source": self.source, "path": self.path, "methods": list(self.domain.TOOL_METHODS),
                              "task": ep.public, "seed": call_seed(self.seed, ep.index, ep.task["id"], ep.sample,
                                                                   "random"),
                              "memory_bytes": self.memory_bytes, "allowed": list(ALLOWED_IMPORTS),
                              "open_files": sandbox.SANDBOX_OPEN_FILES, "tasks": self.weak_tasks,
                              "max_chars": MAX_CHARS, "max_line": MAX_LINE, "stdout_keep": STDOUT_KEEP})

    def finish(self, ep, error=None, stdout="", result=None):
        if ep.state == "done":
            return
        now = time.time()
        reward, answer, scored = 0.0, None, None
        if error is None and not (isinstance(result, dict) and "answer" in result):
            error = f"run() returned {json.dumps(result)[:200]}, expected a dict with an 'answer' key"
        if error is None:
            answer = result["answer"]
            try:
                # what the verifier reads: the answer run() returned, or (--scoring last-message, the paper's data)
                # the model's last message, so a harness cannot rewrite what is scored; the returned answer is kept
                scored = scored_answer(self.domain, answer, ep.calls)
                reward = float(self.domain.reward(ep.task, scored, ep.tools))
            except Exception as e:  # the domain promises not to raise; keep the run alive if it does
                error = f"reward failed: {type(e).__name__}: {e}"
        if ep.out_of_tokens and self.domain.OUT_OF_TOKENS_SCORES_ZERO:
            reward = 0.0
        ep.record = {"task_id": ep.task["id"], "sample": ep.sample, "reward": reward, "answer": capped(answer),
                     "extracted": extracted_answer(self.domain, scored), "scoring": self.domain.scoring_rule(),
                     "error": error, "turns": len(ep.calls), "tokens": sum(len(c["completion_ids"]) for c in ep.calls),
                     "seconds": round(now - ep.start, 3), "calls": ep.calls, "tool_calls": ep.tool_calls,
                     "stdout": stdout, "out_of_tokens": ep.out_of_tokens, "capped": ep.capped}
        if isinstance(result, dict) and "answer" in result and len(result) > 1:  # the cpu h0s return a note
            ep.record["returned"] = beside_answer(result)
        ep.state = "done"
        self.running.discard(ep)
        self.bar.update(1)
        self.write_finished()

    def write_finished(self):
        """Append the trace of every finished episode whose predecessors are all written: records leave as they
        finish, in episode order (the file reads the same however the episodes interleaved)."""
        while self.written < len(self.order) and self.order[self.written].state == "done":
            if self.traces:
                self.traces.write(trace_line(self.order[self.written].record) + "\n")
            self.written += 1
        if self.traces:
            self.traces.flush()

    def fail(self, ep, error, w):
        """A harness broke a rule or ran out of time: the episode scores 0 and its sandbox is replaced."""
        self.finish(ep, error=error)
        self.retire(w)

    def lose(self, ep, error):
        """An episode lost outside the harness's own code: it scores 0 like a harness failure (its record says
        which), and counts against the error budget, not the candidate."""
        ep.start = ep.start or time.time()
        self.infra_errors.append(error)
        self.finish(ep, error=f"infrastructure: {error}"[:MAX_CHARS])

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
            messages, cap, stop, tools = llm_request(msg, self.max_new_tokens)
            if ep.asked >= MAX_LLM_CALLS:  # empty replies count too: a harness cannot spin on them
                return self.send(w, {"raise": "RuntimeError", "message": f"llm() call limit {MAX_LLM_CALLS} reached"})
            ep.asked += 1
            if self.past_cap(ep):  # no sample: '' ends the episode in the harness, scored on what it has
                ep.capped = True
                return self.send(w, {"value": ""})
            try:
                ids = chat_ids(self.backend.tokenizer, messages, tools=tools, thinking=self.thinking)
            except Exception as e:
                return self.send(w, exception_reply(e))
            # the episode's first prompt, as verl's max_prompt_length with truncation='error' (later prompts hold
            # the episode's own turns: the budget and the model length bound them); official drops such a task
            # from the data, here the harness gets the error
            if not ep.calls and len(ids) > self.max_prompt_tokens:
                return self.send(w, {"raise": "ValueError",
                                     "message": f"prompt of {len(ids)} tokens; the limit is {self.max_prompt_tokens}"})
            cap = self.tokens_left(ep, ids, cap)
            if cap < 1:  # the budget or the window is spent: no sample, an empty reply, the harness ends the episode
                ep.out_of_tokens = True
                return self.send(w, {"value": ""})
            ep.request, ep.state, ep.since = (messages, ids, cap, stop), "llm", now
            self.llm_calls += 1
        elif "tool" in msg:
            name, args, kwargs = tool_request(msg, self.domain.TOOL_METHODS)
            if len(ep.tool_calls) >= MAX_TOOL_CALLS:
                return self.send(w, {"raise": "RuntimeError", "message": f"tool call limit {MAX_TOOL_CALLS} reached"})
            # the record keeps capped copies (a 3 MB query is cut); the tool gets the arguments whole
            ep.tool_calls.append({"name": name, "args": capped(args), "kwargs": capped(kwargs), "result": None})
            ep.state, ep.since = "tool", now
            ep.future = self.pool.submit(getattr(ep.tools, name), *args, **kwargs)
            ep.future.add_done_callback(self.wake)
        else:
            raise ValueError(f"unknown message {str(msg)[:200]}")

    def past_cap(self, ep):
        """Whether this llm() request goes past the domain's caps (domains.Domain): its MODEL_CALLS, or its
        MAX_RETRIES of either kind of retry where it has them (chess; None: no cap on retries)."""
        retries = self.domain.MAX_RETRIES
        if retries is not None:
            self.count_retry(ep)
        return len(ep.calls) >= self.domain.MODEL_CALLS or (retries is not None and max(ep.retries.values()) > retries)

    def count_retry(self, ep):
        """Chess: the model call before this request failed when the harness sent no move after it (a format
        retry, as a move that is not UCI) or its last move was illegal (an illegal-move retry); once per call."""
        if ep.checked == len(ep.calls):
            return
        ep.checked = len(ep.calls)
        moves = [c["result"] for c in ep.tool_calls[ep.tools_seen:] if c["name"] == "move"]
        ep.tools_seen = len(ep.tool_calls)
        status = moves[-1].get("status") if moves and isinstance(moves[-1], dict) else None
        if not moves or status == "unparseable":
            ep.retries["format"] += 1
        elif status == "illegal":
            ep.retries["illegal"] += 1

    def tokens_left(self, ep, ids, cap):
        """This call's token cap: `cap` (the harness's and --max-new-tokens) cut to what is left of the episode's
        assistant-token budget (the sampled tokens of its calls; prompt and tool tokens do not count, as
        official) and of the model length after this prompt. The harness cannot raise either."""
        budget = self.episode_tokens - sum(len(c["completion_ids"]) for c in ep.calls) if self.episode_tokens else cap
        return min(cap, budget, self.window - len(ids))

    def on_tool_done(self, ep, now):
        try:
            value = ep.future.result()
            check_depth(value)
            line = json.dumps(value)
            reply = {"value": value} if len(line) <= MAX_LINE else {"raise": "RuntimeError",
                                                                   "message": "tool result too large"}
        except InfrastructureError as e:  # a tool server or sandbox that failed: not a result the harness may read
            self.lose(ep, f"tools.{ep.tool_calls[-1]['name']}: {e}")
            return self.retire(ep.worker)
        except Exception as e:
            reply = exception_reply(e)
        ep.tool_calls[-1]["result"] = capped(reply.get("value", reply.get("message")))
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
                            "completion": text, "stop": e.request[3], "tokens": len(ids), "max_tokens": e.request[2]})
            e.waited += now - e.since
            e.state, e.since, e.request = "busy", now, None
            self.send(e.worker, {"value": text})

    def run(self, episodes, desc):
        self.todo, self.running, self.workers = deque(episodes), set(), []
        self.order, self.written = list(episodes), 0
        if self.traces_path:
            Path(self.traces_path).parent.mkdir(parents=True, exist_ok=True)
        self.traces = open(self.traces_path, "a") if self.traces_path else None
        self.n_workers = min(self.n_workers, len(episodes))
        self.memory_bytes = worker_memory_bytes(self.n_workers)
        # a worker's threads: its cgroup's pids.max, else (--allow-weak-bounds) RLIMIT_NPROC
        self.weak_tasks = 0 if cgroups.cgroup_parents() or switches.disabled() else WORKER_TASKS
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
                w.unwatch(self.sel)
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
            if self.traces:
                self.traces.close()
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
            return w.flush(self.sel)
        chunk = os.read(w.rfd, 1 << 20)
        if not chunk:
            rc = w.proc.wait()
            if not w.ready:  # it never ran harness code: the machine's failure, charged to a waiting episode
                error = f"a harness worker failed to start (exit code {rc}): {w.startup_error()}"
                self.retire(w)
                return self.lose(self.todo.popleft(), error) if self.todo else None
            return self.fail(w.episode, f"the worker died (exit code {rc}), e.g. out of memory", w) \
                if w.episode else self.retire(w)
        w.inbuf += chunk
        while b"\n" in w.inbuf and w in self.workers:
            line, w.inbuf = w.inbuf.split(b"\n", 1)
            try:
                msg = json.loads(line)
                if not isinstance(msg, dict):
                    raise ValueError("not an object")
                check_depth(msg)
                self.on_message(w, valid_text(msg), time.time())  # a lone surrogate becomes '?' here, once
            except Exception as e:  # a harness can write to its pipe directly: forged messages cost its episode
                return self.fail(w.episode, f"protocol violation: {type(e).__name__}: {e}"[:500], w) if w.episode \
                    else self.retire(w)
        if w in self.workers and len(w.inbuf) > MAX_LINE:
            self.fail(w.episode, f"a message over {MAX_LINE} bytes", w) if w.episode else self.retire(w)


def beside_answer(result):
    """The keys run() returned beside 'answer', kept in the trace so the harness's author can read what it noted;
    bounded: past EXTRA_KEEP characters of JSON, the first EXTRA_KEEP of them as text, marked cut."""
    extra = {k: v for k, v in result.items() if k != "answer"}
    text = json.dumps(extra)
    return extra if len(text) <= EXTRA_KEEP else f"{cut(text, EXTRA_KEEP)} ... (cut: {len(text)} characters)"


def capped(value, limit=MAX_CHARS):
    """A recorded value (a tool call's arguments or result, an answer) as it is, or past `limit` characters of
    JSON, cut and marked: a string its own start, anything else the start of its JSON text, each as much as
    fits `limit` characters once the trace line escapes it (quotes and backslashes are not escaped past the cap):
    no field of a trace holds more."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return f"(not recorded: a {type(value).__name__} that is not JSON)"
    if len(text) <= limit:
        return value
    return f"{cut(value if isinstance(value, str) else text, limit)} ... (cut: {len(text)} characters)"


def cut(text, limit):
    """The longest start of text whose JSON form (without its quotes) has at most `limit` characters."""
    lo, hi = 0, min(len(text), limit)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(json.dumps(text[:mid])) - 2 <= limit else (lo, mid - 1)
    return text[:lo]


def trace_line(record):
    """One episode's line of traces.jsonl, at most TRACE_RECORD_BYTES: token ids left out (the record keeps them
    for training); over the bound, each model call keeps only its last message, then the last calls and tool
    calls go, and `trace_cut` says how long the full line was."""
    calls = [{k: v for k, v in c.items() if not k.endswith("_ids")} for c in record["calls"]]
    line = json.dumps({**record, "calls": calls})
    if len(line) <= TRACE_RECORD_BYTES:
        return line
    full = len(line)
    calls = [{**c, "messages": c["messages"][-1:], "messages_cut": len(c["messages"]) - 1} for c in calls]
    tools = list(record["tool_calls"])
    while True:
        line = json.dumps({**record, "calls": calls, "tool_calls": tools, "trace_cut": full})
        if len(line) <= TRACE_RECORD_BYTES or not (calls or tools):
            return line
        (calls if len(calls) >= len(tools) else tools).pop()


def scored_answer(domain, answer, calls):
    """What the domain's reward reads of an episode (domains.Domain.scored_answer): the harness's returned answer, or
    the model's last sampled message (a capped or out-of-tokens request sampled nothing, so it is not one)."""
    return domain.scored_answer(answer, calls[-1]["completion"] if calls else "")


def extracted_answer(domain, answer):
    """The answer as the domain's reward reads it (None: nothing to read), kept in the trace so a proposer can
    tell a missing answer from a wrong one without seeing the gold answer; `answer`: what the reward was given
    (scored_answer)."""
    try:
        return domain.extract(answer)
    except Exception:  # the domain promises not to raise; a trace field is not worth the run
        return None
