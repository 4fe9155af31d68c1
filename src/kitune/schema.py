"""Backend-neutral records shared by the programs, the stores and the eval harness.

* :class:`Document` — one corpus document (``docid``, ``title``, ``text``, ``url``, ``source``).
* :class:`Filter` — a backend-neutral KI filter; the embedded store calls :meth:`Filter.evaluate`,
  the Elasticsearch backend translates it to ES|QL/Query DSL.
* :class:`QueryPlan` — what the query rewriter produces and each store compiles. The LLM
  never writes query text that is executed: every field here is a validated *value*.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kitune.ki import entity_tag

if TYPE_CHECKING:
    from kitune.ki import KI, KIStatus, KISubtype

__all__ = ["Document", "Filter", "QueryPlan"]

_ENTITY_TAG_RE = re.compile(r"^entity:[a-z0-9][a-z0-9-]*$")
_TAG_RE = re.compile(r"^(?:[a-z0-9][a-z0-9-]*|entity:[a-z0-9][a-z0-9-]*|doc:[A-Za-z0-9._-]+)$")


@dataclass(frozen=True)
class Document:
    """One corpus document."""

    docid: str
    """Unique id (BrowseComp-Plus style numeric strings in the shipped data)."""
    text: str
    """Full text, UTF-8."""
    title: str = ""
    """Title, possibly empty."""
    url: str = ""
    """Source URL, possibly empty."""
    source: str = ""
    """Origin dataset or system, e.g. ``"musique"``."""
    metadata: dict[str, str] = field(default_factory=dict)
    """Free-form string metadata (record fields for structured corpora)."""


class Filter(BaseModel):
    """Backend-neutral KI filter. Empty fields do not filter. All given conditions must hold.

    ``statuses``: search serves only active KIs when ``statuses`` is not set; a default Filter in
    ``count``/``iter_kis`` excludes only expired ones. ``subjects``/``predicates`` match the KI's
    triple exactly (stores without triple columns refuse them with a clear error).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    statuses: tuple[str, ...] = Field(default=("active", "stale"), description="Allowed lifecycle statuses.")
    tags_all: tuple[str, ...] = Field(default=(), description="KI must carry every one of these tags.")
    tags_any: tuple[str, ...] = Field(default=(), description="KI must carry at least one of these tags.")
    doc_ids: tuple[str, ...] = Field(default=(), description="KI evidence must include one of these docs.")
    subtypes: tuple[str, ...] = Field(default=(), description="Allowed payload subtypes.")
    min_confidence: int = Field(default=0, ge=0, le=100, description="Confidence floor, 0–100.")
    subjects: tuple[str, ...] = Field(default=(), description="Triple subject must be one of these (exact).")
    predicates: tuple[str, ...] = Field(
        default=(), description="Triple predicate must be one of these (exact)."
    )

    @field_validator("statuses")
    @classmethod
    def _check_statuses(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [s for s in v if s not in ("active", "stale", "expired")]
        if bad:
            raise ValueError(f"unknown status {bad}: use active, stale or expired")
        return v

    @field_validator("tags_all", "tags_any")
    @classmethod
    def _check_tags(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [t for t in v if not _TAG_RE.match(t)]
        if bad:
            raise ValueError(f"malformed tags {bad}")
        return v

    def evaluate(self, ki: KI) -> bool:
        """Return True when ``ki`` passes every condition of this filter."""
        if self.statuses and ki.payload.status not in self.statuses:
            return False
        tags = set(ki.tags)
        if self.tags_all and not set(self.tags_all) <= tags:
            return False
        if self.tags_any and not (set(self.tags_any) & tags):
            return False
        if self.doc_ids and not (set(self.doc_ids) & set(ki.evidence_doc_ids)):
            return False
        if self.subtypes and ki.payload.subtype not in self.subtypes:
            return False
        props = ki.payload.properties
        if self.subjects and props.subject not in self.subjects:
            return False
        if self.predicates and props.predicate not in self.predicates:
            return False
        return ki.payload.confidence >= self.min_confidence

    @classmethod
    def of(
        cls,
        *,
        statuses: tuple[KIStatus, ...] = ("active", "stale"),
        subtypes: tuple[KISubtype, ...] = (),
        **kwargs: object,
    ) -> Filter:
        """Typed convenience constructor (same fields as the model)."""
        return cls(statuses=statuses, subtypes=subtypes, **kwargs)


class QueryPlan(BaseModel):
    """A typed retrieval request: the query rewriter's output, compiled by each store.

    Branches: ``entity_tags`` drive the tag branch, ``lexical`` drives BM25 on KI titles,
    ``semantic`` drives vector search on KI descriptions. A branch with no input is skipped.

    Raises:
        pydantic.ValidationError: on malformed tags, over-long text (lexical ≤ 500 chars,
            semantic ≤ 1000 chars), ``size`` outside 1–1000, or a plan with no branch input.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    entity_tags: tuple[str, ...] = Field(default=(), max_length=20, description="entity:<slug> tags.")
    lexical: str = Field(default="", max_length=500, description="Keywords matched against KI titles (BM25).")
    semantic: str = Field(
        default="", max_length=1000, description="Text matched against KI descriptions (vectors)."
    )
    filters: Filter = Field(default_factory=Filter, description="Conditions every KI must meet.")
    size: int = Field(default=10, ge=1, le=1000, description="KIs to return, best first.")

    @field_validator("entity_tags")
    @classmethod
    def _check_entity_tags(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [t for t in v if not _ENTITY_TAG_RE.match(t)]
        if bad:
            raise ValueError(f"entity tags must look like entity:<slug>, got {bad}")
        return tuple(dict.fromkeys(v))

    def is_empty(self) -> bool:
        """True when no branch has input (nothing to search for)."""
        return not (self.entity_tags or self.lexical.strip() or self.semantic.strip())

    @classmethod
    def plain(cls, question: str, *, size: int = 10, filters: Filter | None = None) -> QueryPlan:
        """The fallback plan: the question as both lexical and semantic text.

        Entity tags are guessed from capitalised word runs. Deterministic.
        """
        q = " ".join(question.split())
        runs = re.findall(r"(?:[A-Z][\w'’.-]*)(?:\s+(?:of|the|de|von|van|[A-Z][\w'’.-]*))*", q)
        tags = []
        for run in runs:
            tag = entity_tag(run)
            if tag != "entity:" and _ENTITY_TAG_RE.match(tag):
                tags.append(tag)
        return cls(
            entity_tags=tuple(dict.fromkeys(tags))[:20],
            lexical=q[:500],
            semantic=q[:1000],
            filters=filters or Filter(),
            size=size,
        )
