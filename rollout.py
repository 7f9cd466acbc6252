r"""
The batched, sandboxed episode runner and mean@k evaluation (the policy and its backends:
lib/backends/policy.py).

    python rollout.py --domain chess --harness harnesses/chess.py --model smoke --split test \
        --k 8 --limit 4 --out out/eval
    python rollout.py --domain searchqa --harness harnesses/searchqa.py --model cpu --k 2 \
        --limit 4 --out out/sq
    python rollout.py --domain math --harness my_math.py --preset cpu --split harness   # as the cpu search scores it
    python rollout.py --domain math --harness my_math.py --preset cpu --split test      # as the cpu table does
    python rollout.py --domain countdown --harness my_countdown.py --preset cpu --split train --limit 3 --k 1 \
        --show   # a new harness on three tasks, each episode's calls, replies, answer and error printed

--preset takes whale.py's preset (presets.py): its model, sampling and data flags, and the split's size as the
preset's run draws it (harness: --harness-tasks tasks x --harness-samples; test: --test-limit tasks past
--test-holdout, mean@--k; train: --train-limit tasks x --group, as RSFT samples them); any flag given still wins.

A harness is untrusted Python, `run(task, llm, tools)`: each episode runs it in a fresh sandboxed worker, and the
runner (lib/episodes/runner.py) batches the llm() requests of every live episode into one `generate` call, answers the
tool calls, records the exact token ids and computes the reward. mean@k = per-task success rate over k samples,
averaged over tasks. How the runner works (caps, seeds, the error budget): docs/design.md section 4.
"""
import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from lib.backends.policy import add_backend_args, load_policy
from lib.cli import Parser, check_out, conflicting_flags, one_line_errors, sampling_of
from lib.common.argtypes import nonnegative_float, nonnegative_int, positive_float, positive_int, seed_int, share
from lib.common.errors import InfrastructureError
from lib.episodes import sandbox
from lib.episodes.runner import MAX_PROMPT_TOKENS, Episode, Runner
from lib.subsets import seeded_sample
from presets import add_preset_arg, choose_threads, parse_with_preset


# -----------------------------------------------------------------------------
# sampling flags, shared by every script that runs episodes

def add_sampling_args(p):
    """Sampling flags, the runner's width and torch's threads, shared by every script that runs episodes (the sandbox's
    switches: add_sandbox_args)."""
    # sampling (paper: temperature 1.0, top-k 20, top-p 1.0, for training and test alike; top-p has no
    # flag: the engines always send the official 1.0, lib/backends/engines.py TOP_P, because a `vllm serve` fills a
    # missing one from the model's generation_config.json) and the runner
    p.add_argument("--temperature", type=nonnegative_float, default=1.0, help="0 = greedy")
    p.add_argument("--top-k", type=nonnegative_int, default=20, help="0 = off")
    p.add_argument("--max-new-tokens", type=positive_int, default=256, help="cap per llm() call")
    p.add_argument("--thinking", default="auto", choices=("on", "off", "auto"),
                   help="the chat template's enable_thinking switch; auto: on where the template "
                        "has it (Qwen3.5 thinks only when it is on), else not passed")
    p.add_argument("--episode-tokens", type=positive_int, default=None,
                   help="assistant-token budget per episode: each llm() call gets at most what is "
                        "left, then an empty reply (paper: 8192; default: none)")
    p.add_argument("--max-prompt-tokens", type=positive_int, default=None,
                   help=f"longest first prompt of an episode (paper: 2048, chess 4096); a longer "
                        f"one is refused (default {MAX_PROMPT_TOKENS})")
    p.add_argument("--deadline", type=positive_float, default=120.0,
                   help="seconds of harness time per episode")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="concurrent episodes (default min(64, episodes))")
    p.add_argument("--threads", type=threads_arg, default=None,
                   help="torch CPU threads, or auto: one for each core this process may use that no other process "
                        "keeps busy, at least one (default: torch's own; the cpu preset: auto)")


def add_sandbox_args(parser):
    """The sandbox's switches and the runner's error budget, a group of their own on every CLI that runs episodes
    (whale.py --help names it; --help-all lists it)."""
    g = parser.add_argument_group("sandbox and runner (harness code, the python tool and proposers run in the OS "
                                  "sandbox; episodes that fail outside the harness stop a run)")
    sandbox.add_args(g)
    g.add_argument("--infra-budget", type=share, default=INFRA_BUDGET,
                   help="stop the run when more than this share of a phase's episodes failed "
                        "outside the harness (a worker that did not start, a tool server that did "
                        "not answer)")


def threads_arg(text):
    return text if text == "auto" else positive_int(text)


def apply_args(args):
    """--infra-budget for every run_episodes call of this process (not a sampling setting: results
    never depend on it, so it is not part of what a resumed or reused run must match), and --threads: auto is
    chosen here, at the start, from what the machine is doing (presets.choose_threads), and said in one line."""
    INFRA_ERRORS.share = args.infra_budget
    if getattr(args, "threads", None) == "auto":
        args.threads, why = choose_threads()
        print(f"torch threads: {args.threads} ({why}; --threads N sets it)", flush=True)
    if getattr(args, "threads", None):
        import torch  # here: rollout.py's own import stays light (report.py and domains.py import it)
        torch.set_num_threads(args.threads)


# -----------------------------------------------------------------------------
# the error budget: episodes that failed outside the harness's own code

INFRA_BUDGET = 0.05  # default --infra-budget


class InfraErrorBudget:
    """Episodes that failed outside the harness's own code (its worker did not start, a tool server
    did not answer, the sandbox was refused), per phase. Each scores 0 like a harness's own failure,
    so past a small share a phase's scores measure the machine, not the candidates: the run stops
    with one line naming the cause. Checked after every run_episodes call on the phase so far.
    whale.py names the phases; a lone rft.py, meta_harness.py or rollout.py run is one phase. Starts
    tried again (sandbox.start_retries) are counted beside them."""

    def __init__(self, share=INFRA_BUDGET):
        self.share = share
        self.start_phase("the run")

    def start_phase(self, name):
        self.phase, self.episodes, self.failures = name, 0, 0
        self.retries_before = sandbox.start_retries

    def counts(self):
        """The phase's counters for its metrics row."""
        return {"infra_failures": self.failures,
                "start_retries": sandbox.start_retries - self.retries_before}

    def add(self, episodes, errors):
        """A run_episodes call's episodes and the errors of those that failed outside the harness."""
        self.episodes += episodes
        self.failures += len(errors)
        if errors and self.failures > self.share * self.episodes:
            raise InfrastructureError(f"{self.failures} of {self.episodes} episodes of "
                                      f"{self.phase} failed outside the harness, over "
                                      f"--infra-budget {self.share:g}; the last: {errors[-1]}")


INFRA_ERRORS = InfraErrorBudget()


def run_episodes(domain, harness_path, tasks, backend, **kw):
    """Run the harness on every (task, sample); -> episode dicts, task-major (docs/design.md section 4)."""
    return run_and_count(domain, harness_path, tasks, backend, **kw)[0]


def run_and_count(domain, harness_path, tasks, backend, *, samples=1, temperature=1.0, top_k=20,
                  max_new_tokens=256, deadline_s=120.0, workers=None, seed=0, traces_path=None,
                  desc="episodes", thinking="auto", episode_tokens=None, max_prompt_tokens=None,
                  max_model_len=None):
    """run_episodes, and how the runner batched them: -> (episodes, {"generate_calls", "llm_calls",
    "generate_s"}) (scripts/bench_rollout.py, scripts/calibrate_cpu_h0.py)."""
    episodes = [Episode(i * samples + s, t, s, domain.public(t)) for i, t in enumerate(tasks)
                for s in range(samples)]
    runner = Runner(domain, harness_path, backend, temperature=temperature, top_k=top_k,
                    max_new_tokens=max_new_tokens, deadline_s=deadline_s,
                    workers=workers or min(64, len(episodes)), seed=seed, thinking=thinking,
                    episode_tokens=episode_tokens, max_prompt_tokens=max_prompt_tokens,
                    max_model_len=max_model_len, traces_path=traces_path)
    records = runner.run(episodes, desc) if episodes else []
    counts = {"generate_calls": runner.generate_calls, "llm_calls": runner.llm_calls,
              "generate_s": runner.generate_s}
    INFRA_ERRORS.add(len(records), runner.infra_errors)  # after the traces: they show what failed
    return records, counts


def evaluate(domain, harness_path, tasks, backend, k=8, **kw):
    """mean@k: each task's success rate over k samples, averaged over tasks (not pass@k)."""
    start = time.time()
    kw = {"desc": f"mean@{k}", **kw}
    eps = run_episodes(domain, harness_path, tasks, backend, samples=k, **kw)
    per_task = {}
    for e in eps:
        per_task.setdefault(e["task_id"], []).append(e["reward"])
    per_task = {t: sum(r) / len(r) for t, r in per_task.items()}
    n = max(len(eps), 1)
    return {"mean_at_k": sum(per_task.values()) / max(len(per_task), 1), "k": k,
            "per_task": per_task, "mean_turns": sum(e["turns"] for e in eps) / n,
            "tokens": sum(e["tokens"] for e in eps),
            "rollouts": len(eps), "errors": sum(e["error"] is not None for e in eps),
            "seconds": round(time.time() - start, 2), "scoring": domain.scoring_rule()}


# -----------------------------------------------------------------------------
# CLI

def adapted_policy(args):
    """The policy for --model with --adapter: the trainer-side model holds it, and the vllm and
    openai engines load it too and pass the canary before the first episode; a bad folder or a
    refused engine option is one line."""
    if args.adapter and not os.path.isfile(os.path.join(args.adapter, "adapter_config.json")):
        raise SystemExit(f"--adapter {args.adapter}: no adapter_config.json there; pass a LoRA "
                         "folder such as OUT/ckpt/adapter from rft.py")
    try:
        return load_policy(args, adapter=args.adapter)
    except (ValueError, RuntimeError) as e:
        raise SystemExit(str(e).splitlines()[0])


def main(argv=None):
    import domains
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, short_help=True)
    # what to evaluate
    p.add_argument("--domain", choices=list(domains.DOMAINS))
    p.add_argument("--harness", help="harness file, e.g. harnesses/chess.py")
    p.add_argument("--split", default="test", choices=["train", "harness", "test"])
    p.add_argument("--limit", type=positive_int, default=None,
                   help="a seeded sample of N tasks of the split")
    p.add_argument("--k", type=positive_int, default=8, help="samples per task (mean@k)")
    p.add_argument("--test-holdout", type=nonnegative_int, default=0,
                   help="--split test: never draw the first N test tasks (as whale.py's test evaluation)")
    add_preset_arg(p)
    p.add_argument("--out", default=None, help="folder for traces.jsonl and results.json")
    p.add_argument("--show", action="store_true",
                   help="print each episode's trace as it is scored (its calls, replies, tool calls, answer, reward "
                        "and error): a harness's runtime bug in seconds, on a few tasks (--limit 3 --k 1)")
    # model and sampling
    p.add_argument("--model", default="smoke", help="smoke | cpu | null (replies '' to every call) | hub id | local path")
    p.add_argument("--adapter", default=None, help="LoRA adapter folder")
    p.add_argument("--seed", type=seed_int, default=0)
    # named in --help, listed in --help-all
    add_sampling_args(p.add_argument_group("sampling"))
    add_backend_args(p)
    domains.add_args(p)  # --data paper, --math-test-set ...
    add_sandbox_args(p)
    args = parse_with_preset(p, argv)  # the preset's defaults (its sizes of --split), any flag given over them
    if not args.domain or not args.harness:
        p.error("pass --domain and --harness")
    if args.test_holdout and args.split != "test":
        p.error(f"--test-holdout holds out test tasks, and --split {args.split} draws none: drop it, or use --split test")
    if conflicting_flags(args):
        p.error(conflicting_flags(args))
    with one_line_errors("rollout.py"):
        evaluate_cli(args, domains)


def shown_trace(row, width=600):
    """One episode's trace as --show prints it: the task and its score, then each model call's last message and
    reply, each tool call, each cut to `width` characters."""
    def cut(text):
        text = text if len(text) <= width else text[:width] + f"... ({len(text)} chars)"
        return text.replace("\n", "\n    ")
    lines = [f"== {row['task_id']} sample {row['sample']}: reward {row['reward']}, turns {row['turns']}, answer "
             f"{cut(repr(row['answer']))}" + (f", error {cut(str(row['error']))}" if row.get("error") else "")]
    for i, call in enumerate(row["calls"], 1):
        last = (call.get("messages") or [{}])[-1]
        lines += [f"  call {i} {last.get('role', '?')}: {cut(str(last.get('content', '')))}",
                  f"  call {i} reply: {cut(call.get('completion', ''))}"]
    lines += [f"  tool call: {cut(json.dumps(t))}" for t in row.get("tool_calls", [])]
    return "\n".join(lines)


def evaluate_cli(args, domains):
    """rollout.py's run: every check before the model loads, then mean@k with traces and results in --out."""
    sandbox.apply_args(args)
    apply_args(args)
    check_out(args.out)
    domain, tasks = domains.check_inputs(args, args.split)
    held_out = {t["id"] for t in tasks[: args.test_holdout]} if args.split == "test" else ()
    tasks = seeded_sample(tasks, args.limit, exclude=held_out)
    policy = adapted_policy(args)
    out = Path(args.out) if args.out else None
    traces = None
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(vars(args), indent=1))
        traces = out / "traces.jsonl"
        traces.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        traces = traces or (Path(tmp, "traces.jsonl") if args.show else None)  # --show reads them back
        stats = evaluate(domain, args.harness, tasks, policy, k=args.k, **sampling_of(args).kwargs(),
                         seed=args.seed, traces_path=traces)
        if args.show:
            for line in traces.read_text().splitlines():
                print(shown_trace(json.loads(line)))
    if out:
        (out / "results.json").write_text(json.dumps(stats, indent=1))
    print(f"tasks {len(tasks)}  rollouts {stats['rollouts']}  errors {stats['errors']}  mean turns "
          f"{stats['mean_turns']:.2f}  tokens {stats['tokens']}  seconds {stats['seconds']}")
    print(f"mean@{args.k} = {stats['mean_at_k']:.4f} (scored on {stats['scoring']})")


if __name__ == "__main__":
    main()
