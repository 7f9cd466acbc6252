"""hf: batched sampling with transformers in the trainer's own process, so the sampled weights are always the
trainer's (no canary needed).

Rows are left-padded into one batch with a KV cache, and each row draws from its own seeded generator, so a
row's sample does not depend on which other rows share the batch. Rows with the same prompt ids share one prefill
(the G samples of a prompt pay for its prompt once) and, on CPU, one copy of its KV while decoding (Cascade); the
leading tokens all prompts share (a harness's system turn and examples) are prefilled once for all of them.

The second half of the file: faster hf decoding on CPU, each with the same logits as transformers' own path
(the tests check them): a KV cache that grows in place, grouped-query attention without copying K and V to every
head, shared-prefix (cascade) attention for the G samples of one prompt, and the output head as W @ h.T.
"""
from functools import lru_cache

import torch

from lib.backends.models import shared_prefix


class HFBackend:
    """Batched sampling with transformers: left padding, KV cache, temperature, top-k, per-row seeds, stop
    strings; share_prefix=False prefills every row on its own (the bench's baseline)."""

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
        token after which its decoded completion holds one of them (that token is the last returned)."""
        if not prompts:
            return []
        model, n = self.model, len(prompts)
        caps = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * n
        seeds = seeds if seeds is not None else list(range(n))
        stops = [[s for s in row or () if s] for row in (stop if stop is not None else [None] * n)]
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        out = [[] for _ in range(n)]
        live = [i for i in range(n) if caps[i] > 0]  # rows still sampling, in cache order
        if not live:
            return out
        was_training, attn = model.training, model.config._attn_implementation
        model.eval()
        if attn == "sdpa":  # sampling only: the trainer keeps transformers' own sdpa
            model.config._attn_implementation = register_sdpa_grouped()
        try:
            with torch.inference_mode():
                self.decode(prompts, live, caps, gens, stops, out, temperature, top_k)
        finally:
            model.train(was_training)
            model.config._attn_implementation = attn
        return out

    def prefill(self, prompts, live, room):
        """One prefill per distinct prompt, expanded to one cache row per live row. -> (logits, mask, positions,
        cache, cascade or None), one row per live row."""
        model, device = self.model, next(self.model.parameters()).device
        slot, unique, rows = {}, [], []  # prompt -> its row in the prefill batch; that row for each live row
        for i in live:
            key = tuple(prompts[i]) if self.share_prefix else i
            if key not in slot:
                slot[key] = len(unique)
                unique.append(prompts[i])
            rows.append(slot[key])
        shared = shared_prefix(unique, model.config) if self.share_prefix else 0
        ids, mask, pos = self.left_pad([p[shared:] for p in unique], device)
        # with an opening, the buffers are made at its prefill: they need room for the rows' own parts too
        cache = roomy_cache(model.config, room + ids.shape[1] * (shared > 0))
        if shared:  # the leading tokens every prompt has, once, their KV then copied to every prompt's row
            ones = torch.ones((1, shared), dtype=torch.long, device=device)
            self.next_logits(ones.new_tensor([unique[0][:shared]]), ones, ones.cumsum(-1) - 1, cache)
            cache.reorder_cache(torch.zeros(len(unique), dtype=torch.long, device=device))
            # each row: the shared part, its left padding (masked), its own part at the next positions
            mask, pos = torch.cat([ones.expand(len(unique), -1), mask], dim=1), pos + shared
        logits = self.next_logits(ids, mask, pos, cache)
        cascade = None
        if len(unique) < len(live):
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
        return logits, mask, pos, cache, cascade

    def decode(self, prompts, live, caps, gens, stops, out, temperature, top_k):
        """Sample token after token into out[i] until every live row hit its cap, EOS or a stop string; finished
        rows leave the batch and the cache."""
        device = next(self.model.parameters()).device
        logits, mask, pos, cache, cascade = self.prefill(prompts, live, max(caps[i] for i in live))
        while True:
            nxt = [self.sample(logits[j], gens[i], temperature, top_k) for j, i in enumerate(live)]
            stay = []
            for j, (i, t) in enumerate(zip(live, nxt)):
                out[i].append(t)
                if (len(out[i]) < caps[i] and (self.ignore_eos or t not in self.eos)
                        and not self.hit_stop(out[i], stops[i])):
                    stay.append(j)
            if not stay:
                return
            if len(stay) < len(live):
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
# faster decoding on CPU, the same logits

def roomy_cache(config, room):
    """A DynamicCache whose full-attention layers keep buffers with `room` free tokens after the prefill, so a
    decode step writes its keys and values in place: DynamicLayer's torch.cat copies every layer's whole cache
    at every step. Attention reads views of
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
    of the cache per layer and decode step; torch's CPU kernel takes the mask with enable_gqa and reads the same
    numbers (the tests check the logits bit for bit)."""
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
    than a dot product per row and head. The rows' own tokens live in a separate roomy cache; cascade_attention
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


# model types whose forward returns the head's output as the logits, unscaled (Granite, Cohere, Gemma and others
# scale or cap them after the head: they keep the model's own forward)
PLAIN_HEAD_MODELS = ("llama", "mistral", "qwen2", "qwen3")


def cpu_head(model):
    """(causal LM, its output head) when the head is a plain Linear on CPU, else (model, None). Decoding a few rows,
    torch's CPU matmul is about twice as fast as W @ h.T than as nn.Linear's h @ W.T, so next_logits runs
    the decoder and the head apart."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: LoRA sits inside the decoder
    head = lm.get_output_embeddings()
    plain = (type(head) is torch.nn.Linear and head.bias is None and head.weight.device.type == "cpu"
             and lm.config.model_type in PLAIN_HEAD_MODELS)
    return lm, head if plain else None


class NullModelBackend:
    """--model null, and the search's check of a candidate without the model: every call's reply is empty (the
    EOS token alone, decoded to ''), at no model time, so a harness scored under it earns only what its own code
    solves. model: the trainer's (--model null trains the smoke model: RSFT accepts nothing, every reward being
    the harness's alone); the replies never read it."""

    def __init__(self, tokenizer, model=None):
        self.tokenizer, self.model = tokenizer, model

    def sync_adapter(self, path):
        pass

    def generate(self, prompts, *, max_new_tokens=256, **_):
        caps = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
        return [[self.tokenizer.eos_token_id] if cap > 0 else [] for cap in caps]
