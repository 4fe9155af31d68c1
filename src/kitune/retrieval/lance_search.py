"""The three retrieval branches of the LanceDB store, as functions of a table (ids best first)."""

from __future__ import annotations

from typing import Any

from kitune.config import RetrievalConfig
from kitune.retrieval.fusion import branch_weights
from kitune.retrieval.lance_sql import filter_to_sql, sql_and, sql_list
from kitune.retrieval.rules import effective_filter, tag_forms, tag_matches
from kitune.schema import QueryPlan

__all__ = [
    "FTS_TOKENIZER",
    "branch_lexical",
    "branch_semantic",
    "branch_tag",
    "compile_plan",
    "fts_config",
    "fts_state",
]

FTS_TOKENIZER = "icu"
"""Lance's base tokenizer for every kitune FTS index (KI titles, corpus passages).

``icu`` splits words by Unicode rules (UAX #29) in every script and segments Chinese and
Japanese, which have no spaces, with ICU's dictionary. Lance's default ``simple`` tokenizer keeps a
whole CJK sentence as one token (``北京是中国的首都`` is found only by the whole sentence, never by
``北京``). Lance's English stemmer, stop words, lower-casing and ASCII folding still apply, so
``Zürich`` = ``zurich`` and ``Acme's`` = ``acme``. Known limit: a possessive with a typographic
apostrophe (``Globex’s``) stays one token, so ``globex`` does not match it lexically.
"""


def fts_config() -> Any:
    """The :class:`lancedb.index.FTS` config every kitune FTS index is built with."""
    from lancedb.index import FTS

    return FTS(with_position=False, base_tokenizer=FTS_TOKENIZER)


def fts_state(table: Any, column: str) -> str:
    """``"missing"``, ``"stale"`` (built with another tokenizer, e.g. by an older kitune) or ``"current"``.

    A stale index still answers queries; it is rebuilt with :func:`fts_config` on the next write.
    """
    for index in table.list_indices():
        if tuple(index.columns) == (column,) and str(index.index_type).upper() == "FTS":
            details = getattr(index, "index_details", None) or {}
            return "current" if details.get("base_tokenizer") == FTS_TOKENIZER else "stale"
    return "missing"


def branch_tag(table: Any, plan: QueryPlan, where: str | None, n: int) -> list[str]:
    """Tag branch: KIs naming the most plan entities (``entity:<slug>`` or bare slug), ties by id."""
    from lancedb.query import ColumnOrdering

    forms = tag_forms(plan.entity_tags)
    every = [form for pair in forms for form in pair]
    pred = sql_and(where, f"array_has_any(tags, {sql_list(every)})")
    assert pred is not None
    rows = (
        table.search()
        .where(pred)
        .select(["id", "tags"])
        .order_by([ColumnOrdering(column_name="id", ascending=True)])
        .limit(max(n * 20, 200))
        .to_list()
    )
    counted = sorted(((tag_matches(forms, r["tags"]), r["id"]) for r in rows), key=lambda c: (-c[0], c[1]))
    return [i for _, i in counted[:n]]


def branch_lexical(table: Any, plan: QueryPlan, where: str | None, n: int) -> list[str]:
    """Lexical branch: BM25 (native FTS) on titles, best first, ties by id (needs the FTS index)."""
    from lancedb.query import MatchQuery

    match = MatchQuery(plan.lexical, "title")  # type: ignore[call-arg]  # pydantic defaults
    query = table.search(match, query_type="fts")
    if where:
        query = query.where(where, prefilter=True)
    rows = query.select(["id", "_score"]).limit(n).to_list()
    rows.sort(key=lambda r: (-float(r["_score"]), r["id"]))
    return [r["id"] for r in rows]


def branch_semantic(table: Any, vector: Any, where: str | None, n: int) -> list[str]:
    """Semantic branch: cosine nearest descriptions to ``vector``, ties by id."""
    search: Any = table.search(vector, vector_column_name="vector", query_type="vector")
    query = search.distance_type("cosine")
    if where:
        query = query.where(where, prefilter=True)
    rows = query.select(["id", "_distance"]).limit(n).to_list()
    rows.sort(key=lambda r: (round(float(r["_distance"]), 6), r["id"]))
    return [r["id"] for r in rows]


def compile_plan(plan: QueryPlan, table: str, r: RetrievalConfig) -> dict[str, Any]:
    """The plan as the LanceDB store runs it: per-branch SQL filters and RRF settings (JSON-able)."""
    where = filter_to_sql(effective_filter(plan, r))
    every = [form for pair in tag_forms(plan.entity_tags) for form in pair]
    tag_pred = sql_and(where, f"array_has_any(tags, {sql_list(every)})") if plan.entity_tags else None
    return {
        "backend": "lancedb",
        "table": table,
        "where": where,
        "branches": {
            "tag": {"where": tag_pred, "limit": r.branch_size} if plan.entity_tags else None,
            "lexical": {"match": plan.lexical, "column": "title", "limit": r.branch_size}
            if plan.lexical.strip()
            else None,
            "semantic": {
                "text": plan.semantic,
                "column": "vector",
                "metric": "cosine",
                "limit": r.branch_size,
            }
            if plan.semantic.strip()
            else None,
        },
        "rrf_k": r.rrf_k,
        "weights": branch_weights(r),
        "size": plan.size,
    }
