"""The three retrieval branches of the LanceDB store, as functions of a table (ids best first)."""

from __future__ import annotations

from typing import Any

from kitune.config import RetrievalConfig
from kitune.retrieval.fusion import branch_weights
from kitune.retrieval.lance_sql import filter_to_sql, sql_and, sql_list
from kitune.retrieval.memory import effective_filter, tag_forms, tag_matches
from kitune.schema import QueryPlan

__all__ = ["branch_lexical", "branch_semantic", "branch_tag", "compile_plan"]


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
