r"""Read JSON out of real model replies: the reader behind kitune's lenient adapters (pure, no I/O).

Models rarely return exactly the JSON they were asked for. The functions here survive the shapes
catalogued in ``shared/cases/failure-cases.md`` and never guess a value:

* **P1** — ``<think>…</think>`` reasoning, prose preambles, DSPy's ``[[ ## field ## ]]`` markers
  and code fences around the JSON are stripped (:func:`extract_json`); a reply with no usable JSON
  raises :class:`kitune.errors.ParseError`, never "success with nothing", with one of three reasons
  (:data:`REPLY_FAILURES`, read back with :func:`reply_failure`): ``no_json`` (no JSON object or
  array anywhere), ``cut_off`` (a JSON object or array opens and the reply ends before it closes,
  as when a reply is cut at its token limit) and ``malformed_json`` (it opens and closes but does
  not parse, with the decoder's message and position).
* **Broken arrays** — an array that is not valid JSON (an unescaped quote or a missing comma in one
  element, or a reply cut at its token limit) is read with ``json_repair``; every element that is
  well-formed in the original text is kept and every other one becomes a ``malformed_json``
  record error: its repaired form is never kept, since a repair can guess (evidence must stay
  verbatim).
* **Records** — :func:`read_records` reads a list of pydantic records and validates each one on its
  own: one bad record never aborts its siblings; it is dropped, reported as a
  :class:`RecordError` and counted. The record model's own validators carry its policies (key
  aliases, the confidence policy); a model may also name the wrapper keys its list comes under
  (``LIST_KEYS``) and say when an object is one whole record (``is_whole_record``).
* **One object** — :func:`read_json_object` finds the first JSON object in a reply (a Python-literal
  dict such as ``str(dict)`` writes is read with :func:`ast.literal_eval`, literals only).
* **Lone surrogates** — a model may write a JSON escape for half of an emoji's UTF-16 pair
  (``"\ud83d"``, as a small model does when its token budget or grammar splits the pair); JSON
  decodes it to a lone surrogate, a ``str`` that cannot be encoded as UTF-8, so hashing a KI id,
  writing a state file or sending the next request fails on it far from the reply. Every value
  decoded here goes through :func:`repair_surrogates`: a split pair is joined into its character
  and a lone surrogate becomes U+FFFD, counted as ``surrogates_replaced``.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import json_repair
from pydantic import BaseModel, ValidationError

from kitune.errors import ParseError

__all__ = [
    "REPLY_FAILURES",
    "RecordError",
    "Records",
    "extract_json",
    "find_json_object",
    "read_json_object",
    "read_records",
    "record_error",
    "repair_surrogates",
    "reply_failure",
    "strip_reasoning",
]

R = TypeVar("R", bound=BaseModel)

REPLY_FAILURES: dict[str, str] = {
    "no_json": "no JSON object found",
    "cut_off": "JSON cut off",
    "malformed_json": "malformed JSON",
}
"""Why a whole reply held no usable JSON → the prefix of its :class:`ParseError` message."""

_THINK_RE = re.compile(r"<(think|thinking|reasoning)>.*?</\1>", re.DOTALL | re.IGNORECASE)
_UNCLOSED_THINK_RE = re.compile(r"^\s*<(think|thinking|reasoning)>.*?(?=[\[{])", re.DOTALL | re.IGNORECASE)
_FENCE_RE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?(.*?)```", re.DOTALL)
_DSPY_MARKER_RE = re.compile(r"\[\[ ## \w+ ## \]\]")
# Where a JSON value plausibly starts: an object opening on a key (or closing at once), or an
# array opening on an object/array/string; prose like "[1]" or "{see above}" is not JSON.
_JSON_START_RE = re.compile(r"\{\s*(?:[\"'}]|$)|\[\s*(?:[\[{\"\]]|$)")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
# A high surrogate not followed by a low one, or a low one not preceded by a high one.
_LONE_SURROGATE_RE = re.compile("[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]")


@dataclass(frozen=True)
class RecordError:
    """Why one record of a reply was dropped."""

    index: int
    """0-based position of the record in the reply's list."""
    reason: str
    """``missing_fields`` | ``bad_confidence`` | ``bad_type`` | ``not_an_object`` | ``malformed_json``
    (a record model's validator may name its own reason)."""
    message: str
    """Human-readable detail naming the field and the fix."""
    missing_fields: tuple[str, ...] = ()
    """Required fields that were absent or empty, in the model's order."""


class Records(list[R]):
    """The value of a record-list output field: the valid records in reply order, plus the dropped ones.

    A plain ``list`` to DSPy (predictions, traces, demos); kitune code also reads :attr:`errors`
    and :attr:`counters`.

    Args:
        records: the valid records.
        errors: one :class:`RecordError` per dropped record.
        counters: event counts of the read (``think_stripped``, ``fence_stripped``, ``bare_list``,
            ``envelope_unwrapped``, ``truncated_salvaged``, ``records_malformed``,
            ``records_rejected`` and whatever the record model's validators count).
    """

    def __init__(
        self,
        records: Iterable[R] = (),
        *,
        errors: Iterable[RecordError] = (),
        counters: dict[str, int] | None = None,
    ) -> None:
        super().__init__(records)
        self.errors: tuple[RecordError, ...] = tuple(errors)
        self.counters: dict[str, int] = dict(counters or {})

    @property
    def is_malformed(self) -> bool:
        """True when records were offered but none survived (worth a retry)."""
        return not self and bool(self.errors)


def strip_reasoning(raw: str) -> tuple[str, bool]:
    """Remove ``<think>``/``<thinking>``/``<reasoning>`` blocks (closed, or unclosed up to the JSON).

    Returns:
        ``(text, stripped)`` where ``stripped`` says whether a block was removed.
    """
    text, n = _THINK_RE.subn("", raw)
    if n == 0:
        text, n = _UNCLOSED_THINK_RE.subn("", raw)
    return text, n > 0


def _repair_text(text: str, counts: Counter[str] | None) -> str:
    if _SURROGATE_RE.search(text) is None:
        return text
    fixed, lone = _LONE_SURROGATE_RE.subn("\ufffd", text)
    if lone and counts is not None:
        counts["surrogates_replaced"] += lone
    # every surrogate left is half of a pair: UTF-16 joins each pair into its character
    return fixed.encode("utf-16-le", "surrogatepass").decode("utf-16-le")


def repair_surrogates(value: Any, counts: Counter[str] | None = None) -> Any:
    r"""``value`` with every string made encodable as UTF-8: split pairs joined, lone surrogates → U+FFFD.

    JSON (and ``json_repair``, ``ast.literal_eval``) decode ``"\ud83d\ude00"`` escapes to two
    UTF-16 surrogates (``json`` joins them itself, ``json_repair`` and ``ast`` do not) and a lone
    ``"\ud83d"`` to one surrogate, which no UTF-8 writer, hasher or HTTP client accepts. A pair is
    joined into its character (``"😀"``); a lone one becomes ``"\ufffd"``.

    Args:
        value: a decoded reply value: ``str``, ``list``/``tuple``/``dict`` of them (keys too), a
            pydantic model (its fields, copied when one changes); anything else is returned as is.
        counts: when given, ``surrogates_replaced`` is increased by the number of lone surrogates.

    Returns:
        The value, unchanged (the same object) when it held no surrogate.
    """
    if isinstance(value, str):
        return _repair_text(value, counts)
    if isinstance(value, Records):
        return value  # read by read_records, which repaired it already
    if isinstance(value, list | tuple):
        items = [repair_surrogates(v, counts) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        pairs = [(repair_surrogates(k, counts), repair_surrogates(v, counts)) for k, v in value.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(pairs, value.items(), strict=True)):
            return value
        return dict(pairs)
    if isinstance(value, BaseModel):
        changes = {}
        for name in type(value).model_fields:
            old = getattr(value, name, None)
            new = repair_surrogates(old, counts)
            if new is not old:
                changes[name] = new
        return value.model_copy(update=changes) if changes else value
    return value


def _is_json_shape(value: Any) -> bool:
    if isinstance(value, dict):
        return True
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


@dataclass(frozen=True)
class _Malformed:
    """Placeholder for an array element that was not well-formed JSON (reported, never kept)."""

    repaired: Any
    """What ``json_repair`` made of it (shown in the error message only)."""


def _scan_json(text: str, counts: Counter[str]) -> Any:
    decoder = json.JSONDecoder()
    for match in re.finditer(r"[\[{]", text):
        try:
            value, _end = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            if match.group(0) == "[":
                repaired = _repair_array(text, match.start(), counts)
                if repaired is not None:
                    return repaired
            continue
        if _is_json_shape(value):
            return value
    raise LookupError


def _decode_at(text: str, pos: int, expected: Any) -> int | None:
    """End offset when a JSON value equal to ``expected`` starts at ``pos`` (after , and spaces)."""
    while pos < len(text) and (text[pos].isspace() or text[pos] == ","):
        pos += 1
    try:
        value, end = json.JSONDecoder().raw_decode(text, pos)
    except json.JSONDecodeError:
        return None
    # json joins an escaped surrogate pair, json_repair does not: compare them repaired
    return end if repair_surrogates(value) == repair_surrogates(expected) else None


def _find_from(text: str, pos: int, expected: Any) -> int | None:
    """End offset of the first well-formed JSON value equal to ``expected`` at or after ``pos``."""
    end = _decode_at(text, pos, expected)
    if end is not None:
        return end
    opener = "{" if isinstance(expected, dict) else "[" if isinstance(expected, list) else None
    if opener is None:
        return None
    i = text.find(opener, pos + 1)
    while i >= 0:
        end = _decode_at(text, i, expected)
        if end is not None:
            return end
        i = text.find(opener, i + 1)
    return None


def _repair_array(text: str, start: int, counts: Counter[str]) -> list[Any] | None:
    """Read an array that is not valid JSON (a bad element inside, or cut off at the token limit).

    ``json_repair`` reads the array; then each element is checked against the original text: an
    element that decodes there as well-formed JSON, unchanged, is kept; any other element (one
    ``json_repair`` had to fix or invent) becomes a :class:`_Malformed` placeholder that
    :func:`read_records` reports as a ``malformed_json`` record error. So every well-formed
    element around a bad one survives, and the bad one is reported, never guessed.

    Returns None when the array holds no well-formed element (then the reply is treated as
    holding no JSON). Counts ``truncated_salvaged`` when the array never closes (a reply cut at
    its token limit) and ``records_malformed`` per bad element.
    """
    segment = text[start:]
    repaired = json_repair.loads(segment)
    if isinstance(repaired, list) and repaired and isinstance(repaired[0], list):
        repaired = repaired[0]  # json_repair returns [array, trailing value] when text follows
    if not isinstance(repaired, list) or not repaired:
        return None
    out: list[Any] = []
    pos = start + 1
    kept = 0
    for item in repaired:
        after_bad = bool(out) and isinstance(out[-1], _Malformed)
        end = _find_from(text, pos, item) if after_bad else _decode_at(text, pos, item)
        if end is None:
            out.append(_Malformed(item))
            continue
        out.append(item)
        kept += 1
        pos = end
    if kept == 0:
        return None
    if not text.rstrip().rstrip("`").rstrip().endswith(("]", "}")):
        counts["truncated_salvaged"] += 1
    bad = sum(isinstance(x, _Malformed) for x in out)
    if bad:
        counts["records_malformed"] += bad
    return out


def reply_failure(err: ParseError) -> str:
    """The reason a whole reply failed to parse (a key of :data:`REPLY_FAILURES`).

    Returns:
        ``"no_json"``, ``"cut_off"`` or ``"malformed_json"``; ``""`` when ``err`` is not a
        whole-reply failure (a record-level error).
    """
    text = str(err)
    for reason, prefix in REPLY_FAILURES.items():
        if text.startswith(prefix + ":"):
            return reason
    return ""


def _closing_end(text: str, start: int) -> int | None:
    """End offset of the bracket group opening at ``start`` (strings skipped); None if it never closes."""
    depth = 0
    in_string = escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _no_json_error(text: str, raw: str) -> ParseError:
    """The :class:`ParseError` for a reply in which nothing decoded: cut off, malformed or no JSON."""
    pos = 0
    while (m := _JSON_START_RE.search(text, pos)) is not None:
        start = m.start()
        kind = "object" if text[start] == "{" else "array"
        end = _closing_end(text, start)
        if end is None:
            return ParseError(
                f"{REPLY_FAILURES['cut_off']}: the JSON {kind} opened at character {start} never closes "
                "(the reply ended inside it, e.g. at its token limit) and holds no complete record",
                raw=raw,
            )
        try:
            json.loads(text[start:end])
        except json.JSONDecodeError as e:
            return ParseError(
                f"{REPLY_FAILURES['malformed_json']}: the JSON {kind} at characters {start}-{end} does not "
                f"parse ({e.msg} at line {e.lineno} column {e.colno}) and holds no well-formed record",
                raw=raw,
            )
        pos = end  # valid JSON that is not object-shaped (a list of strings): look further
    return ParseError(
        f"{REPLY_FAILURES['no_json']}: the reply holds no JSON object or array of objects; "
        "the output format asks for JSON",
        raw=raw,
    )


def extract_json(raw: str, counters: Counter[str] | None = None) -> Any:
    """Find the JSON object or array in a model reply.

    Strips DSPy field markers and reasoning blocks, then tries each fenced block, then scans the
    text for the first ``{``/``[`` that decodes to an object or to a list of objects (prose like
    ``[1]`` is skipped). A JSON *string* holding JSON (``"[{...}]"``) is decoded once more. When an
    array does not decode (one bad element inside, or cut off at the token limit), it is read with
    ``json_repair`` and every element that is well-formed in the original text is kept; each other
    element is returned as a placeholder that :func:`read_records` reports as a ``malformed_json``
    record error (``records_malformed``; ``truncated_salvaged`` when the array never closes).

    Args:
        raw: the raw completion text.
        counters: optional counter updated with ``think_stripped``/``fence_stripped``, the
            repair counts above and ``surrogates_replaced`` (see :func:`repair_surrogates`).

    Returns:
        A ``dict`` or a ``list`` of dicts (possibly empty), every string encodable as UTF-8.

    Raises:
        ParseError: when nothing decodes, ``raw`` kept, the message starting with one of
            :data:`REPLY_FAILURES` (:func:`reply_failure` reads it back): ``"JSON cut off"``,
            ``"malformed JSON"`` or ``"no JSON object found"``.
    """
    counts: Counter[str] = counters if counters is not None else Counter()
    text, stripped = strip_reasoning(_DSPY_MARKER_RE.sub("\n", raw))
    if stripped:
        counts["think_stripped"] += 1
    stripped_text = text.strip()
    if stripped_text.startswith('"'):
        try:
            inner = json.loads(stripped_text)
            if isinstance(inner, str):
                text = inner
        except json.JSONDecodeError:
            pass
    for fence in _FENCE_RE.findall(text):
        try:
            value = _scan_json(fence, counts)
        except LookupError:
            continue
        counts["fence_stripped"] += 1
        return repair_surrogates(value, counts)
    try:
        return repair_surrogates(_scan_json(text, counts), counts)
    except LookupError:
        raise _no_json_error(text, raw) from None


def _as_object(value: Any) -> Any:
    """A dict or list value as is, or a string holding a JSON object/array decoded; else None."""
    if isinstance(value, dict | list):
        return value
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError:
            return None
        return decoded if isinstance(decoded, dict | list) else None
    return None


def _lowered(value: dict[Any, Any]) -> dict[str, Any]:
    return {str(k).strip().lower(): v for k, v in value.items()}


def _is_whole_record(model: type[BaseModel], value: dict[str, Any]) -> bool:
    """True when ``value`` offers every required field of ``model`` (the model's own test if it has one)."""
    own = getattr(model, "is_whole_record", None)
    if callable(own):
        return bool(own(value))
    required = {name for name, f in model.model_fields.items() if f.is_required()}
    return required <= set(_lowered(value))


def _locate_records(
    value: Any, model: type[BaseModel], keys: Sequence[str], counts: Counter[str]
) -> list[Any]:
    """The list of records in a decoded reply (a bare list, under a wrapper key, or one record)."""
    if isinstance(value, list):
        counts["bare_list"] += 1
        return value
    lowered = _lowered(value)
    for key in keys:
        if key in lowered:
            inner = _as_object(lowered[key])
            if isinstance(inner, list):
                return inner
    if _is_whole_record(model, value):
        return [value]
    # One envelope level around either a record list or a single record.
    objects = [v for v in (_as_object(v) for v in value.values()) if v is not None]
    if len(objects) == 1:
        inner = objects[0]
        if isinstance(inner, list) and all(isinstance(v, dict) for v in inner):
            counts["envelope_unwrapped"] += 1
            return inner
        if isinstance(inner, dict):
            inner_lowered = _lowered(inner)
            for key in keys:
                listed = _as_object(inner_lowered[key]) if key in inner_lowered else None
                if isinstance(listed, list):
                    counts["envelope_unwrapped"] += 1
                    return listed
    # A single (possibly wrapped) record: the model's validators decide and report gaps.
    return [value]


_OWN_REASONS = ("missing_fields", "bad_confidence", "bad_type", "not_an_object", "malformed_json")
_NOT_AN_OBJECT = ("model_type", "model_attributes_type", "dict_type")


def record_error(index: int, err: ValidationError) -> RecordError:
    """The :class:`RecordError` for a record that failed validation.

    A validator that raises ``PydanticCustomError(reason, "{message}", {"message": ..., "missing":
    (...)})`` names the reason, the message and the missing fields itself; pydantic's own errors map
    to ``missing_fields`` (required fields absent), ``not_an_object`` (not a JSON object) or
    ``bad_type`` (anything else).

    Args:
        index: the record's position in the reply's list.
        err: what ``model_validate`` raised.
    """
    errors = err.errors()
    first = errors[0]
    kind = str(first.get("type", ""))
    ctx = first.get("ctx") or {}
    if kind in _OWN_REASONS or (kind and "message" in ctx):
        missing = tuple(ctx.get("missing") or ())
        return RecordError(index, kind, str(ctx.get("message", first.get("msg", ""))), missing)
    if kind in _NOT_AN_OBJECT:
        got = type(first.get("input")).__name__
        return RecordError(index, "not_an_object", f"a record must be a JSON object, got {got}")
    missing = tuple(".".join(map(str, e["loc"])) for e in errors if e.get("type") == "missing")
    detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'record'}: {e['msg']}" for e in errors)
    if missing:
        return RecordError(index, "missing_fields", f"record is missing required field(s): {detail}", missing)
    return RecordError(index, "bad_type", detail)


def read_records(raw: str, model: type[R], *, keys: Sequence[str] = ()) -> Records[R]:
    """Read a reply's list of records, validating each record on its own.

    Args:
        raw: the raw completion text (may hold reasoning, prose, fences, DSPy field markers).
        model: the record model; its validators run with ``context={"counts": Counter}`` so they
            can count what they normalised. It may define ``LIST_KEYS`` (wrapper keys whose list
            value is the records, after ``keys``) and a classmethod ``is_whole_record(obj)``.
        keys: wrapper keys tried first (lower case; e.g. the output field's name).

    Returns:
        :class:`Records`: the valid records in reply order, one :class:`RecordError` per dropped
        record (a ``malformed_json`` one for each element ``json_repair`` had to fix) and the
        counters (``records_rejected`` = number of errors). An empty list yields no records and
        no errors.

    Raises:
        ParseError: the reply holds no usable JSON (see :func:`extract_json`), ``raw`` kept.
    """
    counts: Counter[str] = Counter()
    value = extract_json(raw, counts)
    list_keys = [*keys, *(k for k in getattr(model, "LIST_KEYS", ()) if k not in keys)]
    records: list[R] = []
    errors: list[RecordError] = []
    for index, item in enumerate(_locate_records(value, model, list_keys, counts)):
        if isinstance(item, _Malformed):
            shown = json.dumps(item.repaired, default=str)[:200]
            errors.append(
                RecordError(
                    index,
                    "malformed_json",
                    "malformed JSON record (e.g. an unescaped quote, or cut off at the token limit): "
                    f"not kept; json_repair read it as {shown}",
                )
            )
            continue
        item = repair_surrogates(item, counts)  # a list decoded from a JSON string (_as_object)
        try:
            records.append(model.model_validate(item, context={"counts": counts}))
        except ValidationError as e:
            errors.append(record_error(index, e))
    if errors:
        counts["records_rejected"] += len(errors)
    return Records(records, errors=errors, counters=dict(counts))


def find_json_object(text: str, counters: Counter[str] | None = None) -> dict[str, Any]:
    """The first JSON object in ``text``, found as :func:`read_json_object` finds it.

    Args:
        text: the reply text.
        counters: optional counter updated as :func:`extract_json` updates it
            (``surrogates_replaced`` among them).

    Raises:
        ParseError: no object, with the reason of :func:`extract_json` (``no_json``, ``cut_off``,
            ``malformed_json``).
    """
    counts: Counter[str] = counters if counters is not None else Counter()
    try:
        value = extract_json(text, counts)
    except ParseError as err:
        cleaned = strip_reasoning(text)[0]
        start, end = cleaned.find("{"), cleaned.rfind("}")
        if 0 <= start < end:
            try:
                lit = ast.literal_eval(cleaned[start : end + 1])
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                raise err from None
            if isinstance(lit, dict) and all(isinstance(k, str) for k in lit):
                return dict(repair_surrogates(lit, counts))
        raise
    if isinstance(value, list):
        value = next((v for v in value if isinstance(v, dict)), None)
        if value is None:
            raise ParseError(f"{REPLY_FAILURES['no_json']}: the reply holds an empty JSON array", raw=text)
    if set(value) == {"json"} and isinstance(value["json"], str):
        try:
            return find_json_object(value["json"], counts)
        except ParseError:
            return dict(value)
    return dict(value)


def read_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object found in ``text``, or None.

    :func:`extract_json` does the work (reasoning blocks, code fences and prose around the object
    are skipped; a broken array is read with ``json_repair``); from a list the first object is
    taken. A stringified object under a single ``"json"`` key is decoded once. A Python-literal
    dict (single quotes, as ``str(dict)`` writes it when an adapter stringifies an object) is read
    with :func:`ast.literal_eval`, which evaluates literals only.
    """
    try:
        return find_json_object(text or "")
    except ParseError:
        return None
