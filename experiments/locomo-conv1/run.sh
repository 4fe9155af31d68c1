#!/usr/bin/env bash
# experiments/locomo-conv1/run.sh — LoCoMo, one conversation end to end with the embedded local model.
# NOT YET RUN (prepared while the machine was busy; see README.md).
#
# Steps (each resumable: rerun the script, or one step with STEPS="..."; finished work is skipped):
#   prepare       data folder for conversation $CONV + a seeded random sample of $N of its questions
#   bootstrap     kitune bootstrap: description, drafted extractor (registered as production), source KIs
#   extract       kitune extract of the conversation's sessions with that extractor (resume file)
#   full-context  arm 1: whole conversation in the prompt, question last (prompt cache), judged after
#   baseline      arm 2: search (10 hits x 3 snippets x <=700 chars) + get_by_doc_id over the sessions
#   in-context    arm 3: get_context over the extracted KIs (disambiguation KIs hidden)
#   loop          kitune optimize, 2 iterations, tune/validation split of the sample (optimize.seed)
#   disamb        arm 4: in-context + disambiguation KIs, on the validation questions, accepted extractor's KIs
#   coverage      evidence turns covered by KIs vs by reference observations (no LLM)
#   report        results.md (four arms by category, tokens vs full-context, cache), curves, per-question ids
#
# Usage (repository root, venv active):  bash experiments/locomo-conv1/run.sh
#   CONV=26 N=40 SEED=17 STEPS="prepare bootstrap" bash experiments/locomo-conv1/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

EXP=experiments/locomo-conv1
CFG=$EXP/config.yaml
CONV=${CONV:-26}
N=${N:-20}
SEED=${SEED:-17}
SESSIONS=${SESSIONS:-6}   # first K sessions (0: all 19): what 2 shared CPU cores could run in one session
export KITUNE_WORKDIR=${KITUNE_WORKDIR:-kitune-work/locomo-conv$CONV}
export LITELLM_LOCAL_MODEL_COST_MAP=True
DATA=$KITUNE_WORKDIR/data
PREFIX=conv$CONV-
LOOP=conv$CONV-loop
STEPS=${STEPS:-"prepare bootstrap extract full-context loop baseline coverage report"}
PY=${PYTHON:-python}
mkdir -p "$EXP/logs"

# The KI table of an extractor text: <store.table>-<sha8>, the table `kitune optimize` uses for that
# extractor version, so the loop's first iteration reuses what `extract` wrote.
table_of() {  # $1: production | loop
  "$PY" - "$CFG" "$1" "$KITUNE_WORKDIR/optimize/$LOOP/loop_state.json" <<'PY'
import json, sys
from pathlib import Path
from kitune.config import load_config
from kitune.tracking.prompts import PromptRegistry, prompt_name
from kitune.programs.instructions import instruction_version
cfg = load_config(sys.argv[1])
if sys.argv[2] == "loop" and Path(sys.argv[3]).is_file():
    text = json.loads(Path(sys.argv[3]).read_text())["current"]["prompts"]["extractor"]
else:
    text = PromptRegistry(cfg.mlflow_uri).get(prompt_name(cfg.corpus_name, "extractor"), "production").text
print(f"{cfg.store.table}-{instruction_version('extractor', text).split('@', 1)[1]}")
PY
}

run_step() {  # $1: name; the rest: the command. Appends wall time and exit code to timings.tsv.
  local name=$1; shift
  local t0=$SECONDS start rc=0
  start=$(date -u +%FT%TZ)
  echo "== $start step $name: $*" | tee -a "$EXP/logs/$name.log"
  "$@" 2>&1 | tee -a "$EXP/logs/$name.log" || rc=${PIPESTATUS[0]}
  printf '%s\t%s\t%s\t%s\n' "$name" "$start" "$((SECONDS - t0))" "$rc" >> "$EXP/timings.tsv"
  return "$rc"
}

for step in $STEPS; do
  case $step in
    prepare)
      run_step prepare "$PY" "$EXP/prepare.py" --conversation "$CONV" --n "$N" --seed "$SEED" --sessions "$SESSIONS" \
        --out "$DATA" --sample-out "$EXP/sample.json" ;;
    bootstrap)
      if [[ -f $KITUNE_WORKDIR/bootstrap/report.json ]]; then echo "bootstrap: done (remove $KITUNE_WORKDIR/bootstrap to redo)"; continue; fi
      run_step bootstrap kitune bootstrap -c "$CFG" --corpus "$DATA" --seed "$SEED" --sample-size 4 \
        --out "$KITUNE_WORKDIR/bootstrap"
      mkdir -p "$EXP/bootstrap" && cp "$KITUNE_WORKDIR"/bootstrap/*.{md,json,txt,diff} "$EXP/bootstrap/" 2>/dev/null || true ;;
    extract)
      T=$(table_of production)
      KITUNE_STORE__TABLE=$T run_step extract kitune extract -c "$CFG" --data "$DATA" --prompt-alias production --no-progress ;;
    full-context)
      run_step full-context kitune eval -c "$CFG" --skill full-context --data "$DATA" --run-name "${PREFIX}full-context" --concurrency 1 ;;
    baseline)
      run_step baseline kitune eval -c "$CFG" --skill baseline --data "$DATA" --run-name "${PREFIX}baseline" --concurrency 1 ;;
    in-context)
      T=$(table_of production)
      KITUNE_STORE__TABLE=$T run_step in-context kitune eval -c "$CFG" --skill in-context --data "$DATA" \
        --run-name "${PREFIX}in-context" --concurrency 1 ;;
    loop)
      run_step loop kitune optimize -c "$CFG" --data "$DATA" --iterations 2 --run-name "$LOOP" \
        --programs disambiguator --max-metric-calls 4 --distractors 0 --knob-trials 0 --feedback --no-progress ;;
    disamb)
      T=$(table_of loop)
      KITUNE_STORE__TABLE=$T run_step disamb kitune eval -c "$CFG" --skill in-context --disambiguation --split validation \
        --data "$DATA" --run-name "${PREFIX}in-context-disamb" --concurrency 1 ;;
    coverage)
      for side in production loop; do
        T=$(table_of "$side")
        KITUNE_STORE__TABLE=$T run_step "coverage-$side" "$PY" benchmarks/locomo_coverage.py --conversations "$CONV" --sessions "$SESSIONS" \
          --store-config "$CFG" --name "coverage.$side" --out-dir "$EXP"
      done ;;
    report)
      run_step report "$PY" "$EXP/report.py" --config "$CFG" --data "$DATA" --runs "$KITUNE_WORKDIR/runs" \
        --prefix "$PREFIX" --loop-dir "$KITUNE_WORKDIR/optimize/$LOOP" --out "$EXP" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
