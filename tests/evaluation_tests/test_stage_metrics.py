"""Tests for kitune.evaluation.stage_metrics: known values on a scripted corpus, KIs and look-ups."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from kitune.data.loaders import Question, load_dataset
from kitune.evaluation.stage_metrics import (
    ExtractionCounts,
    StageReport,
    answer_coverage,
    evidence_coverage,
    extractor_metrics,
    grounding_rate,
    ki_tokens_per_doc,
    reciprocal_rank,
    rewriter_metrics,
)
from kitune.ki import KI
from kitune.programs.fact_extractor import DocExtraction
from kitune.testing.store_contract import make_ki

QUESTIONS = [
    Question(
        "q1",
        "Who opened the Old Mill Bakery?",
        "Tom O'Neill",
        gold_docids=("d1",),
        evidence_docids=("d1", "d2"),
    ),
    Question("q2", "When was the Harwick bridge finished?", "1932", evidence_docids=("d2",)),
    Question(
        "q3", "Which city?", "Zurich", aliases=("Zürich",), gold_docids=("d3",), evidence_docids=("d3",)
    ),
    Question(
        "q4", "Is the bakery older than the bridge?", "no", gold_docids=("d1",), evidence_docids=("d1",)
    ),
    Question("q5", "No documents?", "x"),
]

KIS = {
    # typographic apostrophe in the KI, ASCII in the gold answer: folded, still a match
    "d1": [make_ki("Old Mill Bakery", "Tom O’Neill", docid="d1", predicate="founded_by")],
    # "19320" must not count as "1932" (whole words only)
    "d2": [
        make_ki("Harwick bridge", "river Wey", docid="d2", predicate="crosses"),
        make_ki("Harwick bridge", "19320 stones", docid="d2", predicate="built_from"),
    ],
}


def test_answer_coverage_counts_folded_whole_word_hits_and_excludes_yes_no_and_docless() -> None:
    m = answer_coverage(QUESTIONS, KIS)
    assert (m.successes, m.n, m.excluded) == (1, 3, 2)  # q1 only; q4 yes/no, q5 no docs left out
    assert m.value == pytest.approx(1 / 3)
    assert (m.ci_low, m.ci_high) == pytest.approx((0.06149194, 0.79234040))


def test_answer_coverage_reads_the_object_and_the_gold_documents_only() -> None:
    # the answer only in the object field counts; a KI of a non-gold document does not
    only_object = make_ki(
        "Bridge", "1932", docid="d2", title="The bridge opened.", description="It opened then."
    )
    q = Question("q", "When?", "1932", gold_docids=("d2",))
    assert answer_coverage([q], {"d2": [only_object]}).successes == 1
    assert answer_coverage([q], {"d9": [only_object]}).successes == 0


def test_evidence_coverage_is_over_distinct_evidence_and_gold_documents() -> None:
    m = evidence_coverage(QUESTIONS, KIS)
    assert (m.successes, m.n) == (2, 3)  # d1, d2 have KIs; d3 none
    assert (m.ci_low, m.ci_high) == pytest.approx((0.20765960, 0.93850806))


def test_grounding_rate_counts_only_facts_that_reached_the_evidence_check() -> None:
    counts = ExtractionCounts(
        kept=5,
        drops={"evidence_not_found": 2, "over_cap": 1, "empty_field": 3, "duplicate": 1},
        counters={"evidence_repaired": 1, "evidence_trimmed": 1},
    )
    m = grounding_rate(counts)
    # reached = 5 kept + 1 over_cap + 2 not found = 8; grounded = 6 passed - 1 repaired = 5
    assert (m.successes, m.n) == (5, 8)
    assert (m.ci_low, m.ci_high) == pytest.approx((0.30574239, 0.86315571))
    assert grounding_rate(ExtractionCounts(0, {}, {})).value is None


def test_extraction_counts_sum_doc_extractions() -> None:
    ki = make_ki("A", "B")
    results = [
        DocExtraction(
            "d1", "ok", kis=(ki, ki), drops={"evidence_not_found": 1}, counters={"evidence_repaired": 1}
        ),
        DocExtraction(
            "d2", "ok", kis=(ki,), drops={"evidence_not_found": 2, "over_cap": 1}, counters={"lm_calls": 1}
        ),
    ]
    c = ExtractionCounts.from_results(results)
    assert (c.kept, dict(c.drops), dict(c.counters)) == (
        3,
        {"evidence_not_found": 3, "over_cap": 1},
        {"evidence_repaired": 1, "lm_calls": 1},
    )
    assert (grounding_rate(c).successes, grounding_rate(c).n) == (3, 7)


def test_ki_tokens_per_doc_is_a_mean_over_evidence_documents_with_a_normal_interval() -> None:
    m = ki_tokens_per_doc(QUESTIONS, KIS, count_tokens=lambda _text: 10)
    # d1: 10, d2: 20, d3: 0 → mean 10, s = 10, half = 1.96 · 10 / √3
    assert (m.value, m.n, m.successes) == (10.0, 3, None)
    assert (m.ci_low, m.ci_high) == pytest.approx((0.0, 10 + 1.959963984540054 * 10 / 3**0.5))
    words = ki_tokens_per_doc(QUESTIONS[:1], {"d1": KIS["d1"]}, count_tokens=lambda t: len(t.split()))
    assert words.value == pytest.approx((len(KIS["d1"][0].text_for_context().split()) + 0) / 2)


@dataclass(frozen=True)
class _Returned:
    evidence_doc_ids: tuple[str, ...]


def test_rewriter_recall_and_mrr_on_scripted_lookups() -> None:
    lookups = {
        "q1": [_Returned(("d2",)), _Returned(("d1",))],  # gold d1 at rank 2
        "q2": [_Returned(("d2",))],  # no gold: evidence d2 stands in, rank 1
        "q3": [_Returned(("d1",))],  # miss
        # q4 missing → empty result (miss); q5 has no document → excluded
    }
    recall, mrr = rewriter_metrics(QUESTIONS, lookups, k=10)
    assert (recall.successes, recall.n, recall.excluded, recall.label) == (2, 4, 1, "recall@10")
    assert (recall.ci_low, recall.ci_high) == pytest.approx((0.15003899, 0.84996101))
    assert (mrr.value, mrr.n) == (0.375, 4)
    assert (mrr.ci_low, mrr.ci_high) == pytest.approx((0.0, 0.844131), abs=1e-6)
    recall1, mrr1 = rewriter_metrics(QUESTIONS, lookups, k=1)
    assert (recall1.successes, mrr1.value) == (1, 0.25)
    with pytest.raises(ValueError, match="k=0"):
        rewriter_metrics(QUESTIONS, lookups, k=0)


def test_reciprocal_rank_reads_ki_evidence_documents() -> None:
    kis = [KIS["d2"][0], KIS["d1"][0]]
    assert reciprocal_rank(["d1"], kis, 5) == 0.5
    assert reciprocal_rank(["d1"], kis, 1) == 0.0
    assert reciprocal_rank(["d9"], kis, 5) == 0.0


def test_stage_report_flat_metrics_and_markdown() -> None:
    metrics = extractor_metrics(
        QUESTIONS, KIS, ExtractionCounts(5, {"evidence_not_found": 3}, {}), count_tokens=lambda _t: 10
    )
    recall, mrr = rewriter_metrics(QUESTIONS, {"q2": [_Returned(("d2",))]}, k=5)
    report = StageReport("tune", (*metrics, recall, mrr))
    flat = report.to_metrics("tune")
    assert flat["tune_extractor_answer_coverage"] == pytest.approx(1 / 3)
    assert flat["tune_extractor_answer_coverage_n"] == 3.0
    assert flat["tune_extractor_grounding_rate"] == 5 / 8
    assert flat["tune_rewriter_recall_at_k"] == 0.25
    assert flat["tune_rewriter_mrr"] == 0.25
    assert flat["tune_extractor_ki_tokens_per_doc"] == 10.0
    assert len(flat) == 6 * 4
    assert report.get("rewriter", "mrr") is mrr
    assert report.markdown_header().splitlines() == [
        "| split | extractor answer coverage | extractor evidence coverage | extractor grounding "
        "| extractor KI tokens/doc | rewriter recall@5 | rewriter MRR |",
        "|---|---|---|---|---|---|---|",
    ]
    assert report.markdown_row() == (
        "| tune | 1/3 = 33.3% [6.1%–79.2%] | 2/3 = 66.7% [20.8%–93.9%] | 5/8 = 62.5% [30.6%–86.3%] "
        "| 10 [0–21.3] (n=3) | 1/4 = 25.0% [4.6%–69.9%] | 0.25 [0–0.74] (n=4) |"
    )
    empty = StageReport("validation", (answer_coverage([], {}),))
    assert empty.to_metrics("val") == {"val_extractor_answer_coverage_n": 0.0}
    assert empty.markdown_row() == "| validation | – (n=0) |"


RUN_24 = Path(__file__).resolve().parents[2] / "experiments" / "loop-fixture-24"


def test_extractor_metrics_on_the_committed_loop_fixture_24_kis(fixture_dir: Path) -> None:
    """The 105 extracted KIs of experiments/loop-fixture-24 (disambiguation KIs left out)."""
    kis = [
        KI.model_validate_json(line)
        for line in (RUN_24 / "kis.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    by_doc: dict[str, list[KI]] = {}
    for ki in kis:
        if ki.payload.subtype != "disambiguation":
            for d in ki.evidence_doc_ids:
                by_doc.setdefault(d, []).append(ki)
    questions = load_dataset(fixture_dir).questions
    cov = answer_coverage(questions, by_doc)
    assert (cov.successes, cov.n, cov.excluded) == (12, 22, 2)  # the 2 yes/no questions left out
    ev = evidence_coverage(questions, by_doc)
    assert (ev.successes, ev.n) == (46, 52)


def test_per_question_values_match_the_aggregates() -> None:
    from kitune.evaluation.stage_metrics import answer_hits, per_question_values, reciprocal_ranks

    # q1: gold d1 stated; q2: d2's KIs say 19320, not 1932; q3: d3 has no KI; q4 yes/no and q5 docless out
    assert answer_hits(QUESTIONS, KIS) == {"q1": 1.0, "q2": 0.0, "q3": 0.0}
    ki1, ki2 = KIS["d1"][0], KIS["d2"][0]
    lookups = {"q1": [ki2, ki1], "q2": [ki2], "q3": [ki1, ki2]}
    rr = reciprocal_ranks(QUESTIONS, lookups, k=5)
    assert rr == {"q1": 0.5, "q2": 1.0, "q3": 0.0, "q4": 0.0}  # q4 counted (gold d1), no look-up
    per = per_question_values(QUESTIONS, KIS, lookups, k=5)
    recall, mrr = rewriter_metrics(QUESTIONS, lookups, k=5)
    assert per["rewriter_recall_at_k"] == {"q1": 1.0, "q2": 1.0, "q3": 0.0, "q4": 0.0}
    assert sum(per["rewriter_recall_at_k"].values()) == recall.successes
    assert sum(per["rewriter_mrr"].values()) / len(per["rewriter_mrr"]) == pytest.approx(mrr.value)
    report = StageReport("validation", (recall, mrr), per)
    assert report.values("rewriter", "mrr") == rr and report.values("extractor", "nope") == {}
    assert per_question_values(QUESTIONS, KIS, None, k=5).keys() == {"extractor_answer_coverage"}
