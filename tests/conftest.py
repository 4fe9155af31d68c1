"""Shared test set-up: no network, no real LLM, fresh DSPy settings, MLflow in tmp_path."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

# Here, not in retrieval_tests/conftest.py: tests in other folders (evaluation, optimizers, …)
# import the suite first, and a later registration only warns "Module already imported".
pytest.register_assert_rewrite("kitune.testing.store_contract")

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")

SHARED_DATA = (Path(__file__).resolve().parents[1] / ".." / "shared" / "data").resolve()
"""The real data (read-only, never copied into the repo)."""


@pytest.fixture
def fixture_dir() -> Path:
    """The real fixture split (24 questions, 144 docs)."""
    path = SHARED_DATA / "fixture"
    if not path.is_dir():
        pytest.skip(f"shared data not found at {path}")
    return path


@pytest.fixture(autouse=True)
def _clean_dspy_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Reset DSPy settings, disable its disk cache, point MLflow at tmp_path, drop KITUNE_* vars."""
    import dspy

    for key in list(os.environ):
        if key.startswith("KITUNE_"):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    # a command run with --no-progress sets TQDM_DISABLE for its process (cli.common.quiet_progress)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    dspy.settings.configure(lm=None, adapter=None)
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    yield
    dspy.settings.configure(lm=None, adapter=None)


_real_connect = socket.socket.connect


def _guarded_connect(self: socket.socket, address: object) -> object:
    """Allow loopback and Unix sockets only: tests never reach a network."""
    if isinstance(address, tuple) and address:
        host = str(address[0])
        if host not in ("127.0.0.1", "::1", "localhost", "0.0.0.0"):
            raise RuntimeError(f"test tried to reach the network: {address!r}")
    return _real_connect(self, address)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)
    yield
