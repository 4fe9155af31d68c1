"""Fixtures for the LM layer: a scripted OpenAI-compatible stub and a config pointing at it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kitune.config import KituneConfig, load_config
from kitune.testing.openai_stub import StubServer

StubFactory = Callable[..., StubServer]


@pytest.fixture(autouse=True)
def _fresh_format_memory() -> Iterator[None]:
    """A stub port reused later in the run must not inherit an earlier downgrade."""
    from kitune.lm import reset_format_memory

    reset_format_memory()
    yield
    reset_format_memory()


@pytest.fixture
def stub() -> Iterator[StubServer]:
    """A running stub with an empty script (answers normally until replies are pushed)."""
    with StubServer() as server:
        yield server


@pytest.fixture
def gateway_cfg(stub: StubServer, monkeypatch: pytest.MonkeyPatch) -> Callable[..., KituneConfig]:
    """Build a config whose gateway is the stub (env vars KI_GW_URL / KI_GW_KEY), plus overrides."""
    monkeypatch.setenv("KI_GW_URL", stub.base_url)
    monkeypatch.setenv("KI_GW_KEY", "sk-test-secret-9876")

    def make(**overrides: Any) -> KituneConfig:
        base = {
            "lm.gateway.base_url_env": "KI_GW_URL",
            "lm.gateway.api_key_env": "KI_GW_KEY",
            "lm.gateway.default_model": "m-small",
        }
        base.update(overrides)
        return load_config(overrides=base)

    return make
