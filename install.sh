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
# Suffix decoding runs on Snowflake's C++ suffix trees (arctic-inference), published as an sdist only.
# Its build would pull an unpinned (CUDA) torch into an isolated build environment, so it is built
# against the torch installed above, with its build tools. Optional: without it, --spec-type suffix
# says so and auto drafts with prompt lookup instead.
if ! "$PY" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
    # its build tools pin an old protobuf, which Ray Serve (the replicas extra) cannot run on: put back
    # the version the packages installed above chose
    pb=$("$PY" -c "import importlib.metadata as m; print(m.version('protobuf'))" 2>/dev/null || true)
    "$PY" -m pip install --quiet cmake ninja "nanobind==2.9.2" "protobuf==5.29.6" grpcio-tools &&
        "$PY" -m pip install --quiet --no-build-isolation "arctic-inference==0.3.0" ||
        echo "install.sh: arctic-inference did not build; --spec-type suffix is unavailable" >&2
    if [ -n "$pb" ]; then "$PY" -m pip install --quiet "protobuf==$pb"; fi
fi
