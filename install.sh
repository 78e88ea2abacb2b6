#!/usr/bin/env bash
# Installs specdecode and its dependencies. On a machine without torch it first installs the CPU
# build of torch 2.13.0 (the wheel on these machines' disk), so that pip never resolves the plain
# "torch" requirement to a multi-GB CUDA build. A machine that already has torch (CUDA or not) keeps it.
# Usage: ./install.sh [EXTRAS]     e.g. ./install.sh test
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install --quiet "torch==2.13.0"
fi
extras=${1:-}
if [ -n "$extras" ]; then
    "$PY" -m pip install --quiet -e ".[$extras]"
else
    "$PY" -m pip install --quiet -e .
fi
