"""The domain describer: a corpus sample → a typed :class:`DomainDescription`.

One LM call per corpus (plus one retry when the reply holds no usable JSON). The output is typed,
``description: DomainDescription``, so the format comes from the type through the adapter, which
reads it leniently (:func:`kitune.lm.parse_leniently`: reasoning blocks, fences and prose around
the object are skipped) and the program reads the typed field directly
(:func:`kitune.programs.predict.predict_typed`); :func:`parse_description` applies the same reading
to a reply text. Either way the pydantic model :class:`DomainDescription` validates it, lenient
about shape drift and strict about values:

* key aliases (``entities`` → ``entity_types``, ``relations`` → ``predicates`` …, see
  :data:`KEY_ALIASES`) and one wrapper level (``{"description": {...}}``) are accepted;
* a comma- or semicolon-separated string given for a list is split;
* entity types are lower-cased and de-duplicated; predicates are turned into snake_case
  (``"Directed By"`` → ``directed_by``) and dropped when still not ``[a-z][a-z0-9_]*`` ≤ 32
  characters; every list is capped (:data:`LIST_CAPS`) and every string cut to its limit;
* ``fields`` accepts an object, a list of ``{"name", "meaning"}`` objects or a list of names;
* ``date_range`` accepts ``{"start", "end"}`` (or ``from``/``to``), a ``"1990-2020"`` string or a
  two-item list; anything else becomes None.

A reply that still fails validation (no ``domain``) is a parse failure; after the retry the
describer returns :meth:`DomainDescription.fallback` with ``status="fallback"`` instead of
raising, so the bootstrap can go on and report it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import dspy
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kitune.errors import ParseError
from kitune.lm import extract_json
from kitune.programs.instructions import resolve_instruction
from kitune.programs.predict import predict_typed
from kitune.schema import Document

__all__ = [
    "KEY_ALIASES",
    "LIST_CAPS",
    "DateRange",
    "DescribeDomain",
    "DescriptionResult",
    "DomainDescriber",
    "DomainDescription",
    "parse_description",
    "render_sample",
    "to_predicate",
]

KEY_ALIASES: dict[str, str] = {
    "entities": "entity_types",
    "entity_type": "entity_types",
    "types": "entity_types",
    "relations": "predicates",
    "relation_types": "predicates",
    "predicate": "predicates",
    "document_types": "document_kinds",
    "doc_kinds": "document_kinds",
    "kinds": "document_kinds",
    "field_meanings": "fields",
    "record_fields": "fields",
    "queries": "query_patterns",
    "query_examples": "query_patterns",
    "example_queries": "query_patterns",
    "dates": "date_range",
    "date": "date_range",
    "time_range": "date_range",
    "disambiguators": "disambiguating_details",
    "distinguishing_details": "disambiguating_details",
    "topic": "domain",
    "description": "summary",
}
"""Drifting key names the parser maps to :class:`DomainDescription` fields."""

LIST_CAPS: dict[str, int] = {
    "document_kinds": 6,
    "entity_types": 12,
    "predicates": 15,
    "query_patterns": 5,
    "disambiguating_details": 6,
}
"""Most items kept per list field (the rest are dropped, first ones kept)."""

_ITEM_MAX_CHARS = 80
_PREDICATE_RE = re.compile(r"^[a-z][a-z0-9_]{2,31}$")


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = re.split(r"[;,\n]", value)
    if isinstance(value, dict):
        value = list(value)
    if not isinstance(value, list | tuple):
        value = [value]
    out: list[str] = []
    for item in value:
        if isinstance(item, dict):
            item = item.get("name") or item.get("type") or next(iter(item.values()), "")
        if isinstance(item, str | int | float) and not isinstance(item, bool):
            text = _cut(str(item).strip().strip("\"'"), _ITEM_MAX_CHARS)
            if text:
                out.append(text)
    return out


def _dedupe(items: list[str], key: Any = str.casefold) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for item in items:
        k = key(item)
        if k not in seen:
            seen.add(k)
            out.append(item)
    return out


def to_predicate(text: str) -> str:
    """``"Directed By"`` → ``"directed_by"``; "" unless 3–32 chars of valid snake_case remain."""
    snake = re.sub(r"[^a-z0-9]+", "_", text.strip().lower()).strip("_")
    snake = re.sub(r"^[0-9_]+", "", snake)[:32].rstrip("_")
    return snake if _PREDICATE_RE.match(snake) else ""


class DateRange(BaseModel):
    """Earliest and latest dates (or years) visible in the sample, as written."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    start: str = Field(default="", max_length=40, description="Earliest date or year, e.g. '1871'.")
    end: str = Field(default="", max_length=40, description="Latest date or year, e.g. '2016'.")

    def label(self) -> str:
        """``"1871 – 2016"``, or the one end given; "" when neither is."""
        return " – ".join(p for p in (self.start, self.end) if p)


class DomainDescription(BaseModel):
    """A typed description of a corpus, written by the LM from a sample (see the module doc).

    Raises:
        pydantic.ValidationError: no ``domain`` (empty after trimming).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    domain: str = Field(min_length=1, max_length=120, description="What the collection is about.")
    summary: str = Field(default="", max_length=400, description="One or two sentences on the content.")
    document_kinds: tuple[str, ...] = Field(default=(), description="Kinds of documents or records.")
    entity_types: tuple[str, ...] = Field(default=(), description="Entity types to extract, lowercase.")
    predicates: tuple[str, ...] = Field(default=(), description="Preferred snake_case relations.")
    fields: dict[str, str] = Field(default_factory=dict, description="Record field → meaning (records only).")
    query_patterns: tuple[str, ...] = Field(default=(), description="How the data is usually asked about.")
    date_range: DateRange | None = Field(default=None, description="Dates visible in the sample.")
    disambiguating_details: tuple[str, ...] = Field(default=(), description="Details that tell twins apart.")

    @model_validator(mode="before")
    @classmethod
    def _map_aliases(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out: dict[str, Any] = {}
        for key, value in data.items():
            name = KEY_ALIASES.get(str(key).strip().lower(), str(key).strip().lower())
            if name not in out or out[name] in (None, "", [], {}):
                out[name] = value
        return out

    @field_validator("domain", "summary", mode="before")
    @classmethod
    def _trim_text(cls, v: Any, info: Any) -> str:
        limit = 120 if info.field_name == "domain" else 400
        return _cut(str(v or ""), limit)

    @field_validator("document_kinds", "query_patterns", "disambiguating_details", mode="before")
    @classmethod
    def _text_list(cls, v: Any, info: Any) -> tuple[str, ...]:
        return tuple(_dedupe(_as_list(v))[: LIST_CAPS[info.field_name]])

    @field_validator("entity_types", mode="before")
    @classmethod
    def _types(cls, v: Any) -> tuple[str, ...]:
        items = [" ".join(t.lower().replace("_", " ").split())[:40] for t in _as_list(v)]
        return tuple(_dedupe([t for t in items if t])[: LIST_CAPS["entity_types"]])

    @field_validator("predicates", mode="before")
    @classmethod
    def _predicates(cls, v: Any) -> tuple[str, ...]:
        items = [to_predicate(p) for p in _as_list(v)]
        return tuple(_dedupe([p for p in items if p])[: LIST_CAPS["predicates"]])

    @field_validator("fields", mode="before")
    @classmethod
    def _fields(cls, v: Any) -> dict[str, str]:
        out: dict[str, str] = {}
        if isinstance(v, dict):
            pairs = list(v.items())
        elif isinstance(v, list):
            pairs = []
            for item in v:
                if isinstance(item, dict):
                    pairs.append((item.get("name") or item.get("field") or "", item.get("meaning") or ""))
                elif isinstance(item, str):
                    pairs.append((item, ""))
        else:
            pairs = []
        for name, meaning in pairs[:40]:
            key = str(name).strip()[:_ITEM_MAX_CHARS]
            if key:
                out[key] = _cut(str(meaning or ""), 160)
        return out

    @field_validator("date_range", mode="before")
    @classmethod
    def _date_range(cls, v: Any) -> Any:
        if isinstance(v, dict):
            start = v.get("start", v.get("from", v.get("earliest", "")))
            end = v.get("end", v.get("to", v.get("latest", "")))
        elif isinstance(v, list | tuple) and len(v) == 2:
            start, end = v
        elif isinstance(v, str) and v.strip():
            years = re.fullmatch(r"(\d{3,4})\s*[-–]\s*(\d{3,4})", v.strip())
            parts = list(years.groups()) if years else re.split(r"\s+(?:-|–|to)\s+", v.strip(), maxsplit=1)
            start, end = [*parts, ""][:2]
        else:
            return None
        start, end = (_cut(str(x or "").strip(), 40) for x in (start, end))
        if start.lower() in ("null", "none", "unknown", "n/a"):
            start = ""
        if end.lower() in ("null", "none", "unknown", "n/a"):
            end = ""
        return DateRange(start=start, end=end) if (start or end) else None

    @classmethod
    def fallback(
        cls,
        corpus_name: str,
        *,
        kind: str = "prose",
        fields: Sequence[str] = (),
        entity_types: Sequence[str] = (),
    ) -> DomainDescription:
        """A minimal description built without the LM (used when its reply stays unusable).

        Args:
            corpus_name: names the domain (``"<corpus_name> corpus"``).
            kind: ``"prose"`` or ``"records"``.
            fields: record field names (meanings left empty).
            entity_types: entity types known anyway (e.g. the pinned ones).
        """
        return cls(
            domain=f"{corpus_name} corpus",
            document_kinds=["structured record" if kind == "records" else "document"],
            entity_types=list(entity_types),
            fields={name: "" for name in fields},
        )


def parse_description(raw: str) -> tuple[DomainDescription, Counter[str]]:
    """Read a :class:`DomainDescription` from a model reply.

    Returns:
        ``(description, counters)``; counters note ``think_stripped``, ``fence_stripped``,
        ``wrapper_unwrapped`` and ``list_unwrapped``.

    Raises:
        ParseError: no JSON object in the reply, or the object fails validation (message names
            the fields at fault); ``raw`` is kept on the error.
    """
    counts: Counter[str] = Counter()
    value = extract_json(raw, counts)
    if isinstance(value, list):
        value = next((v for v in value if isinstance(v, dict)), {})
        counts["list_unwrapped"] += 1
    if isinstance(value, dict) and "domain" not in value and len(value) == 1:
        inner = next(iter(value.values()))
        if isinstance(inner, dict):
            value = inner
            counts["wrapper_unwrapped"] += 1
    try:
        return DomainDescription.model_validate(value), counts
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc'])) or 'object'}: {err['msg']}" for err in e.errors()
        )
        raise ParseError(
            f"domain description invalid ({problems}): the reply needs at least a non-empty 'domain'", raw=raw
        ) from e


class DescribeDomain(dspy.Signature):  # type: ignore[misc]
    """Describe a document collection from a sample of it."""

    corpus_name: str = dspy.InputField(desc="Name of the collection.")
    record_fields: str = dspy.InputField(
        desc="Fields of the structured records, or 'none (prose documents)'."
    )
    sample: str = dspy.InputField(desc="A few documents from the collection, each starting with [id].")
    example_questions: str = dspy.InputField(desc="Questions people ask about the collection (may be empty).")
    description: DomainDescription = dspy.OutputField(desc="The description of the collection.")


@dataclass(frozen=True)
class DescriptionResult:
    """What :meth:`DomainDescriber.describe` returns."""

    description: DomainDescription
    status: Literal["ok", "fallback"]
    """``fallback``: every reply was unusable (or the LM call raised); see ``error``."""
    lm_calls: int
    """LM calls made (1, or 2 with the retry)."""
    error: str = ""
    """Why the fallback was used (empty when ok)."""
    raw: str = ""
    """The last reply (kept for the report)."""
    counters: dict[str, int] | None = None
    """Parse counters of the accepted reply (the adapter reads the typed field: empty)."""


def render_sample(docs: Sequence[Document], *, doc_chars: int = 600) -> str:
    """Render documents as ``[docid] title`` + the first ``doc_chars`` characters, blank-line separated."""
    parts = []
    for d in docs:
        head = f"[{d.docid}] {d.title}".rstrip()
        body = d.text if len(d.text) <= doc_chars else d.text[:doc_chars].rstrip() + " …"
        parts.append(f"{head}\n{body}")
    return "\n\n".join(parts)


class DomainDescriber(dspy.Module):  # type: ignore[misc]
    """Corpus sample → :class:`DomainDescription`. Its optimisable predictor is ``describe_domain``.

    Args:
        instructions: None loads the packaged ``domain_describer`` prompt.
        doc_chars: characters of each sampled document shown to the LM (keeps the prompt short).
        max_questions: example questions shown at most.
        max_tokens: output-token cap of the call (keeps a slow local model's reply short).
        retries: extra calls when the reply is unusable (default 1; the retry bypasses the cache).
    """

    def __init__(
        self,
        instructions: str | None = None,
        *,
        doc_chars: int = 600,
        max_questions: int = 5,
        max_tokens: int = 700,
        retries: int = 1,
    ) -> None:
        super().__init__()
        text, self.prompt_version = resolve_instruction("domain_describer", instructions)
        self.describe_domain = dspy.Predict(DescribeDomain.with_instructions(text))
        self.doc_chars = doc_chars
        self.max_questions = max_questions
        self.max_tokens = max_tokens
        self.retries = retries

    def _complete(self, inputs: dict[str, Any], attempt: int) -> tuple[DomainDescription | None, str, str]:
        """One call; returns ``(description or None, the model's reply, why there is none)``."""
        config: dict[str, Any] = {"max_tokens": self.max_tokens}
        if attempt > 0:
            config.update(cache=False, rollout_id=attempt, temperature=0.7)
        reply = predict_typed(self.describe_domain, config=config, **inputs)
        if reply.prediction is not None and isinstance(reply.prediction.description, DomainDescription):
            return reply.prediction.description, reply.raw, ""
        error = reply.error.detail if reply.error is not None else "the reply holds no description"
        return None, reply.raw, error

    def describe(
        self,
        docs: Sequence[Document],
        *,
        corpus_name: str,
        kind: str = "prose",
        fields: Mapping[str, str] | None = None,
        questions: Sequence[str] = (),
        pin_types: Sequence[str] = (),
    ) -> DescriptionResult:
        """Describe the corpus from ``docs``.

        Args:
            docs: the sample (rendered with :func:`render_sample`).
            corpus_name: the collection's name.
            kind: ``"prose"`` or ``"records"``.
            fields: records only: field name → what was seen (e.g. ``"in 40 of 40 records, e.g.
                12.50"``), shown to the LM one per line.
            questions: example questions (the first ``max_questions`` are shown).
            pin_types: entity types for the fallback description.

        Returns:
            :class:`DescriptionResult`. Unusable replies never raise: after ``retries`` the
            fallback description is returned with ``status="fallback"``.

        Raises:
            kitune.errors.LMError: the LM call failed (wrong key, unreachable, timeout): a
                description cannot be written without it, so the caller decides.
        """
        fields = dict(fields or {})
        inputs = {
            "corpus_name": corpus_name,
            "record_fields": "\n".join(f"{name}: {hint}" for name, hint in fields.items())
            if kind == "records" and fields
            else "none (prose documents)",
            "sample": render_sample(docs, doc_chars=self.doc_chars),
            "example_questions": "\n".join(f"- {_cut(q, 200)}" for q in questions[: self.max_questions]),
        }
        error, raw, calls = "", "", 0
        for attempt in range(self.retries + 1):
            calls += 1
            description, raw, error = self._complete(inputs, attempt)
            if description is not None:
                return DescriptionResult(description, "ok", calls, raw=raw, counters={})
        names = list(fields) if kind == "records" else []
        fallback = DomainDescription.fallback(corpus_name, kind=kind, fields=names, entity_types=pin_types)
        return DescriptionResult(fallback, "fallback", calls, error=error, raw=raw)

    def forward(self, sample: str, corpus_name: str = "corpus") -> dspy.Prediction:
        """Describe a pre-rendered sample (the form optimisers call); ``description`` or None."""
        description, raw, _error = self._complete(
            {
                "corpus_name": corpus_name,
                "record_fields": "none (prose documents)",
                "sample": sample,
                "example_questions": "",
            },
            0,
        )
        return dspy.Prediction(description=description, raw=raw)
