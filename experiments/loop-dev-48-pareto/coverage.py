"""Answer coverage of the validation questions' gold documents: the seed extractor vs GEPA's candidate.

Reads a loop-dev-48-pareto work folder (no LLM call): the candidate's extraction state file says
which documents it has extracted so far, the KI tables ``kis-<seed>`` and ``kis-<candidate>`` hold
the KIs. Counts, per validation question whose gold documents the candidate has all extracted,
whether a KI of a gold document states the answer (kitune.evaluation.stage_metrics.ki_states_answer,
the loop's own rule; yes/no questions excluded), for both extractors on the same questions, with
the paired split (both / seed only / candidate only / neither) and KIs per document.

Usage: python experiments/loop-dev-48-pareto/coverage.py WORK SEED_SHA CANDIDATE_SHA > coverage.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kitune.config import load_config
from kitune.data.loaders import load_questions
from kitune.evaluation.stage_metrics import gold_documents, is_yes_no, ki_states_answer
from kitune.evaluation.summary import wilson_interval
from kitune.retrieval import create_store
from kitune.schema import Filter

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "experiments" / "loop-dev.yaml"


def _kis_by_doc(work: Path, table: str) -> dict[str, list]:
    cfg = load_config(CONFIG, {"workdir": str(work), "store": {"table": table}})
    store = create_store(cfg)
    out: dict[str, list] = {}
    try:
        for ki in store.iter_kis(Filter(statuses=("active",))):
            if ki.payload.subtype != "disambiguation":
                for d in ki.evidence_doc_ids:
                    out.setdefault(d, []).append(ki)
    finally:
        store.close()
    return out


def main(work: Path, seed: str, cand: str) -> None:
    run = work / "optimize" / "loop-dev-48"
    split = json.loads((run / "questions.json").read_text())
    val = {str(q) for q in split["validation"]}
    questions = [q for q in load_questions(split["data"]) if str(q.query_id) in val]
    state = work / "extraction" / f"dev.extractor-{cand}.state.jsonl"
    last = {}
    for line in state.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            last[rec["docid"]] = rec["status"]
    done = set(last)  # a failed document counts, with no KIs (as in the loop's own stage metric)
    failed = sorted(d for d, st in last.items() if st == "failed")
    seed_kis, cand_kis = _kis_by_doc(work, f"kis-{seed}"), _kis_by_doc(work, f"kis-{cand}")
    rows, split_counts = [], {"both": 0, "seed only": 0, "candidate only": 0, "neither": 0}
    for q in sorted(questions, key=lambda q: int(q.query_id)):
        docs = gold_documents(q)
        if not docs or is_yes_no(q) or not set(docs) <= done:
            continue
        s = any(ki_states_answer(k, q.golds) for d in docs for k in seed_kis.get(d, ()))
        c = any(ki_states_answer(k, q.golds) for d in docs for k in cand_kis.get(d, ()))
        key = "both" if s and c else "seed only" if s else "candidate only" if c else "neither"
        split_counts[key] += 1
        ns = sum(len(seed_kis.get(d, ())) for d in docs)
        nc = sum(len(cand_kis.get(d, ())) for d in docs)
        marks = ("✓" if s else "✗", "✓" if c else "✗")
        rows.append(f"| {q.query_id} | {len(docs)} | {marks[0]} ({ns} KIs) | {marks[1]} ({nc} KIs) |")
    n = len(rows)
    hs = split_counts["both"] + split_counts["seed only"]
    hc = split_counts["both"] + split_counts["candidate only"]
    print(
        f"Validation questions counted: {n} of {len(questions)} (gold documents all extracted by the "
        f"candidate so far: {len(done)} documents, failed {len(failed)}: {', '.join(failed) or 'none'}; "
        "yes/no questions excluded)\n"
    )
    if n:
        ls, hs_ = wilson_interval(hs, n)
        lc, hc_ = wilson_interval(hc, n)
        print(f"- seed extractor@{seed}: {hs}/{n} = {hs / n:.1%} [{ls:.1%}–{hs_:.1%}]")
        print(f"- candidate extractor@{cand}: {hc}/{n} = {hc / n:.1%} [{lc:.1%}–{hc_:.1%}]")
        print(f"- paired: {split_counts}\n")
    print("| question | gold documents | seed | candidate |\n|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
