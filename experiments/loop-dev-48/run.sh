#!/usr/bin/env bash
# The issue-21 loop on 48 dev questions with the embedded local model (see README.md here).
#
# Run from the repository root:   bash experiments/loop-dev-48/run.sh [WORKDIR]
# (default WORKDIR kitune-work/loop-dev-48). Resumable: rerun the same command after an
# interruption; every step continues where it stopped (extraction resume file + extraction cache,
# evaluation cache keyed by setting and store state, loop_state.json). After each step (and when a
# step fails) collect.py copies the records into this folder, so they can be committed as the run
# goes. Each step's wall time and exit code is appended to timings.tsv with its exact command.
set -uo pipefail

HERE=experiments/loop-dev-48
WORK=${1:-kitune-work/loop-dev-48}
KITUNE=${KITUNE:-kitune}
PY=${PY:-python}
RUN=loop-dev-48
export KITUNE_WORKDIR=$WORK
export DSPY_CACHEDIR=$WORK/dspy-cache        # lm.cache: true in the config; kept with the run
mkdir -p "$WORK"
[ -f "$HERE/timings.tsv" ] || printf 'step\tstarted\tended\tseconds\texit\tcommand\n' > "$HERE/timings.tsv"

COMMON=(
  --data ../shared/data/dev
  -c configs/experiments/loop-dev.yaml
  --questions 48 --sample-seed 21 --distractors 4
  --programs extractor,rewriter,disambiguator
  --run-name "$RUN" --no-progress
)

step() {  # step NAME COMMAND...: run, time, log, collect; stop the script when it fails
  local name=$1; shift
  local started ended rc
  started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local t0=$SECONDS
  echo "== $name: $*" | tee -a "$HERE/run.log"
  "$@" 2>&1 | tee -a "$HERE/run.log"
  rc=${PIPESTATUS[0]}
  ended=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$started" "$ended" "$((SECONDS - t0))" "$rc" "$*" >> "$HERE/timings.tsv"
  "$PY" "$HERE/collect.py" "$WORK" || echo "collect.py failed (records not copied)" >&2
  if [ "$rc" -ne 0 ]; then
    echo "== $name failed (exit $rc); rerun this script to resume" | tee -a "$HERE/run.log"
    exit "$rc"
  fi
}

# 1. extract the 48 questions' evidence documents + 4 distractors with the starting extractor
step extract "$KITUNE" optimize "${COMMON[@]}" --extract-only
# 2. iteration 0 (measure both splits, GEPA on extractor + rewriter + disambiguator, feedback
#    KIs through the gate, paired validation, decision); --iterations is the total, so a rerun
#    of a finished step does nothing
step iteration-0 "$KITUNE" optimize "${COMMON[@]}" --iterations 1
# 3. iteration 1
step iteration-1 "$KITUNE" optimize "${COMMON[@]}" --iterations 2
echo "done: records in $HERE (commit them), work folder $WORK"
