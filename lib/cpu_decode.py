"""Faster hf decoding on CPU, each with the same logits as transformers' own path (the tests check them): a KV
cache that grows in place, grouped-query attention without copying K and V to every head, shared-prefix (cascade)
attention for the G samples of one prompt, and the output head as W @ h.T. The README gives what each saves."""
from functools import lru_cache

import torch


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
