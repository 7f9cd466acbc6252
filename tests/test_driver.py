"""The NVIDIA driver against the CUDA 13 wheels (lib/ops/driver.py), on a faked nvidia-smi: install.sh --gpu,
run_all.sh's preset choice and the preflight name the cause in one line instead of falling back to the cpu preset."""
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from lib.ops import driver
from lib.ops import preflight

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fake_smi(tmp_path, output, code=0):
    """A folder holding an nvidia-smi that prints `output`, to put first on PATH."""
    folder = tmp_path / "smi"
    folder.mkdir(exist_ok=True)
    (folder / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '%s\\n' '{output}'\nexit {code}\n")
    (folder / "nvidia-smi").chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}


OLD = "NVIDIA A100-SXM4-80GB, 535.104.05"
NEW = "NVIDIA H100 80GB HBM3, 580.65.06"


def test_the_driver_is_read_from_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setattr(driver, "libcuda_version", lambda: None)  # no forward compatibility (tested below)
    monkeypatch.setenv("PATH", fake_smi(tmp_path, OLD)["PATH"])
    assert driver.gpus() == [("NVIDIA A100-SXM4-80GB", "535.104.05")]
    why = driver.driver_problem(driver.gpus())
    assert "NVIDIA driver 535.104.05 (NVIDIA A100-SXM4-80GB)" in why and ">= 580" in why and "580 branch" in why
    assert driver.driver_problem([("H100", "580.65.06")]) is None and driver.driver_problem([]) is None
    cpu_torch = SimpleNamespace(__version__="2.14.0+cpu", version=SimpleNamespace(cuda=None))
    assert "is a CPU build: bash install.sh --gpu" in driver.unusable_gpu([("H100", "580.65.06")], cpu_torch)
    monkeypatch.setenv("PATH", fake_smi(tmp_path, "NVIDIA-SMI has failed", code=9)["PATH"])
    assert driver.gpus() == []  # a failing nvidia-smi: no GPU seen


def test_a_driver_below_580_passes_where_forward_compatibility_runs_cuda_13(monkeypatch):
    """An NGC-style container: the kernel driver is 535, but its cuda-compat libcuda runs CUDA 13.0 (cuInit
    succeeds, cuDriverGetVersion says 13000): nothing to refuse. A libcuda of 12.8, or none, is refused."""
    class FakeLibcuda:
        def __init__(self, version, init=0):
            self.version, self.init = version, init

        def cuInit(self, flags):
            return self.init

        def cuDriverGetVersion(self, ref):
            ref._obj.value = self.version
            return 0

    import ctypes
    for lib, want in ((FakeLibcuda(13000), 13000), (FakeLibcuda(12080), 12080), (FakeLibcuda(13000, init=3), None)):
        monkeypatch.setattr(ctypes, "CDLL", lambda name, lib=lib: lib)
        assert driver.libcuda_version() == want
    monkeypatch.setattr(driver, "libcuda_version", lambda: 13000)
    assert driver.driver_problem([("NVIDIA H100 80GB HBM3", "535.104.05")]) is None
    for version in (12080, None):
        monkeypatch.setattr(driver, "libcuda_version", lambda: version)
        assert "NVIDIA driver 535.104.05" in driver.driver_problem([("NVIDIA H100 80GB HBM3", "535.104.05")])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine whose torch sees no GPU")
def test_run_all_never_falls_back_to_cpu_on_a_gpu_torch_cannot_use(tmp_path):
    for smi, cause in ((OLD, "NVIDIA driver 535.104.05"), (NEW, "is a CPU build: bash install.sh --gpu")):
        done = subprocess.run(["bash", "run_all.sh"], cwd=ROOT, env=fake_smi(tmp_path, smi), capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 1 and done.stdout == "", done.stderr
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("run_all.sh: no cpu preset on a GPU machine: ")
        assert cause in done.stderr
    smi = fake_smi(tmp_path, "NVIDIA-SMI has failed", code=9)  # no GPU at all: the cpu preset, as before
    done = subprocess.run([sys.executable, "lib/ops/driver.py", "preset"], cwd=ROOT, env=smi, capture_output=True,
                          text=True)
    assert done.returncode == 0 and done.stdout == "cpu\n"


def test_install_gpu_stops_on_an_old_driver_before_installing_anything(tmp_path):
    shutil.copy(os.path.join(ROOT, "install.sh"), tmp_path / "install.sh")
    (tmp_path / "lib" / "ops").mkdir(parents=True)
    for name in ("driver.py", "compiler.py"):  # install.sh --gpu's two stdlib checks (compiler.py passes here)
        shutil.copy(os.path.join(ROOT, "lib", "ops", name), tmp_path / "lib" / "ops" / name)
    env = {k: v for k, v in fake_smi(tmp_path, OLD).items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    done = subprocess.run(["bash", str(tmp_path / "install.sh"), "--gpu"], capture_output=True, text=True,
                          env={**env, "PYTHON": sys.executable}, timeout=60)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert done.stderr.startswith("install.sh: NVIDIA driver 535.104.05") and "580" in done.stderr
    assert not (tmp_path / ".venv").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine whose torch sees no GPU")
def test_the_preflight_names_the_driver_for_runs_that_need_the_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_smi(tmp_path, OLD)["PATH"])
    gpu_run = SimpleNamespace(backend="vllm", preset="gpu", model="smoke", gpu_memory=0.45)
    with pytest.raises(preflight.Failed, match=r"^NVIDIA driver 535\.104\.05 .* \(>= 580\)"):
        preflight.check_gpu([gpu_run])
    cpu_run = SimpleNamespace(backend="hf", preset="cpu", model="smoke", gpu_memory=0.45)
    assert preflight.check_gpu([cpu_run]).startswith("no GPU (NVIDIA driver 535.104.05")
