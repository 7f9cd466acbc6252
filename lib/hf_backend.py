"""hf: batched sampling with transformers in the trainer's own process, so the sampled weights are always the
trainer's (no canary needed).

Rows are left-padded into one batch with a KV cache, and each row draws from its own seeded generator, so a
row's sample does not depend on which other rows share the batch. Rows with the same prompt ids share one prefill
(the G samples of a prompt pay for its prompt once) and, on CPU, one copy of its KV while decoding (Cascade).
"""
import torch

from lib.cpu_decode import Cascade, cpu_head, register_sdpa_grouped, roomy_cache


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
        cache = roomy_cache(model.config, room)
        ids, mask, pos = self.left_pad(unique, device)
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

