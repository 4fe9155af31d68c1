"""LoCoMo as published (locomo10.json): loaded directly, category 5 kept as abstention questions, errata."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from kitune.data.errata import apply_errata, load_errata
from kitune.data.loaders import Question, load_corpus, load_dataset, load_questions
from kitune.data.locomo import ABSTENTION_ALIASES, ABSTENTION_ANSWER, read_locomo
from kitune.errors import DataError

SAMPLE: dict[str, Any] = {
    "sample_id": "conv-26",
    "conversation": {
        "speaker_a": "Caroline",
        "speaker_b": "Melanie",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Caroline", "dia_id": "D1:1", "text": "Hey Mel!"},
            {
                "speaker": "Caroline",
                "dia_id": "D1:2",
                "text": "I went to a LGBTQ support group yesterday. ",
                "img_url": ["https://example.org/x.jpg"],
                "blip_caption": "a photo of a rainbow flag",
                "query": "pride flag",
            },
        ],
        "session_2_date_time": "1:14 pm on 25 May, 2023",
        "session_2": [{"speaker": "Melanie", "dia_id": "D2:1", "text": "I ran a race last Saturday."}],
        "session_3_date_time": "",
        "session_3": [],
    },
    "qa": [
        {"question": "When did Caroline go to the LGBTQ support group?", "answer": "7 May 2023",
         "evidence": ["D1:2"], "category": 2},
        {"question": "When did Melanie paint?", "answer": 2022, "evidence": ["D1:1"], "category": 2},
        {"question": "What did Caroline realize after her charity race?", "evidence": ["D2:1"], "category": 5,
         "adversarial_answer": "self-care is important"},
        {"question": "What did the two talk about?", "answer": "support and running",
         "evidence": ["D1:2; D2:1", "D"], "category": 1},
        {"question": "Is Oscar Melanie's pet?", "answer": "No", "adversarial_answer": "Yes",
         "evidence": ["D2:1"], "category": 5},
    ],
    "observation": {},
    "session_summary": {},
    "event_summary": {},
}  # fmt: skip


@pytest.fixture
def published(tmp_path: Path) -> Path:
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps([SAMPLE]), encoding="utf-8")
    return path


def test_published_file_loads_documents_as_the_shared_layout_does(published: Path) -> None:
    docs = load_corpus(published)
    assert [(d.docid, d.title, d.source, d.metadata) for d in docs] == [
        ("26001", "Caroline and Melanie — session 1", "locomo-26", {"date": "1:56 pm on 8 May, 2023"}),
        ("26002", "Caroline and Melanie — session 2", "locomo-26", {"date": "1:14 pm on 25 May, 2023"}),
    ]  # the empty session 3 is no document
    assert docs[0].text == (
        "Conversation between Caroline and Melanie, session 1 (1:56 pm on 8 May, 2023)\n"
        "[D1:1] Caroline: Hey Mel!\n"
        "[D1:2] Caroline: I went to a LGBTQ support group yesterday.  "
        "[shares a photo: a photo of a rainbow flag]"
    )


def test_category_5_line_without_answer_is_an_abstention_question_not_a_failed_file(published: Path) -> None:
    qs = load_questions(published)
    assert [(q.query_id, q.answer, q.category, q.abstention) for q in qs] == [
        ("26-001", "7 May 2023", "temporal", False),
        ("26-002", "2022", "temporal", False),  # a numeric answer as text
        ("26-a001", ABSTENTION_ANSWER, "adversarial", True),
        ("26-003", "support and running", "multi-hop", False),
        ("26-a002", ABSTENTION_ANSWER, "adversarial", True),  # its 'answer' is not the gold
    ]
    adversarial = qs[2]
    assert adversarial.golds == (
        "Not mentioned in the conversation",
        "No information available",
        "Not mentioned",
    )
    assert adversarial.evidence_docids == ("26002",) and adversarial.evidence_turns == ("D2:1",)
    assert qs[3].evidence_turns == ("D1:2; D2:1", "D") and qs[3].evidence_docids == ("26001", "26002")
    ds = load_dataset(published)
    assert len(ds.documents) == 2 and len(ds.questions) == 5


def test_a_category_5_jsonl_line_without_answer_no_longer_fails_the_file(tmp_path: Path) -> None:
    rows = [
        {"query_id": "26-001", "query": "When?", "answer": "7 May 2023", "category": "temporal"},
        {"query_id": "26-200", "query": "What did Caroline realize?", "category": 5,
         "adversarial_answer": "self-care is important"},
    ]  # fmt: skip
    f = tmp_path / "questions.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    qs = load_questions(f)
    assert [(q.query_id, q.answer, q.abstention) for q in qs] == [
        ("26-001", "7 May 2023", False),
        ("26-200", ABSTENTION_ANSWER, True),
    ]
    # written back and read again, it stays one
    again = tmp_path / "again.jsonl"
    again.write_text("\n".join(json.dumps(q.to_dict()) for q in qs), encoding="utf-8")
    assert load_questions(again) == qs
    # any other question without an answer is still an error naming the line
    f.write_text(json.dumps({"query_id": "x", "query": "Q?", "category": "temporal"}), encoding="utf-8")
    with pytest.raises(DataError, match=r"questions.jsonl:1: question 'x' has no answer"):
        load_questions(f)


def test_per_conversation_files_of_the_zip_load_from_their_directory(tmp_path: Path) -> None:
    flat = {**SAMPLE["conversation"], "qa": SAMPLE["qa"]}  # data/locomo10.zip: 26.json, 30.json …
    (tmp_path / "26.json").write_text(json.dumps(flat), encoding="utf-8")
    second = {**flat, "speaker_a": "Jon", "speaker_b": "Gina"}
    (tmp_path / "30.json").write_text(json.dumps(second), encoding="utf-8")
    data = read_locomo(tmp_path)
    assert [d.docid for d in data.documents] == ["26001", "26002", "30001", "30002"]
    assert data.files == [tmp_path / "26.json", tmp_path / "30.json"]
    assert load_questions(tmp_path)[5].query_id == "30-001"


def test_not_locomo_shaped_json_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "locomo10.json"
    bad.write_text(
        json.dumps([{"qa": [], "conversation": {"speaker_a": "A"}}, {"nope": 1}]), encoding="utf-8"
    )
    with pytest.raises(DataError, match=r"item 1 is not a LoCoMo conversation"):
        read_locomo(bad)
    missing_question = [{**SAMPLE, "qa": [{"answer": "x", "category": 4}]}]
    bad.write_text(json.dumps(missing_question), encoding="utf-8")
    with pytest.raises(DataError, match=r"conversation 26, qa item 1 has no question text"):
        load_questions(bad)


# ----------------------------------------------------------------------------- the real shared data


def _as_published(locomo_dir: Path) -> list[dict[str, Any]]:
    """``shared/data/locomo`` written back in locomo10.json's shape, one adversarial item per conversation."""
    convs: dict[str, dict[str, Any]] = {}
    turn_re = re.compile(r"^\[(D\d+:\d+)\] ([^:]+): (.*)$")
    for line in (locomo_dir / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
        doc = json.loads(line)
        conv, session = doc["source"].removeprefix("locomo-"), int(doc["docid"]) % 1000
        header, *turn_lines = doc["text"].split("\n")
        a, b = re.match(r"Conversation between (.+) and (.+), session", header).groups()  # type: ignore[union-attr]
        c = convs.setdefault(
            conv, {"sample_id": f"conv-{conv}", "conversation": {"speaker_a": a, "speaker_b": b}, "qa": []}
        )
        turns: list[dict[str, str]] = []
        for tl in turn_lines:
            m = turn_re.match(tl)
            if m is None:  # a turn whose text holds a newline continues on the next line
                turns[-1]["text"] += "\n" + tl
                continue
            turns.append({"speaker": m.group(2), "dia_id": m.group(1), "text": m.group(3)})
        for turn in turns:
            text = turn["text"]
            if " [shares a photo: " in text and text.endswith("]"):
                turn["text"], caption = text.rsplit(" [shares a photo: ", 1)
                turn["blip_caption"] = caption[:-1]
        c["conversation"][f"session_{session}_date_time"] = doc["date"]
        c["conversation"][f"session_{session}"] = turns
    numbers = {"multi-hop": 1, "temporal": 2, "open-domain": 3, "single-hop": 4}
    for line in (locomo_dir / "ground_truth.jsonl").read_text(encoding="utf-8").splitlines():
        g = json.loads(line)
        item = {"question": g["query"], "answer": g["answer"], "evidence": g["evidence_dia_ids"],
                "category": numbers[g["category"]]}  # fmt: skip
        convs[g["query_id"].split("-")[0]]["qa"].append(item)
    for c in convs.values():
        c["qa"].append({"question": "What did they say about skydiving?", "evidence": ["D1:1"], "category": 5,
                        "adversarial_answer": "it was fun"})  # fmt: skip
    return list(convs.values())


def test_published_shape_of_the_shared_conversations_loads_exactly_as_the_shared_layout(
    tmp_path: Path,
) -> None:
    locomo_dir = (Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "locomo").resolve()
    if not locomo_dir.is_dir():
        pytest.skip(f"shared data not found at {locomo_dir}")
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps(_as_published(locomo_dir)), encoding="utf-8")
    shared, published = load_dataset(locomo_dir), load_dataset(path)
    assert published.documents == shared.documents  # 128 sessions, text byte for byte
    answerable = [q for q in published.questions if not q.abstention]
    assert answerable == shared.questions  # 762 questions: ids, answers, categories, turns, qrels
    assert [q.query_id for q in published.questions if q.abstention] == [
        "26-a001",
        "30-a001",
        "41-a001",
        "42-a001",
        "43-a001",
    ]


# ----------------------------------------------------------------------------- errata overlay


def test_errata_overlay_beside_the_file_is_applied_counted_and_logged(
    published: Path, caplog: pytest.LogCaptureFixture
) -> None:
    overlay = published.with_name("locomo10.errata.json")
    overlay.write_text(
        json.dumps(
            {
                "26-002": {"answer": "2022 (before the first session)", "note": "answer is a number"},
                "26-001": {"aliases": ["May 7, 2023"]},
                "26-a001": {"answer": "that self-care is important"},
                "99-001": {"answer": "not in this subset"},
            }
        ),
        encoding="utf-8",
    )
    with caplog.at_level(logging.INFO, logger="kitune.data.errata"):
        qs = load_questions(published)
    by_id = {q.query_id: q for q in qs}
    assert by_id["26-001"].golds == ("7 May 2023", "May 7, 2023")
    assert by_id["26-002"].answer == "2022 (before the first session)"
    assert (by_id["26-a001"].answer, by_id["26-a001"].abstention) == ("that self-care is important", False)
    assert by_id["26-a001"].aliases == ABSTENTION_ALIASES  # aliases not corrected stay
    assert "applied 3 correction(s); 1 id(s) not in these questions (99-001)" in caplog.text
    assert "26-002: answer '2022' -> '2022 (before the first session)'" in caplog.text
    assert "(answer is a number)" in caplog.text


def test_explicit_errata_file_and_its_report(published: Path, tmp_path: Path) -> None:
    overlay = tmp_path / "fixes.json"
    overlay.write_text(
        json.dumps({"26-003": {"answer": "running"}, "26-004": {"aliases": []}}), encoding="utf-8"
    )
    qs = load_questions(published, errata=overlay)
    assert {q.query_id: q.answer for q in qs}["26-003"] == "running"
    fixed, report = apply_errata(load_questions(published), load_errata(overlay), path=overlay)
    assert (report.applied, report.unmatched) == (("26-003",), ("26-004",))
    assert fixed[3] == Question(
        query_id="26-003",
        query="What did the two talk about?",
        answer="running",
        evidence_docids=("26001", "26002"),
        dataset="locomo",
        category="multi-hop",
        evidence_turns=("D1:2; D2:1", "D"),
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]", "expected an object mapping query id -> correction"),
        ('{"26-001": "7 May"}', "entry '26-001' must be an object"),
        ('{"26-001": {"answr": "x"}}', "entry '26-001' has unknown key\\(s\\) answr"),
        ('{"26-001": {"answer": " "}}', "'answer' must be a non-empty string"),
        ('{"26-001": {"aliases": "x"}}', "'aliases' must be a list of strings"),
        ('{"26-001": {"note": "only a note"}}', "corrects nothing"),
        ("{not json", "is not valid JSON"),
    ],
)
def test_invalid_errata_file_is_refused(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "errata.json"
    f.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message):
        load_errata(f)
