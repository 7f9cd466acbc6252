#!/usr/bin/env bash
# The GPU path on a machine with a GPU and no internet: one line per check, "ok NAME ..." or "FAIL NAME ...".
#
#     bash scripts/gpu_check.sh          # from anywhere; a few minutes (most of it vLLM's start-up)
#
#   cuda         a CUDA device that does bf16
#   hf-smoke     the smoke model through the hf backend on CUDA in bf16: greedy is repeatable, sampling runs
#   rsft-step    one RSFT step of rft.py on the smoke model (rollouts, SFT pass, checkpoint, adapter sync)
#   rsft-update  the SFT update itself on CUDA (scripts/bench_rft.py: LoRA forward/backward against a bare loop)
#   memory-plan  the trainer's peak memory in one SFT micro-batch of a random Qwen3.5-2B (built from its config:
#                nothing downloaded; bf16, all-linear LoRA r16, checkpointed, 2 calls of 8,192 tokens, 1,024
#                trained each) against lib/ops/time_model.memory's (weights + LoRA state + activations); fails when
#                the plan underestimates it by more than 10 %
#   vllm-greedy  vLLM's greedy tokens equal hf's on the same prompts (each within the canary's tolerance)
#   vllm-lora    vLLM applies a LoRA adapter: greedy output changes and the adapter canary passes
#   vllm-sleep   sleeping the engine frees GPU memory and the next generate wakes it
# The vllm checks print "skip" where vllm is not importable (bash install.sh --gpu).
set -u
cd "$(dirname "$0")/.."
# the environment install.sh filled: an active venv or conda env, else .venv/ (no activation needed)
if [ -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ] && [ -x .venv/bin/python ]; then PATH="$PWD/.venv/bin:$PATH"; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

check() {  # check NAME FUNCTION: the function prints its own result lines; a crash becomes a FAIL line
    local name=$1 fn=$2
    if "$fn" > "$TMP/$name.out" 2> "$TMP/$name.err"; then
        grep -E "^(ok|FAIL|skip) " "$TMP/$name.out" || echo "FAIL $name (no result line)"
    else
        grep -E "^(ok|FAIL|skip) " "$TMP/$name.out"
        echo "FAIL $name ($(tr '\r' '\n' < "$TMP/$name.err" | grep -v '^\s*$' | tail -n 1))"
    fi
}

cuda() {
python - <<'EOF'
import torch
assert torch.cuda.is_available(), "torch sees no CUDA device"
assert torch.cuda.is_bf16_supported(), "this GPU has no bf16"
free, total = torch.cuda.mem_get_info()
print(f"ok cuda {torch.cuda.get_device_name()}, {total / 2**30:.0f} GiB ({free / 2**30:.0f} free), torch {torch.__version__}")
EOF
}

hf_smoke() {
python - <<'EOF'
import torch
from lib import canary, engines, hf_backend, models
model, tok = models.load_model("smoke")
param = next(model.parameters())
assert param.device.type == "cuda" and param.dtype == torch.bfloat16, f"smoke model on {param.device} in {param.dtype}"
backend = hf_backend.HFBackend(model, tok)
prompts = [models.chat_ids(tok, [{"role": "user", "content": q}]) for q in ("What is 2 + 3?", "Name a river.", "Move?")]
greedy = backend.generate(prompts, temperature=0.0, max_new_tokens=16)
assert greedy == backend.generate(prompts, temperature=0.0, max_new_tokens=16), "greedy output differs between two calls"
sampled = backend.generate(prompts * 8, temperature=1.0, top_k=20, max_new_tokens=16, seeds=list(range(24)))
assert all(greedy) and all(sampled), "an empty completion"
print(f"ok hf-smoke bf16 on cuda: greedy {[len(g) for g in greedy]} tokens (repeatable), {len(sampled)} sampled rows")
EOF
}

rsft_step() {
python rft.py --domain math --harness harnesses/math.py --model smoke --bf16 --steps 1 --batch 4 --group 2 \
    --max-new-tokens 16 --out "$TMP/rft" >&2 || return 1
OUT="$TMP/rft" python - <<'EOF'
import json, os
out = os.environ["OUT"]
rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
assert len(rows) == 1 and rows[0]["rollouts"] == 8, rows
assert os.path.exists(os.path.join(out, "ckpt", "adapter", "adapter_config.json")), "no adapter checkpoint"
r = rows[0]
print(f"ok rsft-step 1 step, {r['rollouts']} rollouts, reward {r['reward']:.2f}, sample {r['sample_s']} s, train {r['train_s']} s")
EOF
}

rsft_update() {
python scripts/bench_rft.py --model smoke --bf16 > "$TMP/bench.txt" || return 1
grep -q "device cuda" "$TMP/bench.txt" || { echo "FAIL rsft-update (did not run on cuda: $(tail -n 2 "$TMP/bench.txt"))"; return 0; }
echo "ok rsft-update LoRA forward/backward on cuda, $(grep '^ratio' "$TMP/bench.txt")"
}

memory_plan() {
python - <<'EOF'
import importlib.util
import torch
from types import SimpleNamespace
from transformers import Qwen3_5TextConfig
from transformers.models.qwen3_5 import modeling_qwen3_5
import rft
from lib.ops import time_model
from lib.policy import add_lora
name, context, completion = "Qwen3.5-2B", 8192, 1024
torch.manual_seed(0)
with torch.device("cuda"):
    model = modeling_qwen3_5.Qwen3_5ForCausalLM(Qwen3_5TextConfig(**time_model.config(name))).to(torch.bfloat16)
model = add_lora(model, SimpleNamespace(lora_targets="all-linear", lora_rank=16, lora_alpha=32, lora_dropout=0.0))
model.get_base_model().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # as rft.py
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
calls = []
for _ in range(2):  # the gpu preset's --minibatch 2: two calls in one forward/backward
    tokens = [int(t) for t in torch.randint(0, model.config.vocab_size, (context,))]
    calls.append([(tokens[:context - completion], tokens[context - completion:])])
rft.sft_update(model, opt, calls, 2, 2, 1.0)  # the first step makes Adam's state; the second is measured
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
rft.sft_update(model, opt, calls, 2, 2, 1.0)
peak = torch.cuda.max_memory_allocated()
plan = time_model.memory(name, 80, context=context, completion=completion, minibatch=2)
want, GiB = plan["weights"] + plan["lora_opt"] + plan["act"], 2 ** 30
fla = importlib.util.find_spec("fla") is not None
print(f"{'ok' if peak <= 1.1 * want else 'FAIL'} memory-plan {name} SFT micro-batch (2 calls of {context} tokens, "
      f"{completion} trained; fla kernels {'on' if fla else 'off'}): peak {peak / GiB:.2f} GiB, planned {want / GiB:.2f} "
      f"GiB (weights {plan['weights'] / GiB:.2f} + LoRA state {plan['lora_opt'] / GiB:.2f} + activations "
      f"{plan['act'] / GiB:.2f}), ratio {peak / want:.2f}")
EOF
}

vllm_checks() {
python -c "import vllm" 2>/dev/null || {
    local n; for n in vllm-greedy vllm-lora vllm-sleep; do echo "skip $n vllm is not importable"; done; return 0; }
ADAPTER="$TMP/adapter" python - <<'EOF'
import os
import torch
from peft import LoraConfig, get_peft_model
from lib import canary, engines, hf_backend, models

model, tok = models.load_model("smoke")
hf = hf_backend.HFBackend(model, tok)
engine = engines.VLLMBackend(model.name_or_path, tok, model, gpu_memory=0.3, sleep=True, max_model_len=2048)
questions = ("What is 2 + 3?", "Name a river.", "Which move wins?", "Write a haiku.")
prompts = [models.chat_ids(tok, [{"role": "user", "content": q}]) for q in questions]

want = hf.generate(prompts, temperature=0.0, max_new_tokens=16)
got = engine.generate(prompts, temperature=0.0, max_new_tokens=16, seeds=[0] * len(prompts))
same = sum(a == b for a, b in zip(want, got))
try:
    s = canary.check_canary(engine, model, tok, "none (base model)", "vllm")
    print(f"ok vllm-greedy {same}/{len(prompts)} prompts token-identical to hf; engine vs trainer (bf16 both) "
          f"{s['noise']:.2e} nats/token on the canary")
except RuntimeError as e:
    print(f"FAIL vllm-greedy {same}/{len(prompts)} identical; {e}")

torch.manual_seed(1)
trained = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
for name, p in trained.named_parameters():
    if "lora_B" in name:
        torch.nn.init.normal_(p, std=0.5)
trained.save_pretrained(os.environ["ADAPTER"])
engine.model = trained
try:
    engine.sync_adapter(os.environ["ADAPTER"])
    changed = sum(a != b for a, b in zip(got, engine.generate(prompts, temperature=0.0, max_new_tokens=16)))
    print(f"{'ok' if changed else 'FAIL'} vllm-lora adapter loaded, canary passed, {changed}/{len(prompts)} greedy outputs changed")
except RuntimeError as e:
    print(f"FAIL vllm-lora {e}")

free_awake = torch.cuda.mem_get_info()[0]
engine.sleep()
free_asleep = torch.cuda.mem_get_info()[0]
again = engine.generate(prompts, temperature=0.0, max_new_tokens=16)
ok = free_asleep > free_awake and not engine.sleeping and all(again)
print(f"{'ok' if ok else 'FAIL'} vllm-sleep freed {(free_asleep - free_awake) / 2**30:.1f} GiB, woke for the next generate")
EOF
}

check cuda cuda
check hf-smoke hf_smoke
check rsft-step rsft_step
check rsft-update rsft_update
check memory-plan memory_plan
check vllm vllm_checks
