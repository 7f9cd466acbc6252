"""The preflight (`python plan.py --check`, run_all.sh's first step): each resource a run needs, checked before any
model loads, each failure one line naming its fix. The retriever, the proposer's endpoints and the hub are
stand-ins on loopback or in a temp folder; nothing here reaches the network."""
import gzip
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import types
from functools import partial
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch

import domains
import plan
import presets
import whale
from lib.paper import retriever
from lib.common.errors import SandboxError
from lib.backends import models
from lib.episodes import sandbox, switches
from lib.ops import hub, preflight

ROOT = Path(__file__).resolve().parent.parent
WIKI = [{"id": "0", "contents": '"Zarnoth River"\nThe Zarnoth River flows through Kelmar and ends in the Sea of Vost.'},
        {"id": "1", "contents": '"Kelmar"\nKelmar is a city founded in 1342 by the weaver Oda Prell.'}]
PAPER_DATASETS = ("PeterJinGo/nq_hotpotqa_train", "RUC-NLPIR/FlashRAG_datasets", "BytedTsinghua-SIA/DAPO-Math-17k",
                  "Maxwell-Jia/AIME_2024", "yentinglin/aime_2025", "Lichess/chess-puzzles")


def run_args(*argv, preset="paper", domain="searchqa"):
    return whale.parse_args(["--preset", preset, "--domain", domain, *argv])[0]


def check(fn, *args):
    """(ok, line): what one check says."""
    try:
        return True, fn(*args)
    except preflight.Failed as e:
        return False, str(e)


def fake_hub_cache(root, models=(), datasets=()):
    """A Hugging Face hub cache holding these repos, as `hf download` leaves it (refs/main -> snapshots/<commit>)."""
    for kind, names in (("models", models), ("datasets", datasets)):
        for name in names:
            repo = root / f"{kind}--{name.replace('/', '--')}"
            (repo / "refs").mkdir(parents=True)
            (repo / "refs" / "main").write_text("abc123")
            snap = repo / "snapshots" / "abc123"
            snap.mkdir(parents=True)
            if kind == "models":
                (snap / "config.json").write_text("{}")
                (snap / "model.safetensors").write_bytes(b"\0" * 4096)
            else:
                (snap / "train.parquet").write_bytes(b"PAR1")
    return root


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """An empty hub cache and HF_HUB_OFFLINE=1: a repo counts as there only if the test caches it. The hub
    read its variables at import, so the test patches its constants, and the variable for our own checks."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    return cache


def fake_cli(folder, name, script):
    """An executable `name` in `folder` (a shell script)."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path


CLAUDE_LOGGED_IN = """case "$1" in
  --version) echo "2.1.197 (Claude Code)" ;;
  auth) echo '{"loggedIn": true, "authMethod": "claude.ai"}' ;;
esac
"""


def serve(handler):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def json_handler(answer, log=None):
    """A server answering every GET and POST with answer(path, request) as JSON."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, req):
            if log is not None:
                log.append((self.path, req))
            body = json.dumps(answer(self.path, req)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self.reply(None)

        def do_POST(self):
            self.reply(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
    return Handler


def search_r1(path, req):
    """Search-R1's /retrieve: with return_scores each hit is {"document": {...}, "score": s}."""
    hits = [[{"document": WIKI[i % 2], "score": 1.0 / (i + 1)} for i in range(req["topk"])] for _ in req["queries"]]
    return {"result": hits if req["return_scores"] else [[h["document"] for h in q] for q in hits]}

# -----------------------------------------------------------------------------
# done when: the paper preset without a retriever stops in seconds with one line, before any model loads


def test_paper_run_all_without_a_retriever_exits_in_seconds_with_one_line(tmp_path):
    """run_all.sh with PRESET=paper where everything else is in place (models and datasets cached, vllm importable,
    Claude Code logged in): the preflight's one line, exit 1, no traceback, no run folder."""
    bin_dir, stubs = tmp_path / "bin", tmp_path / "stubs"
    fake_cli(bin_dir, "claude", CLAUDE_LOGGED_IN)
    for package in ("vllm", "datasets"):  # importable stand-ins of the GPU extra
        (stubs / package).mkdir(parents=True)
        (stubs / package / "__init__.py").write_text('__version__ = "0.33.0"\n')
    cache = fake_hub_cache(tmp_path / "hub", models={d["model"] for d in presets.PAPER.values()},
                           datasets=PAPER_DATASETS)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    env.update(PRESET="paper", PATH=f"{bin_dir}:{os.path.dirname(sys.executable)}:{env['PATH']}",
               PYTHONPATH=str(stubs), HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    # the timeout only guards against a hang: the one FAIL line below says the preflight stopped it, before a model
    done = subprocess.run(["bash", str(ROOT / "run_all.sh")], env=env, capture_output=True, text=True, timeout=300)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 1, done.returncode
    assert len(lines) == 1 and lines[0].startswith("FAIL retriever: searchqa on the paper's data needs a retriever"), lines
    assert "scripts/search_r1_retriever.sh setup DIR" in lines[0] and 'DOMAINS="math chess"' in lines[0]
    # the bm25s way out it offers is one the paper preset takes: it names the flag that lets it
    assert "--wiki wiki-18.jsonl.gz" in lines[0] and "only with --paper-with-bm25" in lines[0]
    assert "Traceback" not in done.stderr


def test_bundled_presets_pass_with_one_ok_line_per_resource(capsys):
    with pytest.raises(SystemExit) as e:
        plan.main(["--check", "searchqa", "math", "chess", "--preset", "smoke", "--domain", "math"])
    out = capsys.readouterr().out.splitlines()
    assert e.value.code == 0 and all(line.startswith("ok   ") for line in out)
    names = [line[5:].split(":")[0] for line in out]
    assert names == ["harness (math)", "harness (searchqa)", "harness (chess)", "data (math)", "data (searchqa)",
                     "data (chess)", "model (smoke)", "engine (hf)", "proposer (mutate)", "sandbox",
                     "open files", "gpu"]  # the shared resources once


def test_the_harness_line_is_the_runs_own_check(capsys):
    """--check runs domains.check_harness, the check every CLI makes (domains.check_inputs), as its harness line."""
    with pytest.raises(SystemExit) as e:
        plan.main(["--check", "--preset", "smoke", "--domain", "math", "--harness", "harnesses/searchqa.py"])
    fails = capsys.readouterr().err.splitlines()
    with pytest.raises(ValueError) as cli:
        domains.check_inputs(run_args("--harness", "harnesses/searchqa.py", preset="smoke", domain="math"))
    assert e.value.code == 1 and fails == [f"FAIL harness (math): {cli.value}"]


def test_every_failure_is_a_line_and_a_broken_check_too(monkeypatch, capsys):
    monkeypatch.setattr(preflight, "check_data", lambda args, domain_of: {}["boom"])
    monkeypatch.setattr(preflight, "check_proposer", lambda args: (_ for _ in ()).throw(preflight.Failed("fix it")))
    assert preflight.main([run_args(preset="smoke", domain="math")], domain_of=domains.from_args) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["FAIL data (math): the check itself failed (KeyError: 'boom')", "FAIL proposer (mutate): fix it"]


def test_weight_only_needs_no_proposer_and_report_to_needs_its_package(monkeypatch):
    names = [name for name, _ in preflight.plan([run_args("--method", "weight-only", "--report-to", "wandb")])]
    assert "proposer (claude)" not in names and "report-to (wandb)" in names
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    monkeypatch.setattr(preflight.report_to.importlib.util, "find_spec", lambda name: None)
    assert check(preflight.check_report, "wandb") == (False, "--report-to wandb needs the wandb package: pip install wandb")

# -----------------------------------------------------------------------------
# searchqa: Search-R1's server, or the wiki file as downloaded


def test_retriever_server_answering_search_r1s_api():
    log = []
    server = serve(json_handler(search_r1, log))
    url = f"http://127.0.0.1:{server.server_port}/retrieve"
    try:
        ok, line = check(preflight.check_retriever, run_args("--retriever-url", url))
        assert ok and line.startswith(f"Search-R1 retrieval server {url} answers; top passage '\"Zarnoth River\":")
        assert log == [("/retrieve", {"queries": ["who wrote the iliad"], "topk": 1, "return_scores": True})]
    finally:
        server.shutdown()
    wrong = serve(json_handler(lambda path, req: {"passages": ["a"]}))  # some other service on that port
    try:
        ok, line = check(preflight.check_retriever_url, f"http://127.0.0.1:{wrong.server_port}/retrieve")
        assert not ok and "answered, but not as Search-R1's /retrieve does (KeyError" in line and '{"result"' in line
    finally:
        wrong.shutdown()
    ok, line = check(preflight.check_retriever_url, "http://127.0.0.1:9/retrieve")
    assert not ok and "retrieval server http://127.0.0.1:9/retrieve failed" in line
    assert "scripts/search_r1_retriever.sh setup DIR" in line and 'DOMAINS="math chess"' in line and "\n" not in line


def test_no_retriever_names_the_server_the_wiki_and_the_skip():
    ok, line = check(preflight.check_retriever, run_args())
    assert not ok and "--retriever-url http://127.0.0.1:8010/retrieve" in line and "--wiki wiki-18.jsonl.gz" in line
    assert "bash scripts/search_r1_retriever.sh setup DIR, then serve DIR" in line


def test_wiki_is_read_as_downloaded_gzip(tmp_path):
    path = tmp_path / "wiki-18.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(d) + "\n" for d in WIKI))
    ok, line = check(preflight.check_retriever, run_args("--wiki", str(path), "--paper-with-bm25"))
    assert ok and "reads ('\"Zarnoth River\": The Zarnoth" in line and "built at the first search" in line
    wiki = retriever.WikiBM25(str(path))  # the run's bm25s over the .gz itself
    assert wiki.search("who founded Kelmar", k=1) == ['"Kelmar": Kelmar is a city founded in 1342 by the weaver Oda Prell.']
    assert "index is cached" in check(preflight.check_wiki, str(path))[1]
    # the flags are checked by the runs' own check first (retriever.check_flags)
    ok, line = check(preflight.check_retriever, run_args("--wiki", str(tmp_path / "missing.jsonl.gz"), "--paper-with-bm25"))
    assert not ok and "hf download PeterJinGo/wiki-18-corpus wiki-18.jsonl.gz" in line
    (tmp_path / "bad.jsonl").write_text("not json\n")
    ok, line = check(preflight.check_retriever, run_args("--wiki", str(tmp_path / "bad.jsonl"), "--paper-with-bm25"))
    assert not ok and "is not a wiki-18 .jsonl or .jsonl.gz file" in line

# -----------------------------------------------------------------------------
# data and model: local, cached, or on the hub, without downloading


def test_paper_datasets_cached_local_or_missing(tmp_path, offline_hub):
    fake_hub_cache(offline_hub, datasets=PAPER_DATASETS[2:5])
    assert check(preflight.check_data, run_args(domain="math")) == (
        True, "--math-train BytedTsinghua-SIA/DAPO-Math-17k, --math-test Maxwell-Jia/AIME_2024, --math-test "
              "yentinglin/aime_2025: cached")
    ok, line = check(preflight.check_data, run_args(domain="searchqa"))
    assert not ok and line.startswith("--searchqa-train PeterJinGo/nq_hotpotqa_train, --searchqa-test "
                                      "RUC-NLPIR/FlashRAG_datasets: not cached, and HF_HUB_OFFLINE=1 forbids the hub")
    puzzles = tmp_path / "lichess_db_puzzle.csv"
    puzzles.write_text("PuzzleId,FEN,Moves,Rating\n")
    assert check(preflight.check_data, run_args("--chess-puzzles", str(puzzles), domain="chess")) == (
        True, f"--chess-puzzles {puzzles}: local file")
    ok, line = check(preflight.check_data, run_args("--chess-puzzles", str(tmp_path / "gone.csv"), domain="chess"))
    assert not ok and "gone.csv: no such file" in line
    assert check(preflight.check_data, run_args(preset="cpu", domain="chess"), domains.from_args) == (
        True, "bundled: 1250 train, 256 harness, 250 test tasks")


def test_hub_down_is_asked_once(monkeypatch, offline_hub):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # what the hub read at import
    monkeypatch.setattr(hub, "HUB_DOWN", {})
    calls = []

    class Down:
        def model_info(self, name, timeout):
            calls.append(name)
            raise ConnectionError("no route to huggingface.co")
    monkeypatch.setattr(huggingface_hub, "HfApi", Down)
    for name in ("Qwen/Qwen3.5-2B", "Qwen/Qwen3.5-4B"):
        ok, line = check(preflight.check_model, name)
        assert not ok and "the hub is unreachable (ConnectionError: no route" in line and f"hf download {name}" in line
    assert calls == ["Qwen/Qwen3.5-2B"]  # the second look-up does not wait for another timeout


def test_models_built_cached_or_local(tmp_path, offline_hub):
    assert check(preflight.check_model, "smoke")[0]
    fake_hub_cache(offline_hub, models=["Qwen/Qwen3.5-2B"])
    assert check(preflight.check_model, "Qwen/Qwen3.5-2B") == (True, "cached (0.0 GiB of weights)")
    ok, line = check(preflight.check_model, "Qwen/Qwen3.5-4B")
    assert not ok and "HF_HUB_OFFLINE=1" in line and "`hf download Qwen/Qwen3.5-4B`" in line
    ok, line = check(preflight.check_model, str(tmp_path))
    assert not ok and "holds no config.json" in line

# -----------------------------------------------------------------------------
# engine and proposer


def test_engine_vllm_imports_or_names_the_gpu_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.33.0"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert check(preflight.check_engine, run_args()) == (
        True, "vllm 0.33.0 imports; no CUDA device: vLLM's own kernels for this platform")
    monkeypatch.setitem(sys.modules, "vllm", None)  # what Python does for a package that is not there
    ok, line = check(preflight.check_engine, run_args())
    assert not ok and "vllm does not import" in line and "bash install.sh --gpu" in line


def test_engine_openai_server_of_a_builtin_model_serves_its_folder():
    """`vllm serve` of --model smoke (scripts/node.py's CPU rehearsal) serves the cache folder, the name the openai
    backend asks for (policy.load_policy: --openai-model, else the model's path), so the preflight passes it."""
    folder = models.model_folder("smoke")
    server = serve(json_handler(lambda path, req: {"object": "list", "data": [{"id": folder}]}))
    url = f"http://127.0.0.1:{server.server_port}/v1"
    try:
        ok, line = check(preflight.check_engine, run_args("--backend", "openai", "--openai-url", url, preset="smoke"))
        assert ok and line == f"the server at {url} serves {folder}", line
    finally:
        server.shutdown()


def test_engine_openai_server_serves_the_model():
    server = serve(json_handler(lambda path, req: {"object": "list", "data": [{"id": "Qwen/Qwen3.5-2B"}]}))
    url = f"http://127.0.0.1:{server.server_port}/v1"
    try:
        assert check(preflight.check_engine, run_args("--backend", "openai", "--openai-url", url))[0]
        ok, line = check(preflight.check_engine, run_args("--backend", "openai", "--openai-url", url, domain="chess"))
        assert not ok and "serves ['Qwen/Qwen3.5-2B'], not Qwen/Qwen3.5-4B: pass --openai-model" in line
        ok, line = check(preflight.check_proposer, run_args("--proposer", "openai", "--proposer-url", url,
                                                          "--proposer-model", "Qwen/Qwen3.5-2B"))
        assert ok and line == f"{url} answers /models (1 models)"
    finally:
        server.shutdown()
    ok, line = check(preflight.check_engine, run_args("--backend", "openai", "--openai-url", "http://127.0.0.1:9/v1"))
    assert not ok and "does not answer" in line and "--openai-url" in line


def test_claude_present_and_logged_in(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for key in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN", "CLAUDE_CONFIG_DIR"):
        monkeypatch.delenv(key, raising=False)
    ok, line = check(preflight.check_claude)
    assert not ok and "npm install -g @anthropic-ai/claude-code" in line
    fake_cli(bin_dir, "claude", CLAUDE_LOGGED_IN)
    assert check(preflight.check_claude) == (True, "Claude Code 2.1.197, logged in")
    fake_cli(bin_dir, "claude", CLAUDE_LOGGED_IN.replace('"loggedIn": true', '"loggedIn": false'))
    assert check(preflight.check_claude) == (False, "Claude Code is not logged in: run `claude` and /login (or set "
                                                    "ANTHROPIC_API_KEY)")
    # an older CLI has no `auth status` (it would take it for a prompt): never called; the credentials file decides
    fake_cli(bin_dir, "claude", f'[ "$1" = --version ] && echo "2.0.5 (Claude Code)" || touch {tmp_path}/asked\n')
    ok, line = check(preflight.check_claude)
    assert not ok and "shows no login" in line
    (tmp_path / "home" / ".claude").mkdir(parents=True)
    (tmp_path / "home" / ".claude" / ".credentials.json").write_text("{}")
    ok, line = check(preflight.check_claude)
    assert ok and "a login in" in line and not (tmp_path / "asked").exists()


def test_command_proposer_program_as_the_sandbox_finds_it(tmp_path, monkeypatch):
    assert check(preflight.check_proposer, run_args("--proposer", "command", "--proposer-cmd", "cat {instructions}"))[0]
    ok, line = check(preflight.check_proposer, run_args("--proposer", "command"))
    assert not ok and "needs --proposer-cmd" in line
    ok, line = check(preflight.check_proposer, run_args("--proposer", "command", "--proposer-cmd", "no-such-agent {workdir}"))
    assert not ok and "'no-such-agent' is not on PATH" in line
    agent = fake_cli(tmp_path / "tools", "my-agent", "exit 0\n")
    monkeypatch.setenv("PATH", f"{agent.parent}:{os.environ['PATH']}")
    ok, line = check(preflight.check_proposer, run_args("--proposer", "command", "--proposer-cmd", "my-agent {workdir}"))
    assert not ok and "outside the sandbox's PATH" in line and f"--proposer-ro {agent.parent}" in line
    ok, line = check(preflight.check_proposer, run_args("--proposer", "command", "--proposer-cmd", f"{agent} {{workdir}}"))
    assert not ok and f"add --proposer-ro {agent.parent}" in line
    assert check(preflight.check_proposer, run_args("--proposer", "command", "--proposer-cmd", f"{agent} {{workdir}}",
                                                    "--proposer-ro", str(agent.parent))) == (True, str(agent))

# -----------------------------------------------------------------------------
# sandbox and GPU memory


def test_sandbox_refused_is_the_line_naming_the_opt_out(monkeypatch):
    def refused():
        raise SandboxError(switches.unavailable("bwrap: setting up uid map: Permission denied"))
    monkeypatch.setattr(sandbox, "check", refused)
    ok, line = check(preflight.check_sandbox, run_args())
    assert not ok and "Permission denied" in line and "--unsafe-no-sandbox" in line


def test_a_hard_open_file_limit_too_low_for_the_workers_is_the_line_naming_the_fix(monkeypatch):
    """The gpu preset's 256 workers hold ~3 descriptors each beside CUDA's and zmq's: a hard limit of 1,024
    cannot be raised by the run, so the preflight says so; 65,536 is enough."""
    monkeypatch.setattr(preflight.resource, "getrlimit", lambda what: (1024, 1024))
    ok, line = check(preflight.check_open_files, [run_args("--workers", "256")])
    assert not ok and line.startswith("the hard open-file limit is 1024, below the ~1792 that --workers 256 needs")
    assert "ulimit -Hn 1792" in line and line.endswith("docker --ulimit nofile=1792)")  # no --workers fits
    monkeypatch.setattr(preflight.resource, "getrlimit", lambda what: (1024, 1600))
    ok, line = check(preflight.check_open_files, [run_args("--workers", "256")])
    assert not ok and line.endswith(", or pass --workers 192")
    monkeypatch.setattr(preflight.resource, "getrlimit", lambda what: (1024, 65536))
    ok, line = check(preflight.check_open_files, [run_args("--workers", "256"), run_args()])
    assert ok and line.startswith("hard limit 65536, enough for --workers 256 (~1792)")


def test_gpu_memory_against_the_runs_need(monkeypatch, offline_hub):
    fake_hub_cache(offline_hub, models=["Qwen/Qwen3.5-2B"])
    assert check(preflight.check_gpu, [run_args()]) == (True, "no GPU") or torch.cuda.is_available()
    GiB = preflight.GiB
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "Stand-in GPU")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (int(20 * GiB), int(80 * GiB)))
    ok, line = check(preflight.check_gpu, [run_args(), run_args("--backend", "hf", domain="math")])
    assert not ok and line.startswith("Stand-in GPU: 20.0 GiB free of 80.0, these runs need 37.0 (CUDA context 1.0 + "
                                      "Qwen/Qwen3.5-2B weights 0.0 + vllm share 0.45 x 80.0)")
    assert "or lower --gpu-memory" in line
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (int(79 * GiB), int(80 * GiB)))
    assert check(preflight.check_gpu, [run_args()])[0]


def test_an_engine_share_too_small_for_one_sequence_is_refused_before_the_model_loads(monkeypatch, offline_hub):
    """On a 24 GB card, chess's 4B engine at --gpu-memory 0.3 leaves its KV cache no room for one 8,192-token
    sequence (vLLM would refuse at its start, after the trainer has loaded): one line naming the share that fits."""
    fake_hub_cache(offline_hub, models=["Qwen/Qwen3.5-4B"])
    GiB = preflight.GiB
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "Stand-in GPU")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (int(23 * GiB), int(24 * GiB)))
    ok, line = check(preflight.check_gpu, [run_args("--gpu-memory", "0.3", preset="gpu", domain="chess")])
    assert not ok and line.startswith("chess: Qwen3.5-4B's KV cache at --gpu-memory 0.3 of 24.0 GiB would be 0.00 "
                                      "GiB, below the 0.30 GiB one sequence of --max-model-len 8192 needs")
    assert line.endswith("pass --gpu-memory 0.43 or more, or a lower --max-model-len")
    ok, line = check(preflight.check_gpu, [run_args("--workers", "120", preset="gpu", domain="chess")])
    assert ok, line  # the preset's 0.5


def test_an_engine_with_fewer_cache_blocks_than_sequences_is_refused_before_the_model_loads(monkeypatch, offline_hub):
    """vLLM refuses to capture its CUDA graphs when max_num_seqs (here --workers) exceeds its Mamba cache blocks:
    chess's 4B engine at the gpu preset's --gpu-memory 0.5 of a 24 GB card has about 134 blocks, below the preset's
    --workers 256; one line names the --workers that fits. The gpu preset's defaults pass on an 80 GB card."""
    fake_hub_cache(offline_hub, models=["Qwen/Qwen3.5-2B", "Qwen/Qwen3.5-4B"])
    GiB = preflight.GiB
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "Stand-in GPU")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (int(23 * GiB), int(24 * GiB)))
    ok, line = check(preflight.check_gpu, [run_args(preset="gpu", domain="chess")])
    assert not ok and line.startswith("chess: Qwen3.5-4B's cache at --gpu-memory 0.5 of 24.0 GiB would hold about "
                                      "134 blocks (16.5 MiB each: one per running sequence's Gated DeltaNet state, "
                                      "triton prefill), too few for the 256 sequences the engine runs at once "
                                      "(--workers) with 10% to spare: vLLM refuses")
    # the suggestion leaves the stated margin below the estimate (vLLM measures its CUDA graphs, the plan guesses)
    assert line.endswith("pass --workers 120") and "\n" not in line  # 0.6 would not fit beside the trainer
    assert check(preflight.check_gpu, [run_args("--workers", "120", preset="gpu", domain="chess")])[0]
    assert not check(preflight.check_gpu, [run_args("--workers", "134", preset="gpu", domain="chess")])[0]
    # the estimate follows the prefill the engine takes: FlashInfer's (--gdn-prefill auto) aligns blocks to 64 tokens
    ok, line = check(preflight.check_gpu, [run_args("--workers", "120", "--gdn-prefill", "auto", preset="gpu",
                                                    domain="chess")])
    assert not ok and "about 123 blocks (18.0 MiB each" in line and "flashinfer prefill" in line
    assert line.endswith("pass --workers 110 or --gpu-memory 0.51")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (int(79 * GiB), int(80 * GiB)))
    ok, line = check(preflight.check_gpu, [run_args(preset="gpu", domain=d) for d in ("searchqa", "math", "chess")])
    assert ok, line


def test_the_engine_kernels_with_and_without_nvcc(monkeypatch, tmp_path):
    """A Gated DeltaNet model gets Triton's prefill whether or not nvcc is there (FlashInfer's would be JIT-compiled
    at warm-up), unless --gdn-prefill auto; the sampler is PyTorch's without nvcc. nvcc is looked for where the
    compile takes it: $CUDA_HOME/bin first, so a runtime-only $CUDA_HOME counts as no nvcc even with one on PATH.
    The preflight's line says which prefill and sampler, and why."""
    from lib.backends import engines
    GiB = preflight.GiB
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.33.0"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (int(79 * GiB), int(80 * GiB)))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda: (9, 0))  # Hopper
    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(engines, "CUDA_DEFAULT", str(tmp_path / "no-cuda"))  # not this machine's /usr/local/cuda
    monkeypatch.setenv("PATH", str(tmp_path))
    assert engines.nvcc_path() is None
    kw, env, _ = engines.engine_backends(True, engines.nvcc_path(), gated_deltanet=True)
    assert kw == {"gdn_prefill_backend": "triton"} and env == {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    ok, line = check(preflight.check_engine, run_args(preset="gpu", domain="math"))
    assert ok and line == ("vllm 0.33.0 imports; Triton's Gated DeltaNet prefill (gdn_prefill_backend=triton, the "
                           "default: no nvcc compile at warm-up; --gdn-prefill auto for vLLM's choice); PyTorch's "
                           "sampler (VLLM_USE_FLASHINFER_SAMPLER=0: no nvcc ($CUDA_HOME/bin, $CUDA_PATH/bin, PATH, "
                           "/usr/local/cuda/bin) for FlashInfer's)")
    # --gdn-prefill auto on Hopper without nvcc: vLLM would pick FlashInfer's prefill and fail to compile it
    ok, line = check(preflight.check_engine, run_args("--gdn-prefill", "auto", preset="gpu", domain="math"))
    assert not ok and line.startswith("--gdn-prefill auto: on this Hopper card vLLM takes FlashInfer's") and \
        line.endswith("drop --gdn-prefill auto (Triton's prefill), or install the CUDA toolkit and set CUDA_HOME")
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    assert engines.nvcc_path() == str(nvcc)
    # with nvcc: Triton's prefill still, FlashInfer's sampler
    assert engines.engine_backends(True, engines.nvcc_path(), gated_deltanet=True)[:2] == (
        {"gdn_prefill_backend": "triton"}, {})
    ok, line = check(preflight.check_engine, run_args(preset="gpu", domain="math"))
    assert ok and line.endswith(f"; FlashInfer's sampler (vLLM's default; nvcc at {nvcc})")
    ok, line = check(preflight.check_engine, run_args("--gdn-prefill", "auto", preset="gpu", domain="math"))
    assert ok and "vLLM's choice of Gated DeltaNet prefill (--gdn-prefill auto: FlashInfer's on Hopper" in line
    assert engines.engine_backends(True, str(nvcc), True, "auto")[0] == {}  # vLLM's own choice
    # a runtime-only $CUDA_HOME: the compile looks there, not on PATH
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "runtime-only"))
    assert engines.nvcc_path() is None
    assert engines.engine_backends(False, None, gated_deltanet=True)[:2] == ({}, {})  # the CPU engine: its own


def test_the_gated_deltanet_probe_runs_once_before_the_night_and_a_failure_names_its_fix(monkeypatch):
    """The trainer's Gated DeltaNet kernel against transformers' reference (lib/ops/gdn_probe.py; its comparison:
    tests/test_gdn_probe.py) runs once in a process of its own where weights train on a Qwen3.5 model; a crash, a
    hang or wrong gradients are one line naming the fix: the compiler's packages where Triton lacked one, fla-core
    otherwise."""
    names = lambda runs: [name for name, _ in preflight.plan(runs)]
    assert "gated deltanet backward" in names([run_args(preset="gpu", domain="math")])
    assert "gated deltanet backward" not in names([run_args(preset="smoke", domain="math")])  # no Qwen3.5
    assert "gated deltanet backward" not in names([run_args("--method", "harness-only", preset="gpu", domain="math")])
    assert preflight.check_gated_deltanet_backward().startswith("skip (no GPU") or torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def failed(stderr):
        return lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", stderr)

    def hung(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    wrong = ("fla-core's chunk_gated_delta_rule in bf16 against transformers' fp32 reference over 512 tokens (8 "
             "chunks): relative errors out 4.0e-03, q 4.1e-03, k 9.1e-01, v 4.0e-03, g 4.2e-03, beta 4.0e-03: dk off "
             "by more than 0.05\n")
    no_cc = "Traceback ...\nRuntimeError: Failed to find C compiler. Please specify via CC environment variable.\n"
    no_header = "...\n/tmp/main.c:1:10: fatal error: Python.h: No such file or directory\n"
    monkeypatch.setattr(preflight.compiler, "missing", lambda: None)  # this machine's own compiler is not the case
    for run, start, fix in (
            (failed(wrong), wrong.strip(), "pip uninstall fla-core"),
            (failed(no_cc), "RuntimeError: Failed to find C compiler", "apt install build-essential python3.11-dev"),
            (failed(no_header), "/tmp/main.c:1:10: fatal error: Python.h",
             "apt install build-essential python3.11-dev"),
            (failed("tilelang.engine.CompileError: nvcc failed\n"), "tilelang.engine.CompileError",
             "export FLA_TILELANG=0"),
            (hung, "one forward and backward did not end in 300 s", "pip uninstall fla-core")):
        ok, line = check(partial(preflight.check_gated_deltanet_backward, run=run))
        assert not ok and line.startswith(start) and fix in line and "\n" not in line, line
        assert "FLA_TILELANG" not in line or "tilelang" in start  # the old fix, named only where it applies
    ok, line = check(partial(preflight.check_gated_deltanet_backward,
                             run=lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, wrong.replace(
                                 "k 9.1e-01", "k 4.2e-03").replace("dk off by more than", "within") + "\n", "")))
    assert ok and line.endswith("within 0.05")


def test_the_compiler_and_pythons_headers_triton_builds_with(monkeypatch, tmp_path):
    """Triton builds its kernel launchers with a C compiler and Python.h at the first kernel: both checked where a GPU
    run needs Triton, each missing one named with the package that brings it."""
    from lib.ops import compiler
    names = lambda runs: [name for name, _ in preflight.plan(runs)]
    assert "compiler" in names([run_args(preset="gpu", domain="math")])
    assert "compiler" in names([run_args("--method", "harness-only", preset="gpu", domain="math")])  # vllm
    assert "compiler" not in names([run_args(preset="smoke", domain="math")])
    assert check(preflight.check_compiler)[1].startswith("skip (no GPU") or torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    include = tmp_path / "include"
    include.mkdir()
    (include / "Python.h").write_text("")
    fake_cli(tmp_path / "bin", "gcc", "")
    monkeypatch.setattr(compiler, "include_dir", lambda: str(include))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("CC", raising=False)
    assert check(preflight.check_compiler) == (True, f"C compiler {tmp_path}/bin/gcc, {include}/Python.h")
    (include / "Python.h").unlink()
    ok, line = check(preflight.check_compiler)
    assert not ok and line.startswith(f"no Python.h in {include}: Triton builds its kernel launchers") and \
        "apt install python3.11-dev (Debian/Ubuntu" in line
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    ok, line = check(preflight.check_compiler)
    assert not ok and line.startswith("no C compiler (no gcc or clang on PATH) and no Python.h") and \
        "apt install build-essential python3.11-dev" in line
    monkeypatch.setenv("CC", "clang-19")
    assert check(preflight.check_compiler)[1].startswith("no C compiler ($CC=clang-19 not found)")
    # install.sh --gpu runs the same module before it installs anything
    done = subprocess.run([sys.executable, str(ROOT / "lib" / "ops" / "compiler.py")], capture_output=True, text=True,
                          env={**os.environ, "PATH": str(tmp_path / "empty"), "CC": ""})
    assert done.returncode == 1 and done.stderr.startswith("no C compiler (no gcc or clang on PATH)")
    # install.sh --gpu stops on it before anything is installed (PATH: python and dirname only)
    bare = tmp_path / "bare"
    bare.mkdir()
    for tool in ("python3", "dirname"):
        (bare / tool).symlink_to(sys.executable if tool == "python3" else shutil.which(tool, path="/usr/bin:/bin"))
    done = subprocess.run(["/bin/bash", str(ROOT / "install.sh"), "--gpu"], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(bare), "HOME": str(tmp_path)})
    assert done.returncode == 1 and done.stderr.startswith("install.sh: no C compiler (no gcc or clang on PATH)"), \
        done.stderr


def test_the_trainer_is_checked_against_the_card_before_the_model_loads(monkeypatch, offline_hub, capsys):
    """Chess's 4B trainer with a micro-batch of 2 calls of 8,192 tokens does not fit beside its engine on a 24 GB
    card: refused in one line naming the micro-batch that does; the gpu preset takes that one on its own and says
    so; everything passes on 80 GB."""
    fake_hub_cache(offline_hub, models=["Qwen/Qwen3.5-2B", "Qwen/Qwen3.5-4B"])
    GiB = preflight.GiB
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "Stand-in GPU")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (int(23 * GiB), int(24 * GiB)))
    ok, line = check(preflight.check_gpu, [run_args("--workers", "120", "--micro-batch", "2", preset="gpu",
                                                    domain="chess")])
    assert not ok and line == ("chess: Qwen3.5-4B's SFT micro-batch of 2 calls of 8,192 tokens (1,024 trained) needs "
                               "about 13.4 GiB, more than the 11.8 GiB the trainer's weights and the sleeping engine "
                               "leave of 24.0 GiB: the first RSFT step would run out of memory: pass --micro-batch 1")
    capsys.readouterr()
    args = run_args("--workers", "120", preset="gpu", domain="chess")  # the preset's micro-batch, fitted
    assert args.micro_batch == 1
    assert capsys.readouterr().err == ("gpu preset: --micro-batch 1 on this 24.0 GiB card, where its 2 calls do not "
                                       "fit beside the trainer and the engine (presets.GPU_TWO_CALLS_GIB)\n")
    ok, line = check(preflight.check_gpu, [args])
    assert ok and line.endswith("; trainer: chess --micro-batch 1 (at most 1 fit)")
    # an engine share that leaves the trainer no room names the share that does
    ok, line = check(preflight.check_gpu, [run_args("--workers", "120", "--gpu-memory", "0.6", preset="gpu",
                                                    domain="chess")])
    assert not ok and line.startswith("chess: Qwen3.5-4B's trainer (8.3 GiB") and line.endswith(
        "pass --gpu-memory 0.51 or less")
    # a harness-only run trains nothing: its trainer is not checked (the engine is)
    assert check(preflight.check_gpu, [run_args("--workers", "120", "--micro-batch", "2", "--method",
                                                "harness-only", preset="gpu", domain="chess")])[0]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (int(79 * GiB), int(80 * GiB)))
    capsys.readouterr()
    runs = [run_args(preset="gpu", domain=d) for d in ("searchqa", "math", "chess")]
    assert [a.micro_batch for a in runs] == [2, 2, 2] and not capsys.readouterr().err  # nothing to fit on 80 GB
    ok, line = check(preflight.check_gpu, runs)
    assert ok and line.endswith("trainer: searchqa --micro-batch 2 (at most 12 fit), math --micro-batch 2 (at most "
                                "12 fit), chess --micro-batch 2 (at most 9 fit)"), line
    # the paper preset keeps the official micro-batch of 2 and is refused where a call of --max-model-len 32,768
    # (chess: 8,129 trained, its episode budget) leaves room for one only
    ok, line = check(preflight.check_gpu, [run_args(preset="paper", domain="chess")])
    assert not ok and line.endswith("pass --micro-batch 1") and "2 calls of 32,768 tokens (8,129 trained)" in line


def test_plan_check_names_a_card_without_a_gpu(capsys):
    """plan.py --check --card N: the same engine and trainer check against a card of N GiB, on a machine without
    a GPU (here)."""
    GiB = preflight.GiB
    [args] = plan.parse_args(["--check", "--preset", "gpu", "--domain", "chess", "--card", "24"])
    assert args.micro_batch == 1 and "gpu preset: --micro-batch 1 on this 24.0 GiB card" in capsys.readouterr().err
    ok, line = check(preflight.check_gpu, [args])
    assert not ok and line.startswith("chess: Qwen3.5-4B's cache at --gpu-memory 0.5 of 24.0 GiB") and \
        line.endswith("pass --workers 120")
    [args] = plan.parse_args(["--check", "--preset", "gpu", "--domain", "chess", "--card", "24", "--workers", "120",
                              "--micro-batch", "2"])
    ok, line = check(preflight.check_gpu, [args])
    assert not ok and line.endswith("the first RSFT step would run out of memory: pass --micro-batch 1")
    [args] = plan.parse_args(["--check", "--preset", "gpu", "--domain", "chess", "--card", "80"])
    assert check(preflight.check_gpu, [args]) == (True, "a 80 GiB card (--card, not this machine's): these runs' "
                                                        "engine and trainer fit; trainer: chess --micro-batch 2 (at "
                                                        "most 9 fit)")


REPLICA_FLAGS = ["--preset", "paper", "--domain", "chess", "--backend", "openai", "--gpu-memory", "0.5",
                 "--micro-batch", "2"]
REPLICA_REFUSED = ("FAIL gpu: chess: Qwen3.5-4B's SFT micro-batch of 2 calls of 32,768 tokens (8,129 trained) needs "
                   "about 75.9 GiB, more than the 49.4 GiB the trainer's weights and the engine's --gpu-memory 0.5 "
                   "leave of 141.0 GiB: the first RSFT step would run out of memory: pass --micro-batch 1 or "
                   "--gpu-memory 0.31 (the engine's share of this card)")


def test_a_server_replica_on_the_trainers_card_is_counted_by_plan_check(capsys):
    """The paper preset's chess at --micro-batch 2 beside a vllm serve replica at 0.5 of a 141 GB card (--backend
    openai, --gpu-memory: the replica's --gpu-memory-utilization): refused, naming the micro-batch and the share that
    fit; with the server on other cards (--gpu-memory 0) the trainer has the card and fits."""
    with pytest.raises(SystemExit) as e:
        plan.main(["--check", *REPLICA_FLAGS, "--card", "141", "--data", "bundled", "--method", "weight-only"])
    assert e.value.code == 1 and REPLICA_REFUSED in capsys.readouterr().err.splitlines()
    [args] = plan.parse_args(["--check", *REPLICA_FLAGS, "--card", "141", "--gpu-memory", "0"])
    assert check(preflight.check_gpu, [args]) == (True, "a 141 GiB card (--card, not this machine's): these runs' "
                                                        "engine and trainer fit; trainer: chess --micro-batch 2 (at "
                                                        "most 3 fit)")


def test_a_direct_whale_launch_runs_the_preflight_on_its_own_card_before_any_model_loads(monkeypatch, offline_hub,
                                                                                          tmp_path, capsys):
    """`python whale.py ...` (what torchrun runs on each rank) checks what plan.py --check checks, before any model
    loads: on a (stand-in) 141 GiB card, set as this rank's device first, beside a replica of 0.5, the same line."""
    model = tmp_path / "Qwen3.5-4B"  # a local copy: the model is not read before the preflight
    model.mkdir()
    (model / "config.json").write_text("{}")
    GiB, calls = preflight.GiB, []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.append(("set_device", i)))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "Stand-in H200")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: calls.append("mem_get_info") or (140 * GiB, 141 * GiB))
    monkeypatch.setattr(preflight, "check_gated_deltanet_backward", lambda: "stand-in probe")
    monkeypatch.setattr(preflight, "check_compiler", lambda: "stand-in compiler")
    monkeypatch.setattr(whale, "load_policy", lambda args: pytest.fail("a model loaded before the preflight"))
    monkeypatch.setenv("LOCAL_RANK", "3")
    with pytest.raises(SystemExit) as e:
        whale.main([*REPLICA_FLAGS, "--data", "bundled", "--method", "weight-only", "--model", str(model),
                    "--out", str(tmp_path / "run")])
    assert str(e.value.code).startswith("whale.py: error: the preflight refused this launch")
    assert REPLICA_REFUSED in capsys.readouterr().err.splitlines()
    assert calls[0] == ("set_device", 3) and "mem_get_info" in calls  # the card read after the rank's device is set


def test_a_direct_rft_launch_runs_the_same_preflight_before_any_model_loads(monkeypatch, offline_hub, tmp_path, capsys):
    """rft.py on a (stand-in) GPU: the same checks, the same line, before the policy loads."""
    import rft
    model = tmp_path / "Qwen3.5-4B"
    model.mkdir()
    (model / "config.json").write_text("{}")
    GiB = preflight.GiB
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "Stand-in H200")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (140 * GiB, 141 * GiB))
    monkeypatch.setattr(preflight, "check_gated_deltanet_backward", lambda: "stand-in probe")
    monkeypatch.setattr(preflight, "check_compiler", lambda: "stand-in compiler")
    monkeypatch.setattr(rft, "load_policy", lambda args: pytest.fail("a model loaded before the preflight"))
    with pytest.raises(SystemExit) as e:
        rft.main([*REPLICA_FLAGS, "--data", "bundled", "--harness", "harnesses/paper/chess.py", "--model", str(model),
                  "--out", str(tmp_path / "rft")])
    assert str(e.value.code).startswith("rft.py: error: the preflight refused this launch")
    assert REPLICA_REFUSED in capsys.readouterr().err.splitlines()


def test_searchqas_retriever_on_the_trainers_card_is_counted():
    """Search-R1's index served from this machine (a localhost --retriever-url: scripts/search_r1_retriever.sh puts
    it on the GPU) takes its ~32 GiB of the trainer's card: the paper preset's 2 calls beside a 0.41 replica fit on a
    141 GB card without it and not with it, the line naming the index and the share that fits."""
    flags = ["--check", "--preset", "paper", "--domain", "searchqa", "--card", "141", "--backend", "openai",
             "--gpu-memory", "0.41"]
    [elsewhere] = plan.parse_args([*flags, "--retriever-url", "http://10.0.0.9:8010/retrieve"])
    assert check(preflight.check_gpu, [elsewhere])[0]
    [here] = plan.parse_args([*flags, "--retriever-url", "http://127.0.0.1:8010/retrieve"])
    ok, line = check(preflight.check_gpu, [here])
    assert not ok and "the trainer's weights, Search-R1's index and the engine's --gpu-memory 0.41 leave" in line \
        and line.endswith("pass --micro-batch 1 or --gpu-memory 0.18 (the engine's share of this card)"), line


def test_plan_check_checks_every_method_of_each_check_domain(capsys):
    """`--check chess` with `--method harness-only weight-only`: chess's weight-only trainer is checked too, not only
    its first method (harness-only, which trains nothing)."""
    with pytest.raises(SystemExit):
        plan.main(["--check", "chess", "--preset", "gpu", "--domain", "math", "--method", "harness-only",
                   "weight-only", "--card", "24", "--micro-batch", "2", "--data",
                   "bundled", "--workers", "120"])
    assert any(line.startswith("FAIL gpu: chess: Qwen3.5-4B's SFT micro-batch of 2 calls")
               for line in capsys.readouterr().err.splitlines())
