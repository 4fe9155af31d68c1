"""Adapters: which ``dspy.Adapter`` turns a signature into a request for a given LM, and reads the reply.

Every adapter here formats requests exactly as its DSPy parent does (the requests are
byte-identical); only reading the reply differs, so programs read their typed output fields
directly whatever shape the model wrote (:func:`parse_leniently`):

* a signature whose one output is a list of pydantic records (the extractor's ``facts``) is read
  **per record** (:func:`kitune.lm.replies.read_records`): the list is found in the reply (bare,
  under a wrapper key, inside fences, after reasoning), each record is validated by its own model
  and a bad one is dropped, reported and counted instead of failing the whole reply; an element
  ``json_repair`` had to fix is reported, never kept (evidence must stay verbatim). The field's
  value is a :class:`kitune.lm.replies.Records` list that carries ``errors`` and ``counters``;
* any other signature is parsed as DSPy's parent adapter does; when that fails, values the model
  wrote in the *type-annotated* form it saw in the prompt's field descriptions (``int[90]``,
  ``bool[False]``, ``"float[0.5]"``, ``str[Paris]``) are unwrapped (:func:`unwrap_typed`) and the
  parse is tried once more; when that fails too, the first JSON object anywhere in the reply is
  read (:func:`kitune.lm.replies.read_json_object`): its keys name the output fields, or, for a
  single output field typed as a pydantic model, the object is that model's value.

A reply that still cannot be read raises :class:`ReplyParseError` (an ``AdapterParseError``) that
says why: ``reason`` is ``no_json``, ``cut_off`` or ``malformed_json`` (no usable JSON) or
``invalid_fields`` (JSON found, but an output field is missing or fails validation).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, get_args, get_origin

import dspy
from dspy.adapters.utils import apply_output_field_defaults, parse_value
from dspy.utils.exceptions import AdapterParseError
from pydantic import BaseModel, ConfigDict, create_model

from kitune.errors import ParseError
from kitune.lm.calls import note_parse_counts, note_reply
from kitune.lm.client import KituneLM
from kitune.lm.replies import find_json_object, read_records, repair_surrogates, reply_failure

__all__ = [
    "KituneChatAdapter",
    "KituneJSONAdapter",
    "LocalJSONAdapter",
    "ReplyParseError",
    "adapter_for",
    "default_adapter",
    "output_schema",
    "parse_leniently",
    "record_list_field",
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


def _close_objects(part: dict[str, Any]) -> None:
    """Every object lists all its properties as required and allows no others (nested too)."""
    if part.get("type") == "object":
        props = part.get("properties")
        if props is not None:
            part["required"] = list(props.keys())
            part["additionalProperties"] = False
            for sub in props.values():
                if isinstance(sub, dict):
                    _close_objects(sub)
        else:
            part["properties"] = {}
            part["required"] = []
            part["additionalProperties"] = False
    if part.get("type") == "array" and isinstance(part.get("items"), dict):
        _close_objects(part["items"])
    for key in ("$defs", "definitions"):
        for sub in (part.get(key) or {}).values():
            _close_objects(sub)


def output_schema(signature: Any, *, skip_tool_calls: bool = True) -> dict[str, Any]:
    """The JSON schema of a signature's outputs, every object closed, for a structured-output request.

    Built from the public ``signature.output_fields`` with pydantic (the same schema DSPy's JSON
    adapter derives, so recorded requests keep their bytes; ``tests/lm_tests`` compares the two).

    Args:
        signature: a ``dspy.Signature`` class.
        skip_tool_calls: leave out a ``dspy.ToolCalls`` output (native function calling sends it
            as tools instead).

    Raises:
        ValueError: an output is an open-ended mapping (``dict[...]``): no closed schema exists;
            the caller falls back to plain JSON mode.
    """
    fields: dict[str, Any] = {}
    for name, field in signature.output_fields.items():
        annotation = field.annotation
        if get_origin(annotation) is dict:
            raise ValueError(f"output {name!r} is an open-ended mapping: no closed schema for it")
        if skip_tool_calls and annotation == dspy.ToolCalls:
            continue
        fields[name] = (annotation, field.default if hasattr(field, "default") else ...)
    model = create_model("DSPyProgramOutputs", __config__=ConfigDict(extra="forbid"), **fields)
    schema = model.model_json_schema()
    for prop in schema.get("properties", {}).values():
        prop.pop("json_schema_extra", None)
    _close_objects(schema)
    return schema


class ReplyParseError(AdapterParseError):  # type: ignore[misc]
    """A reply kitune's lenient parse could not read either (see :func:`parse_leniently`).

    Attributes:
        reason: ``no_json``, ``cut_off`` or ``malformed_json`` (no usable JSON in the reply, as
            :func:`kitune.lm.replies.reply_failure` names it) or ``invalid_fields`` (JSON found, but
            an output field is missing or fails validation).
        detail: what was wrong, naming the field (``"JSON cut off: the JSON object opened at …"``).
        lm_response: the reply as the adapter received it.
    """

    def __init__(self, adapter_name: str, signature: Any, lm_response: str, cause: ParseError) -> None:
        self.reason = reply_failure(cause) or "invalid_fields"
        self.detail = str(cause)
        super().__init__(adapter_name, signature, lm_response, message=self.detail)


def record_list_field(signature: Any) -> tuple[str, type[BaseModel]] | None:
    """``(name, record model)`` when the signature's only output is ``list[<pydantic model>]``, else None."""
    fields = signature.output_fields
    if len(fields) != 1:
        return None
    ((name, field),) = fields.items()
    annotation = field.annotation
    if get_origin(annotation) is not list:
        return None
    args = get_args(annotation)
    model = args[0] if len(args) == 1 else None
    if isinstance(model, type) and issubclass(model, BaseModel):
        return name, model
    return None


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _fields_from_object(signature: Any, completion: str, counts: Counter[str]) -> dict[str, Any]:
    """The output fields read from the first JSON object in the reply (validated by their types).

    Raises:
        ParseError: no JSON object (``no_json`` / ``cut_off`` / ``malformed_json``), or an output
            field missing or invalid (the message names it).
    """
    obj = find_json_object(completion, counts)
    lowered = {str(k).strip().lower(): v for k, v in obj.items()}
    fields = signature.output_fields
    found: dict[str, Any] = {}
    for name in fields:
        if name.lower() in lowered:
            found[name] = lowered[name.lower()]
    if not found and len(fields) == 1:
        ((name, field),) = fields.items()
        if _is_model(field.annotation):  # the object is the one output's value
            found[name] = obj
    values: dict[str, Any] = {}
    for name, value in found.items():
        annotation = fields[name].annotation
        if _is_model(annotation) and isinstance(value, str):
            value = find_json_object(value, counts)  # a stringified object
        try:
            values[name] = repair_surrogates(parse_value(value, annotation), counts)
        except ValueError as e:  # pydantic's ValidationError is a ValueError
            raise ParseError(f"output field {name!r} is invalid: {e}", raw=completion) from None
    values = apply_output_field_defaults(signature, values)
    missing = [name for name in fields if name not in values]
    if missing:
        raise ParseError(
            f"the reply's JSON object has no output field {', '.join(map(repr, missing))}", raw=completion
        )
    return values


def parse_leniently(
    parse: Callable[[Any, str], dict[str, Any]], signature: Any, completion: str, *, adapter_name: str
) -> dict[str, Any]:
    r"""Read ``completion`` into the signature's output fields, as leniently as the types allow.

    Args:
        parse: the parent adapter's strict ``parse(signature, completion)``.
        signature: the DSPy signature.
        completion: the reply text.
        adapter_name: named in a :class:`ReplyParseError`.

    The reply is reported to :func:`kitune.lm.track_replies` first, and the counters of its read
    to :func:`kitune.lm.track_parse_counts` (a record list's ``counters``; for other signatures
    ``surrogates_replaced``).

    Every string value is encodable as UTF-8 (:func:`kitune.lm.repair_surrogates`: a JSON escape
    of half an emoji pair, ``"\ud83d"``, is read as U+FFFD and counted as ``surrogates_replaced``).

    Returns:
        ``{field name: value}`` for every output field. A record-list output (see
        :func:`record_list_field`) is a :class:`kitune.lm.replies.Records` with the valid records,
        the dropped ones (``errors``) and ``counters``; it may be empty with errors (every record
        rejected), which is the program's to judge.

    Raises:
        ReplyParseError: the reply holds no usable JSON, or (other signatures) the strict parse,
            the typed-value retry and the JSON-object reading all failed.
    """
    note_reply(completion)
    records = record_list_field(signature)
    if records is not None:
        name, model = records
        try:
            read = read_records(completion, model, keys=(name.lower(),))
        except ParseError as e:
            raise ReplyParseError(adapter_name, signature, completion, e) from None
        note_parse_counts(read.counters)
        return {name: read}
    counts: Counter[str] = Counter()
    values: dict[str, Any] | None = None
    try:
        values = parse(signature, completion)
    except AdapterParseError as first:
        fixed = unwrap_typed(completion)
        if fixed != completion:
            with contextlib.suppress(AdapterParseError):
                values = parse(signature, fixed)
        if values is None:
            try:
                values = _fields_from_object(signature, fixed, counts)
            except ParseError as e:
                raise ReplyParseError(adapter_name, signature, completion, e) from first
    values = {name: repair_surrogates(value, counts) for name, value in values.items()}
    note_parse_counts(counts)
    return values


class KituneChatAdapter(dspy.ChatAdapter):  # type: ignore[misc]
    """``dspy.ChatAdapter`` whose ``parse`` is lenient (:func:`parse_leniently`); requests unchanged.

    Its JSON fallback (a second call after an unreadable reply, on unless
    ``use_json_adapter_fallback=False``) is a :class:`KituneJSONAdapter`.
    """

    def parse(self, signature: Any, completion: str) -> dict[str, Any]:
        """Parse like ``dspy.ChatAdapter``, leniently (see :func:`parse_leniently`).

        Raises:
            ReplyParseError: the reply could not be read.
        """
        return parse_leniently(super().parse, signature, completion, adapter_name=type(self).__name__)

    def _make_json_adapter_fallback(self) -> dspy.Adapter:
        return KituneJSONAdapter(
            use_native_function_calling=self.use_native_function_calling,
            parallel_tool_calls=self.parallel_tool_calls,
        )


class KituneJSONAdapter(dspy.JSONAdapter):  # type: ignore[misc]
    """``dspy.JSONAdapter`` whose ``parse`` is lenient (:func:`parse_leniently`); requests unchanged."""

    def parse(self, signature: Any, completion: str) -> dict[str, Any]:
        """Parse like ``dspy.JSONAdapter``, leniently (see :func:`parse_leniently`).

        Raises:
            ReplyParseError: the reply could not be read.
        """
        return parse_leniently(super().parse, signature, completion, adapter_name=type(self).__name__)


class LocalJSONAdapter(KituneJSONAdapter):
    """JSONAdapter for llama.cpp's server: the schema goes as ``{"type": "json_object", "schema": ...}``.

    That is llama.cpp's grammar-constrained JSON mode, which it accepts; OpenAI's ``json_schema``
    form it rejects with HTTP 500.

    Args:
        field_limits: property name → JSON-schema keywords added to every object schema of the
            output (top level and ``$defs``) that has that property, e.g.
            ``{"title": {"maxLength": 140}}``. llama.cpp compiles them into the grammar, so the
            model cannot write a value the guardrails would drop for its length. None: the schema
            as pydantic writes it (the requests of earlier releases, byte for byte).
    """

    def __init__(
        self, *args: Any, field_limits: Mapping[str, Mapping[str, int]] | None = None, **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self.field_limits = {k: dict(v) for k, v in (field_limits or {}).items()}

    def _prepare_response_format(self, lm: Any, lm_kwargs: dict[str, Any], signature: Any) -> None:
        try:
            schema = output_schema(signature, skip_tool_calls=self.use_native_function_calling)
        except Exception:  # open-ended mapping or unschematisable field: plain JSON mode
            lm_kwargs["response_format"] = {"type": "json_object"}
            return
        if self.field_limits:
            for obj in [schema, *(schema.get("$defs") or {}).values()]:
                props = obj.get("properties") if isinstance(obj, dict) else None
                for name, keywords in self.field_limits.items():
                    if isinstance(props, dict) and isinstance(props.get(name), dict):
                        props[name].update(keywords)
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
    *without* its JSON fallback, so a reply the lenient parse cannot read costs no second call.
    """
    if isinstance(lm, KituneLM):
        return adapter_for(lm)
    return KituneChatAdapter(use_json_adapter_fallback=False)
