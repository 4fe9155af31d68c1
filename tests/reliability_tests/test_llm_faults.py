"""Faults in the LLM path (issue 8 item 1): extraction and eval through the real LM layer.

A :class:`StubServer` on 127.0.0.1 answers per document / question and injects a scripted fault
sequence (429 with Retry-After, 500/503, timeouts, truncated JSON with finish_reason=length, empty
choices, prose). Every unit of work must end accounted for: done, retried-then-done, or failed
with a reason; nothing is fabricated from a cut-off reply.
"""

from __future__ import annotations

import json
from pathlib import Path

import dspy
import pytest
from reliability_helpers import (
    NOW,
    agent_reply,
    extraction_reply,
    facts_for,
    fixture_slice,
    question_key,
    stub_config,
)

from kitune.data.loaders import Question
from kitune.evaluation.agent import Agent
from kitune.evaluation.budget import Budget
from kitune.evaluation.harness import evaluate, read_traces
from kitune.evaluation.tools import closed_book_toolbox
from kitune.ki import ki_id
from kitune.lm import LiteLLMChatModel, build_lm, reset_format_memory
from kitune.programs.fact_extractor import FactExtractor
from kitune.retrieval.memory import MemoryStore
from kitune.schema import Document
from kitune.service.pipelines.extraction import extract_corpus, read_state
from kitune.testing.faults import FaultPlan, FaultyProvider, dspy_docid, fault_reply, scripted
from kitune.testing.openai_stub import StubServer
from kitune.usage import TokenLedger

# What each of the first nine fixture documents gets, attempt by attempt (None: a good reply).
EXTRACT_SCRIPT: list[list[str | None]] = [
    [],  # 0: clean
    ["rate_limited"],  # 1: 429 + Retry-After, retried by the LM layer
    ["server_500", "server_503"],  # 2: two 5xx, then ok
    ["timeout"],  # 3: hangs past timeout_s, retried
    ["truncated", "truncated"],  # 4: cut twice (retried once with more room): first record kept, doc partial
    ["empty_choices"],  # 5: content filter: failed, not retried with the same prompt
    ["prose"],  # 6: no JSON: the extractor retries once (cache bypassed), then ok
    ["prose", "prose"],  # 7: no JSON twice: failed with the parse reason
    ["server_500"] * 3,  # 8: 5xx past num_retries=2: failed with the transport reason
]


@pytest.fixture(autouse=True)
def _gateway_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KI_GW_KEY", "sk-test-secret-9876")
    reset_format_memory()


def _extract(stub: StubServer, docs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **overrides):
    monkeypatch.setenv("KI_GW_URL", stub.base_url)
    cfg = stub_config(
        stub.base_url, tmp_path, **{"lm.extract.num_retries": 2, "lm.extract.timeout_s": 0.5, **overrides}
    )
    ledger = TokenLedger()
    lm = build_lm(cfg, "extract", ledger=ledger, backoff_base_s=0.01, max_wait_s=0.2)
    store = MemoryStore()
    state = tmp_path / "state.jsonl"
    with dspy.context(lm=lm):
        report = extract_corpus(
            docs,
            store,
            FactExtractor.from_config(cfg),
            cfg=cfg,
            ledger=ledger,
            state_path=state,
            progress=False,
            now=NOW,
        )
    return report, store, state, ledger


KEEP_CUT = {"extraction.keep_truncated_records": True}
"""Keep the complete records of a reply still cut after its retry (off by default, issue 40)."""


def test_by_default_a_cut_retry_fails_its_document_and_counts_the_dropped_record(
    fixture_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs, _by_id, provider = _scripted_extraction(fixture_dir)
    with StubServer(responder=provider) as stub:
        report, store, state_path, _ledger = _extract(stub, docs, tmp_path, monkeypatch)
    ids = [d.docid for d in docs]
    truncated = ids[4]
    assert report.docs_done == 5 and report.docs_failed == 4 and report.truncated == ()
    assert report.counters["truncated_records_dropped"] == 1 and "kept_from_truncated" not in report.counters
    failure = report.parse_failed[truncated]
    assert (failure.status, failure.reason, failure.records_dropped) == ("cut_off", "length", 1)
    assert not [k for k in store.iter_kis() if f"doc:{truncated}" in k.tags]
    lines = [json.loads(line) for line in state_path.read_text(encoding="utf-8").splitlines()]
    (line,) = [rec for rec in lines if rec["docid"] == truncated]
    assert line["status"] == "failed" and line["parse_failure"] == failure.to_dict()
    # the unparseable reply (no JSON) is a structured record in the report and the state file
    prose = report.parse_failed[ids[7]]
    assert (prose.status, prose.reason, prose.exception) == ("unparseable", "no_json", "ReplyParseError")
    (line,) = [rec for rec in lines if rec["docid"] == ids[7]]
    assert line["parse_failure"]["raw"] == prose.raw != ""
    assert ("records of cut replies dropped", "1") in report.summary_rows()


def _scripted_extraction(fixture_dir: Path) -> tuple[list[Document], dict[str, Document], FaultyProvider]:
    """The fixture documents, by id, and a provider answering each with its EXTRACT_SCRIPT fault plan."""
    docs = fixture_slice(fixture_dir, len(EXTRACT_SCRIPT))
    by_id = {d.docid: d for d in docs}
    script = {d.docid: EXTRACT_SCRIPT[i] for i, d in enumerate(docs)}
    return docs, by_id, FaultyProvider(good=extraction_reply(by_id), key=dspy_docid, plan=scripted(script))


def test_extraction_under_scripted_faults_accounts_for_every_document(
    fixture_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs, by_id, provider = _scripted_extraction(fixture_dir)
    with StubServer(responder=provider) as stub:
        report, store, state_path, _ledger = _extract(stub, docs, tmp_path, monkeypatch, **KEEP_CUT)

    ids = [d.docid for d in docs]
    # every document accounted for, exactly once
    assert report.docs_total == 9
    assert report.docs_done + report.docs_failed == 9
    assert report.docs_done == 6 and report.docs_failed == 3
    assert set(report.failed) == {ids[5], ids[7], ids[8]}
    assert "content_filter" in report.failed[ids[5]]
    assert "no JSON object found" in report.failed[ids[7]]
    assert "LMServerError" in report.failed[ids[8]] or "500" in report.failed[ids[8]]
    state = read_state(state_path)
    assert state == {i: ("failed" if i in report.failed else "partial" if i == ids[4] else "ok") for i in ids}
    # retries happened where scripted: 1 + 1 + 2 + 1 transport retries, 2 parse retries (docs 6, 7)
    # a cut reply (finish_reason=length) is retried once with more room, never at the same size
    assert [provider.attempts[i] for i in ids] == [1, 2, 3, 2, 2, 1, 2, 2, 3]
    assert report.counters["retries"] == 3 and report.parse_failures == 3
    assert report.counters["truncated_replies"] == 2 and report.counters["truncation_retries"] == 1
    assert report.tokens["failed_calls"] == 1 + 2 + 1 + 1 + 3  # 429, 2x5xx, timeout, empty, 3x5xx
    # the truncated reply: its complete first record kept, the cut-off one never fabricated
    truncated = ids[4]
    assert report.counters["truncated_salvaged"] == 2 and report.counters["kept_from_truncated"] == 1
    assert report.truncated == (truncated,)
    first, second = facts_for(by_id[truncated])
    assert store.get(ki_id(truncated, first["subject"], first["predicate"], first["object"])).title
    stored = {k.id for k in store.iter_kis()}
    assert ki_id(truncated, second["subject"], second["predicate"], second["object"]) not in stored
    # every other ok document has both facts; failed ones have none
    for docid in ids:
        facts = facts_for(by_id[docid])
        expected = 0 if docid in report.failed else (1 if docid == truncated else len(facts))
        present = sum(ki_id(docid, f["subject"], f["predicate"], f["object"]) in stored for f in facts)
        assert present == expected, docid
    assert report.kis_written == store.count() == len(stored)


def test_rerun_after_faults_retries_only_the_failed_documents(
    fixture_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs, _, provider = _scripted_extraction(fixture_dir)
    with StubServer(responder=provider) as stub:
        first, _, state_path, _ = _extract(stub, docs, tmp_path, monkeypatch, **KEEP_CUT)
        before = dict(provider.attempts)
        second, _, _, _ = _extract(stub, docs, tmp_path, monkeypatch, **KEEP_CUT)  # now answers well
    # the partial (cut) document is re-extracted too
    assert second.docs_skipped == 5 and second.docs_done == 4 and second.docs_failed == 0
    retried = {k for k in provider.attempts if provider.attempts[k] > before.get(k, 0)}
    assert retried == set(first.failed) | set(first.truncated)
    assert set(read_state(state_path).values()) == {"ok"}


def test_a_partial_document_is_not_re_extracted_when_no_run_could_complete_it(
    fixture_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no bigger retry (max_retry_tokens at the floor) and no halving: the same request would be
    # cut the same way, so the partial document is final and a rerun retries only the failed ones
    docs, _, provider = _scripted_extraction(fixture_dir)
    final = {"extraction.split_cut_chunks": False, "extraction.max_retry_tokens": 1, **KEEP_CUT}
    with StubServer(responder=provider) as stub:
        first, _, state_path, _ = _extract(stub, docs, tmp_path, monkeypatch, **final)
        before = dict(provider.attempts)
        second, _, _, _ = _extract(stub, docs, tmp_path, monkeypatch, **final)
    assert len(first.truncated) == 1 and first.counters.get("truncation_retries", 0) == 0
    assert second.docs_skipped == 6 and second.docs_done == 3 and second.docs_failed == 0
    retried = {k for k in provider.attempts if provider.attempts[k] > before.get(k, 0)}
    assert retried == set(first.failed)
    assert read_state(state_path)[first.truncated[0]] == "partial"


def test_seeded_random_faults_extraction_every_doc_accounted(
    fixture_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = fixture_slice(fixture_dir, 20)
    by_id = {d.docid: d for d in docs}
    plan = FaultPlan(seed=7, rate=0.35, timeout_delay_s=1.0)
    provider = FaultyProvider(good=extraction_reply(by_id), key=dspy_docid, plan=plan)
    with StubServer(responder=provider) as stub:
        report, store, state_path, _ = _extract(stub, docs, tmp_path, monkeypatch)
    assert sum(provider.injected.values()) > 0
    assert report.docs_done + report.docs_failed == 20
    assert set(read_state(state_path)) == set(by_id)
    for docid, reason in report.failed.items():
        assert reason, docid
        kinds = provider.kinds_for(docid)
        assert any(
            k in ("empty_choices", "prose", "server_500", "server_503", "timeout", "rate_limited")
            for k in kinds
        ), (docid, kinds)
    # a document that only ever got good replies is done with both facts
    for docid in by_id:
        if set(provider.kinds_for(docid)) == {"ok"}:
            assert docid not in report.failed
    assert report.truncated == tuple(sorted(report.truncated))
    assert report.kis_written == store.count()


# -- eval: the agent on LiteLLMChatModel over the same stub ----------------------------------------

EVAL_SCRIPT: list[list[str | None]] = [
    [],
    ["rate_limited"],
    ["server_503", "server_500"],
    ["timeout"],
    ["truncated"],  # cut-off answer JSON: an invalid step, then the good answer (never "Spring")
    ["empty_choices"],  # the call raises EmptyCompletionError: failed with the reason
    ["prose"],  # prose: an invalid step, then the answer
    ["server_500"] * 3,  # past num_retries: failed
]


def _questions(n: int) -> list[Question]:
    return [
        Question(query_id=f"q{i}", query=f"Which town is number {i}?", answer=f"Town {i}", evidence_docids=())
        for i in range(n)
    ]


def test_eval_under_scripted_faults_accounts_for_every_question(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    qs = _questions(len(EVAL_SCRIPT))
    script = {q.query: EVAL_SCRIPT[i] for i, q in enumerate(qs)}
    provider = FaultyProvider(good=agent_reply(qs), key=question_key, plan=scripted(script))
    with StubServer(responder=provider) as stub:
        monkeypatch.setenv("KI_GW_URL", stub.base_url)
        cfg = stub_config(stub.base_url, tmp_path, **{"lm.agent.num_retries": 2, "lm.agent.timeout_s": 0.5})
        ledger = TokenLedger()
        lm = build_lm(cfg, "agent", ledger=ledger, backoff_base_s=0.01, max_wait_s=0.2)

        def factory(q: Question) -> Agent:
            return Agent(LiteLLMChatModel(lm=lm), closed_book_toolbox(), budget=Budget(max_steps=4))

        path = tmp_path / "traces.jsonl"
        traces = evaluate(qs, factory, skill="closed-book", concurrency=2, traces_path=path, progress=False)

    assert [t.query_id for t in traces] == [q.query_id for q in qs]
    status = {t.query_id: t.status for t in traces}
    assert status == {
        "q0": "answered",
        "q1": "answered",
        "q2": "answered",
        "q3": "answered",
        "q4": "answered",
        "q5": "failed",
        "q6": "answered",
        "q7": "failed",
    }
    answers = {t.query_id: t.exact_answer for t in traces if t.status == "answered"}
    assert answers == {q.query_id: q.answer for q in qs if q.query_id in answers}  # none fabricated
    by_id = {t.query_id: t for t in traces}
    assert any("EmptyCompletionError" in e for e in by_id["q5"].errors)
    assert any("content_filter" in e for e in by_id["q5"].errors)
    assert any("LMServerError" in e or "500" in e for e in by_id["q7"].errors)
    assert by_id["q4"].n_steps == 2 and by_id["q6"].n_steps == 2  # one invalid step each
    assert len(read_traces(path)) == len(qs)
    assert [provider.attempts[q.query] for q in qs] == [1, 2, 3, 2, 2, 1, 2, 3]


def test_rate_limit_wait_is_charged_to_the_agents_wall_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Case L5-A: the Retry-After wait happens inside the model call, so the episode's wall time
    (what ``Budget.timeout_s`` is checked against) includes it."""
    qs = _questions(1)
    provider = FaultyProvider(good=agent_reply(qs), key=question_key, plan=scripted({}))
    with StubServer(responder=provider) as stub:
        monkeypatch.setenv("KI_GW_URL", stub.base_url)
        cfg = stub_config(stub.base_url, tmp_path, **{"lm.agent.num_retries": 1})
        lm = build_lm(cfg, "agent", max_wait_s=5.0)
        stub.push(fault_reply("rate_limited", "", retry_after_s=0.4))  # answered before the responder
        episode = Agent(LiteLLMChatModel(lm=lm), closed_book_toolbox(), budget=Budget(max_steps=3)).run(
            qs[0].query
        )
    assert episode.status == "answered" and episode.exact_answer == "Town 0"
    assert len(stub.chat_requests) == 2
    waited = stub.chat_requests[1].received_at - stub.chat_requests[0].received_at
    assert waited >= 0.4  # the hinted wait was honoured ...
    assert episode.wall_time_s >= 0.4 and episode.steps[0].latency_s >= 0.4  # ... and charged to the episode


def test_eval_during_an_outage_is_retried_on_resume_and_counted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Provider down for a whole run: every question fails with the reason; rerunning the same
    command after the outage retries them, and the run's report counts each question once."""
    from kitune.evaluation.report import load_run, summarize
    from kitune.testing.openai_stub import Reply

    qs = _questions(4)
    path = tmp_path / "run" / "traces.jsonl"
    with StubServer(default=Reply.server_error(503)) as stub:
        monkeypatch.setenv("KI_GW_URL", stub.base_url)
        cfg = stub_config(stub.base_url, tmp_path, **{"lm.agent.num_retries": 0})
        lm = build_lm(cfg, "agent", backoff_base_s=0.01, max_wait_s=0.05)
        factory = lambda q: Agent(LiteLLMChatModel(lm=lm), closed_book_toolbox())  # noqa: E731
        down = evaluate(qs, factory, skill="closed-book", traces_path=path, progress=False)
        assert [t.status for t in down] == ["failed"] * 4
        assert all("LMServerError" in t.errors[0] or "503" in t.errors[0] for t in down)
        stub.default = Reply.ok(json.dumps({"answer": {"explanation": "x", "exact_answer": "Town 0"}}))
        up = evaluate(qs, factory, skill="closed-book", traces_path=path, progress=False)
        calls = len(stub.chat_requests)
        again = evaluate(qs, factory, skill="closed-book", traces_path=path, progress=False)
        assert len(stub.chat_requests) == calls  # answered questions are not re-run
    assert [t.status for t in up] == ["answered"] * 4 and again == up
    assert len(path.read_text(encoding="utf-8").splitlines()) == 8  # 4 failed + 4 retried lines
    assert [t.status for t in read_traces(path)] == ["answered"] * 4
    assert len(read_traces(path, latest_only=False)) == 8
    _, traces = load_run(path.parent)
    summary = summarize(traces)
    assert (summary.n_total, summary.n_failed) == (4, 0)
