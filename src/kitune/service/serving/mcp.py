"""The MCP tools as plain functions: ``get_context``, ``search_documents``, ``get_document``.

:mod:`kitune.mcp_server` wires these into the official ``mcp`` SDK; here they are ordinary,
synchronous, SDK-free functions over the service layer, so they are tested without a transport.

* :func:`context_tool` runs :func:`kitune.service.serving.context.get_context` (same size clamp,
  confidence floor and rewriter fallback as ``kitune context`` and ``POST /api/_get_context``)
  and returns each KI with its tags, references, evidence doc ids, subtype and confidence, plus
  the aggregations. Optional :class:`ContextFilters` are *values* validated by pydantic (tags
  must match the tag grammar, subtypes are an enum): they replace the rewriter's filter of the
  same name and are never dropped by the empty-result relaxation; no query text reaches a store
  unparsed.
* :func:`search_documents_tool` / :func:`get_document_tool` are the baseline's raw corpus
  search and fetch (the LanceDB corpus tables ``kitune eval`` fills).
* :func:`review_list_tool`, :func:`review_show_tool`, :func:`review_action_tool` — the review
  queue (:mod:`kitune.service.workflows.review`), served only with ``review.mcp_tools: true`` (they write);
  a review error (unknown id, wrong status, missing reason) is raised as :class:`ValueError`
  with the queue's message.
* :func:`source_description_kis` lists the ``source_description`` KIs ``kitune bootstrap``
  wrote (what the corpus is, its entity types), which the server exposes as a resource.

Every function raises :class:`ValueError` for a bad argument (the message names the argument
and the allowed range) and lets :mod:`kitune.errors` store errors propagate; the server turns
both into MCP tool errors.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kitune.config import KituneConfig
from kitune.errors import ReviewError
from kitune.ki import KI
from kitune.programs.query_rewriter import QueryRewriter
from kitune.retrieval.base import CorpusStore, SearchResult, Store
from kitune.schema import Filter, QueryPlan
from kitune.service.serving.context import get_context
from kitune.usage import TokenLedger

__all__ = [
    "MAX_DOCUMENT_CHARS",
    "MAX_QUERY_CHARS",
    "ContextFilters",
    "context_tool",
    "get_document_tool",
    "review_action_tool",
    "review_list_tool",
    "review_show_tool",
    "search_documents_tool",
    "source_description_kis",
]

MAX_QUERY_CHARS = 2000
"""Longest accepted query, in characters (same as ``POST /api/_get_context``)."""

MAX_DOCUMENT_CHARS = 20_000
"""Default cap on the text ``get_document`` returns, in characters."""


class ContextFilters(BaseModel):
    """Optional conditions every returned KI must meet; an omitted field does not filter."""

    model_config = ConfigDict(extra="forbid")

    tags_all: list[str] = Field(
        default_factory=list,
        max_length=20,
        description="KI must carry every one of these tags (plain tags, entity:<slug>, doc:<docid>).",
    )
    tags_any: list[str] = Field(
        default_factory=list, max_length=20, description="KI must carry at least one of these tags."
    )
    doc_ids: list[str] = Field(
        default_factory=list, max_length=50, description="KI evidence must cite one of these document ids."
    )
    subtypes: list[Literal["dataset_fact", "disambiguation", "source_description"]] = Field(
        default_factory=list, description="Allowed KI subtypes."
    )
    min_confidence: int = Field(
        default=0, ge=0, le=100, description="Drop KIs below this confidence (0–100)."
    )

    def overrides(self) -> dict[str, Any]:
        """The given fields as :class:`kitune.schema.Filter` updates (tuples; empty ones left out)."""
        out: dict[str, Any] = {}
        for name in ("tags_all", "tags_any", "doc_ids", "subtypes"):
            value = getattr(self, name)
            if value:
                out[name] = tuple(value)
        return out


class _FilteredStore:
    """A store view that applies the caller's filters to every plan and remembers the hits' KIs.

    The caller's fields replace the rewriter's (and survive ``get_context``'s relaxation of an
    empty narrowing filter); the confidence floor is the maximum of both.
    """

    def __init__(self, store: Store, filters: ContextFilters | None) -> None:
        self.store = store
        self.filters = filters
        self.kis: dict[str, KI] = {}

    def _plan(self, plan: QueryPlan) -> QueryPlan:
        if self.filters is None:
            return plan
        update = self.filters.overrides()
        update["min_confidence"] = max(plan.filters.min_confidence, self.filters.min_confidence)
        merged = Filter.model_validate({**plan.filters.model_dump(), **update})
        return plan.model_copy(update={"filters": merged})

    def compile(self, plan: QueryPlan) -> Any:
        return self.store.compile(self._plan(plan))

    def search(self, plan: QueryPlan) -> SearchResult:
        result = self.store.search(self._plan(plan))
        self.kis.update({h.ki.id: h.ki for h in result.hits})
        return result

    def iter_kis(self, filters: Filter | None = None) -> Iterator[KI]:
        return self.store.iter_kis(filters)


def _check_query(query: Any, name: str = "query") -> str:
    if not isinstance(query, str) or not query.strip():
        raise ValueError(f"{name} is blank: pass the question or keywords as text")
    if len(query) > MAX_QUERY_CHARS:
        raise ValueError(f"{name} has {len(query)} characters: at most {MAX_QUERY_CHARS} are accepted")
    return query


def _check_int(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name}={value!r}: pass an integer from {low} to {high}")
    return value


def context_tool(
    query: str,
    *,
    store: Store,
    cfg: KituneConfig,
    size: int | None = None,
    filters: ContextFilters | None = None,
    rewriter: QueryRewriter | None = None,
    ledger: TokenLedger | None = None,
) -> dict[str, Any]:
    """KIs for ``query``: the ``get_context`` MCP tool.

    Args:
        query: the question, 1–2000 characters, not blank.
        store: the KI store.
        cfg: configuration (``retrieval.default_size``, ``max_size``, ``confidence_floor``).
        size: KIs wanted, 1–``retrieval.max_size`` (None: ``retrieval.default_size``).
        filters: optional KI conditions (see :class:`ContextFilters`).
        rewriter: the query rewriter with its LM (None: the plain plan, no LLM call).
        ledger: token ledger for the rewrite.

    Returns:
        ``{"kis": [{"id", "title", "description", "tags", "references", "evidence_doc_ids",
        "subtype", "confidence", "score"}], "aggregations": {"by_tag", "by_doc", "by_entity"},
        "rewrite_fell_back": bool, "filters_relaxed": bool, "took_ms": float}``; KIs best first,
        at most ``size``.

    Raises:
        ValueError: blank or over-long query, ``size`` out of range.
        StoreUnavailableError: the store backend cannot be reached.
    """
    _check_query(query)
    max_size = cfg.retrieval.max_size
    size = (
        min(cfg.retrieval.default_size, max_size) if size is None else _check_int(size, "size", 1, max_size)
    )
    view = _FilteredStore(store, filters)
    t0 = time.perf_counter()
    resp = get_context(query, store=view, rewriter=rewriter, size=size, cfg=cfg, ledger=ledger)  # type: ignore[arg-type]
    kis = []
    for k in resp.kis:
        full = view.kis.get(k.id)
        kis.append(
            {
                "id": k.id,
                "title": k.title,
                "description": k.description,
                "tags": list(k.tags),
                "references": list(full.references) if full else [],
                "evidence_doc_ids": list(k.evidence_doc_ids),
                "subtype": full.payload.subtype if full else None,
                "confidence": full.payload.confidence if full else None,
                "score": round(k.score, 6),
            }
        )
    return {
        "kis": kis,
        "aggregations": resp.aggregations.model_dump(),
        "rewrite_fell_back": resp.rewrite_fell_back,
        "filters_relaxed": resp.filters_relaxed,
        "took_ms": round((time.perf_counter() - t0) * 1000, 1),
    }


def search_documents_tool(
    query: str, *, corpus_store: CorpusStore, cfg: KituneConfig, k: int | None = None
) -> dict[str, Any]:
    """Raw document search (BM25 + vectors over passages): the ``search_documents`` MCP tool.

    Args:
        query: keywords, 1–2000 characters.
        corpus_store: the corpus store.
        cfg: ``retrieval.search_hits`` (default and cap of ``k``), ``snippets_per_hit``, ``snippet_chars``.
        k: documents wanted, 1–100 (None: ``retrieval.search_hits``).

    Returns:
        ``{"hits": [{"docid", "title", "snippets", "score"}]}`` best first; empty when the corpus
        has not been indexed (``kitune index``/``kitune eval`` fill it).

    Raises:
        ValueError: blank or over-long query, ``k`` out of range.
    """
    _check_query(query)
    r = cfg.retrieval
    k = r.search_hits if k is None else _check_int(k, "k", 1, 100)
    hits = corpus_store.search(query, k=k, snippets_per_hit=r.snippets_per_hit, snippet_chars=r.snippet_chars)
    return {
        "hits": [
            {"docid": h.docid, "title": h.title, "snippets": list(h.snippets), "score": round(h.score, 6)}
            for h in hits[:k]
        ]
    }


def get_document_tool(
    docid: str, *, corpus_store: CorpusStore, max_chars: int = MAX_DOCUMENT_CHARS
) -> dict[str, Any]:
    """One full document by id: the ``get_document`` MCP tool.

    Args:
        docid: the document id as cited by a KI's ``evidence_doc_ids`` or a search hit.
        corpus_store: the corpus store.
        max_chars: cap on the returned text, characters.

    Returns:
        ``{"docid", "title", "url", "source", "text", "chars", "truncated"}``; ``chars`` is the
        full length, ``text`` at most ``max_chars`` of it.

    Raises:
        ValueError: blank docid.
        DocumentNotFoundError: no document has this id.
    """
    if not isinstance(docid, str) or not docid.strip():
        raise ValueError("docid is blank: pass an id from a KI's evidence_doc_ids or a search hit")
    doc = corpus_store.get(docid.strip().strip("[]"))
    return {
        "docid": doc.docid,
        "title": doc.title,
        "url": doc.url,
        "source": doc.source,
        "text": doc.text[:max_chars],
        "chars": len(doc.text),
        "truncated": len(doc.text) > max_chars,
    }


@dataclass(frozen=True)
class SourceDescription:
    """The source-description KIs of a store, rendered for an agent."""

    kis: list[dict[str, Any]] = field(default_factory=list)
    """``{"id", "title", "description", "tags", "references"}`` per KI, store order."""

    def to_text(self) -> str:
        """Markdown: one bullet per KI (title, then description); a hint when there is none."""
        if not self.kis:
            return (
                "No source-description KIs in this store yet: run `kitune bootstrap --corpus ...` to "
                "describe the corpus."
            )
        lines = ["# What this knowledge base holds", ""]
        lines += [f"- **{k['title']}** {k['description']}" for k in self.kis]
        return "\n".join(lines)


def source_description_kis(store: Store, *, limit: int = 50) -> SourceDescription:
    """The store's ``source_description`` KIs (active or stale), at most ``limit``."""
    out: list[dict[str, Any]] = []
    for ki in store.iter_kis(Filter(subtypes=("source_description",))):
        out.append(
            {
                "id": ki.id,
                "title": ki.title,
                "description": ki.description,
                "tags": list(ki.tags),
                "references": list(ki.references),
            }
        )
        if len(out) >= limit:
            break
    return SourceDescription(out)


def review_list_tool(review: Any, *, status: str | None = None, kind: str | None = None) -> dict[str, Any]:
    """The ``list_proposals`` MCP tool: ``{"proposals": [{"id", "kind", "status", "title", …}]}``.

    Raises:
        ValueError: an unknown status or kind.
    """
    return {"proposals": [p.summary(times=False) for p in review.list(status=status, kind=kind)]}


def review_show_tool(review: Any, proposal_id: str) -> dict[str, Any]:
    """The ``show_proposal`` MCP tool: ``{"proposal": {...full, diff, evidence, effect}, "events": [...]}``.

    Raises:
        ValueError: no proposal has this id.
    """
    try:
        p, events = review.show(proposal_id)
    except ReviewError as e:
        raise ValueError(str(e)) from e
    return {"proposal": p.to_dict(), "events": events}


def review_action_tool(review: Any, action: str, proposal_id: str, *, reason: str = "") -> dict[str, Any]:
    """The ``approve_proposal`` / ``reject_proposal`` / ``revert_proposal`` MCP tools.

    Args:
        review: a :class:`kitune.service.workflows.review.ReviewService`.
        action: ``approve``, ``reject`` or ``revert``.
        proposal_id: the proposal.
        reason: why (required to reject).

    Returns:
        ``{"proposal": summary, "reason": str}`` after the action.

    Raises:
        ValueError: unknown id or action, a status the action does not fit, a blank rejection reason.
    """
    try:
        if action == "approve":
            p = review.approve(proposal_id, actor="mcp", reason=reason)
        elif action == "reject":
            p = review.reject(proposal_id, reason=reason, actor="mcp")
        elif action == "revert":
            p = review.revert(proposal_id, reason=reason, actor="mcp")
        else:
            raise ValueError(f"action {action!r}: use approve, reject or revert")
    except ReviewError as e:
        raise ValueError(str(e)) from e
    return {"proposal": p.summary(times=False), "reason": p.reason}
