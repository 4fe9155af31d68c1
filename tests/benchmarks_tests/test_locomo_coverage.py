"""benchmarks/locomo_coverage.py: evidence turns covered by reference observations and by KIs."""

from __future__ import annotations

import json
from pathlib import Path

import locomo_coverage as lc

from kitune.data.loaders import Question
from kitune.schema import Document

S1 = "A and B, session 1 (8 May, 2023)\n[D1:1] A: I ran yesterday.\n[D1:2] B: Nice!\n[D1:3] A: I love Oslo."
S2 = "A and B, session 2 (9 May, 2023)\n[D2:1] B: I moved to Bergen.\n[D2:2] A: Great."
DOCS = [Document("1001", S1, source="locomo-1"), Document("1002", S2, source="locomo-1")]


def _dataset(root: Path) -> Path:
    root.mkdir()
    (root / "corpus.jsonl").write_text(
        "\n".join(json.dumps({"docid": d.docid, "text": d.text, "source": d.source}) for d in DOCS) + "\n"
    )
    gt = [
        {"query_id": "1-1", "query": "When did A run?", "answer": "7 May", "category": "temporal",
         "evidence_dia_ids": ["D1:1"]},
        {"query_id": "1-2", "query": "Where?", "answer": "Bergen", "category": "multi-hop",
         "evidence_dia_ids": ["D1:3", "D2:1", "D9:9"]},
        {"query_id": "1-3", "query": "Open?", "answer": "x", "category": "open-domain",
         "evidence_dia_ids": []},
    ]  # fmt: skip
    (root / "ground_truth.jsonl").write_text("\n".join(json.dumps(g) for g in gt) + "\n")
    (root / "queries.tsv").write_text("".join(f"{g['query_id']}\t{g['query']}\n" for g in gt))
    (root / "qrel_evidence.txt").write_text("1-1 Q0 1001 1\n1-2 Q0 1001 1\n1-2 Q0 1002 1\n")
    obs = [
        {"docid": "1001", "speaker": "A", "fact": "A ran.", "dia_id": "D1:1"},
        {"docid": "1001", "speaker": "A", "fact": "A loves Oslo.", "dia_id": ["D1:3", "D1:2"]},
        {"docid": "9999", "speaker": "Z", "fact": "elsewhere", "dia_id": "D2:1"},
    ]
    (root / "reference_observations.jsonl").write_text("\n".join(json.dumps(o) for o in obs) + "\n")
    return root


def test_locate_and_coverage_sets() -> None:
    turns_of = {"1001": {"D1:1", "D1:2", "D1:3"}, "1002": {"D2:1", "D2:2"}}
    q = Question("q", "?", "x", evidence_docids=("1001", "1002"), evidence_turns=("D2:1", "D1:3", "D7:1"))
    assert lc.locate_evidence(q, turns_of) == ([("1002", "D2:1"), ("1001", "D1:3")], ["D7:1"])
    kis = [
        {"evidence_doc_ids": ["1002"], "payload": {"evidence": ["I moved to Bergen."]}},
        {"evidence_doc_ids": ["1001"], "description": "[D1:1] says so", "payload": {}},
        {"evidence_doc_ids": ["other"], "payload": {"evidence": ["I moved to Bergen."]}},
    ]
    covered, per_doc, n = lc.ki_turns(kis, {d.docid: d.text for d in DOCS})
    assert covered == {("1002", "D2:1"), ("1001", "D1:1")} and per_doc == {"1002": 1, "1001": 1} and n == 2


def test_main_reference_and_ki_sides(tmp_path: Path) -> None:
    data = _dataset(tmp_path / "data")
    kis = tmp_path / "kis.jsonl"
    kis.write_text(
        json.dumps({"evidence_doc_ids": ["1002"], "payload": {"evidence": ["moved to Bergen"]}}) + "\n"
    )
    out = tmp_path / "out"
    assert lc.main(["--data", str(data), "--kis", str(kis), "--name", "cov", "--out-dir", str(out)]) == 0
    res = json.loads((out / "cov.json").read_text())["results"]
    cov = res["coverage"]
    # 1-1: D1:1 covered by a reference observation, not by the KI; 1-2: D1:3 ref only, D2:1 KI only
    assert cov["temporal"]["covered_ref"] == {
        "questions": 1, "mean_share_covered": 1.0, "all_covered": 1.0, "none_covered": 0.0
    }  # fmt: skip
    assert cov["multi-hop"]["covered_ref"]["mean_share_covered"] == 0.5
    assert cov["multi-hop"]["covered_ki"]["mean_share_covered"] == 0.5
    assert (
        cov["all"]["covered_ki"]["mean_share_covered"] == 0.25
        and cov["all"]["covered_ki"]["none_covered"] == 0.5
    )
    assert res["reference_observations_per_session"] == {
        "sessions": 2, "total": 2, "mean": 1.0, "median": 1.0, "min": 0, "max": 2
    }  # fmt: skip
    assert res["kis_per_session"]["total"] == 1 and res["kis_citing_these_sessions"] == 1
    assert res["unresolved_evidence_turns"] == ["1-2:D9:9"]
    assert res["questions_skipped"] == {"no_evidence": 1, "evidence_turns_not_found": 0}
    md = (out / "cov.md").read_text()
    assert "| multi-hop | 1 | 50.0% | 0.0% | 50.0% | 0.0% |" in md
