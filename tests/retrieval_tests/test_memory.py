"""MemoryStore and MemoryCorpusStore: the conformance suite plus corpus search behaviour."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kitune.config import RetrievalConfig
from kitune.errors import DocumentNotFoundError
from kitune.ki import KI
from kitune.retrieval.base import CorpusStore, Store
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryCorpusStore, MemoryStore
from kitune.schema import Document, QueryPlan
from kitune.testing.store_contract import StoreContract, make_ki


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self) -> Iterator[MemoryStore]:
        s = MemoryStore(HashEmbedder())
        yield s
        s.close()


def test_memory_store_is_a_store() -> None:
    assert isinstance(MemoryStore(), Store)
    assert isinstance(MemoryCorpusStore(), CorpusStore)


def test_weights_change_the_fused_order() -> None:
    a = make_ki("Alpha", "One", title="Zebra crossing rules.", description="Alpha one.")
    b = make_ki("Zebra", "Two", title="Unrelated words here.", description="Zebra two.")
    lexical_heavy = MemoryStore(
        retrieval=RetrievalConfig(tag_weight=0.1, lexical_weight=5.0, semantic_weight=0.0)
    )
    tag_heavy = MemoryStore(
        retrieval=RetrievalConfig(tag_weight=5.0, lexical_weight=0.1, semantic_weight=0.0)
    )
    plan = QueryPlan(entity_tags=("entity:zebra",), lexical="zebra crossing")
    for s in (lexical_heavy, tag_heavy):
        s.upsert([a, b])
    assert lexical_heavy.search(plan).hits[0].ki.id == a.id
    assert tag_heavy.search(plan).hits[0].ki.id == b.id
    compiled = tag_heavy.compile(plan)
    assert compiled["weights"] == {"tag": 5.0, "lexical": 0.1, "semantic": 0.0} and compiled["rrf_k"] == 60


def test_configured_confidence_floor_applies() -> None:
    s = MemoryStore(retrieval=RetrievalConfig(confidence_floor=50))
    low = make_ki("Low", "Conf", confidence=10)
    s.upsert([low, make_ki("High", "Conf", confidence=90)])
    ids = [h.ki.id for h in s.search(QueryPlan(lexical="conf")).hits]
    assert low.id not in ids and len(ids) == 1


def _docs() -> list[Document]:
    long_text = (
        "Filler sentence about nothing in particular. " * 30
        + "The lighthouse of Alexandria was one of the Seven Wonders. "
        + "More filler text follows here. " * 30
    )
    return [
        Document(docid="100", title="Lighthouse", text=long_text),
        Document(
            docid="200", title="Gardens", text="The Hanging Gardens of Babylon are a wonder of the world."
        ),
        Document(docid="300", title="Cooking", text="Boil pasta in salted water for ten minutes."),
    ]


def test_corpus_search_returns_snippets_and_get() -> None:
    cs = MemoryCorpusStore(chunk_chars=300)
    result = cs.add_documents(_docs())
    assert (result.submitted, result.indexed) == (3, 3) and cs.count() == 3
    hits = cs.search("lighthouse Alexandria wonder", k=2, snippets_per_hit=3, snippet_chars=120)
    assert hits[0].docid == "100" and hits[0].title == "Lighthouse"
    assert len(hits) == 2 and len({h.docid for h in hits}) == 2
    assert all(len(s) <= 120 for h in hits for s in h.snippets)
    assert 1 <= len(hits[0].snippets) <= 3
    assert any("Alexandria" in s for s in hits[0].snippets)
    assert cs.get("300").text.startswith("Boil pasta")
    with pytest.raises(DocumentNotFoundError):
        cs.get("999")
    assert cs.search("   ") == []


def test_corpus_replace_by_docid() -> None:
    cs = MemoryCorpusStore()
    cs.add_documents(_docs())
    cs.add_documents([Document(docid="300", title="Cooking", text="Bake bread at 220 degrees.")])
    assert cs.count() == 3
    hits = cs.search("pasta salted water", k=3)
    assert all("pasta" not in s for h in hits for s in h.snippets)
    assert cs.search("bake bread degrees", k=1)[0].docid == "300"


def test_serve_stale_flag_and_explicit_statuses() -> None:
    """Stale KIs are served only when retrieval.serve_stale is set or the filter names statuses."""
    from kitune.retrieval.rules import effective_filter
    from kitune.schema import Filter

    plan = QueryPlan(lexical="x")
    assert effective_filter(plan, RetrievalConfig()).statuses == ("active",)
    assert effective_filter(plan, RetrievalConfig(serve_stale=True)).statuses == ("active", "stale")
    named = QueryPlan(lexical="x", filters=Filter(statuses=("stale",)))
    assert effective_filter(named, RetrievalConfig()).statuses == ("stale",)
    stale = make_ki("Pierre Curie", "Marie Curie", status="stale")
    served = MemoryStore(retrieval=RetrievalConfig(serve_stale=True))
    served.upsert([stale])
    assert [h.ki.id for h in served.search(QueryPlan(lexical="Pierre Curie")).hits] == [stale.id]
    default = MemoryStore()
    default.upsert([stale])
    assert default.search(QueryPlan(lexical="Pierre Curie")).hits == []


def test_tag_branch_matches_bare_slug_and_filter_on_subject_predicate() -> None:
    """The tag branch matches entity:<slug> or the bare slug; a filter can name subject/predicate."""
    from kitune.schema import Filter

    tagged = make_ki("Acme Corp", "Berlin", predicate="located_in")
    bare = make_ki("Widget", "Thing", tags=["acme-corp"], title="Widgets are made by a company.")
    neither = make_ki("Other", "Thing")
    store = MemoryStore()
    store.upsert([tagged, bare, neither])
    hits = store.search(QueryPlan(entity_tags=("entity:acme-corp",), size=10)).hits
    assert sorted(h.ki.id for h in hits) == sorted([tagged.id, bare.id])
    flt = Filter().model_copy(update={"subjects": ("Acme Corp",), "predicates": ("located_in",)})
    assert store.count(flt) == 1
    plan = QueryPlan(lexical="Berlin Widgets Thing", filters=flt)
    assert [h.ki.id for h in store.search(plan).hits] == [tagged.id]


def _multilingual_kis() -> list[KI]:
    return [
        make_ki("Москва", "Россия", docid="ru", title="Москва — столица России."),
        make_ki("北京", "中国", docid="zh", title="北京是中国的首都。"),
        make_ki("Zürich", "Schweiz", docid="de", title="Zürich liegt in der Schweiz."),
        make_ki("Paris", "France", docid="en", title="Paris is the capital of France."),
    ]


@pytest.mark.parametrize(
    ("query", "docid"),
    [("столица", "ru"), ("北京", "zh"), ("中国首都", "zh"), ("Zürich", "de"), ("ZÜRICH", "de")],
)
def test_lexical_only_search_finds_every_script(query: str, docid: str) -> None:
    s = MemoryStore(HashEmbedder(dim=32))
    kis = _multilingual_kis()
    s.upsert(kis)
    hits = s.search(QueryPlan(lexical=query)).hits
    assert [h.ki.evidence_doc_ids[0] for h in hits] == [docid]
    assert hits[0].branches == {"lexical": 1}


def test_corpus_lexical_finds_cyrillic_and_chinese() -> None:
    cs = MemoryCorpusStore(chunk_chars=300)
    cs.add_documents(
        [
            Document(docid="ru", title="Москва", text="Москва — столица России."),
            Document(docid="zh", title="北京", text="北京是中国的首都。"),
            Document(docid="en", title="Paris", text="Paris is the capital of France."),
        ]
    )
    assert cs.search("столица", k=1)[0].docid == "ru"
    assert cs.search("中国的首都", k=1)[0].docid == "zh"
