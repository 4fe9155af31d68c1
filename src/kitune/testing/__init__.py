"""Shipped test doubles (replay LM, scripted chat model, recording tracker) and store conformance.

Public names are imported lazily on first use (PEP 562), so importing the package is cheap and
has no side effects; ``__all__`` lists them and ``tests/test_public_api.py`` checks it.
"""

from __future__ import annotations

from kitune.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "ReplayLM": "kitune.testing.lm",
    "ScriptedChatModel": "kitune.testing.chat",
    "RecordingTracker": "kitune.testing.tracking",
    "make_ki": "kitune.testing.store_contract",
}
"""Public name → the module that defines it."""

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
