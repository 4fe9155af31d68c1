"""Timeouts sized to the local server's measured speed; a timed-out document is retried once, longer."""

from __future__ import annotations

import json
import types
from datetime import UTC, datetime

import dspy
import pytest
from dspy.utils import DummyLM

import kitune.localmodel
from kitune.config import KituneConfig, load_config
from kitune.errors import LMTimeoutError
from kitune.lm import build_lm
from kitune.lm.errors import classify_error
from kitune.lm.roles import resolve_role
from kitune.lm.timeouts import (
    DEFAULT_GEN_TPS,
    DEFAULT_PROMPT_TPS,
    OVERHEAD_S,
    SAFETY,
    RateMeter,
    current_timeout_scale,
    derived_timeout,
    meter_for,
    timeout_scale,
)
from kitune.programs.fact_extractor import FactExtractor
from kitune.retrieval.memory import MemoryStore
from kitune.schema import Document
from kitune.service.pipelines.extraction import TIMEOUT_RETRY_SCALE, extract_corpus


def test_derived_timeout_matches_the_documented_formula() -> None:
    # 700 output tokens, 800 prompt tokens, 20 prompt tok/s, 10 gen tok/s, 4 slots sharing the cores
    got = derived_timeout(
        max_tokens=700, prompt_tokens=800, prompt_tps=20.0, gen_tps=10.0, slots=4, floor_s=120.0
    )
    assert (OVERHEAD_S, SAFETY) == (10.0, 1.5)
    assert got == pytest.approx(10.0 + 1.5 * 4 * (800 / 20 + 700 / 10))  # 670 s
    assert got == pytest.approx(670.0)
    # a fast server and a short reply: the configured timeout_s stays the floor
    assert (
        derived_timeout(max_tokens=16, prompt_tokens=50, prompt_tps=500, gen_tps=100, slots=1, floor_s=120)
        == 120
    )
    with pytest.raises(ValueError, match="rates must be > 0"):
        derived_timeout(max_tokens=1, prompt_tokens=1, prompt_tps=0, gen_tps=1, slots=1, floor_s=1)
    with pytest.raises(ValueError, match="slots must be >= 1"):
        derived_timeout(max_tokens=1, prompt_tokens=1, prompt_tps=1, gen_tps=1, slots=0, floor_s=1)


def test_rate_meter_keeps_the_lowest_recent_rate_and_ignores_tiny_samples() -> None:
    meter = RateMeter(window=2)
    assert meter.rates() == (DEFAULT_PROMPT_TPS, DEFAULT_GEN_TPS) and not meter.measured
    assert meter.observe_timings(
        {"prompt_n": 500, "prompt_per_second": 40.0, "predicted_n": 64, "predicted_per_second": 9.0}
    )
    assert meter.observe_timings(
        {"prompt_n": 500, "prompt_per_second": 60.0, "predicted_n": 64, "predicted_per_second": 12.0}
    )
    assert meter.rates() == (40.0, 9.0) and meter.measured
    meter.observe(prompt_tps=70.0, gen_tps=13.0)  # the window holds 2: the slow first sample leaves
    assert meter.rates() == (60.0, 12.0)
    assert not meter.observe_timings(
        {"prompt_n": 5, "prompt_per_second": 1.0, "predicted_n": 2, "predicted_per_second": 0.5}
    )
    assert meter.rates() == (60.0, 12.0)
    assert not meter.observe_timings(None)
    assert meter.claim_probe() and not meter.claim_probe()


def test_timeout_scale_nests_and_resets() -> None:
    assert current_timeout_scale() == 1.0
    with timeout_scale(2.0):
        with timeout_scale(1.5):
            assert current_timeout_scale() == 3.0
        assert current_timeout_scale() == 2.0
    assert current_timeout_scale() == 1.0
    with pytest.raises(ValueError, match="> 0"), timeout_scale(0):
        pass


def test_local_calls_get_the_derived_timeout_and_provider_calls_keep_timeout_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = types.SimpleNamespace(
        api_base="http://127.0.0.1:9/v1",
        model_alias="qwen-local",
        startup_timings={
            "prompt_n": 130,
            "prompt_per_second": 25.0,
            "predicted_n": 16,
            "predicted_per_second": 8.0,
        },
    )
    monkeypatch.setattr(kitune.localmodel, "get_local_server", lambda local_cfg: server)
    monkeypatch.setitem(kitune.lm.timeouts._METERS, server.api_base, RateMeter())
    cfg = load_config(overrides={"lm.local.parallel": 3, "lm.extract.timeout_s": 60.0})
    lm = build_lm(cfg, "extract")
    assert lm.rate_meter is meter_for(server.api_base) and lm.local_slots == 3
    assert lm.rate_meter.rates() == (25.0, 8.0)  # the start-up probe's timings
    messages = [{"role": "user", "content": "x" * 400}]  # 100 tokens by kitune's estimate (4 chars/token)
    expected = 10.0 + 1.5 * 3 * (100 / 25.0 + 700 / 8.0)
    assert lm.timeout_for(messages, {"max_tokens": 700}) == pytest.approx(expected)
    with timeout_scale(TIMEOUT_RETRY_SCALE):
        assert lm.timeout_for(messages, {"max_tokens": 700}) == pytest.approx(2 * expected)
    gateway = KituneConfig.model_validate(
        {
            "lm": {
                "gateway": {"default_model": "openai/m"},
                "extract": {"timeout_s": 60},
            }
        }
    )
    provider_lm = build_lm(gateway, "extract")
    assert provider_lm.rate_meter is None and provider_lm.timeout_for(messages, {"max_tokens": 700}) == 60.0


def test_every_role_has_a_max_tokens_bound_by_default() -> None:
    cfg = KituneConfig()
    for role in ("extract", "rewrite", "agent", "judge", "reflection"):
        assert 0 < getattr(cfg.lm, role).max_tokens <= 4096, role
        assert resolve_role(cfg, role).max_tokens == getattr(cfg.lm, role).max_tokens


def test_a_gateway_timeout_says_the_provider_may_still_be_generating() -> None:
    import litellm

    exc = litellm.Timeout("timed out", model="m", llm_provider="openai")
    gateway = KituneConfig.model_validate({"lm": {"gateway": {"default_model": "openai/m"}}})
    err = classify_error(exc, resolve_role(gateway, "extract"))
    assert isinstance(err, LMTimeoutError)
    assert "a gateway or provider may still be generating the abandoned request" in str(err)
    local = classify_error(exc, resolve_role(KituneConfig(), "extract"))
    assert "the embedded server stopped the abandoned generation when the connection closed" in str(local)


NOW = datetime(2026, 12, 7, 19, 0, tzinfo=UTC)
DOCS = [Document(docid=f"d{i}", text=f"Company{i} was founded in {1990 + i} in Town{i}.") for i in range(3)]


def _answers() -> dict[str, dict[str, str]]:
    out = {}
    for i in range(3):
        fact = {
            "title": f"Company{i} founded in {1990 + i}",
            "description": f"Company{i} was founded in {1990 + i}.",
            "subject": f"Company{i}",
            "predicate": "founded_in",
            "object": str(1990 + i),
            "evidence_span": f"Company{i} was founded in {1990 + i}",
            "confidence": 0.9,
            "tags": ["org"],
        }
        out[f"Company{i} was founded"] = {"facts_json": json.dumps({"facts": [fact]})}
    return out


def test_a_timed_out_document_is_retried_once_with_twice_the_timeout() -> None:
    cfg = load_config(overrides={"extraction.concurrency": 1})
    extractor = FactExtractor.from_config(cfg)
    real = extractor.extract_document
    calls: list[tuple[str, float]] = []

    def flaky(doc: Document, now: datetime | None = None):  # type: ignore[no-untyped-def]
        calls.append((doc.docid, current_timeout_scale()))
        tries = sum(1 for d, _ in calls if d == doc.docid)
        if (doc.docid == "d1" and tries == 1) or doc.docid == "d2":
            raise LMTimeoutError("m did not answer within timeout_s=120", timeout_s=120.0)
        return real(doc, now=now)

    extractor.extract_document = flaky  # type: ignore[method-assign]
    with dspy.context(lm=DummyLM(_answers())):
        report = extract_corpus(
            DOCS, MemoryStore(), extractor, cfg=cfg, state_path=None, progress=False, now=NOW
        )
    assert sorted(calls) == [("d0", 1.0), ("d1", 1.0), ("d1", 2.0), ("d2", 1.0), ("d2", 2.0)]
    assert report.retried == ("d1", "d2")
    assert report.docs_done == 2 and report.docs_failed == 1 and list(report.failed) == ["d2"]
    assert "the second try, with 2x the timeout" in report.failed["d2"]
    assert ("retried after a timeout", "2") in report.summary_rows()
