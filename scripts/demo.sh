#!/usr/bin/env bash
# Install kitune with the embedded local model into ./.venv and run the main job:
# extract KIs from a small slice of ../shared/data/fixture, evaluate baseline vs in-context
# vs in-context + disambiguation KIs with a budgeted agent, run one optimisation round,
# log everything to MLflow (SQLite under ./kitune-work) and print the side-by-side table.
# Extra arguments go to `kitune demo` (see `kitune demo --help`), e.g. --questions 6.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
export LITELLM_LOCAL_MODEL_COST_MAP=True PIP_DISABLE_PIP_VERSION_CHECK=1
.venv/bin/python -m pip install -q -e '.[server]' 2>&1 | grep -v '^WARNING: Location' || true
PATH="$PWD/.venv/bin:$PATH" bash scripts/install_local_model.sh
exec .venv/bin/kitune demo "$@"
