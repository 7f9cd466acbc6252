"""Run-folder files: JSON and JSON Lines written atomically (a kill never leaves half a file) and read back
with an error that names a damaged file and its fix; hard links; content hashes; and the paths a run folder
stores, relative to it so that a moved folder resumes (`resolved_path` also reads the absolute paths that
older runs stored)."""

import hashlib
import json
import os
import re
import shutil
from pathlib import Path


def read_json(path, default=None):
    """The JSON in path (default when there is none); a damaged file is an error naming it and the fix."""
    path = Path(path)
    if not path.exists():
        return default
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"damaged run file {path} ({'empty' if not path.read_text().strip() else e.msg}): restore "
                         "it, or start this run over in a fresh --out") from None


def write_json(path, obj):
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)  # atomic, so a killed run never leaves half a file behind


def read_jsonl(path, what="run file", fix="delete that line and rerun",
               error="damaged {what} {path}: line {lineno} is not a JSON object: {fix}"):
    """The JSON objects of a JSON Lines file ([] when there is none; blank lines skipped); a line that is not
    a JSON object is an error naming the file, the line and the fix (`error` filled with what, path, lineno
    and fix: a reader whose message reads otherwise passes its own)."""
    if not os.path.exists(path):
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if not isinstance(row, dict):
                raise ValueError(error.format(what=what, path=path, lineno=lineno, fix=fix))
            rows.append(row)
    return rows


def write_jsonl(path, rows):
    """path holds exactly these rows, swapped in by one rename."""
    tmp = Path(str(path) + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


def append_jsonl(path, row):
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def swap_link(link, target):
    """link -> target (a name in link's folder), switched in one rename: a kill leaves the old or the new link."""
    link = Path(link)
    tmp = link.with_name(link.name + ".new")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


def link_tree(src, dst, copy_function=None):
    """dst as a copy of the folder src, made of hard links (files are never rewritten in place here; pass
    copy_function=shutil.copy2 for real copies), in a temporary folder renamed at the end, so a kill leaves
    either nothing or the whole copy."""
    tmp = Path(str(dst) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, copy_function=copy_function or link_or_copy)
    os.replace(tmp, dst)


def link_file(src, dst):
    """dst as a hard link of (or a copy of) src, put in place in one rename."""
    tmp = Path(str(dst) + ".tmp")
    tmp.unlink(missing_ok=True)
    link_or_copy(src, tmp)
    os.replace(tmp, dst)


def link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:  # another file system, or none that has hard links
        shutil.copy2(src, dst)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
