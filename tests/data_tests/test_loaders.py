from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kitune.data.loaders import load_corpus, load_corpus_with_report, load_dataset, load_questions
from kitune.errors import DataError


def _copy_layout(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in ("corpus.jsonl", "queries.tsv", "ground_truth.jsonl", "qrel_evidence.txt", "qrel_golds.txt"):
        shutil.copy(src / name, dst / name)
        (dst / name).chmod(0o644)
    return dst


def test_fixture_dir_loads_24_questions_144_docs(fixture_dir: Path) -> None:
    ds = load_dataset(fixture_dir)
    assert len(ds.documents) == 144
    assert len(ds.questions) == 24
    assert ds.report.skipped == ()
    q43 = next(q for q in ds.questions if q.query_id == "43")
    assert q43.answer == "Lunenburg Municipal District"
    assert q43.aliases == ("Lunenburg",)
    assert q43.evidence_docids[:2] == ("100818", "100820")
    assert "100820" in q43.gold_docids
    assert set(q43.gold_docids) <= set(q43.evidence_docids)
    assert q43.dataset == "musique" and q43.hops == "2hop"
    assert ds.questions[0].query_id == "43"  # queries.tsv order
    assert all(q.evidence_docids for q in ds.questions)
    assert {q.dataset for q in ds.questions} == {"musique", "hotpotqa"}


def test_missing_file_names_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist") as e:
        load_corpus(tmp_path / "nope.jsonl")
    assert "nope.jsonl" in str(e.value)
    with pytest.raises(DataError, match="ground_truth"):
        load_questions(tmp_path)


def test_bad_corpus_line_is_skipped_with_line_number(tmp_path: Path) -> None:
    f = tmp_path / "docs.jsonl"
    f.write_text(
        json.dumps({"docid": "1", "text": "a"})
        + "\n{not json\n"
        + json.dumps({"id": 2, "contents": "b"})
        + "\n[]\n",
        encoding="utf-8",
    )
    docs, report = load_corpus_with_report(f)
    assert [d.docid for d in docs] == ["1", "2"]
    assert docs[1].text == "b"
    assert [(s.line, s.reason.split(":")[0]) for s in report.skipped] == [
        (2, "invalid JSON"),
        (4, "expected an object, got list"),
    ]
    assert report.loaded == 2


def test_duplicate_docid_raises_with_both_lines(tmp_path: Path) -> None:
    f = tmp_path / "docs.jsonl"
    f.write_text("\n".join(json.dumps({"docid": "7", "text": t}) for t in "ab") + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"docs.jsonl:2: duplicate docid '7' \(first on line 1\)") as e:
        load_corpus(f)
    assert e.value.line == 2


def test_unknown_qrel_doc_raises(tmp_path: Path, fixture_dir: Path) -> None:
    d = _copy_layout(fixture_dir, tmp_path / "ds")
    with (d / "qrel_evidence.txt").open("a", encoding="utf-8") as fh:
        fh.write("43 Q0 999999999 1\n")
    n = len((d / "qrel_evidence.txt").read_text().splitlines())
    with pytest.raises(DataError, match=rf"qrel_evidence.txt:{n}: qrel names doc id '999999999'"):
        load_questions(d)


def test_bad_question_json_and_missing_answer(tmp_path: Path) -> None:
    f = tmp_path / "q.jsonl"
    f.write_text(json.dumps({"id": "a", "question": "Q?", "answer": "x"}) + "\n{oops\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"q.jsonl:2: invalid JSON") as e:
        load_questions(f)
    assert e.value.line == 2
    f.write_text(json.dumps({"id": "a", "question": "Q?", "answer": ""}) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="question 'a' has no answer"):
        load_questions(f)
    f.write_text(
        "\n".join(json.dumps({"id": "a", "question": "Q?", "answer": "x"}) for _ in range(2)),
        encoding="utf-8",
    )
    with pytest.raises(DataError, match="duplicate query_id 'a'"):
        load_questions(f)


def test_query_without_ground_truth_raises(tmp_path: Path, fixture_dir: Path) -> None:
    d = _copy_layout(fixture_dir, tmp_path / "ds")
    with (d / "queries.tsv").open("a", encoding="utf-8") as fh:
        fh.write("12345\tWho?\n")
    with pytest.raises(DataError, match="question '12345' has no answer"):
        load_questions(d)


def test_plain_jsonl_dataset(tmp_path: Path) -> None:
    docs = tmp_path / "documents.jsonl"
    docs.write_text(
        json.dumps({"id": "d1", "text": "Paris is in France.", "title": "Paris"}) + "\n", encoding="utf-8"
    )
    qs = tmp_path / "questions.jsonl"
    qs.write_text(
        json.dumps(
            {
                "id": "q1",
                "question": "Where is Paris?",
                "answer": "France",
                "aliases": ["FR"],
                "evidence_docids": ["d1"],
            }
        )
        + "\n",
        encoding="utf-8",
    )
    ds = load_dataset(tmp_path)
    assert ds.documents[0].title == "Paris"
    q = ds.questions[0]
    assert (q.query_id, q.query, q.golds, q.evidence_docids) == (
        "q1",
        "Where is Paris?",
        ("France", "FR"),
        ("d1",),
    )
    qs.write_text(json.dumps({"id": "q1", "question": "?", "answer": "x", "evidence_docids": ["zz"]}) + "\n")
    with pytest.raises(DataError, match="cites doc id 'zz'"):
        load_dataset(tmp_path)


@pytest.mark.parametrize("record", [{"id": "b", "answer": "x"}, {"id": "b", "query": "   ", "answer": "x"}])
def test_question_without_text_is_refused_naming_file_and_line(tmp_path: Path, record: dict) -> None:
    # Issue 16: a questions file with no `query` was accepted and blank questions were sent (tokens spent).
    f = tmp_path / "q.jsonl"
    f.write_text(json.dumps({"id": "a", "query": "Q?", "answer": "x"}) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(DataError, match=r"q.jsonl:2: question 'b' has no question text.*'query'") as e:
        load_questions(f)
    assert e.value.line == 2


def test_browsecomp_question_with_blank_text_everywhere_is_refused(tmp_path: Path, fixture_dir: Path) -> None:
    d = _copy_layout(fixture_dir, tmp_path / "ds")
    (d / "queries.tsv").unlink()
    lines = (d / "ground_truth.jsonl").read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    first["query"] = "  "
    (d / "ground_truth.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"question '{first['query_id']}' has no query text"):
        load_questions(d)


def test_json_errors_read_at_column_once(tmp_path: Path) -> None:
    # Issue 16: json's "Unterminated string starting at" became "... starting at at column 12".
    f = tmp_path / "q.jsonl"
    f.write_text('{"id": "a", "query": "unterminated\n', encoding="utf-8")
    with pytest.raises(DataError) as e:
        load_questions(f)
    assert "Unterminated string starting at column 22" in str(e.value) and "at at" not in str(e.value)


def test_skipped_corpus_lines_are_logged_once_per_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from kitune.data.loaders import load_corpus, load_corpus_with_report

    d = tmp_path / "ds"
    d.mkdir()
    (d / "corpus.jsonl").write_text(
        json.dumps({"docid": "d1", "text": "Paris is in France."}) + "\n{bad\n", encoding="utf-8"
    )
    (d / "questions.jsonl").write_text(json.dumps({"id": "q", "query": "Where?", "answer": "France"}) + "\n")
    with caplog.at_level("WARNING", logger="kitune.data.loaders"):
        _, report = load_corpus_with_report(d)  # the caller reports report.skipped itself
        load_questions(d)  # reads the corpus for its doc ids: no second report
        assert [r.getMessage() for r in caplog.records] == []
        assert [s.line for s in report.skipped] == [2]
        load_corpus(d)  # drops the report, so it logs
    assert [r.getMessage() for r in caplog.records] == [
        f"skipped {d / 'corpus.jsonl'}:2: invalid JSON: "
        "Expecting property name enclosed in double quotes at column 2"
    ]
