#!/usr/bin/env bash
# Install kitune with its test extras (server, elasticsearch, dev and local: the tests import every
# package the source imports, xllamacpp included) into ./.venv (created if missing), then run the checks CI
# runs: ruff (lint), ruff format --check, strict mypy, and the test suite. Tests never reach a
# network or a real LLM; they read the shared data from ../shared/data.
# The install uses the exact versions in constraints/py3XY.txt for the venv's Python (3.11 and
# 3.13 are tested; another version installs the newest versions pyproject.toml allows, with a
# warning).
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -x tests/optimizers_tests`).
# Environment: PYTHON (interpreter that creates the venv, default python3.11), KITUNE_VENV (venv
# folder, default .venv), KITUNE_SKIP_LINT=1 (only the tests).
set -euo pipefail
cd "$(dirname "$0")/.."

# An interpreter that runs: pyenv's shim for a version that is installed but not selected exits
# non-zero, so `command -v` alone is not enough; fall back to pyenv's own folders, then python3.
runs() { "$1" -c 'import sys' >/dev/null 2>&1; }
find_python() {
  local want="$1" cand
  if runs "$want"; then echo "$want"; return; fi
  for cand in "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/"${want#python}"*/bin/"$want"; do
    if runs "$cand"; then echo "$cand"; return; fi
  done
  return 1
}
PY=$(find_python "${PYTHON:-python3.11}") || {
  if [ -n "${PYTHON:-}" ]; then echo "scripts/test.sh: cannot run PYTHON=$PYTHON" >&2; exit 1; fi
  PY=python3
}
VENV="${KITUNE_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
export LITELLM_LOCAL_MODEL_COST_MAP=True PIP_DISABLE_PIP_VERSION_CHECK=1

PYVER=$("$VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
CONSTRAINTS="constraints/py$PYVER.txt"
if [ -f "$CONSTRAINTS" ]; then
  CFLAGS=(-c "$CONSTRAINTS")
else
  echo "scripts/test.sh: no $CONSTRAINTS (tested: $(ls constraints)); installing the newest versions pyproject.toml allows" >&2
  CFLAGS=()
fi
echo "== install ($("$VENV/bin/python" -V), ${CFLAGS[*]:-no constraints}) into $VENV"
LOG=$(mktemp)
if ! "$VENV/bin/python" -m pip install -q "${CFLAGS[@]}" -e '.[server,elasticsearch,dev,local]' >"$LOG" 2>&1; then
  grep -v '^WARNING: Location' "$LOG" >&2; rm -f "$LOG"; exit 1
fi
rm -f "$LOG"
"$VENV/bin/python" -c "import kitune, dspy, lancedb, fastapi" # fail fast if the install is broken
if [ "${KITUNE_SKIP_LINT:-0}" != "1" ]; then
  echo "== ruff check"; "$VENV/bin/ruff" check src tests benchmarks scripts experiments
  echo "== ruff format --check"; "$VENV/bin/ruff" format --check src tests benchmarks scripts experiments
  echo "== mypy (strict)"; "$VENV/bin/mypy"
fi
echo "== pytest"
"$VENV/bin/python" -m pytest "$@"
