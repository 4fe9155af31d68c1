"""Failure kinds are decided from the trace alone, by documented rules in a fixed order."""

from __future__ import annotations

from kitune.evaluation.failures import FAILURE_KINDS, classify_failure, count_failure_kinds, is_numeric_answer
from kitune.evaluation.metrics import Trace


def _trace(**kw: object) -> Trace:
    base: dict[str, object] = {
        "query_id": "q",
        "skill": "in-context",
        "question": "Who?",
        "gold_answer": "Warsaw",
        "status": "answered",
        "exact_answer": "Kraków",
        "judge_correct": False,
        "judge_status": "graded",
        "evidence_docids": ["d1", "d2"],
        "doc_ids_seen": ["d1", "d2"],
    }
    base.update(kw)
    return Trace(**base)  # type: ignore[arg-type]


def test_each_rule_in_order() -> None:
    assert classify_failure(_trace(judge_correct=True)) is None
    assert classify_failure(_trace(status="failed", judge_correct=None, judge_status="not_run")) == "failed"
    assert classify_failure(_trace(judge_status="grader_error", judge_correct=None)) == "grader_error"
    assert classify_failure(_trace(exact_answer="", timed_out=True)) == "out_of_budget"
    assert (
        classify_failure(_trace(status="malformed_calls", exact_answer="")) == "malformed_calls"
    )  # issue 25
    assert classify_failure(_trace(exact_answer="", timed_out=False)) == "no_candidate"
    assert classify_failure(_trace(doc_ids_seen=["d9"])) == "no_candidate"
    assert classify_failure(_trace()) == "wrong_entity"
    assert classify_failure(_trace(gold_answer="1889", exact_answer="1891")) == "wrong_number"
    assert classify_failure(_trace(gold_answer="March 3, 1921", exact_answer="1920")) == "wrong_number"
    # a force-committed answer after the budget ran out is classified by its content
    assert classify_failure(_trace(timed_out=True, force_committed=True)) == "wrong_entity"


def test_gold_docids_override_evidence() -> None:
    t = _trace(doc_ids_seen=["d1"])  # saw a bridge document, never the answer-bearing one
    assert classify_failure(t) == "wrong_entity"
    assert classify_failure(t, gold_docids=["d2"]) == "no_candidate"


def test_ungraded_uses_exact_match() -> None:
    t = _trace(judge_correct=None, judge_status="not_run", em=True)
    assert classify_failure(t) is None


def test_counts_have_every_kind() -> None:
    traces = [
        _trace(query_id="a"),
        _trace(query_id="b", judge_correct=True),
        _trace(query_id="c", doc_ids_seen=[]),
    ]
    counts = count_failure_kinds(traces)
    assert list(counts) == list(FAILURE_KINDS)
    assert counts["wrong_entity"] == 1 and counts["no_candidate"] == 1 and sum(counts.values()) == 2


def test_numeric_detection() -> None:
    assert is_numeric_answer("1,500 million") and is_numeric_answer("three") and is_numeric_answer("May 1990")
    assert not is_numeric_answer("Marie Curie") and not is_numeric_answer("")
