"""The NVIDIA driver against the CUDA 13 wheels: torch 2.14.0 and vllm 0.33.0 from PyPI are CUDA 13 builds, which
need driver 580 or newer. On an older driver torch sees no GPU at all, so this reads the driver from nvidia-smi.

    python lib/ops/driver.py install   # install.sh --gpu: one line and exit 1 when the driver is too old
    python lib/ops/driver.py preset    # run_all.sh: prints gpu or cpu; a GPU that torch cannot use is one line, exit 1

Standard library only (install.sh runs it before torch is installed); torch is imported for `preset` alone.
"""
import subprocess
import sys

MIN_DRIVER = 580  # CUDA 13.0's minimum Linux driver (NVIDIA's CUDA toolkit release notes)
CUDA_13 = 13000  # cuDriverGetVersion's number for CUDA 13.0
DRIVER_FIX = ("install an NVIDIA driver of the 580 branch or newer (your distribution's package, or NVIDIA's CUDA 13 "
              "driver), reboot, and rerun; or rent a machine that has one")


def gpus():
    """[(name, driver version)] of the GPUs nvidia-smi lists; [] without nvidia-smi or when it fails."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    rows = [line.rsplit(",", 1) for line in out.stdout.splitlines() if "," in line]
    return [(name.strip(), version.strip()) for name, version in rows]


def major(version):
    try:
        return int(version.split(".")[0])
    except ValueError:
        return None


def libcuda_version():
    """The CUDA version the libcuda this process loads runs (cuInit, then cuDriverGetVersion: 13000 for 13.0), or
    None where it does not load or start. A forward-compatibility package (cuda-compat, as NGC containers ship)
    runs CUDA 13 on a data-centre GPU whose kernel driver's number is below 580: only libcuda can say so."""
    import ctypes
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int(0)
    if lib.cuInit(0) != 0 or lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return version.value


def driver_problem(found):
    """One line naming the fix when the driver is older than the CUDA 13 wheels need (and no forward-compatibility
    libcuda runs CUDA 13 on it), else None."""
    if not found:
        return None
    name, version = found[0]
    if major(version) is not None and major(version) < MIN_DRIVER and (libcuda_version() or 0) < CUDA_13:
        return (f"NVIDIA driver {version} ({name}) is older than the CUDA 13 builds of torch 2.14.0 and vllm 0.33.0 "
                f"need (>= {MIN_DRIVER}), so torch would see no GPU: {DRIVER_FIX}")
    return None


def unusable_gpu(found, torch):
    """Why torch cannot use the GPU that nvidia-smi lists (call it when torch.cuda.is_available() is False)."""
    if not found:
        return None
    problem = driver_problem(found)
    if problem:
        return problem
    name, version = found[0]
    if torch.version.cuda is None:
        return (f"nvidia-smi lists {name} (driver {version}), but torch {torch.__version__} is a CPU build: "
                "bash install.sh --gpu")
    return (f"nvidia-smi lists {name} (driver {version}), but torch {torch.__version__} (CUDA {torch.version.cuda}) "
            "cannot use it: check CUDA_VISIBLE_DEVICES and that no other process holds the GPU in exclusive mode")


def main(argv):
    what = argv[1] if len(argv) > 1 else ""
    if what == "install":
        problem = driver_problem(gpus())
        if problem:
            sys.exit(f"install.sh: {problem}")
        return
    if what == "preset":
        import torch
        if torch.cuda.is_available():
            print("gpu")
            return
        why = unusable_gpu(gpus(), torch)
        if why:
            sys.exit(f"run_all.sh: no cpu preset on a GPU machine: {why}")
        print("cpu")
        return
    sys.exit("usage: python lib/ops/driver.py install|preset")


if __name__ == "__main__":
    main(sys.argv)
