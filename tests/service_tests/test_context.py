from __future__ import annotations

import json

import pytest
from dspy.utils import DummyLM

from kitune.config import KituneConfig, RetrievalConfig
from kitune.ki import KI
from kitune.programs.query_rewriter import QueryRewriter
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryStore
from kitune.schema import QueryPlan
from kitune.service.serving.context import ContextResponse, context_ids, get_context, render_context


def _ki(
    docid: str,
    subject: str,
    predicate: str,
    obj: str,
    title: str,
    confidence: int = 80,
    tags: list[str] | None = None,
) -> KI:
    return KI.from_fact(
        docid=docid,
        title=title,
        description=f"{title} The record states it plainly.",
        subject=subject,
        predicate=predicate,
        obj=obj,
        evidence=[title],
        confidence=confidence,
        tags=tags or ["org"],
    )


KIS = [
    _ki("d1", "Acme Corp", "headquartered_in", "Springfield", "Acme Corp is headquartered in Springfield."),
    _ki("d1", "Acme Corp", "founded_in", "1999", "Acme Corp was founded in 1999."),
    _ki(
        "d2",
        "Globex",
        "headquartered_in",
        "Shelbyville",
        "Globex is headquartered in Shelbyville.",
        confidence=40,
        tags=["org", "rival"],
    ),
    _ki("d3", "Springfield", "located_in", "Oregon", "Springfield is located in Oregon.", tags=["place"]),
]


@pytest.fixture
def cfg() -> KituneConfig:
    return KituneConfig(retrieval=RetrievalConfig(max_size=3))


@pytest.fixture
def store(cfg: KituneConfig) -> MemoryStore:
    s = MemoryStore(embedder=HashEmbedder(dim=64), retrieval=RetrievalConfig())
    assert s.upsert(KIS).ok
    return s


def test_plain_plan_returns_kis_and_aggregations(store: MemoryStore, cfg: KituneConfig) -> None:
    resp = get_context("Where is Acme Corp headquartered?", store=store, cfg=cfg, size=2)
    assert resp.executed and not resp.rewrite_fell_back
    assert resp.kis[0].title == "Acme Corp is headquartered in Springfield."
    assert len(resp.kis) == 2
    assert all(resp.kis[i].score >= resp.kis[i + 1].score for i in range(len(resp.kis) - 1))
    assert resp.aggregations.by_entity["acme-corp"] == 2
    assert resp.aggregations.by_doc == {"d1": 2}
    assert resp.aggregations.by_tag == {"org": 2}
    assert resp.plan == QueryPlan.plain("Where is Acme Corp headquartered?", size=2)
    assert resp.compiled_query["backend"] == "memory"
    assert resp.rewrite_tokens.input == 0 and resp.took_ms >= 0
    first = resp.kis[0]
    assert first.evidence_doc_ids == ["d1"] and "doc:d1" in first.tags


def test_size_is_clamped_to_max_size(store: MemoryStore, cfg: KituneConfig) -> None:
    resp = get_context("Acme Corp Springfield Globex Oregon", store=store, cfg=cfg, size=50)
    assert resp.plan.size == 3 and len(resp.kis) == 3


def test_confidence_floor_is_applied(store: MemoryStore) -> None:
    cfg = KituneConfig(retrieval=RetrievalConfig(confidence_floor=50))
    resp = get_context("Where is Globex headquartered?", store=store, cfg=cfg)
    assert resp.plan.filters.min_confidence == 50
    assert "Globex is headquartered in Shelbyville." not in [k.title for k in resp.kis]
    resp_all = get_context("Where is Globex headquartered?", store=store, cfg=KituneConfig())
    assert resp_all.kis[0].title == "Globex is headquartered in Shelbyville."


def test_execute_false_returns_compiled_query_only(store: MemoryStore, cfg: KituneConfig) -> None:
    resp = get_context("Where is Acme Corp?", store=store, cfg=cfg, execute=False)
    assert resp.executed is False and resp.kis == []
    assert resp.aggregations.by_tag == {}
    assert resp.compiled_query == store.compile(resp.plan)
    assert render_context(resp).startswith("compiled query (not executed): {")


def test_rewriter_plan_is_used_and_tokens_reported(store: MemoryStore, cfg: KituneConfig) -> None:
    rw = QueryRewriter()
    rw.set_lm(
        DummyLM(
            [
                {
                    "plan_json": '{"entity_tags": ["Springfield"], "lexical": "Springfield located", '
                    '"semantic": "Springfield is located in a state."}'
                }
            ]
        )
    )
    q = "Which state is Springfield, the HQ city of Acme, in?"
    resp = get_context(q, store=store, rewriter=rw, cfg=cfg)
    assert resp.rewrite_fell_back is False
    assert resp.plan.entity_tags == ("entity:springfield",)
    assert resp.kis[0].title == "Springfield is located in Oregon."


def test_rewriter_fallback_is_reported(store: MemoryStore, cfg: KituneConfig) -> None:
    rw = QueryRewriter()
    rw.set_lm(DummyLM([{"plan_json": "I think the answer is Oregon."}]))
    resp = get_context("Where is Acme Corp headquartered?", store=store, rewriter=rw, cfg=cfg)
    assert resp.rewrite_fell_back is True
    assert resp.rewrite_reason is not None and resp.rewrite_reason.startswith("no_json")
    assert resp.kis[0].title == "Acme Corp is headquartered in Springfield."
    assert rw.fallbacks == {"no_json": 1}


def test_bad_arguments_raise(store: MemoryStore, cfg: KituneConfig) -> None:
    with pytest.raises(ValueError, match="blank"):
        get_context("  ", store=store, cfg=cfg)
    with pytest.raises(ValueError, match="size=0"):
        get_context("Acme", store=store, cfg=cfg, size=0)


def test_render_context_and_json_round_trip(store: MemoryStore, cfg: KituneConfig) -> None:
    resp = get_context("Where is Acme Corp headquartered?", store=store, cfg=cfg, size=2)
    text = render_context(resp)
    lines = text.splitlines()
    assert len(lines) == 3
    assert lines[0] == (
        f"1. [{resp.kis[0].id}] Acme Corp is headquartered in Springfield. — Acme Corp is headquartered in "
        "Springfield. The record states it plainly. (docs: d1)"
    )
    assert lines[2].startswith("facets: tags: org 2 | docs: d1 2 | entities: acme-corp 2")
    again = ContextResponse.model_validate(json.loads(resp.model_dump_json()))
    assert again.kis == resp.kis and again.plan == resp.plan
    empty = get_context("zzzz qqqq", store=MemoryStore(embedder=HashEmbedder(dim=64)), cfg=cfg)
    assert render_context(empty) == "no KIs found for: zzzz qqqq"


def test_context_ids_feeds_accept_if_retrieved(store: MemoryStore, cfg: KituneConfig) -> None:
    ids = context_ids(store=store, cfg=cfg, size=2)("Where is Acme Corp headquartered?")
    assert ids[0] == KIS[0].id and len(ids) == 2


def test_rewriter_filters_that_match_nothing_are_relaxed_once(store: MemoryStore, cfg: KituneConfig) -> None:
    rw = QueryRewriter()
    rw.set_lm(
        DummyLM(
            [
                {"plan_json": '{"lexical": "Acme Corp headquartered", "filters": {"tags_any": ["finance"]}}'},
                {"plan_json": '{"lexical": "Globex headquartered", "filters": {"tags_any": ["rival"]}}'},
            ]
        )
    )
    resp = get_context("Where is Acme Corp headquartered?", store=store, rewriter=rw, cfg=cfg)
    assert resp.filters_relaxed is True
    assert resp.plan.filters.tags_any == () and resp.plan.filters.statuses == ("active", "stale")
    assert resp.kis[0].title == "Acme Corp is headquartered in Springfield."
    kept = get_context("Where is the rival?", store=store, rewriter=rw, cfg=cfg)
    assert kept.filters_relaxed is False and kept.plan.filters.tags_any == ("rival",)
    assert [k.title for k in kept.kis] == ["Globex is headquartered in Shelbyville."]
