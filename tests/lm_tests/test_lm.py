"""Tests for kitune.lm against the scripted OpenAI stub (cases L1, L3, L4, L5, D1, D2)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import types
from collections.abc import Callable
from typing import Any

import dspy
import litellm
import pytest

import kitune.localmodel
from kitune.config import KituneConfig, load_config
from kitune.errors import (
    ConfigError,
    EmptyCompletionError,
    LMAuthError,
    LMConnectionError,
    LMContextWindowError,
    LMError,
    LMRateLimitError,
    LMTimeoutError,
    ResponseFormatError,
)
from kitune.lm import (
    KituneLM,
    LiteLLMChatModel,
    LocalJSONAdapter,
    adapter_for,
    build_lm,
    parse_retry_after,
    resolve_role,
)
from kitune.testing.openai_stub import Reply, StubServer
from kitune.usage import TokenLedger, estimate_tokens

CfgFactory = Callable[..., KituneConfig]
MSG = [{"role": "user", "content": "Where is Acme Corp headquartered?"}]


class QA(dspy.Signature):
    """Answer the question."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField()


def _lm(cfg: KituneConfig, role: str = "extract", **kw: Any) -> tuple[KituneLM, TokenLedger]:
    ledger = TokenLedger()
    kw.setdefault("backoff_base_s", 0.01)
    return build_lm(cfg, role, ledger=ledger, **kw), ledger  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- resolve_role (L3)


def test_unset_base_url_env_fails_before_any_request(
    stub: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KI_PROXY_HOST", raising=False)
    monkeypatch.delenv("KI_PROXY_KEY", raising=False)
    cfg = load_config(
        overrides={
            "lm.extract.model": "litellm_proxy/ki-extractor",
            "lm.extract.api_base_env": "KI_PROXY_HOST",
            "lm.extract.api_key_env": "KI_PROXY_KEY",
        }
    )
    with pytest.raises(ConfigError, match=r"^KI_PROXY_HOST is not set") as info:
        build_lm(cfg, "extract")
    assert "lm.extract.api_base_env" in str(info.value)
    assert stub.requests == []


def test_unset_key_env_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KI_PROXY_HOST", "http://127.0.0.1:9/v1")
    monkeypatch.delenv("KI_PROXY_KEY", raising=False)
    cfg = load_config(
        overrides={
            "lm.gateway.base_url_env": "KI_PROXY_HOST",
            "lm.gateway.api_key_env": "KI_PROXY_KEY",
            "lm.gateway.default_model": "m",
        }
    )
    with pytest.raises(ConfigError, match=r"^KI_PROXY_KEY is not set.*lm.gateway.api_key_env"):
        resolve_role(cfg, "judge")


def test_model_precedence_and_gateway_routing(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    cfg = gateway_cfg(**{"lm.judge.model": "anthropic/claude-3-5", "lm.agent.model": "openai/gpt-4o-mini"})
    judge, agent, rewrite = (resolve_role(cfg, r) for r in ("judge", "agent", "rewrite"))
    assert judge.model == "openai/anthropic/claude-3-5"  # the gateway's model name, not Anthropic's host
    assert agent.model == "openai/gpt-4o-mini"
    assert rewrite.model == "openai/m-small"  # gateway.default_model
    assert {judge.api_base, agent.api_base, rewrite.api_base} == {stub.base_url}
    assert rewrite.key_env == "KI_GW_KEY" and rewrite.api_key == "sk-test-secret-9876"
    assert not rewrite.is_local and rewrite.max_tokens == 512 and rewrite.timeout_s == 120.0


def test_role_env_overrides_gateway_and_no_gateway_keeps_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLE_URL", "http://127.0.0.1:1234/v1/")
    monkeypatch.setenv("GW_URL", "http://127.0.0.1:5678/v1")
    cfg = load_config(
        overrides={
            "lm.gateway.base_url_env": "GW_URL",
            "lm.extract.api_base_env": "ROLE_URL",
            "lm.extract.model": "hosted_vllm/qwen",
        }
    )
    r = resolve_role(cfg, "extract")
    assert (r.api_base, r.model, r.base_env) == ("http://127.0.0.1:1234/v1", "hosted_vllm/qwen", "ROLE_URL")
    plain = resolve_role(load_config(overrides={"lm.judge.model": "openai/gpt-4o-mini"}), "judge")
    assert (plain.model, plain.api_base, plain.api_key, plain.is_local) == (
        "openai/gpt-4o-mini",
        None,
        None,
        False,
    )
    local = resolve_role(load_config(), "agent")
    assert local.is_local and local.api_base is None


def test_resolved_repr_masks_the_key(gateway_cfg: CfgFactory) -> None:
    r = resolve_role(gateway_cfg(), "extract")
    assert "sk-test-secret-9876" not in repr(r) and "sk-test-secret-9876" not in str(r)
    assert r.masked_key == "…9876"


# ----------------------------------------------------------------------------- ledger


def test_ledger_totals_equal_the_stubs_reported_usage(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(Reply.ok("a", usage=(100, 10)), Reply.ok("b", usage=(200, 20)), Reply.ok("c", usage=(300, 30)))
    lm, ledger = _lm(gateway_cfg())
    with ledger.stage("extract"):
        assert lm(messages=MSG) == ["a"]
        assert lm(messages=MSG, temperature=0.5) == ["b"]
    with ledger.stage("eval:baseline"):
        assert lm(messages=MSG, max_tokens=64) == ["c"]
    assert ledger.totals()["input_tokens"] == 600 and ledger.totals()["output_tokens"] == 60
    assert ledger.totals(stage="extract")["input_tokens"] == 300
    assert ledger.totals(role="extract", stage="eval:baseline")["output_tokens"] == 30
    assert ledger.totals()["estimated_calls"] == 0
    assert stub.chat_requests[2].body["max_tokens"] == 64
    assert stub.chat_requests[1].body["temperature"] == 0.5


def test_missing_usage_is_estimated_not_zero(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(Reply.no_usage("Acme Corp is headquartered in Springfield."))
    lm, ledger = _lm(gateway_cfg())
    lm(messages=MSG)
    (rec,) = ledger.records
    assert rec.estimated and not rec.failed
    assert rec.input_tokens > 0 and rec.output_tokens > 0


def test_async_call_records_the_callers_stage(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(Reply.ok("x", usage=(5, 2)))
    lm, ledger = _lm(gateway_cfg())

    async def go() -> Any:
        with ledger.stage("optimize:gepa"):
            return await lm.acall(messages=MSG)

    assert asyncio.run(go()) == ["x"]
    assert ledger.totals(stage="optimize:gepa")["input_tokens"] == 5


# ----------------------------------------------------------------------------- auth / proxy


def test_401_names_env_var_and_base_url_and_is_not_retried(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(Reply.unauthorized())
    lm, ledger = _lm(gateway_cfg(**{"lm.extract.num_retries": 3}))
    with pytest.raises(LMAuthError) as info:
        lm(messages=MSG)
    msg = str(info.value)
    assert "KI_GW_KEY" in msg and stub.base_url in msg and "openai/m-small" in msg
    assert "sk-test-secret-9876" not in msg
    assert info.value.retryable is False and info.value.api_base == stub.base_url
    assert len(stub.chat_requests) == 1
    assert ledger.records[0].failed


@pytest.mark.parametrize("reply", [Reply.proxy_page(407), Reply.proxy_page(200)], ids=["407", "html200"])
def test_proxy_in_the_way_is_a_connection_error(
    gateway_cfg: CfgFactory, stub: StubServer, reply: Reply
) -> None:
    stub.push(reply)
    lm, _ = _lm(gateway_cfg(**{"lm.extract.num_retries": 2}))
    with pytest.raises(LMConnectionError, match="proxy") as info:
        lm(messages=MSG)
    assert stub.base_url in str(info.value)
    assert len(stub.chat_requests) == 1  # a proxy page is not transient


def test_connection_refused_is_a_connection_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("DEAD_URL", f"http://127.0.0.1:{port}/v1")
    cfg = load_config(
        overrides={
            "lm.gateway.base_url_env": "DEAD_URL",
            "lm.gateway.default_model": "m",
            "lm.extract.num_retries": 1,
        }
    )
    lm, ledger = _lm(cfg)
    with pytest.raises(LMConnectionError, match=f"127.0.0.1:{port}"):
        lm(messages=MSG)
    assert ledger.totals()["failed_calls"] == 2  # one bounded retry


# ----------------------------------------------------------------------------- L5: 429 and timeouts


@pytest.mark.parametrize(
    "reply",
    [Reply.rate_limited(body_hint="0.3s"), Reply.rate_limited(retry_after_s=0.3)],
    ids=["body_hint", "retry_after_header"],
)
def test_429_waits_at_least_the_hinted_time(gateway_cfg: CfgFactory, stub: StubServer, reply: Reply) -> None:
    stub.push(reply, Reply.ok("done"))
    lm, ledger = _lm(gateway_cfg(), backoff_base_s=0.0)
    assert lm(messages=MSG) == ["done"]
    first, second = stub.chat_requests
    assert second.received_at - first.received_at >= 0.3
    assert ledger.totals()["calls"] == 2 and ledger.totals()["failed_calls"] == 1


def test_429_persisting_is_bounded_and_keeps_the_hint(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.default = Reply.rate_limited(body_hint="50ms")
    lm, _ = _lm(gateway_cfg(**{"lm.extract.num_retries": 2}))
    with pytest.raises(LMRateLimitError) as info:
        lm(messages=MSG)
    assert info.value.retry_after_s == pytest.approx(0.05)
    assert len(stub.chat_requests) == 3


def test_timeout_aborts_near_the_configured_timeout(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(Reply.slow(6.0))
    lm, ledger = _lm(gateway_cfg(**{"lm.extract.timeout_s": 1.0, "lm.extract.num_retries": 0}))
    started = time.monotonic()
    with pytest.raises(LMTimeoutError) as info:
        lm(messages=MSG)
    elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 4.0
    assert info.value.timeout_s == 1.0 and info.value.model == "openai/m-small"
    assert "timeout_s=1" in str(info.value) and info.value.retryable
    assert ledger.records[0].failed


def test_timeout_is_retried_a_bounded_number_of_times(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(Reply.slow(3.0), Reply.ok("late but fine"))
    lm, _ = _lm(gateway_cfg(**{"lm.extract.timeout_s": 0.5, "lm.extract.num_retries": 1}))
    assert lm(messages=MSG) == ["late but fine"]
    assert len(stub.chat_requests) == 2


def test_5xx_retried_then_succeeds(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(Reply.server_error(500), Reply.server_error(503), Reply.ok("ok", usage=(9, 3)))
    lm, ledger = _lm(gateway_cfg(**{"lm.extract.num_retries": 2}))
    assert lm(messages=MSG) == ["ok"]
    assert [r.failed for r in ledger.records] == [True, True, False]
    assert ledger.records[-1].input_tokens == 9


def test_backoff_waits_follow_the_seeded_jitter_and_the_attempt_index(
    gateway_cfg: CfgFactory, stub: StubServer, caplog: pytest.LogCaptureFixture
) -> None:
    import random

    stub.push(Reply.server_error(500), Reply.server_error(503), Reply.ok("ok"))
    lm, ledger = _lm(gateway_cfg(**{"lm.extract.num_retries": 2}), backoff_base_s=0.1, seed=7)
    with caplog.at_level("INFO", logger="kitune.lm"):
        assert lm(messages=MSG) == ["ok"]
    rng = random.Random(7)
    expected = [0.1 * 1 * rng.uniform(0.5, 1.0), 0.1 * 2 * rng.uniform(0.5, 1.0)]
    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert retries == [
        f"openai/m-small: LMError; retry 1/2 in {expected[0]:.2f}s",
        f"openai/m-small: LMError; retry 2/2 in {expected[1]:.2f}s",
    ]
    first, second, third = stub.chat_requests
    assert second.received_at - first.received_at >= expected[0] - 0.01
    assert third.received_at - second.received_at >= expected[1] - 0.01
    assert [r.failed for r in ledger.records] == [True, True, False]


def test_bad_request_is_not_retried(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(Reply.error(400, "messages[0].role is invalid"))
    lm, _ = _lm(gateway_cfg(**{"lm.extract.num_retries": 3}))
    with pytest.raises(LMError, match=r"messages\[0\]\.role is invalid") as info:
        lm(messages=MSG)
    assert not info.value.retryable and len(stub.chat_requests) == 1


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("Please try again in 4.2s.", 4.2),
        ("Please try again in 300ms.", 0.3),
        ("try again in 1m30s", 90.0),
        ("slow down", None),
    ],
)
def test_parse_retry_after_body_hints(text: str, seconds: float | None) -> None:
    got = parse_retry_after(Exception(text))
    assert got == (pytest.approx(seconds) if seconds is not None else None)


# ----------------------------------------------------------------------------- L1: empty completions


def test_empty_choices_content_filter(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(Reply.empty_choices())
    lm, ledger = _lm(gateway_cfg(**{"lm.extract.num_retries": 3}))
    with pytest.raises(EmptyCompletionError) as info:
        lm(messages=MSG)
    assert info.value.reason == "content_filter" and not info.value.retryable
    assert len(stub.chat_requests) == 1
    (rec,) = ledger.records
    assert rec.failed and rec.estimated and rec.input_tokens > 0  # unknown usage is estimated, not 0


def test_empty_choices_without_filter(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(Reply.empty_choices(content_filter=False))
    lm, _ = _lm(gateway_cfg())
    with pytest.raises(EmptyCompletionError) as info:
        lm(messages=MSG)
    assert info.value.reason == "no_choices"


def test_answer_in_reasoning_field(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(Reply.reasoning_only())
    lm, ledger = _lm(gateway_cfg())
    with pytest.raises(EmptyCompletionError, match="max_tokens") as info:
        lm(messages=MSG)
    assert info.value.reason == "answer_in_reasoning_field"
    assert "reasoning" in str(info.value)
    assert ledger.records[0].output_tokens == 64 and not ledger.records[0].estimated


@pytest.mark.parametrize("usage", [None, (11, 0)])
def test_reasoning_only_reply_without_output_usage_is_booked_with_its_reasoning_tokens(
    gateway_cfg: CfgFactory, stub: StubServer, usage: tuple[int, int] | None
) -> None:
    reasoning = "The user asks where Acme is. The document says Springfield, so the answer is Springfield."
    stub.push(Reply.reasoning_only(reasoning, usage=usage))
    lm, ledger = _lm(gateway_cfg())
    with pytest.raises(EmptyCompletionError) as info:
        lm(messages=MSG)
    assert info.value.reason == "answer_in_reasoning_field"
    (rec,) = ledger.records
    assert rec.failed and rec.estimated
    assert rec.output_tokens == estimate_tokens(reasoning) and rec.output_tokens > 10
    assert info.value.output_tokens == rec.output_tokens  # what the caller is told it was billed
    if usage is not None:
        assert rec.input_tokens == 11  # the provider's input count is kept


def test_reply_with_content_and_reasoning_but_no_usage_estimates_both(
    gateway_cfg: CfgFactory, stub: StubServer
) -> None:
    body = json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 1,
            "model": "stub-model",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {
                        "role": "assistant",
                        "content": "Springfield",
                        "reasoning_content": "Acme's headquarters are in Springfield, says the page.",
                    },
                }
            ],
        }
    ).encode()
    stub.push(Reply(status=200, body=body))
    lm, ledger = _lm(gateway_cfg())
    assert lm(messages=MSG)[0]["text"] == "Springfield"
    (rec,) = ledger.records
    expected = estimate_tokens("Acme's headquarters are in Springfield, says the page.\nSpringfield")
    assert rec.estimated and rec.output_tokens == expected


# ----------------------------------------------------------------------------- L4: response_format ladder


@pytest.mark.parametrize("status", [400, 500])
def test_rejected_json_schema_downgrades_exactly_once(
    gateway_cfg: CfgFactory, stub: StubServer, status: int
) -> None:
    stub.push(
        Reply.reject_response_format(status),
        Reply.ok('{"answer": "Springfield"}'),
        Reply.ok('{"answer": "Paris"}'),
    )
    lm, ledger = _lm(gateway_cfg(**{"lm.extract.num_retries": 3}))
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        assert dspy.Predict(QA)(question="Where is Acme?").answer == "Springfield"
        assert dspy.Predict(QA)(question="Capital of France?").answer == "Paris"
    first, second, third = (r.body.get("response_format") for r in stub.chat_requests)
    assert first["type"] == "json_schema"
    assert second == {"type": "json_object"} and third == {"type": "json_object"}  # remembered
    assert lm.fallback_counts == {"json_schema->json_object": 1}
    assert lm.format_level == "json_object"
    assert ledger.totals()["calls"] == 3 and ledger.totals()["failed_calls"] == 1


def test_client_side_unsupported_params_downgrades(
    gateway_cfg: CfgFactory, stub: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = litellm.completion
    seen: list[Any] = []

    def picky(**kw: Any) -> Any:
        seen.append(kw.get("response_format"))
        if kw.get("response_format", {}).get("type") == "json_schema":
            raise litellm.UnsupportedParamsError(
                message="openai does not support parameters: ['response_format']",
                model=kw["model"],
                llm_provider="openai",
            )
        return real(**kw)

    monkeypatch.setattr(litellm, "completion", picky)
    lm, _ = _lm(gateway_cfg())
    schema = {"type": "json_schema", "json_schema": {"name": "ki", "schema": {"type": "object"}}}
    assert lm(messages=MSG, response_format=schema) == ["ok"]
    assert [f["type"] for f in seen] == ["json_schema", "json_object"]
    assert lm.fallback_counts == {"json_schema->json_object": 1}


def test_json_object_rejected_falls_back_to_prompt_only(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(Reply.error(400, "response_format is not supported by this model"), Reply.ok("{}"))
    lm, _ = _lm(gateway_cfg())
    assert lm(messages=MSG, response_format={"type": "json_object"}) == ["{}"]
    assert "response_format" not in stub.chat_requests[1].body
    assert lm.fallback_counts == {"json_object->text": 1}
    assert "response_format" not in lm.supported_params


def test_format_rejection_when_nothing_left_to_drop_raises(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(Reply.reject_response_format(), Reply.reject_response_format())
    lm, _ = _lm(gateway_cfg())
    with pytest.raises(ResponseFormatError, match="rejected response_format"):
        lm(messages=MSG, response_format={"type": "text"})
    assert len(stub.chat_requests) == 1


# ----------------------------------------------------------------------------- D1 / D2: cache


@pytest.fixture
def memory_cache() -> Any:
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    yield
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)


def test_cache_hit_keeps_usage_and_bills_zero(
    gateway_cfg: CfgFactory, stub: StubServer, memory_cache: Any
) -> None:
    stub.push(Reply.ok('{"answer": "Springfield"}', usage=(120, 8)))
    lm, ledger = _lm(gateway_cfg(**{"lm.cache": True}))
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        a = dspy.Predict(QA)(question="Where is Acme?").answer
        b = dspy.Predict(QA)(question="Where is Acme?").answer
    assert a == b == "Springfield"
    assert len(stub.chat_requests) == 1
    miss, hit = ledger.records
    assert (miss.cache_hit, hit.cache_hit) == (False, True)
    assert (hit.input_tokens, hit.output_tokens) == (120, 8)  # original usage kept for reporting
    totals = ledger.totals()
    assert (totals["billed_input_tokens"], totals["billed_output_tokens"], totals["cache_hits"]) == (
        120,
        8,
        1,
    )


def test_cache_key_covers_sampling_params(
    gateway_cfg: CfgFactory, stub: StubServer, memory_cache: Any
) -> None:
    stub.push(Reply.ok("cold"), Reply.ok("hot"), Reply.ok("rollout"))
    lm, ledger = _lm(gateway_cfg(**{"lm.cache": True}))
    assert lm(messages=MSG, temperature=0.0) == ["cold"]
    assert lm(messages=MSG, temperature=1.0) == ["hot"]
    assert lm(messages=MSG, temperature=1.0, rollout_id=7) == ["rollout"]
    assert lm(messages=MSG, temperature=0.0) == ["cold"]  # same params: served from cache
    assert len(stub.chat_requests) == 3
    assert "rollout_id" not in stub.chat_requests[2].body
    assert ledger.totals()["cache_hits"] == 1


def test_retry_after_parse_error_bypasses_and_replaces_cache(
    gateway_cfg: CfgFactory, stub: StubServer, memory_cache: Any
) -> None:
    stub.push(Reply.ok("Let me analyze the document step by step"), Reply.ok('{"answer": "x"}'))
    lm, _ = _lm(gateway_cfg(**{"lm.cache": True}))
    assert lm(messages=MSG) == ["Let me analyze the document step by step"]
    assert lm.call_uncached(messages=MSG) == ['{"answer": "x"}']
    assert lm(messages=MSG) == ['{"answer": "x"}']  # the bad reply was replaced
    assert len(stub.chat_requests) == 2


def test_cache_false_reaches_the_server(gateway_cfg: CfgFactory, stub: StubServer, memory_cache: Any) -> None:
    lm, _ = _lm(gateway_cfg(**{"lm.cache": True}))
    lm(messages=MSG)
    lm(messages=MSG, cache=False)
    assert len(stub.chat_requests) == 2


# ----------------------------------------------------------------------------- ChatModel


def test_chat_model_returns_text_usage_and_finish_reason(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(
        Reply.ok('{"tool": "search"}', usage=(40, 6)), Reply.truncated('{"answer": "Spr', usage=(41, 5))
    )
    ledger = TokenLedger()
    chat = LiteLLMChatModel(gateway_cfg(), "agent", ledger=ledger)
    first = chat.complete(MSG, json_mode=True, max_tokens=32)
    assert (first.text, first.input_tokens, first.output_tokens, first.estimated) == (
        '{"tool": "search"}',
        40,
        6,
        False,
    )
    assert first.finish_reason == "stop"
    assert stub.chat_requests[0].body["response_format"] == {"type": "json_object"}
    assert stub.chat_requests[0].body["max_tokens"] == 32
    second = chat.complete(MSG)
    assert second.finish_reason == "length" and "response_format" not in stub.chat_requests[1].body
    assert ledger.totals(role="agent")["input_tokens"] == 81


def test_chat_model_context_overflow(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(Reply.context_overflow())
    chat = LiteLLMChatModel(gateway_cfg(**{"lm.agent.num_retries": 3}), "agent")
    with pytest.raises(LMContextWindowError, match="context window"):
        chat.complete(MSG)
    assert len(stub.chat_requests) == 1


def test_chat_model_needs_cfg_or_lm() -> None:
    with pytest.raises(ConfigError, match="needs a config or an lm"):
        LiteLLMChatModel()


# ----------------------------------------------------------------------------- local model


def test_local_model_uses_json_object_with_schema(stub: StubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    server = types.SimpleNamespace(api_base=stub.base_url, model_alias="qwen-local")
    monkeypatch.setattr(kitune.localmodel, "get_local_server", lambda local_cfg: server)
    stub.push(Reply.ok('{"answer": "Springfield"}'), Reply.ok('{"answer": "Paris"}'))
    lm, _ = _lm(load_config())
    assert lm.resolved.is_local and lm.model == "openai/qwen-local" and lm.resolved.api_key == "sk-local"
    assert isinstance(adapter_for(lm), LocalJSONAdapter)
    with dspy.context(lm=lm, adapter=adapter_for(lm)):
        assert dspy.Predict(QA)(question="Where?").answer == "Springfield"
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):  # plain adapter: never json_schema for llama.cpp
        assert dspy.Predict(QA)(question="Capital?").answer == "Paris"
    schema = {
        "type": "json_schema",
        "json_schema": {
            "name": "qa",
            "schema": {"type": "object", "properties": {"answer": {"type": "string"}}},
        },
    }
    lm(messages=MSG, response_format=schema)  # the ladder rewrites json_schema into llama.cpp's form
    first, second, third = (r.body["response_format"] for r in stub.chat_requests)
    assert first["type"] == "json_object" and first["schema"]["properties"]["answer"]["type"] == "string"
    assert second == {"type": "json_object"}
    assert third == {"type": "json_object", "schema": schema["json_schema"]["schema"]}
    assert lm.fallback_counts == {}
    assert stub.chat_requests[0].headers["authorization"] == "Bearer sk-local"


# ----------------------------------------------------------------------------- through dspy programs


def test_predict_surfaces_classified_errors_unchanged(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(Reply.slow(5.0))
    lm, _ = _lm(gateway_cfg(**{"lm.extract.timeout_s": 0.5, "lm.extract.num_retries": 0}))
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()), pytest.raises(LMTimeoutError) as info:
        dspy.Predict(QA)(question="Where?")
    assert info.value.timeout_s == 0.5


def test_stream_requests_are_sent_unstreamed_so_usage_is_kept(
    gateway_cfg: CfgFactory, stub: StubServer
) -> None:
    stub.push(Reply.ok("x", usage=(12, 3)))
    lm, ledger = _lm(gateway_cfg())
    assert lm(messages=MSG, stream=True) == ["x"]
    assert "stream" not in stub.chat_requests[0].body
    assert (ledger.records[0].input_tokens, ledger.records[0].estimated) == (12, False)


def test_retry_after_http_date_and_garbage() -> None:
    class HintError(Exception):
        def __init__(self, value: str) -> None:
            super().__init__("rate limited")
            self.response = types.SimpleNamespace(headers={"retry-after": value})

    future = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25.0 <= (parse_retry_after(HintError(future)) or 0.0) <= 31.0
    assert parse_retry_after(HintError("soon")) is None


def test_finish_reason_of_every_call_is_reported(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    from kitune.lm import track_calls

    stub.push(Reply.ok("a"), Reply.ok('[{"title": "cut', finish_reason="length"))
    lm, _ledger = _lm(gateway_cfg())
    with track_calls() as outer:
        lm(messages=MSG)
        with track_calls() as inner:
            assert lm(messages=MSG, max_tokens=8) == ['[{"title": "cut']
    assert [(c.finish_reason, c.content) for c in outer] == [("stop", "a"), ("length", '[{"title": "cut')]
    assert [c.finish_reason for c in inner] == ["length"]
    lm(messages=MSG)  # outside any block: nothing collected, nothing raised
    assert len(outer) == 2


def test_no_zero_temperature_rollout_warning_from_kitune_lm(
    gateway_cfg: CfgFactory, stub: StubServer
) -> None:
    """DSPy warns that rollout_id "has no effect when temperature=0"; KituneLM's cache and recording
    keys include rollout_id, so the warning was wrong and cluttered the demo (newcomer check)."""
    import warnings

    stub.push(Reply.ok("fresh"))
    lm, _ = _lm(gateway_cfg())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert lm(messages=MSG, temperature=0.0, rollout_id=1, cache=False) == ["fresh"]
    assert not [w for w in caught if "rollout_id" in str(w.message)]


def test_ledger_counts_retries_rejections_and_timeouts_as_what_they_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # issue 37 (5): retries after a 429 were counted 0, a 500 was billed its prompt, a timeout 0 output
    from kitune.config import load_config
    from kitune.errors import LMTimeoutError
    from kitune.lm import build_lm
    from kitune.testing.openai_stub import Reply, StubServer
    from kitune.usage import TokenLedger

    with StubServer(
        [Reply.rate_limited(retry_after_s=0.01), Reply.server_error(500), Reply.ok("fine", usage=(40, 3))]
    ) as stub:
        monkeypatch.setenv("KI_ACC_URL", stub.base_url)
        monkeypatch.setenv("KI_ACC_KEY", "sk-test")
        cfg = load_config(
            overrides={
                "lm.gateway.base_url_env": "KI_ACC_URL",
                "lm.gateway.api_key_env": "KI_ACC_KEY",
                "lm.gateway.default_model": "m-small",
                "lm.judge.num_retries": 3,
                "lm.judge.timeout_s": 0.5,
            }
        )
        ledger = TokenLedger()
        lm = build_lm(cfg, "judge", ledger=ledger)
        assert lm("hello") == ["fine"]
        t = ledger.totals()
        assert (t["calls"], t["failed_calls"], t["retries"], t["timeouts"]) == (3, 2, 2, 0)
        assert (t["billed_input_tokens"], t["billed_output_tokens"]) == (40, 3)  # only the answer billed
        assert t["input_tokens"] > 40  # the rejected attempts' prompts are kept as estimates
        stub.push(*[Reply.slow(2.0)] * 4)
        with pytest.raises(LMTimeoutError):
            lm("slow please")
        t = ledger.totals()
        assert t["timeouts"] == 4 and t["retries"] == 2 + 3 and t["billed_output_tokens"] == 3
