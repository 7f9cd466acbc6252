"""Run-folder files: JSON and JSON Lines written atomically (a kill never leaves half a file) and read back
with an error that names a damaged file and its fix."""

import json
import os
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


def read_jsonl(path, what="run file", fix="delete that line and rerun"):
    """The JSON objects of a JSON Lines file ([] when there is none; blank lines skipped); a line that is not
    a JSON object is an error naming the file, the line and the fix."""
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
                raise ValueError(f"damaged {what} {path}: line {lineno} is not a JSON object: {fix}")
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
