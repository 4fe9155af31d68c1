"""Turn real model output into candidate fact records (pure functions, no I/O).

Models rarely return exactly the JSON they were asked for. :func:`parse_facts` survives the
shapes catalogued in ``shared/cases/failure-cases.md``:

* **P1** — ``<think>…</think>`` reasoning, prose preambles and code fences around the JSON are
  stripped; output with no usable JSON raises :class:`kitune.errors.ParseError`, never "success
  with 0 facts", with one of three reasons (:data:`REPLY_FAILURES`, read back with
  :func:`reply_failure`): ``no_json`` (``"no JSON object found"``: no JSON object or array
  anywhere), ``cut_off`` (``"JSON cut off"``: a JSON object or array opens and the reply ends
  before it closes, as when a reply is cut at its token limit before one record ended) and
  ``malformed_json`` (``"malformed JSON"``: a JSON object or array opens and closes but does not
  parse, with the decoder's message and position).
* **P2** — *policy*: a bare top-level list is accepted as the facts array (it is unambiguous).
  Drifting key names are mapped only through the explicit :data:`FIELD_ALIASES` table; a record
  that still lacks a required field (or has it empty) is rejected with a field-level error that
  lists the missing fields. A record with an empty subject/object/evidence is never produced.
* **P3** — one extra wrapper level is unwrapped when the wrapper's single object value (or a
  string holding JSON) has every required field (``{"json_input": {...}}``, a tool-call
  envelope ``{"type": "function", "parameters": {...}}``, ``{"json": "{...}"}``). Partial
  fragments are never merged: ``{"result": {"title": "T"}, "subject": "S"}`` is rejected with its
  missing fields listed. Each unwrap increments the ``envelope_unwrapped`` counter.
* **G1** — confidence policy (0–100 int): an int/float/numeric string in 0–100 without a
  fractional part is taken as is (``72`` → 72); a value in (0, 1] *with* a fractional part is a
  fraction (``0.85`` → 85); a percent string is a percentage (``"85%"`` → 85); other fractional
  values above 1 are rounded (``72.4`` → 72); anything outside 0–100 (``140``) or not numeric
  (``"high"``, booleans) rejects the record — no clamping. A missing confidence defaults to
  :data:`DEFAULT_CONFIDENCE` and is counted (``confidence_defaulted``). Scalars given for string
  fields are coerced with ``str`` (``1999`` → ``"1999"``); booleans, lists and objects are not.
  A value written in the type-annotated form a model copied from its prompt (``"int[90]"``,
  ``"str[Acme]"``) is read as its bare value (:func:`kitune.lm.typed_value`).

* **Broken arrays** — an array that is not valid JSON (an unescaped quote or a missing comma in
  one record, or a reply cut at its token limit) is read with ``json_repair``; every element
  that is well-formed in the original text is kept and every other one is reported as a
  ``malformed_json`` record error (its repaired form is never kept, since a repair can guess).

One bad record never aborts its siblings: :func:`parse_facts` returns every valid record plus a
per-record error list and counters.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kitune.errors import ParseError
from kitune.lm.adapters import typed_value

__all__ = [
    "DEFAULT_CONFIDENCE",
    "FACT_LIST_KEYS",
    "FIELD_ALIASES",
    "REPLY_FAILURES",
    "REQUIRED_FIELDS",
    "FactCandidate",
    "ParsedFacts",
    "RecordError",
    "coerce_confidence",
    "coerce_record",
    "extract_json",
    "parse_facts",
    "reply_failure",
    "strip_reasoning",
]

REQUIRED_FIELDS: tuple[str, ...] = ("title", "description", "subject", "predicate", "object", "evidence_span")
"""Fields every fact record must carry, non-empty, after alias mapping."""

DEFAULT_CONFIDENCE = 50
"""Confidence given to a record that states none (counted as ``confidence_defaulted``)."""

FIELD_ALIASES: dict[str, str] = {
    "subj": "subject",
    "entity": "subject",
    "head": "subject",
    "obj": "object",
    "value": "object",
    "tail": "object",
    "pred": "predicate",
    "relation": "predicate",
    "rel": "predicate",
    "evidence": "evidence_span",
    "evidence_text": "evidence_span",
    "evidence_quote": "evidence_span",
    "span": "evidence_span",
    "quote": "evidence_span",
    "desc": "description",
    "score": "confidence",
    "confidence_score": "confidence",
    "tag": "tags",
    "labels": "tags",
}
"""Alias key → canonical field. Keys are matched case-insensitively; a canonical key present in
the same record wins over its alias. Nothing outside this table is ever renamed."""

FACT_LIST_KEYS: tuple[str, ...] = (
    "facts",
    "facts_json",
    "indicators",
    "knowledge_indicators",
    "kis",
    "items",
    "records",
    "results",
    "data",
)
"""Wrapper keys whose list value is taken as the facts array (first match wins)."""

_THINK_RE = re.compile(r"<(think|thinking|reasoning)>.*?</\1>", re.DOTALL | re.IGNORECASE)
_UNCLOSED_THINK_RE = re.compile(r"^\s*<(think|thinking|reasoning)>.*?(?=[\[{])", re.DOTALL | re.IGNORECASE)
_FENCE_RE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?(.*?)```", re.DOTALL)
_PERCENT_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*%\s*$")
_NUMBER_RE = re.compile(r"^\s*-?\d+(?:\.\d+)?\s*$")


@dataclass(frozen=True)
class FactCandidate:
    """One fact record as the model stated it, with types coerced but not yet verified."""

    title: str
    description: str
    subject: str
    predicate: str
    object: str
    evidence_span: str
    """The model's claimed verbatim quote; guardrails check it against the document."""
    confidence: int
    """0–100."""
    tags: tuple[str, ...] = ()
    """As given by the model (guardrails normalise them)."""


@dataclass(frozen=True)
class RecordError:
    """Why one record was rejected."""

    index: int
    """0-based position of the record in the facts array."""
    reason: str
    """``missing_fields`` | ``bad_confidence`` | ``bad_type`` | ``not_an_object`` | ``malformed_json``."""
    message: str
    """Human-readable detail naming the field and the fix."""
    missing_fields: tuple[str, ...] = ()
    """Required fields that were absent or empty (in :data:`REQUIRED_FIELDS` order)."""


@dataclass(frozen=True)
class ParsedFacts:
    """Result of :func:`parse_facts`: valid records, per-record errors and counters."""

    records: tuple[FactCandidate, ...]
    errors: tuple[RecordError, ...] = ()
    counters: dict[str, int] = field(default_factory=dict)
    """Event counts: ``think_stripped``, ``fence_stripped``, ``truncated_salvaged``,
    ``records_malformed``, ``bare_list``,
    ``envelope_unwrapped``, ``aliased_keys``, ``confidence_defaulted``, ``records_rejected``."""

    @property
    def is_malformed(self) -> bool:
        """True when records were offered but none survived (worth a retry)."""
        return not self.records and bool(self.errors)


_DSPY_MARKER_RE = re.compile(r"\[\[ ## \w+ ## \]\]")


def strip_reasoning(raw: str) -> tuple[str, bool]:
    """Remove ``<think>``/``<thinking>``/``<reasoning>`` blocks (closed, or unclosed up to the JSON).

    Returns:
        ``(text, stripped)`` where ``stripped`` says whether a block was removed.
    """
    text, n = _THINK_RE.subn("", raw)
    if n == 0:
        text, n = _UNCLOSED_THINK_RE.subn("", raw)
    return text, n > 0


def _is_facts_shape(value: Any) -> bool:
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
        if _is_facts_shape(value):
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
    return end if value == expected else None


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
    """Read an array that is not valid JSON (a bad record inside, or cut off at the token limit).

    ``json_repair`` (a DSPy dependency) reads the array; then each element is checked against the
    original text: an element that decodes there as well-formed JSON, unchanged, is kept; any
    other element (one ``json_repair`` had to fix or invent) becomes a :class:`_Malformed`
    placeholder that :func:`parse_facts` reports as a ``malformed_json`` record error. So every
    well-formed record around a bad one survives, and the bad one is reported, never guessed.

    Returns None when the array holds no well-formed element (then the reply is treated as
    holding no JSON). Counts ``truncated_salvaged`` when the array never closes (a reply cut at
    its token limit) and ``records_malformed`` per bad element.
    """
    import json_repair

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


REPLY_FAILURES: dict[str, str] = {
    "no_json": "no JSON object found",
    "cut_off": "JSON cut off",
    "malformed_json": "malformed JSON",
}
"""Why a whole reply held no usable JSON → the prefix of its :class:`ParseError` message."""

# Where a JSON value plausibly starts: an object opening on a key (or closing at once), or an
# array opening on an object/array/string; prose like "[1]" or "{see above}" is not JSON.
_JSON_START_RE = re.compile(r"\{\s*(?:[\"'}]|$)|\[\s*(?:[\[{\"\]]|$)")


def reply_failure(err: ParseError) -> str:
    """The reason a whole reply failed to parse (a key of :data:`REPLY_FAILURES`).

    Returns:
        ``"no_json"``, ``"cut_off"`` or ``"malformed_json"``; ``""`` when ``err`` is not a
        whole-reply failure (a record-level error from :func:`coerce_record`).
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
        pos = end  # valid JSON that is not facts-shaped (a list of strings): look further
    return ParseError(
        f"{REPLY_FAILURES['no_json']}: the reply holds no JSON object or array of objects; "
        "the instruction asks for a JSON array of facts",
        raw=raw,
    )


def extract_json(raw: str, counters: Counter[str] | None = None) -> Any:
    """Find the JSON object or array in a model reply.

    Strips reasoning blocks, then tries each fenced block, then scans the text for the first
    ``{``/``[`` that decodes to an object or to a list of objects (prose like ``[1]`` is skipped).
    A JSON *string* holding JSON (``"[{...}]"``) is decoded once more. When an array does not
    decode (one bad record inside, or cut off at the token limit), it is read with
    ``json_repair`` and every element that is well-formed in the original text is kept; each
    other element is returned as a placeholder that :func:`parse_facts` reports as a
    ``malformed_json`` record error (``records_malformed``; ``truncated_salvaged`` when the array
    never closes). The cut-off or broken record itself is never guessed.

    Args:
        raw: the raw completion text.
        counters: optional counter updated with ``think_stripped``/``fence_stripped``.

    Returns:
        A ``dict`` or a ``list`` of dicts (possibly empty).

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
        return value
    try:
        return _scan_json(text, counts)
    except LookupError:
        raise _no_json_error(text, raw) from None


def _canonical_keys(record: dict[str, Any], counts: Counter[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    aliased: dict[str, Any] = {}
    for key, value in record.items():
        k = str(key).strip().lower()
        if k in REQUIRED_FIELDS or k in ("confidence", "tags"):
            out[k] = value
        elif k in FIELD_ALIASES:
            aliased.setdefault(FIELD_ALIASES[k], value)
        else:
            out.setdefault(k, value)
    for key, value in aliased.items():
        if key not in out:
            out[key] = value
            counts["aliased_keys"] += 1
    return out


def _has_all_required(record: dict[str, Any]) -> bool:
    keys = {FIELD_ALIASES.get(str(k).strip().lower(), str(k).strip().lower()) for k in record}
    return all(f in keys for f in REQUIRED_FIELDS)


def _as_object(value: Any) -> Any:
    """A dict value as is, or a string holding a JSON object/array decoded; else None."""
    if isinstance(value, dict | list):
        return value
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError:
            return None
        return decoded if isinstance(decoded, dict | list) else None
    return None


def _unwrap_envelope(record: dict[str, Any], counts: Counter[str]) -> dict[str, Any]:
    """Unwrap one level when exactly one value is an object holding every required field."""
    if _has_all_required(record):
        return record
    inner = [v for v in (_as_object(v) for v in record.values()) if isinstance(v, dict)]
    if len(inner) == 1 and _has_all_required(inner[0]):
        counts["envelope_unwrapped"] += 1
        return inner[0]
    return record


def _locate_records(value: Any, counts: Counter[str]) -> list[Any]:
    if isinstance(value, list):
        counts["bare_list"] += 1
        return value
    assert isinstance(value, dict)
    lowered = {str(k).strip().lower(): v for k, v in value.items()}
    for key in FACT_LIST_KEYS:
        if key in lowered:
            inner = _as_object(lowered[key])
            if isinstance(inner, list):
                return inner
    if _has_all_required(value):
        return [value]
    # One envelope level around either a facts list or a single record.
    objects = [v for v in (_as_object(v) for v in value.values()) if v is not None]
    if len(objects) == 1:
        inner = objects[0]
        if isinstance(inner, list) and all(isinstance(v, dict) for v in inner):
            counts["envelope_unwrapped"] += 1
            return inner
        if isinstance(inner, dict):
            inner_lowered = {str(k).strip().lower(): v for k, v in inner.items()}
            for key in FACT_LIST_KEYS:
                if key in inner_lowered and isinstance(_as_object(inner_lowered[key]), list):
                    counts["envelope_unwrapped"] += 1
                    return list(_as_object(inner_lowered[key]))
    # A single (possibly wrapped) record; _unwrap_envelope decides, coerce_record reports gaps.
    return [value]


def coerce_confidence(value: Any) -> int:
    """Apply the G1 confidence policy (see the module docstring).

    Args:
        value: what the model gave: int, float, or a string like ``"85"``, ``"0.85"``, ``"85%"``
            or ``"int[85]"`` (a type-annotated value, read as ``"85"``).

    Returns:
        An int in 0–100.

    Raises:
        ValueError: for booleans, words, NaN, or values outside 0–100 after conversion.
    """
    if isinstance(value, bool) or value is None:
        raise ValueError(f"confidence {value!r} is not a number: give an integer 0-100")
    if isinstance(value, str):
        value = typed_value(value) or value  # "int[90]" -> "90"
        pct = _PERCENT_RE.match(value)
        if pct:
            number = float(pct.group(1))
            if not 0 <= number <= 100:
                raise ValueError(f"confidence {value!r} is outside 0-100%")
            return round(number)
        if not _NUMBER_RE.match(value):
            raise ValueError(f"confidence {value!r} is not a number: give an integer 0-100")
        value = float(value)
    if not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"confidence {value!r} is not a number: give an integer 0-100")
    number = float(value)
    if 0 < number <= 1 and number != int(number):
        return round(number * 100)
    if not 0 <= number <= 100:
        raise ValueError(f"confidence {value!r} is outside 0-100 (not clamped): give an integer 0-100")
    return round(number)


def _coerce_str(name: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return (typed_value(value) or value).strip()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"field {name!r} must be a string, got {type(value).__name__} {value!r}")
    return str(value)


def _coerce_tags(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(t.strip() for t in value.split(",") if t.strip())
    if isinstance(value, list | tuple):
        return tuple(str(t).strip() for t in value if isinstance(t, str | int | float) and str(t).strip())
    return ()


def coerce_record(record: Any, counters: Counter[str] | None = None) -> FactCandidate:
    """Validate and coerce one record (aliases, one envelope level, G1 confidence policy).

    Args:
        record: one element of the facts array.
        counters: optional counter updated with ``envelope_unwrapped``, ``aliased_keys``,
            ``confidence_defaulted``.

    Returns:
        The :class:`FactCandidate`.

    Raises:
        ParseError: the record is not an object, a required field is missing or empty
            (``missing_fields`` lists them all), a string field holds a non-scalar, or the
            confidence breaks the policy.
    """
    counts: Counter[str] = counters if counters is not None else Counter()
    if isinstance(record, _Malformed):
        raise ParseError(
            "malformed JSON record (e.g. an unescaped quote, or cut off at the token limit): "
            f"not kept; json_repair read it as {json.dumps(record.repaired, default=str)[:200]}",
            raw=json.dumps(record.repaired, default=str),
        )
    if not isinstance(record, dict):
        raise ParseError(f"fact record must be a JSON object, got {type(record).__name__}", raw=repr(record))
    rec = _canonical_keys(_unwrap_envelope(record, counts), counts)
    values: dict[str, str] = {}
    for name in REQUIRED_FIELDS:
        try:
            values[name] = _coerce_str(name, rec.get(name))
        except TypeError as e:
            raise ParseError(str(e), raw=json.dumps(record, default=str)) from None
    missing = tuple(name for name in REQUIRED_FIELDS if not values[name])
    if missing:
        raise ParseError(
            f"fact record is missing required field(s) {', '.join(missing)}: every fact needs "
            f"{', '.join(REQUIRED_FIELDS)}",
            raw=json.dumps(record, default=str),
            missing_fields=missing,
        )
    if rec.get("confidence") is None:
        confidence = DEFAULT_CONFIDENCE
        counts["confidence_defaulted"] += 1
    else:
        try:
            confidence = coerce_confidence(rec["confidence"])
        except ValueError as e:
            raise ParseError(str(e), raw=json.dumps(record, default=str)) from None
    return FactCandidate(
        title=values["title"],
        description=values["description"],
        subject=values["subject"],
        predicate=values["predicate"],
        object=values["object"],
        evidence_span=values["evidence_span"],
        confidence=confidence,
        tags=_coerce_tags(rec.get("tags")),
    )


def _reason(err: ParseError) -> str:
    if err.missing_fields:
        return "missing_fields"
    text = str(err)
    if text.startswith("malformed JSON"):
        return "malformed_json"
    if text.startswith("confidence"):
        return "bad_confidence"
    if text.startswith("fact record must be"):
        return "not_an_object"
    return "bad_type"


def parse_facts(raw: str, *, resolve: Callable[[Any, Counter[str]], Any] | None = None) -> ParsedFacts:
    """Parse a model reply into fact candidates.

    Args:
        raw: the raw completion text (may hold reasoning, prose, fences).
        resolve: optional ``(record, counters) -> record`` applied to each located record before
            it is validated (the sentence-indexed mode turns cited sentence numbers into the
            verbatim ``evidence_span`` here).

    Returns:
        :class:`ParsedFacts` with the valid records in reply order, one :class:`RecordError` per
        rejected record, and counters. An empty list (``[]``) yields no records and no errors.

    Raises:
        ParseError: ``"no JSON object found"`` when the reply holds no JSON object/array.
    """
    counts: Counter[str] = Counter()
    value = extract_json(raw, counts)
    records: list[FactCandidate] = []
    errors: list[RecordError] = []
    for index, item in enumerate(_locate_records(value, counts)):
        try:
            if resolve is not None and isinstance(item, dict):
                item = resolve(item, counts)
            records.append(coerce_record(item, counts))
        except ParseError as e:
            errors.append(
                RecordError(index=index, reason=_reason(e), message=str(e), missing_fields=e.missing_fields)
            )
    if errors:
        counts["records_rejected"] += len(errors)
    return ParsedFacts(records=tuple(records), errors=tuple(errors), counters=dict(counts))
