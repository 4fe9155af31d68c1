"""Concurrent extraction gives the sequential run's KIs, and one failing slot is a counted failure (issue 22).

The models here answer from the request alone (which document it is about) and each document's
reply is delayed by its own amount, the first documents longest, so replies come back out of
submission order: a result that depended on arrival order would differ between the runs.
Three paths: the real LM layer against an OpenAI-compatible stub (with a cut reply, a malformed
one and a failing document), the same run recorded and replayed concurrently, and a plain
``dspy.LM`` (no kitune ledger; the extractor reads how each call ended from the LM's history).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dspy
import litellm
import pytest

from kitune.config import KituneConfig, load_config
from kitune.lm import build_lm, reset_format_memory
from kitune.programs.fact_extractor import FactExtractor
from kitune.programs.sentences import sentence_spans
from kitune.recording import reset_recorders
from kitune.retrieval.memory import MemoryStore
from kitune.schema import Document
from kitune.service.pipelines.extraction import ExtractionReport, extract_corpus
from kitune.testing.faults import dspy_docid, fault_reply
from kitune.testing.openai_stub import RecordedRequest, Reply, StubServer
from kitune.usage import TokenLedger

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)

DOCS = [
    Document(
        docid=f"d{i}",
        title=f"Town{i}",
        text=f"Town{i} is a village in County{i}. It was founded in {1800 + i} by Person{i}. "
        f"Its population was {100 * (i + 1)} in 2011.",
    )
    for i in range(8)
]
BY_ID = {d.docid: d for d in DOCS}
SLOTS = 4


def _facts(doc: Document) -> list[dict[str, Any]]:
    """One fact per sentence of ``doc`` (sentence mode: cites its number), plus one citing nothing valid."""
    out: list[dict[str, Any]] = []
    for n, (start, end) in enumerate(sentence_spans(doc.text), 1):
        words = doc.text[start:end].rstrip(".").split()
        out.append(
            {
                "title": " ".join(words),
                "description": f"{' '.join(words)}, according to the records of {doc.title}.",
                "subject": doc.title,
                "predicate": f"fact_{n}",
                "object": words[-1],
                "evidence_sentences": [n],
                "confidence": 80,
                "tags": ["place"],
            }
        )
    bad = dict(out[0], predicate="bad_citation", evidence_sentences=[99])  # dropped, counted
    return [*out, bad]


def _reply(docid: str) -> str:
    return json.dumps({"facts": _facts(BY_ID[docid])})


def _delay_s(docid: str) -> float:
    """The first documents answer last: d0 waits longest."""
    return 0.03 * (len(DOCS) - int(docid[1:]))


# d2: cut at the token limit once (retried with more room); d5: prose once (retried, cache
# bypassed); d6: HTTP 500 on every attempt (failed after num_retries).
FAULTS: dict[str, list[str]] = {"d2": ["truncated"], "d5": ["prose"], "d6": ["server_500"] * 3}


class _Provider:
    """Stub responder: the reply depends only on (document, attempt); counts replies in flight."""

    def __init__(self, hang: str | None = None, hang_s: float = 0.0) -> None:
        self.attempts: dict[str, int] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.answered: list[str] = []
        self.hang, self.hang_s = hang, hang_s
        self._lock = threading.Lock()

    def __call__(self, request: RecordedRequest) -> Reply:
        docid = dspy_docid(request)
        with self._lock:
            attempt = self.attempts.get(docid, 0)
            self.attempts[docid] = attempt + 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if docid not in BY_ID:  # the warm-up call
                return Reply.ok("ok")
            if docid == self.hang:  # this slot answers long after the client's timeout
                return Reply.slow(self.hang_s, Reply.ok(_reply(docid), usage=(300, 90)))
            time.sleep(_delay_s(docid))
            kinds = FAULTS.get(docid, [])
            kind = kinds[attempt] if attempt < len(kinds) else None
            if kind is None:
                return Reply.ok(_reply(docid), usage=(300, 90))
            return fault_reply(kind, _reply(docid))
        finally:
            with self._lock:
                self.in_flight -= 1
                self.answered.append(docid)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("KI_GW_KEY", "sk-test-secret-9876")
    reset_recorders()
    reset_format_memory()
    yield
    reset_recorders()
    reset_format_memory()


def _cfg(monkeypatch: pytest.MonkeyPatch, url: str, concurrency: int, **extra: object) -> KituneConfig:
    monkeypatch.setenv("KI_GW_URL", url)
    return load_config(
        overrides={
            "lm.gateway.base_url_env": "KI_GW_URL",
            "lm.gateway.api_key_env": "KI_GW_KEY",
            "lm.gateway.default_model": "m-small",
            "lm.extract.num_retries": 2,
            "extraction.concurrency": concurrency,
            "extraction.evidence_mode": "sentences",
            "extraction.write_batch_size": 3,
            **extra,
        }
    )


def _extract(cfg: KituneConfig, lm: Any = None) -> tuple[ExtractionReport, MemoryStore, list[str]]:
    ledger = TokenLedger()
    lm = (
        lm
        if lm is not None
        else build_lm(cfg, "extract", ledger=ledger, backoff_base_s=0.001, max_wait_s=0.01)
    )
    store = MemoryStore()
    order: list[str] = []
    with dspy.context(lm=lm):
        report = extract_corpus(
            DOCS,
            store,
            FactExtractor.from_config(cfg),
            cfg=cfg,
            ledger=ledger,
            progress=False,
            now=NOW,
            on_result=lambda res: order.append(res.docid),
        )
    return report, store, order


def _kis(store: MemoryStore) -> list[dict[str, Any]]:
    return sorted((k.model_dump(mode="json") for k in store.iter_kis()), key=lambda k: k["id"])


def _same_report(a: ExtractionReport, b: ExtractionReport) -> None:
    for name in ("docs_total", "docs_done", "docs_failed", "kis_written", "drops", "counters", "truncated"):
        assert getattr(a, name) == getattr(b, name), name
    assert a.failed.keys() == b.failed.keys()
    for key in ("calls", "input_tokens", "output_tokens", "failed_calls"):
        assert a.tokens[key] == b.tokens[key], key


def test_concurrent_extraction_through_the_lm_layer_equals_the_sequential_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runs = {}
    for n in (1, SLOTS):
        provider = _Provider()
        with StubServer(responder=provider) as stub:
            runs[n] = (*_extract(_cfg(monkeypatch, stub.base_url, n)), provider)
    (seq, seq_store, seq_order, seq_p), (par, par_store, par_order, par_p) = runs[1], runs[SLOTS]

    # the concurrent run really ran SLOTS requests at once, and finished out of submission order
    assert seq_p.max_in_flight == 1 and par_p.max_in_flight == SLOTS
    assert seq_order == [d.docid for d in DOCS]
    assert par_order != sorted(par_order, key=lambda d: int(d[1:]))
    # the same KIs: ids, titles, descriptions, evidence, tags, every field
    assert _kis(par_store) == _kis(seq_store)
    assert len(_kis(par_store)) == 7 * 3  # 3 sentences → 3 KIs for each of the 7 documents done
    ki = next(
        k
        for k in _kis(par_store)
        if k["payload"]["properties"]["predicate"] == "fact_2" and "doc:d3" in k["tags"]
    )
    assert ki["payload"]["evidence"] == ["It was founded in 1803 by Person3."]
    assert ki["title"] == "It was founded in 1803 by Person3"
    _same_report(seq, par)
    assert (par.docs_done, par.docs_failed, list(par.failed)) == (7, 1, ["d6"])
    assert "server error 500" in par.failed["d6"]
    assert par.drops == {} and par.truncated == ()
    # d2's cut reply retried with more room, d5's prose retried once; the 7 invalid citations rejected
    assert par.counters["truncated_replies"] == 1 and par.counters["truncation_retries"] == 1
    assert par.counters["retries"] == 2 and par.parse_failures == 1
    assert par.counters["bad_sentence_number"] == 7
    assert par.tokens["calls"] == 12 and par.tokens["failed_calls"] == 3
    # every document got the same number of requests in both runs
    assert par_p.attempts == seq_p.attempts == {**{d.docid: 1 for d in DOCS}, "d2": 2, "d5": 2, "d6": 3}


def test_a_recorded_sequential_run_replays_concurrently_to_the_same_kis(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rec = tmp_path / "recording"
    with StubServer(responder=_Provider()) as stub:
        seq, seq_store, _ = _extract(_cfg(monkeypatch, stub.base_url, 1, **{"lm.record_dir": str(rec)}))
    assert (rec / "calls.jsonl").is_file()
    reset_recorders()
    cfg = _cfg(monkeypatch, "http://127.0.0.1:9/v1", SLOTS, **{"lm.replay_dir": str(rec)})
    monkeypatch.delenv("KI_GW_URL")  # replay: no provider at all
    par, par_store, _ = _extract(cfg)
    assert _kis(par_store) == _kis(seq_store) and len(_kis(par_store)) == 21
    _same_report(seq, par)
    assert list(par.failed) == ["d6"]


def _docid_of(messages: list[dict[str, Any]] | None) -> str:
    text = "\n".join(str(m.get("content") or "") for m in messages or [])
    return str(re.findall(r"\[\[ ## docid ## \]\]\s*\n([^\n]*)", text)[-1]).strip()


class _DelayedLM(dspy.LM):  # type: ignore[misc]
    """A plain ``dspy.LM`` answering from the request: per-document reply and delay, d2 cut once.

    It also forces the interleaving a shared history allows: once d2's cut reply is in the
    history, it waits (while other documents are in flight) until another document's reply is
    recorded after it, so "the LM's last history record" is not d2's own.
    """

    def __init__(self) -> None:
        super().__init__(model="openai/delayed", cache=False, num_retries=0, max_tokens=1000)
        self.attempts: dict[str, int] = {}
        self.in_flight = 0
        self._other_recorded = threading.Event()
        self._lock = threading.Lock()

    def forward(
        self, prompt: str | None = None, messages: list[dict[str, Any]] | None = None, **kwargs: Any
    ) -> Any:
        docid = _docid_of(messages)
        with self._lock:
            attempt = self.attempts.get(docid, 0)
            self.attempts[docid] = attempt + 1
            self.in_flight += 1
        try:
            time.sleep(_delay_s(docid))
        finally:
            with self._lock:
                self.in_flight -= 1
        content, finish = _reply(docid), "stop"
        if docid == "d2" and attempt == 0:
            # stopped by the token limit just after a complete record: only finish_reason tells
            # the extractor the reply was cut (the retry, with more room, has every fact)
            content, finish = json.dumps({"facts": _facts(BY_ID[docid])[:1]}), "length"
        return litellm.ModelResponse(
            model=self.model,
            choices=[
                {"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": content}}
            ],
            usage={"prompt_tokens": 300, "completion_tokens": 90, "total_tokens": 390},
        )

    def update_history(self, entry: dict[str, Any]) -> None:
        super().update_history(entry)
        if _docid_of(entry.get("messages")) != "d2":
            self._other_recorded.set()
        elif self.attempts.get("d2") == 1 and self.in_flight:
            self._other_recorded.clear()
            assert self._other_recorded.wait(5.0), "no other document was recorded after d2"


def test_a_plain_dspy_lm_reads_each_documents_own_finish_reason_under_concurrency(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    results = {}
    for n in (1, SLOTS):
        cfg = _cfg(monkeypatch, "http://127.0.0.1:9/v1", n)
        lm = _DelayedLM()
        report, store, order = _extract(cfg, lm=lm)
        results[n] = (report, store, lm.attempts, order)
    (seq, seq_store, seq_att, _), (par, par_store, par_att, par_order) = results[1], results[SLOTS]
    assert par_order != sorted(par_order, key=lambda d: int(d[1:]))
    assert _kis(par_store) == _kis(seq_store) and len(_kis(par_store)) == 8 * 3
    for name in ("docs_done", "docs_failed", "drops", "counters", "truncated"):
        assert getattr(par, name) == getattr(seq, name), name
    # only d2's call was cut, so only d2 got a retry with more room — in both runs
    assert par.counters["truncated_replies"] == 1 and par.counters["truncation_retries"] == 1
    assert par_att == seq_att == {**{d.docid: 1 for d in DOCS}, "d2": 2}


def test_one_slot_that_never_answers_is_a_counted_failure_bounded_by_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    provider = _Provider(hang="d1", hang_s=60.0)
    with StubServer(responder=provider) as stub:
        cfg = _cfg(
            monkeypatch, stub.base_url, SLOTS, **{"lm.extract.timeout_s": 0.5, "lm.extract.num_retries": 1}
        )
        build_lm(cfg, "extract")("warm up")  # LiteLLM's first call in a process is slow: not timed
        started = time.monotonic()
        report, store, _ = _extract(cfg)
        wall = time.monotonic() - started
    assert (report.docs_total, report.docs_done, report.docs_failed) == (8, 6, 2)
    assert set(report.failed) == {"d1", "d6"}
    assert "LMTimeoutError" in report.failed["d1"]
    # the first try (one attempt and one retry, each cut off after timeout_s), then the document's
    # one more try with twice the timeout (issue 41), again an attempt and a retry
    assert provider.attempts["d1"] == 4
    assert "d1" in report.retried and "the second try, with 2x the timeout" in report.failed["d1"]
    assert store.count() == 6 * 3
    # two 0.5 s and two 1 s attempts while the other slots carried on (generous for a loaded
    # machine): the run is bounded by the timeout, not by the 60 s the slot would take
    assert wall < 20
    assert report.tokens["failed_calls"] == 4 + 2  # d1: four timeouts; d6: two 500s (num_retries=1)
