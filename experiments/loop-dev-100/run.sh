#!/usr/bin/env bash
# Issue 36's loop on all 100 dev questions with the embedded local model (see README.md here).
#
# Run from the repository root:   bash experiments/loop-dev-100/run.sh [WORKDIR] [STEP...]
# (default WORKDIR kitune-work/loop-dev-100; default steps: every step in order). Resumable:
# rerun the same command after an interruption; every step continues where it stopped
# (extraction cache keyed by instruction + limits and document content, evaluation cache keyed
# by setting and store state, loop_state.json). After each step (and when a step fails)
# collect.py copies the records into this folder, so they are committed as the run goes. Each
# step's wall time and exit code is appended to timings.tsv with its exact command.
set -uo pipefail

HERE=experiments/loop-dev-100
WORK=${1:-kitune-work/loop-dev-100}
shift || true
STEPS=("$@")
KITUNE=${KITUNE:-kitune}
PY=${PY:-python}
RUN=loop-dev-100
export KITUNE_WORKDIR=$WORK
export DSPY_CACHEDIR=$WORK/dspy-cache        # lm.cache: true in the config; kept with the run
mkdir -p "$WORK/optimize/$RUN/extractions"
[ -f "$HERE/timings.tsv" ] || printf 'step\tstarted\tended\tseconds\texit\tcommand\n' > "$HERE/timings.tsv"

# Seed the extraction cache with loop-dev-48's committed extractions: same seed extractor, same
# limits (configs/experiments/loop-dev-100.yaml keeps loop-dev.yaml's extraction settings), so the
# documents it extracted are cache hits (keyed by instruction + limits and document content).
for f in experiments/loop-dev-48/extractions/*.jsonl; do
  dst="$WORK/optimize/$RUN/extractions/$(basename "$f")"
  [ -f "$dst" ] || cp "$f" "$dst"
done

COMMON=(
  --data ../shared/data/dev
  -c configs/experiments/loop-dev-100.yaml
  --questions 100 --distractors 20
  --programs extractor,rewriter,disambiguator
  --split stratified --measure stage --tune-agent --e2e-sample auto
  --run-name "$RUN" --no-progress
)

step() {  # step NAME COMMAND...: run, time, log, collect; stop the script when it fails
  local name=$1; shift
  if [ ${#STEPS[@]} -gt 0 ] && [[ ! " ${STEPS[*]} " == *" $name "* ]]; then return 0; fi
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

# 1. extract every evidence document of the 100 questions + 20 seeded distractors with the
#    starting extractor (cache hits for what loop-dev-48 extracted)
step extract "$KITUNE" optimize "${COMMON[@]}" --extract-only
# 2. iteration 0: stage metrics on all 50 + 50 questions, the agent on the 50 tuning questions
#    (their failures feed the feedback KIs) and on 20 seeded validation questions (the paired
#    end-to-end non-inferiority check), GEPA on extractor + rewriter (>= 8 proposals each:
#    optimize.min_proposals), feedback KIs through the gate, every change decided by the stage
#    decision rule (optimize.decision_rule: stage, the default); --iterations is the total, so a
#    rerun of a finished step does nothing
step iteration-0 "$KITUNE" optimize "${COMMON[@]}" --iterations 1
# 3. iteration 1
step iteration-1 "$KITUNE" optimize "${COMMON[@]}" --iterations 2
# 4. the final setting against the seed setting end to end on all 50 validation questions
step final "$KITUNE" optimize "${COMMON[@]}" --iterations 2 --final-eval
echo "done: records in $HERE (commit them), work folder $WORK"
