"""LoCoMo as its authors intend (issue 40): category 5 scored apart, dropped sessions counted,
the shipped errata applied, and a run reporting the published and the corrected score."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kitune.config import KituneConfig
from kitune.data.errata import LOCOMO_ERRATA
from kitune.data.loaders import load_corpus_with_report, load_questions, load_questions_and_errata
from kitune.data.locomo import ABSTENTION_ANSWER, DroppedSession, read_locomo
from kitune.service.pipelines.evaluation import run_eval
from kitune.testing.chat import ScriptedChatModel

ERRATUM_Q = "What fields would Caroline be likely to pursue in her educaton?"
QA = [
    {"question": "When did Caroline go to the LGBTQ support group?", "answer": "7 May 2023",
     "evidence": ["D1:1"], "category": 2},
    {"question": "When did Melanie paint a sunrise?", "answer": 2022, "evidence": ["D2:1"], "category": 2},
    {"question": "What did Caroline realize?", "adversarial_answer": "self-care is important",
     "evidence": ["D2:1"], "category": 5},
    {"question": ERRATUM_Q, "answer": "Psychology, counseling certification", "evidence": ["D1:1"],
     "category": 3},
    {"question": "What is Melanie's favourite colour?", "answer": "blue", "adversarial_answer": "blue",
     "evidence": ["D1:1"], "category": 5},
]  # fmt: skip
SAMPLE = {
    "sample_id": "conv-26",
    "conversation": {
        "speaker_a": "Caroline",
        "speaker_b": "Melanie",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [{"speaker": "Caroline", "dia_id": "D1:1", "text": "I went to the group yesterday."}],
        "session_2_date_time": "1:14 pm on 25 May, 2023",
        "session_2": [{"speaker": "Melanie", "dia_id": "D2:1", "text": "I painted a sunrise in 2022."}],
        "session_3_date_time": "7:55 pm on 9 June, 2023",
        "session_3": [],
        "session_4_date_time": "10:37 am on 27 June, 2023",
    },
    "qa": QA,
}
ANSWERS = ["7 May 2023", "2021", ABSTENTION_ANSWER, "counseling", "blue"]


@pytest.fixture
def published(tmp_path: Path) -> Path:
    path = tmp_path / "data" / "locomo10.json"
    path.parent.mkdir()
    path.write_text(json.dumps([SAMPLE]), encoding="utf-8")
    return path


def test_every_dated_session_without_a_body_is_counted_in_the_load_report(published: Path) -> None:
    data = read_locomo(published)
    assert [d.docid for d in data.documents] == ["26001", "26002"]
    assert data.report.dropped_sessions == (
        DroppedSession("26", 3, "7:55 pm on 9 June, 2023", "no turns"),
        DroppedSession("26", 4, "10:37 am on 27 June, 2023", "no turns"),
    )
    assert data.report.questions == {"temporal": 2, "adversarial": 2, "open-domain": 1}
    assert data.report.summary() == (
        "1 conversation(s), 2 session(s) kept, 2 dropped [26/3 (no turns), 26/4 (no turns)]; "
        "questions: adversarial 2, open-domain 1, temporal 2"
    )
    docs, report = load_corpus_with_report(published)
    assert len(docs) == report.loaded == 2
    assert [s.reason for s in report.skipped] == [
        "conversation 26 session 3 (7:55 pm on 9 June, 2023): no turns",
        "conversation 26 session 4 (10:37 am on 27 June, 2023): no turns",
    ]


def test_category_5_is_an_abstention_question_in_both_layouts(published: Path, tmp_path: Path) -> None:
    from_file = load_questions(published)
    rows = [
        {"query_id": q.query_id, "query": q.query, "dataset": "locomo", "category": c, **extra}
        for q, c, extra in zip(
            from_file,
            ["temporal", "temporal", 5, "open-domain", "adversarial"],
            [{"answer": "7 May 2023"}, {"answer": "2022"}, {"adversarial_answer": "self-care"},
             {"answer": "Psychology, counseling certification"}, {"answer": "blue"}],
            strict=True,
        )
    ]  # fmt: skip
    jsonl = tmp_path / "questions.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    from_jsonl = load_questions(jsonl)
    for qs in (from_file, from_jsonl):
        assert [(q.query_id, q.answer, q.abstention) for q in qs] == [
            ("26-001", "7 May 2023", False),
            ("26-002", "2022", False),
            ("26-a001", ABSTENTION_ANSWER, True),
            ("26-003", "Counseling or mental health", False),  # the shipped erratum, in both layouts
            ("26-a002", ABSTENTION_ANSWER, True),  # its 'answer' (the tempting one) is not the gold
        ]


def test_the_shipped_errata_apply_only_to_the_question_they_correct(published: Path) -> None:
    qs, report = load_questions_and_errata(published)
    assert report is not None and Path(report.path) == LOCOMO_ERRATA
    assert report.applied == ("26-003",)
    assert [(q.query_id, q.answer) for q in report.published] == [
        ("26-003", "Psychology, counseling certification")
    ]
    assert qs[3].aliases == ("counseling", "mental health")
    assert set(report.unmatched) == {"26-006", "26-057", "26-024"}
    shipped = json.loads(LOCOMO_ERRATA.read_text(encoding="utf-8"))
    assert all("query" in e and ("issue" in e["note"] or "PR" in e["note"]) for e in shipped.values())


def _eval(cfg: KituneConfig, published: Path, name: str):  # type: ignore[no-untyped-def]
    replies = [
        json.dumps({"answer": {"explanation": "", "exact_answer": a, "confidence": 80}}) for a in ANSWERS
    ]
    return run_eval(
        cfg,
        skill="closed-book",
        data_dir=published,
        run_name=name,
        concurrency=1,
        progress=False,
        chat_model=ScriptedChatModel(replies, usage=(40, 4)),
    )


def test_a_run_scores_category_5_apart_and_reports_published_and_corrected_scores(
    published: Path, tmp_path: Path
) -> None:
    cfg = KituneConfig(workdir=tmp_path / "w", grading={"grader": "match"})
    res = _eval(cfg, published, "locomo-edges")
    s = res.summary
    # headline: the three answerable questions only (26-001 right, 26-002 wrong, 26-003 right
    # against the corrected label)
    assert (s.n_total, s.n_graded, s.n_correct, s.accuracy) == (3, 3, 2, pytest.approx(2 / 3))
    assert (s.abstention_total, s.abstention_graded, s.abstention_correct) == (2, 2, 1)
    assert s.abstention_accuracy == pytest.approx(0.5) and s.adversarial_in_headline is False
    published_summary = res.published_summary
    assert published_summary is not None
    assert (published_summary.n_correct, published_summary.accuracy) == (1, pytest.approx(1 / 3))
    scores = json.loads((res.run_dir / "scores.json").read_text(encoding="utf-8"))
    assert (scores["corrected"]["n_correct"], scores["published"]["n_correct"]) == (2, 1)
    assert scores["errata"]["applied"] == ["26-003"]
    assert Path(scores["errata"]["path"]) == LOCOMO_ERRATA
    assert scores["corrected"]["abstention_correct"] == scores["published"]["abstention_correct"] == 1
    traces = {t.query_id: t for t in res.traces}
    assert traces["26-003"].gold_answer == "Counseling or mental health" and traces["26-003"].judge_correct


def test_the_documented_option_puts_category_5_in_the_headline(published: Path, tmp_path: Path) -> None:
    cfg = KituneConfig(workdir=tmp_path / "w", grading={"grader": "match", "include_adversarial": True})
    s = _eval(cfg, published, "locomo-all").summary
    assert (s.n_total, s.n_graded, s.n_correct) == (5, 5, 3)
    assert s.adversarial_in_headline is True and s.abstention_correct == 1
