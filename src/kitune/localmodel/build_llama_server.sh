#!/usr/bin/env bash
# Compile llama.cpp's llama-server for THIS CPU, once, into the kitune cache (`kitune lm build`,
# `scripts/install_local_model.sh --build-native`). Nothing else runs it: a first run uses the
# prebuilt xllamacpp wheel and compiles nothing.
#
# Source: llama.cpp as vendored by the pinned llama-cpp-python sdist (PyPI). CPU flags are read
# from /proc/cpuinfo (AVX-512 where present; AMX always off: the default build enables AMX and
# dies with "Illegal instruction" on CPUs without it). The binary lands in
#   $KITUNE_CACHE/bin/<key>/llama-server   (key = hash of version + flags; a build is never reused
#                                          on a CPU with other flags)
# with build.json beside it (version, the CPU flags it needs), which kitune's launcher reads.
# About 8 min on 2 cores.
#
# Usage: build_llama_server.sh [--rebuild] [--python-wheel]
#   --rebuild        rebuild even if cached
#   --python-wheel   also build the llama-cpp-python wheel (the fallback server) into
#                    $KITUNE_CACHE/wheels/<key>/ with the same flags (about 11 min)
# Prints the binary's path on its last line.
set -euo pipefail
LLAMA_VERSION="0.3.36"
CACHE="${KITUNE_CACHE:-$HOME/.cache/kitune}"
REBUILD=0
PY_WHEEL=0
PY="${PYTHON:-python}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rebuild) REBUILD=1; shift ;;
    --python-wheel) PY_WHEEL=1; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "kitune: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for tool in cmake c++ make; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "kitune: building llama-server needs $tool (and a C++17 compiler); install it, or keep the" \
         "prebuilt xllamacpp wheel (pip install 'kitune[local]'), which needs no build" >&2
    exit 1
  }
done
cpu_flags() { grep -m1 -E '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2 || true; }
FLAGS=" $(cpu_flags) "
onoff() { if [[ "$FLAGS" == *" $1 "* ]]; then echo ON; else echo OFF; fi; }
NEEDS=()
for f in avx avx2 fma f16c bmi2 avx512f avx512vbmi avx512_vnni avx512_bf16 avx_vnni; do
  [[ "$(onoff "$f")" == ON ]] && NEEDS+=("$f")
done
ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
ARGS+=" -DGGML_AVX=$(onoff avx) -DGGML_AVX2=$(onoff avx2) -DGGML_FMA=$(onoff fma)"
ARGS+=" -DGGML_F16C=$(onoff f16c) -DGGML_BMI2=$(onoff bmi2) -DGGML_AVX512=$(onoff avx512f)"
ARGS+=" -DGGML_AVX512_VBMI=$(onoff avx512vbmi) -DGGML_AVX512_VNNI=$(onoff avx512_vnni)"
ARGS+=" -DGGML_AVX512_BF16=$(onoff avx512_bf16) -DGGML_AVX_VNNI=$(onoff avx_vnni)"
KEY=$(echo "$LLAMA_VERSION $ARGS" | sha256sum | cut -c1-12)
BIN_DIR="$CACHE/bin/$KEY"
WHEEL_DIR="$CACHE/wheels/$KEY"
if [[ $REBUILD -eq 1 ]]; then rm -rf "$BIN_DIR" "$WHEEL_DIR"; fi
SRC="$CACHE/src/llama-cpp-python-$LLAMA_VERSION"
fetch_source() {  # the pinned sdist from PyPI: llama.cpp's source as this release vendors it
  if [[ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]]; then
    local tmp; tmp=$(mktemp -d)
    "$PY" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_VERSION" -d "$tmp" >/dev/null
    mkdir -p "$CACHE/src"
    tar -xzf "$tmp"/llama_cpp_python-"$LLAMA_VERSION".tar.gz -C "$CACHE/src"
    mv "$CACHE/src/llama_cpp_python-$LLAMA_VERSION" "$SRC"
    rm -rf "$tmp"
  fi
}
write_build_json() {
  local needs; needs=$(printf '"%s",' "${NEEDS[@]}"); needs="[${needs%,}]"
  printf '{"llama_cpp_python": "%s", "key": "%s", "cpu_flags": %s, "cmake_args": "%s"}\n' \
    "$LLAMA_VERSION" "$KEY" "$needs" "$ARGS" >"$BIN_DIR/build.json"
}
if [[ ! -x "$BIN_DIR/llama-server" ]]; then
  fetch_source
  echo "kitune: compiling llama-server from llama.cpp as vendored by llama-cpp-python $LLAMA_VERSION (about 8 min on 2 cores)"
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
  echo "kitune: using the cached llama-server in $BIN_DIR"
fi
write_build_json
if [[ $PY_WHEEL -eq 1 ]]; then
  if ! ls "$WHEEL_DIR"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    fetch_source
    echo "kitune: compiling llama-cpp-python $LLAMA_VERSION from source (about 11 min on 2 cores)"
    mkdir -p "$WHEEL_DIR"
    CMAKE_ARGS="$ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      "$PY" -m pip wheel --no-deps "$SRC" -w "$WHEEL_DIR"
  else
    echo "kitune: using the cached llama-cpp-python wheel in $WHEEL_DIR"
  fi
fi
echo "$BIN_DIR/llama-server"
