"""The harness contract: what a harness file may be. One allowlist of imports, one list of forbidden names,
the size cap, and the two gates built on them: `check_harness`, the episode runner's check of a file (it
raises, naming the file, the line and the fix), and `static_check`, the search's verdict on a candidate
(a reason string; stricter: names, dunders, size, the parent's RUNNER_OWNS, --prompt-only). Plus what --prompt-only compares
(`strings_blanked`) and what counts as a duplicate (`normalized`)."""

import ast
from pathlib import Path

from lib.failures import skill_problem

ALLOWED_IMPORTS = ("re", "json", "math", "random", "string", "collections", "itertools", "functools",
                   "textwrap", "dataclasses", "typing")
# names that reach files, code execution or the interpreter's internals; the runner sandboxes harness
# code anyway, this catches the obvious attempts before any rollout is spent
FORBIDDEN_NAMES = ("open", "exec", "eval", "compile", "__import__", "globals", "locals", "vars", "getattr",
                   "setattr", "delattr", "breakpoint", "input", "__builtins__", "__loader__", "__spec__")
MAX_HARNESS_CHARS = 100_000
# a harness may list the names that belong to the runner, not to the search (the paper chess h0: the official
# runner's loop and verifier messages, C/autoharness_chess_puzzle/runner.py): a candidate of such a parent binds
# each of them exactly as the parent does, the list itself included (`owned_change`)
RUNNER_OWNS = "RUNNER_OWNS"
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
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such harness file; pass an existing .py file such as harnesses/chess.py")
    if not path.is_file():  # a folder, a FIFO (reading it would block), a device
        raise ValueError(f"{path}: not a regular file; pass a harness .py file such as harnesses/chess.py")
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:  # unreadable, or not text
        why = e.strerror if isinstance(e, OSError) else f"not UTF-8 text: {e.reason} at byte {e.start}"
        raise ValueError(f"{path}: cannot read the harness ({why}): pass a readable Python file") from None
    try:
        tree = ast.parse(source, str(path))
    except (SyntaxError, ValueError) as e:  # a NUL byte: SyntaxError without a line, ValueError on Python 3.11.2
        where = f"{path}:{e.lineno}" if getattr(e, "lineno", None) else str(path)
        raise ValueError(f"{where}: {parse_failure(e)}; fix the harness so that it compiles") from None
    for node in ast.walk(tree):
        bad = forbidden_import(node)
        if bad:
            bad = "." if bad.startswith(".") else bad  # the runner names any relative import '.'
            raise ValueError(f"{path}:{node.lineno}: imports {bad!r}; a harness may import only "
                             f"{', '.join(ALLOWED_IMPORTS)}")
    if not any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body):
        raise ValueError(f"{path}:1: no top-level function run; define run(task, llm, tools) returning "
                         "{'answer': ...}")
    found = space_misfit(tree) or skill_misfit(tree)
    if found:
        raise ValueError(f"{path}:{found[0]}: {found[1]}")
    return source


def top_level_assigns(tree):
    """{name: its last top-level `name = ...` statement}: the file's knobs as mutate reads and rewrites them."""
    return {n.targets[0].id: n for n in tree.body if isinstance(n, ast.Assign) and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name)}


def space_misfit(tree):
    """(line, why) when SEARCH_SPACE is not a literal dict of lists (or tuples), or names a key that is no knob of
    the file (a typo: mutate could never set it), else None: either way mutate would silently try nothing there."""
    assigns = top_level_assigns(tree)
    if "SEARCH_SPACE" not in assigns:
        return None
    try:
        space = ast.literal_eval(assigns["SEARCH_SPACE"].value)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        space = None
    if not (isinstance(space, dict) and all(isinstance(values, (list, tuple)) for values in space.values())):
        return (assigns["SEARCH_SPACE"].lineno, "SEARCH_SPACE must be a literal dict, {KNOB: [values]}: mutate "
                "reads it with ast.literal_eval, so built any other way it reads as empty")
    knobs = [name for name in assigns if name.isupper() and name not in ("SEARCH_SPACE", "SKILL", RUNNER_OWNS)]
    for key in space:
        if key not in assigns:
            return (assigns["SEARCH_SPACE"].lineno, f"SEARCH_SPACE names {key!r}, which is no knob of this file (a "
                    f"top-level NAME = value); its knobs: {', '.join(knobs) or 'none'}")
    return None


def skill_misfit(tree):
    """(line, why) when the file declares a SKILL (failure kind -> knobs, read by the offline proposer) that
    names a kind that does not exist or a knob that is not in its SEARCH_SPACE, else None."""
    assigns = top_level_assigns(tree)
    if "SKILL" not in assigns:
        return None
    try:
        skill = ast.literal_eval(assigns["SKILL"].value)
        space = ast.literal_eval(assigns["SEARCH_SPACE"].value) if "SEARCH_SPACE" in assigns else {}
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return assigns["SKILL"].lineno, "SKILL and SEARCH_SPACE must be literal dicts"
    why = skill_problem(skill, space if isinstance(space, dict) else {})
    return (assigns["SKILL"].lineno, why) if why else None


def check_harness_fits(path, domain_name, tool_methods):
    """-> the harness source; check_harness's checks, then the harness against its domain, before any model
    loads (each CLI calls it with its --domain): raises ValueError naming the file, the line and the fix."""
    source = check_harness(path)
    found = domain_misfit(ast.parse(source), tool_methods)
    if found:
        lineno, why = found
        raise ValueError(f"{path}:{lineno}: {why}, but {domain_name} offers {tool_list(tool_methods)}: pass a "
                         f"{domain_name} harness such as harnesses/{domain_name}.py")
    return source


def tool_list(tool_methods):
    return " and ".join(f"tools.{m}" for m in tool_methods) or "no tools"


def domain_misfit(tree, tool_methods):
    """(line, what) of the first thing a harness does that its domain cannot serve, else None. Static and
    exact on what the file spells out: (1) every attribute it reads off the tools object (run's third
    parameter, or a name `tools` anywhere, as helpers are passed it) is one of the domain's TOOL_METHODS
    (searchqa: search, math: python, chess: move); (2) run() answers with a dict holding 'answer': every
    return in run's own body that is written out as a literal is such a dict (a name or a call may be one,
    so it passes), and run has a return at all."""
    run = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"][-1]
    names = {"tools"} | ({run.args.args[2].arg} if len(run.args.args) >= 3 else set())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names \
                and node.attr not in tool_methods:
            return node.lineno, f"calls tools.{node.attr}"
    returns = [n for n in own_nodes(run) if isinstance(n, ast.Return)]
    if not returns:
        return run.lineno, "run() never returns, so it answers None instead of {'answer': ...}"
    for node in returns:
        why = not_an_answer(node.value)
        if why:
            return node.lineno, f"run() returns {why}, not a dict with an 'answer' key"
    return None


def own_nodes(function):
    """The nodes of a function's body, without those of the functions and classes defined inside it."""
    todo = list(function.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def not_an_answer(value):
    """What a literal return value is when it cannot be {'answer': ...}; None when it is one or may be one."""
    if value is None or isinstance(value, ast.Constant):
        return repr(value.value) if value is not None else "nothing"
    if isinstance(value, ast.IfExp):
        return not_an_answer(value.body) or not_an_answer(value.orelse)
    if isinstance(value, ast.Dict):
        keys = [k.value if isinstance(k, ast.Constant) else None for k in value.keys]
        spread = any(k is None for k in value.keys)  # {**other}: may bring the key
        return None if spread or "answer" in keys or None in keys else f"a dict of {', '.join(map(repr, keys))}"
    if isinstance(value, (ast.List, ast.Tuple, ast.Set, ast.JoinedStr, ast.ListComp, ast.SetComp,
                          ast.GeneratorExp)):
        return f"a {type(value).__name__.lower()}"
    return None


def parse_failure(e):
    """One line for a source that does not parse, whatever ast.parse raised."""
    if isinstance(e, SyntaxError) and e.lineno:
        return f"syntax error: line {e.lineno}: {e.msg}"
    if isinstance(e, (SyntaxError, ValueError)):  # no line: the whole source (Python 3.11.2: ValueError)
        return f"syntax error: {e.msg if isinstance(e, SyntaxError) else e}"
    return f"syntax error: {type(e).__name__}" + (f": {e}" if str(e) else " (the parser gave up: too deeply nested?)")


def static_check(source, parent_source=None, prompt_only=False, domain=None):
    """None when the candidate may be run, else the reason it is rejected (domain: its domain, whose
    BANNED_IMPORTS are refused with its own reason)."""
    if not source or not source.strip():
        return "no code: the candidate file is missing or empty"
    if len(source) > MAX_HARNESS_CHARS:
        return f"too large: {len(source)} characters (max {MAX_HARNESS_CHARS})"
    try:
        tree = ast.parse(source)
    except RecursionError:
        raise  # meta_harness.validate's own reason: too deeply nested
    except Exception as e:  # any parse failure is the candidate's (a NUL byte: SyntaxError, ValueError on 3.11.2)
        return parse_failure(e)
    runs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    if not runs or [a.arg for a in runs[-1].args.args] != ["task", "llm", "tools"] or runs[-1].args.vararg \
            or runs[-1].args.kwonlyargs or runs[-1].args.kwarg or runs[-1].args.posonlyargs:
        return "no run: the file must define a top-level def run(task, llm, tools)"
    for node in ast.walk(tree):
        bad = forbidden_import(node)
        if bad and bad.split(".")[0] in getattr(domain, "BANNED_IMPORTS", ()):
            return domain.BANNED_WHY.format(module=bad)
        if bad:
            return f"forbidden import: {bad} (allowed: {', '.join(ALLOWED_IMPORTS)})"
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            return f"forbidden name: {node.id} (line {node.lineno})"
        if isinstance(node, ast.Attribute) and node.attr.startswith("__") and node.attr.endswith("__"):
            return f"forbidden attribute: .{node.attr} (line {node.lineno})"
    found = space_misfit(tree) or skill_misfit(tree)
    if found:
        return f"{found[1]} (line {found[0]})"
    found = owned_change(tree, parent_source)
    if found:
        return (f"runner-owned: changes {found[0]} (line {found[1]}), which the parent's {RUNNER_OWNS} keeps as the "
                "runner's: change only the other names (chess: the prompts, observation, parse_action, the retry "
                "budgets and MAX_TURNS)")
    if prompt_only and parent_source is not None and strings_blanked(source) != strings_blanked(parent_source):
        return ("prompt-only violation: the candidate changes more than its parent's prompt text (top-level "
                "*_PROMPT / *_TEMPLATE string constants and docstrings)")
    return None


def owned_change(tree, parent_source):
    """(name, line) of the first name of the parent's RUNNER_OWNS that the candidate binds otherwise than the parent
    does (a name the parent never binds, such as a builtin its loop calls, stays unbound), else None. None as well
    when the parent lists none or does not parse."""
    try:
        parent = ast.parse(parent_source or "")
    except (SyntaxError, ValueError):
        return None
    owned = [n.value for n in parent.body if isinstance(n, ast.Assign) and len(n.targets) == 1
             and isinstance(n.targets[0], ast.Name) and n.targets[0].id == RUNNER_OWNS]
    if not owned:
        return None
    try:
        names = [RUNNER_OWNS, *ast.literal_eval(owned[-1])]
    except (ValueError, TypeError, SyntaxError):
        return None
    for name in names:
        theirs, ours = binding_statements(parent, name), binding_statements(tree, name)
        if [ast.dump(n) for n in theirs] != [ast.dump(n) for n in ours]:
            changed = next((o for t, o in zip(theirs, ours) if ast.dump(t) != ast.dump(o)), (ours or [tree])[-1])
            return name, getattr(changed, "lineno", 1)
    return None


def binding_statements(tree, name):
    """The top-level statements that bind `name` anywhere inside them (a def, an assignment or deletion, an import,
    a global declaration, an except ... as), in file order."""
    def binds(node):
        return (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name
                or isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load)
                or isinstance(node, ast.alias) and (node.asname or node.name.split(".")[0]) == name
                or isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names
                or isinstance(node, ast.ExceptHandler) and node.name == name)
    return [stmt for stmt in tree.body if any(binds(n) for n in ast.walk(stmt))]


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
    except (SyntaxError, ValueError):
        return None
