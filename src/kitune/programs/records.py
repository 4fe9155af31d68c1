"""Typed outputs of the programs: what each DSPy signature asks the model to return.

The output *format* of every program comes from these types, not from its instruction text:
DSPy's adapters render them (ChatAdapter shows the JSON schema; JSONAdapter sends it as
``response_format``; :class:`kitune.lm.LocalJSONAdapter` sends ``json_object`` + schema, which
llama.cpp turns into a grammar). Optimisers rewrite instructions only, so they can no longer
rewrite the format away.

The records are also what kitune reads back: kitune's adapters validate each record of a reply
with these models (:func:`kitune.lm.parse_leniently`), so the lenient reading policies live here,
as pydantic validators, and nowhere else. They run before field validation and never change the
JSON schema a model is shown (the fields, their descriptions and the class docstrings are the
prompt):

* **Key aliases** (case P2) — keys are matched case-insensitively and drifting names are mapped
  through the explicit :data:`FIELD_ALIASES` table only (a canonical key present in the same
  record wins over its alias; nothing outside the table is ever renamed), counted
  ``aliased_keys``;
* **One envelope level** (case P3) — a record whose single object value (or a string holding
  JSON) has every required field is unwrapped (``{"json_input": {...}}``, a tool-call envelope
  ``{"type": "function", "parameters": {...}}``), counted ``envelope_unwrapped``; partial
  fragments are never merged;
* **Required text fields** — a field missing or blank rejects the record with reason
  ``missing_fields`` listing them all; scalars given for text fields are coerced with ``str``
  (``1999`` → ``"1999"``), booleans, lists and objects reject it (``bad_type``); a value written
  in the type-annotated form the model saw in its prompt (``"str[Acme]"``, ``"int[1999]"``) is
  read as its bare value (:func:`kitune.lm.typed_value`);
* **Confidence policy** (G1 in ``shared/cases/failure-cases.md``, :func:`coerce_confidence`, the
  one policy wherever a model states a confidence): an integer 0–100 is taken as is; a value in
  (0, 1] with a fractional part is a fraction (``0.85`` → 85); a percent string is a percentage
  (``"85%"`` → 85); other fractional values in range are rounded; anything outside 0–100
  (``140``) or not numeric (``"high"``, booleans) rejects the record (``bad_confidence``) —
  never clamped, never mapped to a default. A missing one gets :data:`DEFAULT_CONFIDENCE` and is
  counted ``confidence_defaulted``.

Counts go to the ``Counter`` passed as ``context={"counts": ...}`` to ``model_validate`` (kitune's
reader passes one; a plain constructor call counts nothing).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from kitune.lm import repair_surrogates, typed_value

__all__ = [
    "CITATION_KEYS",
    "DEFAULT_CONFIDENCE",
    "FACT_LIST_KEYS",
    "FIELD_ALIASES",
    "REQUIRED_FIELDS",
    "FactRecord",
    "PlanDraft",
    "SentenceFactRecord",
    "cited_numbers",
    "coerce_confidence",
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

CITATION_KEYS: tuple[str, ...] = (
    "evidence_sentences",
    "evidence_sentence",
    "sentences",
    "sentence_ids",
    "sentence_numbers",
    "evidence",
)
"""Keys read for the cited sentence numbers of a :class:`SentenceFactRecord` (first present wins)."""

_PERCENT_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*%\s*$")
_NUMBER_RE = re.compile(r"^\s*-?\d+(?:\.\d+)?\s*$")


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


def cited_numbers(value: Any) -> list[int]:
    """The sentence numbers a citation names: ``2``, ``"2"``, ``[3, 4]``, ``"[3, 4]"``, ``"3 and 4"``.

    Booleans and anything without digits name none (``[]``).
    """
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, float) and value.is_integer():
        return [int(value)]
    if isinstance(value, str):
        return [int(n) for n in re.findall(r"\d+", value)]
    if isinstance(value, list | tuple):
        return [n for v in value for n in cited_numbers(v)]
    return []


def _reject(reason: str, message: str, missing: tuple[str, ...] = ()) -> PydanticCustomError:
    """The validation error rejecting a record for ``reason`` (read by :func:`kitune.lm.record_error`)."""
    return PydanticCustomError(reason, "{message}", {"message": message, "missing": missing})


def _counts(info: ValidationInfo) -> Counter[str]:
    context = info.context if isinstance(info.context, dict) else {}
    counts = context.get("counts")
    return counts if isinstance(counts, Counter) else Counter()


def _as_object(value: Any) -> Any:
    """A dict value as is, or a string holding a JSON object decoded; else None."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value.strip()[:1] == "{":
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError:
            return None
        return decoded if isinstance(decoded, dict) else None
    return None


def _canonical_keys(
    record: dict[str, Any],
    canonical: tuple[str, ...],
    counts: Counter[str],
    *,
    skip: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Lower-cased keys with :data:`FIELD_ALIASES` applied (aliases to fields in ``skip`` dropped)."""
    out: dict[str, Any] = {}
    aliased: dict[str, Any] = {}
    for key, value in record.items():
        k = str(key).strip().lower()
        if k in canonical:
            out[k] = value
        elif k in FIELD_ALIASES:
            if FIELD_ALIASES[k] not in skip:
                aliased.setdefault(FIELD_ALIASES[k], value)
        else:
            out.setdefault(k, value)
    for key, value in aliased.items():
        if key not in out:
            out[key] = value
            counts["aliased_keys"] += 1
    return out


def _offers(record: dict[str, Any], required: tuple[str, ...]) -> bool:
    keys = {FIELD_ALIASES.get(str(k).strip().lower(), str(k).strip().lower()) for k in record}
    return all(f in keys for f in required)


def _unwrap_envelope(
    record: dict[str, Any], required: tuple[str, ...], counts: Counter[str]
) -> dict[str, Any]:
    """Unwrap one level when exactly one value is an object holding every required field."""
    if _offers(record, required):
        return record
    inner = [v for v in (_as_object(v) for v in record.values()) if isinstance(v, dict)]
    if len(inner) == 1 and _offers(inner[0], required):
        counts["envelope_unwrapped"] += 1
        return dict(repair_surrogates(inner[0], counts))  # decoded from a JSON string here
    return record


def _text(name: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return (typed_value(value) or value).strip()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _reject("bad_type", f"field {name!r} must be a string, got {type(value).__name__} {value!r}")
    return str(value)


def _tags(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    if isinstance(value, list | tuple):
        return [str(t).strip() for t in value if isinstance(t, str | int | float) and str(t).strip()]
    return []


def _fact_values(data: Any, info: ValidationInfo, required: tuple[str, ...], *, citations: bool) -> Any:
    """The lenient reading shared by both fact records (see the module docstring)."""
    if isinstance(data, BaseModel):
        return data
    if not isinstance(data, dict):
        raise _reject("not_an_object", f"fact record must be a JSON object, got {type(data).__name__}")
    counts = _counts(info)
    record = _unwrap_envelope(data, required, counts)
    cited: list[int] | None = None
    if citations:  # the citation, under any of its keys, then no evidence quote at all
        lowered = {str(k).strip().lower(): v for k, v in record.items()}
        cited = cited_numbers(next((lowered[k] for k in CITATION_KEYS if k in lowered), None))
        record = {k: v for k, v in record.items() if str(k).strip().lower() not in CITATION_KEYS}
    canonical = (*required, "confidence", "tags")
    skip = frozenset({"evidence_span"}) if citations else frozenset()
    rec = _canonical_keys(record, canonical, counts, skip=skip)
    values = {name: _text(name, rec.get(name)) for name in required}
    missing = tuple(name for name in required if not values[name])
    if missing:
        raise _reject(
            "missing_fields",
            f"fact record is missing required field(s) {', '.join(missing)}: every fact needs "
            f"{', '.join(required)}",
            missing,
        )
    if rec.get("confidence") is None:
        confidence = DEFAULT_CONFIDENCE
        counts["confidence_defaulted"] += 1
    else:
        try:
            confidence = coerce_confidence(rec["confidence"])
        except ValueError as e:
            raise _reject("bad_confidence", str(e)) from None
    out: dict[str, Any] = {**values, "confidence": confidence, "tags": _tags(rec.get("tags"))}
    if cited is not None:
        out["evidence_sentences"] = cited
    return out


_TITLE = (
    "One natural sentence of at most 140 characters that states the fact and ends on its value where "
    "possible, e.g. 'Ada Lovelace was born in London'."
)
_DESCRIPTION = (
    "2-3 sentences, at most 350 characters, that make the fact self-contained: who or what, the "
    "relation, the value, and the date, place or role that pins it down."
)
_SUBJECT = "The entity the fact is about, named in full as in the text."
_PREDICATE = "A reusable snake_case relation of at most 32 characters, e.g. born_in, founded_by."
_OBJECT = "The value: an entity, a date, a number or a short phrase, as written."
_CONFIDENCE = "How sure you are that the fact is right, 0-100."
_TAGS = "A few lowercase keywords (letters, digits, hyphens), e.g. person, organization, date."


class FactRecord(BaseModel):
    """One fact as the extractor writes it (the items of the extractor's ``facts`` output)."""

    # The docstring above, the fields and their descriptions are the JSON schema the model is shown
    # (and the recorded requests' bytes): change them only on purpose. The validators below are
    # the lenient reading (module docstring); the guardrails check the fact after it.
    model_config = ConfigDict(extra="ignore", frozen=True)

    LIST_KEYS: ClassVar[tuple[str, ...]] = FACT_LIST_KEYS
    """Wrapper keys a reply's facts list may come under (read by :func:`kitune.lm.read_records`)."""

    title: str = Field(description=_TITLE)
    description: str = Field(description=_DESCRIPTION)
    subject: str = Field(description=_SUBJECT)
    predicate: str = Field(description=_PREDICATE)
    object: str = Field(description=_OBJECT)
    evidence_span: str = Field(
        description="An exact quote copied character for character from the text that supports the fact "
        "(one sentence or clause; no paraphrase, no changed punctuation)."
    )
    confidence: int = Field(ge=0, le=100, description=_CONFIDENCE)
    tags: list[str] = Field(default_factory=list, description=_TAGS)

    @model_validator(mode="before")
    @classmethod
    def _lenient(cls, data: Any, info: ValidationInfo) -> Any:
        return _fact_values(data, info, REQUIRED_FIELDS, citations=False)

    @classmethod
    def is_whole_record(cls, value: dict[str, Any]) -> bool:
        """True when ``value`` offers every required field (aliases applied): one record, not a wrapper."""
        return _offers(value, REQUIRED_FIELDS)


class SentenceFactRecord(BaseModel):
    """One fact in the sentence-indexed evidence mode: it cites sentence numbers, never quotes.

    kitune copies the cited sentences' text from the document, so the stored evidence is
    verbatim by construction and the model writes a few digits instead of a quote.
    """

    # As FactRecord: docstring, fields and descriptions are the schema the model is shown. The
    # citation is read under any of CITATION_KEYS (no valid number: an empty list, which the
    # extractor rejects once it has the sentences); a quoted evidence span is ignored.
    model_config = ConfigDict(extra="ignore", frozen=True)

    LIST_KEYS: ClassVar[tuple[str, ...]] = FACT_LIST_KEYS
    """Wrapper keys a reply's facts list may come under (read by :func:`kitune.lm.read_records`)."""

    title: str = Field(description=_TITLE)
    description: str = Field(description=_DESCRIPTION)
    subject: str = Field(description=_SUBJECT)
    predicate: str = Field(description=_PREDICATE)
    object: str = Field(description=_OBJECT)
    evidence_sentences: list[int] = Field(
        description="The number(s) in [brackets] of the sentence(s) that state the fact; one is usually "
        "enough."
    )
    confidence: int = Field(ge=0, le=100, description=_CONFIDENCE)
    tags: list[str] = Field(default_factory=list, description=_TAGS)

    @model_validator(mode="before")
    @classmethod
    def _lenient(cls, data: Any, info: ValidationInfo) -> Any:
        return _fact_values(data, info, _SENTENCE_REQUIRED, citations=True)

    @classmethod
    def is_whole_record(cls, value: dict[str, Any]) -> bool:
        """True when ``value`` offers every required text field and a citation key (one record)."""
        keys = {str(k).strip().lower() for k in value}
        return _offers(value, _SENTENCE_REQUIRED) and any(k in keys for k in CITATION_KEYS)


_SENTENCE_REQUIRED: tuple[str, ...] = ("title", "description", "subject", "predicate", "object")


class PlanDraft(BaseModel):
    """The values of a retrieval plan as the rewriter writes them (validated into a QueryPlan).

    Only values, never query text a store executes; ``size`` always comes from the caller.
    """

    # Docstring, fields and descriptions are the schema the model is shown; the validators below
    # only read null and single-string values leniently (they do not change the schema).
    model_config = ConfigDict(extra="ignore")

    entity_tags: list[str] = Field(
        default_factory=list,
        description="The proper names the question mentions, each as entity:<slug> (the name in lowercase, "
        "every run of other characters replaced by one hyphen: 'New York City' -> 'entity:new-york-city'). "
        "At most 20; empty when there are none.",
    )
    lexical: str = Field(
        default="",
        description="A few keywords likely to appear in the title of a fact that helps answer the question "
        "(names and relation words; no question words). At most 500 characters.",
    )
    semantic: str = Field(
        default="",
        description="One plain sentence describing the first fact needed, with the unknown left open. "
        "At most 1000 characters.",
    )
    filters: dict[str, Any] = Field(
        default_factory=dict,
        description='Usually {}; {"tags_any": ["<topic-tag>"]} only when the question is explicitly '
        "restricted to a topic.",
    )

    @field_validator("entity_tags", mode="before")
    @classmethod
    def _one_tag_as_list(cls, value: Any) -> Any:
        """A single tag given as a string is a one-tag list; null is no tags."""
        if value is None:
            return []
        return [value] if isinstance(value, str) else value

    @field_validator("lexical", "semantic", mode="before")
    @classmethod
    def _null_text(cls, value: Any) -> Any:
        """Null text is empty text (other non-strings stay invalid)."""
        return "" if value is None else value

    @field_validator("filters", mode="before")
    @classmethod
    def _null_filters(cls, value: Any) -> Any:
        """Null filters are no filters (other non-objects stay invalid)."""
        return {} if value is None else value
