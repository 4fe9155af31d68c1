"""``get_context``: question → KIs + facets + the compiled query. Shared by Python, CLI and HTTP.

One call: rewrite the question into a :class:`~kitune.schema.QueryPlan` (or take the plain plan
when no rewriter is given), clamp the size to ``cfg.retrieval.max_size``, apply the configured
confidence floor, compile the plan with the store and — unless ``execute=False`` — run it.
:class:`ContextResponse` is both the Python return value and the HTTP response schema.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field

from kitune.config import KituneConfig
from kitune.programs.query_rewriter import QueryRewriter, RewriteTokens
from kitune.retrieval.base import Store
from kitune.retrieval.fusion import aggregate
from kitune.schema import QueryPlan
from kitune.usage import TokenLedger

__all__ = [
    "ContextAggregations",
    "ContextKI",
    "ContextResponse",
    "RewriteTokenCount",
    "compact_line",
    "context_ids",
    "facets_of",
    "get_context",
    "render_context",
]


class ContextKI(BaseModel):
    """One KI as returned to an agent."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="Stable KI id.")
    title: str = Field(description="One sentence ending on the answer value.")
    description: str = Field(description="2–3 sentences with the evidence.")
    tags: list[str] = Field(description="Plain tags, entity:<slug> and doc:<docid> tags.")
    evidence_doc_ids: list[str] = Field(description="Documents the evidence comes from.")
    score: float = Field(description="Fused score; higher is better, comparable only within one response.")


class ContextAggregations(BaseModel):
    """Counts over the returned KIs (not the whole store), most frequent first."""

    model_config = ConfigDict(frozen=True)

    by_tag: dict[str, int] = Field(default_factory=dict, description="Plain tag → count.")
    by_doc: dict[str, int] = Field(default_factory=dict, description="Evidence doc id → count.")
    by_entity: dict[str, int] = Field(default_factory=dict, description="Entity slug → count.")


class RewriteTokenCount(BaseModel):
    """Tokens the query rewrite cost (0 when no rewriter ran)."""

    model_config = ConfigDict(frozen=True)

    input: int = Field(default=0, ge=0, description="Prompt tokens.")
    output: int = Field(default=0, ge=0, description="Completion tokens.")


class ContextResponse(BaseModel):
    """What ``get_context`` returns (also the ``POST /api/_get_context`` response body)."""

    model_config = ConfigDict(frozen=True)

    query: str = Field(description="The question as received.")
    kis: list[ContextKI] = Field(
        description="Best first, at most the requested size; empty when not executed."
    )
    aggregations: ContextAggregations = Field(description="Facets over `kis`.")
    compiled_query: Any = Field(
        description="The query the store runs: ES|QL text for Elasticsearch, the plan dict for the "
        "embedded store."
    )
    plan: QueryPlan = Field(description="The validated query plan (after size clamp and confidence floor).")
    executed: bool = Field(description="False when only the compiled query was requested.")
    rewrite_fell_back: bool = Field(
        description="True when the rewriter's output was unusable (plain plan used)."
    )
    rewrite_reason: str | None = Field(default=None, description="Why the rewrite fell back, if it did.")
    rewrite_tokens: RewriteTokenCount = Field(description="Tokens the rewrite cost.")
    filters_relaxed: bool = Field(
        default=False,
        description="True when the rewriter's tag/doc/subtype filters matched nothing and were dropped.",
    )
    took_ms: float = Field(ge=0, description="Wall time of the whole call, milliseconds.")


def get_context(
    query: str,
    *,
    store: Store,
    rewriter: QueryRewriter | None = None,
    size: int = 10,
    execute: bool = True,
    cfg: KituneConfig,
    ledger: TokenLedger | None = None,
    rerank: Callable[[list[ContextKI]], list[ContextKI]] | None = None,
) -> ContextResponse:
    """Retrieve KIs for ``query``.

    Args:
        query: the natural-language question (non-blank).
        store: the KI store that compiles and runs the plan.
        rewriter: the query rewriter (its LM set with ``set_lm`` or from the DSPy context);
            None uses :meth:`QueryPlan.plain` and costs no tokens. A rewriter failure never
            raises here: it falls back to the plain plan (``rewrite_fell_back=True``).
        size: KIs wanted, ≥ 1; clamped to ``cfg.retrieval.max_size``.
        execute: False returns the compiled query without running it (``kis`` empty).
        cfg: the configuration (``retrieval.max_size``, ``retrieval.confidence_floor``).
        ledger: where the rewriter's LM records tokens (used when the LM reports none).
        rerank: re-orders (and may drop from) the returned KIs, best first, before the facets are
            counted — e.g. the loop's KI credit demotion
            (:func:`kitune.optimizers.credit.demote_ranked`); None: the store's order.

    Returns:
        The response; ``len(kis) <= min(size, cfg.retrieval.max_size)``. When the rewriter's
        tag/doc/subtype filters match nothing, the search is re-run once without them
        (``filters_relaxed=True``; the status and confidence rules always stay).

    Raises:
        ValueError: ``query`` is blank or ``size`` < 1.
        StoreUnavailableError: the store backend cannot be reached.
    """
    if not query or not query.strip():
        raise ValueError("query is blank: pass the question to retrieve KIs for")
    if size < 1:
        raise ValueError(f"size={size}: ask for at least 1 KI")
    t0 = time.perf_counter()
    size = min(size, cfg.retrieval.max_size)
    tokens = RewriteTokens()
    fell_back, reason = False, None
    if rewriter is None:
        plan = QueryPlan.plain(query, size=size)
    else:
        result = rewriter.rewrite(query, size=size, ledger=ledger)
        plan, fell_back, reason, tokens = result.plan, result.fell_back, result.reason, result.tokens
    floor = max(plan.filters.min_confidence, cfg.retrieval.confidence_floor)
    plan = plan.model_copy(
        update={"size": size, "filters": plan.filters.model_copy(update={"min_confidence": floor})}
    )
    kis: list[ContextKI] = []
    aggs = ContextAggregations()
    relaxed = False
    if execute:
        found = store.search(plan)
        narrowing = plan.filters.model_copy(
            update={"tags_all": (), "tags_any": (), "doc_ids": (), "subtypes": ()}
        )
        if not found.hits and rewriter is not None and narrowing != plan.filters:
            # The LM's narrowing filters matched nothing: retry with the status/confidence rules only.
            plan = plan.model_copy(update={"filters": narrowing})
            found = store.search(plan)
            relaxed = True
        compiled = found.compiled
        kis = [
            ContextKI(
                id=h.ki.id,
                title=h.ki.title,
                description=h.ki.description,
                tags=list(h.ki.tags),
                evidence_doc_ids=list(h.ki.evidence_doc_ids),
                score=float(h.score),
            )
            for h in found.hits[:size]
        ]
        a = found.aggregations
        aggs = ContextAggregations(by_tag=dict(a.by_tag), by_doc=dict(a.by_doc), by_entity=dict(a.by_entity))
        if rerank is not None:
            reranked = rerank(list(kis))
            if [k.id for k in reranked] != [k.id for k in kis]:
                kis = reranked[:size]
                aggs = facets_of(kis)
    else:
        compiled = store.compile(plan)
    return ContextResponse(
        query=query,
        kis=kis,
        aggregations=aggs,
        compiled_query=compiled,
        plan=plan,
        executed=execute,
        rewrite_fell_back=fell_back,
        rewrite_reason=reason,
        rewrite_tokens=RewriteTokenCount(input=tokens.input, output=tokens.output),
        took_ms=(time.perf_counter() - t0) * 1000,
        filters_relaxed=relaxed,
    )


def facets_of(kis: list[ContextKI]) -> ContextAggregations:
    """Facets over exactly ``kis`` (the store's rule, :func:`kitune.retrieval.fusion.aggregate`).

    For a response whose KIs were re-ranked or filtered after the search: the facet line must
    count only the KIs it is shown with.
    """
    a = aggregate(cast(Any, kis))  # ContextKI has the tags and evidence_doc_ids it reads
    return ContextAggregations(by_tag=dict(a.by_tag), by_doc=dict(a.by_doc), by_entity=dict(a.by_entity))


def context_ids(
    *, store: Store, cfg: KituneConfig, rewriter: QueryRewriter | None = None, size: int = 10
) -> Callable[[str], list[str]]:
    """Return a function ``question → KI ids best first`` that goes through :func:`get_context`.

    It is the ``context_fn`` that :func:`kitune.programs.disambiguator.accept_if_retrieved` takes.
    """

    def ids(question: str) -> list[str]:
        return [k.id for k in get_context(question, store=store, rewriter=rewriter, size=size, cfg=cfg).kis]

    return ids


def _top(counts: dict[str, int], n: int = 5) -> str:
    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return ", ".join(f"{k} {v}" for k, v in items) or "-"


_WORD = re.compile(r"\w+")


def _words(text: str) -> set[str]:
    return {w.casefold() for w in _WORD.findall(text)}


def compact_line(ki: ContextKI) -> str:
    """One KI as a line that carries its fact once: ``[ki-…] <fact> [d1] [d2]``.

    The fact is the description when every word of the title is in it (the title only restates
    it), the title when every word of the description is in the title, else
    ``<title> — <description>``; the evidence documents follow as ``[docid]``, the form the agent
    cites. No facet line.
    """
    title, desc = ki.title.strip(), ki.description.strip()
    tw, dw = _words(title), _words(desc)
    if desc and tw <= dw:
        fact = desc
    elif title and dw <= tw:
        fact = title
    else:
        fact = f"{title} — {desc}"
    docs = " ".join(f"[{d}]" for d in ki.evidence_doc_ids)
    return f"[{ki.id}] {fact}" + (f" {docs}" if docs else "")


def render_context(resp: ContextResponse, *, compact: bool = False) -> str:
    """Render a response for an agent: one line per KI, then one facet line.

    Format::

        1. [ki-…] <title> — <description> (docs: d1, d2)
        facets: tags: org 2, … | docs: d1 2, … | entities: acme-corp 2, …

    With ``compact``, each KI is :func:`compact_line` (the fact once, its documents as
    ``[docid]``) and there is no facet line (issue 39.2: measured in
    ``benchmarks/results/context_cost.dev.md``).

    When the query was not executed, the compiled query is shown instead; when nothing matched,
    the text says so.
    """
    if not resp.executed:
        compiled = resp.compiled_query
        text = compiled if isinstance(compiled, str) else json.dumps(compiled, sort_keys=True, default=str)
        return f"compiled query (not executed): {text}"
    if not resp.kis:
        return f"no KIs found for: {resp.query}"
    if compact:
        return "\n".join(f"{i}. {compact_line(k)}" for i, k in enumerate(resp.kis, start=1))
    lines = [
        f"{i}. [{k.id}] {k.title} — {k.description} (docs: {', '.join(k.evidence_doc_ids)})"
        for i, k in enumerate(resp.kis, start=1)
    ]
    a = resp.aggregations
    lines.append(f"facets: tags: {_top(a.by_tag)} | docs: {_top(a.by_doc)} | entities: {_top(a.by_entity)}")
    return "\n".join(lines)
