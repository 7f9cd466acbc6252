"""Run-folder files: copies made whole in one rename; the paths a run folder stores, relative to it so that a moved
folder resumes; content hashes (file_sha, adapter_id); and the check rft.py and meta_harness.py make before they resume
from their own store (the same model). JSON and JSON Lines files: lib/common/json_files.py."""

import hashlib
import json
import os
import shutil
from pathlib import Path


def copy_tree(src, dst):
    """dst as a copy of the folder src (real copies: an edit of either never reaches the other), in a temporary
    folder renamed at the end, so a kill leaves either nothing or the whole copy."""
    tmp = Path(str(dst) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    os.replace(tmp, dst)


def remove(path):
    """Whatever lies at path gone: a folder, a file, or a link (the link itself, never what it points to, so a run
    folder's archive that is a link to another is not searched in place); nothing there is fine."""
    path = Path(path)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


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
# a rerun on a run folder: one line naming the fix, never a silently wrong result

def start_over(out):
    return f"restore it, or delete {out} to start the run over"


def check_same_model(out, model):
    """A run folder resumes only on the model its work was done with, as its last start's config.json names it."""
    try:
        config = json.loads(Path(out, "config.json").read_text())
    except (OSError, ValueError):
        return  # none yet (config.json is rewritten at every start, so a damaged one is not an error)
    if isinstance(config, dict) and config.get("model", model) != model:
        raise ValueError(f"{out} was run on model {config['model']!r}, not {model!r}: use the same --model or a "
                         "new --out")
