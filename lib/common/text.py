"""Untrusted text made text where it enters: a string a harness, a worker, a tool or a proposer hands back may hold
a lone surrogate (JSON's "\\ud800" escape says one; no file, pipe or terminal can hold it), and printing or writing it
later stops the command. Each entry point passes what it takes through valid_text, so nothing past it can fail."""


def valid_text(value):
    """value with every string in it valid UTF-8 text (each lone surrogate replaced by '?'); lists and dicts are
    walked, keys too, other values kept. Recursive: pass values whose depth is bounded (runner.check_depth)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, list):
        return [valid_text(v) for v in value]
    if isinstance(value, dict):
        return {valid_text(k): valid_text(v) for k, v in value.items()}
    return value
