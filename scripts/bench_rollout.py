"""
The episode runner's speed: (1) hf's shared prefill against a prefill per row, G samples of one long prompt,
and distinct prompts that open alike (the opening prefilled once); (2) the runner (rollout.run_episodes:
sandboxed workers, batching) against raw batched backend.generate on the same prompts and lengths, each
episode's fresh sandboxed interpreter charged to the runner. Both alternate their two sides for --rounds
rounds, so a shared machine's changing load hits both alike. Prints "prefix speedup = X" and "opening
speedup = X" (hf only: vllm and openai servers share prefixes on their own) and "ratio = X" (runner
tokens/s over direct tokens/s; 1.0: the runner costs nothing; docs/cpu-run/README.md quotes the measured figures).

    python scripts/bench_rollout.py --model smoke
    python scripts/bench_rollout.py --model cpu
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rollout  # noqa: E402
from domains import Domain  # noqa: E402
from lib.episodes import sandbox, switches  # noqa: E402
from lib.cli import Parser  # noqa: E402
from lib.common.argtypes import positive_int  # noqa: E402
from lib.backends.hf_backend import HFBackend  # noqa: E402
from lib.backends.models import chat_ids, shared_prefix  # noqa: E402
from lib.backends.policy import add_backend_args  # noqa: E402
from lib.episodes.worker_pool import POOL, Pool, Worker  # noqa: E402

BENCH_HARNESS = '''"""Bench: a few llm() calls with a fixed budget, nothing else."""
CALLS = 4
def run(task, llm, tools):
    for i in range(CALLS):
        llm([{"role": "user", "content": task["question"] + " call " + str(i)}])
    return {"answer": None}
'''


class BenchDomain(Domain):
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
    sandboxed = float("nan") if switches.disabled() else start_seconds(sandboxed=True)
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
            eps, batching = rollout.run_and_count(BenchDomain(), path, tasks, backend, max_new_tokens=max_new_tokens,
                                                  workers=episodes, seed=r, desc="bench")
            waited = time.time()
            POOL.wait_ready()  # the fresh sandboxes that replaced this call's: the runner's cost, so counted here
            seconds["b"] += time.time() - start
            seconds["wait"] += time.time() - waited
            tokens["b"] += sum(e["tokens"] for e in eps)
            errors = [e["error"] for e in eps if e["error"]]
            if errors:
                raise RuntimeError(f"bench episode failed: {errors[0]}")
            for key, n in batching.items():
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


def time_sharing(backend, rows, max_new_tokens, rounds):
    """-> {share_prefix: seconds}: the same rows and seeds generated with hf's prefix sharing on and off
    (EOS ignored), the two alternating for `rounds` rounds, as in bench; the backend ends sharing and reading EOS."""
    backend.ignore_eos = True
    backend.generate(rows[:2], max_new_tokens=2)  # warm up
    seconds = {True: 0.0, False: 0.0}
    for _ in range(rounds):
        for share in (True, False):
            backend.share_prefix = share
            start = time.time()
            backend.generate(rows, max_new_tokens=max_new_tokens, seeds=list(range(len(rows))))
            seconds[share] += time.time() - start
    backend.share_prefix, backend.ignore_eos = True, False
    return seconds


def prefix_bench(backend, samples=8, prompt_tokens=300, max_new_tokens=32, rounds=2):
    """G samples of one long prompt (EOS ignored): one shared prefill against a prefill per row, same rows and
    seeds. The two alternate for `rounds` rounds, as in bench."""
    words = (PREFIX_TEXT * prompt_tokens).split()
    for n in range(1, len(words) + 1):  # the shortest passage whose prompt reaches prompt_tokens
        prompt = chat_ids(backend.tokenizer, [{"role": "user", "content": " ".join(words[:n])}])
        if len(prompt) >= prompt_tokens:
            break
    seconds = time_sharing(backend, [prompt] * samples, max_new_tokens, rounds)
    print(f"prefix: {samples} samples x {max_new_tokens} tokens of one {len(prompt)}-token prompt, {rounds} rounds: "
          f"shared prefill {seconds[True]:.2f} s, a prefill per row {seconds[False]:.2f} s")
    print(f"prefix speedup = {seconds[False] / seconds[True]:.2f}")
    return seconds[False] / seconds[True]


OPENING = ("Answer the question. You may search an encyclopedia by writing <search>query</search>. Give the "
           "final answer, a few words only, as <answer>answer</answer>. Example: Question: Who founded the city? "
           "<search>city founded</search> Passage: ")


def opening_bench(backend, prompts=24, max_new_tokens=32, rounds=2):
    """Distinct prompts that open alike, one sample each (a harness set scored under one harness: its system
    turn and example open every prompt, EOS ignored): the opening prefilled once against a prefill per row."""
    rows = [chat_ids(backend.tokenizer, [{"role": "system", "content": OPENING + PREFIX_TEXT},
                                         {"role": "user", "content": f"Question {i}: {PREFIX_TEXT[:40 + 3 * i]}?"}])
            for i in range(prompts)]
    seconds = time_sharing(backend, rows, max_new_tokens, rounds)
    opening = shared_prefix(rows, backend.model.config)
    print(f"opening: {prompts} prompts of {min(map(len, rows))}-{max(map(len, rows))} tokens, {opening} of them "
          f"shared, x {max_new_tokens} tokens, {rounds} rounds: opening prefilled once {seconds[True]:.2f} s, "
          f"a prefill per row {seconds[False]:.2f} s")
    print(f"opening speedup = {seconds[False] / seconds[True]:.2f}")
    return seconds[False] / seconds[True]


SANDBOX_TRIAL = 16


def start_seconds(sandboxed, n=SANDBOX_TRIAL):
    """Wall seconds per worker to start n at once until all are ready, then kill them: what each episode costs."""
    saved = os.environ.get(switches.OPT_OUT)
    os.environ[switches.OPT_OUT] = "0" if sandboxed else "1"
    try:
        start, pool = time.time(), Pool()
        pool.idle = [Worker() for _ in range(n)]
        pool.wait_ready()
        pool.close()
        return (time.time() - start) / n
    finally:
        if saved is None:
            del os.environ[switches.OPT_OUT]
        else:
            os.environ[switches.OPT_OUT] = saved


def main():
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smoke", help="smoke | cpu | null (replies '' to every call) | hub id | local path")
    p.add_argument("--adapter", default=None, help="LoRA adapter folder")
    add_backend_args(p)
    sandbox.add_args(p)
    p.add_argument("--episodes", type=positive_int, default=64)
    p.add_argument("--calls", type=positive_int, default=4, help="llm() calls per bench episode")
    p.add_argument("--tokens", type=positive_int, default=64, help="tokens per llm() call")
    p.add_argument("--rounds", type=positive_int, default=2, help="alternating rounds of (a) and (b)")
    args = p.parse_args()
    sandbox.apply_args(args)
    backend = rollout.adapted_policy(args).backend
    if isinstance(backend, HFBackend):  # vllm and openai servers share prefixes on their own
        prefix_bench(backend, rounds=args.rounds)
        opening_bench(backend, rounds=args.rounds)
    bench(backend, episodes=args.episodes, calls=args.calls, max_new_tokens=args.tokens, rounds=args.rounds)


if __name__ == "__main__":
    main()
