#!/usr/bin/env bash
# The watch loop over the embedded model's own unlabelled episodes (issue 23; see README.md here).
#
# Run from the repository root:   bash experiments/watch-unlabelled/run.sh
# Resumable: extraction resumes from its state file, and the other steps are idempotent. Each
# step's wall time and exit code is appended to results/steps.tsv with its exact command.
set -uo pipefail

HERE=experiments/watch-unlabelled
CFG=$HERE/config.yaml
WORK=kitune-work/watch-unlabelled            # = workdir in config.yaml
SLICE=$WORK/fixture-12
KITUNE=${KITUNE:-kitune}
PY=${PY:-python}
export LITELLM_LOCAL_MODEL_COST_MAP=True   # no network here: LiteLLM keeps its packaged cost map
mkdir -p "$HERE/results"
LOG=$HERE/results/steps.tsv
[ -f "$LOG" ] || printf 'step\tstarted\tended\tseconds\texit\tcommand\n' > "$LOG"

step() {  # step NAME COMMAND...: run, time, log; stop the script when it fails
  local name=$1; shift
  local started rc t0=$SECONDS
  started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  echo "== $name: $*" | tee -a "$HERE/results/run.log"
  "$@" 2>&1 | tee -a "$HERE/results/run.log"
  rc=${PIPESTATUS[0]}
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$started" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    "$((SECONDS - t0))" "$rc" "$*" >> "$LOG"
  if [ "$rc" -ne 0 ]; then
    echo "== $name failed (exit $rc); rerun this script to resume" | tee -a "$HERE/results/run.log"
    exit "$rc"
  fi
}

# 0. 12 fixture questions, their 28 evidence documents + 4 seeded distractors (written to the work folder)
step slice "$PY" "$HERE/slice.py" --data ../shared/data/fixture --questions 12 --distractors 4 --out "$SLICE"
# 1. the KIs and the embedded model's own in-context episodes (every role on the embedded model)
step extract "$KITUNE" extract --data "$SLICE" -c "$CFG"
step episodes "$KITUNE" eval --skill in-context --data "$SLICE" --run-name embedded-episodes -c "$CFG"
# 2. labels removed → one watch poll (signals, proposals) → one approved change and its effect
step watch "$PY" "$HERE/run.py" --episodes "$WORK/runs/embedded-episodes" --corpus "$SLICE" \
  -c "$CFG" --out "$HERE/results"
echo "done: records in $HERE/results (commit them)"
