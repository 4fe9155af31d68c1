"""Safe MLflow names and params: :func:`sanitize_name` and :func:`prepare_params` (case M1). Pure, no I/O.

Import from :mod:`kitune.tracking.trackers` (re-exported there).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_NAME_CHARS", "MAX_PARAM_CHARS", "PreparedParams", "prepare_params", "sanitize_name"]

MAX_PARAM_CHARS = 500
"""Longest param value logged inline; longer values go to an artifact (some backends store 500)."""

MAX_NAME_CHARS = 250
"""MLflow's limit on param/metric key length."""

_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]+")


def sanitize_name(name: str) -> str:
    r"""Map a param/metric name onto MLflow's safe charset ``[A-Za-z0-9_\\-. /]``.

    ``@`` becomes ``_at_``; every other run of disallowed characters becomes one ``_``;
    leading/trailing ``_`` from replacements are trimmed. Names over 250 chars are cut and given
    an 8-hex hash suffix. Deterministic: the same input always gives the same output.

    Args:
        name: any string.

    Returns:
        A non-empty safe name, e.g. ``recall@10`` → ``recall_at_10``, ``acc[k=5]`` → ``acc_k_5``.
    """
    out = _BAD_CHARS.sub("_", name.replace("@", "_at_"))
    out = re.sub(r"_{2,}", "_", out)
    if out != name:
        out = out.strip("_") or "_"
    if not out.strip():
        out = "_"
    if len(out) > MAX_NAME_CHARS:
        digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
        out = f"{out[: MAX_NAME_CHARS - 9]}_{digest}"
    return out


@dataclass(frozen=True)
class PreparedParams:
    """Params made safe to log (result of :func:`prepare_params`)."""

    params: dict[str, str]
    """Sanitised name → value of at most :data:`MAX_PARAM_CHARS` chars."""
    long_values: dict[str, str]
    """Artifact file (``params/<name>.txt``) → full text, for each truncated value."""
    renamed: dict[str, str]
    """Original name → sanitised name, only for names that changed."""


def prepare_params(params: Mapping[str, Any], *, max_chars: int = MAX_PARAM_CHARS) -> PreparedParams:
    """Sanitise names and truncate long values (case M1); pure, no I/O.

    Non-string values are ``str()``-ed (dicts/lists as sorted JSON). A value longer than
    ``max_chars`` is cut to ``<head>…[sha256:<12 hex>]`` (total ≤ ``max_chars``), its full text
    is returned under ``params/<name>.txt`` and a param ``<name>.artifact`` names that file.

    Args:
        params: name → value.
        max_chars: inline value limit, ≥ 40.

    Returns:
        A :class:`PreparedParams`.

    Raises:
        ValueError: ``max_chars`` < 40.
    """
    if max_chars < 40:
        raise ValueError(f"max_chars must be >= 40, got {max_chars}")
    out: dict[str, str] = {}
    long_values: dict[str, str] = {}
    renamed: dict[str, str] = {}
    for raw_name, raw_value in params.items():
        name = sanitize_name(str(raw_name))
        if name != raw_name:
            renamed[str(raw_name)] = name
        value = _param_text(raw_value)
        if len(value) > max_chars:
            digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:12]
            suffix = f"…[sha256:{digest}]"
            file = f"params/{name.replace('/', '_')}.txt"
            long_values[file] = value
            out[name] = value[: max_chars - len(suffix)] + suffix
            out[sanitize_name(f"{name}.artifact")] = file
        else:
            out[name] = value
    return PreparedParams(params=out, long_values=long_values, renamed=renamed)


def _param_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, tuple)):
        try:
            return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
        except (TypeError, ValueError):
            return str(value)
    return str(value)
