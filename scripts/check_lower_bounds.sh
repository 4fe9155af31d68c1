#!/usr/bin/env bash
# Install kitune with every DIRECT dependency at the lower bound pyproject.toml declares and every
# transitive one at the newest version the index serves (the mix a user gets who already has the
# old versions), into ./.venv-lower, then run a smoke subset of the suite. Not run by CI: CI's 3.11
# leg installs constraints/py311.txt, which pins the same floors but also fixes the transitive
# versions. Extra arguments replace the default pytest selection.
# Environment: PYTHON (default python3.11), KITUNE_VENV (default .venv-lower).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
"$PY" -c 'import sys' >/dev/null 2>&1 || PY=$(ls "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.11*/bin/python3.11 | head -1)
VENV="${KITUNE_VENV:-.venv-lower}"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
export LITELLM_LOCAL_MODEL_COST_MAP=True PIP_DISABLE_PIP_VERSION_CHECK=1
FLOORS=$(mktemp)
# every requirement of the core and the extras, its ">=X" (or "==X") turned into "==X"
"$VENV/bin/python" - "$FLOORS" <<'PY'
import re, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
reqs = list(project["dependencies"])
for extra in ("server", "elasticsearch", "dev"):
    reqs += project["optional-dependencies"][extra]
lines = []
for req in reqs:
    m = re.match(r"^([A-Za-z0-9_.\-]+)\s*(?:>=|==)\s*([^,;\s]+)", req)
    if not m:
        sys.exit(f"check_lower_bounds.sh: {req!r} has no lower bound")
    lines.append(f"{m[1]}=={m[2]}")
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
print(f"{len(lines)} direct dependencies at their lower bounds")
PY
LOG=$(mktemp)
if ! "$VENV/bin/python" -m pip install -q -c "$FLOORS" -e '.[server,elasticsearch,dev,local]' >"$LOG" 2>&1; then
  grep -v '^WARNING: Location' "$LOG" >&2; exit 1
fi
echo "== installed; versions that differ from constraints/py311.txt:"
diff <(grep -v '^#' constraints/py311.txt | sort -f) <("$VENV/bin/python" -m pip freeze --exclude-editable | grep -v '^#' | sort -f) | grep '^[<>]' || echo "(none)"
if [ $# -eq 0 ]; then
  set -- -q -p no:randomly tests/test_public_api.py tests/test_packaging.py tests/core_tests tests/lm_tests \
    tests/programs_tests tests/retrieval_tests/test_lance.py tests/tracking_tests tests/optimizers_tests/test_loop.py
fi
"$VENV/bin/python" -m pytest "$@"
