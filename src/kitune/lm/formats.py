"""The ``response_format`` capability ladder: json_schema → json_object → prompt-only JSON.

The strongest rung a (model, base URL) accepts is remembered process-wide, so a rejection
downgrades exactly once per rung (case L4); :func:`reset_format_memory` forgets it.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = [
    "FORMAT_LEVELS",
    "apply_level",
    "assume_level",
    "format_level_of",
    "normalise_format",
    "raise_level",
    "remembered_level",
    "reset_format_memory",
]

CapabilityKey = tuple[str, str | None]
"""(LiteLLM model string, base URL or None)."""

FORMAT_LEVELS: tuple[str, ...] = ("json_schema", "json_object", "text")
"""The response_format ladder, strongest first; ``text`` means prompt-only JSON."""


# Capability memory shared by every KituneLM: (model, api_base) -> index into FORMAT_LEVELS.
_FORMAT_LEVEL: dict[CapabilityKey, int] = {}
_FORMAT_LOCK = threading.Lock()


def reset_format_memory() -> None:
    """Forget every remembered response_format downgrade (tests; after a server upgrade)."""
    with _FORMAT_LOCK:
        _FORMAT_LEVEL.clear()


def remembered_level(key: CapabilityKey) -> int:
    """The index into :data:`FORMAT_LEVELS` remembered for ``key`` (0 = json_schema when unknown)."""
    with _FORMAT_LOCK:
        return _FORMAT_LEVEL.get(key, 0)


def raise_level(key: CapabilityKey, level: int) -> None:
    """Remember that ``key`` accepts at most rung ``level`` (never moves back up the ladder)."""
    with _FORMAT_LOCK:
        _FORMAT_LEVEL[key] = max(_FORMAT_LEVEL.get(key, 0), level)


def assume_level(key: CapabilityKey, level: int) -> None:
    """Start ``key`` at rung ``level`` unless something is already remembered for it."""
    with _FORMAT_LOCK:
        _FORMAT_LEVEL.setdefault(key, level)


def format_level_of(rf: Any) -> int | None:
    """The rung a ``response_format`` value asks for (index into :data:`FORMAT_LEVELS`), None when unset.

    A pydantic model class counts as json_schema (LiteLLM sends it so); an unknown dict type is None.
    """
    if rf is None:
        return None
    if isinstance(rf, dict):
        kind = rf.get("type")
        return {"json_schema": 0, "json_object": 1, "text": 2}.get(kind) if isinstance(kind, str) else None
    return 0  # a pydantic model class: LiteLLM sends it as json_schema


def normalise_format(rf: Any) -> Any:
    """``rf`` as the dict LiteLLM would send (a pydantic model class becomes its json_schema form)."""
    if rf is None or isinstance(rf, dict):
        return rf
    import litellm.utils

    return litellm.utils.type_to_response_format_param(rf)  # type: ignore[attr-defined]


def _schema_of(rf: dict[str, Any]) -> dict[str, Any] | None:
    if rf.get("type") == "json_schema":
        inner = rf.get("json_schema") or {}
        schema = inner.get("schema")
        return schema if isinstance(schema, dict) else None
    schema = rf.get("schema")
    return schema if isinstance(schema, dict) else None


def apply_level(rf: dict[str, Any] | None, level: int, *, keep_schema: bool) -> dict[str, Any] | None:
    """``rf`` lowered to rung ``level``: unchanged when it already asks no more; None for prompt-only.

    Args:
        rf: the requested ``response_format`` dict (None: nothing requested).
        level: the remembered rung (0 json_schema, 1 json_object, 2 text).
        keep_schema: keep the schema inside ``json_object`` (llama.cpp's grammar-constrained mode).
    """
    if rf is None:
        return None
    sent = format_level_of(rf)
    if sent is None or sent >= level:
        return rf
    if level >= 2:
        return None
    schema = _schema_of(rf)
    return {"type": "json_object", "schema": schema} if keep_schema and schema else {"type": "json_object"}
