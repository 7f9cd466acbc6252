"""
The batched, sandboxed episode runner and mean@k evaluation (the policy and its backends: lib/policy.py).

    python rollout.py --domain chess --harness harnesses/chess.py --model smoke --split test --k 8 --limit 4 --out out/eval
    python rollout.py --domain searchqa --harness harnesses/searchqa.py --model cpu --k 2 --limit 4 --out out/sq

Algorithm. A harness is untrusted Python: `run(task, llm, tools)`. Each episode runs it in its own worker
(lib/harness_process.py) inside the OS sandbox (lib/sandbox.py: no project folder, no data, no other process, no
network), so it holds no answers and no hidden tool state. The worker talks JSON lines over its own pipes:
it asks for `llm(messages, tools, max_tokens, stop)` or a tool call and waits for the reply. The parent
process holds the tasks, the tools and the model; it checks every request (lib/protocol.py), renders it
through the model's chat template (tool schemas in the model's native format, thinking per --thinking),
answers tool calls from a thread pool and collects the llm() requests of all episodes, and when every live
episode is waiting (or the rest are busy for a while) it samples them all in ONE batched `backend.generate`
call. It records the exact prompt and completion token ids of every call, and cuts the reply text after
the first stop string. Each call's token cap is the harness's and --max-new-tokens, cut to what is left of
the episode's assistant-token budget (--episode-tokens) and of the model length; once nothing is left, the
reply is empty (docs/protocol.md section 2). So is every request past the official caps on an episode's model
calls, whatever the harness asks (lib/protocol.py MODEL_CALL_CAPS: searchqa and math 16; chess 18, and 10
retries of each kind). When an episode ends (done, error, its deadline, a forged request: reward 0, error in
the trace) its sandbox is killed with every process and thread in it, and a fresh one starts in its place:
every episode gets a fresh interpreter (started ones wait in a pool across calls, so an episode rarely waits).
An episode lost outside the harness's own code (its worker did not start, a tool server or the python tool's
sandbox failed: lib.protocol.InfrastructureError) also scores 0, but counts against its phase's error budget,
not the candidate: past --infra-budget (5 %) of a phase's episodes the run stops with one line (ErrorBudget).
Seeds: each call's sampling seed and the harness's `random` seed come from (--seed, the episode's index,
task id, sample, call number): the same prompt twice in one batch gets two rollouts, a rerun the same ones.
The parent computes the reward from the returned answer. mean@k = per-task success rate over k samples,
averaged over tasks. The runner's overhead over raw batched generation: scripts/bench_rollout.py.
"""
import argparse
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

from lib import sandbox
from lib.cli import (Parser, check_out, conflicting_flags, nonnegative_float, nonnegative_int, one_line_errors,
                     positive_float, positive_int, seed_int, share)
from lib.contract import ALLOWED_IMPORTS, check_harness
from lib.models import chat_ids, thinking_switch
from lib.policy import add_backend_args, load_policy
from lib.protocol import (MAX_CHARS, MAX_LINE, MAX_LLM_CALLS, MAX_PROMPT_TOKENS, MAX_RETRIES, MAX_TOOL_CALLS,
                          MODEL_CALL_CAPS, STDOUT_KEEP, InfrastructureError, cut_at_stop, exception_reply,
                          llm_request, tool_request)
from lib.worker_pool import POOL, worker_memory_bytes


# -----------------------------------------------------------------------------
# sampling flags, shared by every script that runs episodes

def add_sampling_args(p):
    """Sampling and runner flags, shared by every script that runs episodes."""
    # sampling (paper: temperature 1.0, top-k 20, for training and test alike; its top-p 1.0 is no filter,
    # which is every backend's default, so there is no flag for it) and the runner
    p.add_argument("--temperature", type=nonnegative_float, default=1.0, help="0 = greedy")
    p.add_argument("--top-k", type=nonnegative_int, default=20, help="0 = off")
    p.add_argument("--max-new-tokens", type=positive_int, default=256, help="cap per llm() call")
    p.add_argument("--thinking", default="auto", choices=("on", "off", "auto"),
                   help="the chat template's enable_thinking switch; auto: on where the template has it (Qwen3.5 "
                        "thinks only when it is on), else not passed")
    p.add_argument("--episode-tokens", type=positive_int, default=None,
                   help="assistant-token budget per episode: each llm() call gets at most what is left, then an "
                        "empty reply (paper: 8192; default: none)")
    p.add_argument("--max-prompt-tokens", type=positive_int, default=None,
                   help=f"longest first prompt of an episode (paper: 2048, chess 4096); a longer one is refused "
                        f"(default {MAX_PROMPT_TOKENS})")
    p.add_argument("--deadline", type=positive_float, default=120.0, help="seconds of harness time per episode")
    p.add_argument("--workers", type=positive_int, default=None, help="concurrent episodes (default min(64, episodes))")
    p.add_argument("--infra-budget", type=share, default=INFRA_BUDGET,
                   help="stop the run when more than this share of a phase's episodes failed outside the harness "
                        "(a worker that did not start, a tool server that did not answer)")
    sandbox.add_args(p)


def apply_args(args):
    """--infra-budget for every run_episodes call of this process (not a sampling setting: results never depend
    on it, so it is not part of what a resumed or reused run must match)."""
    BUDGET.share = args.infra_budget


def sampling_kwargs(args):
    """The add_sampling_args flags as run_episodes/evaluate keyword arguments."""
    # the generation flags by getattr: callers that build args by hand (tests) set only the ones above
    return dict(temperature=args.temperature, top_k=args.top_k, max_new_tokens=args.max_new_tokens,
                deadline_s=args.deadline, workers=args.workers, thinking=getattr(args, "thinking", "auto"),
                episode_tokens=getattr(args, "episode_tokens", None),
                max_prompt_tokens=getattr(args, "max_prompt_tokens", None),
                max_model_len=getattr(args, "max_model_len", None))


# -----------------------------------------------------------------------------
# the error budget: episodes that failed outside the harness's own code

INFRA_BUDGET = 0.05  # default --infra-budget


class ErrorBudget:
    """Episodes that failed outside the harness's own code (its worker did not start, a tool server did not
    answer, the sandbox was refused), per phase. Each scores 0 like a harness's own failure, so past a small
    share a phase's scores measure the machine, not the candidates: the run stops with one line naming the
    cause. Checked after every run_episodes call on the phase so far. whale.py names the phases; a lone
    rft.py, meta_harness.py or rollout.py run is one phase. Starts tried again (sandbox.start_retries) are
    counted beside them."""

    def __init__(self, share=INFRA_BUDGET):
        self.share = share
        self.start_phase("the run")

    def start_phase(self, name):
        self.phase, self.episodes, self.failures, self.retries_before = name, 0, 0, sandbox.start_retries

    def counts(self):
        """The phase's counters for its metrics row."""
        return {"infra_failures": self.failures, "start_retries": sandbox.start_retries - self.retries_before}

    def add(self, episodes, errors):
        """A run_episodes call's episodes and the errors of those that failed outside the harness."""
        self.episodes += episodes
        self.failures += len(errors)
        if errors and self.failures > self.share * self.episodes:
            raise InfrastructureError(f"{self.failures} of {self.episodes} episodes of {self.phase} failed outside "
                                      f"the harness, over --infra-budget {self.share:g}; the last: {errors[-1]}")


BUDGET = ErrorBudget()


# -----------------------------------------------------------------------------
# the runner: parent side

BATCH_WAIT_S = 0.1        # least time a busy episode may hold back a batch (see Runner.hold_s)
# domains whose episode scores 0 once it asks for a call that its token budget or the model length cannot
# hold: the official chess agent loop forces the reward to 0; searchqa and math score the last turn
OUT_OF_TOKENS_SCORES_ZERO = ("chess",)


def call_seed(*parts):
    """A seed from the parts, the same in every process (unlike hash(), which is salted per process)."""
    return int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest(), "big") >> 2


class Episode:
    def __init__(self, index, task, sample, public):
        self.index, self.task, self.sample, self.public = index, task, sample, public
        self.calls, self.tool_calls, self.record = [], [], None
        self.asked, self.out_of_tokens = 0, False  # llm() requests so far; whether one found no tokens left
        self.capped = False  # whether a request went past the domain's caps on model calls (MODEL_CALL_CAPS)
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
                 seed, thinking="auto", episode_tokens=None, max_prompt_tokens=None, max_model_len=None):
        sandbox.check()  # once per process: fails closed, naming --unsafe-no-sandbox
        self.source = check_harness(harness_path)
        self.domain, self.path, self.backend, self.seed = domain, str(harness_path), backend, seed
        self.gen_kw = dict(temperature=temperature, top_k=top_k)
        self.max_new_tokens, self.deadline_s, self.n_workers = max_new_tokens, deadline_s, workers
        self.thinking = thinking_switch(backend.tokenizer, thinking)
        self.episode_tokens = episode_tokens
        self.max_prompt_tokens = max_prompt_tokens or MAX_PROMPT_TOKENS
        # the model length bounds prompt + completion; unknown (tests), room for any first prompt and a full cap
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
        if ep.out_of_tokens and getattr(self.domain, "name", None) in OUT_OF_TOKENS_SCORES_ZERO:
            reward = 0.0
        ep.record = {"task_id": ep.task["id"], "sample": ep.sample, "reward": reward, "answer": answer,
                     "extracted": extracted_answer(self.domain, answer), "error": error, "turns": len(ep.calls), "tokens": sum(len(c["completion_ids"]) for c in ep.calls),
                     "seconds": round(now - ep.start, 3), "calls": ep.calls, "tool_calls": ep.tool_calls,
                     "stdout": stdout, "out_of_tokens": ep.out_of_tokens, "capped": ep.capped}
        ep.state = "done"
        self.running.discard(ep)
        self.bar.update(1)

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
            ep.tool_calls.append({"name": name, "args": args, "kwargs": kwargs, "result": None})
            ep.state, ep.since = "tool", now
            ep.future = self.pool.submit(getattr(ep.tools, name), *args, **kwargs)
            ep.future.add_done_callback(self.wake)
        else:
            raise ValueError(f"unknown message {str(msg)[:200]}")

    def past_cap(self, ep):
        """Whether this llm() request goes past the domain's caps: its model calls (MODEL_CALL_CAPS) or, in chess,
        MAX_RETRIES of either kind of retry."""
        name = getattr(self.domain, "name", None)
        if name == "chess":
            self.count_retry(ep)
        return len(ep.calls) >= MODEL_CALL_CAPS.get(name, MAX_LLM_CALLS) or max(ep.retries.values()) > MAX_RETRIES

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
            line = json.dumps(value)
            reply = {"value": value} if len(line) <= MAX_LINE else {"raise": "RuntimeError",
                                                                   "message": "tool result too large"}
        except InfrastructureError as e:  # a tool server or sandbox that failed: not a result the harness may read
            self.lose(ep, f"tools.{ep.tool_calls[-1]['name']}: {e}")
            return self.retire(ep.worker)
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
                            "completion": text, "stop": e.request[3], "tokens": len(ids), "max_tokens": e.request[2]})
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
                self.on_message(w, msg, time.time())
            except Exception as e:  # a harness can write to its pipe directly: forged messages cost its episode
                return self.fail(w.episode, f"protocol violation: {type(e).__name__}: {e}"[:500], w) if w.episode \
                    else self.retire(w)
        if w in self.workers and len(w.inbuf) > MAX_LINE:
            self.fail(w.episode, f"a message over {MAX_LINE} bytes", w) if w.episode else self.retire(w)


def extracted_answer(domain, answer):
    """The answer as the domain's reward reads it (None: nothing to read), kept in the trace so a proposer can
    tell a missing answer from a wrong one without seeing the gold answer."""
    if not hasattr(domain, "extract"):  # a stand-in domain (tests): the answer as given
        return answer if isinstance(answer, str) else None
    try:
        return domain.extract(answer)
    except Exception:  # the domain promises not to raise; a trace field is not worth the run
        return None


def run_episodes(domain, harness_path, tasks, backend, **kw):
    """Run the harness on every (task, sample); -> episode dicts, task-major (docs/design.md section 4)."""
    return run_and_count(domain, harness_path, tasks, backend, **kw)[0]


def run_and_count(domain, harness_path, tasks, backend, *, samples=1, temperature=1.0, top_k=20, max_new_tokens=256,
                  deadline_s=120.0, workers=None, seed=0, traces_path=None, desc="episodes", thinking="auto",
                  episode_tokens=None, max_prompt_tokens=None, max_model_len=None):
    """run_episodes, and how the runner batched them: -> (episodes, {"generate_calls", "llm_calls",
    "generate_s"}) (scripts/bench_rollout.py, scripts/calibrate_cpu_h0.py)."""
    episodes = [Episode(i * samples + s, t, s, domain.public(t)) for i, t in enumerate(tasks)
                for s in range(samples)]
    runner = Runner(domain, harness_path, backend, temperature=temperature, top_k=top_k,
                    max_new_tokens=max_new_tokens, deadline_s=deadline_s, workers=workers or min(64, len(episodes)),
                    seed=seed, thinking=thinking, episode_tokens=episode_tokens,
                    max_prompt_tokens=max_prompt_tokens, max_model_len=max_model_len)
    records = runner.run(episodes, desc) if episodes else []
    counts = {"generate_calls": runner.generate_calls, "llm_calls": runner.llm_calls, "generate_s": runner.generate_s}
    if traces_path:
        Path(traces_path).parent.mkdir(parents=True, exist_ok=True)
        with open(traces_path, "a") as f:
            for r in records:
                calls = [{k: v for k, v in c.items() if not k.endswith("_ids")} for c in r["calls"]]
                f.write(json.dumps({**r, "calls": calls}) + "\n")
    BUDGET.add(len(records), runner.infra_errors)  # after the traces: they show what failed
    return records, counts


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
# CLI

def adapted_policy(args):
    """The policy for --model with --adapter: the trainer-side model holds it, and the vllm and openai engines load
    it too and pass the canary before the first episode; a bad folder or a refused engine option is one line."""
    if args.adapter and not os.path.isfile(os.path.join(args.adapter, "adapter_config.json")):
        raise SystemExit(f"--adapter {args.adapter}: no adapter_config.json there; pass a LoRA folder such as "
                         "OUT/ckpt/adapter from rft.py")
    try:
        return load_policy(args, adapter=args.adapter)
    except (ValueError, RuntimeError) as e:
        raise SystemExit(str(e).splitlines()[0])


def main(argv=None):
    import domains
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # what to evaluate
    p.add_argument("--domain", choices=["searchqa", "math", "chess"])
    p.add_argument("--harness", help="harness file, e.g. harnesses/chess.py")
    p.add_argument("--split", default="test", choices=["train", "harness", "test"])
    p.add_argument("--limit", type=positive_int, default=None, help="a seeded sample of N tasks of the split")
    p.add_argument("--k", type=positive_int, default=8, help="samples per task (mean@k)")
    p.add_argument("--out", default=None, help="folder for traces.jsonl and results.json")
    # model and sampling
    p.add_argument("--model", default="smoke", help="smoke | cpu | hub id | local path")
    p.add_argument("--adapter", default=None, help="LoRA adapter folder")
    add_sampling_args(p)
    add_backend_args(p)
    p.add_argument("--seed", type=seed_int, default=0)
    domains.add_args(p)  # --data paper, --math-test-set ...
    args = p.parse_args(argv)
    if not args.domain or not args.harness:
        p.error("pass --domain and --harness")
    if conflicting_flags(args):
        p.error(conflicting_flags(args))
    with one_line_errors("rollout.py"):
        evaluate_cli(args, domains)


def evaluate_cli(args, domains):
    """rollout.py's run: every check before the model loads, then mean@k with traces and results in --out."""
    sandbox.apply_args(args)
    apply_args(args)
    check_out(args.out)
    domain, tasks = domains.check_inputs(args, args.split)
    tasks = domains.seeded_sample(tasks, args.limit)
    policy = adapted_policy(args)
    out = Path(args.out) if args.out else None
    traces = None
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(vars(args), indent=1))
        traces = out / "traces.jsonl"
        traces.unlink(missing_ok=True)
    stats = evaluate(domain, args.harness, tasks, policy, k=args.k, **sampling_kwargs(args), seed=args.seed,
                     traces_path=traces)
    if out:
        (out / "results.json").write_text(json.dumps(stats, indent=1))
    print(f"tasks {len(tasks)}  rollouts {stats['rollouts']}  errors {stats['errors']}  mean turns "
          f"{stats['mean_turns']:.2f}  tokens {stats['tokens']}  seconds {stats['seconds']}")
    print(f"mean@{args.k} = {stats['mean_at_k']:.4f}")


if __name__ == "__main__":
    main()
