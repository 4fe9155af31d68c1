"""LoCoMo evidence coverage: KIs vs the dataset's reference observations (issue 17, item 7).

For each question, its evidence turns (``evidence_dia_ids``, e.g. ``D3:5``, located in the
question's evidence sessions) are checked against two sets of per-session facts:

* **reference observations** — ``reference_observations.jsonl``, facts the LoCoMo authors
  generated per session with an LLM, each citing the turn(s) it came from (``dia_id``). An
  outside yardstick, not ground truth, and never loaded as if kitune had extracted it;
* **KIs** (optional) — a KI JSONL (one KI per line, the ``kis.jsonl`` shape) or the KIs of the
  configured store; a KI covers the turns it names (``D3:5`` in its text or properties, or a
  ``d3-5`` tag) and the turns its evidence spans quote verbatim
  (:func:`kitune.data.dialogue.ki_turn_ids`).

Reported: the share of a question's evidence turns covered by at least one fact (mean over
questions), the share of questions whose evidence turns are all covered, both overall and per
category, and facts per session (mean / median / min / max) on each side. No LLM, no network.

Usage::

    python benchmarks/locomo_coverage.py                      # reference side, all 5 conversations
    python benchmarks/locomo_coverage.py --conversations 26 --kis kis.jsonl --name locomo_coverage.conv26
    python benchmarks/locomo_coverage.py --conversations 26 --store-config cfg.yaml --questions ids.txt
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import machine_info, markdown_table, write_results

from kitune.data.dialogue import ki_turn_ids, parse_session
from kitune.data.loaders import Question, load_dataset
from kitune.schema import Document

LOCOMO = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "locomo"
Turn = tuple[str, str]
"""(doc id, turn id)."""


@dataclass(frozen=True)
class QuestionCoverage:
    """Coverage of one question's evidence turns."""

    query_id: str
    category: str
    evidence: tuple[Turn, ...]
    """Evidence turns located in the corpus (doc id, turn id)."""
    unresolved: tuple[str, ...]
    """Evidence turn ids not found in the question's evidence sessions."""
    covered_ref: tuple[Turn, ...]
    covered_ki: tuple[Turn, ...] | None
    """None when no KIs were given."""


def locate_evidence(q: Question, turns_of: Mapping[str, set[str]]) -> tuple[list[Turn], list[str]]:
    """Place each evidence turn id in the evidence session that holds it.

    Returns:
        ``(located, unresolved)``: located (doc id, turn id) pairs in question order, and the
        turn ids none of the question's evidence documents holds.
    """
    located: list[Turn] = []
    missing: list[str] = []
    for t in q.evidence_turns:
        docs = [d for d in q.evidence_docids if t in turns_of.get(d, set())]
        if docs:
            located.append((docs[0], t))
        else:
            missing.append(t)
    return located, missing


def reference_turns(path: Path, docids: set[str]) -> tuple[set[Turn], dict[str, int]]:
    """Turns cited by the reference observations of ``docids``, and observations per doc id."""
    covered: set[Turn] = set()
    per_doc: dict[str, int] = defaultdict(int)
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        obs = json.loads(line)
        docid = str(obs["docid"])
        if docid not in docids:
            continue
        per_doc[docid] += 1
        ids = obs.get("dia_id") or []
        for t in [ids] if isinstance(ids, str) else ids:
            covered.add((docid, str(t)))
    return covered, dict(per_doc)


def ki_turns(
    kis: Iterable[Mapping[str, Any]], texts: Mapping[str, str]
) -> tuple[set[Turn], dict[str, int], int]:
    """Turns covered by KIs, KIs per evidence doc id (of ``texts``), and KIs read.

    A KI citing two sessions counts once for each.
    """
    covered: set[Turn] = set()
    per_doc: dict[str, int] = defaultdict(int)
    n = 0
    for ki in kis:
        docs = [str(d) for d in ki.get("evidence_doc_ids") or [] if str(d) in texts]
        if not docs:
            continue
        n += 1
        for d in docs:
            per_doc[d] += 1
        covered |= ki_turn_ids(ki, texts)
    return covered, dict(per_doc), n


def read_kis(path: Path) -> list[dict[str, Any]]:
    """KIs from a JSONL file (one KI JSON object per line)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def store_kis(config: Path) -> list[dict[str, Any]]:
    """Every KI (any status) of the store ``config`` names."""
    from kitune.config import load_config
    from kitune.retrieval import create_store
    from kitune.schema import Filter

    store = create_store(load_config(config))
    try:
        return [ki.model_dump(mode="json") for ki in store.iter_kis(Filter(statuses=()))]
    finally:
        store.close()


def coverage(
    questions: Sequence[Question],
    docs: Sequence[Document],
    ref: set[Turn],
    kis: set[Turn] | None,
) -> list[QuestionCoverage]:
    """Per-question coverage (questions without evidence turns are skipped)."""
    turns_of = {d.docid: {t.unit_id for t in parse_session(d.text).turns} for d in docs}
    out = []
    for q in questions:
        located, missing = locate_evidence(q, turns_of)
        if not located:
            continue
        out.append(
            QuestionCoverage(
                query_id=q.query_id,
                category=q.category,
                evidence=tuple(located),
                unresolved=tuple(missing),
                covered_ref=tuple(t for t in located if t in ref),
                covered_ki=None if kis is None else tuple(t for t in located if t in kis),
            )
        )
    return out


def _agg(rows: Sequence[QuestionCoverage], side: str) -> dict[str, float]:
    got = [len(getattr(r, side)) / len(r.evidence) for r in rows]
    return {
        "questions": len(rows),
        "mean_share_covered": statistics.fmean(got) if got else 0.0,
        "all_covered": sum(1 for g in got if g == 1.0) / len(got) if got else 0.0,
        "none_covered": sum(1 for g in got if g == 0.0) / len(got) if got else 0.0,
    }


def _per_session(counts: Mapping[str, int], docids: Sequence[str]) -> dict[str, float]:
    values = [counts.get(d, 0) for d in docids]
    return {
        "sessions": len(values),
        "total": sum(values),
        "mean": statistics.fmean(values) if values else 0.0,
        "median": statistics.median(values) if values else 0.0,
        "min": min(values, default=0),
        "max": max(values, default=0),
    }


def summarize(rows: Sequence[QuestionCoverage], with_kis: bool) -> dict[str, Any]:
    """Overall and per-category aggregates for each side."""
    sides = ["covered_ref", *(["covered_ki"] if with_kis else [])]
    cats = sorted({r.category for r in rows})
    out: dict[str, Any] = {"all": {s: _agg(rows, s) for s in sides}}
    for c in cats:
        sub = [r for r in rows if r.category == c]
        out[c or "(none)"] = {s: _agg(sub, s) for s in sides}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--data", type=Path, default=LOCOMO, help="LoCoMo directory (default ../shared/data/locomo)."
    )
    p.add_argument(
        "--conversations", default="", help="Comma-separated conversation ids (26,30); default all."
    )
    p.add_argument(
        "--questions", type=Path, help="File of query ids (one per line) restricting the questions."
    )
    p.add_argument(
        "--sessions",
        type=int,
        default=0,
        help="Only each conversation's first K sessions (and the questions answerable from them); 0: all.",
    )
    p.add_argument("--kis", type=Path, help="KI JSONL (one KI per line).")
    p.add_argument("--store-config", type=Path, help="Read the KIs from the store this config names.")
    p.add_argument("--name", default="locomo_coverage", help="Result file stem in --out-dir.")
    p.add_argument("--out-dir", type=Path, help="Default benchmarks/results.")
    args = p.parse_args(argv)
    machine = machine_info()
    ds = load_dataset(args.data)
    convs = {c.strip() for c in args.conversations.split(",") if c.strip()}
    docs = [d for d in ds.documents if not convs or d.source.removeprefix("locomo-") in convs]
    if args.sessions > 0:  # docid = conversation x 1000 + session
        docs = [d for d in docs if int(d.docid) % 1000 <= args.sessions]
    docids = {d.docid for d in docs}
    questions = [
        q for q in ds.questions if q.evidence_docids and q.evidence_turns and set(q.evidence_docids) <= docids
    ]
    if args.questions:
        wanted = {x.strip() for x in args.questions.read_text().split() if x.strip()}
        questions = [q for q in questions if q.query_id in wanted]
    ref, ref_per_doc = reference_turns(args.data / "reference_observations.jsonl", docids)
    texts = {d.docid: d.text for d in docs}
    kis_raw = read_kis(args.kis) if args.kis else store_kis(args.store_config) if args.store_config else None
    ki_cov, ki_per_doc, n_kis = (None, {}, 0) if kis_raw is None else ki_turns(kis_raw, texts)
    rows = coverage(questions, docs, ref, ki_cov)
    order = [d.docid for d in docs]
    results: dict[str, Any] = {
        "coverage": summarize(rows, kis_raw is not None),
        "reference_observations_per_session": _per_session(ref_per_doc, order),
        "kis_per_session": None if kis_raw is None else _per_session(ki_per_doc, order),
        "kis_citing_these_sessions": None if kis_raw is None else n_kis,
        "evidence_turns": sum(len(r.evidence) for r in rows),
        "unresolved_evidence_turns": sorted({f"{r.query_id}:{t}" for r in rows for t in r.unresolved}),
        "questions_skipped": {
            "no_evidence": sum(1 for q in ds.questions if not q.evidence_docids or not q.evidence_turns),
            "evidence_turns_not_found": len(questions) - len(rows),
        },
        "per_question": [
            {
                "query_id": r.query_id,
                "category": r.category,
                "evidence": [f"{d}/{t}" for d, t in r.evidence],
                "covered_ref": [f"{d}/{t}" for d, t in r.covered_ref],
                "covered_ki": None if r.covered_ki is None else [f"{d}/{t}" for d, t in r.covered_ki],
            }
            for r in rows
        ],
    }
    cov = results["coverage"]
    headers = ["category", "questions", "ref: mean share covered", "ref: all covered"]
    if kis_raw is not None:
        headers += ["KIs: mean share covered", "KIs: all covered"]
    table_rows = []
    for cat, sides in cov.items():
        row: list[object] = [cat, sides["covered_ref"]["questions"]]
        for s in ["covered_ref", *(["covered_ki"] if kis_raw is not None else [])]:
            row += [f"{100 * sides[s]['mean_share_covered']:.1f}%", f"{100 * sides[s]['all_covered']:.1f}%"]
        table_rows.append(row)
    per = [("reference observations", results["reference_observations_per_session"])]
    if kis_raw is not None:
        per.append(("KIs", results["kis_per_session"]))
    md = [
        f"Conversations: {', '.join(sorted(convs)) or 'all'}; sessions: {len(docs)}; questions with evidence "
        f"turns: {len(rows)} ({results['evidence_turns']} evidence turns, "
        f"{len(results['unresolved_evidence_turns'])} not found in their sessions). "
        + (
            "KIs: none given (reference side only)."
            if kis_raw is None
            else f"KIs citing these sessions: {n_kis}."
        ),
        "",
        "### Evidence turns covered by at least one fact",
        "",
        markdown_table(headers, table_rows),
        "",
        "### Facts per session",
        "",
        markdown_table(
            ["side", "sessions", "total", "mean", "median", "min", "max"],
            [
                [name, v["sessions"], v["total"], v["mean"], v["median"], v["min"], v["max"]]
                for name, v in per
            ],
        ),
    ]
    params = {
        "data": str(args.data),
        "conversations": sorted(convs),
        "questions_file": str(args.questions) if args.questions else None,
        "kis": str(args.kis) if args.kis else (f"store:{args.store_config}" if args.store_config else None),
    }
    notes = [
        "Reference observations are the LoCoMo authors' LLM-generated per-session facts: a yardstick, not "
        "ground truth. A fact covers a turn when it cites it (dia_id) or, for KIs, names it or quotes it.",
    ]
    json_path, md_path = write_results(
        args.name,
        machine=machine,
        params=params,
        results=results,
        summary_md="\n".join(md),
        notes=notes,
        out_dir=args.out_dir,
    )
    print("\n".join(md))
    print(f"written: {json_path}, {md_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
