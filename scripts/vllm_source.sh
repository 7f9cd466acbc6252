#!/usr/bin/env bash
# The pinned vLLM's Python source, for the CPU checks that run vLLM's own code without importing it
# (tests/test_vllm_keys.py: its LoRA name mapping, its EngineArgs): the wheel of requirements-gpu.txt's vllm
# version from PyPI (about 340 MB, downloaded once and deleted), its .py files unpacked into
# $WHALE_CACHE/vllm-VERSION-src (default ~/.cache/whale), about 40 MB. Nothing is installed or imported.
#
#     bash scripts/vllm_source.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$(sed -n 's/^vllm==//p' requirements-gpu.txt)
DEST=${WHALE_CACHE:-$HOME/.cache/whale}/vllm-$VERSION-src
if [ -f "$DEST/vllm/_version.py" ]; then echo "vllm $VERSION source already in $DEST"; exit 0; fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 -m pip download -q --no-deps -d "$TMP" "vllm==$VERSION"
mkdir -p "$TMP/src"
python3 - "$TMP" <<'PY'
import sys, zipfile
from pathlib import Path
tmp = Path(sys.argv[1])
[wheel] = tmp.glob("vllm-*.whl")
with zipfile.ZipFile(wheel) as z:
    z.extractall(tmp / "src", [n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")])
PY
rm -rf "$DEST" && mv "$TMP/src" "$DEST"
echo "vllm $VERSION source in $DEST"
