"""Run-folder files: copies made whole in one rename; the paths a run folder stores, relative to it so that a moved
folder resumes; content hashes (file_sha, adapter_id); and the checks that say, before a resume, whether a file
it reads back (a JSON file, safetensors, a torch file, an RSFT checkpoint) is whole. JSON and JSON Lines files:
lib/common/json_files.py."""

import hashlib
import json
import os
import shutil
import struct
import zipfile
from pathlib import Path

from lib.common.json_files import damaged, json_object, read_json, sha256


def copy_tree(src, dst):
    """dst as a copy of the folder src (real copies: an edit of either never reaches the other), in a temporary
    folder renamed at the end, so a kill leaves either nothing or the whole copy."""
    tmp = Path(str(dst) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    os.replace(tmp, dst)


def copy_file(src, dst):
    """dst as a copy of src, put in place in one rename."""
    tmp = Path(str(dst) + ".tmp")
    tmp.unlink(missing_ok=True)
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def stored_path(path, run_dir):
    """path as a run folder stores it: relative to the folder when inside it (so a moved folder resumes),
    else absolute."""
    real, root = os.path.realpath(path), os.path.realpath(run_dir)
    if os.path.commonpath([real, root]) == root:
        return os.path.relpath(real, root)
    return os.path.abspath(path)


def resolved_path(stored, run_dir):
    """The file a stored path names: a relative one from run_dir, an absolute one as it is."""
    return None if stored is None else os.path.abspath(os.path.join(run_dir, stored))


# -----------------------------------------------------------------------------
# content hashes: what the cross-method reuse and a resume compare

def file_sha(path):
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return f"missing: {path}"  # matches nothing, so nothing is reused


def adapter_config_sha(path):
    """The hash of a peft adapter config as a canonical JSON: peft writes target_modules from a set, in an
    order that differs from one save of the same adapter to the next."""
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return f"missing: {path}"
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def adapter_id(folder):
    """The content of a saved LoRA adapter, for the evaluation cache."""
    folder = Path(folder)
    return "adapter " + adapter_config_sha(folder / "adapter_config.json")[:32] + \
        file_sha(folder / "adapter_model.safetensors")[:32]


# -----------------------------------------------------------------------------
# run files checked as a whole before a resume: a damaged or missing one raises ValueError with one line
# naming the file and the fix, never a traceback halfway or a silently wrong result


def start_over(out):
    return f"restore it, or delete {out} to start the run over"


def check_safetensors(path, fix):
    """A safetensors file is its header's length (8 bytes), the header (JSON) and exactly the tensor bytes that
    header lays out, and every value is finite: a cut file, bytes appended or a NaN adapter is the error."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} is missing: {fix}")
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n)) if n < size else None
        end = 8 + n + max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (struct.error, ValueError, TypeError, KeyError, AttributeError):
        raise damaged(path, "not a safetensors file: its header does not parse", fix) from None
    if end != size:
        raise damaged(path, f"{size} bytes where its header lays out {end}", fix)
    import torch  # the callers hold torch already; report.py and domains.py never get here
    from safetensors.torch import load_file
    for name, tensor in load_file(str(path)).items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise damaged(path, f"tensor {name} holds inf or nan", fix)


def check_torch_file(path, fix):
    """A torch.save file is a zip archive: every member is there and matches its checksum."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} is missing: {fix}")
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise damaged(path, f"not a whole torch file: {e}", fix) from None
    if bad is not None:
        raise damaged(path, f"its member {bad} fails its checksum", fix)


def check_recorded_sha(path, sha, fix):
    """The file holds what was saved (the sha256 recorded beside it), when one was recorded."""
    if sha is not None and sha256(path) != sha:
        raise damaged(path, "its content is not what was saved: the sha256 differs", fix)


def check_same_model(out, model):
    """A run folder resumes only on the model its work was done with, as its last start's config.json names it."""
    try:
        config = json.loads(Path(out, "config.json").read_text())
    except (OSError, ValueError):
        return  # none yet (config.json is rewritten at every start, so a damaged one is not an error)
    if isinstance(config, dict) and config.get("model", model) != model:
        raise ValueError(f"{out} was run on model {config['model']!r}, not {model!r}: use the same --model or a "
                         "new --out")


# -----------------------------------------------------------------------------
# an RSFT checkpoint, whole (a harness archive: lib/archive.py's check_archive)

CHECKPOINT_FILES = ("adapter/adapter_model.safetensors", "optimizer.pt")  # their sha256 is saved in state.json


def check_checkpoint_files(folder, fix):
    """Every file a trainer reads from a checkpoint folder (rft.RSFT.save's, as the store holds it) is whole, before
    the model loads: state.json, adapter_config.json, the adapter weights (safetensors laid out as its header says,
    finite) and optimizer.pt (a whole torch file), each holding the sha256 recorded at save time. -> its state"""
    folder = Path(folder)
    state = json_object(folder / "state.json", fix, keys=("model", "step", "rollouts", "sampler", "weights"))
    json_object(folder / "adapter" / "adapter_config.json", fix)
    check_safetensors(folder / CHECKPOINT_FILES[0], fix)
    check_torch_file(folder / CHECKPOINT_FILES[1], fix)
    for name in CHECKPOINT_FILES:
        check_recorded_sha(folder / name, state.get("sha256", {}).get(name), fix)
    return state


def check_run_files(folder, skip=()):
    """Every JSON file of a run folder parses (read_json's error otherwise), checked before any work starts;
    skip: folders whose files the caller checks (and rebuilds) itself."""
    for path in sorted(Path(folder).glob("**/*.json")):
        cut = any(part.endswith(".tmp") for part in path.relative_to(folder).parts)  # a copy a kill cut: remade
        if path.name != "config.json" and path.parent.name not in skip and not cut:  # config.json: rewritten at start
            read_json(path)
