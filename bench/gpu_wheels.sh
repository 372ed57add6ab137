#!/usr/bin/env bash
# Wheels of what inferd imports at serve time that the GPU machine's image lacks (or may hold too old),
# for CPython 3.12 on x86-64 Linux, into .gpu-wheels/ (git-ignored). Run it here, where PyPI is reachable;
# the GPU machine has no network, so the folder travels with the run (`carry: [".gpu-wheels"]`) and is
# installed there without an index (docs/gpu.md, "Run bench/gpu_check.py on a GPU machine"):
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu-wheels/*.whl
#   export PYTHONPATH=$PWD:/tmp/site
#
# The image already has torch, triton, transformers, safetensors, tokenizers, numpy, jinja2, uvloop,
# prometheus-client, tqdm and typing-extensions. Missing: msgspec, orjson, cryptography (+ cffi, pycparser).
# aiohttp travels too, with its own dependencies: inferd needs aiohttp >= 3.14 (web.RequestKey) and the
# image's version is not recorded. One version of each (two stop the install); the pins are the versions
# the development venv runs.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.gpu-wheels}
PYTHON=${PYTHON:-python3}
WHEELS=(
    msgspec==0.22.0 orjson==3.13.0
    cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
    aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 attrs==26.1.0 frozenlist==1.8.0
    multidict==7.2.1 propcache==0.5.4 yarl==1.25.1 idna==3.20
)
mkdir -p "$DEST"
for wheel in "${WHEELS[@]}"; do
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        -d "$DEST" "$wheel"
done
ls -l "$DEST"
du -sh "$DEST"
