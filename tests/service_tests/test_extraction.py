"""Corpus extraction: batched writes, resume, failures isolated, concurrency, tokens and stages."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import dspy
import pytest
from dspy.utils import DummyLM

from kitune.config import KituneConfig, load_config
from kitune.errors import LMAuthError, StoreUnavailableError
from kitune.ki import KI, ki_id
from kitune.programs.fact_extractor import FactExtractor
from kitune.retrieval.base import WriteResult
from kitune.retrieval.memory import MemoryStore
from kitune.schema import Document, Filter
from kitune.service.pipelines.extraction import default_state_path, extract_corpus, load_documents, read_state
from kitune.usage import TokenLedger

NOW = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def _fact(subject: str, predicate: str, obj: str, evidence: str) -> dict[str, object]:
    return {
        "title": f"{subject} {predicate.replace('_', ' ')} {obj}",
        "description": f"{subject} {predicate.replace('_', ' ')} {obj}.",
        "subject": subject,
        "predicate": predicate,
        "object": obj,
        "evidence_span": evidence,
        "confidence": 0.9,
        "tags": ["org"],
    }


DOCS = [
    Document(
        docid=f"d{i}", text=f"Company{i} was founded in {1990 + i} in Town{i}. Company{i} makes widgets."
    )
    for i in range(6)
]


def _answers(bad: Sequence[str] = ()) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for i in range(6):
        key = f"Company{i} was founded"
        if f"d{i}" in bad:
            out[key] = {"facts_json": "Let me think about this document first."}
            continue
        facts = [
            _fact(f"Company{i}", "founded_in", str(1990 + i), f"Company{i} was founded in {1990 + i}"),
            _fact(f"Company{i}", "located_in", f"Town{i}", f"founded in {1990 + i} in Town{i}"),
            _fact(f"Company{i}", "product", "spaceships", "Company makes spaceships"),  # not in the text
        ]
        out[key] = {"facts_json": json.dumps({"facts": facts})}
    return out


def _cfg(**overrides: object) -> KituneConfig:
    base: dict[str, object] = {"extraction.concurrency": 1, "extraction.write_batch_size": 4}
    base.update(overrides)
    return load_config(overrides=base)


class RecordingStore(MemoryStore):
    """A MemoryStore that remembers the size of every upsert batch."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def upsert(self, kis: Sequence[KI]) -> WriteResult:
        self.batches.append(len(kis))
        return super().upsert(kis)


class DownStore(MemoryStore):
    def upsert(self, kis: Sequence[KI]) -> WriteResult:
        raise StoreUnavailableError("store is down", backend="memory")


def _run(lm: dspy.BaseLM, store: MemoryStore, cfg: KituneConfig, state: Path | None, docs=DOCS, **kw):
    with dspy.context(lm=lm):
        return extract_corpus(
            docs,
            store,
            FactExtractor.from_config(cfg),
            cfg=cfg,
            state_path=state,
            progress=False,
            now=NOW,
            **kw,
        )


def test_writes_verified_kis_in_batches_and_reports_counts(tmp_path: Path) -> None:
    store = RecordingStore()
    state = tmp_path / "state.jsonl"
    report = _run(DummyLM(_answers()), store, _cfg(), state)
    assert (report.docs_total, report.docs_done, report.docs_failed, report.docs_skipped) == (6, 6, 0, 0)
    assert report.kis_written == 12 and store.count() == 12
    assert report.drops == {"evidence_not_found": 6}
    assert report.parse_failures == 0 and report.envelope_unwrapped == 0
    assert report.kis_per_doc == 2.0
    assert store.batches == [4, 4, 4]
    ki = store.get(ki_id("d3", "Company3", "located_in", "Town3"))
    assert ki.payload.evidence == ["founded in 1993 in Town3"]
    assert ki.payload.confidence == 90 and ki.payload.last_seen == NOW
    assert read_state(state) == {f"d{i}": "ok" for i in range(6)}
    lines = [json.loads(line) for line in state.read_text().splitlines()]
    assert {line["kis"] for line in lines} == {2}
    assert all(line["prompt_version"] == report.prompt_version for line in lines)
    assert report.tokens["calls"] == 0  # no ledger given


def test_failed_doc_is_isolated_and_retried_on_rerun_without_duplicates(tmp_path: Path) -> None:
    store = MemoryStore()
    state = tmp_path / "state.jsonl"
    first = _run(DummyLM(_answers(bad=("d2",))), store, _cfg(), state)
    assert (first.docs_done, first.docs_failed) == (5, 1)
    assert "no JSON object found" in first.failed["d2"]
    assert first.parse_failures == 2 and first.counters["retries"] == 1
    assert store.count() == 10
    assert read_state(state)["d2"] == "failed"

    lm = DummyLM(_answers())
    second = _run(lm, store, _cfg(), state)
    assert (second.docs_done, second.docs_failed, second.docs_skipped) == (1, 0, 5)
    assert len(lm.history) == 1  # only d2 was sent to the model
    assert second.kis_written == 2
    assert store.count() == 12
    assert read_state(state) == {f"d{i}": "ok" for i in range(6)}

    third = _run(DummyLM(_answers()), store, _cfg(), state)
    assert (third.docs_done, third.docs_skipped, third.kis_written) == (0, 6, 0)


def test_concurrent_run_gives_the_same_kis_as_sequential() -> None:
    seq, par = MemoryStore(), MemoryStore()
    _run(DummyLM(_answers()), seq, _cfg(**{"extraction.concurrency": 1}), None)
    report = _run(DummyLM(_answers()), par, _cfg(**{"extraction.concurrency": 4}), None)
    assert report.docs_done == 6
    dump = lambda s: [k.model_dump() for k in s.iter_kis()]  # noqa: E731
    assert dump(seq) == dump(par) and len(dump(par)) == 12


def test_store_down_aborts_and_marks_nothing_done(tmp_path: Path) -> None:
    state = tmp_path / "state.jsonl"
    with pytest.raises(StoreUnavailableError):
        _run(DummyLM(_answers()), DownStore(), _cfg(), state)
    assert "ok" not in read_state(state).values()


def test_duplicate_docids_are_extracted_once() -> None:
    store = MemoryStore()
    lm = DummyLM(_answers())
    report = _run(lm, store, _cfg(), None, docs=[DOCS[0], DOCS[0], DOCS[1]])
    assert report.docs_total == 2 and len(lm.history) == 2


def test_truncated_state_line_is_ignored(tmp_path: Path) -> None:
    state = tmp_path / "s.jsonl"
    state.write_text('{"docid": "d0", "status": "ok"}\n{"docid": "d1", "sta', encoding="utf-8")
    assert read_state(state) == {"d0": "ok"}
    assert read_state(tmp_path / "missing.jsonl") == {}


def test_default_state_path_is_per_prompt_version(tmp_path: Path) -> None:
    cfg = load_config(overrides={"workdir": str(tmp_path), "corpus_name": "fixture"})
    path = default_state_path(cfg, "extractor@1234abcd")
    assert path == tmp_path / "extraction" / "fixture.extractor-1234abcd.state.jsonl"


def test_load_documents_reads_the_fixture_with_limit(fixture_dir: Path) -> None:
    docs = load_documents(fixture_dir, limit=3)
    assert len(docs) == 3 and all(d.docid and d.text for d in docs)
    assert len(load_documents(fixture_dir)) == 144


# -- through the real LM layer and an OpenAI-compatible stub on 127.0.0.1 -----------------------


def _stub_cfg(stub_url: str, monkeypatch: pytest.MonkeyPatch, **overrides: object) -> KituneConfig:
    monkeypatch.setenv("KI_GW_URL", stub_url)
    monkeypatch.setenv("KI_GW_KEY", "sk-test-secret-9876")
    base: dict[str, object] = {
        "lm.gateway.base_url_env": "KI_GW_URL",
        "lm.gateway.api_key_env": "KI_GW_KEY",
        "lm.gateway.default_model": "m-small",
        "lm.extract.num_retries": 0,
        "extraction.concurrency": 2,
    }
    base.update(overrides)
    return load_config(overrides=base)


def test_raw_reasoning_reply_through_build_lm_records_tokens_under_extract_stage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kitune.lm import build_lm
    from kitune.testing.openai_stub import Reply, StubServer

    doc = DOCS[0]
    facts = [_fact("Company0", "founded_in", "1990", "Company0 was founded in 1990")]
    content = "<think>\nfacts first\n</think>\n```json\n" + json.dumps({"indicators": facts}) + "\n```"
    with StubServer(default=Reply.ok(content, usage=(120, 30))) as stub:
        cfg = _stub_cfg(stub.base_url, monkeypatch)
        ledger = TokenLedger()
        lm = build_lm(cfg, "extract", ledger=ledger)
        store = MemoryStore()
        with dspy.context(lm=lm):
            report = extract_corpus(
                [doc, DOCS[1]],
                store,
                FactExtractor.from_config(cfg),
                cfg=cfg,
                ledger=ledger,
                progress=False,
                now=NOW,
            )
    # the reply has no ChatAdapter field markers: our parser reads the raw completion
    assert report.docs_done == 2 and report.docs_failed == 0
    assert store.count() == 1
    assert store.get(ki_id("d0", "Company0", "founded_in", "1990")).payload.confidence == 90
    assert report.drops == {"evidence_not_found": 1}  # DOCS[1]'s text does not hold the quote
    assert report.counters["fence_stripped"] == 2  # (the LM layer already split off <think>)
    assert report.tokens["calls"] == 2
    assert report.tokens["input_tokens"] == 240 and report.tokens["output_tokens"] == 60
    assert {r.stage for r in ledger.records} == {"extract"}


def test_auth_error_aborts_the_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kitune.lm import build_lm
    from kitune.testing.openai_stub import Reply, StubServer

    with StubServer(default=Reply.unauthorized()) as stub:
        cfg = _stub_cfg(stub.base_url, monkeypatch)
        lm = build_lm(cfg, "extract")
        with dspy.context(lm=lm), pytest.raises(LMAuthError):
            extract_corpus(
                DOCS[:3],
                MemoryStore(),
                FactExtractor.from_config(cfg),
                cfg=cfg,
                state_path=tmp_path / "s.jsonl",
                progress=False,
            )
    assert "ok" not in read_state(tmp_path / "s.jsonl").values()


# -- the `kitune extract` command (thin wrapper over extract_corpus) -----------------------------


def test_cli_extract_on_fixture_with_stub_lm_and_resume(
    fixture_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    import kitune.retrieval
    from kitune.cli import _register, app
    from kitune.testing.openai_stub import Reply, StubServer

    fact = _fact(
        "Abshir Ata Waterfall",
        "located_in",
        "Nookat District",
        "Abshir Ata Waterfall is a geological reserve at Abshir Say River in Nookat District",
    )
    store = MemoryStore()
    store.close = lambda: None  # type: ignore[method-assign]
    monkeypatch.setattr(kitune.retrieval, "create_store", lambda cfg: store)
    _register()
    with StubServer(default=Reply.ok(json.dumps([fact]), usage=(50, 20))) as stub:
        monkeypatch.setenv("KI_GW_URL", stub.base_url)
        monkeypatch.setenv("KI_GW_KEY", "sk-test-secret-9876")
        monkeypatch.setenv("KITUNE_LM__GATEWAY__BASE_URL_ENV", "KI_GW_URL")
        monkeypatch.setenv("KITUNE_LM__GATEWAY__API_KEY_ENV", "KI_GW_KEY")
        monkeypatch.setenv("KITUNE_LM__GATEWAY__DEFAULT_MODEL", "m-small")
        monkeypatch.setenv("KITUNE_WORKDIR", str(tmp_path))
        runner = CliRunner()
        first = runner.invoke(app, ["extract", "--data", str(fixture_dir), "--limit", "3", "--no-progress"])
        assert first.exit_code == 0, first.output
        assert store.count() == 1
        assert "KIs written" in first.output and "token ledger" in first.output
        assert len(stub.chat_requests) == 3
        again = runner.invoke(app, ["extract", "--data", str(fixture_dir), "--limit", "3", "--no-progress"])
        assert again.exit_code == 0, again.output
        assert len(stub.chat_requests) == 3  # all three resumed as done
    states = list((tmp_path / "extraction").glob("corpus.extractor-*.state.jsonl"))
    assert len(states) == 1 and set(read_state(states[0]).values()) == {"ok"}


def test_cli_extract_missing_data_is_a_clean_error(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kitune.cli import _register, app

    _register()
    result = CliRunner().invoke(app, ["extract", "--data", str(tmp_path / "nowhere"), "--no-progress"])
    assert result.exit_code == 2
    assert "nowhere" in result.output


def test_progress_bar_run_gives_the_same_report(capsys: pytest.CaptureFixture[str]) -> None:
    store = MemoryStore()
    seen: list[str] = []
    with dspy.context(lm=DummyLM(_answers())):
        report = extract_corpus(
            DOCS[:2],
            store,
            FactExtractor(),
            cfg=_cfg(),
            progress=True,
            now=NOW,
            on_result=lambda r: seen.append(r.docid),
        )
    assert (report.docs_done, report.kis_written) == (2, 4)
    assert sorted(seen) == ["d0", "d1"]
    assert "extract" in capsys.readouterr().err


def test_flush_interval_commits_each_finished_doc_so_a_crash_loses_little(tmp_path: Path) -> None:
    # Found by following the README: with the local model (~30 s/doc) a 256-KI batch meant a
    # kill -9 lost every finished document. flush_interval_s=0 writes after each document.
    store = RecordingStore()
    state = tmp_path / "state.jsonl"
    seen_in_state: list[set[str]] = []
    cfg = _cfg(**{"extraction.write_batch_size": 256, "extraction.flush_interval_s": 0.0})
    _run(
        DummyLM(_answers()),
        store,
        cfg,
        state,
        on_result=lambda r: seen_in_state.append(set(read_state(state))),
    )
    assert store.batches == [2, 2, 2, 2, 2, 2]
    # each finished document is in the state file before the next result is reported; documents
    # may finish in any order (extraction runs concurrently), so check growth, not names
    assert [len(s) for s in seen_in_state] == [1, 2, 3, 4, 5, 6]
    assert all(a < b for a, b in itertools.pairwise(seen_in_state))
    assert seen_in_state[-1] == {"d0", "d1", "d2", "d3", "d4", "d5"}


# -- lifecycle (issue 14) ---------------------------------------------------------------------


def test_rerun_of_an_unchanged_corpus_refreshes_last_seen_without_llm_calls(tmp_path: Path) -> None:
    """The reproduced bug: KIs extracted 15 days ago, same corpus re-run, sweep → all still active."""
    from datetime import timedelta

    from kitune.service.serving.stores import expire_kis

    store = MemoryStore()
    state = tmp_path / "state.jsonl"
    first = _run(DummyLM(_answers()), store, _cfg(), state)
    assert first.kis_written == 12
    later = NOW + timedelta(days=15)
    lm = DummyLM([])  # any LM call would fail: there is no answer to give
    with dspy.context(lm=lm):
        second = extract_corpus(
            DOCS,
            store,
            FactExtractor.from_config(_cfg()),
            cfg=_cfg(),
            state_path=state,
            progress=False,
            now=later,
        )
    assert lm.history == []
    assert (second.docs_done, second.docs_skipped, second.docs_changed, second.kis_refreshed) == (0, 6, 0, 12)
    assert {k.payload.last_seen for k in store.iter_kis()} == {later}
    swept = expire_kis(store, now=later + timedelta(days=1), stale_after=timedelta(days=7))
    assert (swept.stale, swept.expired) == (0, 0)
    assert store.count(Filter(statuses=("active",))) == 12


def test_changed_document_is_re_extracted_and_a_gone_document_starts_its_clock(tmp_path: Path) -> None:
    from datetime import timedelta

    from kitune.service.serving.stores import expire_kis

    store = MemoryStore()
    state = tmp_path / "state.jsonl"
    _run(DummyLM(_answers()), store, _cfg(), state)
    lines = [json.loads(line) for line in state.read_text().splitlines()]
    assert all(len(line["hash"]) == 32 for line in lines)
    later = NOW + timedelta(days=10)
    changed = Document(docid="d0", text=DOCS[0].text + " Company0 was renamed.")
    corpus = [changed, *DOCS[1:5]]  # d5 left the corpus
    lm = DummyLM(_answers())
    with dspy.context(lm=lm):
        report = extract_corpus(
            corpus,
            store,
            FactExtractor.from_config(_cfg()),
            cfg=_cfg(),
            state_path=state,
            progress=False,
            now=later,
        )
    assert len(lm.history) == 1  # only the changed d0 went to the model
    assert (report.docs_done, report.docs_skipped, report.docs_changed, report.kis_refreshed) == (1, 4, 1, 8)
    seen = {k.evidence_doc_ids[0]: k.payload.last_seen for k in store.iter_kis()}
    assert seen == {**{f"d{i}": later for i in range(5)}, "d5": NOW}
    swept = expire_kis(store, now=NOW + timedelta(days=15), stale_after=timedelta(days=7))
    assert (swept.stale, swept.expired) == (0, 2)  # d5's two KIs: unseen 15 days > 2 x 7
    assert {k.evidence_doc_ids[0] for k in store.iter_kis(Filter(statuses=("expired",)))} == {"d5"}
    assert store.count() == 12  # nothing deleted


def test_derived_kis_are_kept_while_their_evidence_documents_exist(tmp_path: Path) -> None:
    from datetime import timedelta

    from kitune.testing.store_contract import make_ki

    store = MemoryStore()
    old = NOW - timedelta(days=20)
    present = make_ki("Company1", "Company2", docid="d1", subtype="disambiguation", last_seen=old)
    present.evidence_doc_ids = ["d1", "d2"]
    gone = make_ki("Company1", "Company9", docid="d1", subtype="disambiguation", last_seen=old)
    gone.evidence_doc_ids = ["d1", "d9"]
    source = make_ki("Corpus", "Widgets", docid="d3", subtype="source_description", last_seen=old)
    store.upsert([present, gone, source])
    report = _run(DummyLM(_answers()), store, _cfg(), None)
    assert report.derived_refreshed == 2
    assert store.get(present.id).payload.last_seen == NOW
    assert store.get(source.id).payload.last_seen == NOW
    assert store.get(gone.id).payload.last_seen == old
    # "age": derived KIs are only refreshed when re-written
    store2 = MemoryStore()
    store2.upsert([present])
    aged = _run(DummyLM(_answers()), store2, _cfg(**{"lifecycle.derived_retention": "age"}), None)
    assert aged.derived_refreshed == 0 and store2.get(present.id).payload.last_seen == old


def test_state_written_before_hashes_counts_as_unchanged(tmp_path: Path) -> None:
    store = MemoryStore()
    state = tmp_path / "state.jsonl"
    _run(DummyLM(_answers()), store, _cfg(), state)
    legacy = [json.loads(line) for line in state.read_text().splitlines()]
    state.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "hash"}) + "\n" for r in legacy))
    lm = DummyLM([])
    report = _run(lm, store, _cfg(), state)
    assert lm.history == [] and (report.docs_skipped, report.kis_refreshed) == (6, 12)


def test_progress_to_a_file_is_one_plain_line_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    # a redirected stderr (cron, CI, `> log`) got nothing, then a burst of bar redraws
    import io
    import sys

    from kitune.service.pipelines.extraction import _Progress

    out = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", out)
    bar = _Progress(True, 3, None, 0, interval_s=3600)
    assert bar.plain
    bar.advance(1, 2, 0)  # the first line is written at once
    bar.advance(2, 4, 0)  # inside the interval: nothing
    bar.advance(3, 5, 1)  # the last document: always a line
    bar.close()
    lines = out.getvalue().splitlines()
    assert [line.split(" · ")[0] for line in lines] == ["extract 1/3", "extract 3/3"]
    assert "2.5 KIs/doc" in lines[-1] and "1 failed" in lines[-1] and "\x1b" not in out.getvalue()
