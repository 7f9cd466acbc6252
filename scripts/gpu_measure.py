"""The measurements of scripts/gpu_check.sh, each printed beside lib/ops/time_model.py's figure as one "ok NAME ...",
"FAIL NAME ..." or "skip NAME ..." line. Random weights built from the real Qwen3.5-2B config: nothing downloaded.

    python scripts/gpu_measure.py memory    # SFT micro-batch peak, reserved before / after the hand-back
    python scripts/gpu_measure.py speed     # trained tokens/s with fla-core and without (the torch chunk loop)
    python scripts/gpu_measure.py decode    # hf decode tokens/s at batch 1, 8, 32
    python scripts/gpu_measure.py probe     # vllm: the probe adapter on Qwen3.5's real model class

The plan is stated for one card per memory class (time_model.CARDS); a larger or faster card is compared with the
80 GB one, so a FAIL says the plan is optimistic there, never that the card is slow. Margins: memory may pass
the plan by MEMORY_MARGIN; trained tokens/s must reach the plan's / SPEED_MARGIN, and the slowdown without fla
lie within SPEED_MARGIN of time_model.NO_FLA_SFT_FACTOR; hf decode (no engine: the plan models vLLM's) must lie
within DECODE_RANGE of the plan's engine rate.
"""
import inspect
import os
import sys
import time
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rft  # noqa: E402
from lib.ops import time_model  # noqa: E402
from lib.backends.policy import add_lora  # noqa: E402

NAME, CONTEXT, COMPLETION, CALLS = "Qwen3.5-2B", 8192, 1024, 2  # the gpu preset's longest micro-batch
MEMORY_MARGIN, SPEED_MARGIN, DECODE_RANGE = 1.10, 2.0, (1 / 20, 2.0)
DECODE_BATCHES, DECODE_PROMPT, DECODE_TOKENS = (1, 8, 32), 512, 64
GiB = time_model.GiB


def card_gb():
    """The plan's card for this GPU: the largest memory class it holds."""
    total = torch.cuda.get_device_properties(0).total_memory / 1e9
    return max([gb for gb in time_model.CARDS if gb <= total + 1] or [min(time_model.CARDS)])


def random_model(lora=True):
    """Qwen3.5-2B's text model, random bf16 weights on the GPU; LoRA r16 on all linear layers and gradient
    checkpointing, as rft.py trains it."""
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5 import modeling_qwen3_5
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = modeling_qwen3_5.Qwen3_5ForCausalLM(Qwen3_5TextConfig(**time_model.config(NAME))).to(torch.bfloat16)
    if not lora:
        return model.eval()
    model = add_lora(model, SimpleNamespace(lora_targets="all-linear", lora_rank=16, lora_alpha=32, lora_dropout=0.0))
    model.get_base_model().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def calls(vocab):
    """CALLS accepted model calls of CONTEXT tokens, COMPLETION of them trained, as rft.sft_update takes them."""
    out = []
    for _ in range(CALLS):
        tokens = torch.randint(0, vocab, (CONTEXT,)).tolist()
        out.append([(tokens[:CONTEXT - COMPLETION], tokens[CONTEXT - COMPLETION:])])
    return out


def memory():
    model = random_model()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    batch = calls(model.config.vocab_size)
    rft.sft_update(model, opt, batch, CALLS, CALLS, 1.0)  # the first step makes Adam's state; the second is measured
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    rft.sft_update(model, opt, batch, CALLS, CALLS, 1.0)
    peak, held = torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved()
    rft.hand_back_memory()
    handed = torch.cuda.memory_reserved()
    plan = time_model.memory(NAME, card_gb(), context=CONTEXT, completion=COMPLETION, micro_batch=CALLS)
    want = plan["weights"] + plan["lora_opt"] + plan["act"]
    fla = "on" if importlib_ok("fla") else "off"  # transformers takes fla-core's kernels where it imports
    print(f"{'ok' if peak <= MEMORY_MARGIN * want else 'FAIL'} memory-plan {NAME} SFT micro-batch ({CALLS} calls of "
          f"{CONTEXT} tokens, {COMPLETION} trained; fla {fla}): peak {peak / GiB:.2f} GiB, planned {want / GiB:.2f} "
          f"(weights {plan['weights'] / GiB:.2f} + LoRA state {plan['lora_opt'] / GiB:.2f} + activations "
          f"{plan['act'] / GiB:.2f}), ratio {peak / want:.2f} (margin {MEMORY_MARGIN:.2f})")
    print(f"{'ok' if handed <= plan['reserved_at_wake'] else 'FAIL'} memory-wake reserved after the update "
          f"{held / GiB:.2f} GiB, after rft.hand_back_memory {handed / GiB:.2f}; planned at the engine's wake "
          f"{plan['reserved_at_wake'] / GiB:.2f} (live tensors + RESERVED_SLACK {time_model.RESERVED_SLACK / GiB:.2f}); "
          f"without the hand-back the wake would meet {held / GiB:.2f}")


def trained_tokens_per_s(model, opt, batch, steps):
    rft.sft_update(model, opt, batch, CALLS, CALLS, 1.0)  # warm-up: kernels compiled, Adam's state made
    torch.cuda.synchronize()
    start = time.time()
    for _ in range(steps):
        rft.sft_update(model, opt, batch, CALLS, CALLS, 1.0)
    torch.cuda.synchronize()
    return steps * CALLS * CONTEXT / (time.time() - start)


def speed():
    from transformers.models.qwen3_5 import modeling_qwen3_5
    card = card_gb()
    _, _, _, tflops = time_model.CARDS[card]
    params, _ = time_model.param_counts(NAME)
    plan = tflops * 1e12 * time_model.EFF_TRAIN / (8 * params)  # time_model.sft_s: 8 FLOPs a parameter a trained token
    model = random_model()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    batch = calls(model.config.vocab_size)
    have_fla = importlib_ok("fla")
    with_fla = trained_tokens_per_s(model, opt, batch, 2) if have_fla else None
    chosen = modeling_qwen3_5.torch_chunk_gated_delta_rule  # fla-core's kernel where it imported
    modeling_qwen3_5.torch_chunk_gated_delta_rule = torch_only(chosen)
    try:
        without = trained_tokens_per_s(model, opt, batch, 1)
    finally:
        modeling_qwen3_5.torch_chunk_gated_delta_rule = chosen
    where = f"{time_model.CARDS[card][0]} in the plan ({tflops} TFLOPS x EFF_TRAIN {time_model.EFF_TRAIN})"
    if with_fla is None:
        print("skip sft-speed-fla fla-core is not importable (carry wheels/: bash scripts/gpu_wheels.sh)")
        fast = without * time_model.NO_FLA_SFT_FACTOR  # the plan's own claim, to judge the no-fla figure by
    else:
        fast = with_fla
        print(f"{'ok' if with_fla >= plan / SPEED_MARGIN else 'FAIL'} sft-speed-fla {with_fla:,.0f} trained tokens/s, "
              f"planned {plan:,.0f} on the {where}: ratio {with_fla / plan:.2f} (at least 1/{SPEED_MARGIN:g})")
    slowdown = fast / without
    ok = 1 / SPEED_MARGIN <= slowdown / time_model.NO_FLA_SFT_FACTOR <= SPEED_MARGIN
    print(f"{'ok' if ok or with_fla is None else 'FAIL'} sft-speed-no-fla {without:,.0f} trained tokens/s with "
          f"transformers' torch chunk loop: {slowdown:.1f}x slower{'' if with_fla else ' (by the plan, fla not here)'}, "
          f"planned {time_model.NO_FLA_SFT_FACTOR:g}x (within {SPEED_MARGIN:g}x)")


def torch_only(chosen):
    """transformers' own torch path of a kernel function it wrapped (the one it runs without fla-core), taking
    only the arguments that path has, as the wrapper passes them."""
    path = inspect.unwrap(chosen)
    params = inspect.signature(path).parameters
    return lambda *args, **kw: path(*args, **{k: v for k, v in kw.items() if k in params})


def importlib_ok(name):
    try:
        __import__(name)
        return True
    except Exception:  # absent, or built for another torch
        return False


def decode():
    from lib.backends.hf_backend import HFBackend
    model = random_model(lora=False)
    tok = SimpleNamespace(eos_token_id=None, pad_token_id=0)
    backend = HFBackend(model, tok, ignore_eos=True)
    card = card_gb()
    mean_context = DECODE_PROMPT + DECODE_TOKENS // 2
    step, per_token = time_model.decode_costs(time_model.memory(NAME, card, None, 0.45, context=mean_context), card,
                                            mean_context)
    backend.generate([[1] * 16], max_new_tokens=4, seeds=[0])  # warm-up
    for b in DECODE_BATCHES:
        prompts = torch.randint(0, model.config.vocab_size, (b, DECODE_PROMPT)).tolist()
        torch.cuda.synchronize()
        start = time.time()
        out = backend.generate(prompts, temperature=1.0, top_k=20, max_new_tokens=DECODE_TOKENS, seeds=list(range(b)))
        torch.cuda.synchronize()
        rate = sum(map(len, out)) / (time.time() - start)
        plan = b / (step + b * per_token)  # time_model.rollout_s: every step pays the weights, every token its state
        ok = DECODE_RANGE[0] <= rate / plan <= DECODE_RANGE[1]
        print(f"{'ok' if ok else 'FAIL'} hf-decode-{b} {rate:,.0f} tokens/s at batch {b} ({DECODE_PROMPT}-token "
              f"prompts, prefill included), planned {plan:,.0f} for vLLM on the {time_model.CARDS[card][0]}: ratio "
              f"{rate / plan:.2f} (within {DECODE_RANGE[0]:g}-{DECODE_RANGE[1]:g}: hf is no engine)")


PROBE_MODEL = "qwen35-probe-v1"  # build_probe_model's cache folder


def build_probe_model(folder):
    """A small random Qwen3.5 saved as the hub checkpoints are (Qwen3_5ForConditionalGeneration: a vision tower
    beside three Gated DeltaNet layers and a gated full-attention one), with the real models' head sizes (Gated
    DeltaNet key and value heads of 128, attention heads of 256), which vLLM's kernels are built for (the paper dry
    run's tiny model has heads of 16, which FlashInfer's Hopper prefill may refuse), and the tests' Qwen3.5 tokenizer."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    from tests.fixtures.qwen35 import qwen35_tokenizer
    heads = {k: v for k, v in time_model.QWEN35_COMMON.items() if k.startswith(("head_dim", "linear_"))}
    tok = qwen35_tokenizer()
    torch.manual_seed(0)
    text = dict(heads, vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                num_attention_heads=2, num_key_value_heads=1, linear_num_key_heads=2, linear_num_value_heads=2,
                max_position_embeddings=32768, tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=256)
    model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision,
                                                          tie_word_embeddings=True))
    model.generation_config.eos_token_id = tok.eos_token_id
    tok.save_pretrained(folder)
    model.save_pretrained(folder)


def probe():
    """vLLM serves a probe adapter on Qwen3.5's real model class (build_probe_model) and its outputs move as the
    trainer's: what every engine start checks, with the adapter's keys renamed for that class (lib/backends/engines)."""
    from lib.backends import canary, engines, models
    folder = models.cached(PROBE_MODEL, build_probe_model)
    model, tok = models.load_model(str(folder), dtype=torch.bfloat16)
    engine = engines.VLLMBackend(str(folder), tok, model, gpu_memory=0.3, max_lora_rank=16, max_model_len=2048)
    took = f"kernels: {engine.backends}; {engine.adapter_keys}"
    try:
        s = canary.probe_engine(engine, tok)
        print(f"ok vllm-probe Qwen3.5's model class serves a LoRA adapter: adapter effect {s['effect']:.2e} "
              f"nats/token, the engine's own effect {s['scale']:.2f} of it (residual {s['residual']:.2e}), "
              f"dtype noise {s['noise']:.2e}; {took}")
    except canary.EngineError as e:
        print(f"FAIL vllm-probe {e} ({took})")


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    checks = {"memory": ("memory-plan memory-wake", memory), "speed": ("sft-speed-fla sft-speed-no-fla", speed),
              "decode": (" ".join(f"hf-decode-{b}" for b in DECODE_BATCHES), decode), "probe": ("vllm-probe", probe)}
    if what in ("-h", "--help"):
        print(__doc__)
        return
    if what not in checks:
        sys.exit(f"usage: python scripts/gpu_measure.py {'|'.join(checks)}")
    names, check = checks[what]
    why = None
    if not torch.cuda.is_available():
        why = f"no CUDA device (torch {torch.__version__} sees none)"
    elif what == "probe" and not importlib_ok("vllm"):
        why = "vllm is not importable (bash install.sh --gpu)"
    if why:
        for name in names.split():
            print(f"skip {name} {why}")
        return
    check()


if __name__ == "__main__":
    main()
