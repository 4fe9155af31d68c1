#!/usr/bin/env bash
# Iteration 1 of experiments/loop-dev-48 again, extractor only, on the current code: GEPA's Pareto
# set now takes up to half of its examples from documents the current instruction gets wrong
# (229cfb9), and cut-off instructions are refused (aee5d8e). Does a learned extractor instruction
# raise answer coverage on the *validation* questions' gold documents, and then accuracy?
#
# Usage (repository root, venv active): bash experiments/loop-dev-48-pareto/run.sh WORK [SOURCE]
#   WORK    the work folder to run in (created from SOURCE when missing)
#   SOURCE  a loop-dev-48 work folder after its iteration 1 (caches: DSPy, extractions, evaluations,
#           the KI store as iteration 1 started); its loop state is rewound to the end of
#           iteration 0 from the records committed at 0b6b22c, so iteration 1 runs again.
# Resumable: rerun with the same WORK. Appends to experiments/loop-dev-48-pareto/timings.tsv.
set -uo pipefail
cd "$(dirname "$0")/../.."
WORK=${1:?usage: run.sh WORK [SOURCE]}
SOURCE=${2:-}
OUT=experiments/loop-dev-48-pareto
RUN=$WORK/optimize/loop-dev-48
if [ ! -d "$WORK" ]; then
  [ -n "$SOURCE" ] || { echo "run.sh: $WORK does not exist; give SOURCE, a loop-dev-48 work folder" >&2; exit 2; }
  cp -a "$SOURCE" "$WORK"
  for f in loop_state.json failure_ledger.json ki_credit.json; do
    git show "0b6b22c:experiments/loop-dev-48/$f" > "$RUN/$f"
  done
  rm -f "$RUN"/proposals/iteration-1.*
fi
export KITUNE_WORKDIR=$WORK DSPY_CACHEDIR=$WORK/dspy-cache
CMD=(kitune optimize --data ../shared/data/dev -c configs/experiments/loop-dev.yaml --questions 48
     --sample-seed 21 --distractors 4 --programs extractor --run-name loop-dev-48 --no-progress
     --iterations 2)
start=$(date -u +%FT%TZ); t0=$SECONDS
"${CMD[@]}" 2>&1 | tee -a "$OUT/run.log"
rc=${PIPESTATUS[0]}
printf '%s\t%s\t%s\t%s\t%s\t%s\n' iteration-1-extractor "$start" "$(date -u +%FT%TZ)" $((SECONDS - t0)) "$rc" "${CMD[*]}" >> "$OUT/timings.tsv"
mkdir -p "$OUT/proposals" "$OUT/evals"
cp "$RUN"/loop_state.json "$RUN"/curves.md "$RUN"/failure_ledger.md "$RUN"/ki_credit.json "$OUT"/ 2>/dev/null
cp "$RUN"/proposals/iteration-1.* "$OUT/proposals/" 2>/dev/null
cp "$RUN"/evals/stages-*.json "$OUT/evals/" 2>/dev/null
exit "$rc"
