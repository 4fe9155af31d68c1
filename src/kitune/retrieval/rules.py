"""The store contract's rules, applied the same way by every backend (memory, LanceDB, Elasticsearch).

What a filter means (:func:`effective_filter`: serving statuses and the confidence floor;
:func:`filter_triples`, :func:`passes`), how a plan's entity tags match a KI's tags
(:func:`tag_forms`, :func:`tag_matches`), the validation every write does (:func:`validate_ki`),
how the lifecycle sweep moves a KI (:func:`window_for`, :func:`sweep_status`) and how ranked
chunks become per-document corpus hits (:func:`group_chunks`). A neutral module: the backends
import it, never each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from kitune.config import RetrievalConfig
from kitune.ki import KI, KIStatus, lifecycle_status
from kitune.retrieval.base import CorpusHit
from kitune.retrieval.fusion import trim_snippet
from kitune.schema import Filter, QueryPlan

__all__ = [
    "effective_filter",
    "filter_triples",
    "group_chunks",
    "passes",
    "sweep_status",
    "tag_forms",
    "tag_matches",
    "validate_ki",
    "window_for",
]

_STATUS_ORDER = {"active": 0, "stale": 1, "expired": 2}


def validate_ki(ki: KI) -> KI:
    """Return a validated deep copy of ``ki`` (catches ``model_construct``-built or mutated KIs).

    Raises:
        pydantic.ValidationError: the KI breaks the KI rules.
    """
    return KI.model_validate(ki.model_dump(mode="python"))


def effective_filter(plan: QueryPlan, retrieval: RetrievalConfig) -> Filter:
    """The filter a search applies: the plan's, with the serving statuses and confidence floor.

    A plan whose filter does not set ``statuses`` is served ``active`` KIs only (plus ``stale``
    ones when ``retrieval.serve_stale``); a filter that names its statuses gets exactly those.
    The configured confidence floor applies when higher than the plan's.
    """
    f = plan.filters
    update: dict[str, Any] = {}
    if "statuses" not in f.model_fields_set:
        update["statuses"] = ("active", "stale") if retrieval.serve_stale else ("active",)
    if retrieval.confidence_floor > f.min_confidence:
        update["min_confidence"] = retrieval.confidence_floor
    return f.model_copy(update=update) if update else f


def filter_triples(f: Filter) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(subjects, predicates)`` a filter restricts the KI triple to (empty: no restriction).

    Read from ``Filter.subjects`` / ``Filter.predicates`` when the schema has them.
    """
    return tuple(getattr(f, "subjects", ()) or ()), tuple(getattr(f, "predicates", ()) or ())


def passes(f: Filter, ki: KI) -> bool:
    """``f.evaluate(ki)`` plus the subject/predicate conditions of :func:`filter_triples` (exact match)."""
    if not f.evaluate(ki):
        return False
    subjects, predicates = filter_triples(f)
    props = ki.payload.properties
    if subjects and props.subject not in subjects:
        return False
    return not (predicates and props.predicate not in predicates)


def tag_forms(entity_tags: Sequence[str]) -> list[tuple[str, str]]:
    """``(entity:<slug>, <slug>)`` per plan tag: the tag branch matches either form."""
    return [(t, t.split(":", 1)[1]) for t in entity_tags]


def tag_matches(forms: Sequence[tuple[str, str]], tags: Sequence[str]) -> int:
    """How many plan entities a KI's tags name, as ``entity:<slug>`` or as the bare slug."""
    have = set(tags)
    return sum(1 for full, bare in forms if full in have or bare in have)


def window_for(subtype: str, stale_after: timedelta, retention: Mapping[str, timedelta] | None) -> timedelta:
    """The stale window of a KI subtype: ``retention[subtype]`` if given, else ``stale_after``."""
    if retention and subtype in retention:
        return retention[subtype]
    return stale_after


def sweep_status(
    ki: KI, now: datetime, stale_after: timedelta, retention: Mapping[str, timedelta] | None = None
) -> KIStatus | None:
    """Return the status a sweep moves ``ki`` to, or None when it stays.

    Status only moves forward (active → stale → expired); a sweep never revives a KI. The window
    is :func:`window_for` the KI's subtype.
    """
    target = lifecycle_status(
        ki.payload.last_seen,
        now,
        stale_after=window_for(ki.payload.subtype, stale_after, retention),
        expires_at=ki.payload.expires_at,
    )
    if _STATUS_ORDER[target] > _STATUS_ORDER[ki.payload.status]:
        return target
    return None


def group_chunks(
    ranked: Sequence[tuple[str, float]],
    chunks: Mapping[str, tuple[str, str]],
    titles: Mapping[str, str],
    query: str,
    *,
    k: int,
    snippets_per_hit: int,
    snippet_chars: int,
) -> list[CorpusHit]:
    """Group ranked chunk ids into per-document hits (document score = its best chunk's score).

    Args:
        ranked: ``(chunk_id, score)`` best first.
        chunks: chunk id → ``(docid, passage)``.
        titles: docid → title.
        query: the query, to centre snippets on its first matching term.
        k: most documents returned.
        snippets_per_hit: most passages per document.
        snippet_chars: most characters per passage.
    """
    order: list[str] = []
    best: dict[str, float] = {}
    snippets: dict[str, list[str]] = {}
    for cid, score in ranked:
        docid, passage = chunks[cid]
        if docid not in best:
            if len(order) >= k:
                continue
            order.append(docid)
            best[docid] = score
            snippets[docid] = []
        if len(snippets[docid]) < snippets_per_hit:
            snippets[docid].append(trim_snippet(passage, query, snippet_chars))
    order.sort(key=lambda d: (-best[d], d))
    return [CorpusHit(docid=d, title=titles.get(d, ""), snippets=snippets[d], score=best[d]) for d in order]
