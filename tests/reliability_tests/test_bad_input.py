"""Bad input (issue 8 item 3): each bad line gets a clear error or a recorded skip naming it.

Already covered elsewhere (see docs/failure-cases-coverage.md): invalid corpus JSON lines
(tests/data_tests/test_loaders.py::test_bad_corpus_line_is_skipped_with_line_number), duplicate
doc ids, qrels naming unknown docs, questions without answers, a corrupt traces line. Here:
non-UTF-8 bytes, empty documents, a 10 MB document, and the same through ``kitune extract`` /
``kitune index`` / ``kitune eval``, where the rest of the run must proceed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dspy
import pytest
from dspy.utils import DummyLM
from reliability_helpers import NOW, facts_for
from typer.testing import CliRunner

from kitune.config import load_config
from kitune.data.loaders import load_corpus_with_report, load_questions
from kitune.errors import DataError
from kitune.programs.fact_extractor import FactExtractor
from kitune.retrieval.memory import MemoryStore
from kitune.schema import Document
from kitune.service.pipelines.extraction import extract_corpus
from kitune.service.serving.stores import index_jsonl

GOOD = [
    Document(
        docid=f"g{i}",
        title=f"Town {i}",
        text=f"Town {i} was founded in {1800 + i} by settlers. It has a mill.",
    )
    for i in range(3)
]


def _line(doc: Document) -> bytes:
    return (json.dumps({"docid": doc.docid, "title": doc.title, "text": doc.text}) + "\n").encode()


def _bad_corpus(path: Path) -> Path:
    """Lines: 1 good, 2 non-UTF-8, 3 good, 4 empty text, 5 not JSON, 6 good, 7 whitespace text."""
    path.write_bytes(
        _line(GOOD[0])
        + b'{"docid": "bin", "text": "caf\xe9 \xff\xfe binary"}\n'
        + _line(GOOD[1])
        + b'{"docid": "empty", "text": ""}\n'
        + b'{"docid": "cut", "text": "no closing\n'
        + _line(GOOD[2])
        + b'{"docid": "blank", "text": "  \\n\\t "}\n'
    )
    return path


def test_corpus_loader_skips_each_bad_line_by_number_and_keeps_the_rest(tmp_path: Path) -> None:
    docs, report = load_corpus_with_report(_bad_corpus(tmp_path / "corpus.jsonl"))
    assert [d.docid for d in docs] == ["g0", "g1", "g2"]
    assert [(s.line, s.reason.split(" (")[0].split(":")[0]) for s in report.skipped] == [
        (2, "not valid UTF-8"),
        (4, "empty text"),
        (5, "invalid JSON"),
        (7, "empty text"),
    ]
    assert "at byte 29" in report.skipped[0].reason
    assert "'empty'" in report.skipped[1].reason and "'blank'" in report.skipped[3].reason
    assert report.loaded == 3 and report.n_skipped == 4


def test_questions_file_with_non_utf8_line_is_a_clear_error_naming_the_line(tmp_path: Path) -> None:
    q = tmp_path / "questions.jsonl"
    q.write_bytes(
        b'{"query_id": "q1", "query": "Who?", "answer": "A"}\n'
        b'{"query_id": "q2", "query": "Wh\xff?", "answer": "B"}\n'
    )
    with pytest.raises(DataError, match=r"questions.jsonl:2: not valid UTF-8 .*re-encode the file as UTF-8"):
        load_questions(q)


def test_ki_index_skips_a_non_utf8_line_and_indexes_the_rest(tmp_path: Path) -> None:
    from kitune.ki import KI

    kis = []
    with dspy.context(lm=DummyLM({d.text[:40]: {"facts_json": json.dumps(facts_for(d))} for d in GOOD})):
        for d in GOOD:
            kis.extend(FactExtractor().extract_document(d, now=NOW).kis)
    assert len(kis) >= 3
    lines = [k.model_dump_json().encode() for k in kis]
    path = tmp_path / "kis.jsonl"
    path.write_bytes(lines[0] + b"\n" + b'{"id": "x", "title": "\xff"}\n' + b"\n".join(lines[1:]) + b"\n")
    store = MemoryStore()
    report = index_jsonl(store, path)
    assert [(b.line, b.message.split(" (")[0]) for b in report.bad_lines] == [(2, "not valid UTF-8")]
    assert report.write.indexed == len(kis) == store.count()
    assert isinstance(store.get(kis[-1].id), KI)


def test_huge_document_is_skipped_without_lm_calls_and_the_run_proceeds(tmp_path: Path) -> None:
    huge = Document(docid="huge", text=("All work and no play makes a dull page. " * 260_000)[:10_000_000])
    assert len(huge.text.encode()) == 10_000_000
    lm = DummyLM({d.text[:40]: {"facts_json": json.dumps(facts_for(d))} for d in GOOD})
    cfg = load_config(overrides={"extraction.concurrency": 2})
    store = MemoryStore()
    state = tmp_path / "state.jsonl"

    def run() -> Any:
        with dspy.context(lm=lm):
            return extract_corpus(
                [GOOD[0], huge, GOOD[1]],
                store,
                FactExtractor.from_config(cfg),
                cfg=cfg,
                progress=False,
                now=NOW,
                state_path=state,
            )

    report = run()
    # skipped with its reason, not failed (a failed document would be retried on every run)
    assert (report.docs_done, report.docs_failed, report.docs_skipped) == (2, 0, 1)
    assert report.too_large["huge"].startswith(
        "document too large: 10000000 characters > extraction.max_doc_chars="
    )
    assert report.counters["lm_calls"] == 2  # one per good document, none for the huge one
    assert store.count() == len(facts_for(GOOD[0])) + len(facts_for(GOOD[1]))
    again = run()
    assert (again.docs_done, again.docs_failed, again.docs_skipped) == (0, 0, 3)
    assert sum('"skipped"' in line for line in state.read_text().splitlines()) == 1  # recorded once


def test_huge_document_loads_and_binary_control_characters_survive_extraction(tmp_path: Path) -> None:
    huge = Document(docid="huge", text="x" * 10_000_000)
    weird = Document(
        docid="nul", text="Mill \x00 Town was founded in 1801 by settlers. \x07 It has a \ufffd mill."
    )
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(_line(huge) + _line(weird) + _line(GOOD[0]))
    docs, report = load_corpus_with_report(path)
    assert [len(d.text) for d in docs] == [10_000_000, len(weird.text), len(GOOD[0].text)]
    assert report.n_skipped == 0
    lm = DummyLM({d.text[:40]: {"facts_json": json.dumps(facts_for(d))} for d in (weird, GOOD[0])})
    cfg = load_config(overrides={"extraction.max_doc_chars": 1_000_000})
    store = MemoryStore()
    with dspy.context(lm=lm):
        rep = extract_corpus(docs, store, FactExtractor.from_config(cfg), cfg=cfg, progress=False, now=NOW)
    assert (rep.docs_done, rep.docs_failed, list(rep.too_large)) == (2, 0, ["huge"])
    assert rep.kis_written == store.count() >= 2


# -- through the CLI ---------------------------------------------------------------------------


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    import kitune.retrieval
    from kitune.cli import _register, app

    store = MemoryStore()
    store.close = lambda: None  # type: ignore[method-assign]
    monkeypatch.setattr(kitune.retrieval, "create_store", lambda cfg: store)
    monkeypatch.setenv("KITUNE_WORKDIR", str(tmp_path / "work"))
    _register()
    return app, store


def test_cli_extract_skips_bad_lines_by_number_and_extracts_the_rest(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reliability_helpers import extraction_reply

    from kitune.testing.faults import FaultyProvider, dspy_docid, scripted
    from kitune.testing.openai_stub import StubServer

    app, store = cli
    corpus = _bad_corpus(tmp_path / "corpus.jsonl")
    provider = FaultyProvider(
        good=extraction_reply({d.docid: d for d in GOOD}), key=dspy_docid, plan=scripted({})
    )
    with StubServer(responder=provider) as stub:
        monkeypatch.setenv("KI_GW_URL", stub.base_url)
        monkeypatch.setenv("KI_GW_KEY", "sk-test-secret-9876")
        monkeypatch.setenv("KITUNE_LM__GATEWAY__BASE_URL_ENV", "KI_GW_URL")
        monkeypatch.setenv("KITUNE_LM__GATEWAY__API_KEY_ENV", "KI_GW_KEY")
        monkeypatch.setenv("KITUNE_LM__GATEWAY__DEFAULT_MODEL", "m-small")
        result = CliRunner().invoke(app, ["extract", "--data", str(corpus), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert sorted(provider.attempts) == ["g0", "g1", "g2"]
    assert store.count() == sum(len(facts_for(d)) for d in GOOD)
    for line, why in ((2, "not valid UTF-8"), (4, "empty text"), (5, "invalid JSON"), (7, "empty text")):
        assert f"corpus.jsonl:{line}: {why}" in result.output, result.output


def test_cli_index_reports_bad_lines_and_exits_1(cli, tmp_path: Path) -> None:
    app, store = cli
    kis = []
    with dspy.context(lm=DummyLM({d.text[:40]: {"facts_json": json.dumps(facts_for(d))} for d in GOOD})):
        for d in GOOD:
            kis.extend(FactExtractor().extract_document(d, now=NOW).kis)
    path = tmp_path / "kis.jsonl"
    path.write_bytes(
        kis[0].model_dump_json().encode()
        + b"\n\xff\xfe\n{not json\n"
        + kis[1].model_dump_json().encode()
        + b"\n"
    )
    result = CliRunner().invoke(app, ["index", str(path)])
    assert result.exit_code == 1
    assert "4 lines, 2 bad, 2 submitted, 2 indexed, 0 failed" in result.output
    assert "line 2: not valid UTF-8" in result.output and "line 3: not JSON" in result.output
    assert store.count() == 2


def test_cli_eval_with_qrels_naming_a_missing_doc_is_a_clear_error(cli, tmp_path: Path) -> None:
    app, _ = cli
    data = tmp_path / "data"
    data.mkdir()
    (data / "corpus.jsonl").write_bytes(b"".join(_line(d) for d in GOOD))
    (data / "queries.tsv").write_text("q1\tWhen was Town 0 founded?\n")
    (data / "ground_truth.jsonl").write_text(json.dumps({"query_id": "q1", "answer": "1800"}) + "\n")
    (data / "qrel_evidence.txt").write_text("q1 Q0 g0 1\nq1 Q0 nowhere 1\n")
    (data / "qrel_golds.txt").write_text("q1 Q0 g0 1\n")
    result = CliRunner().invoke(app, ["eval", "--data", str(data), "--skill", "closed-book"])
    assert result.exit_code == 2, result.output
    message = result.output.replace("\n", "")  # rich wraps long paths
    assert "qrel_evidence.txt:2: qrel names doc id 'nowhere', which is not in the corpus" in message
