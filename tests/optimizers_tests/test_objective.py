"""Tests for kitune.optimizers.objective: loop_score arithmetic, feedback text, answer coverage."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kitune.config import KituneConfig
from kitune.data.loaders import Question
from kitune.evaluation.metrics import Trace
from kitune.evaluation.report import summarize
from kitune.ki import KI
from kitune.optimizers.objective import (
    LoopWeights,
    answer_coverage,
    extractor_feedback,
    ki_contains_answer,
    loop_score,
    trace_feedback,
)
from kitune.programs.fact_extractor import DocExtraction


def _trace(qid: str, correct: bool, *, tokens: int = 0, tool: int = 0, timed_out: bool = False) -> Trace:
    return Trace(
        query_id=qid,
        skill="in-context",
        question="Where?",
        gold_answer="Paris",
        status="answered",
        exact_answer="Paris" if correct else "Lyon",
        judge_correct=correct,
        judge_status="graded",
        input_tokens=tokens,
        tool_input_tokens=tool,
        timed_out=timed_out,
    )


def test_loop_score_arithmetic() -> None:
    traces = [
        _trace("1", True, tokens=15_000, tool=5_000),
        _trace("2", True, tokens=20_000),
        _trace("3", False, tokens=20_000, timed_out=True),
        _trace("4", False, tokens=20_000),
    ]
    s = summarize(traces)
    # accuracy 0.5; mean input tokens (agent + tools) 20,000 → 2.0 units; timeout rate 0.25
    assert loop_score(s, LoopWeights(1.0, 0.1, 0.2)) == pytest.approx(0.5 - 0.2 - 0.05)
    assert loop_score(s, LoopWeights(2.0, 0.0, 0.0)) == pytest.approx(1.0)
    assert loop_score(summarize([])) == 0.0


def test_weights_from_config() -> None:
    cfg = KituneConfig(optimize={"accuracy_weight": 0.5, "token_weight": 0.0, "timeout_weight": 1.0})
    assert LoopWeights.from_config(cfg) == LoopWeights(0.5, 0.0, 1.0)


def test_trace_feedback_names_answers_docs_and_queries() -> None:
    t = Trace(
        query_id="q",
        skill="in-context",
        question="Who?",
        gold_answer="Ada Lovelace",
        aliases=["Ada"],
        status="budget_exhausted",
        exact_answer="Charles Babbage",
        judge_correct=False,
        judge_status="graded",
        steps=[
            {"kind": "tool", "tool": "get_context", "args": {"query": "analytical engine notes"}},
            {"kind": "invalid", "error": "no JSON object"},
        ],
        timed_out=True,
        force_committed=True,
        input_tokens=1234,
        evidence_docids=["d1", "d2"],
        doc_ids_seen=["d2"],
    )
    text = trace_feedback(t, "rewriter")
    assert "'Charles Babbage'" in text and "'Ada Lovelace'" in text and "'Ada'" in text
    assert "never seen: d1." in text
    assert "get_context('analytical engine notes')" in text
    assert "Unparseable replies: 1" in text
    assert "force-committed" in text and "1234 input" in text
    assert "'Ada Lovelace' from 'Charles Babbage'" in trace_feedback(t, "disambiguator")


def _ki(docid: str, title: str) -> KI:
    return KI.from_fact(
        docid=docid,
        title=title,
        description=title + " This is the evidence sentence.",
        subject="s",
        predicate="located_in",
        obj="o",
        evidence=[title],
        confidence=80,
        now=datetime(2026, 1, 1, tzinfo=UTC),
    )


def test_answer_coverage_and_extractor_feedback() -> None:
    q1 = Question("1", "Capital of France?", "Paris", gold_docids=("d1",))
    q2 = Question("2", "Capital of Peru?", "Lima", aliases=("Lima city",), evidence_docids=("d2",))
    q3 = Question("3", "No docs?", "x")
    k1 = _ki("d1", "The capital of France is Paris.")
    k2 = _ki("d2", "Peru's largest port is Callao.")
    assert ki_contains_answer(k1, ["paris"]) and not ki_contains_answer(k2, ["Lima"])
    assert not ki_contains_answer(_ki("d3", "Parisian cafes are old."), ["Paris"])  # whole words only
    assert answer_coverage([q1, q2, q3], {"d1": [k1], "d2": [k2]}) == 0.5
    assert answer_coverage([q3], {}) is None

    results = [
        DocExtraction(
            "d1", "ok", kis=(k1,), drops={"evidence_not_verbatim": 2}, counters={"parse_failures": 1}
        ),
        DocExtraction("d2", "ok", kis=(k2,), drops={"evidence_not_verbatim": 1, "title_too_long": 1}),
        DocExtraction("d3", "failed", error="boom"),
    ]
    fb = extractor_feedback(results, [q1, q2])
    assert (fb.docs, fb.facts_kept, fb.facts_offered, fb.violations) == (3, 2, 6, 4)
    assert fb.grounding_rate == pytest.approx(2 / 6)
    assert fb.facts_per_doc == pytest.approx(2 / 3)
    assert fb.coverage == 0.5 and fb.parse_failures == 1 and fb.failed_docs == 1
    assert fb.score() == pytest.approx(0.5 + 0.5 * (2 / 6) - 0.5 / 3)
    assert "Dropped 3 fact(s): evidence_not_verbatim." in fb.text()
    m = fb.to_metrics()
    assert m["extract_facts_dropped"] == 4.0 and m["extract_answer_coverage"] == 0.5
