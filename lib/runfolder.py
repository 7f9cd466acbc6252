"""Run folders checked as a whole before a resume, and movable.

A resumed run reads back what earlier starts wrote: JSON, JSON Lines, safetensors, torch files, harness files.
The checks here say, before any work, whether one such file is whole; a damaged or missing one raises
ValueError with one line naming the file and the fix, never a traceback halfway or a silently wrong result.
What a run folder stores about a file inside it is a path relative to the folder (`stored_path`), so a moved
folder resumes; `resolved_path` also reads the absolute paths that older runs stored."""

import hashlib
import json
import os
import re
import struct
import zipfile
from pathlib import Path

from lib.io import read_jsonl


def start_over(out):
    return f"restore it, or delete {out} to start the run over"


def damaged(path, why, fix):
    return ValueError(f"damaged run file {path} ({why}): {fix}")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# -----------------------------------------------------------------------------
# one file: whole or an error naming it and the fix

def json_object(path, fix, keys=()):
    """The JSON object in path, holding `keys`; a missing file, bad JSON or another value is the error."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} is missing: {fix}")
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise damaged(path, "empty" if not path.read_bytes().strip() else f"not JSON: {e}", fix) from None
    if not isinstance(value, dict):
        raise damaged(path, f"a JSON {type(value).__name__}, not an object", fix)
    lacking = [k for k in keys if k not in value]
    if lacking:
        raise damaged(path, f"no {', '.join(lacking)}", fix)
    return value


def jsonl_rows(path, fix):
    """The rows of a JSON Lines file that must exist, each a JSON object."""
    if not os.path.isfile(path):
        raise ValueError(f"{path} is missing: {fix}")
    try:
        return read_jsonl(path, fix=fix)
    except UnicodeDecodeError:
        raise damaged(path, "not UTF-8 text", fix) from None


def whole_jsonl(path, rows_expected):
    """Whether a JSON Lines file exists with exactly `rows_expected` JSON objects (a cut file has fewer)."""
    try:
        return os.path.isfile(path) and len(read_jsonl(path)) == rows_expected
    except (ValueError, OSError):
        return False


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
# paths a run folder stores

def stored_path(path, run_dir):
    """path as a run folder stores it: relative to the folder when inside it (so a moved folder resumes),
    else absolute."""
    real, root = os.path.realpath(path), os.path.realpath(run_dir)
    if os.path.commonpath([real, root]) == root:
        return os.path.relpath(real, root)
    return os.path.abspath(path)


def resolved_path(stored, run_dir):
    """The file a stored path names: a relative one inside run_dir; an absolute one as it is, or, when it
    pointed into a folder that has since moved (older runs stored absolute paths), by its tail from a
    harness_w<n>/ folder on."""
    if stored is None:
        return None
    if not os.path.isabs(stored):
        return os.path.abspath(os.path.join(run_dir, stored))
    parts = Path(stored).parts
    if not os.path.exists(stored):
        for i, part in enumerate(parts):
            if re.fullmatch(r"harness_w\d+", part) and Path(run_dir, *parts[i:]).exists():
                return os.path.abspath(Path(run_dir, *parts[i:]))
    return stored
