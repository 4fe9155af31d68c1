"""Tests for kitune.evaluation.stage_feedback: the answer-bearing sentence a document's KIs missed."""

from __future__ import annotations

from kitune.data.loaders import Question
from kitune.evaluation.stage_feedback import answer_sentences, document_coverage
from kitune.schema import Document
from kitune.testing.store_contract import make_ki

D1 = Document(
    docid="d1",
    title="Old Mill Bakery",
    text=(
        "Tom O'Neill opened the Old Mill Bakery in Harwick in 1921. Dr. Ann Lee baked its first loaf.\n"
        "The U.S. Army bought bread there! Nobody from Leeds came."
    ),
)
KIS = [make_ki("Old Mill Bakery", "Tom O’Neill", docid="d1", predicate="founded_by")]
Q1 = Question("q1", "Who opened the Old Mill Bakery?", "Tom O'Neill", gold_docids=("d1",))
Q_YES_NO = Question("q4", "Is the bakery older than the bridge?", "no", gold_docids=("d1",))
Q_OTHER = Question("q2", "When was the Harwick bridge finished?", "1932", evidence_docids=("d2",))


def test_answer_sentences_respect_abbreviations_initials_and_whole_words() -> None:
    assert answer_sentences(D1.text, ["Ann Lee"]) == ["Dr. Ann Lee baked its first loaf."]
    assert answer_sentences(D1.text, ["Army"]) == ["The U.S. Army bought bread there!"]
    assert answer_sentences(D1.text, ["Lee"]) == ["Dr. Ann Lee baked its first loaf."]  # not "Leeds"
    assert answer_sentences(D1.text, ["1921", "bread"]) == [
        "Tom O'Neill opened the Old Mill Bakery in Harwick in 1921.",
        "The U.S. Army bought bread there!",
    ]
    assert answer_sentences(D1.text, ["1921", "bread"], max_sentences=1) == [
        "Tom O'Neill opened the Old Mill Bakery in Harwick in 1921."
    ]
    assert answer_sentences(D1.text, ["Paris"]) == []


def test_document_coverage_names_the_missed_answer_sentence() -> None:
    questions = [
        Q1,  # covered by the d1 KI
        Question("qa", "Who baked the first loaf?", "Ann Lee", gold_docids=("d1",)),
        Question("qb", "Where?", "Paris", gold_docids=("d1",)),  # d1 does not say it
        Q_YES_NO,  # yes/no: ignored
        Q_OTHER,  # d1 is not its gold document: ignored
    ]
    cov = document_coverage(D1, questions, KIS)
    assert cov.covered == ("q1",)
    assert [(m.query_id, m.sentences) for m in cov.missed] == [("qa", ("Dr. Ann Lee baked its first loaf.",))]
    assert cov.absent == ("qb",)
    assert cov.score == 0.5
    assert cov.feedback() == (
        "Document d1: no fact states 'Ann Lee'; it is in \"Dr. Ann Lee baked its first loaf.\""
    )
    full = document_coverage(D1, questions[:1], KIS)
    assert (full.score, full.feedback()) == (1.0, "Document d1: every answer it states is in a fact (1).")
    assert document_coverage(D1, [], []).score == 1.0
