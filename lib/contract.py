"""The harness contract: what a harness file may be. One allowlist of imports, one list of forbidden names,
the size cap, and the two gates built on them: `check_harness`, the episode runner's check of a file (it
raises, naming the file, the line and the fix), and `static_check`, the search's verdict on a candidate
(a reason string; stricter: names, dunders, size, --prompt-only). Plus what --prompt-only compares
(`strings_blanked`) and what counts as a duplicate (`normalized`)."""

import ast
from pathlib import Path

ALLOWED_IMPORTS = ("re", "json", "math", "random", "string", "collections", "itertools", "functools",
                   "textwrap", "dataclasses", "typing")
# names that reach files, code execution or the interpreter's internals; the runner sandboxes harness
# code anyway, this catches the obvious attempts before any rollout is spent
FORBIDDEN_NAMES = ("open", "exec", "eval", "compile", "__import__", "globals", "locals", "vars", "getattr",
                   "setattr", "delattr", "breakpoint", "input", "__builtins__", "__loader__", "__spec__")
MAX_HARNESS_CHARS = 100_000
PROMPT_KNOBS = ("PROMPT", "TEMPLATE")  # a prompt knob's name is one of these or ends in _PROMPT / _TEMPLATE


def forbidden_import(node):
    """The first module an import statement names that is not in ALLOWED_IMPORTS (a relative import as its dots
    and name, e.g. '.x'), else None (also for any node that is not an import)."""
    if isinstance(node, ast.Import):
        bad = [a.name for a in node.names if a.name.split(".")[0] not in ALLOWED_IMPORTS]
    elif isinstance(node, ast.ImportFrom):
        module = "." * node.level + (node.module or "")
        bad = [] if module.split(".")[0] in ALLOWED_IMPORTS else [module]
    else:
        bad = []
    return bad[0] if bad else None


def check_harness(path):
    """-> the harness source; raises FileNotFoundError / ValueError naming the file, the line and the fix.
    The runner's gate, before any worker starts: it parses, imports only ALLOWED_IMPORTS, defines run."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such harness file; pass an existing .py file such as harnesses/chess.py")
    source = path.read_text()
    try:
        tree = ast.parse(source, str(path))
    except SyntaxError as e:
        raise ValueError(f"{path}:{e.lineno}: syntax error: {e.msg}; fix the harness so that it compiles") from None
    for node in ast.walk(tree):
        bad = forbidden_import(node)
        if bad:
            bad = "." if bad.startswith(".") else bad  # the runner names any relative import '.'
            raise ValueError(f"{path}:{node.lineno}: imports {bad!r}; a harness may import only "
                             f"{', '.join(ALLOWED_IMPORTS)}")
    if not any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body):
        raise ValueError(f"{path}:1: no top-level function run; define run(task, llm, tools) returning "
                         "{'answer': ...}")
    return source


def static_check(source, parent_source=None, prompt_only=False):
    """None when the candidate may be run, else the reason it is rejected."""
    if not source or not source.strip():
        return "no code: the candidate file is missing or empty"
    if len(source) > MAX_HARNESS_CHARS:
        return f"too large: {len(source)} characters (max {MAX_HARNESS_CHARS})"
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return f"syntax error: line {e.lineno}: {e.msg}"
    runs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    if not runs or [a.arg for a in runs[-1].args.args] != ["task", "llm", "tools"] or runs[-1].args.vararg \
            or runs[-1].args.kwonlyargs or runs[-1].args.kwarg or runs[-1].args.posonlyargs:
        return "no run: the file must define a top-level def run(task, llm, tools)"
    for node in ast.walk(tree):
        bad = forbidden_import(node)
        if bad:
            return f"forbidden import: {bad} (allowed: {', '.join(ALLOWED_IMPORTS)})"
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            return f"forbidden name: {node.id} (line {node.lineno})"
        if isinstance(node, ast.Attribute) and node.attr.startswith("__") and node.attr.endswith("__"):
            return f"forbidden attribute: .{node.attr} (line {node.lineno})"
    if prompt_only and parent_source is not None and strings_blanked(source) != strings_blanked(parent_source):
        return ("prompt-only violation: the candidate changes more than its parent's prompt text (top-level "
                "*_PROMPT / *_TEMPLATE string constants and docstrings)")
    return None


def strings_blanked(source):
    """The syntax tree with its prompt text blanked, so two files compare equal iff they differ only in prompt
    text (--prompt-only, FST). Prompt text is (1) the value of a top-level prompt knob: `NAME = "..."`, a single
    string literal, NAME being PROMPT, TEMPLATE or UPPER_CASE ending in _PROMPT or _TEMPLATE; (2) docstrings,
    which code cannot read without a new name (and so a rejected change). Every other literal (regexes, tag
    names, dict keys, SEARCH_SPACE, strings inside functions) must stay as the parent has it."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id.isupper() and node.targets[0].id.split("_")[-1] in PROMPT_KNOBS \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            node.value.value = ""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
                and isinstance(node.body[0].value.value, str):
            node.body[0].value.value = ""
    return ast.dump(tree, include_attributes=False)


def normalized(source):
    """The code without formatting and comments, for duplicate checks (None when it does not parse)."""
    try:
        return ast.dump(ast.parse(source))
    except SyntaxError:
        return None
