"""Tests for lib/backends/hf_backend.py's HFBackend: shared prefill gives the unshared samples, stop strings end a row.

    python -m pytest -q tests/test_hf_backend.py
"""
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lib.backends import hf_backend, models  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_rollout  # noqa: E402


class RecordingBackend(hf_backend.HFBackend):
    """Keeps the logits of every sampling step: the random smoke model's near-uniform distributions let a
    slightly wrong cache still draw the same tokens, so the shared path must match on logits too."""

    def sample(self, logits, gen, temperature, top_k):
        self.seen.append(logits.clone())
        return super().sample(logits, gen, temperature, top_k)


@pytest.fixture(scope="module")
def backend():
    model, tok = models.load_model("smoke")
    backend = RecordingBackend(model, tok)
    backend.seen = []
    return backend


def prompt(backend, text):
    return models.chat_ids(backend.tokenizer, [{"role": "user", "content": text}])


def generate(backend, share, prompts, **kw):
    """(completions, logits of every step in order) with or without the shared prefill."""
    backend.share_prefix, backend.seen = share, []
    try:
        return backend.generate(prompts, **kw), torch.stack(backend.seen)
    finally:
        backend.share_prefix = True


def test_shared_prefill_samples_the_same_tokens(backend):
    p, q, r = (prompt(backend, t) for t in ("hello", "a longer prompt than the other one", "Who wrote the novel?"))
    # three groups of different lengths, interleaved; different caps (one 0) within a group; one prompt alone
    prompts = [p, q, p, r, q, p, q, p]
    caps = [16, 12, 3, 16, 0, 16, 16, 9]
    seeds = [1, 2, 3, 4, 5, 6, 7, 8]
    shared, shared_logits = generate(backend, True, prompts, max_new_tokens=caps, seeds=seeds)
    alone, alone_logits = generate(backend, False, prompts, max_new_tokens=caps, seeds=seeds)
    assert shared == alone
    assert torch.allclose(shared_logits, alone_logits, atol=1e-4)
    assert all(len(o) <= c for o, c in zip(shared, caps)) and shared[4] == []
    assert len({tuple(shared[i]) for i in (0, 2, 5)}) > 1  # same prompt, own seeds: different samples
    # G samples of one prompt, EOS ignored so every row runs to its cap and rows drop out at different steps
    backend.ignore_eos = True
    try:
        (g, g_logits), (h, h_logits) = (generate(backend, share, [q] * 6, max_new_tokens=[8, 2, 8, 5, 8, 1],
                                                 seeds=list(range(10, 16))) for share in (True, False))
    finally:
        backend.ignore_eos = False
    assert g == h and [len(o) for o in g] == [8, 2, 8, 5, 8, 1]
    assert torch.allclose(g_logits, h_logits, atol=1e-4)


def test_stop_string_ends_the_row_at_its_first_occurrence(backend):
    tok = backend.tokenizer
    p = prompt(backend, "Search for the entity")
    free = backend.generate([p], max_new_tokens=24, seeds=[3])[0]
    assert len(free) >= 12, "pick a seed whose sample runs long enough to stop in the middle"
    stop = tok.decode(free[6:8], skip_special_tokens=True)  # text that first appears by token 8
    assert stop.strip()
    stopped = backend.generate([p, p], max_new_tokens=24, seeds=[3, 3], stop=[[stop, "never-sampled-text"], None])
    ids = stopped[0]
    assert free[:len(ids)] == ids and len(ids) < len(free)  # a prefix of the unstopped sample, same seed
    assert stop in tok.decode(ids, skip_special_tokens=True)
    assert stop not in tok.decode(ids[:-1], skip_special_tokens=True)  # ended at the first token that holds it
    assert stopped[1] == free  # a row without stop strings is untouched
    assert backend.generate([p], max_new_tokens=24, seeds=[3], stop=[[""]])[0] == free  # "" is no stop


def test_stop_strings_with_shared_prefill(backend):
    """Rows of one prompt, each with its own stop list: stopping a row drops it from the expanded cache."""
    tok = backend.tokenizer
    p = prompt(backend, "Solve the problem step by step")
    free = backend.generate([p] * 4, max_new_tokens=20, seeds=[0, 1, 2, 3])
    stops = [[tok.decode(o[4:6], skip_special_tokens=True)] if len(o) > 8 else None for o in free]
    assert any(stops)
    out = backend.generate([p] * 4, max_new_tokens=20, seeds=[0, 1, 2, 3], stop=stops)
    for o, f, s in zip(out, free, stops):
        assert f[:len(o)] == o
        if s:
            assert len(o) <= 6 and s[0] in tok.decode(o, skip_special_tokens=True)
        else:
            assert o == f


def test_prefix_bench_prints_the_speedup(backend, capsys):
    speedup = bench_rollout.prefix_bench(backend, samples=3, prompt_tokens=40, max_new_tokens=2, rounds=1)
    out = capsys.readouterr().out
    length = int(re.search(r"3 samples x 2 tokens of one (\d+)-token prompt", out).group(1))
    assert 40 <= length <= 45  # grown a word at a time to about the asked length
    assert f"prefix speedup = {speedup:.2f}" in out and speedup > 0
    assert backend.share_prefix and not backend.ignore_eos  # the bench leaves the backend as it found it
    speedup = bench_rollout.opening_bench(backend, prompts=3, max_new_tokens=2, rounds=1)
    out = capsys.readouterr().out
    shared = int(re.search(r"3 prompts of \d+-\d+ tokens, (\d+) of them shared", out).group(1))
    assert shared >= models.MIN_SHARED_PREFIX and f"opening speedup = {speedup:.2f}" in out
    assert backend.share_prefix and not backend.ignore_eos


def test_roomy_cache_gives_dynamic_cache_logits(backend):
    """Keys and values written in place into preallocated room (and regrown when a step outruns it) give the
    logits of transformers' DynamicCache, bit for bit, with left padding and a row reorder on the way."""
    from transformers import DynamicCache
    model = backend.model.eval()
    ids, mask, pos = backend.left_pad([prompt(backend, "hello"), prompt(backend, "a longer prompt than the other one")],
                                      "cpu")
    runs = []
    for cache in (DynamicCache(config=model.config), hf_backend.roomy_cache(model.config, room=2)):
        x, m, p, steps = ids, mask, pos, []
        with torch.inference_mode():
            for step in range(6):  # the prefill, 5 one-token steps: the third outruns room=2
                steps.append(backend.next_logits(x, m, p, cache))
                if step == 1:  # rows swap places and one is duplicated, as the shared prefill expands
                    sel = torch.tensor([1, 0, 1])
                    cache.reorder_cache(sel)
                    m, p, steps[-1] = m[sel], p[sel], steps[-1][sel]
                x = steps[-1].argmax(-1, keepdim=True)
                m, p = torch.cat([m, torch.ones_like(m[:, :1])], dim=1), p[:, -1:] + 1
        runs.append(steps)
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_grouped_attention_under_a_padding_mask_gives_the_sdpa_logits(backend, monkeypatch):
    """Prompts of different lengths (left padding, a mask) sample through sdpa_grouped: the logits of transformers'
    sdpa bit for bit; each row's tokens are those it samples alone, unpadded; the trainer's sdpa is restored."""
    p, q = prompt(backend, "hello"), prompt(backend, "a longer prompt than the other one")
    kw = dict(max_new_tokens=[12, 12, 5], seeds=[1, 2, 3])
    grouped, grouped_logits = generate(backend, False, [p, q, q], **kw)  # unshared: no cascade, bit for bit
    assert backend.model.config._attn_implementation == "sdpa"
    monkeypatch.setattr(hf_backend, "register_sdpa_grouped", lambda: "sdpa")  # transformers' own sdpa
    plain, plain_logits = generate(backend, False, [p, q, q], **kw)
    assert grouped == plain and torch.equal(grouped_logits, plain_logits)
    assert [backend.generate([x], max_new_tokens=12, seeds=[s])[0] for x, s in ((p, 1), (q, 2))] == grouped[:2]
    # shared under transformers' sdpa: no cascade (as on GPU), the prefill's cache copied to each row instead
    monkeypatch.setattr(hf_backend, "cascade_attention", lambda *a: pytest.fail("no cascade outside sdpa_grouped"))
    copied, copied_logits = generate(backend, True, [p, q, q], **kw)
    assert copied == plain and torch.allclose(copied_logits, plain_logits, atol=1e-4)


def test_the_prompts_shared_opening_is_prefilled_once_with_the_same_samples(backend, monkeypatch):
    """Prompts that open alike (a harness's system turn) prefill that opening once: the same tokens and,
    within 1e-4, the same logits as a prefill per row, with duplicated prompts (cascade) and without, rows
    dropping out at different steps, and under transformers' own sdpa (no cascade: the cache copied)."""
    system = "You answer questions. Think step by step, then give the answer in <answer></answer> tags."
    prompts = [models.chat_ids(backend.tokenizer, [{"role": "system", "content": system},
                                                   {"role": "user", "content": q}])
               for q in ("hello", "a longer question than the other one", "Who wrote it?")]
    real, seen = hf_backend.shared_prefix, []
    monkeypatch.setattr(hf_backend, "shared_prefix", lambda *a: seen.append(real(*a)) or seen[-1])
    backend.ignore_eos = True
    try:
        for attention in ("sdpa_grouped", "sdpa"):
            monkeypatch.setattr(hf_backend, "register_sdpa_grouped", lambda: attention)
            for rows, caps in (([0, 1, 2], [8, 3, 6]), ([0, 1, 1, 2, 0, 1], [8, 2, 8, 5, 8, 1])):
                batch, seeds = [prompts[i] for i in rows], list(range(1, len(rows) + 1))
                shared, shared_logits = generate(backend, True, batch, max_new_tokens=caps, seeds=seeds)
                alone, alone_logits = generate(backend, False, batch, max_new_tokens=caps, seeds=seeds)
                assert shared == alone and [len(o) for o in shared] == caps
                assert (shared_logits - alone_logits).abs().max() <= 1e-4
    finally:
        backend.ignore_eos = False
    assert len(seen) == 4 and len(set(seen)) == 1 and seen[0] >= models.MIN_SHARED_PREFIX


def test_shared_prefix_counts_only_what_pays_and_what_the_model_can_share():
    from transformers import LlamaConfig, MistralConfig, Qwen3_5Config
    full = LlamaConfig()
    head = list(range(40))
    assert models.shared_prefix([head + [1, 2], head + [3]], full) == 40
    assert models.shared_prefix([head + [1], head], full) == 39  # each keeps a token of its own
    assert models.shared_prefix([head + [1]], full) == 0  # one prompt: nothing to share
    assert models.shared_prefix([head[:10] + [1], head[:10] + [2]], full) == 0  # too short to pay
    # a sliding window (Mistral's, inferred from the config) counts cache slots, padding included; a
    # recurrent layer (Qwen3.5's decoder, inside a vision-language config) carries a state
    for config in (MistralConfig(), Qwen3_5Config()):
        assert models.shared_prefix([head + [1], head + [2]], config) == 0


def test_cascade_decode_gives_the_unshared_logits(backend, monkeypatch):
    """Two prompts of different lengths (left padding), 2 and 3 rows each, rows dropping out at different steps:
    cascade attention (each prompt's prefix once, merged with each row's own tokens) gives the logits of a
    prefill per row within 1e-4, at every decode step."""
    rows, real = [], hf_backend.cascade_attention
    monkeypatch.setattr(hf_backend, "cascade_attention", lambda *a: rows.append(len(a[-1].rows)) or real(*a))
    p, q = prompt(backend, "hello"), prompt(backend, "a longer prompt than the other one")
    caps = [6, 2, 6, 4, 6]
    backend.ignore_eos = True
    try:
        (shared, shared_logits), (alone, alone_logits) = (
            generate(backend, share, [p, q, q, p, q], max_new_tokens=caps, seeds=[1, 2, 3, 4, 5])
            for share in (True, False))
    finally:
        backend.ignore_eos = False
    assert shared == alone and [len(o) for o in shared] == caps
    assert (shared_logits - alone_logits).abs().max() <= 1e-4
    assert sorted(set(rows)) == [3, 4, 5]  # the shared run decoded through the cascade, before and after drops


def test_next_logits_runs_the_head_apart_and_gives_the_models_logits(backend):
    """cpu_head's W @ h.T (faster for a few rows on CPU) gives the model's own last-position logits, with a LoRA
    adapter too (peft's LoRA lives inside the decoder, so running the decoder keeps it)."""
    from peft import LoraConfig, get_peft_model
    model = backend.model.eval()
    ids, mask, pos = backend.left_pad([prompt(backend, "hello"), prompt(backend, "a longer prompt than the other")],
                                      "cpu")
    adapted = get_peft_model(models.load_model("smoke")[0], LoraConfig(r=4, target_modules="all-linear",
                                                                         init_lora_weights=False)).eval()
    for m in (model, adapted):
        assert hf_backend.cpu_head(m)[1] is not None
        with torch.inference_mode():
            own = m(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1).logits[:, -1]
            ours = hf_backend.HFBackend(m, backend.tokenizer).next_logits(ids, mask, pos,
                                                                       hf_backend.roomy_cache(m.config, room=1))
        assert torch.allclose(ours, own, atol=1e-5) and torch.equal(ours.argmax(-1), own.argmax(-1))
    with torch.inference_mode():  # the adapter is really applied: its logits differ from the base model's
        base = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1).logits[:, -1]
    assert not torch.allclose(own, base, atol=1e-3)
