"""The GPU plan of the Qwen3.5 runs (paper and gpu presets): memory per phase and hours per run on one card,
from the model configs and stated token lengths. No GPU, model or dataset is needed: plan.py and
scripts/memory_plan.py (the tables of docs/gpu.md) call in here; nothing here imports a top-level script.

    mem = memory("Qwen3.5-2B", 80, retriever="gpu", gpu_memory=0.45, context=8192, completion=1024)
    counts = run_counts(whale.fixed_phases(args, n_train), batch=64, group=8, candidates=3, harness_tasks=128,
                        harness_samples=1, n_test=105, k=8, shared=1, first=False)   # its own work only
    shared = shared_phases([("weight-only", [("weight", 2)] * 2), ("whale", [("weight", 2), ("harness", 1)])])
    est = hours("Qwen3.5-2B", "searchqa", counts, card_gb=80)   # {"rollouts": h, ..., "total": h, "counts": ...}
    est = estimate(args, phases, n_harness, n_test)             # the same from a whale.py run's flags
    h = night([[est, ...], ...])    # run_all.sh's night, a list per domain's process chain: {"with": h, "without": h, ...}
    half = interval_halfwidth(n_test, 8, p=0.4)                 # 95 % half-width of one cell's mean@8

Setting: one card holds the trainer (transformers + peft: bf16 base weights, fp32 LoRA weights and AdamW),
the vLLM engine (its own bf16 weights, KV cache for the full-attention layers, a GatedDeltaNet state per
sequence) and, for searchqa on the 80 GB card, Search-R1's retriever (e5 + a flat FAISS index in fp16).
With --vllm-sleep the engine frees its memory while the trainer runs, so the two phases peak apart:
    rollout peak = trainer weights + LoRA/Adam + retriever + engine share (weights + overhead + KV + states)
    train peak   = trainer weights + LoRA/Adam + retriever + activations (checkpointed) + sleeping engine
The engine (its own process) maps its whole share again at the wake after each update, beside what the
trainer's caching allocator still reserves: rft.hand_back_memory empties that cache before the wake, so the
wake holds the trainer's live tensors + RESERVED_SLACK, not its SFT peak (which the wake would add otherwise).
Time of a run = its rollouts (decode: bandwidth-bound; prefill: FLOP-bound; the harness's tool waits) + its
SFT passes (FLOP-bound) + per RSFT step the engine's sleep, wake, adapter load and canary + per process
the model load and engine start + per proposer round the coding agent's own time. run_all.sh runs a domain's
methods in one whale.py process with one engine, and whale.py's reuse (lib/run_folder/store.py) takes a phase that
an earlier run of the process already made (the same steps under the same harnesses, the same search from
the same harness under the same weights) and its test evaluation: shared_phases() counts those, and a run's
estimate is its own work only. run_all.sh's domain processes take turns on the card (TURNS=1, lib/run_folder/card.py):
night() gives the night with them, the card's own work with the proposers' waits hidden, and without.
Every constant below is a stated assumption (with its source where there is one), not a measurement: the
plan is to be checked against scripts/gpu_check.sh and the first real run's metrics.jsonl.
"""
import math

from lib.methods import METHODS, table_names

GiB = 1024 ** 3

# Qwen3.5 text configs: layer counts and sizes from THUDM/slime scripts/models/qwen3.5-{2B,4B}.sh; the
# linear-attention head counts from the released config.json files; the rest transformers' Qwen3_5TextConfig
# defaults. Hybrid: three Gated DeltaNet layers, then one full (gated) attention layer, repeated.
QWEN35_COMMON = dict(vocab_size=248320, head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128,
                     linear_conv_kernel_dim=4, tie_word_embeddings=True)
MODELS = {
    "Qwen3.5-2B": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=24, num_attention_heads=8,
                       num_key_value_heads=2, linear_num_key_heads=16, linear_num_value_heads=16),
    "Qwen3.5-4B": dict(hidden_size=2560, intermediate_size=9216, num_hidden_layers=32, num_attention_heads=16,
                       num_key_value_heads=4, linear_num_key_heads=16, linear_num_value_heads=32),
}
FULL_ATTENTION_EVERY = 4
DOMAIN_MODEL = {"searchqa": "Qwen3.5-2B", "math": "Qwen3.5-2B", "chess": "Qwen3.5-4B"}

# one card per memory class: (name, GiB, HBM GB/s, dense bf16 TFLOPS), from the vendors' spec sheets (the H200 SXM:
# NVIDIA's H200 datasheet, 141 GB of HBM3e at 4.8 TB/s, 1,979 bf16 TFLOPS with sparsity, so 989 dense; the official
# runs' card, 8 a node)
CARDS = {24: ("RTX 4090", 24, 1008, 165), 48: ("L40S", 48, 864, 362), 80: ("A100 80GB", 80, 2039, 312),
         141: ("H200", 141, 4800, 989)}

# Search-R1's retriever (its retrieval_server.py): e5-base-v2 (110M parameters) over wiki-18, 21,015,324
# passages x 768 dims in a flat inner-product index. On the GPU in fp16: 30 GiB of index + the encoder + faiss's
# scratch; on the CPU in fp32: 60 GiB of RAM, and each query (one per request: retriever.RetrieverClient sends one)
# scans all of it at the machine's memory bandwidth.
WIKI_PASSAGES, E5_DIMS = 21_015_324, 768
RETRIEVER_GPU_BYTES = WIKI_PASSAGES * E5_DIMS * 2 + 2 * GiB  # + e5 fp16, faiss temp memory, its CUDA context
RETRIEVER_CPU_RAM = WIKI_PASSAGES * E5_DIMS * 4
RETRIEVER_QUERY_S = {"gpu": 0.03,        # 30 GiB at ~1 TB/s effective
                     "other-gpu": 0.03,  # the same on a second card, off this one
                     "cpu": 1.0}         # 60 GiB at ~60 GB/s (a 16-core host); queries queue at the server
# where the index goes on each card (30 GiB fits only on 80 and more)
CARD_RETRIEVER = {24: "cpu", 48: "cpu", 80: "gpu", 141: "gpu"}

# Token lengths of one episode, stated, not measured (no Qwen3.5 run yet): prompt = the first call's prompt
# tokens; calls = llm() calls per episode; gen = assistant tokens per episode (thinking included); longest =
# the longest completion in a batch of calls at temperature 1 (the per-call cap where a share of calls reach
# it); tool = tokens the episode adds between calls (passages, code output, the next position); accept =
# share of rollouts with reward 1 (RSFT trains on those); searches = retriever queries per episode; tool_s =
# seconds a call waits on something else than the engine (a sandboxed python run).
# CAPPED: --max-new-tokens 1024 a call (the gpu preset), thinking as the template does, h0 harnesses.
#   searchqa: a short think + a query, then the answer, one 150-word passage; h0 stops at </search> but has no
#   cap below the call's 1,024, so at temperature 1 some call of a batch reaches it (longest). math: the first call thinks to the cap, a code block in about half of them.
#   chess: a 650-token position (FEN, board, 30-40 legal moves in UCI and SAN), 1-2 solver moves and the
#   wrong-move stop; the 4B thinks to the cap on most calls.
# THINKING: the official episode (docs/protocol.md section 2): 8,192 assistant tokens an episode (chess 8,129), no
#   per-call cap but what is left of it; AIME-level math spends most of it, searchqa and chess less.
CAPPED = {
    "searchqa": dict(prompt=160, calls=1.8, gen=650, longest=1024, tool=220, accept=0.35, searches=0.9, tool_s=0.0),
    "math": dict(prompt=170, calls=1.4, gen=1250, longest=1024, tool=120, accept=0.15, searches=0.0, tool_s=0.5),
    "chess": dict(prompt=650, calls=1.4, gen=1300, longest=1024, tool=260, accept=0.10, searches=0.0, tool_s=0.0),
}
THINKING = {
    "searchqa": dict(prompt=350, calls=1.9, gen=1600, longest=4096, tool=250, accept=0.40, searches=0.95, tool_s=0.0),
    "math": dict(prompt=400, calls=1.6, gen=5000, longest=8192, tool=150, accept=0.30, searches=0.0, tool_s=0.5),
    "chess": dict(prompt=650, calls=1.5, gen=4000, longest=8129, tool=260, accept=0.15, searches=0.0, tool_s=0.0),
}
# the longest model call of each regime, for the memory plan: (context, trained completion) tokens. Capped:
# vLLM's --max-model-len 8192 and one call's cap. Thinking: the official prompt cap + response window
# (searchqa 2,048 + 10,240, math 2,048 + 8,192, chess 4,096 + 16,384), within --max-model-len 32,768
LONGEST = {"capped": {"searchqa": (8192, 1024), "math": (8192, 1024), "chess": (8192, 1024)},
           "thinking": {"searchqa": (12288, 8192), "math": (10240, 8192), "chess": (20480, 8129)}}
MODEL_LEN = 32768

# memory: vLLM's own overhead within its share, a guess: vLLM 0.33 measures it at its start and gives the KV cache
# what is left (vllm/v1/worker/gpu_worker.py determine_available_memory: the share less the weights, the peak of a
# profiling forward pass at max_num_batched_tokens, non-torch memory, and the CUDA graphs it captures, profiled
# before the capture since v0.21, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1); none of those is computed here.
# What a sleeping engine keeps; the trainer's CUDA context; the share of the card left free for fragmentation
OVERHEAD_ENGINE, SLEEP_RESIDUAL, CUDA_CONTEXT, FREE_SHARE = 2 * GiB, 1 * GiB, 1 * GiB, 0.08
# what the trainer's allocator keeps reserved past its live tensors once rft.hand_back_memory emptied its cache:
# segments pinned by a live tensor (the LoRA weights and Adam state sit in small ones); scripts/gpu_check.sh
# measures it after an update
RESERVED_SLACK = GiB // 2
# time: the share of peak bandwidth / FLOPs reached (decode and prefill, SFT); vLLM's fixed cost per decode
# step (scheduler, sampler, Python); the least wait of a generate call for its batch (lib/episodes/runner.BATCH_WAIT_S)
EFF_INFER, EFF_TRAIN, STEP_OVERHEAD_S, BATCH_WAIT_S = 0.5, 0.4, 0.004, 0.1
# every call carries its own seed (lib/episodes/runner.call_seed: an episode samples the same on a resume), and vLLM
# 0.33 samples seeded requests one at a time (a torch.Generator each, in a Python loop, and the PyTorch top-k path
# instead of FlashInfer's): a stated cost per seeded sequence per decode step, i.e. per generated token
SEEDED_TOKEN_S = 30e-6
DEFAULT_WORKERS = 64  # rollout.py: concurrent episodes, min(64, episodes) unless --workers
MAX_NUM_SEQS = 256    # vLLM's default cap on sequences in a batch
SYNC_S = 20           # per RSFT step: engine sleep + wake (weights over PCIe), adapter save + load, the canary
START_S = 180         # per process: trainer model load, vLLM start (profiling, CUDA graphs), data, worker pool
PROPOSER_S = 1200     # per proposer round: one Claude Code session (--effort max) reading the archive and
                      # writing M candidates with file tools; the official timeout is 2,400 s (docs/protocol.md
                      # section 7): half of it stated, scripts/memory_plan.py also prints 10 and 40 min
SWITCH_S = 15         # per turn on the card (run_all.sh's TURNS=1, lib/run_folder/card.py), one a proposer round: the
                      # engine's sleep and wake and the trainer's weights to host memory and back, over PCIe (stated)
NO_FLA_SFT_FACTOR = 3.0  # SFT time without fla-core: transformers' torch path for the chunked gated delta rule
                         # (a Python loop over 64-token chunks in fp32) in 3 of every 4 layers

# the runs of run_all.sh's table, in its order: every domain x method (one process a domain); ADAPTIVE adds
# adaptive WHALE where the paper reports it (a process of its own: another --schedule; the gpu preset leaves
# it out by default)
# (lib/methods.table_names: the method table's order, its experimental rows left out, as run_all.sh does)
TABLE = [(d, m, "fixed") for d in DOMAIN_MODEL for m in table_names()]
ADAPTIVE = [(d, m, "adaptive") for d in DOMAIN_MODEL if d != "chess"  # as presets.ADAPTIVE_DOMAINS
            for m in table_names() if METHODS[m].adaptive]


def tokens(domain, max_new_tokens=1024):
    """The token lengths of the regime these settings run in: a per-call cap of up to 1024 tokens, or the
    thinking-length episode."""
    return (CAPPED if max_new_tokens <= 1024 else THINKING)[domain]


# -----------------------------------------------------------------------------
# model sizes

def config(name):
    return {**QWEN35_COMMON, **MODELS[name]}


def layer_counts(c):
    """(Gated DeltaNet layers, full-attention layers)."""
    full = c["num_hidden_layers"] // FULL_ATTENTION_EVERY
    return c["num_hidden_layers"] - full, full


def linear_shapes(c):
    """(in, out) of every decoder Linear (peft's 'all-linear' targets; the tied head is not one)."""
    n_delta, n_full = layer_counts(c)
    delta, full = layer_linears(c)
    return delta * n_delta + full * n_full


def layer_linears(c):
    """(in, out) of the Linears of (a GatedDeltaNet layer, a full-attention layer)."""
    h, inter = c["hidden_size"], c["intermediate_size"]
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    heads, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    mlp = [(h, inter), (h, inter), (inter, h)]
    delta = [(h, 2 * nk * dk + nv * dv), (h, nv * dv), (h, nv), (h, nv), (nv * dv, h)]  # qkv, z, b, a, out
    attention = [(h, 2 * heads * hd), (h, kv * hd), (h, kv * hd), (heads * hd, h)]  # q (with its gate), k, v, o
    return delta + mlp, attention + mlp


def param_counts(name, lora_rank=16):
    """(all parameters, LoRA parameters), the same as instantiating Qwen3_5ForCausalLM (tests check it)."""
    c = config(name)
    h = c["hidden_size"]
    n_delta, n_full = layer_counts(c)
    nv, dk, dv = c["linear_num_value_heads"], c["linear_key_head_dim"], c["linear_value_head_dim"]
    conv = (2 * c["linear_num_key_heads"] * dk + nv * dv) * c["linear_conv_kernel_dim"]
    small = n_delta * (conv + 2 * nv + dv) + n_full * 2 * c["head_dim"] + c["num_hidden_layers"] * 2 * h + h
    linear = sum(i * o for i, o in linear_shapes(c))
    lora = sum(lora_rank * (i + o) for i, o in linear_shapes(c))
    return c["vocab_size"] * h + linear + small, lora


def cache_sizes(name):
    """(KV bytes per token over the full-attention layers, GatedDeltaNet state bytes per sequence: the fp32
    recurrent state and the conv window of every linear layer)."""
    c = config(name)
    n_delta, n_full = layer_counts(c)
    kv_per_token = n_full * 2 * c["num_key_value_heads"] * c["head_dim"] * 2  # K and V in bf16
    nv, dk, dv = c["linear_num_value_heads"], c["linear_key_head_dim"], c["linear_value_head_dim"]
    conv_dim = 2 * c["linear_num_key_heads"] * dk + nv * dv
    state = n_delta * (nv * dk * dv * 4 + conv_dim * (c["linear_conv_kernel_dim"] - 1) * 2)
    return kv_per_token, state


# the loss's bytes a trained token and vocabulary entry at its peak, in cross-entropy's backward: the fp32
# log-softmax it saved, that tensor's gradient and the gradient of the logits, in fp32 before its cast to bf16
# (4 + 4 + 4)
LOSS_BYTES = 12


def activation_bytes(name, examples, context, completion):
    """Peak training activations of one micro-batch of `examples` model calls, `context` tokens each of which
    `completion` are trained: a bf16 hidden state per checkpointed layer, one layer recomputed with its
    gradients (~ (8h + 3I) x 2 bytes a token, twice) and peft's fp32 copy of each LoRA Linear's input in it
    (lora_casts), the chunk states one GatedDeltaNet layer keeps for its backward (one fp32 state per 64 tokens),
    and the loss: rft.completion_nll runs the head on the completion tokens only, but all of them at once
    (LOSS_BYTES x vocab each)."""
    c = config(name)
    tokens = examples * context
    checkpoints = c["num_hidden_layers"] * tokens * c["hidden_size"] * 2
    one_layer = 2 * tokens * (8 * c["hidden_size"] + 3 * c["intermediate_size"]) * 2 + lora_casts(c, tokens)
    delta = tokens / 64 * c["linear_num_value_heads"] * c["linear_key_head_dim"] * c["linear_value_head_dim"] * 4
    loss = examples * completion * c["vocab_size"] * LOSS_BYTES
    return checkpoints + one_layer + delta + loss


def lora_casts(c, tokens):
    """What peft adds to a recomputed layer: each LoRA Linear casts its bf16 input to the adapter's fp32 and
    lora_A keeps that copy for its weight's gradient, one copy per module even where q, k and v share an input
    (the larger layer kind: GatedDeltaNet's, ~1.25 GiB at 2 x 8,192 tokens on the 2B model)."""
    return tokens * 4 * max(sum(i for i, _ in layer) for layer in layer_linears(c))


# -----------------------------------------------------------------------------
# memory

def memory(name, card_gb, retriever=None, gpu_memory=None, context=8192, completion=1024, micro_batch=None,
           sleep=True, model_len=MODEL_LEN, card_bytes=None):
    """The plan of one card: the engine's share (--gpu-memory; default: all the trainer leaves), the sequences
    its KV cache holds at `context` tokens, and the largest micro-batch (--micro-batch, model calls) of
    `context`-token calls with `completion` trained tokens that fits beside the trainer (or `micro_batch`,
    checked). It fits only if the KV cache also holds one sequence of model_len (--max-model-len) tokens:
    vLLM refuses to start below that (kv_shortfall). retriever: "gpu" puts Search-R1's index on this card;
    "cpu" or None leave it off. card_bytes: a measured card instead of the class card_gb's size."""
    params, lora = param_counts(name)
    card = card_bytes or CARDS[card_gb][1] * GiB
    on_card = RETRIEVER_GPU_BYTES if retriever == "gpu" else 0
    usable = card * (1 - FREE_SHARE) - CUDA_CONTEXT - on_card
    weights, lora_opt = params * 2, lora * 16  # bf16 base; fp32 LoRA weight + grad + Adam m and v
    act = lambda m: activation_bytes(name, m, context, completion)
    held = weights + lora_opt + RESERVED_SLACK  # the trainer at the engine's wake, its cache handed back
    room = usable - held  # what the trainer leaves for the engine (asleep while it trains)
    if sleep:
        engine = gpu_memory * card if gpu_memory else room
        train_room = room + RESERVED_SLACK - SLEEP_RESIDUAL
    else:  # both awake: keep room for one micro-batch of 2 calls
        engine = gpu_memory * card if gpu_memory else room - act(2)
        train_room = room - engine
    largest = 0
    while act(largest + 1) <= train_room and largest < 64:
        largest += 1
    micro = micro_batch or largest
    kv_per_token, state = cache_sizes(name)
    kv = engine - weights - OVERHEAD_ENGINE
    one_sequence = model_len * kv_per_token + state
    wake = CUDA_CONTEXT + on_card + held + engine  # the card at the wake after an update
    return dict(params=params, lora=lora, weights=weights, lora_opt=lora_opt, retriever=on_card, engine=engine,
                reserved_at_wake=held, wake=wake, wake_without_hand_back=wake - RESERVED_SLACK + act(max(micro, 1)),
                gpu_memory=engine / card, max_gpu_memory=room / card, kv=kv,
                seqs=max(0, int(kv // (context * kv_per_token + state))), kv_per_token=kv_per_token, state=state,
                micro_batch=micro, largest=largest, act=act(max(micro, 1)), train_room=train_room, context=context,
                completion=completion, one_sequence=one_sequence,
                fits=one_sequence <= kv and engine <= room and 1 <= micro <= largest)


# vLLM's hybrid cache (vllm/v1/core/kv_cache_planning.py, platforms/interface.py _align_hybrid_block_size): every
# layer's page is one size, a Gated DeltaNet layer's whole state (its recurrent state in the config's mamba_ssm_dtype,
# float32 for Qwen3.5, as cache_sizes counts it) or an attention layer's KV for a block of tokens, the block rounded
# up to KERNEL_BLOCK tokens until its page holds that state; the layers form groups of the full-attention layers'
# count (the 1 of the 3:1 pattern) and a block is one page of each layer of a group. A running sequence holds one
# block for each DeltaNet group, and with full CUDA graphs (vLLM's default) vLLM refuses to start when max_num_seqs
# exceeds the blocks (vllm/config/compilation.py: "max_num_seqs (N) exceeds available Mamba cache blocks (M)")
# tokens an attention block is a multiple of, by the Gated DeltaNet prefill the engine runs: the attention kernels'
# smallest block (FlashAttention's 16); with FlashInfer's prefill also its checkpoint alignment, 64 tokens, as vLLM
# keeps prefix-cache checkpoints on block boundaries (vllm/v1/attention/backends/gdn_attn.py
# FLASHINFER_GDN_CHECKPOINT_ALIGNMENT; mamba_cache_mode "align", vLLM's default with prefix caching on)
KERNEL_BLOCK = {"triton": 16, "flashinfer": 64}
# the share of the estimated blocks a suggested --workers leaves unused: the estimate rests on OVERHEAD_ENGINE,
# a guess where vLLM measures (its CUDA graphs can take more), so the line never proposes the estimate itself
BLOCK_MARGIN = 0.1


def cache_blocks(name, kv_bytes, prefill="triton"):
    """(blocks vLLM makes of kv_bytes of cache, tokens an attention block holds, bytes a block takes), with the
    engine's Gated DeltaNet `prefill` kernel ("triton" or "flashinfer")."""
    c = config(name)
    n_delta, n_full = layer_counts(c)
    kv_per_token, state = cache_sizes(name)
    layer_state, layer_token = state // n_delta, kv_per_token // n_full
    align = KERNEL_BLOCK[prefill]
    tokens = align * math.ceil(layer_state / (align * layer_token))
    per_block = n_full * tokens * layer_token
    return max(0, int(kv_bytes // per_block)), tokens, per_block


def workers_that_fit(blocks):
    """The most sequences at once (--workers) to run on `blocks` estimated cache blocks: BLOCK_MARGIN below them."""
    return int(blocks * (1 - BLOCK_MARGIN))


def block_shortfall(name, card_bytes, gpu_memory, seqs, prefill="triton"):
    """The one line that refuses an engine share whose cache holds too few blocks for `seqs` (the max_num_seqs the
    engine is given: lib/backends/policy.engine_seqs, from --workers) with BLOCK_MARGIN to spare, or None. vLLM
    checks this only at its start, after the trainer has loaded."""
    mem = memory(name, None, gpu_memory=gpu_memory, card_bytes=card_bytes)
    blocks, tokens, per_block = cache_blocks(name, mem["kv"], prefill)
    fits = workers_that_fit(blocks)
    if fits >= seqs:
        return None
    need = math.ceil(seqs / (1 - BLOCK_MARGIN))
    least = math.ceil((mem["weights"] + OVERHEAD_ENGINE + need * per_block) / card_bytes * 100) / 100
    fixes = [f"--workers {fits}"] if fits >= 64 else []  # the engine keeps room for the test's 64 at once
    if least <= mem["max_gpu_memory"]:
        fixes.append(f"--gpu-memory {least:.2f}")
    fix = " or ".join(fixes) if fixes else f"a larger card (the share that fits, {least:.2f}, leaves no room for the trainer)"
    return (f"{name}'s cache at --gpu-memory {gpu_memory:g} of {card_bytes / GiB:.1f} GiB would hold about {blocks} "
            f"blocks ({per_block / 2**20:.1f} MiB each: one per running sequence's Gated DeltaNet state, {prefill} "
            f"prefill), too few for the {seqs} sequences the engine runs at once (--workers) with "
            f"{BLOCK_MARGIN:.0%} to spare: vLLM refuses to start when they exceed its own count (max_num_seqs exceeds "
            f"available Mamba cache blocks): pass {fix}")


def trainer_flags(args):
    """memory()'s and trainer_shortfall()'s keywords from a whale.py run's flags: the engine's share on the trainer's
    card (--gpu-memory: the in-process engine's under --backend vllm, which sleeps while the trainer trains with
    --vllm-sleep; under --backend openai a server replica's --gpu-memory-utilization on this card, always awake, 0 where
    the server runs on other cards; None: no engine here) and whether it sleeps, and the longest call RSFT can be
    handed: --max-model-len tokens, of them the most one call generates trained (--max-new-tokens, within
    --episode-tokens)."""
    share = args.gpu_memory if args.backend in ("vllm", "openai") and args.gpu_memory else None
    sleep = share is None or (args.backend == "vllm" and bool(args.vllm_sleep))
    completion = min(args.max_new_tokens, getattr(args, "episode_tokens", None) or args.max_new_tokens)
    return dict(gpu_memory=share, sleep=sleep, context=args.max_model_len, completion=completion)


def trainer_shortfall(name, card_bytes, micro_batch, gpu_memory, context, completion, sleep=True, retriever=None):
    """The one line that refuses a trainer that would run out of memory at its first RSFT step on this card, or None:
    an engine share (--gpu-memory; None: no engine on the card) the trainer cannot wake beside, or a micro-batch
    (--micro-batch calls of `context` tokens, `completion` of them trained) whose SFT peak passes what the trainer's
    weights, LoRA and Adam state and the engine (asleep with --vllm-sleep, else awake) leave of the card, and
    Search-R1's index where it sits on it (retriever "gpu")."""
    mem = memory(name, None, gpu_memory=gpu_memory, context=context, completion=completion, micro_batch=micro_batch,
                 sleep=sleep, card_bytes=card_bytes, retriever=retriever)
    card = f"{card_bytes / GiB:.1f} GiB"
    if gpu_memory and mem["engine"] > mem["max_gpu_memory"] * card_bytes:
        return (f"{name}'s trainer ({(mem['weights'] + mem['lora_opt']) / GiB:.1f} GiB of weights, LoRA and Adam "
                f"state) has no room beside the engine's --gpu-memory {gpu_memory:g} of {card}: pass --gpu-memory "
                f"{math.floor(mem['max_gpu_memory'] * 100) / 100:.2f} or less")
    if micro_batch <= mem["largest"]:
        return None
    beside = ("the trainer's weights" if not gpu_memory else "the trainer's weights and the sleeping engine" if sleep
              else f"the trainer's weights and the engine's --gpu-memory {gpu_memory:g}")
    if retriever == "gpu":
        beside = beside.replace("the trainer's weights", "the trainer's weights, Search-R1's index", 1)
    fixes = [f"--micro-batch {mem['largest']}"] if mem["largest"] else []
    if gpu_memory and not sleep:  # an engine awake beside the trainer: the share at which this micro-batch fits
        share = replica_share(name, card_bytes, micro_batch, context, completion, retriever)
        if share > 0:
            fixes.append(f"--gpu-memory {share:.2f} (the engine's share of this card)")
    fix = " or ".join(fixes) or "a lower --max-model-len or --max-new-tokens, or a larger card"
    return (f"{name}'s SFT micro-batch of {micro_batch} call{'s' * (micro_batch > 1)} of {context:,d} tokens "
            f"({completion:,d} trained) needs about {mem['act'] / GiB:.1f} GiB, more than the "
            f"{max(mem['train_room'], 0) / GiB:.1f} GiB {beside} leave of {card}: the first RSFT step would run out "
            f"of memory: pass {fix}")


def replica_share(name, card_bytes, micro_batch, context, completion, retriever=None):
    """The largest engine share (two decimals; 0 or less where none) an awake engine, a server replica, can take of
    the card beside a trainer whose SFT micro-batch of `micro_batch` calls must fit (scripts/node.py: the share of
    vllm serve's --gpu-memory-utilization, trainer_shortfall's fix)."""
    mem = memory(name, None, gpu_memory=None, context=context, completion=completion, micro_batch=micro_batch,
                 card_bytes=card_bytes, retriever=retriever)
    return math.floor((mem["max_gpu_memory"] * card_bytes - mem["act"]) / card_bytes * 100) / 100


def kv_shortfall(name, card_bytes, gpu_memory, model_len):
    """The one line that refuses an engine share whose KV cache (the share less the engine's bf16 weights and
    OVERHEAD_ENGINE: CUDA graphs, the sampler's profiling, activations) holds no sequence of model_len tokens,
    or None. vLLM checks this only at its start, after the trainer has loaded; no RSFT step could run."""
    mem = memory(name, None, gpu_memory=gpu_memory, model_len=model_len, card_bytes=card_bytes)
    if mem["one_sequence"] <= mem["kv"]:
        return None
    least = (mem["weights"] + OVERHEAD_ENGINE + mem["one_sequence"]) / card_bytes
    return (f"{name}'s KV cache at --gpu-memory {gpu_memory:g} of {card_bytes / GiB:.1f} GiB would be "
            f"{max(mem['kv'], 0) / GiB:.2f} GiB, below the {mem['one_sequence'] / GiB:.2f} GiB one sequence of "
            f"--max-model-len {model_len} needs (vLLM refuses to start): pass --gpu-memory {math.ceil(least * 100) / 100:.2f} "
            f"or more, or a lower --max-model-len")


# -----------------------------------------------------------------------------
# what a run does, from its phases

def run_counts(phases, batch, group, candidates, harness_tasks, harness_samples, n_test, k, shared=0, first=True,
               test_evals="every"):
    """Work of a run with these [(kind, RSFT steps or proposer rounds)] phases (whale.fixed_phases), as
    plan.print_plan counts it, less what an earlier run of its process made: its first `shared` phases (and
    their evaluations), and the phase-0 evaluation and engine start unless it is the process's `first` run. A
    harness phase right after a weight phase (or the first) starts a new archive by re-scoring its incoming
    harness; each round scores M candidates (+ one smoke episode each); the test set is evaluated before the
    first phase and after every phase (test_evals "ends": after the last only)."""
    score = harness_tasks * harness_samples
    own = list(enumerate(phases))[shared:]
    steps = sum(n for _, (kind, n) in own if kind == "weight")
    rounds = sum(n for _, (kind, n) in own if kind == "harness")
    rescores = sum(1 for i, (kind, _) in own if kind == "harness" and (i == 0 or phases[i - 1][0] == "weight"))
    evaluated = [i for i, _ in own if test_evals == "every" or i == len(phases) - 1]
    evals = first + len(evaluated)
    return dict(steps=steps, train=steps * batch * group, rounds=rounds, scorings=rescores + rounds * candidates,
                harness=rescores * score + rounds * candidates * (score + 1), evals=evals, n_test=n_test,
                test=evals * n_test * k, starts=int(first), shared=shared)


def shared_phases(runs):
    """[how many leading phases of each run an earlier run of the process made], runs: [(method, phases)] in
    the process's order. whale.py's reuse takes a phase when everything before it and the phase itself are
    the same: the same steps of the same weight step (the method row's: RSFT's, or another's) under the same
    harnesses, the same search from the same harness under the same weights (a prompt-only method's searches,
    fast-slow's, are its own)."""
    made, out = set(), []
    for method, phases in runs:
        path, shared = (), 0
        for kind, size in phases:
            how = METHODS[method].weight_step if kind == "weight" else METHODS[method].prompt_only
            path += ((kind, size, how),)
            shared += path in made and shared == len(path) - 1
            made.add(path)
        out.append(shared)
    return out


# -----------------------------------------------------------------------------
# time

def decode_costs(mem, card_gb, mean_context):
    """(seconds every decode step pays whatever its batch: the weights through HBM + vLLM's fixed cost,
    seconds per generated token on top: its sequence's KV and DeltaNet state (read and written) through HBM,
    or its FLOPs if that is slower)."""
    _, _, bandwidth, tflops = CARDS[card_gb]
    step = mem["weights"] / (bandwidth * 1e9 * EFF_INFER) + STEP_OVERHEAD_S
    per_token = max((mean_context * mem["kv_per_token"] + 2 * mem["state"]) / (bandwidth * 1e9),
                    2 * mem["params"] / (tflops * 1e12)) / EFF_INFER + SEEDED_TOKEN_S
    return step, per_token


def episode_tokens(t):
    """(tokens prefilled, tokens in the SFT examples) of one episode. Prefill: the prompt and what the
    episode adds between calls (the prefix cache holds the rest). SFT: rft.py trains one example per call,
    each its whole context so far + its completion."""
    calls, gen_call = t["calls"], t["gen"] / t["calls"]
    added = t["tool"] / max(calls - 1, 1)
    trained = calls * t["prompt"] + gen_call * calls * (calls + 1) / 2 + added * calls * (calls - 1) / 2
    return t["prompt"] + t["tool"], trained


def rollout_s(name, t, card_gb, episodes, batches, workers=DEFAULT_WORKERS, gpu_memory=None, retriever=None):
    """Seconds to run `episodes` of token lengths `t` in `batches` runner calls (lib/episodes/runner.Runner). The runner
    keeps `workers` episodes live (at most what the KV cache holds) and samples their pending calls in one
    blocking generate call, which lasts as long as its longest completion (t["longest"]). So a generate call
    costs that many steps of the fixed step cost + its tokens, and waits for the slowest tool of its batch
    first; each runner call drains its last episodes in `calls` extra, emptier generate calls. The prefill
    FLOPs come on top, and the retriever's queue (one query at a time at the server) bounds it all where it
    is slower."""
    if not episodes:
        return 0.0
    prefill, _ = episode_tokens(t)
    mean_context = t["prompt"] + (t["gen"] + t["tool"]) / 2
    mem = memory(name, card_gb, retriever, gpu_memory, context=int(mean_context) + 1)
    slots = max(1, min(workers, MAX_NUM_SEQS, mem["seqs"]))
    step, per_token = decode_costs(mem, card_gb, mean_context)
    generate_calls = episodes * t["calls"] / slots + batches * math.ceil(t["calls"])
    decode = generate_calls * (t["longest"] * step + BATCH_WAIT_S + t["tool_s"]) + episodes * t["gen"] * per_token
    prefill_s = episodes * prefill * 2 * mem["params"] / (CARDS[card_gb][3] * 1e12 * EFF_INFER)
    search = episodes * t["searches"] * RETRIEVER_QUERY_S[retriever or "gpu"]
    return max(decode, search) + prefill_s


def sft_s(name, t, card_gb, trajectories, fla=True):
    """Seconds of the SFT passes over `trajectories` accepted episodes: 6 FLOPs per parameter and trained token
    (forward + backward; LoRA's saving on weight gradients not counted) + 2 for the checkpointed recompute."""
    _, trained = episode_tokens(t)
    params, _ = param_counts(name)
    s = trajectories * trained * 8 * params / (CARDS[card_gb][3] * 1e12 * EFF_TRAIN)
    return s if fla else s * NO_FLA_SFT_FACTOR


PARTS = ("rollouts", "test", "sft", "engine", "proposer")


def engine_replicas(gpus, ranks):
    """The engine's data-parallel replicas on a node of `gpus` cards (`vllm serve --data-parallel-size`, docs/gpu.md):
    one card holds everything; one trainer rank keeps a card of its own beside gpus - 1 replicas; several trainer
    ranks share the cards with a replica on each."""
    return gpus if gpus == 1 or ranks > 1 else gpus - 1


def hours(name, domain, counts, card_gb=80, max_new_tokens=1024, workers=None, gpu_memory=None, retriever=None,
          proposer_s=PROPOSER_S, fla=True, gpus=1, ranks=1):
    """Estimated hours of one run (one whale.py process) from run_counts(): {part: hours for PARTS, "total":
    hours, "counts": counts}. Training and harness scoring run `workers` episodes at a time, the test
    evaluation the runner's own width (whale.evaluate_test); the retriever sits where CARD_RETRIEVER puts it
    unless given. On `gpus` cards the rollouts spread over engine_replicas(gpus, ranks), each running its share
    of the episodes at once (so --workers must grow with them), and the SFT update over `ranks` trainer ranks
    (lib/backends/ranks.py: the LoRA gradients' one all-reduce a step, ~130 MB, is left out); the rest stays
    where it is."""
    t = tokens(domain, max_new_tokens)
    retriever = retriever or (CARD_RETRIEVER[card_gb] if domain == "searchqa" else None)
    engines = engine_replicas(gpus, ranks)
    run = lambda n, batches, w: rollout_s(name, t, card_gb, n / engines, batches, max(1, w // engines), gpu_memory,
                                          retriever)
    w = workers or DEFAULT_WORKERS
    parts = {"rollouts": run(counts["train"], counts["steps"], w) + run(counts["harness"], counts["scorings"], w),
             "test": run(counts["test"], counts["evals"], DEFAULT_WORKERS),
             "sft": sft_s(name, t, card_gb, counts["train"] * t["accept"], fla) / ranks,
             "engine": counts["steps"] * SYNC_S + counts["starts"] * START_S, "proposer": counts["rounds"] * proposer_s}
    parts = {k: v / 3600 for k, v in parts.items()}
    return {**parts, "total": sum(parts.values()), "counts": counts, "gpus": gpus, "ranks": ranks}


def night(processes, switch_s=SWITCH_S):
    """Hours of run_all.sh's night on one card, processes: [[estimate of each run of one process chain (a domain's
    runs: its process, then its adaptive one)], ...]. Without turns (TURNS=0) the chains run one after another: every
    hour of every run. With turns they run side by side and hold the card for their own work only, so the card's work
    is one chain's after another's, plus a switch (switch_s) per proposer round; a chain's own card work and its
    proposer's time cannot overlap each other, so the night is at least the longest chain's (where the others have
    nothing left to do, its proposer's share shows). -> {"without", "with", "card", "switches", "longest"} in hours"""
    card = [sum(e["total"] - e["proposer"] for e in chain) for chain in processes]
    own = [sum(e["total"] for e in chain) for chain in processes]
    switches = sum(e["counts"]["rounds"] for chain in processes for e in chain) * switch_s / 3600
    return {"without": sum(own), "with": max(sum(card) + switches, max(own)), "card": sum(card),
            "switches": switches, "longest": max(own)}


def model_name(model):
    """The MODELS key of a --model value (a hub id or a local folder named after it), or None."""
    tail = str(model).rstrip("/").split("/")[-1]
    return tail if tail in MODELS else None


def estimate(args, phases, n_harness, n_test, card_gb=80, shared=0, first=True, **kw):
    """hours() of a whale.py run's own work (run_counts) from its flags and whale.fixed_phases, or None for a
    model not in MODELS."""
    name = model_name(args.model)
    if name is None:
        return None
    counts = run_counts(phases, args.batch, args.group, args.candidates, n_harness, args.harness_samples, n_test,
                        args.k, shared, first, args.test_evals)
    return hours(name, args.domain, counts, card_gb, args.max_new_tokens, args.workers, args.gpu_memory, **kw)


def describe(est, card_gb=80):
    parts = ", ".join(f"{k} {est[k]:.2f}" for k in PARTS)
    gpus, ranks = est.get("gpus", 1), est.get("ranks", 1)
    where = f"one {card_gb} GB card" if gpus == 1 else f"{gpus} x {card_gb} GB cards"
    line = f"estimated {est['total']:.2f} h on {where} ({CARDS[card_gb][0]}; lib/ops/time_model.py): {parts}"
    if gpus == 1:
        return line
    return (f"{line}; the trainer's share (SFT over {ranks} rank{'s' * (ranks > 1)}) {est['sft']:.2f} h = "
            f"{est['sft'] / est['total']:.0%}, rollouts and tests on {engine_replicas(gpus, ranks)} engine replicas")


# -----------------------------------------------------------------------------
# how sure one cell is

def interval_halfwidth(n_tasks, k, p, rho=0.5, z=1.96):
    """95 % half-width of mean@k over n_tasks tasks at accuracy p. A task's k samples are correlated: with
    rho the share of the variance p(1-p) that lies between tasks (0: every task has accuracy p; 1: each task
    is always right or always wrong),
        Var(mean@k) = p (1 - p) (rho + (1 - rho) / k) / n_tasks."""
    return z * math.sqrt(p * (1 - p) * (rho + (1 - rho) / k) / n_tasks)
