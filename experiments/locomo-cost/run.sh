#!/usr/bin/env bash
# experiments/locomo-cost/run.sh — issue 39's end-to-end token comparison on LoCoMo. NOT YET RUN.
#
# Three arms on the same questions, paired: full-context (the whole conversation in the prompt),
# baseline (search + get_by_doc_id over the sessions), in-context (get_context over the KIs extracted
# from the sessions). N questions (default 20) sampled (seeded) from EACH of conversations 26 and 30,
# every session of both conversations a document (SESSIONS=0).
#
# Steps (each resumable: rerun the script, or run some with STEPS="..."; finished work is skipped —
# kitune eval resumes a run from its traces, kitune extract from its state file):
#   prepare       data folder: both conversations' sessions + the question sample (prepare.py of locomo-conv1)
#   bootstrap     kitune bootstrap: the dialogue extractor drafted and registered as production
#   extract       kitune extract of all sessions with that extractor
#   full-context  arm 1            baseline  arm 2            in-context  arm 3
#   report        kitune report over the three runs: accuracy, input tokens per question and per correct
#                 answer with intervals, in-context / baseline ratio, tokens by component
#   dev           (not in the default STEPS) in-context vs baseline on loop-dev-48's 24 validation questions,
#                 its committed KIs loaded into a fresh table, then kitune report into $EXP/report-dev
#
# Usage (repository root, venv active, the embedded model installed):
#   bash experiments/locomo-cost/run.sh
#   N=20 SEED=17 STEPS="prepare extract" bash experiments/locomo-cost/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

EXP=experiments/locomo-cost
CFG=$EXP/config.yaml
CONVS=${CONVS:-"26 30"}
N=${N:-20}
SEED=${SEED:-17}
SESSIONS=${SESSIONS:-0}
export KITUNE_WORKDIR=${KITUNE_WORKDIR:-kitune-work/locomo-cost}
export LITELLM_LOCAL_MODEL_COST_MAP=True
DATA=$KITUNE_WORKDIR/data
PREFIX=locomo-cost-
STEPS=${STEPS:-"prepare bootstrap extract full-context baseline in-context report"}
PY=${PYTHON:-python}
mkdir -p "$EXP/logs"

table_of_production() {  # the KI table of the production extractor: <store.table>-<sha8>
  "$PY" - "$CFG" <<'PY'
import sys
from kitune.config import load_config
from kitune.programs.instructions import instruction_version, prompt_name
from kitune.tracking.prompts import PromptRegistry
cfg = load_config(sys.argv[1])
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
      mkdir -p "$DATA"
      : > "$DATA/corpus.jsonl"; : > "$DATA/ground_truth.jsonl"; : > "$DATA/queries.tsv"; : > "$DATA/qrel_evidence.txt"
      for c in $CONVS; do
        run_step "prepare-$c" "$PY" experiments/locomo-conv1/prepare.py --conversation "$c" --n "$N" --seed "$SEED" \
          --sessions "$SESSIONS" --out "$KITUNE_WORKDIR/conv$c" --sample-out "$EXP/sample-$c.json"
        for f in corpus.jsonl ground_truth.jsonl queries.tsv qrel_evidence.txt; do
          cat "$KITUNE_WORKDIR/conv$c/$f" >> "$DATA/$f"
        done
      done ;;
    bootstrap)
      if [[ -f $KITUNE_WORKDIR/bootstrap/report.json ]]; then echo "bootstrap: done"; continue; fi
      run_step bootstrap kitune bootstrap -c "$CFG" --corpus "$DATA" --seed "$SEED" --sample-size 4 \
        --out "$KITUNE_WORKDIR/bootstrap"
      mkdir -p "$EXP/bootstrap" && cp "$KITUNE_WORKDIR"/bootstrap/*.{md,json,txt,diff} "$EXP/bootstrap/" 2>/dev/null || true ;;
    extract)
      T=$(table_of_production)
      KITUNE_STORE__TABLE=$T run_step extract kitune extract -c "$CFG" --data "$DATA" --prompt-alias production --no-progress ;;
    full-context)
      run_step full-context kitune eval -c "$CFG" --skill full-context --data "$DATA" --run-name "${PREFIX}full-context" --concurrency 1 ;;
    baseline)
      run_step baseline kitune eval -c "$CFG" --skill baseline --data "$DATA" --run-name "${PREFIX}baseline" --concurrency 1 ;;
    in-context)
      T=$(table_of_production)
      KITUNE_STORE__TABLE=$T run_step in-context kitune eval -c "$CFG" --skill in-context --data "$DATA" \
        --run-name "${PREFIX}in-context" --concurrency 1 ;;
    report)
      R=$KITUNE_WORKDIR/runs
      run_step report kitune report "$R/${PREFIX}baseline" "$R/${PREFIX}in-context" "$R/${PREFIX}full-context" \
        --out "$EXP/report" ;;
    dev)
      # The data folder of loop-dev-48's slice: its 24 validation questions, the documents its extraction
      # read (so search and the KIs see the same 106 documents), lines copied verbatim from the dev split.
      DEVD=$KITUNE_WORKDIR/dev-slice
      run_step dev-prepare "$PY" - "$DEVD" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
spec = json.loads(Path("experiments/loop-dev-48/questions.json").read_text())
src, keep = Path(spec["data"]), set(spec["validation"])
docs = {json.loads(l)["docid"] for f in Path("experiments/loop-dev-48/extractions").glob("*.jsonl")
        for l in f.read_text().splitlines() if l.strip()}
def copy(name, ok):
    lines = [l for l in (src / name).read_text(encoding="utf-8").splitlines() if l.strip() and ok(l)]
    (out / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)
n_docs = copy("corpus.jsonl", lambda l: json.loads(l)["docid"] in docs)
n_q = copy("ground_truth.jsonl", lambda l: json.loads(l)["query_id"] in keep)
copy("queries.tsv", lambda l: l.split("\t", 1)[0] in keep)
for name in ("qrel_evidence.txt", "qrel_golds.txt"):
    if (src / name).is_file():
        copy(name, lambda l: l.split()[0] in keep)
print(f"dev slice: {n_docs} documents, {n_q} validation questions in {out}")
PY
      run_step dev-index kitune index experiments/loop-dev-48/kis/kis-d6e68232.jsonl -c "$EXP/dev.yaml"
      for skill in baseline in-context; do
        run_step "dev-$skill" kitune eval -c "$EXP/dev.yaml" --skill "$skill" --data "$DEVD" \
          --run-name "dev-cost-$skill" --concurrency 1
      done
      run_step dev-report kitune report "$KITUNE_WORKDIR/runs/dev-cost-baseline" \
        "$KITUNE_WORKDIR/runs/dev-cost-in-context" --out "$EXP/report-dev" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
