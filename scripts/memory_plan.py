"""The paper preset's GPU memory plan and expected hours, computed from the model configs.

    python scripts/memory_plan.py                  # the README tables (24 / 48 / 80 GB)
    python scripts/memory_plan.py --lora-rank 32 --markdown

Setting: one GPU holds the trainer (transformers + peft, bf16 base weights, fp32 LoRA weights, AdamW)
and the vLLM engine (its own bf16 copy of the weights + KV cache), colocated (rollout.py --backend vllm).
With --vllm-sleep the engine offloads its weights and drops its KV cache while the trainer runs, so the
two phases peak separately:
    rollout peak = trainer weights + LoRA/optimizer + engine share (engine weights + overhead + KV cache)
    train peak   = trainer weights + LoRA/optimizer + activations (gradient checkpointing) + sleeping engine
Parameter counts come from instantiating the real transformers classes on the meta device.
Model configs: Qwen3.5-2B / Qwen3.5-4B text configs (hybrid: Gated DeltaNet layers with one full
attention layer every 4th, head_dim 256, vocab 248320, tied embeddings). Sources: layer counts and sizes
from THUDM/slime scripts/models/qwen3.5-{2B,4B}.sh (num-layers, hidden-size, ffn-hidden-size,
num-attention-heads, num-query-groups, kv-channels); linear-attention head counts from the released
config.json files (2B: 16 key / 16 value heads; 4B: 16 key / 32 value heads, each 128 wide);
everything else from transformers' Qwen3_5TextConfig defaults.

Estimates (stated, not measured): activations per checkpointed layer ~ tokens x (8h + 3I) x 2 bytes,
twice for the recompute and its gradients; the loss holds bf16 logits + fp32 log-softmax + fp32 grad
(10 bytes x vocab per token: with a 248k vocab this is the largest activation term); vLLM overhead
(CUDA graphs, sampler, activations) 2 GiB; a sleeping engine keeps 1 GiB; CUDA context 1 GiB; 8% of
the card is left free. Hours: decode is memory-bound (weights + KV + DeltaNet state read per step,
at most 256 sequences), prefill and training are FLOP-bound (2P and 6P FLOPs per token, LoRA
training still back-propagates through the frozen weights, checkpointing adds one forward), at 50%
(inference) and 40% (training) of the card's peak; token counts per rollout are per-domain assumptions
printed with the table. No GPU ran these numbers: they are a plan to check against scripts/gpu_check.sh.
"""
import argparse
import math

import torch

GiB = 1024 ** 3

# model configs (see the docstring for sources)
QWEN35_COMMON = dict(vocab_size=248320, head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128,
                     linear_conv_kernel_dim=4, tie_word_embeddings=True)
MODELS = {
    "Qwen3.5-2B": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=24, num_attention_heads=8,
                       num_key_value_heads=2, linear_num_key_heads=16, linear_num_value_heads=16),
    "Qwen3.5-4B": dict(hidden_size=2560, intermediate_size=9216, num_hidden_layers=32, num_attention_heads=16,
                       num_key_value_heads=4, linear_num_key_heads=16, linear_num_value_heads=32),
}
DOMAIN_MODEL = {"searchqa": "Qwen3.5-2B", "math": "Qwen3.5-2B", "chess": "Qwen3.5-4B"}

# one card per memory class: (memory GiB, HBM GB/s, dense bf16 TFLOPS) from the vendors' spec sheets
GPUS = {"24 GB (RTX 4090)": (24, 1008, 165), "48 GB (L40S)": (48, 864, 362), "80 GB (A100 80GB)": (80, 2039, 312)}

# per domain: train tasks, test tasks, and per rollout: generated tokens, prompt tokens the engine
# must prefill (not in the prefix cache), context length, and the share of rollouts RSFT accepts.
# Train/test sizes: Search-R1 NQ + HotpotQA train (79,168 + 90,447), its 7 x 100 test questions;
# DAPO-Math-17K after de-duplication (~17.9k), AIME 2024 + 2025; chess as domains' paper loader draws.
DOMAINS = {
    "searchqa": dict(train=169_615, test=700, gen=300, prefill=500, ctx=2048, accept=0.45),
    "math": dict(train=17_900, test=60, gen=1500, prefill=300, ctx=4096, accept=0.20),
    "chess": dict(train=20_000, test=1000, gen=300, prefill=2000, ctx=4096, accept=0.25),
}
OVERHEAD_ENGINE, SLEEP_RESIDUAL, CUDA_CONTEXT, FREE_SHARE = 2 * GiB, 1 * GiB, 1 * GiB, 0.08
MAX_NUM_SEQS, EFF_INFER, EFF_TRAIN = 256, 0.5, 0.4


def build_config(name):
    from transformers import Qwen3_5TextConfig
    return Qwen3_5TextConfig(**QWEN35_COMMON, **MODELS[name])


def count_params(cfg, lora_rank):
    """(all parameters, LoRA parameters on every decoder Linear = peft's 'all-linear') on the meta device."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(cfg)
    total = sum(p.numel() for p in model.parameters())
    lora = sum(lora_rank * (m.in_features + m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and not n.startswith("lm_head"))
    return total, lora


def cache_sizes(cfg):
    """(KV bytes per token over the full-attention layers, DeltaNet state bytes per sequence)."""
    full = cfg.layer_types.count("full_attention")
    linear = cfg.num_hidden_layers - full
    kv_per_token = full * 2 * cfg.num_key_value_heads * cfg.head_dim * 2  # K and V in bf16
    conv_dim = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + cfg.linear_num_value_heads * cfg.linear_value_head_dim
    recurrent = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4  # fp32 state
    state_per_seq = linear * (recurrent + conv_dim * (cfg.linear_conv_kernel_dim - 1) * 2)
    return kv_per_token, state_per_seq


def activation_bytes(cfg, tokens):
    checkpoints = cfg.num_hidden_layers * tokens * cfg.hidden_size * 2
    one_layer = 2 * tokens * (8 * cfg.hidden_size + 3 * cfg.intermediate_size) * 2
    loss = tokens * cfg.vocab_size * 10
    return checkpoints + one_layer + loss


def plan(name, gpu, lora_rank, ctx, sleep):
    """Memory per phase on one card, the engine's share and the largest micro-batch that fits."""
    cfg = build_config(name)
    params, lora = count_params(cfg, lora_rank)
    mem_gib, bandwidth, tflops = GPUS[gpu]
    card = mem_gib * GiB
    usable = card * (1 - FREE_SHARE) - CUDA_CONTEXT
    weights, lora_opt = params * 2, lora * 16  # fp32 weight + grad + Adam m and v
    micro = 256  # micro-batch tokens per forward/backward: the largest power of two that fits
    if sleep:
        engine = usable - weights - lora_opt  # the engine gets all that is left while it samples
        train_room = usable - weights - lora_opt - SLEEP_RESIDUAL
    else:  # engine and trainer coexist: give the trainer room for a 4k-token micro-batch
        train_room = activation_bytes(cfg, 4096)
        engine = usable - weights - lora_opt - train_room
    while activation_bytes(cfg, micro * 2) <= train_room and micro < 16384:
        micro *= 2
    kv_per_token, state = cache_sizes(cfg)
    kv = engine - weights - OVERHEAD_ENGINE
    seqs = max(0, int(kv // (ctx * kv_per_token + state)))
    return dict(cfg=cfg, params=params, lora=lora, weights=weights, lora_opt=lora_opt, engine=engine, kv=kv,
                seqs=seqs, micro=micro, act=activation_bytes(cfg, micro), gpu_util=engine / card,
                fits=kv > 0 and activation_bytes(cfg, micro) <= train_room, bandwidth=bandwidth, tflops=tflops,
                kv_per_token=kv_per_token, state=state)


def hours(p, d, method, epochs, phases, iterations, candidates, harness_tasks, group, k):
    """Expected wall-clock hours of one run (rollouts of every kind + RSFT passes)."""
    weight_phases = phases if method != "harness-only" else 0
    harness_phases = phases if method != "weight-only" else 0
    train_rollouts = epochs * d["train"] * group if weight_phases else 0
    evals = (weight_phases + harness_phases + 1) * d["test"] * k  # mean@k after every phase and at the start
    rollouts = train_rollouts + harness_phases * iterations * candidates * harness_tasks + evals
    batch = max(1, min(MAX_NUM_SEQS, p["seqs"]))
    step_bytes = p["weights"] + batch * (d["ctx"] / 2 * p["kv_per_token"] + p["state"])
    step_s = max(step_bytes / (p["bandwidth"] * 1e9), 2 * p["params"] * batch / (p["tflops"] * 1e12)) / EFF_INFER
    decode_s = rollouts * d["gen"] / (batch / step_s)
    prefill_s = rollouts * d["prefill"] * 2 * p["params"] / (p["tflops"] * 1e12 * EFF_INFER)
    train_s = train_rollouts * d["accept"] * d["ctx"] / 2 * 8 * p["params"] / (p["tflops"] * 1e12 * EFF_TRAIN)
    return (decode_s + prefill_s + train_s) / 3600


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # LoRA and engine
    p.add_argument("--lora-rank", type=int, default=16, help="rft.py --lora-rank (targets: all-linear)")
    p.add_argument("--no-sleep", action="store_true", help="plan without --vllm-sleep (engine and trainer coexist)")
    # run budget (whale.py's paper preset: 1.8 epochs in phases of 0.6, I = 6, M = 3, 256 tasks, G = 8, mean@8)
    p.add_argument("--epochs", type=float, default=1.8)
    p.add_argument("--phase-epochs", type=float, default=0.6)
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--candidates", type=int, default=3)
    p.add_argument("--harness-tasks", type=int, default=256)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--markdown", action="store_true", help="print markdown tables (for the README)")
    args = p.parse_args()

    phases = math.ceil(args.epochs / args.phase_epochs - 1e-9)
    sep = " | " if args.markdown else "  "
    gb = lambda x: f"{x / GiB:.1f}"
    print(f"memory plan, LoRA rank {args.lora_rank} (all-linear), engine {'sleeps' if not args.no_sleep else 'stays awake'} "
          f"during training; GiB per phase")
    head = ["model", "GPU", "params", "weights x2", "LoRA+Adam", "engine share (gpu_memory)", "KV cache (seqs at ctx)",
            "activations (micro tokens)", "fits"]
    rows = []
    plans = {}
    for name in MODELS:
        ctx = max(d["ctx"] for dom, d in DOMAINS.items() if DOMAIN_MODEL[dom] == name)
        for gpu in GPUS:
            q = plan(name, gpu, args.lora_rank, ctx, not args.no_sleep)
            plans[name, gpu] = q
            rows.append([name, gpu, f"{q['params'] / 1e9:.2f}B", f"{gb(q['weights'])} x2", gb(q["lora_opt"]),
                         f"{gb(q['engine'])} ({q['gpu_util']:.2f})", f"{gb(max(q['kv'], 0))} ({q['seqs']} at {ctx})",
                         f"{gb(q['act'])} ({q['micro']})", "yes" if q["fits"] else "NO"])
    print_table(head, rows, args.markdown, sep)
    for name in MODELS:
        q = plans[name, next(iter(GPUS))]
        print(f"{name}: LoRA {q['lora'] / 1e6:.1f}M params; KV {q['kv_per_token'] / 1024:.0f} KiB/token "
              f"({q['cfg'].layer_types.count('full_attention')} full-attention layers); DeltaNet state "
              f"{q['state'] / 2**20:.1f} MiB/sequence")

    print(f"\nexpected hours per run ({phases} weight + {phases} harness phases, G = {args.group}, "
          f"M = {args.candidates} x {args.harness_tasks} tasks x {args.iterations} iterations, mean@{args.k} after every phase)")
    head = ["domain", "model", "tokens/rollout (gen, prefill, ctx)", "accept"]
    head += [f"{g.split(' (')[0]} {m}" for g in GPUS for m in ("whale", "harness-only")]
    rows = []
    for dom, d in DOMAINS.items():
        name = DOMAIN_MODEL[dom]
        cells = []
        for gpu in GPUS:
            budget = dict(epochs=args.epochs, phases=phases, iterations=args.iterations, candidates=args.candidates,
                          harness_tasks=args.harness_tasks, group=args.group, k=args.k)
            w = hours(plans[name, gpu], d, "whale", **budget)
            h = hours(plans[name, gpu], d, "harness-only", **budget)
            cells += [f"{w:.0f} h", f"{h:.1f} h"]
        rows.append([dom, name, f"{d['gen']}, {d['prefill']}, {d['ctx']}", f"{d['accept']:.2f}"] + cells)
    print_table(head, rows, args.markdown, sep)
    print("weight-only, stagewise and fast-slow spend the same weight budget as whale and take about as long;\n"
          "harness phases add the proposer's own time (a coding agent), not counted here.")


def print_table(head, rows, markdown, sep):
    if markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
        return
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    for r in [head] + rows:
        print(sep.join(str(x).ljust(w) for x, w in zip(r, widths)))


if __name__ == "__main__":
    main()
