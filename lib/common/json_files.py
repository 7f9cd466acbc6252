"""JSON and JSON Lines files, written atomically (a kill never leaves half a file) and read back with an error that
names a damaged file and its fix; a file's sha256. The run folder, the store, the archive, the proposers, the
report and the paper's data all read and write through these."""
import hashlib
import json
import os
from pathlib import Path


def read_json(path, default=None):
    """The JSON in path (default when there is none); a damaged file is an error naming it and the fix."""
    path = Path(path)
    if not path.exists():
        return default
    data = path.read_bytes()
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        why = f"not UTF-8 text: byte {e.start}"
    except json.JSONDecodeError as e:
        why = "empty" if not data.strip() else e.msg
    raise ValueError(f"damaged run file {path} ({why}): restore it, or start this run over in a fresh --out")


def write_json(path, obj):
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)  # atomic, so a killed run never leaves half a file behind


def read_jsonl(path, what="run file", fix="delete that line and rerun",
               error="damaged {what} {path}: line {lineno} is not a JSON object: {fix}", required=()):
    """The JSON objects of a JSON Lines file ([] when there is none; blank lines skipped); a line that is not
    a JSON object (holding the `required` keys) is an error naming the file, the line and the fix (`error` filled
    with what, path, lineno, fix and required: a reader whose message reads otherwise passes its own)."""
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
            if not isinstance(row, dict) or any(k not in row for k in required):
                raise ValueError(error.format(what=what, path=path, lineno=lineno, fix=fix,
                                              required=", ".join(required)))
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


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def damaged(path, why, fix):
    return ValueError(f"damaged run file {path} ({why}): {fix}")


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
