#!/usr/bin/env bash
# Install kitune with its test extras into ./.venv (created if missing) and run the test suite.
# Tests never reach a network or a real LLM; they read the shared data from ../shared/data.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
export LITELLM_LOCAL_MODEL_COST_MAP=True PIP_DISABLE_PIP_VERSION_CHECK=1
.venv/bin/python -m pip install -q -e '.[server,elasticsearch,dev]' 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import kitune, dspy, lancedb, fastapi" # fail fast if the install is broken
.venv/bin/python -m pytest "$@"
