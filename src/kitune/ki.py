"""The Knowledge Indicator (KI) record.

A KI is one short, self-contained, evidence-backed fact. The JSON shape follows the published
KI format (``shared/docs/DESIGN.md`` part 1)::

    {"type": "knowledge_indicator", "id": "ki-…", "title": "...", "description": "...",
     "references": ["index://dev"], "tags": ["entity:acme-corp", "doc:100060", "org"],
     "evidence_doc_ids": ["100060"],
     "payload": {"type": "fact", "subtype": "dataset_fact",
                 "properties": {"subject": ..., "predicate": ..., "object": ..., "docid": ...},
                 "evidence": ["verbatim span"], "confidence": 85, "status": "active",
                 "last_seen": "2026-11-30T10:00:00Z", "expires_at": null},
     "prompt_version": "extractor@1"}

The id is derived from doc id + subject + predicate + object (see :func:`ki_id`), so
re-extracting the same fact upserts instead of duplicating.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kitune.text import fold_text

__all__ = [
    "DEFAULT_STALE_AFTER",
    "DERIVED_SUBTYPES",
    "KI",
    "KIPayload",
    "KIProperties",
    "KIStatus",
    "KISubtype",
    "doc_tag",
    "entity_tag",
    "ki_id",
    "lifecycle_status",
    "slugify",
    "utcnow",
]

KIStatus = Literal["active", "stale", "expired"]
KISubtype = Literal["dataset_fact", "disambiguation", "source_description"]

DEFAULT_STALE_AFTER = timedelta(days=7)
"""A KI unseen for this long goes stale; unseen for twice this long it expires."""

DERIVED_SUBTYPES: tuple[KISubtype, ...] = ("disambiguation", "source_description")
"""Subtypes built from several documents or a whole source, with their own retention
(``lifecycle.derived_retention``) rather than their source document's."""

TITLE_MAX_CHARS = 140
DESCRIPTION_MAX_CHARS = 350
PREDICATE_MAX_CHARS = 32
_TAG_RE = re.compile(r"^(?:[a-z0-9][a-z0-9-]*|entity:[a-z0-9][a-z0-9-]*|doc:[A-Za-z0-9._-]+)$")


def utcnow() -> datetime:
    """Return the current time as a timezone-aware UTC datetime."""
    return datetime.now(UTC)


def slugify(text: str, *, max_chars: int = 64) -> str:
    """Return a lowercase ``a-z0-9-`` slug of ``text`` (at most ``max_chars``; may be empty).

    Accents are stripped via NFKD, so ``"Zürich"`` → ``"zurich"``.
    """
    ascii_text = unicodedata.normalize("NFKD", fold_text(text)).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")
    return slug[:max_chars].rstrip("-")


def entity_tag(name: str) -> str:
    """Return the ``entity:<slug>`` tag for an entity name (``entity:`` alone if nothing is left)."""
    return f"entity:{slugify(name)}"


def doc_tag(docid: str) -> str:
    """Return the ``doc:<docid>`` tag."""
    return f"doc:{docid}"


def ki_id(docid: str, subject: str, predicate: str, obj: str) -> str:
    """Derive the stable KI id from doc id + subject + predicate + object.

    The parts are folded (:func:`kitune.text.fold_text`) and lower-cased, so typographic or
    case variants of the same fact map to one id.

    Returns:
        ``"ki-"`` followed by 24 hex characters of a SHA-256 digest.
    """
    key = "\x1f".join(fold_text(part).lower() for part in (docid, subject, predicate, obj))
    return "ki-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]


def lifecycle_status(
    last_seen: datetime,
    now: datetime,
    *,
    stale_after: timedelta = DEFAULT_STALE_AFTER,
    expires_at: datetime | None = None,
) -> KIStatus:
    """Compute a KI's lifecycle status.

    Args:
        last_seen: when the KI was last (re-)extracted, UTC.
        now: the reference time, UTC.
        stale_after: unseen for longer than this → ``stale``; longer than twice this → ``expired``.
        expires_at: a hard expiry; at or after it the KI is ``expired`` whatever ``last_seen`` is.

    Returns:
        ``"active"``, ``"stale"`` or ``"expired"``.
    """
    if expires_at is not None and now >= expires_at:
        return "expired"
    age = now - last_seen
    if age > 2 * stale_after:
        return "expired"
    if age > stale_after:
        return "stale"
    return "active"


class KIProperties(BaseModel):
    """The fact as a triple plus the source document id."""

    model_config = ConfigDict(extra="forbid")

    subject: str = Field(min_length=1, description="The entity the fact is about.")
    predicate: str = Field(
        min_length=1,
        max_length=PREDICATE_MAX_CHARS,
        pattern=r"^[a-z][a-z0-9_]*$",
        description="snake_case relation, at most 32 characters.",
    )
    object: str = Field(min_length=1, description="The value: entity, date, number or phrase.")
    docid: str = Field(min_length=1, description="Id of the source document.")


class KIPayload(BaseModel):
    """Structured part of a KI: triple, evidence, confidence and lifecycle."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field(default="fact", description="Payload kind.")
    subtype: KISubtype = Field(
        default="dataset_fact", description="dataset_fact | disambiguation | source_description."
    )
    properties: KIProperties
    evidence: list[str] = Field(
        default_factory=list, description="Verbatim spans cut from the source document."
    )
    confidence: int = Field(ge=0, le=100, description="Extractor confidence, 0–100.")
    status: KIStatus = Field(default="active", description="Lifecycle status.")
    last_seen: datetime = Field(default_factory=utcnow, description="When last (re-)extracted, UTC.")
    expires_at: datetime | None = Field(default=None, description="Hard expiry, UTC, optional.")
    status_reason: str | None = Field(
        default=None,
        exclude_if=lambda v: v is None,  # the published KI shape is unchanged for every other KI
        description="Why the KI left ``active`` when it was not by age, e.g. ``source_changed`` (its "
        "document changed or was removed); None for the age-based sweep.",
    )


class KI(BaseModel):
    """A Knowledge Indicator (see the module docstring for the JSON shape).

    Raises:
        pydantic.ValidationError: on a title over 140 chars, a description over 350 chars,
            a badly formed tag, a predicate that is not snake_case ≤ 32 chars, or a confidence
            outside 0–100.
    """

    model_config = ConfigDict(extra="forbid")

    type: Literal["knowledge_indicator"] = "knowledge_indicator"
    id: str = Field(description="Stable id from ki_id(docid, subject, predicate, object).")
    title: str = Field(
        min_length=1, max_length=TITLE_MAX_CHARS, description="One sentence ending on the answer value."
    )
    description: str = Field(
        min_length=1, max_length=DESCRIPTION_MAX_CHARS, description="2–3 sentences with the evidence."
    )
    references: list[str] = Field(default_factory=list, description="e.g. index://<corpus>.")
    tags: list[str] = Field(
        default_factory=list, description="lowercase a-z0-9- tags, entity:<slug>, doc:<docid>."
    )
    evidence_doc_ids: list[str] = Field(
        default_factory=list, description="Documents the evidence comes from."
    )
    payload: KIPayload
    prompt_version: str = Field(
        default="", description="Prompt version of the program that produced this KI."
    )

    @field_validator("tags")
    @classmethod
    def _check_tags(cls, tags: list[str]) -> list[str]:
        bad = [t for t in tags if not _TAG_RE.match(t)]
        if bad:
            raise ValueError(f"malformed tags {bad}: use lowercase a-z0-9-, entity:<slug> or doc:<docid>")
        return list(dict.fromkeys(tags))

    @classmethod
    def from_fact(
        cls,
        *,
        docid: str,
        title: str,
        description: str,
        subject: str,
        predicate: str,
        obj: str,
        evidence: list[str],
        confidence: int,
        tags: list[str] | None = None,
        corpus: str = "corpus",
        subtype: KISubtype = "dataset_fact",
        prompt_version: str = "",
        evidence_doc_ids: list[str] | None = None,
        now: datetime | None = None,
    ) -> KI:
        """Build a KI from a verified fact, adding ``entity:``/``doc:`` tags and the stable id.

        Raises:
            pydantic.ValidationError: if any field breaks the KI rules.
        """
        all_tags = [t for t in (tags or []) if t]
        for name in (subject, obj):
            tag = entity_tag(name)
            if tag != "entity:":
                all_tags.append(tag)
        all_tags.append(doc_tag(docid))
        return cls(
            id=ki_id(docid, subject, predicate, obj),
            title=title,
            description=description,
            references=[f"index://{corpus}"],
            tags=all_tags,
            evidence_doc_ids=evidence_doc_ids or [docid],
            payload=KIPayload(
                subtype=subtype,
                properties=KIProperties(subject=subject, predicate=predicate, object=obj, docid=docid),
                evidence=evidence,
                confidence=confidence,
                last_seen=now or utcnow(),
            ),
            prompt_version=prompt_version,
        )

    @property
    def entities(self) -> list[str]:
        """Entity slugs from the ``entity:`` tags, in tag order."""
        return [t.split(":", 1)[1] for t in self.tags if t.startswith("entity:")]

    def text_for_context(self) -> str:
        """Render the KI as the agent sees it: ``[ki-id] title — description (docs: …)``."""
        docs = ", ".join(self.evidence_doc_ids)
        return f"[{self.id}] {self.title} — {self.description} (docs: {docs})"
