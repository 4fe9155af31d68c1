"""Tests for kitune.optimizers.objective: loop_score arithmetic, feedback text, answer coverage."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from kitune.config import KituneConfig
from kitune.data.loaders import Question
from kitune.evaluation.report import summarize
from kitune.evaluation.trace import Trace
from kitune.ki import KI
from kitune.optimizers.objective import (
    LoopWeights,
    RunStats,
    answer_coverage,
    extractor_feedback,
    ki_contains_answer,
    loop_score,
    question_score,
    trace_feedback,
)
from kitune.optimizers.tasks import REWRITER_HINT
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
    # no reference: absolute accuracy 0.5 and timeout rate 0.25, no token term
    assert loop_score(s, None, LoopWeights(1.0, 0.1, 0.2)) == pytest.approx(0.5 - 0.05)
    assert loop_score(s, None, LoopWeights(2.0, 0.0, 0.0)) == pytest.approx(1.0)
    assert loop_score(summarize([])) == 0.0
    # against a reference at 1/4 accuracy, 10k tokens/question (agent + tools), no timeouts:
    ref = summarize(
        [_trace("1", True, tokens=10_000), *(_trace(str(i), False, tokens=10_000) for i in (2, 3, 4))]
    )
    w = LoopWeights(1.0, 0.1, 0.2)
    assert loop_score(s, ref, w) == pytest.approx(
        (0.5 - 0.25) - 0.1 * 1.0 - 0.2 * 0.25
    )  # 2x tokens = 1 doubling
    assert loop_score(ref, ref, w) == 0.0


def _published(correct: int, tokens_m: float, timeouts: int, scale: float = 1.0) -> RunStats:
    """A run of the published table (96 questions) at ``scale`` × its token count."""
    return RunStats(correct / 96, tokens_m * 1e6 * scale / 96, timeouts / 96, 96)


@pytest.mark.parametrize("scale", [1.0, 1e-3])
def test_score_ranks_accuracy_over_a_small_token_saving_at_any_scale(scale: float) -> None:
    # issue 12 (d): 88/96 at 42.6M must rank above 60/96 at 38M (same timeouts), and the same at
    # 1/1000 of the tokens; reference: the published baseline (60/96, 174.8M, 28 timeouts)
    ref = _published(60, 174.8, 28, scale)
    better = loop_score(_published(88, 42.6, 27, scale), ref)
    cheaper = loop_score(_published(60, 38.0, 27, scale), ref)
    assert better > cheaper
    assert better == pytest.approx(0.4975, abs=1e-3)  # the module docstring's worked example
    assert cheaper == pytest.approx(0.2223, abs=1e-3)
    # against each other (either as the reference) the order holds too
    assert loop_score(_published(88, 42.6, 28, scale), _published(60, 38.0, 28, scale)) > 0
    assert loop_score(_published(60, 38.0, 28, scale), _published(88, 42.6, 28, scale)) < 0


def test_question_score_is_scale_free_and_informative() -> None:
    right, wrong = _trace("1", True, tokens=1000), _trace("2", False, tokens=1000)
    for scale in (1, 1000):
        r = _trace("1", True, tokens=500 * scale)
        assert question_score(r, 1000 * scale) == pytest.approx(0.8 + 0.2)  # half the tokens
        assert question_score(_trace("1", True, tokens=1000 * scale), 1000 * scale) == pytest.approx(0.9)
        assert question_score(_trace("1", True, tokens=2000 * scale), 1000 * scale) == pytest.approx(0.8)
    # at 1.8M tokens a correct answer still scores high and a wrong one low (the old metric gave 0 to both)
    assert question_score(_trace("1", True, tokens=1_800_000), 1_800_000) == pytest.approx(0.9)
    assert question_score(_trace("2", False, tokens=1_800_000), 1_800_000) == pytest.approx(0.1)
    assert question_score(right) > question_score(wrong)
    failed = Trace(query_id="f", skill="in-context", question="q", gold_answer="g", status="failed")
    assert question_score(failed, 10) == 0.0


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
    text = trace_feedback(t, REWRITER_HINT)
    assert "'Charles Babbage'" in text and "'Ada Lovelace'" in text and "'Ada'" in text
    assert "never seen: d1." in text
    assert "get_context('analytical engine notes')" in text
    assert "Unparseable replies: 1" in text
    assert "force-committed" in text and "1234 input" in text
    assert "surface facts naming the gold answer" in text
    assert "tell 'Ada Lovelace' from 'Charles Babbage'" in trace_feedback(t, "tell {gold} from {answer}")
    assert "tell" not in trace_feedback(replace(t, judge_correct=True), "tell {gold}")


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
