"""The store conformance suite.

The store conformance suite: one pytest class every :class:`~kitune.retrieval.base.Store`
backend runs (optuna ``StorageTestCase`` style).

Use it by subclassing and providing a ``store`` fixture that yields a fresh, empty store::

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store(self, tmp_path):
            s = MyStore(tmp_path, embedder=HashEmbedder())
            yield s
            s.close()

Stores must be built with a deterministic embedder (``HashEmbedder``) and default retrieval knobs
(or at least ``branch_size`` ≥ 20). Call ``pytest.register_assert_rewrite("kitune.testing")`` in
a conftest so the assertions here show their values.

:func:`make_ki` builds valid KIs for tests anywhere in the project.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kitune.errors import DocumentNotFoundError
from kitune.ki import KI, KISubtype
from kitune.retrieval.base import SearchResult, Store
from kitune.schema import Filter, QueryPlan

__all__ = ["T0", "StoreContract", "make_ki"]

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
"""A fixed reference time used by the suite."""


def make_ki(
    subject: str,
    obj: str,
    *,
    docid: str = "d1",
    predicate: str = "related_to",
    title: str | None = None,
    description: str | None = None,
    tags: list[str] | None = None,
    confidence: int = 80,
    status: str = "active",
    last_seen: datetime = T0,
    expires_at: datetime | None = None,
    subtype: KISubtype = "dataset_fact",
) -> KI:
    """Build a valid KI (stable id from docid/subject/predicate/object) for tests.

    Returns:
        A KI tagged ``entity:<subject>``, ``entity:<object>``, ``doc:<docid>`` plus ``tags``.
    """
    ki = KI.from_fact(
        docid=docid,
        title=title or f"{subject} {predicate.replace('_', ' ')} {obj}.",
        description=description or f"{subject} is {predicate.replace('_', ' ')} {obj}, per document {docid}.",
        subject=subject,
        predicate=predicate,
        obj=obj,
        evidence=[f"{subject} {obj}"],
        confidence=confidence,
        tags=tags or [],
        subtype=subtype,
        now=last_seen,
    )
    ki.payload.status = status  # type: ignore[assignment]
    ki.payload.expires_at = expires_at
    return ki


def _ids(result: SearchResult) -> list[str]:
    return [h.ki.id for h in result.hits]


class StoreContract:
    """Conformance tests for :class:`~kitune.retrieval.base.Store`. Subclasses provide ``store``."""

    reports_branch_ranks: bool = True
    """Set False for backends that fuse server-side and cannot say each hit's per-branch rank
    (Elasticsearch ``FUSE``); ``Hit.branches`` is then not checked."""

    @pytest.fixture
    def store(self) -> Any:  # pragma: no cover - overridden
        """A fresh, empty store (subclasses override this fixture)."""
        raise NotImplementedError("subclass StoreContract and provide a `store` fixture")

    @pytest.fixture
    def corpus(self, store: Store) -> dict[str, KI]:
        """Six KIs over three docs; two share the entity ``entity:marie-curie``."""
        kis = {
            "curie_born": make_ki(
                "Marie Curie",
                "Warsaw",
                docid="d1",
                predicate="born_in",
                title="Marie Curie was born in Warsaw.",
                description="Marie Curie, the physicist, was born in Warsaw in 1867.",
                tags=["person"],
                confidence=95,
            ),
            "curie_prize": make_ki(
                "Marie Curie",
                "Nobel Prize",
                docid="d1",
                predicate="received",
                title="Marie Curie received the Nobel Prize in Physics.",
                description="In 1903 Marie Curie shared the Nobel Prize in Physics.",
                tags=["person", "award"],
                confidence=90,
            ),
            "eiffel": make_ki(
                "Eiffel Tower",
                "Paris",
                docid="d2",
                predicate="located_in",
                title="The Eiffel Tower stands in Paris.",
                description="The Eiffel Tower is a wrought-iron tower located in Paris, France.",
                tags=["landmark"],
                confidence=70,
            ),
            "louvre": make_ki(
                "Louvre",
                "Paris",
                docid="d2",
                predicate="located_in",
                title="The Louvre museum is located in Paris.",
                description="The Louvre is the world's most-visited art museum, in Paris.",
                tags=["landmark", "museum"],
                confidence=40,
            ),
            "old": make_ki(
                "Old Bridge",
                "Mostar",
                docid="d3",
                predicate="located_in",
                title="The Old Bridge crosses the river in Mostar.",
                description="Stari Most, the Old Bridge, spans the Neretva in Mostar.",
                tags=["landmark"],
                status="expired",
            ),
            "stale": make_ki(
                "Pierre Curie",
                "Marie Curie",
                docid="d3",
                predicate="married_to",
                title="Pierre Curie was married to Marie Curie.",
                description="Pierre Curie married Marie Curie in 1895 in Sceaux.",
                tags=["person"],
                status="stale",
                confidence=60,
            ),
        }
        result = store.upsert(list(kis.values()))
        assert result.ok, result
        return kis

    # -- upsert + accounting ------------------------------------------------------------------
    def test_upsert_then_get_roundtrips(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: upsert then get roundtrips."""
        for ki in corpus.values():
            got = store.get(ki.id)
            assert got.model_dump(mode="json") == ki.model_dump(mode="json")
        assert store.count() == 6

    def test_upsert_replaces_by_id_and_refreshes_last_seen(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: upsert replaces by id and refreshes last seen."""
        old = corpus["eiffel"]
        newer = old.model_copy(deep=True)
        newer.title = "The Eiffel Tower stands in Paris, France."
        newer.payload.last_seen = T0 + timedelta(days=3)
        result = store.upsert([newer])
        assert (result.submitted, result.indexed, result.failed) == (1, 1, [])
        got = store.get(old.id)
        assert got.title == "The Eiffel Tower stands in Paris, France."
        assert got.payload.last_seen == T0 + timedelta(days=3)
        assert store.count() == 6

    def test_last_duplicate_in_one_call_wins(self, store: Store) -> None:
        """Contract: last duplicate in one call wins."""
        a = make_ki("Ada Lovelace", "London", title="Ada Lovelace lived in London.")
        b = a.model_copy(deep=True)
        b.title = "Ada Lovelace was born in London."
        result = store.upsert([a, b])
        assert result.submitted == 2 and result.indexed + len(result.failed) == 2 and not result.failed
        assert store.get(a.id).title == "Ada Lovelace was born in London."
        assert store.count() == 1

    def test_accounting_with_bad_kis(self, store: Store) -> None:
        """Contract: accounting with bad kis."""
        good = [make_ki(f"Entity {i}", f"Value {i}") for i in range(5)]
        bad = KI.model_construct(
            **{
                **good[0].model_dump(),
                "id": "ki-bad",
                "payload": good[0].payload.model_copy(update={"confidence": 150}),
            }
        )
        result = store.upsert([*good[:3], bad, *good[3:]])
        assert result.submitted == 6
        assert result.indexed == 5
        assert [f.id for f in result.failed] == ["ki-bad"]
        assert result.indexed + len(result.failed) == result.submitted
        assert not result.ok
        assert store.count() == 5
        with pytest.raises(DocumentNotFoundError):
            store.get("ki-bad")

    def test_empty_upsert(self, store: Store) -> None:
        """Contract: empty upsert."""
        result = store.upsert([])
        assert (result.submitted, result.indexed, result.failed) == (0, 0, [])

    # -- get / copies / delete ---------------------------------------------------------------
    def test_get_unknown_raises_document_not_found(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: get unknown raises document not found."""
        with pytest.raises(DocumentNotFoundError) as info:
            store.get("ki-000000000000000000000000")
        assert info.value.doc_id == "ki-000000000000000000000000"
        with pytest.raises(KeyError):
            store.get("ki-nope")

    def test_returned_kis_are_copies(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: returned kis are copies."""
        ki_id = corpus["louvre"].id
        got = store.get(ki_id)
        got.title = "mutated"
        got.tags.append("mutated")
        got.payload.status = "expired"
        hit = store.search(QueryPlan(lexical="Louvre museum")).hits[0]
        hit.ki.title = "mutated again"
        fresh = store.get(ki_id)
        assert fresh.title == "The Louvre museum is located in Paris."
        assert "mutated" not in fresh.tags and fresh.payload.status == "active"
        # mutating the caller's object after upsert does not change the store either
        corpus["eiffel"].title = "changed after upsert"
        assert store.get(corpus["eiffel"].id).title == "The Eiffel Tower stands in Paris."

    def test_delete(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: delete."""
        assert store.delete([corpus["eiffel"].id, "ki-unknown", corpus["eiffel"].id]) == 1
        assert store.count() == 5
        with pytest.raises(DocumentNotFoundError):
            store.get(corpus["eiffel"].id)
        assert store.delete([]) == 0

    # -- count / iter -----------------------------------------------------------------------
    def test_count_and_iter_with_filters(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: count and iter with filters."""
        assert store.count() == 6
        assert store.count(Filter()) == 5  # default filter excludes expired
        assert store.count(Filter(statuses=("expired",))) == 1
        assert store.count(Filter(tags_all=("landmark", "museum"))) == 1
        assert store.count(Filter(doc_ids=("d2",))) == 2
        assert store.count(Filter(min_confidence=90)) == 2
        ids = [k.id for k in store.iter_kis()]
        assert ids == sorted(k.id for k in corpus.values())
        landmark = [k.id for k in store.iter_kis(Filter(tags_any=("landmark",)))]
        assert landmark == sorted([corpus["eiffel"].id, corpus["louvre"].id])

    # -- search -----------------------------------------------------------------------------
    def test_search_tag_branch_and_ordering(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: search tag branch and ordering."""
        result = store.search(QueryPlan(entity_tags=("entity:marie-curie", "entity:warsaw"), size=10))
        ids = _ids(result)
        assert ids[0] == corpus["curie_born"].id  # carries both tags
        # the stale Pierre Curie KI also carries entity:marie-curie but is not served by default
        assert set(ids) == {corpus["curie_born"].id, corpus["curie_prize"].id}
        assert [h.rank for h in result.hits] == list(range(1, len(ids) + 1))
        assert all(a.score >= b.score for a, b in zip(result.hits, result.hits[1:], strict=False))
        if self.reports_branch_ranks:
            assert result.hits[0].branches == {"tag": 1}
        # equal tag counts tie → id ascending
        tied = [h.ki.id for h in result.hits[1:]]
        assert tied == sorted(tied)

    def test_search_lexical_branch(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: search lexical branch."""
        result = store.search(QueryPlan(lexical="Louvre museum", size=3))
        assert result.hits[0].ki.id == corpus["louvre"].id
        if self.reports_branch_ranks:
            assert result.hits[0].branches.get("lexical") == 1

    def test_search_semantic_branch(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: search semantic branch."""
        result = store.search(QueryPlan(semantic="wrought-iron tower located in Paris France", size=2))
        assert result.hits[0].ki.id == corpus["eiffel"].id
        if self.reports_branch_ranks:
            assert result.hits[0].branches.get("semantic") == 1
        assert len(result.hits) <= 2

    def test_search_hybrid_fuses_all_branches(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: search hybrid fuses all branches."""
        plan = QueryPlan(
            entity_tags=("entity:marie-curie",),
            lexical="Nobel Prize physics",
            semantic="shared the Nobel Prize in Physics",
            size=3,
        )
        result = store.search(plan)
        top = result.hits[0]
        assert top.ki.id == corpus["curie_prize"].id
        if self.reports_branch_ranks:
            assert set(top.branches) == {"tag", "lexical", "semantic"}
        assert len(result.hits) == 3
        assert result.compiled == store.compile(plan)

    def test_search_is_deterministic(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: search is deterministic."""
        plan = QueryPlan(entity_tags=("entity:paris",), lexical="Paris", semantic="Paris", size=5)
        first = [(h.ki.id, h.score) for h in store.search(plan).hits]
        assert first == [(h.ki.id, h.score) for h in store.search(plan).hits]

    def test_search_excludes_expired_by_default(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: search excludes expired by default."""
        plan = QueryPlan(entity_tags=("entity:old-bridge",), lexical="Old Bridge Mostar", size=10)
        assert corpus["old"].id not in _ids(store.search(plan))
        with_expired = plan.model_copy(update={"filters": Filter(statuses=("active", "stale", "expired"))})
        assert _ids(store.search(with_expired))[0] == corpus["old"].id

    def test_search_filters(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: search filters."""
        base = dict(lexical="Paris located museum tower Curie", semantic="Paris", size=10)
        assert set(_ids(store.search(QueryPlan(**base, filters=Filter(statuses=("stale",)))))) == {
            corpus["stale"].id
        }
        by_tag = store.search(QueryPlan(**base, filters=Filter(tags_any=("museum",))))
        assert _ids(by_tag) == [corpus["louvre"].id]
        by_doc = store.search(QueryPlan(**base, filters=Filter(doc_ids=("d1",))))
        assert set(_ids(by_doc)) == {corpus["curie_born"].id, corpus["curie_prize"].id}
        floor = store.search(QueryPlan(**base, filters=Filter(min_confidence=75)))
        assert set(_ids(floor)) == {corpus["curie_born"].id, corpus["curie_prize"].id}
        sub = store.search(QueryPlan(**base, filters=Filter(subtypes=("disambiguation",))))
        assert sub.hits == []

    def test_search_aggregations_over_hits(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: search aggregations over hits."""
        result = store.search(QueryPlan(entity_tags=("entity:paris",), size=10))
        assert set(_ids(result)) == {corpus["eiffel"].id, corpus["louvre"].id}
        aggs = result.aggregations
        assert aggs.by_tag == {"landmark": 2, "museum": 1}
        assert aggs.by_doc == {"d2": 2}
        assert aggs.by_entity["paris"] == 2 and aggs.by_entity["louvre"] == 1

    def test_search_respects_size(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: search respects size."""
        result = store.search(QueryPlan(lexical="Paris Curie Bridge", semantic="Paris", size=1))
        assert len(result.hits) == 1

    def test_search_empty_store(self, store: Store) -> None:
        """Contract: search empty store."""
        result = store.search(QueryPlan(entity_tags=("entity:x",), lexical="x", semantic="x"))
        assert result.hits == [] and result.aggregations.by_tag == {}

    # -- lifecycle ---------------------------------------------------------------------------
    def test_set_status_by_filter(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: set status by filter."""
        assert store.set_status(Filter(doc_ids=("d2",)), "stale") == 2
        assert store.get(corpus["louvre"].id).payload.status == "stale"
        assert store.set_status(Filter(doc_ids=("d2",)), "stale") == 0  # already stale: no change
        assert store.count(Filter(statuses=("stale",))) == 3

    def test_sweep_marks_stale_then_expired(self, store: Store) -> None:
        """Contract: sweep marks stale then expired."""
        fresh = make_ki("Fresh", "Fact", last_seen=T0)
        aging = make_ki("Aging", "Fact", last_seen=T0 - timedelta(days=8))
        ancient = make_ki("Ancient", "Fact", last_seen=T0 - timedelta(days=15))
        hard = make_ki("Hard", "Expiry", last_seen=T0, expires_at=T0 - timedelta(hours=1))
        store.upsert([fresh, aging, ancient, hard])
        result = store.sweep(T0, timedelta(days=7))
        assert (result.stale, result.expired) == (1, 2)
        assert [store.get(k.id).payload.status for k in (fresh, aging, ancient, hard)] == [
            "active",
            "stale",
            "expired",
            "expired",
        ]
        again = store.sweep(T0, timedelta(days=7))
        assert (again.stale, again.expired) == (0, 0)
        # re-seeing the KI (upsert with a new last_seen, status active) revives it
        seen = aging.model_copy(deep=True)
        seen.payload.last_seen = T0
        store.upsert([seen])
        assert store.get(aging.id).payload.status == "active"
        assert store.sweep(T0 + timedelta(days=1), timedelta(days=7)).stale == 0

    def test_search_serves_only_active_unless_the_filter_names_statuses(
        self, store: Store, corpus: dict[str, KI]
    ) -> None:
        """Contract: stale KIs are not served by default; a filter naming statuses includes them."""
        plan = QueryPlan(entity_tags=("entity:pierre-curie",), lexical="Pierre Curie married", size=10)
        assert corpus["stale"].id not in _ids(store.search(plan))
        with_stale = plan.model_copy(update={"filters": Filter(statuses=("active", "stale"))})
        assert _ids(store.search(with_stale))[0] == corpus["stale"].id
        # counting applies the filter as given: a default Filter still counts stale KIs
        assert store.count(Filter()) == 5

    def test_sweep_never_deletes_and_is_idempotent(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: the sweep changes status only, never deletes; repeating it changes nothing."""
        later = T0 + timedelta(days=30)
        first = store.sweep(later, timedelta(days=7))
        assert (first.stale, first.expired) == (0, 5)  # 4 active + 1 stale, all unseen for 30 days
        assert store.count() == 6
        assert store.count(Filter(statuses=("expired",))) == 6
        for ki in corpus.values():
            got = store.get(ki.id)
            assert got.title == ki.title and got.payload.last_seen == ki.payload.last_seen
        again = store.sweep(later, timedelta(days=7))
        assert (again.stale, again.expired) == (0, 0)
        assert store.count() == 6

    def test_sweep_uses_per_subtype_retention(self, store: Store) -> None:
        """Contract: disambiguation/source-description KIs age with their own window."""
        ten_days = T0 - timedelta(days=10)
        fact = make_ki("Fact", "Ten days", last_seen=ten_days)
        dis = make_ki("Dis", "Ten days", last_seen=ten_days, subtype="disambiguation")
        src = make_ki("Src", "Ten days", last_seen=ten_days, subtype="source_description")
        old_src = make_ki(
            "Src", "Forty days", last_seen=T0 - timedelta(days=40), subtype="source_description"
        )
        store.upsert([fact, dis, src, old_src])
        retention = {"disambiguation": timedelta(days=30), "source_description": timedelta(days=15)}
        result = store.sweep(T0, timedelta(days=7), retention=retention)
        assert (result.stale, result.expired) == (1, 1)
        assert [store.get(k.id).payload.status for k in (fact, dis, src, old_src)] == [
            "stale",
            "active",
            "active",
            "expired",
        ]
        # without the override the disambiguation KI follows the default window
        assert store.sweep(T0, timedelta(days=7)).stale == 2

    def test_mark_seen_refreshes_and_revives(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: mark_seen sets last_seen and makes the KI active again, without re-writing it."""
        later = T0 + timedelta(days=20)
        store.sweep(later, timedelta(days=7))
        old, louvre = corpus["old"], corpus["louvre"]
        assert store.get(louvre.id).payload.status == "expired"
        assert store.mark_seen([old.id, louvre.id, "ki-000000000000000000000000"], later) == 2
        for ki in (old, louvre):
            got = store.get(ki.id)
            assert (got.payload.status, got.payload.last_seen) == ("active", later)
            assert got.title == ki.title and got.payload.evidence == ki.payload.evidence
        assert store.get(corpus["eiffel"].id).payload.status == "expired"
        assert _ids(store.search(QueryPlan(lexical="Louvre museum", size=3)))[0] == louvre.id
        assert store.sweep(later + timedelta(days=1), timedelta(days=7)) == store.sweep(
            later + timedelta(days=1), timedelta(days=7)
        )
        assert store.get(louvre.id).payload.status == "active"
        assert store.mark_seen([], later) == 0

    def test_lifecycle_of_a_corpus_rerun(self, store: Store) -> None:
        """Contract: the re-run scenario of issue 14 with store primitives.

        Six KIs seen 15 days ago; the corpus is seen again with d1 unchanged and d2 gone: d1's
        facts and the disambiguation whose evidence is all present are refreshed, the rest expire.
        """
        seen = T0 - timedelta(days=15)
        d1 = [make_ki(f"Alpha {i}", "One", docid="d1", last_seen=seen) for i in range(3)]
        d2 = [make_ki("Beta", "Two", docid="d2", last_seen=seen)]
        dis_ok = make_ki("Alpha 0", "Gamma", docid="d1", last_seen=seen, subtype="disambiguation")
        dis_ok.evidence_doc_ids = ["d1", "d3"]
        dis_gone = make_ki("Alpha 1", "Beta", docid="d1", last_seen=seen, subtype="disambiguation")
        dis_gone.evidence_doc_ids = ["d1", "d2"]
        assert store.upsert([*d1, *d2, dis_ok, dis_gone]).ok
        corpus_now = {"d1", "d3"}
        facts = [
            k.id for k in store.iter_kis(Filter(statuses=(), doc_ids=("d1",), subtypes=("dataset_fact",)))
        ]
        assert sorted(facts) == sorted(k.id for k in d1)
        assert store.mark_seen(facts, T0) == 3
        derived = [
            k.id
            for k in store.iter_kis(Filter(statuses=(), subtypes=("disambiguation", "source_description")))
            if set(k.evidence_doc_ids) <= corpus_now
        ]
        assert derived == [dis_ok.id]
        store.mark_seen(derived, T0)
        result = store.sweep(T0, timedelta(days=7))
        assert (result.stale, result.expired) == (0, 2)
        status = {k.id: k.payload.status for k in store.iter_kis()}
        assert status == {
            **dict.fromkeys(facts, "active"),
            dis_ok.id: "active",
            d2[0].id: "expired",
            dis_gone.id: "expired",
        }
        assert store.count() == 6

    def test_fingerprint_changes_on_every_write_and_never_on_reads(
        self, store: Store, corpus: dict[str, KI]
    ) -> None:
        """Contract: fingerprint() moves on upsert/delete/status change/mark_seen, not on reads."""
        fp = store.fingerprint()
        assert isinstance(fp, str) and fp
        store.search(QueryPlan(lexical="Paris", semantic="Paris", size=3))
        store.get(corpus["eiffel"].id)
        store.count(Filter())
        list(store.iter_kis())
        store.compile(QueryPlan(lexical="Paris"))
        assert store.fingerprint() == fp
        seen = {fp}

        def changed() -> None:
            now = store.fingerprint()
            assert now not in seen, "fingerprint did not change after a write"
            seen.add(now)
            assert store.fingerprint() == now  # stable while nothing is written

        store.upsert([make_ki("New", "Fact")])
        changed()
        assert store.set_status(Filter(doc_ids=("d2",)), "stale") == 2
        changed()
        assert store.sweep(T0 + timedelta(days=30), timedelta(days=7)).expired > 0
        changed()
        assert store.mark_seen([corpus["eiffel"].id], T0) == 1
        changed()
        assert store.delete([corpus["louvre"].id]) == 1
        changed()

    # -- concurrency -------------------------------------------------------------------------
    def test_concurrent_reads_with_one_writer(self, store: Store, corpus: dict[str, KI]) -> None:
        """Contract: concurrent reads with one writer."""
        errors: list[BaseException] = []

        def reader() -> None:
            try:
                for _ in range(5):
                    assert store.search(QueryPlan(lexical="Paris", size=3)).hits
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        store.upsert([make_ki(f"Writer {i}", "Paris", docid="d9") for i in range(10)])
        for t in threads:
            t.join(timeout=60)
        assert errors == []
        assert store.count() == 16
