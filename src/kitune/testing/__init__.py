"""Shipped test doubles (replay LM, scripted chat model, recording tracker) and store conformance.

Public names are imported lazily on first use (PEP 562), so importing the package is cheap and
has no side effects; ``__all__`` lists them and ``tests/test_public_api.py`` checks it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "ReplayLM": "kitune.testing.lm",
    "ScriptedChatModel": "kitune.testing.chat",
    "RecordingTracker": "kitune.testing.tracking",
    "make_ki": "kitune.testing.store_contract",
}
"""Public name → the module that defines it."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
