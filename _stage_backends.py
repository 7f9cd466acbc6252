"""GPU policy backends (staged here until rollout.py is done; they move into rollout.py then).

    backend = load_backend(args, model, tok)     # --backend hf | vllm | openai

- vllm: vLLM's offline engine in the trainer's process, colocated on one GPU. After each RSFT update
  the new adapter is loaded as a new LoRARequest; --vllm-sleep offloads the engine's weights and drops
  its KV cache while the trainer runs (backend.sleep(), woken by the next generate).
- openai: any OpenAI-compatible server (e.g. `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve MODEL
  --enable-lora --max-lora-rank 64`), the adapter loaded through POST /v1/load_lora_adapter; the
  adapter folder must be readable by the server at the same path (a shared file system).
Both return the same thing as the hf backend: the sampled completion ids, EOS included when sampled.

Canary: an engine can accept an adapter and silently not apply it. After every adapter load, a few
greedy tokens from the engine are scored by the trainer's own model (which holds the same adapter):
each engine token must be that model's argmax given the same prefix, within CANARY_TOL nats (bf16
kernels differ, so exact ties may flip). Otherwise the run stops with a RuntimeError naming the
adapter and the engine, instead of training on stale weights.
"""
import json
import os
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import torch

CANARY_PROMPTS = ("The capital of France is", "def fibonacci(n):", "Seven times six equals")
CANARY_TOKENS = 8
CANARY_TOL = 0.1  # nats; a flipped near-tie passes, an adapter that was not applied does not


def add_backend_args(p):
    # policy backend
    p.add_argument("--backend", default="hf", choices=("hf", "vllm", "openai"),
                   help="hf: transformers in process; vllm: colocated vLLM engine; openai: a remote server")
    p.add_argument("--gpu-memory", type=float, default=0.45,
                   help="vllm: share of GPU memory for the engine (weights + KV cache); the trainer uses the rest")
    p.add_argument("--vllm-sleep", action="store_true",
                   help="vllm: offload the engine's weights and drop its KV cache while the trainer runs")
    p.add_argument("--max-lora-rank", type=int, default=64, help="vllm: the largest LoRA rank the engine accepts")
    p.add_argument("--max-model-len", type=int, default=8192, help="vllm: longest prompt + completion in tokens")
    p.add_argument("--openai-url", default="http://localhost:8000/v1", help="openai: the server's /v1 base URL")
    p.add_argument("--openai-model", default=None, help="openai: the served base model name (default --model)")
    p.add_argument("--openai-workers", type=int, default=64, help="openai: concurrent requests")


def load_backend(args, model, tok):
    """The policy backend named by --backend; model is the trainer's HF model (the canary's reference)."""
    if args.backend == "hf":
        import rollout
        return rollout.HFBackend(model, tok)
    path = getattr(model, "name_or_path", None) or args.model
    if args.backend == "vllm":
        return VLLMBackend(path, tok, model, gpu_memory=args.gpu_memory, sleep=args.vllm_sleep,
                           max_lora_rank=args.max_lora_rank, max_model_len=args.max_model_len)
    return OpenAIBackend(args.openai_url, args.openai_model or path, tok, model, workers=args.openai_workers)


def per_row(max_new_tokens, seeds, n):
    """(token cap, seed) per prompt: max_new_tokens may be one cap or a list, as for the hf backend."""
    caps = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * n
    return caps, seeds if seeds is not None else [None] * n


def with_eos(ids, finish_reason, stop_token, eos_id):
    """Completion ids with the stop token kept: engines report a stop on EOS but may drop its id."""
    ids = list(ids)
    if finish_reason == "stop" and stop_token is None and eos_id is not None and (not ids or ids[-1] != eos_id):
        ids.append(eos_id)
    elif finish_reason == "stop" and isinstance(stop_token, int) and (not ids or ids[-1] != stop_token):
        ids.append(stop_token)
    return ids

# -----------------------------------------------------------------------------
# canary


@torch.no_grad()
def canary_gaps(model, prompt, completion):
    """Per completion token: the model's best log-prob minus the log-prob of that token, same prefix."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt) + list(completion)], device=device)
    logp = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float().log_softmax(-1)
    chosen = logp.gather(-1, ids[0, len(prompt):, None])[:, 0]
    return (logp.max(-1).values - chosen).tolist()


def check_canary(engine, model, tok, adapter, engine_name):
    """Raise RuntimeError unless the engine's greedy tokens are the trainer model's own greedy tokens."""
    prompts = [tok(p)["input_ids"] for p in CANARY_PROMPTS]
    outputs = engine.generate(prompts, temperature=0.0, top_k=0, max_new_tokens=CANARY_TOKENS, seeds=[0] * len(prompts))
    was_training = model.training
    model.eval()  # no LoRA dropout in the reference
    try:
        for text, prompt, completion in zip(CANARY_PROMPTS, prompts, outputs):
            if not completion:
                raise RuntimeError(f"adapter canary: {engine_name} returned no tokens for {text!r} with adapter {adapter}")
            gaps = canary_gaps(model, prompt, completion)
            worst = max(range(len(gaps)), key=gaps.__getitem__)
            if gaps[worst] > CANARY_TOL:
                raise RuntimeError(
                    f"adapter canary failed: {engine_name} with adapter {adapter} chose token {completion[worst]} at "
                    f"step {worst} of {text!r}, {gaps[worst]:.2f} nats below the trainer's own choice; the engine "
                    f"did not apply the adapter (check its LoRA support for this model, --max-lora-rank and the "
                    f"adapter's target modules). Stopping rather than sampling from stale weights.")
    finally:
        model.train(was_training)

# -----------------------------------------------------------------------------
# vllm


class VLLMBackend:
    """vLLM's offline engine beside the trainer on one GPU; self.model is the trainer's torch module."""

    def __init__(self, model_path, tok, model, *, gpu_memory=0.45, sleep=False, max_lora_rank=64,
                 max_model_len=8192, seed=0):
        import vllm  # GPU-only extra: requirements-gpu.txt
        self.llm = vllm.LLM(model=model_path, tokenizer=model_path, dtype="bfloat16", seed=seed,
                            gpu_memory_utilization=gpu_memory, enable_sleep_mode=sleep, enable_lora=True,
                            max_lora_rank=max_lora_rank, max_loras=1, max_model_len=max_model_len)
        self.tokenizer, self.model = tok, model
        self.sleep_enabled, self.sleeping = sleep, False
        self.lora, self.lora_count = None, 0

    def generate(self, prompts, *, temperature=1.0, top_k=20, max_new_tokens=256, seeds=None):
        from vllm import SamplingParams
        self.wake()
        caps, seeds = per_row(max_new_tokens, seeds, len(prompts))
        params = [SamplingParams(temperature=temperature, top_k=top_k or 0, max_tokens=cap, seed=s)
                  for cap, s in zip(caps, seeds)]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params,
                                 lora_request=self.lora, use_tqdm=False)
        return [with_eos(o.outputs[0].token_ids, o.outputs[0].finish_reason, o.outputs[0].stop_reason,
                         self.tokenizer.eos_token_id) for o in outs]

    def sync_adapter(self, path):
        """Serve the adapter saved at `path` from now on, then check the canary against self.model."""
        from vllm.lora.request import LoRARequest
        self.wake()
        self.lora_count += 1  # a new id per update: vLLM caches adapters by id
        self.lora = LoRARequest(f"rsft-{self.lora_count}", self.lora_count, os.path.realpath(path))
        check_canary(self, self.model, self.tokenizer, path, "vllm (offline engine)")

    def sleep(self):
        """Free the engine's GPU memory for the trainer (--vllm-sleep); the next generate wakes it."""
        if self.sleep_enabled and not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def wake(self):
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

# -----------------------------------------------------------------------------
# openai-compatible server


def post_json(url, payload, timeout=600.0):
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read().decode()
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{url} answered {e.code}: {e.read().decode()[:500]}") from None
    except urllib.error.URLError as e:
        raise RuntimeError(f"cannot reach {url} ({e.reason}): start the server or fix --openai-url") from None
    return json.loads(body) if body.strip().startswith(("{", "[")) else {"text": body}


class OpenAIBackend:
    """Rollouts on an OpenAI-compatible server (/v1/completions with prompt token ids)."""

    def __init__(self, base_url, served_model, tok, model, *, workers=64, timeout=600.0):
        self.base_url, self.served = base_url.rstrip("/"), served_model
        self.tokenizer, self.model = tok, model
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.timeout, self.adapter_name, self.lora_count = timeout, None, 0

    def complete(self, prompt, seed, temperature, top_k, max_new_tokens):
        payload = {"model": self.adapter_name or self.served, "prompt": list(prompt), "max_tokens": max_new_tokens,
                   "temperature": temperature, "top_k": top_k or 0, "seed": seed,
                   "return_token_ids": True, "skip_special_tokens": False}
        choice = post_json(f"{self.base_url}/completions", payload, self.timeout)["choices"][0]
        if "token_ids" not in choice or choice["token_ids"] is None:
            raise RuntimeError(f"{self.base_url} returned no completion token ids: the openai backend needs a server "
                               "that honours return_token_ids (vLLM's OpenAI server does)")
        return with_eos(choice["token_ids"], choice.get("finish_reason"), choice.get("stop_reason"),
                        self.tokenizer.eos_token_id)

    def generate(self, prompts, *, temperature=1.0, top_k=20, max_new_tokens=256, seeds=None):
        caps, seeds = per_row(max_new_tokens, seeds, len(prompts))
        jobs = [self.pool.submit(self.complete, p, s, temperature, top_k, cap) for p, s, cap in zip(prompts, seeds, caps)]
        return [j.result() for j in jobs]

    def sync_adapter(self, path):
        """Load the adapter through the runtime LoRA endpoint, serve it, check the canary, drop the old one."""
        self.lora_count += 1
        name, old = f"rsft-{self.lora_count}", self.adapter_name
        post_json(f"{self.base_url}/load_lora_adapter", {"lora_name": name, "lora_path": os.path.realpath(path)},
                  self.timeout)
        self.adapter_name = name
        check_canary(self, self.model, self.tokenizer, path, f"openai server {self.base_url}")
        if old:
            post_json(f"{self.base_url}/unload_lora_adapter", {"lora_name": old}, self.timeout)
