"""Fixtures for the local-model tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kitune.localmodel import stop_local_server
from localmodel_tests.helpers import FAKE_SERVER


@pytest.fixture
def fake_server_script(tmp_path: Path) -> Path:
    """A tiny server that answers GET /v1/models and POST /v1/chat/completions on --port."""
    path = tmp_path / "fake_server.py"
    path.write_text(FAKE_SERVER, encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _no_leftover_singleton() -> Iterator[None]:
    yield
    stop_local_server()
