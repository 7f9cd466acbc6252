"""Run folders checked as a whole before a resume, and movable.

A resumed run reads back what earlier starts wrote: JSON, JSON Lines, safetensors, torch files, harness files.
The checks here say, before any work, whether one such file is whole; a damaged or missing one raises
ValueError with one line naming the file and the fix, never a traceback halfway or a silently wrong result.
"""

import json
import os
import struct
import zipfile
from pathlib import Path

from lib.files import read_json, read_jsonl, sha256


def start_over(out):
    return f"restore it, or delete {out} to start the run over"


def damaged(path, why, fix):
    return ValueError(f"damaged run file {path} ({why}): {fix}")


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
# an RSFT checkpoint and a harness archive, whole

def check_checkpoint(out_dir, start_over=None):
    """A damaged run folder is an error naming the file and the fix (start_over: the caller's words for
    starting over), never a silent restart from step 0."""
    out_dir = Path(out_dir)
    ckpt, metrics = out_dir / "ckpt", out_dir / "metrics.jsonl"
    start_over = start_over or f"restore it, or delete {out_dir} to train from step 0"
    if ckpt.is_symlink() and not ckpt.exists():
        raise ValueError(f"checkpoint link {ckpt} points to {os.readlink(ckpt)}, which is missing: {start_over}")
    if not ckpt.exists():
        if metrics.exists() and metrics.read_text().strip():
            raise ValueError(f"{metrics} records finished RSFT steps but the checkpoint {ckpt} is missing: {start_over}")
        return
    for name in ("state.json", "optimizer.pt", "adapter/adapter_model.safetensors"):
        if not (ckpt / name).exists():
            raise ValueError(f"damaged checkpoint: {ckpt / name} is missing: {start_over}")
    try:
        json.loads((ckpt / "state.json").read_text())
    except json.JSONDecodeError:
        raise ValueError(f"damaged checkpoint: {ckpt / 'state.json'} is not valid JSON: {start_over}") from None
    check_checkpoint_files(ckpt.resolve(), start_over)


def check_checkpoint_model(out_dir, model):
    """A checkpoint resumes only on the model it was trained on (checked before the model loads)."""
    ckpt = Path(out_dir) / "ckpt"
    state = read_json(ckpt / "state.json") if ckpt.exists() else None
    if state is not None and state["model"] != model:
        raise ValueError(f"{ckpt} was trained on model {state['model']!r}, not {model!r}: "
                         "use the same --model or a new --out")


CHECKPOINT_FILES = ("adapter/adapter_model.safetensors", "optimizer.pt")  # their sha256 is saved in state.json


def check_checkpoint_files(folder, fix):
    """Every file a resume reads from a checkpoint folder (ckpt-<step>/ or a snapshot of one) is whole, before
    the model loads: state.json (its counters and history agree), adapter_config.json, the adapter weights
    (safetensors laid out as its header says, finite) and optimizer.pt (a whole torch file), each holding the
    sha256 recorded at save time where the save recorded one. -> the checkpoint's state"""
    folder = Path(folder)
    state = json_object(folder / "state.json", fix, keys=("model", "step", "rollouts", "sampler", "history"))
    history = state["history"]
    if not isinstance(history, list) or len(history) != state["step"] or \
            [row.get("step") if isinstance(row, dict) else None for row in history] != list(range(1, len(history) + 1)):
        raise ValueError(f"damaged run file {folder / 'state.json'} (its history is not steps 1-{state['step']}): {fix}")
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
        if path.name != "config.json" and path.parent.name not in skip:  # config.json: rewritten at every start
            read_json(path)


def check_archive(run_dir, fix, iterations=None, candidates=None):
    """The archive as a whole, before a search resumes or a finished one is read: every valid candidate has its
    harness.py, every score its scores.json and all the traces it counted; given the iterations finished and
    the candidates per iteration, each of their candidates is there and judged. Raises naming the file and
    `fix`. -> whether the seed's harness.py is lost (restore_seed copies it back)."""
    run_dir = Path(run_dir)
    seed_lost = False
    for meta_path in sorted((run_dir / "candidates").glob("*/meta.json")):
        d, meta = meta_path.parent, json_object(meta_path, fix)
        if meta.get("valid") and not (d / "harness.py").is_file():
            if meta.get("proposer") != "seed":
                raise ValueError(f"{d / 'harness.py'} is missing, but {meta_path} says it is a valid candidate: {fix}")
            seed_lost = True
        if (d / "scores.json").exists():
            scores = json_object(d / "scores.json", fix, keys=("score", "mean_turns", "rollouts"))
            if not whole_jsonl(d / "traces.jsonl", scores["rollouts"]):
                raise damaged(d / "traces.jsonl", f"not the {scores['rollouts']} episodes of its score", fix)
    for it in range(iterations + 1 if iterations is not None else 0):
        for name in ["h0"] if it == 0 else [f"h{it}_{j}" for j in range(1, candidates + 1)]:
            d = run_dir / "candidates" / name
            meta = json_object(d / "meta.json", fix)
            if meta.get("valid") is None:
                raise damaged(d / "meta.json", f"iteration {it} is finished, but {name} was never judged", fix)
            if meta["valid"] and not (d / "scores.json").exists():
                raise ValueError(f"{d / 'scores.json'} is missing, but iteration {it} is finished: {fix}")
    return seed_lost
