"""The policy: one object that owns the model being trained, its LoRA adapter and the backend that samples from it.

    policy = load_policy(args)               # --model, --backend hf|vllm|openai, --bf16
    policy.generate(prompt_ids, ...)         # what the episode runner calls (with policy.tokenizer)
    policy.add_adapter() / load_adapter(folder) / drop_adapter()
    policy.save_adapter(folder); policy.serve_adapter(folder)   # after an update: the backend serves it

hf samples from the trainer's own module, so an update is served at once. vllm and an OpenAI-compatible server
load the saved adapter and run the canary (lib/backends/canary.py) against the trainer's module before the next rollout.
"""
import argparse
import importlib.util
import json
from pathlib import Path

import torch

from lib.common.argtypes import positive_int, share

from lib.backends.canary import PROBE_RANK, probe_engine
from lib.backends.engines import GDN_PREFILLS, OpenAIBackend, VLLMBackend, engine_lora_rank
from lib.backends.hf_backend import HFBackend, NullModelBackend
from lib.backends.models import load_model

RUNNER_WIDTH = 64  # rollout.run_episodes' concurrent episodes without --workers (the test evaluation's)


def add_backend_args(parser):
    p = parser.add_argument_group("policy backend (the engine that samples the model)")
    p.add_argument("--backend", default="hf", choices=("hf", "vllm", "openai"),
                   help="hf: transformers in process; vllm: colocated vLLM engine; openai: a remote server")
    p.add_argument("--gpu-memory", type=share, default=0.45,
                   help="vllm: share of GPU memory for the engine (weights + KV cache; on CPU its KV-cache share "
                        "of RAM); the trainer uses the rest. openai: the share a server replica holds of the "
                        "trainer's card (its --gpu-memory-utilization; 0 where the server runs on other cards), "
                        "which the preflight checks the trainer beside")
    p.add_argument("--vllm-sleep", action=argparse.BooleanOptionalAction, default=False,
                   help="vllm: offload the engine's weights and drop its KV cache while the trainer runs "
                        "(the gpu and paper presets; --no-vllm-sleep where the platform cannot, as on CPU)")
    p.add_argument("--max-lora-rank", type=positive_int, default=None,
                   help="vllm: the largest LoRA rank the engine accepts (default: the adapter's --lora-rank, rounded up "
                        "to a rank vLLM takes)")
    p.add_argument("--max-model-len", type=positive_int, default=8192, help="vllm: longest prompt + completion in tokens")
    p.add_argument("--gdn-prefill", default="triton", choices=GDN_PREFILLS,
                   help="vllm, a Gated DeltaNet model (Qwen3.5): triton (default) runs Triton's prefill kernel; auto "
                        "lets vLLM choose (FlashInfer's on Hopper, compiled with nvcc at the engine's warm-up)")
    p.add_argument("--skip-lora-probe", action="store_true",
                   help="vllm, openai: start without the check that the engine applies LoRA to this model: it then "
                        "serves weights nobody checked (the canary after each update still runs, but cannot tell an "
                        "adapter below the dtype noise from none)")
    p.add_argument("--openai-url", default="http://localhost:8000/v1", help="openai: the server's /v1 base URL")
    p.add_argument("--openai-model", default=None, help="openai: the served base model name (default --model)")
    p.add_argument("--openai-workers", type=positive_int, default=64, help="openai: concurrent requests")


def check_backend(args):
    """--backend names an engine this machine has, before any model loads (vllm is the GPU extra)."""
    if args.model == "null" and args.backend != "hf":
        raise ValueError(f"--model null replies '' without any engine: use --backend hf, not --backend {args.backend}")
    if args.backend == "vllm" and not args.gpu_memory:
        raise ValueError("--backend vllm --gpu-memory 0 leaves the engine no memory: pass its share, e.g. "
                         "--gpu-memory 0.45 (0 is for --backend openai with the server on other cards)")
    if args.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ValueError("--backend vllm: the vllm package is not installed here: bash install.sh --gpu (or pip "
                         "install -r requirements-gpu.txt) on a CUDA machine, or use --backend hf")


def load_backend(args, model, tok, adapter=None):
    """The backend named by --backend; model is the trainer's HF base model (the canary's reference). The engine
    backends first prove with a probe adapter that they apply LoRA to this model (canary.probe_engine). adapter: a
    LoRA folder to start from: loaded onto the model (backend.model is then the PeftModel) and, by the engines,
    into the engine with the canary checked, before the first rollout."""
    if args.backend == "hf":
        backend = NullModelBackend(tok, model) if args.model == "null" else HFBackend(model, tok)
    else:
        path = getattr(model, "name_or_path", None) or args.model
        if args.backend == "vllm":
            rank = max_lora_rank(args, adapter)
            backend = VLLMBackend(path, tok, model, gpu_memory=args.gpu_memory, sleep=args.vllm_sleep,
                                  max_lora_rank=rank, max_model_len=args.max_model_len,
                                  max_num_seqs=engine_seqs(getattr(args, "workers", None)),
                                  gdn_prefill=getattr(args, "gdn_prefill", "triton"))
        else:
            rank = PROBE_RANK  # a server's --max-lora-rank is its own: vLLM's default (16) holds the probe
            backend = OpenAIBackend(args.openai_url, args.openai_model or path, tok, model,
                                    workers=args.openai_workers)
        if not args.skip_lora_probe:
            probe_engine(backend, tok, lora_targets(getattr(args, "lora_targets", "all-linear")), min(PROBE_RANK, rank))
    if adapter:
        backend.model = load_lora(model, adapter)
        backend.sync_adapter(adapter)
    return backend


def engine_seqs(workers):
    """The engine's max_num_seqs: the most episodes the runner keeps live (--workers; None: its default 64), at
    least the 64 the test evaluation runs at once."""
    return max(workers or RUNNER_WIDTH, RUNNER_WIDTH)


def max_lora_rank(args, adapter=None):
    """--max-lora-rank, else the rank of the run's adapters (the one loaded, or --lora-rank) as vLLM takes it."""
    if args.max_lora_rank:
        return args.max_lora_rank
    if adapter:
        return engine_lora_rank(json.loads((Path(adapter) / "adapter_config.json").read_text())["r"])
    return engine_lora_rank(getattr(args, "lora_rank", None) or 16)


def load_policy(args, adapter=None):
    """The policy for --model (bf16 with --bf16) on --backend; adapter: a LoRA folder to start from."""
    dtype = torch.bfloat16 if getattr(args, "bf16", False) else None
    model, tok = load_model(args.model, dtype=dtype)
    backend = load_backend(args, model, tok, adapter=adapter)
    return Policy(backend.model, tok, backend)


class Policy:
    """model: the trainer's module (the base model, or a PeftModel once it has an adapter); tokenizer; backend:
    what samples. Only this object switches the model under the backend."""

    def __init__(self, model, tokenizer, backend):
        self.model, self.tokenizer, self.backend = model, tokenizer, backend

    def generate(self, prompts, **kw):
        return self.backend.generate(prompts, **kw)

    @property
    def has_adapter(self):
        from peft import PeftModel
        return isinstance(self.model, PeftModel)

    def set_model(self, model):
        # hf samples from it; the engines score the canary against it
        self.model = self.backend.model = model

    def add_adapter(self, lora):
        """A fresh, trainable LoRA adapter from the --lora-* flags (its init draws from torch's global RNG)."""
        self.set_model(add_lora(self.model, lora))

    def load_adapter(self, folder):
        self.set_model(load_lora(self.model, folder))

    def drop_adapter(self):
        """Back to the base weights, so another adapter can be loaded."""
        self.set_model(self.model.unload())

    def to_base(self):
        """The trainer and the backend on the base weights, as loaded: for the next run of a process."""
        if self.has_adapter:
            self.drop_adapter()
        if hasattr(self.backend, "serve_base"):
            self.backend.serve_base()

    def save_adapter(self, folder):
        self.model.save_pretrained(folder)

    def serve_adapter(self, folder):
        """The backend samples from the adapter saved in `folder` from now on (the engines check the canary)."""
        return self.backend.sync_adapter(str(folder))

    def free_memory(self):
        """vllm --vllm-sleep: the engine frees its memory while the trainer runs; the next generate wakes it."""
        if hasattr(self.backend, "sleep"):
            self.backend.sleep()

    def leave_card(self):
        """Another process's turn on the GPU (lib/run_folder/card.py): the engine asleep, the trainer's weights in
        host memory (copied exactly, bf16 and fp32 alike; the optimizer's LoRA state, small, stays), the cache
        emptied, so the next process wakes into the card this one held. On CPU it does nothing."""
        self.free_memory()
        if torch.cuda.is_available():
            self.model.to("cpu")
            torch.cuda.empty_cache()

    def back_on_card(self):
        """This process's turn again: the trainer's weights back on the GPU; the engine wakes at its next generate."""
        if torch.cuda.is_available():
            self.model.to("cuda")


def add_lora(model, lora):
    """Wrap `model` with a fresh, trainable LoRA adapter from the flags."""
    from peft import LoraConfig, get_peft_model
    config = LoraConfig(r=lora.lora_rank, lora_alpha=lora.lora_alpha, lora_dropout=lora.lora_dropout,
                        target_modules=lora_targets(lora.lora_targets), task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, config)
    except ValueError as e:  # peft: "Target modules {...} not found in the base model"
        raise ValueError(f"--lora-targets {lora.lora_targets!r} does not fit the model ({e}): "
                         "use 'all-linear' or names of its Linear layers such as q_proj,v_proj") from None


def lora_targets(flag):
    """--lora-targets as peft's target_modules."""
    return flag if flag == "all-linear" else [t.strip() for t in flag.split(",")]


def load_lora(model, folder):
    """The checkpointed adapter on `model`; a clear error when it was trained on another model."""
    from peft import PeftModel
    from safetensors import safe_open
    unfit = lambda why: ValueError(f"the adapter in {folder} does not fit this model ({why}): "
                                   "use the --model it was trained with, or a new --out")
    with safe_open(Path(folder) / "adapter_model.safetensors", "pt") as f:
        saved = sum("lora_" in k for k in f.keys())
    try:
        model = PeftModel.from_pretrained(model, folder, is_trainable=True)
    except (ValueError, RuntimeError, KeyError) as e:  # shape mismatch
        raise unfit(str(e).splitlines()[0][:200]) from None
    here = sum("lora_" in k for k, _ in model.named_parameters())
    if here != saved:  # peft only warns about missing keys (another depth)
        raise unfit(f"{saved} LoRA tensors saved, {here} in the model")
    return model
