"""The GPU path's CPU-testable parts: the adapter canary (vllm and openai backends with engine stand-ins),
the paper data loaders' row parsing, the Search-R1 retrieval client and the bm25 wiki fallback."""
import argparse
import copy
import http.server
import json
import sys
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import Qwen3Config, Qwen3ForCausalLM

import domains
from lib.backends import canary, engines, policy
from lib.paper import paper_data, retriever
from lib.common.errors import InfrastructureError
from lib.backends.canary import EngineError

# -----------------------------------------------------------------------------
# a tiny model, a byte tokenizer and trained-looking adapters


class ByteTok:
    eos_token_id = 1

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [2 + b % 60 for b in text.encode()]}

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


@pytest.fixture(scope="module")
def base():
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=128)
    return Qwen3ForCausalLM(cfg).eval()


def make_adapter(base, folder, seed, std):
    """(a peft model with a random adapter whose B is drawn with `std`, the folder it was saved to)."""
    torch.manual_seed(seed)
    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=std) if std else torch.nn.init.zeros_(p)
    model.save_pretrained(str(folder))
    return model.eval(), str(folder)


@pytest.fixture(autouse=True)
def short_canary(monkeypatch):
    """Three questions, six tokens each: enough to tell the cases apart here, and quick on a busy machine."""
    monkeypatch.setattr(canary, "CANARY_QUESTIONS", canary.CANARY_QUESTIONS[:3])
    monkeypatch.setattr(canary, "CANARY_TOKENS", 6)


@pytest.fixture(scope="module")
def adapter(base, tmp_path_factory):
    """(the trainer's peft model, the folder its adapter was saved to); the adapter changes greedy output."""
    return make_adapter(base, tmp_path_factory.mktemp("adapter") / "step_1", seed=1, std=2.0)


@torch.no_grad()
def decode(model, prompt, n, force=None):
    """(ids, log-prob of each) for n greedy tokens, or for the one token `force`: what the stand-in engines return."""
    ids, lps = list(prompt), []
    for _ in range(n):
        logp = model(input_ids=torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)
        ids.append(force if force is not None else int(logp.argmax()))
        lps.append(float(logp[ids[-1]]))
    return ids[len(prompt):], lps


def engine_model(base, path, applies):
    """What a stand-in engine samples from after loading `path`: the adapted model, or the base if it ignores it."""
    return PeftModel.from_pretrained(copy.deepcopy(base), path).eval() if applies else base


class StandIn:
    """An engine for check_canary: scores with `served` when asked for the adapter, else with `own_base`."""

    def __init__(self, served, own_base):
        self.served, self.own_base, self.forced = served, own_base, 0

    def score(self, rows, adapter=True):
        model = self.served if adapter else self.own_base

        def forced(pairs):
            self.forced += len(pairs)
            return [decode(model, p, 1, t)[1][0] for p, t in pairs]
        return canary.engine_scores(rows, lambda rows: [decode(model, p, len(c)) for p, c in rows], forced)


def test_engine_scores_decode_first_and_force_after_a_divergence(base, adapter):
    trained, _ = adapter
    rows = [([5, 6, 7], decode(trained, [5, 6, 7], 6)[0]), ([8, 9], decode(trained, [8, 9], 5)[0])]
    want = [lp for p, c in rows for lp in [decode(trained, p + c[:i], 1, t)[1][0] for i, t in enumerate(c)]]
    same = StandIn(trained, base)
    assert same.score(rows) == pytest.approx(want, abs=1e-5) and same.forced == 0  # its own greedy: no forcing
    other = StandIn(base, base)  # another model: its greedy differs, so the rest of each row is forced
    got = other.score(rows)
    assert other.forced > 0 and len(got) == 11
    assert got == pytest.approx([lp for p, c in rows for lp in [decode(base, p + c[:i], 1, t)[1][0]
                                                                for i, t in enumerate(c)]], abs=1e-5)

# -----------------------------------------------------------------------------
# the canary: what it passes and what it stops


def test_canary_tells_served_from_base_and_stale(base, adapter, tmp_path, capsys):
    trained, _ = adapter
    s = canary.check_canary(StandIn(trained, base), trained, ByteTok(), "step_1", "stand-in")
    assert s["effect"] > 2 * s["tol"] and s["to_trainer"] < 1e-5 and s["noise"] < 1e-6
    assert "adapter canary ok (direct)" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match=r"canary FAILED \(direct\): stand-in, adapter step_1.*stale weights"):
        canary.check_canary(StandIn(base, base), trained, ByteTok(), "step_1", "stand-in")  # adapter not applied
    other, _ = make_adapter(base, tmp_path / "other", seed=2, std=2.0)
    with pytest.raises(RuntimeError, match=r"canary FAILED \(direct\)"):
        canary.check_canary(StandIn(other, base), trained, ByteTok(), "step_1", "stand-in")  # another adapter


def test_canary_small_adapter_uses_the_differential(base, tmp_path, capsys):
    """An update whose effect is below the noise tolerance: the engine's own adapter effect must be the trainer's."""
    tiny, _ = make_adapter(base, tmp_path / "tiny", seed=3, std=1e-4)
    s = canary.check_canary(StandIn(tiny, base), tiny, ByteTok(), "tiny", "stand-in")
    assert 0 < s["effect"] < 2 * s["tol"] and abs(s["scale"] - 1) < 1e-3
    assert "(effect below noise: differential)" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="FAILED \\(effect below noise: differential\\)"):
        canary.check_canary(StandIn(base, base), tiny, ByteTok(), "tiny", "stand-in")
    half, _ = make_adapter(base, tmp_path / "half", seed=3, std=1e-4)
    for name, p in half.named_parameters():
        if "lora_B" in name:
            p.data *= 0.5  # the previous RSFT step's adapter: same direction, half the size
    with pytest.raises(RuntimeError, match="differential"):
        canary.check_canary(StandIn(half, base), tiny, ByteTok(), "tiny", "stand-in")


def test_canary_zero_adapter_and_bf16_noise(base, adapter, tmp_path, capsys):
    zero, _ = make_adapter(base, tmp_path / "zero", seed=4, std=0)
    s = canary.check_canary(StandIn(base, base), zero, ByteTok(), "zero", "stand-in")
    assert s["effect"] == 0 and s["scale"] is None and "(no adapter effect)" in capsys.readouterr().out
    # an engine in bf16 against an fp32 trainer: the measured noise sets the tolerance, and a real adapter still passes
    trained, path = adapter
    half_base = copy.deepcopy(base).to(torch.bfloat16)
    served = PeftModel.from_pretrained(copy.deepcopy(half_base), path).eval()
    s = canary.check_canary(StandIn(served, half_base), trained, ByteTok(), "step_1", "bf16 stand-in")
    assert s["noise"] > 0 and s["tol"] >= 3 * s["noise"] and s["to_trainer"] <= s["tol"]
    with pytest.raises(RuntimeError, match="FAILED"):
        canary.check_canary(StandIn(half_base, half_base), trained, ByteTok(), "step_1", "bf16 stand-in")


def test_canary_below_the_noise_goes_on_and_stale_weights_still_stop(base, tmp_path, capsys):
    """A bf16 engine against an fp32 trainer, adapters from an early update to a trained one. The engine serving
    the adapter passes at every size; serving the base weights passes only while the adapter's effect is within
    what the dtype noise explains (one line saying so), and stops the run once the effect is above it."""
    half_base = copy.deepcopy(base).to(torch.bfloat16)
    stale = []
    for i, std in enumerate((1e-5, 1e-3, 3e-3, 3e-2)):
        trainer, path = make_adapter(base, tmp_path / f"a{i}", seed=3, std=std)
        served = PeftModel.from_pretrained(copy.deepcopy(half_base), path).eval()
        s = canary.check_canary(StandIn(served, half_base), trainer, ByteTok(), f"a{i}", "bf16 stand-in")
        try:
            canary.check_canary(StandIn(half_base, half_base), trainer, ByteTok(), f"a{i}", "bf16 stand-in")
            stale.append("passed")
            assert s["effect"] <= 2 * s["tol"]  # base weights pass only where they cannot make a difference
        except EngineError as e:
            stale.append("stopped")
            assert "stale weights" in str(e) and "\n" not in str(e)
    assert stale == ["passed", "passed", "stopped", "stopped"]
    out = capsys.readouterr().out
    assert out.count(f"adapter canary ok ({canary.BELOW_NOISE}): bf16 stand-in, adapter a0") == 2
    assert "adapter canary ok (direct): bf16 stand-in, adapter a3" in out
    # below the noise, an engine serving another (trained-size) adapter still stops the run
    tiny, _ = make_adapter(base, tmp_path / "tiny", seed=3, std=1e-5)
    other, other_path = make_adapter(base, tmp_path / "other", seed=2, std=2.0)
    served_other = PeftModel.from_pretrained(copy.deepcopy(half_base), other_path).eval()
    with pytest.raises(EngineError, match=r"canary FAILED \(direct\).*stale weights"):
        canary.check_canary(StandIn(served_other, half_base), tiny, ByteTok(), "tiny", "bf16 stand-in")

# -----------------------------------------------------------------------------
# vllm backend with a stand-in `vllm` module


def fake_vllm(base, applies, sleep_ok=True, refuse=None):
    class LLM:
        def __init__(self, model, **kw):
            if refuse:
                raise ValueError(refuse)
            self.kw, self.sleeps, self.wakes, self.params = kw, 0, 0, []

        def generate(self, prompts, params, lora_request=None, use_tqdm=True):
            model = engine_model(base, lora_request.lora_path, applies) if lora_request else base
            params = params if isinstance(params, list) else [params] * len(prompts)
            self.params += params
            outs = []
            for p, sp in zip(prompts, params):
                forced = getattr(sp, "allowed_token_ids", None)  # the canary: greedy or one forced token, log-probs
                ids, lps = decode(model, p["prompt_token_ids"], sp.max_tokens, forced[0] if forced else None)
                lps = [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, lps)] if getattr(sp, "logprobs", None) == 0 \
                    else None
                outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, logprobs=lps, finish_reason="length",
                                                                     stop_reason=None)]))
            return outs

        def sleep(self, level=1):
            self.sleeps += 1

        def wake_up(self):
            self.wakes += 1

    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = LLM, lambda **kw: SimpleNamespace(**kw)
    lora, request = types.ModuleType("vllm.lora"), types.ModuleType("vllm.lora.request")
    request.LoRARequest = lambda name, int_id, path: SimpleNamespace(lora_name=name, lora_int_id=int_id, lora_path=path)
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = SimpleNamespace(device_type="cpu", is_sleep_mode_available=lambda: sleep_ok)
    return {"vllm": vllm, "vllm.lora": lora, "vllm.lora.request": request, "vllm.platforms": platforms}


@pytest.mark.parametrize("applies", [True, False])
def test_vllm_backend_canary(monkeypatch, base, adapter, applies):
    for name, module in fake_vllm(base, applies).items():
        monkeypatch.setitem(sys.modules, name, module)
    trained, path = adapter
    trained.train()  # as the trainer leaves it: the canary scores in eval mode, then restores train mode
    backend = engines.VLLMBackend("some/model", ByteTok(), trained, gpu_memory=0.3, sleep=True)
    kw = backend.llm.kw
    assert kw["enable_lora"] and kw["enable_sleep_mode"] and kw["gpu_memory_utilization"] == 0.3
    assert kw["dtype"] == "float32"  # the trainer's dtype, never a hard-coded bf16
    if applies:
        backend.sync_adapter(path)
        assert backend.lora.lora_path.endswith("step_1")
    else:
        with pytest.raises(RuntimeError, match=r"adapter canary FAILED \(direct\): vllm .*step_1"):
            backend.sync_adapter(path)
    assert trained.training
    backend.sleep()
    backend.sleep()  # idempotent
    assert backend.llm.sleeps == 1 and backend.sleeping
    out = backend.generate([ByteTok()("hi")["input_ids"]] * 2, temperature=1.0, top_k=20, max_new_tokens=3, seeds=[5, 6],
                           stop=[["</answer>"], None])
    assert backend.llm.wakes == 1 and not backend.sleeping and [len(o) for o in out] == [3, 3]
    sent = backend.llm.params[-2:]
    assert [p.stop for p in sent] == [["</answer>"], None] and all(p.include_stop_str_in_output for p in sent)
    assert all(p.top_p == 1.0 for p in sent) and "language_model_only" not in kw  # a text model: no flag
    trained.eval()


def test_vllm_engine_loads_the_language_model_only_and_sizes_lora_by_the_adapter(monkeypatch, base, adapter, tmp_path):
    from transformers import Qwen3_5Config
    for name, module in fake_vllm(base, True).items():
        monkeypatch.setitem(sys.modules, name, module)
    Qwen3_5Config().save_pretrained(tmp_path / "qwen3.5")  # a vision-language checkpoint, as Qwen3.5 ships
    assert engines.VLLMBackend(str(tmp_path / "qwen3.5"), ByteTok(), base).llm.kw["language_model_only"] is True
    args = SimpleNamespace(max_lora_rank=None, lora_rank=16)
    assert policy.max_lora_rank(args) == 16 and policy.max_lora_rank(SimpleNamespace(max_lora_rank=None, lora_rank=20)) == 32
    assert policy.max_lora_rank(args, adapter[1]) == 8  # the adapter loaded (rank 4), as vLLM takes it
    assert policy.max_lora_rank(SimpleNamespace(max_lora_rank=64, lora_rank=16)) == 64


@pytest.mark.parametrize("applies", [True, False])
def test_the_engine_proves_its_lora_path_with_a_probe_adapter_at_start(monkeypatch, base, applies, capsys):
    """Before the first rollout, whatever the learning rate: an engine that returns base outputs under any adapter
    stops the run with one line naming vLLM's LoRA path; one that applies adapters serves the base model after."""
    for name, module in fake_vllm(base, applies).items():
        monkeypatch.setitem(sys.modules, name, module)
    model = copy.deepcopy(base)
    weights, rng = copy.deepcopy(model.state_dict()), torch.get_rng_state()
    probe, _ = canary.make_probe(model, ByteTok(), "all-linear", 8)
    assert canary.effect_on(model, probe, canary.canary_rows(model, ByteTok())) > 0.1  # random weights: their most
    assert probe.unload() is model and torch.equal(torch.get_rng_state(), rng)  # the trainer's RNG untouched
    args = SimpleNamespace(backend="vllm", gpu_memory=0.3, vllm_sleep=False, max_lora_rank=None, lora_rank=16,
                           max_model_len=128, model="tiny", lora_targets="all-linear", skip_lora_probe=False)
    if applies:
        backend = policy.load_backend(args, model, ByteTok())
        assert backend.lora is None and backend.llm.kw["max_lora_rank"] == 16
        assert backend.llm.kw["max_num_seqs"] == 64  # no --workers: the runner's 64 at once
        assert "adapter probe ok (applied)" in capsys.readouterr().out
    else:
        with pytest.raises(EngineError, match=r"^adapter probe FAILED \(not applied\): vllm .* vLLM's LoRA path .* "
                                              r"The likely cause is the key mapping: .* \(this engine got the adapter's "
                                              r"keys as the trainer names them .*\); stopping before the first "
                                              r"rollout\. .* skipping this check would serve the base model all "
                                              r"night\.$") as e:
            policy.load_backend(args, model, ByteTok())
        assert "\n" not in str(e.value) and "--skip-lora-probe" not in str(e.value)  # no skipping offered as the fix
    # the trainer's model is as it was: the probe is gone
    assert model.state_dict().keys() == weights.keys() and all(torch.equal(model.state_dict()[k], v)
                                                               for k, v in weights.items())


class NoisyEngine:
    """probe_engine's engine: it serves the adapter it is given (or ignores it), its log-probs carrying noise of
    bf16's size (sigma nats/token) on the adapted outputs only, so the noise measured on the base model cannot
    warn of it."""
    LORA_PATH = "the stand-in's LoRA path"

    def __init__(self, model, applies, sigma):
        self.model, self.base, self.applies, self.sigma = model, copy.deepcopy(model), applies, sigma
        self.served, self.loads, self.gen = None, 0, torch.Generator().manual_seed(0)

    def sync_adapter(self, path, probe=None):
        self.loads += 1
        self.served = PeftModel.from_pretrained(copy.deepcopy(self.base), path).eval() if self.applies else self.base
        return canary.check_canary(self, self.model, ByteTok(), path, "noisy stand-in", probe)

    def serve_base(self):
        self.served = None

    def score(self, rows, adapter=True):
        exact = torch.tensor(StandIn(self.served if adapter and self.served else self.base, self.base).score(rows))
        return (exact + self.sigma * torch.randn(len(exact), generator=self.gen) if adapter else exact).tolist()


def test_the_probe_passes_a_correct_engine_under_bf16_noise_and_stops_one_that_ignores_the_adapter(base, capsys):
    """bf16-sized noise (0.05 nats/token) on the adapted tokens only, none on the base model's, so the noise measured
    there cannot warn: a correct engine passes, one that ignores the adapter under the same noise stops the run,
    naming the case and the key mapping as its likely cause."""
    correct = NoisyEngine(copy.deepcopy(base), applies=True, sigma=0.05)
    s = canary.probe_engine(correct, ByteTok())
    assert s["verdict"] == "applied" and s["residual"] <= canary.PROBE_RESIDUAL and correct.served is None
    assert s["noise"] < 1e-6 and s["to_trainer"] > s["tol"]  # the old direct verdict would have stopped it
    assert "adapter probe ok (applied): noisy stand-in" in capsys.readouterr().out
    ignoring = NoisyEngine(copy.deepcopy(base), applies=False, sigma=0.05)
    with pytest.raises(EngineError, match=r"^adapter probe FAILED \(not applied\): noisy stand-in, .* the stand-in's "
                                          r"LoRA path does not apply LoRA .* the key mapping") as e:
        canary.probe_engine(ignoring, ByteTok())
    assert "\n" not in str(e.value) and ignoring.loads > 1  # it doubled before deciding
    assert "adapter probe undecided, doubling it" in capsys.readouterr().out
    assert all(torch.equal(a, b) for a, b in zip(ignoring.model.state_dict().values(), base.state_dict().values()))


def test_the_probe_says_when_the_noise_is_too_large_to_decide(base):
    """On this tiny random model the probe's effect stops growing at about 0.3 nats/token: under 0.4 nats/token of
    noise a correct engine cannot be told from a missing adapter, and the run stops saying so; an engine that
    ignores the adapter never passes (here its own effect is below half the trainer's by three standard errors)."""
    with pytest.raises(EngineError, match=r"^adapter probe FAILED \(noise too large to decide\): .* its numerics "
                                          r"cannot be told from a missing adapter; .* --skip-lora-probe starts "
                                          r"without this check: the engine then serves weights nobody checked"):
        canary.probe_engine(NoisyEngine(copy.deepcopy(base), applies=True, sigma=0.4), ByteTok())
    with pytest.raises(EngineError, match=r"^adapter probe FAILED \(not applied\)"):
        canary.probe_engine(NoisyEngine(copy.deepcopy(base), applies=False, sigma=0.4), ByteTok())


def test_vllm_backend_bf16_and_refused_options(monkeypatch, base):
    for name, module in fake_vllm(base, True).items():
        monkeypatch.setitem(sys.modules, name, module)
    assert engines.VLLMBackend("m", ByteTok(), copy.deepcopy(base).to(torch.bfloat16)).llm.kw["dtype"] == "bfloat16"
    for name, module in fake_vllm(base, True, sleep_ok=False).items():
        monkeypatch.setitem(sys.modules, name, module)
    with pytest.raises(ValueError, match=r"^--vllm-sleep: vLLM cannot sleep on this platform \(cpu\); drop --vllm-sleep$"):
        engines.VLLMBackend("m", ByteTok(), base, sleep=True)
    refusal = "Traceback...\nValueError: User-specified max_model_len (8192) is greater than the derived max_model_len (128)."
    for name, module in fake_vllm(base, True, refuse=refusal).items():
        monkeypatch.setitem(sys.modules, name, module)
    with pytest.raises(ValueError, match=r"^vllm refused --max-model-len \(.*--max-model-len 8192.*\): .*User-specified.*; change or drop --max-model-len$") as e:
        engines.VLLMBackend("m", ByteTok(), base)
    assert "\n" not in str(e.value)

# -----------------------------------------------------------------------------
# openai backend against a loopback server speaking vLLM's OpenAI API


def serve(handler_cls):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_cls)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def fake_openai_server(base, applies, log):
    adapters = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, obj, code=200):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            log.append((self.path, req))
            if self.path == "/v1/load_lora_adapter":
                adapters[req["lora_name"]] = engine_model(base, req["lora_path"], applies)
                return self.reply(f"Success: LoRA adapter '{req['lora_name']}' added successfully.")
            if self.path == "/v1/unload_lora_adapter":
                adapters.pop(req["lora_name"])
                return self.reply("ok")
            if self.path == "/v1/completions":
                model = adapters.get(req["model"], base)
                forced = req.get("allowed_token_ids")  # the canary: greedy or one forced token, with log-probs
                ids, lps = decode(model, req["prompt"], req["max_tokens"], forced[0] if forced else None)
                choice = {"index": 0, "text": "", "token_ids": ids, "finish_reason": "length"}
                if req.get("logprobs") is not None:
                    choice["logprobs"] = {"tokens": ["x"] * len(ids), "token_logprobs": lps}
                return self.reply({"choices": [choice]})
            self.reply({"error": "not found"}, 404)
    return Handler


@pytest.mark.parametrize("applies", [True, False])
def test_openai_backend_canary(base, adapter, applies):
    log = []
    server = serve(fake_openai_server(base, applies, log))
    try:
        trained, path = adapter
        url = f"http://127.0.0.1:{server.server_port}/v1"
        backend = engines.OpenAIBackend(url, "base-model", ByteTok(), trained, workers=4)
        out = backend.generate([[5, 6, 7], [8, 9]], temperature=1.0, top_k=20, max_new_tokens=[4, 2], seeds=[0, 1],
                               stop=[["</search>", "</answer>"], None])
        assert [len(o) for o in out] == [4, 2]  # a cap per row, as the hf backend takes
        sent = sorted((r for _, r in log), key=lambda r: r["max_tokens"])
        assert sent[1]["model"] == "base-model" and sent[1]["return_token_ids"] is True
        assert sent[1]["stop"] == ["</search>", "</answer>"] and sent[1]["include_stop_str_in_output"] is True
        assert "stop" not in sent[0] and all(r["top_p"] == 1.0 for r in sent)  # never the server's default
        if applies:
            backend.sync_adapter(path)
            backend.sync_adapter(path)  # the second load replaces (and unloads) the first
            assert [p for p, _ in log].count("/v1/unload_lora_adapter") == 1
            assert log[-1][0] == "/v1/unload_lora_adapter" and backend.adapter_name == f"rsft-{backend.run_id}-2"
            other = engines.OpenAIBackend(url, "base-model", ByteTok(), trained, workers=4)
            other.sync_adapter(path)  # another process on the same server (a resumed run): its own adapter name
            assert other.adapter_name != backend.adapter_name and other.adapter_name.endswith("-1")
        else:
            with pytest.raises(RuntimeError, match=r"adapter canary FAILED \(direct\): openai server http://127.0.0.1:\d+/v1, adapter .*step_1"):
                backend.sync_adapter(path)
    finally:
        server.shutdown()


def test_adapter_evaluation_goes_through_the_engine(base, adapter, tmp_path):
    """rollout.py --adapter with an engine backend: the engine loads the adapter and the canary runs before any
    rollout; a folder without an adapter is a one-line error."""
    import rollout
    log = []
    server = serve(fake_openai_server(base, True, log))
    try:
        _, path = adapter
        args = SimpleNamespace(backend="openai", openai_url=f"http://127.0.0.1:{server.server_port}/v1",
                               openai_model="base-model", openai_workers=4, model="tiny", skip_lora_probe=False)
        backend = policy.load_backend(args, copy.deepcopy(base), ByteTok(), adapter=path)
        probe, name = f"rsft-{backend.run_id}-1", f"rsft-{backend.run_id}-2"
        loads = [(p, r) for p, r in log if "lora_adapter" in p]  # the probe first, served and dropped
        assert loads[0][0] == "/v1/load_lora_adapter" and "lora-probe-" in loads[0][1]["lora_path"]
        assert loads[1:] == [("/v1/unload_lora_adapter", {"lora_name": probe}),
                             ("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})]
        assert backend.adapter_name == name and isinstance(backend.model, PeftModel)
        after = log[log.index(loads[-1]) + 1:]
        assert {r["model"] for _, r in after} == {name, "base-model"}
    finally:
        server.shutdown()
    with pytest.raises(SystemExit, match=r"^--adapter .*: no adapter_config.json there; pass a LoRA folder"):
        rollout.adapted_policy(SimpleNamespace(adapter=str(tmp_path), model="smoke", backend="hf"))


def test_openai_backend_unreachable_server():
    backend = engines.OpenAIBackend("http://127.0.0.1:9/v1", "m", ByteTok(), None, workers=1, timeout=5)
    with pytest.raises(RuntimeError, match="cannot reach .* --openai-url"):
        backend.generate([[1, 2]], max_new_tokens=2)


def test_with_eos_keeps_the_stop_token():
    assert engines.with_eos([5, 6], "stop", None, 1) == [5, 6, 1]
    assert engines.with_eos([5, 6, 1], "stop", None, 1) == [5, 6, 1]
    assert engines.with_eos([5, 6], "stop", 9, 1) == [5, 6, 9]
    assert engines.with_eos([5, 6], "length", None, 1) == [5, 6]
    assert engines.with_eos([5, 6], "stop", "</answer>", 1) == [5, 6]  # a stop string: its tokens are already there

# -----------------------------------------------------------------------------
# the paper's data: row parsing on rows written here

def test_searchqa_rows():
    flashrag = {"id": "test_7", "question": "who wrote the iliad", "golden_answers": ["Homer"]}
    assert paper_data.searchqa_task(flashrag, "nq", 0) == {"id": "nq-test_7", "question": "who wrote the iliad?",
                                                       "answers": ["Homer"], "source": "nq"}
    verl = {"data_source": "hotpotqa", "question": "Which river is longer?", "golden_answers": None,
            "reward_model": {"ground_truth": {"target": ["the Nile", "Nile"]}, "style": "rule"}}
    task = paper_data.searchqa_task(verl, "train", 12)
    assert task["answers"] == ["the Nile", "Nile"] and task["id"] == "hotpotqa-12" and task["source"] == "hotpotqa"
    assert paper_data.searchqa_task({"question": "no answers?", "golden_answers": []}, "nq", 1) is None


def test_searchqa_test_is_seeded_per_set(monkeypatch):
    def rows(name, config=None, split="train", streaming=False):
        assert name == paper_data.SEARCHQA_TEST and split == dict(s.split(":") for s in paper_data.SEARCHQA_TEST_SETS)[config]
        return [{"id": f"{split}_{i}", "question": f"{config} question {i}", "golden_answers": [str(i)]} for i in range(130)]
    monkeypatch.setattr(paper_data, "read_rows", rows)
    tasks = paper_data.load_searchqa("test")
    assert len(tasks) == 700 and len({t["id"] for t in tasks}) == 700
    assert {t["source"] for t in tasks} == {s.split(":")[0] for s in paper_data.SEARCHQA_TEST_SETS}
    assert all(sum(t["source"] == s for t in tasks) == 100 for s in {t["source"] for t in tasks})  # 7 x 100
    assert tasks == paper_data.load_searchqa("test")
    assert len(paper_data.load_searchqa("test", test_sets=("bamboogle:test",), per_set=5)) == 5


def search_r1_train_rows(n_nq, n_hotpot):
    """Rows in the schema of PeterJinGo/nq_hotpotqa_train: NQ first, then HotpotQA, as the merged file is."""
    return [{"id": f"train_{i}", "question": f"question {i}", "golden_answers": [f"answer {i}"],
             "data_source": "nq" if i < n_nq else "hotpotqa", "ability": "fact-reasoning",
             "reward_model": {"ground_truth": {"target": [f"answer {i}"]}, "style": "rule"},
             "extra_info": {"index": i, "split": "train"}} for i in range(n_nq + n_hotpot)]


def test_searchqa_train_is_a_seeded_sample_keeping_the_sources_shares(monkeypatch):
    """D_weight: the docs' 18,946 of the merged set's 169,615, each source keeping its share (here 1/100 of each)."""
    rows = search_r1_train_rows(792, 904)  # NQ 79,168 and HotpotQA 90,447 in the hub set
    monkeypatch.setattr(paper_data, "read_rows", lambda name, config=None, split="train", streaming=False: rows)
    tasks = paper_data.load_searchqa("train", train_size=189)
    assert len(tasks) == 189 and sum(t["source"] == "nq" for t in tasks) == round(189 * 792 / 1696)
    assert tasks == paper_data.load_searchqa("train", train_size=189)  # seeded
    assert [t["id"] for t in tasks] != [f"nq-train_{i}" for i in range(189)]  # never the first N (NQ only)
    ids = [int(t["id"].rsplit("_", 1)[1]) for t in tasks]
    assert ids == sorted(ids)  # in the file's order
    assert len(paper_data.load_searchqa("train", train_size=0)) == 1696  # 0: all of it
    args = paper_args("--wiki", "unused.jsonl", "--searchqa-train-size", "300")
    domain = domains.get("searchqa", args)
    train, harness = domain.load("train"), domain.load("harness")
    assert len(train) == 300 and {t["id"] for t in harness} <= {t["id"] for t in train}
    assert {t["source"] for t in harness} == {"nq"} and len(harness) == sum(t["source"] == "nq" for t in train)  # tests/test_fidelity.py
    assert paper_data.SEARCHQA_TRAIN_SIZE == 18_946


def dapo_row(problem, uid, answer="0"):
    return {"data_source": "math_dapo", "prompt": [{"role": "user", "content": paper_data.DAPO_PREFIX + problem + paper_data.DAPO_SUFFIX}],
            "ability": "MATH", "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": uid}}


def test_math_rows(tmp_path):
    problem = "Find the sum of all integers $n$ such that $n^2 < 10$."
    block = [dapo_row(problem, "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"),
             dapo_row("How many primes are below 20?", "1f3e0c2a-0000-4000-8000-000000000001", "8"),
             dapo_row(problem, "77c1d2e3-0000-4000-8000-000000000002")]  # the same text under another id: kept
    path = tmp_path / "dapo.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in block * 3))  # the release repeats its block
    tasks = paper_data.load_math("train", train_name=str(path))
    assert [t["id"] for t in tasks] == ["dapo-" + r["extra_info"]["index"] for r in block]
    # the question is DAPO's prompt as released, its "Answer: $Answer" instruction kept, as the official training
    # prompt has it (the ReTool recipe adds the \\boxed line; the official prompt hook takes off only that line)
    assert tasks[0] == {"id": "dapo-9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079", "answer": "0", "source": "dapo-math-17k",
                        "question": (paper_data.DAPO_PREFIX + problem + paper_data.DAPO_SUFFIX).strip()}
    no_ids = tmp_path / "plain.jsonl"  # a copy without ids: one task per problem text
    no_ids.write_text("".join(json.dumps({"question": q, "answer": "1"}) + "\n" for q in ["a?", "b?", "a?"]))
    assert [t["question"] for t in paper_data.load_math("train", train_name=str(no_ids))] == ["a?", "b?"]
    # AIME in the schemas of Maxwell-Jia/AIME_2024 and yentinglin/aime_2025, the paper's test sets (the defaults)
    maxwell = {"ID": "2024-II-4", "Problem": "Let $x,y$ and $z$ be positive real numbers ...", "Solution": "...",
               "Answer": 33}
    yentinglin = {"id": 3, "question": "Find the number of ordered pairs ...", "solution": "...", "answer": "117",
                  "url": "", "year": 2025}
    (tmp_path / "AIME_2024.jsonl").write_text(json.dumps(maxwell) + "\n")
    (tmp_path / "aime_2025.jsonl").write_text(json.dumps(yentinglin) + "\n")
    tasks = paper_data.load_math("test", test_names=(str(tmp_path / "AIME_2024.jsonl"), str(tmp_path / "aime_2025.jsonl")))
    assert [(t["id"], t["answer"], t["source"]) for t in tasks] == [
        ("aime_2024-jsonl-2024-II-4", "33", "aime_2024-jsonl"), ("aime_2025-jsonl-3", "117", "aime_2025-jsonl")]
    assert "answer" not in tasks[0]["question"]
    assert paper_data.MATH_TEST == ("Maxwell-Jia/AIME_2024:train", "yentinglin/aime_2025:train")


LICHESS_HEADER = "PuzzleId,FEN,Moves,Rating,RatingDeviation,Popularity,NbPlays,Themes,GameUrl,OpeningTags\n"


def lichess_line(pid, fen, moves, rating=1200):
    return f"{pid},{fen},{' '.join(moves)},{rating},75,90,100,short mateIn1,https://lichess.org/x,\n"


def random_line(plies, seed):
    """(fen, moves) of `plies` + 1 legal moves from the start position (a line the filter must drop or keep)."""
    import random
    import chess
    rng, board, moves = random.Random(seed), chess.Board(), []
    for _ in range(plies + 1):
        move = rng.choice(list(board.legal_moves))
        moves.append(move.uci())
        board.push(move)
    return chess.STARTING_FEN, moves


def test_chess_rows_rules_and_split(tmp_path):
    """The official builder's rules on real puzzles (the bundled ones, as Lichess CSV rows): 1-9 solution plies
    after the trigger, every move legal, no rating filter, one puzzle per position, hash buckets disjoint."""
    puzzles = domains.read_jsonl("chess_train.jsonl")[:300]
    lines = [lichess_line(p["id"], p["fen"], p["moves"], p["rating"] + 2000 * (i % 2)) for i, p in enumerate(puzzles)]
    fen, moves = puzzles[0]["fen"], puzzles[0]["moves"]
    parts = fen.split()
    lines.insert(1, lichess_line("dupe1", " ".join(parts[:4] + ["0", "77"]), moves))  # same position, other clocks
    lines.insert(2, lichess_line("illegal", fen, [moves[0], "a1a8"]))
    other = domains.read_jsonl("chess_test.jsonl")[0]
    lines.insert(3, lichess_line("upper", other["fen"], [m.upper() for m in other["moves"]]))  # read lower-cased
    lines.insert(4, lichess_line("long10", *random_line(10, 0)))  # 10 solution plies: dropped
    lines.insert(5, lichess_line("long9", *random_line(9, 1)))  # 9: kept
    path = tmp_path / "lichess_db_puzzle.csv"
    path.write_text(LICHESS_HEADER + "".join(lines))
    buckets = (("harness", 8), ("test", 20), ("train", 200))
    filled = paper_data.chess_buckets(str(path), buckets)
    every = [t for b in filled.values() for t in b]
    ids = {t["id"] for t in every}
    assert {b: len(v) for b, v in filled.items()} == {"harness": 8, "test": 20, "train": 200}
    assert "dupe1" not in ids and "illegal" not in ids and "long10" not in ids
    assert {"long9", "upper", puzzles[0]["id"]} <= ids
    assert next(t for t in every if t["id"] == "upper")["moves"] == other["moves"]
    assert len({t["position_key"] for t in every}) == len(every)  # disjoint by position
    assert any(t["rating"] > 2000 for t in every)  # no rating filter
    order = [line.split(",")[0] for line in lines]
    count, sizes = dict.fromkeys(filled, 0), dict(buckets)
    for t in sorted(every, key=lambda t: order.index(t["id"])):  # in the stream's order: its hash bucket, or,
        bucket = paper_data.chess_bucket(t["position_key"], buckets)  # when that one is full, the first one that is not
        if count[bucket] >= sizes[bucket]:
            bucket = next(b for b, n in buckets if count[b] < n)
        assert t in filled[bucket]
        count[bucket] += 1
    assert order.index(max(every, key=lambda t: order.index(t["id"]))["id"]) < len(order) - 1  # stopped when full
    test = paper_data.load_chess("test", str(path), buckets, test_size=5)
    harness = paper_data.load_chess("harness", str(path), buckets)
    assert len(test) == 5 and {t["id"] for t in test} <= {t["id"] for t in filled["test"]}
    assert sorted(t["id"] for t in harness) == sorted(t["id"] for t in filled["harness"])
    assert test == paper_data.load_chess("test", str(path), buckets, test_size=5)  # deterministic
    args = paper_args("--chess-puzzles", str(path), "--chess-harness-size", "8", "--chess-test-pool", "20",
                      "--chess-train-size", "200", "--chess-test-size", "5")
    d = domains.get("chess", args)
    splits = {s: {t["id"] for t in d.load(s)} for s in domains.SPLITS}
    assert [len(v) for v in splits.values()] == [200, 8, 5]
    assert not splits["train"] & splits["harness"] and not splits["train"] & splits["test"]  # its own harness split
    assert not splits["harness"] & splits["test"]
    task = d.load("test")[0]
    tools = d.tools(task)
    for uci in task["moves"][1::2]:
        result = tools.move(uci)
    assert result["status"] == "solved" and d.reward(task, None, tools) == 1.0
    with pytest.raises(ValueError, match="too few distinct legal puzzles"):
        paper_data.chess_buckets(str(path), (("harness", 8), ("test", 20), ("train", 20_000)))


def test_chess_split_rule_is_the_official_hash():
    """sha256(sha256(key + ":42") hex) mod 17,664: [0, 256) harness (mh_val), [256, 1280) test, the rest train."""
    import hashlib
    keys = [p["fen"].split()[0] + " " + "wb"[i % 2] for i, p in enumerate(domains.read_jsonl("chess_train.jsonl"))]
    seen = set()
    for key in keys:
        digest = hashlib.sha256(hashlib.sha256(f"{key}:42".encode()).hexdigest().encode()).hexdigest()
        point = int(digest[:12], 16) % 17_664
        want = "harness" if point < 256 else "test" if point < 1280 else "train"
        assert paper_data.chess_bucket(key) == want
        seen.add(want)
    assert seen == {"harness", "test", "train"}
    assert paper_data.position_key("8/8/8/8/8/8/8/K6k w - - 0 1") == paper_data.position_key("8/8/8/8/8/8/8/K6k w - - 12 40")
    assert paper_data.position_key("8/8/8/8/8/8/8/K6k w - - 0 1") != paper_data.position_key("8/8/8/8/8/8/8/K6k b - - 0 1")


def paper_args(*argv):
    p = argparse.ArgumentParser()
    domains.add_args(p)
    return vars(p.parse_args(["--data", "paper", *argv]))


def test_data_switch(tmp_path):
    assert domains.get("math", {"data": "bundled"}).load("test")[0]["id"].startswith("gsm8k")
    rows = [{"prompt": [{"role": "user", "content": paper_data.DAPO_PREFIX + f"What is {i} + {i}?" + paper_data.DAPO_SUFFIX}],
             "reward_model": {"ground_truth": str(2 * i)}, "extra_info": {"index": i}} for i in range(300)]
    (tmp_path / "dapo.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "aime.jsonl").write_text(json.dumps({"id": 1, "problem": "Find x.", "answer": "7"}) + "\n")
    math = domains.get("math", paper_args("--math-train", str(tmp_path / "dapo.jsonl"), "--math-test", str(tmp_path / "aime.jsonl")))
    assert len(math.load("train")) == 300 and len(math.load("harness")) == 256 and math.load("test")[0]["answer"] == "7"
    assert math.reward(math.load("test")[0], "so \\boxed{7}", None) == 1.0
    (tmp_path / "wiki.jsonl").write_text("".join(json.dumps(d) + "\n" for d in WIKI))
    search = domains.get("searchqa", paper_args("--wiki", str(tmp_path / "wiki.jsonl")))
    assert search.tools({}).search("Kelmar founded", k=50)[0].startswith('"Kelmar": Kelmar is a city')
    with pytest.raises(ValueError, match="--retriever-url URL .* or --wiki PATH"):
        domains.get("searchqa", paper_args()).tools({})

# -----------------------------------------------------------------------------
# retrieval: the Search-R1 server API on loopback, and bm25s over a wiki-18 style file

WIKI = [{"id": "0", "contents": '"Zarnoth River"\nThe Zarnoth River flows through Kelmar and ends in the Sea of Vost.'},
        {"id": "1", "contents": '"Kelmar"\nKelmar is a city founded in 1342 by the weaver Oda Prell.'},
        {"id": "2", "contents": '"Oda Prell"\nOda Prell was a weaver born in Tasmir.'}]


def retriever_handler(log):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            log.append((self.path, req))
            hits = [[{"document": WIKI[i % 3], "score": 1.0 / (i + 1)} for i in range(req["topk"])] for _ in req["queries"]]
            if not req["return_scores"]:
                hits = [[h["document"] for h in q] for q in hits]
            body = json.dumps({"result": hits}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    return Handler


def test_retriever_client_speaks_search_r1_api():
    log = []
    server = serve(retriever_handler(log))
    try:
        client = retriever.RetrieverClient(f"http://127.0.0.1:{server.server_port}/retrieve")
        assert client.search("where does the Zarnoth flow", k=2) == [
            '"Zarnoth River": The Zarnoth River flows through Kelmar and ends in the Sea of Vost.',
            '"Kelmar": Kelmar is a city founded in 1342 by the weaver Oda Prell.']
        assert log[-1] == ("/retrieve", {"queries": ["where does the Zarnoth flow"], "topk": 2, "return_scores": True})
        assert [len(r) for r in client.search_batch(["a", "b", "c"], k=1)] == [1, 1, 1]
    finally:
        server.shutdown()
    with pytest.raises(RuntimeError, match="retrieval server .* --wiki"):
        retriever.RetrieverClient("http://127.0.0.1:9/retrieve", timeout=5, retry_wait=0).search("x")


def flaky_retriever(replies, log):
    """A Search-R1 server whose n-th request gets replies[n] (a status and a body; the last one ever after)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, body = replies[min(len(log), len(replies) - 1)](req)
            log.append(status)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    return serve(Handler)


def answer(req):
    return 200, json.dumps({"result": [[{"document": WIKI[0], "score": 1.0}] for _ in req["queries"]]}).encode()


def test_a_failed_retriever_batch_is_sent_once_more_after_a_wait(capsys):
    log = []
    server = flaky_retriever([lambda req: (503, b"restarting"), answer], log)
    try:
        client = retriever.RetrieverClient(f"http://127.0.0.1:{server.server_port}/retrieve", retry_wait=0.2)
        start = time.time()
        assert client.search("where does the Zarnoth flow") == [retriever.passage_text(WIKI[0]["contents"])]
        assert log == [503, 200] and time.time() - start >= 0.2
        assert "HTTP Error 503" in capsys.readouterr().out  # the retry is said, with its cause
    finally:
        server.shutdown()


def test_a_malformed_retriever_reply_is_infrastructure_after_its_retry():
    """A reply of another shape (here a proxy's page, then hits without contents) is the machine's failure:
    MalformedReply, an InfrastructureError, which the runner counts against the budget (test_rollout.py)."""
    log = []
    server = flaky_retriever([lambda req: (200, b"<html>Bad gateway</html>"),
                              lambda req: (200, json.dumps({"result": [[{"score": 1.0}]]}).encode())], log)
    try:
        client = retriever.RetrieverClient(f"http://127.0.0.1:{server.server_port}/retrieve", retry_wait=0)
        with pytest.raises(retriever.MalformedReply, match=r"malformed reply \(KeyError: 'contents'\)") as e:
            client.search("x")
        assert isinstance(e.value, InfrastructureError) and log == [200, 200]
    finally:
        server.shutdown()


def test_concurrent_searches_reach_the_retriever_one_request_at_a_time():
    """Sixteen episodes' tool threads search at once: the server (a thread pool over a FAISS GPU index that is not
    thread-safe, in Search-R1) never sees two requests at once; the queries leave in batches, each answered."""
    state = {"in_flight": 0, "most": 0, "batches": []}
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                state["in_flight"] += 1
                state["most"] = max(state["most"], state["in_flight"])
                state["batches"].append(len(req["queries"]))
            time.sleep(0.05)  # a search that takes a while, so the others pile up
            hits = [[{"document": {"contents": f'"{q}"\nabout {q}'}, "score": 1.0}] for q in req["queries"]]
            with lock:
                state["in_flight"] -= 1
            body = json.dumps({"result": hits}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = serve(Handler)
    try:
        client = retriever.RetrieverClient(f"http://127.0.0.1:{server.server_port}/retrieve")
        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(lambda i: client.search(f"q{i}", k=1), range(16)))
        assert got == [[f'"q{i}": about q{i}'] for i in range(16)]  # each its own answer (a quoted title)
        assert state["most"] == 1 and sum(state["batches"]) == 16 and len(state["batches"]) < 16
    finally:
        server.shutdown()
    # a failed request (and its retry) fails its batch
    failing = retriever.RetrieverClient("http://127.0.0.1:9/retrieve", timeout=5, retry_wait=0)
    with ThreadPoolExecutor(4) as pool:
        errors = [f.exception() for f in [pool.submit(failing.search, f"q{i}") for i in range(4)]]
    assert all(isinstance(e, RuntimeError) and "retrieval server" in str(e) for e in errors)


def test_the_wiki_loads_once_per_process(tmp_path, capsys):
    path = tmp_path / "wiki-18.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in WIKI))
    before = retriever.SHARED.copy()
    try:
        first = retriever.shared_retriever(None, str(path))
        assert retriever.shared_retriever(None, str(tmp_path / "." / "wiki-18.jsonl")) is first  # the same file
        out = capsys.readouterr().out
        assert out.count("passages and their bm25s index loaded in") == 1 and "once for this process" in out
        assert retriever.shared_retriever("http://127.0.0.1:9/retrieve") is retriever.shared_retriever("http://127.0.0.1:9/retrieve")
    finally:
        retriever.SHARED.clear()
        retriever.SHARED.update(before)


def test_wiki_bm25_fallback(tmp_path):
    path = tmp_path / "wiki-18.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in WIKI))
    wiki = retriever.WikiBM25(str(path))
    assert wiki.search("who founded Kelmar", k=1) == ['"Kelmar": Kelmar is a city founded in 1342 by the weaver Oda Prell.']
    again = retriever.WikiBM25(str(path))  # loads the saved index
    assert again.search("Oda Prell birthplace", k=3)[0].startswith('"Oda Prell":')
    with pytest.raises(FileNotFoundError, match="wiki corpus .* --retriever-url"):
        retriever.WikiBM25(str(tmp_path / "missing.jsonl"))


def test_a_local_folder_of_per_set_files_reads_as_flashrag_does(tmp_path):
    """--searchqa-test FOLDER: one file per config and split (a FlashRAG snapshot's nq/test.jsonl layout), each
    set's tasks named by it; the preflight lists every set's file, and a missing one is named."""
    from lib.ops import preflight
    for config, split in (("nq", "test"), ("hotpotqa", "dev")):
        (tmp_path / config).mkdir()
        (tmp_path / config / f"{split}.jsonl").write_text(
            json.dumps({"id": f"{split}_0", "question": f"who founded {config}", "golden_answers": ["Ann Vo"]}) + "\n")
    tasks = paper_data.load_searchqa("test", test_name=str(tmp_path), test_sets=["nq:test", "hotpotqa:dev"], per_set=5)
    assert [(t["source"], t["question"]) for t in tasks] == [("nq", "who founded nq?"), ("hotpotqa", "who founded hotpotqa?")]
    args = SimpleNamespace(domain="searchqa", searchqa_train="train.jsonl", searchqa_test=str(tmp_path),
                           searchqa_test_sets="nq:test,hotpotqa:dev,musique:dev")
    files = [name for flag, name in preflight.dataset_names(args) if flag == "--searchqa-test"]
    assert files == [str(tmp_path / "nq" / "test.jsonl"), str(tmp_path / "hotpotqa" / "dev.jsonl"),
                     str(tmp_path / "musique" / "dev.jsonl")]
    assert preflight.dataset_status(files[2]) == (False, "no such file")
    with pytest.raises(FileNotFoundError, match="musique:dev"):
        paper_data.load_searchqa("test", test_name=str(tmp_path), test_sets=["musique:dev"])


def test_the_paper_dry_run_stand_ins_speak_the_real_formats(tmp_path):
    """scripts/paper_dry_run.py: its fixtures load through the paper's loaders for every split the dry run uses,
    its retrieval server answers the run's own client, and its agent's edit passes the harness contract."""
    import importlib.util
    import shutil
    from pathlib import Path
    from lib.contract import static_check
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("paper_dry_run", root / "scripts" / "paper_dry_run.py")
    dry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dry)
    dry.fixtures(str(tmp_path))
    [train] = list((tmp_path / "searchqa").glob("searchqa_train.*"))
    assert len(paper_data.load_searchqa("train", train_name=str(train), train_size=16)) == 16
    test = paper_data.load_searchqa("test", test_name=str(tmp_path / "searchqa" / "flashrag"), test_sets=["nq:test", "hotpotqa:dev"])
    assert len(test) == 12 and {t["source"] for t in test} == {"nq", "hotpotqa"}
    [dapo] = list((tmp_path / "math").glob("dapo_math_17k.*"))
    math_train = paper_data.load_math("train", train_name=str(dapo))
    assert len(math_train) == 8 and math_train[0]["id"] == "dapo-0000"  # one per problem id, DAPO's prompt kept:
    assert math_train[0]["question"] == (paper_data.DAPO_PREFIX + "A box holds 6 rows of 7 tiles. How many tiles are in the "
                                                          "box?" + paper_data.DAPO_SUFFIX).strip()
    aime = [str(next((tmp_path / "math").glob(f"aime_{y}.*"))) for y in (2024, 2025)]
    assert [t["answer"] for t in paper_data.load_math("test", test_names=aime)] == ["42", "27", "42", "20"]
    chess_test = paper_data.load_chess("test", str(tmp_path / "chess" / "lichess_db_puzzle.csv"),
                                (("harness", 8), ("test", 8), ("train", 24)), test_size=4)
    assert len(chess_test) == 4 and all(1 <= len(t["moves"]) - 1 <= 3 for t in chess_test)

    port_file = tmp_path / "port"
    server = dry.retriever(tmp_path / "searchqa" / "wiki-18.jsonl.gz", port_file)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = retriever.RetrieverClient(f"http://127.0.0.1:{port_file.read_text()}/retrieve")
        assert client.search_batch(["capital of Zorbia", "Talvia"], k=1) == [
            ['"Zorbia": Zorbia is a country whose capital is Quelm, on the river Ost.'],
            ['"Talvia": Talvia is a country whose capital is Ost, on the river Ost.']]
    finally:
        server.shutdown()
    assert (tmp_path / "port.queries").read_text() == "capital of Zorbia\nTalvia\n"

    candidate = tmp_path / "work" / "candidates" / "h1_1"
    candidate.mkdir(parents=True)
    parent = (root / "harnesses" / "paper" / "searchqa.py").read_text()
    shutil.copyfile(root / "harnesses" / "paper" / "searchqa.py", candidate / "harness.py")
    (candidate / "meta.json").write_text(json.dumps({"proposed": False, "parent": "h0"}))
    dry.agent(str(tmp_path / "work"))
    edited = (candidate / "harness.py").read_text()
    assert edited != parent and static_check(edited, parent, False) is None
    assert "system prompt" in json.loads((candidate / "meta.json").read_text())["changed"]
