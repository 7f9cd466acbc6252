"""install.sh's refusals: each stops before installing anything, with one line naming the fix.
python -m pytest -q tests/test_install.py"""
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_install(tmp_path, *args, **env):
    """install.sh copied alone into tmp_path (so no .venv/ lands in the repo), with no environment active."""
    shutil.copy(os.path.join(ROOT, "install.sh"), tmp_path / "install.sh")
    base = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHON", "PYTHONPATH")}
    return subprocess.run(["bash", str(tmp_path / "install.sh"), *args], capture_output=True, text=True,
                          env={**base, **env}, timeout=60)


def fake_python(path, version):
    """An interpreter that answers install.sh's version question with `version`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return str(path)


def test_missing_venv_names_the_debian_package(tmp_path):
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "ensurepip.py").write_text("raise ImportError('stripped, as on Debian without python3-venv')\n")
    done = run_install(tmp_path, PYTHON=sys.executable, PYTHONPATH=str(stub))
    version = "%d.%d" % sys.version_info[:2]
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and f"apt install python{version}-venv" in done.stderr
    assert not (tmp_path / ".venv").exists()


def test_unsupported_python_says_which_is_supported(tmp_path):
    done = run_install(tmp_path, PYTHON=fake_python(tmp_path / "bin" / "python3", "3.12"))
    assert done.returncode == 1
    assert "Python 3.12" in done.stderr and "supports Python 3.11 only" in done.stderr
    assert "PYTHON=python3.11 bash install.sh" in done.stderr
    assert not (tmp_path / ".venv").exists()


def test_active_environment_is_used_and_checked(tmp_path):
    env = tmp_path / "active-env"
    fake_python(env / "bin" / "python", "3.12")
    done = run_install(tmp_path, VIRTUAL_ENV=str(env))
    assert f"installing into the active environment {env}" in done.stdout
    assert done.returncode == 1 and f"{env} has Python 3.12" in done.stderr
    assert not (tmp_path / ".venv").exists()


def test_unknown_argument(tmp_path):
    done = run_install(tmp_path, "--cuda")
    assert done.returncode == 1 and "bash install.sh --gpu" in done.stderr
