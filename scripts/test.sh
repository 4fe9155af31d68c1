#!/usr/bin/env bash
# Install kitune with its test extras into ./.venv (created if missing), then run the checks CI
# runs: ruff (lint), ruff format --check, strict mypy, and the test suite. Tests never reach a
# network or a real LLM; they read the shared data from ../shared/data.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -x tests/optimizers_tests`);
# KITUNE_SKIP_LINT=1 runs only the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
export LITELLM_LOCAL_MODEL_COST_MAP=True PIP_DISABLE_PIP_VERSION_CHECK=1
.venv/bin/python -m pip install -q -e '.[server,elasticsearch,dev]' 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import kitune, dspy, lancedb, fastapi" # fail fast if the install is broken
if [ "${KITUNE_SKIP_LINT:-0}" != "1" ]; then
  echo "== ruff check"; .venv/bin/ruff check src tests benchmarks scripts experiments
  echo "== ruff format --check"; .venv/bin/ruff format --check src tests benchmarks scripts experiments
  echo "== mypy (strict)"; .venv/bin/mypy
fi
echo "== pytest"
.venv/bin/python -m pytest "$@"
