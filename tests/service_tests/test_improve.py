"""service/tuning/improve: the reflection window (config, LiteLLM, the server's report), the fallback note."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from kitune.config import KituneConfig
from kitune.service.tuning.improve import (
    reflection_context_tokens,
    reflection_fallback,
    server_context_window,
)


def _gateway_cfg(**optimize: object) -> KituneConfig:
    return KituneConfig(
        lm={
            "gateway": {"base_url_env": "KI_TEST_GW", "default_model": "my-own-model"},
            "reflection": {"model": "my-own-model"},
        },
        optimize=dict(optimize),
    )


def _client(routes: dict[str, tuple[int, object]], seen: list[str]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        status, body = routes.get(request.url.path, (404, {"error": "no such path"}))
        return httpx.Response(status, json=body)

    return httpx.Client(transport=httpx.MockTransport(handler))


def test_the_server_report_sizes_an_unknown_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KI_TEST_GW", "http://127.0.0.1:8080/v1")
    seen: list[str] = []
    props = {"/props": (200, {"default_generation_settings": {"n_ctx": 8192}, "total_slots": 4})}
    assert reflection_context_tokens(_gateway_cfg(), client=_client(props, seen)) == 8192
    assert seen == ["/props"]
    seen.clear()
    vllm = {"/v1/models": (200, {"data": [{"id": "my-own-model", "max_model_len": 32768}]})}
    assert reflection_context_tokens(_gateway_cfg(), client=_client(vllm, seen)) == 32768
    assert seen == ["/props", "/v1/models"]
    llama_models = {"/v1/models": (200, {"data": [{"id": "m", "meta": {"n_ctx_train": 32768}}]})}
    assert server_context_window("http://x/v1", client=_client(llama_models, [])) == 32768
    assert reflection_context_tokens(_gateway_cfg(), client=_client({}, [])) is None  # nothing reports it
    not_json = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, text="<html>")))
    assert server_context_window("http://x/v1", client=not_json) is None


def test_config_local_and_litellm_windows_come_first(tmp_path: Path) -> None:
    assert reflection_context_tokens(_gateway_cfg(reflection_context_tokens=6000)) == 6000
    local = KituneConfig(lm={"local": {"n_ctx": 4096}})
    assert reflection_context_tokens(local) == 4096
    known = KituneConfig(lm={"reflection": {"model": "openai/gpt-4o-mini"}})
    assert reflection_context_tokens(known) == 128000  # LiteLLM's max_input_tokens
    seen: list[str] = []
    replay = _gateway_cfg().model_copy(
        update={"lm": _gateway_cfg().lm.model_copy(update={"replay_dir": tmp_path})}
    )
    assert reflection_context_tokens(replay, client=_client({}, seen)) is None and seen == []


def test_reflection_fallback_is_named_only_without_a_reflection_model() -> None:
    assert reflection_fallback(_gateway_cfg()) is None
    split = KituneConfig(
        lm={"gateway": {"default_model": "openai/small"}, "extract": {"model": "openai/big"}}
    )
    assert reflection_fallback(split) == (
        "no reflection model configured (lm.reflection.model): the optimisers reflect with openai/small, the "
        "same model as the rewrite task(s); set lm.reflection.model to a stronger model for better proposals"
    )


def test_the_loop_budget_reads_options_config_and_optimizer_concurrency() -> None:
    from types import SimpleNamespace

    from kitune.optimizers.budget import OptimizerBudget
    from kitune.service.tuning.improve import optimizer_budget

    def env(cfg: KituneConfig, max_calls: int | None) -> SimpleNamespace:
        opts = SimpleNamespace(max_metric_calls=max_calls, budget_minutes=3.0)
        return SimpleNamespace(cfg=cfg, opts=opts, reflection_window=lambda: 2048)

    local = KituneConfig(
        lm={"local": {"parallel": 3}},
        optimize={"max_metric_calls": 40, "min_proposals": 2, "max_input_tokens": 50_000},
    )
    assert optimizer_budget(env(local, None)) == OptimizerBudget(  # type: ignore[arg-type]
        max_metric_calls=40,
        minutes=3.0,
        threads=3,  # the embedded server's slots
        reflection_context_tokens=2048,
        reflection_max_tokens=4096,
        min_proposals=2,
        max_input_tokens=50_000,
    )
    pinned = KituneConfig(agent={"concurrency": 1}, optimize={"max_metric_calls": 40})
    budget = optimizer_budget(env(pinned, 9))  # type: ignore[arg-type]
    assert (budget.max_metric_calls, budget.threads) == (9, 1)  # the flag wins; agent.concurrency set: wins
