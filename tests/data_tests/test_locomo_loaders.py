"""The LoCoMo conversational layout: session dates, question categories and evidence turn ids."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from kitune.data.examples import to_dspy_examples
from kitune.data.loaders import load_dataset, load_questions


@pytest.fixture
def locomo_dir() -> Path:
    path = (Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "locomo").resolve()
    if not path.is_dir():
        pytest.skip(f"shared data not found at {path}")
    return path


def test_locomo_layout_loads_dates_categories_and_turns(locomo_dir: Path) -> None:
    ds = load_dataset(locomo_dir)
    assert len(ds.documents) == 128 and len(ds.questions) == 762 and ds.report.skipped == ()
    first = ds.documents[0]
    assert first.docid == "26001" and first.source == "locomo-26"
    assert first.metadata["date"] == "1:56 pm on 8 May, 2023"
    assert Counter(q.category for q in ds.questions) == {
        "single-hop": 418,
        "temporal": 156,
        "multi-hop": 142,
        "open-domain": 46,
    }
    q1 = ds.questions[0]
    assert (q1.query_id, q1.answer, q1.category, q1.evidence_turns, q1.evidence_docids) == (
        "26-001",
        "7 May 2023",
        "temporal",
        ("D1:3",),
        ("26001",),
    )
    q3 = next(q for q in ds.questions if q.query_id == "26-003")
    assert q3.evidence_turns == ("D1:9", "D1:11")
    assert q3.to_dict()["category"] == "open-domain"
    assert q3.to_dict()["evidence_turns"] == ["D1:9", "D1:11"]


def test_plain_jsonl_reads_category_and_turn_aliases(tmp_path: Path) -> None:
    f = tmp_path / "q.jsonl"
    rows = [
        {"id": "a", "question": "Q?", "answer": "x", "category": " temporal ", "evidence_dia_ids": ["D2:1"]},
        {"id": "b", "question": "Q?", "answer": "y", "evidence_turns": "D1:4"},
        {"id": "c", "question": "Q?", "answer": "z"},
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    qs = load_questions(f)
    assert [(q.category, q.evidence_turns) for q in qs] == [
        ("temporal", ("D2:1",)),
        ("", ("D1:4",)),
        ("", ()),
    ]
    ex = to_dspy_examples(qs)
    assert ex[0].category == "temporal" and ex[0].evidence_turns == ["D2:1"]
    assert ex[2].category == "" and ex[2].evidence_turns == []
    assert set(ex[0].inputs().keys()) == {"question"}
