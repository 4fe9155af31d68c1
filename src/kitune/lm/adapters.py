"""Adapters: which ``dspy.Adapter`` turns a signature into a request for a given LM, and reads the reply.

Every adapter here formats requests exactly as its DSPy parent does; only reading the reply
differs: when DSPy's typed parse fails, values a model wrote in the *type-annotated* form it saw
in the prompt's field descriptions (``int[90]``, ``bool[False]``, ``"float[0.5]"``,
``str[Paris]``) are unwrapped (:func:`unwrap_typed`) and the parse is tried once more.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import dspy
from dspy.adapters.json_adapter import _get_structured_outputs_response_format
from dspy.utils.exceptions import AdapterParseError

from kitune.lm.client import KituneLM

__all__ = [
    "KituneChatAdapter",
    "KituneJSONAdapter",
    "LocalJSONAdapter",
    "adapter_for",
    "default_adapter",
    "typed_value",
    "unwrap_typed",
]

_KINDS = {
    "int": "number",
    "integer": "number",
    "float": "number",
    "number": "number",
    "bool": "bool",
    "boolean": "bool",
    "str": "str",
    "string": "str",
}
_TYPED_RE = re.compile(
    r"(?P<q>\"?)\b(?P<kind>" + "|".join(_KINDS) + r")\[(?P<value>[^\[\]\n]*)\](?P=q)", re.IGNORECASE
)
_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")
_BOOLS = {"true": "true", "yes": "true", "false": "false", "no": "false"}


def _inner(m: re.Match[str]) -> tuple[str, str] | None:
    """``(kind, value)`` of one typed bracket value; None when the value does not fit its type."""
    kind = _KINDS[m.group("kind").lower()]
    value = m.group("value").strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1].strip()
    if kind == "number" and not _NUMBER_RE.fullmatch(value):
        return None
    if kind == "bool":
        if value.lower() not in _BOOLS:
            return None
        value = _BOOLS[value.lower()]
    return kind, value


def typed_value(text: str) -> str | None:
    """The bare value when the WHOLE of ``text`` is one typed bracket value, else None.

    ``"int[90]"`` → ``"90"``; ``"bool[False]"`` → ``"false"``; ``"str['Paris']"`` → ``"Paris"``;
    ``"int[high]"`` (not a number) and ``"90"`` → None. Kinds: ``int``, ``integer``, ``float``,
    ``number``, ``bool``, ``boolean``, ``str``, ``string`` (any case); booleans may be written
    True/False/yes/no and come back as ``"true"``/``"false"``.
    """
    m = _TYPED_RE.fullmatch(text.strip())
    if m is None or m.group("q"):
        return None
    inner = _inner(m)
    return inner[1] if inner is not None else None


def unwrap_typed(text: str) -> str:
    """``text`` with every typed bracket value replaced by its bare value (see :func:`typed_value`).

    A quoted one (a JSON string, ``"int[90]"``) becomes the JSON literal (``90``, ``false``,
    ``"Paris"``), so a JSON reply stays JSON with the right types; an unquoted one (a line of a
    field-per-section reply) becomes the bare value. Values that do not fit their type
    (``int[high]``) are left as written.
    """

    def replace(m: re.Match[str]) -> str:
        inner = _inner(m)
        if inner is None:
            return m.group(0)
        kind, value = inner
        if m.group("q") and kind == "str":
            return json.dumps(value, ensure_ascii=False)
        return value

    return _TYPED_RE.sub(replace, text)


def _parse_unwrapping(
    parse: Callable[[Any, str], dict[str, Any]], signature: Any, completion: str
) -> dict[str, Any]:
    """``parse(signature, completion)``; when that fails, once more on :func:`unwrap_typed`'s text.

    Raises:
        AdapterParseError: the first failure (holding the model's own text) when the reply has
            no typed bracket value or still fails once they are unwrapped.
    """
    try:
        return parse(signature, completion)
    except AdapterParseError as first:
        fixed = unwrap_typed(completion)
        if fixed == completion:
            raise
        try:
            return parse(signature, fixed)
        except AdapterParseError:
            raise first from None


class KituneChatAdapter(dspy.ChatAdapter):  # type: ignore[misc]
    """``dspy.ChatAdapter`` that also reads type-annotated values (``int[90]``, ``bool[False]``)."""

    def parse(self, signature: Any, completion: str) -> dict[str, Any]:
        """Parse like ``dspy.ChatAdapter``, then retry once with :func:`unwrap_typed` applied."""
        return _parse_unwrapping(super().parse, signature, completion)


class KituneJSONAdapter(dspy.JSONAdapter):  # type: ignore[misc]
    """``dspy.JSONAdapter`` that also reads type-annotated values (``"int[90]"``, ``"bool[False]"``)."""

    def parse(self, signature: Any, completion: str) -> dict[str, Any]:
        """Parse like ``dspy.JSONAdapter``, then retry once with :func:`unwrap_typed` applied."""
        return _parse_unwrapping(super().parse, signature, completion)


class LocalJSONAdapter(KituneJSONAdapter):
    """JSONAdapter for llama.cpp's server: the schema goes as ``{"type": "json_object", "schema": ...}``.

    That is llama.cpp's grammar-constrained JSON mode, which it accepts; OpenAI's ``json_schema``
    form it rejects with HTTP 500.
    """

    def _prepare_response_format(self, lm: Any, lm_kwargs: dict[str, Any], signature: Any) -> None:
        try:
            model = _get_structured_outputs_response_format(signature, self.use_native_function_calling)
            schema = model.model_json_schema()
        except Exception:  # open-ended mapping or unschematisable field: plain JSON mode
            lm_kwargs["response_format"] = {"type": "json_object"}
            return
        lm_kwargs["response_format"] = {"type": "json_object", "schema": schema}


def adapter_for(lm: KituneLM) -> dspy.Adapter:
    """The adapter for ``lm``: :class:`LocalJSONAdapter` for the local model, else :class:`KituneJSONAdapter`.

    The JSON adapter sends the signature's output types as ``response_format`` (native structured
    output where the provider supports it; the capability ladder downgrades to ``json_object`` or
    prompt-only JSON when it does not). Scope it with ``dspy.context(lm=lm, adapter=adapter_for(lm))``.
    """
    return LocalJSONAdapter() if lm.resolved.is_local else KituneJSONAdapter()


def default_adapter(lm: Any) -> dspy.Adapter:
    """The adapter a program uses when the DSPy context sets none.

    :func:`adapter_for` for a :class:`KituneLM` (the output types become ``response_format``);
    for any other ``dspy.LM`` (test doubles, plain LiteLLM) a :class:`KituneChatAdapter`
    *without* its JSON fallback, so a reply the adapter cannot parse costs no second call: the
    program's own parser reads the raw reply instead.
    """
    if isinstance(lm, KituneLM):
        return adapter_for(lm)
    return KituneChatAdapter(use_json_adapter_fallback=False)
