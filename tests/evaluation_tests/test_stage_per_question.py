"""Per-question stage values (issue 36): the paired decisions' input, consistent with the aggregates."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kitune.data.loaders import Question
from kitune.evaluation.stage_metrics import answer_coverage, per_question_values, rewriter_metrics
from kitune.testing.store_contract import make_ki

QUESTIONS = [
    Question(
        "q1", "Who opened the bakery?", "Tom O'Neill", gold_docids=("d1",), evidence_docids=("d1", "d2")
    ),
    Question("q2", "When was the bridge finished?", "1932", evidence_docids=("d2",)),
    Question("q3", "Which city?", "Zurich", gold_docids=("d3",), evidence_docids=("d3",)),
    Question(
        "q4", "Is the bakery older than the bridge?", "no", gold_docids=("d1",), evidence_docids=("d1",)
    ),
    Question("q5", "No documents?", "x"),
]
KIS = {
    "d1": [make_ki("Old Mill Bakery", "Tom O’Neill", docid="d1", predicate="founded_by")],
    "d2": [make_ki("Harwick bridge", "19320 stones", docid="d2", predicate="built_from")],
}


@dataclass(frozen=True)
class _Returned:
    evidence_doc_ids: tuple[str, ...]


def test_per_question_values_match_the_aggregate_metrics() -> None:
    lookups = {
        "q1": [_Returned(("d2",)), _Returned(("d1",))],
        "q2": [_Returned(("d2",))],
        "q3": [_Returned(("d1",))],
    }
    values = per_question_values(QUESTIONS, KIS, lookups, k=2)
    # q4 (yes/no) and q5 (no document) have no coverage value; q5 has no rank either
    assert values["extractor_answer_coverage"] == {"q1": 1.0, "q2": 0.0, "q3": 0.0}
    assert values["rewriter_mrr"] == {"q1": 0.5, "q2": 1.0, "q3": 0.0, "q4": 0.0}
    assert values["rewriter_recall_at_k"] == {"q1": 1.0, "q2": 1.0, "q3": 0.0, "q4": 0.0}
    coverage = answer_coverage(QUESTIONS, KIS)
    assert sum(values["extractor_answer_coverage"].values()) / 3 == pytest.approx(coverage.value)
    recall, mrr = rewriter_metrics(QUESTIONS, lookups, k=2)
    assert sum(values["rewriter_mrr"].values()) / 4 == pytest.approx(mrr.value)
    assert sum(values["rewriter_recall_at_k"].values()) / 4 == pytest.approx(recall.value)
    assert set(per_question_values(QUESTIONS, KIS, None, k=2)) == {"extractor_answer_coverage"}
    with pytest.raises(ValueError, match="k=0"):
        per_question_values(QUESTIONS, KIS, lookups, k=0)
