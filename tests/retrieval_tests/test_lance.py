"""LanceStore: the conformance suite plus one test per LanceDB 0.40 gotcha and a kill -9 test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kitune.config import LanceStoreConfig
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.lance import LanceStore
from kitune.testing.store_contract import StoreContract, make_ki


class TestLanceStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[LanceStore]:
        s = LanceStore(tmp_path / "db", HashEmbedder(dim=64), config=LanceStoreConfig(write_batch_size=4))
        yield s
        s.close()


def _store(path: Path, **cfg: object) -> LanceStore:
    return LanceStore(path, HashEmbedder(dim=32), config=LanceStoreConfig(**cfg))  # type: ignore[arg-type]


def test_rows_written_after_indexing_are_searchable_without_optimize(tmp_path: Path) -> None:
    from kitune.schema import QueryPlan

    s = _store(tmp_path)
    a = make_ki("Ada Lovelace", "London", title="Ada Lovelace lived in London.")
    s.upsert([a])
    assert [h.ki.id for h in s.search(QueryPlan(lexical="Lovelace")).hits] == [a.id]
    b = make_ki("Grace Hopper", "Arlington", title="Grace Hopper is buried in Arlington.")
    s.upsert([b])  # lands in a fragment the FTS/label-list indices have not seen yet
    assert next(h.ki.id for h in s.search(QueryPlan(lexical="Hopper Arlington")).hits) == b.id
    assert [h.ki.id for h in s.search(QueryPlan(entity_tags=("entity:grace-hopper",))).hits] == [b.id]
    s.optimize()
    assert next(h.ki.id for h in s.search(QueryPlan(lexical="Hopper Arlington")).hits) == b.id


def test_reopen_keeps_data_and_rejects_other_dim(tmp_path: Path) -> None:
    from kitune.errors import StoreError

    s = _store(tmp_path)
    kis = [make_ki(f"Person {i}", f"City {i}") for i in range(3)]
    s.upsert(kis)
    s.close()
    again = _store(tmp_path)
    assert again.count() == 3 and again.get(kis[1].id).title == kis[1].title
    with pytest.raises(StoreError, match=r"embedder\.dim=32"):
        LanceStore(tmp_path, HashEmbedder(dim=16))


def test_reopen_finds_its_table_among_more_than_ten(tmp_path: Path) -> None:
    # LanceDB's deprecated table_names() returned the first 10 names only: an 11th table (a KI table
    # per extractor prompt version is common) was taken for missing on reopen (issue 24)
    for i in range(11):
        _store(tmp_path, table=f"kis-a{i:02d}").upsert([make_ki(f"Other {i}", "Place")])
    s = _store(tmp_path, table="kis-z")
    kis = [make_ki(f"Person {i}", f"City {i}") for i in range(3)]
    s.upsert(kis)
    s.close()
    again = _store(tmp_path, table="kis-z")
    assert again.count() == 3 and again.get(kis[2].id).title == kis[2].title


def test_tags_column_is_list_item_and_uses_label_list_index(tmp_path: Path) -> None:
    s = _store(tmp_path)
    s.upsert([make_ki("Ada Lovelace", "London", tags=["person"])])
    field = s._table.schema.field("tags").type
    assert field.value_field.name == "item"
    kinds = {tuple(i.columns): i.index_type for i in s._table.list_indices()}
    assert kinds[("tags",)] == "LabelList" and kinds[("docids",)] == "LabelList"
    plan = (
        s._table.search().where("array_has_any(tags, ['person'])").select(["id"]).limit(5).explain_plan(True)
    )
    assert "ScalarIndexQuery" in plan and "CAST" not in plan


def test_list_element_tags_silently_skip_the_index_and_are_rejected(tmp_path: Path) -> None:
    """The gotcha itself: list<element: string> → the planner CASTs and scans; we refuse it."""
    import lancedb
    import pyarrow as pa

    from kitune.errors import StoreError

    db = lancedb.connect(str(tmp_path))
    schema = pa.schema([("id", pa.string()), ("tags", pa.list_(pa.field("element", pa.string())))])
    t = db.create_table("bad", schema=schema)
    t.add(
        pa.Table.from_pylist([{"id": f"k{i}", "tags": ["a", f"t{i % 3}"]} for i in range(10)], schema=schema)
    )
    t.create_scalar_index("tags", index_type="LABEL_LIST")
    plan = t.search().where("array_has_any(tags, ['t1'])").select(["id"]).limit(3).explain_plan(True)
    assert "CAST(tags" in plan and "ScalarIndexQuery" not in plan
    # our store casts explicitly, and refuses a KI table built that way
    good = _store(tmp_path / "db")
    good.close()
    import shutil

    table_dir = tmp_path / "db" / "kis.lance"
    shutil.rmtree(table_dir)
    bad_schema = pa.schema(
        [
            f
            if f.name not in ("tags", "docids")
            else pa.field(f.name, pa.list_(pa.field("element", pa.string())))
            for f in good.schema
        ]
    )
    lancedb.connect(str(tmp_path / "db")).create_table("kis", schema=bad_schema)
    with pytest.raises(StoreError, match="label-list index"):
        _store(tmp_path / "db")


def test_order_by_unselected_column_under_scalar_filter_fails_but_store_selects_it(tmp_path: Path) -> None:
    from lancedb.query import ColumnOrdering

    from kitune.schema import Filter

    s = _store(tmp_path)
    kis = [make_ki(f"Person {i}", f"City {i}", status="stale" if i % 2 else "active") for i in range(6)]
    s.upsert(kis)
    order = [ColumnOrdering(column_name="id")]
    with pytest.raises(Exception, match=r"TakeExec|_rowid"):
        s._table.search().where("status = 'active'").select(["title"]).order_by(order).limit(3).to_list()
    got = [k.id for k in s.iter_kis(Filter(statuses=("active",)), page_size=2)]
    assert got == sorted(k.id for k in kis[::2])


def test_inline_compaction_keeps_fragment_count_bounded(tmp_path: Path) -> None:
    s = _store(tmp_path, write_batch_size=2, compact_every_fragments=4, background_compaction=False)
    for i in range(10):
        s.upsert([make_ki(f"Person {i}", "Somewhere")])
        assert s.fragment_count() < 4
    assert s.count() == 10


def test_background_compaction_never_blocks_an_upsert(tmp_path: Path) -> None:
    """Issue 14: compaction runs off the write path; upserts meanwhile return at once."""
    import threading
    import time

    s = _store(tmp_path, write_batch_size=2, compact_every_fragments=4, compaction_quiet_s=0.0)
    real = s._maintain
    started, release = threading.Event(), threading.Event()

    def slow_maintain() -> None:  # a compaction that takes as long as we want
        started.set()
        release.wait(30)
        real()

    s._maintain = slow_maintain  # type: ignore[method-assign]
    s._compactor._maintain = slow_maintain
    for i in range(4):
        s.upsert([make_ki(f"Person {i}", "Somewhere")])
    assert started.wait(10), "compaction was not requested"
    worst = 0.0
    for i in range(4, 10):  # the compaction is "running" now
        t0 = time.perf_counter()
        assert s.upsert([make_ki(f"Person {i}", "Somewhere")]).ok
        worst = max(worst, time.perf_counter() - t0)
    assert worst < 1.0 and s.fragment_count() >= 4 and s.compaction.runs == 0
    release.set()
    assert s.wait_for_maintenance(60)
    assert s.compaction.runs >= 1 and s.count() == 10
    s.close()


def test_background_compaction_retries_when_a_write_wins_the_commit(tmp_path: Path) -> None:
    s = _store(tmp_path, write_batch_size=2, compact_every_fragments=3, compaction_quiet_s=0.0)
    real = s._maintain
    calls = {"n": 0}

    def flaky() -> None:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise RuntimeError("lance error: Retryable commit conflict for version 7: preempted")
        real()

    s._compactor._maintain = flaky
    for i in range(3):
        s.upsert([make_ki(f"Person {i}", "Somewhere")])
    assert s.wait_for_maintenance(60)
    assert (s.compaction.preempted, s.compaction.runs) == (2, 1)
    assert s.fragment_count() < 3
    s.close()


def test_writer_retries_a_commit_lost_to_compaction() -> None:
    from kitune.retrieval.lance_maintenance import retry_conflicts

    attempts = []

    def commit() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise RuntimeError("Retryable commit conflict for version 9")
        return "ok"

    assert retry_conflicts(commit, sleep=lambda s: None) == "ok" and len(attempts) == 3
    with pytest.raises(ValueError):
        retry_conflicts(lambda: (_ for _ in ()).throw(ValueError("schema mismatch")), sleep=lambda s: None)


def test_optimize_is_synchronous_and_does_not_change_the_fingerprint(tmp_path: Path) -> None:
    s = _store(tmp_path, write_batch_size=1, compact_every_fragments=1000)
    s.upsert([make_ki(f"Person {i}", "Somewhere") for i in range(6)])
    fp = s.fingerprint()
    assert s.fragment_count() == 6
    s.optimize()
    assert s.fragment_count() == 1 and s.fingerprint() == fp
    s.upsert([make_ki("Person 99", "Elsewhere")])
    assert s.fingerprint() != fp


def test_sql_values_are_validated_and_quoted(tmp_path: Path) -> None:
    from kitune.errors import StoreError
    from kitune.retrieval.lance import filter_to_sql, sql_quote
    from kitune.schema import Filter

    assert sql_quote("doc:100.a") == "'doc:100.a'"
    with pytest.raises(StoreError, match="refusing"):
        sql_quote("x') OR 1=1 --")
    sql = filter_to_sql(Filter(tags_any=("entity:paris",), doc_ids=("d2",), min_confidence=50))
    assert sql == (
        "(status IN ('active', 'stale')) AND (array_has_any(tags, ['entity:paris'])) "
        "AND (array_has_any(docids, ['d2'])) AND (confidence >= 50)"
    )
    assert filter_to_sql(Filter(statuses=("active", "stale", "expired"))) is None
    s = _store(tmp_path)
    with pytest.raises(StoreError):
        s.count(Filter(doc_ids=("1' OR '1'='1",)))
    from kitune.errors import DocumentNotFoundError

    with pytest.raises(DocumentNotFoundError):
        s.get("bad' id")


_WRITER = """
import sys
from kitune.config import LanceStoreConfig
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.lance import LanceStore
from kitune.testing.store_contract import make_ki

store = LanceStore(sys.argv[1], HashEmbedder(dim=32), config=LanceStoreConfig(write_batch_size=25))
batch = 0
while True:
    kis = [make_ki(f"Person {batch}-{j}", f"City {j}", docid=f"b{batch}") for j in range(25)]
    result = store.upsert(kis)
    assert result.ok, result
    print(f"committed {batch}", flush=True)
    batch += 1
"""


def test_killed_writer_loses_no_committed_batch(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    from kitune.schema import Filter, QueryPlan

    db = tmp_path / "db"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(db)], stdout=subprocess.PIPE, text=True)
    committed: list[int] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            committed.append(int(line.split()[1]))
            if len(committed) >= 3:
                break
        os.kill(proc.pid, signal.SIGKILL)  # mid-batch: the writer loops straight into the next one
        rest, _ = proc.communicate(timeout=60)
        committed += [int(line.split()[1]) for line in rest.splitlines() if line.startswith("committed")]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    store = _store(db)
    for b in committed:
        assert store.count(Filter(doc_ids=(f"b{b}",), statuses=("active",))) == 25
    total = store.count()
    assert total % 25 == 0 and total >= 25 * len(committed)  # no half-written batch is visible
    probe = make_ki(f"Person {committed[-1]}-7", "City 7", docid=f"b{committed[-1]}")
    assert store.get(probe.id).title == probe.title
    tag_plan = QueryPlan(entity_tags=(f"entity:person-{committed[-1]}-7",), size=5)
    assert [h.ki.id for h in store.search(tag_plan).hits] == [probe.id]
    semantic = store.search(QueryPlan(semantic=probe.description, size=5)).hits
    assert len(semantic) == 5 and semantic[0].ki.id == probe.id  # identical text: cosine 1.0
    assert len(store.search(QueryPlan(lexical="Person City", size=5)).hits) == 5
    assert store.upsert([make_ki("After", "Crash")]).ok  # the store is writable after the crash


def test_ann_index_is_built_past_the_threshold_and_used(tmp_path: Path) -> None:
    from kitune.schema import QueryPlan

    class SmallAnn(LanceStore):
        ann_min_rows = 300

    s = SmallAnn(tmp_path, HashEmbedder(dim=16), config=LanceStoreConfig(write_batch_size=400))
    kis = [
        make_ki(f"Person {i}", f"Town {i % 37}", description=f"Person {i} lives in town {i % 37}.")
        for i in range(320)
    ]
    assert s.upsert(kis).ok
    assert s.wait_for_maintenance(60)  # the ANN index is built by background maintenance (issue 14)
    kinds = {tuple(i.columns): i.index_type for i in s._table.list_indices()}
    assert "vector" in {c[0] for c in kinds}
    hits = s.search(QueryPlan(semantic="Person 123 lives in town 12.", size=3)).hits
    assert len(hits) == 3 and hits[0].branches.get("semantic") == 1


def test_second_process_view_sees_new_commits(tmp_path: Path) -> None:
    from datetime import timedelta

    writer = _store(tmp_path)
    reader = LanceStore(tmp_path, HashEmbedder(dim=32), read_consistency=timedelta(0))
    writer.upsert([make_ki("First", "Fact")])
    assert reader.count() == 1
    writer.upsert([make_ki("Second", "Fact")])
    assert reader.count() == 2 and reader.get(make_ki("Second", "Fact").id).title


def test_lance_stores_satisfy_the_protocols(tmp_path: Path) -> None:
    from kitune.retrieval.base import CorpusStore, Store
    from kitune.retrieval.lance_corpus import LanceCorpusStore

    assert isinstance(_store(tmp_path / "a"), Store)
    assert isinstance(LanceCorpusStore(tmp_path / "b", HashEmbedder(dim=8)), CorpusStore)


def test_lance_tag_branch_matches_bare_slug_and_refuses_triple_filters(tmp_path: Path) -> None:
    from kitune.errors import StoreError
    from kitune.schema import Filter, QueryPlan

    s = _store(tmp_path)
    tagged = make_ki("Acme Corp", "Berlin")
    bare = make_ki("Widget", "Thing", tags=["acme-corp"])
    s.upsert([tagged, bare, make_ki("Other", "Thing")])
    hits = s.search(QueryPlan(entity_tags=("entity:acme-corp",), size=10)).hits
    assert sorted(h.ki.id for h in hits) == sorted([tagged.id, bare.id])
    flt = Filter().model_copy(update={"subjects": ("Acme Corp",)})
    with pytest.raises(StoreError, match="subject/predicate filters are not supported by the embedded store"):
        s.count(flt)


@pytest.mark.parametrize(
    ("query", "docid"),
    [("столица", "ru"), ("北京", "zh"), ("中国首都", "zh"), ("Zürich", "de"), ("zurich", "de")],
)
def test_lexical_only_search_finds_every_script(tmp_path: Path, query: str, docid: str) -> None:
    from kitune.schema import QueryPlan

    s = _store(tmp_path)
    s.upsert(
        [
            make_ki("Москва", "Россия", docid="ru", title="Москва — столица России."),
            make_ki("北京", "中国", docid="zh", title="北京是中国的首都。"),
            make_ki("Zürich", "Schweiz", docid="de", title="Zürich liegt in der Schweiz."),
            make_ki("Paris", "France", docid="en", title="Paris is the capital of France."),
        ]
    )
    hits = s.search(QueryPlan(lexical=query)).hits
    assert [h.ki.evidence_doc_ids[0] for h in hits] == [docid]
    assert hits[0].branches == {"lexical": 1}


def test_fts_index_from_an_older_tokenizer_is_rebuilt_on_next_write(tmp_path: Path) -> None:
    from lancedb.index import FTS

    from kitune.retrieval.lance_search import fts_state
    from kitune.schema import QueryPlan

    s = _store(tmp_path)
    zh = make_ki("北京", "中国", docid="zh", title="北京是中国的首都。")
    s.upsert([zh])
    s._table.create_index("title", config=FTS(with_position=False), replace=True)  # the old default
    s.close()
    s = _store(tmp_path)
    assert fts_state(s._table, "title") == "stale"
    assert s.search(QueryPlan(lexical="北京")).hits == []  # whole sentence was one token
    s.upsert([make_ki("Paris", "France", docid="en", title="Paris is the capital of France.")])
    assert fts_state(s._table, "title") == "current"
    assert [h.ki.id for h in s.search(QueryPlan(lexical="北京")).hits] == [zh.id]


# -- issue 39.5: maintenance that never leaves queries scanning unindexed rows --------------------


def _held(**cfg: object) -> dict[str, object]:
    """A config whose background maintenance is requested but never starts (nor any other trigger)."""
    base: dict[str, object] = {
        "maintain_unindexed_rows": 0,
        "maintain_every_writes": 0,
        "compact_every_fragments": 1000,
        "compaction_quiet_s": 10_000.0,
        "compaction_max_wait_s": None,
    }
    return {**base, **cfg}


def test_maintenance_is_requested_when_unindexed_rows_reach_the_bound(tmp_path: Path) -> None:
    s = _store(tmp_path, **_held(maintain_unindexed_rows=5))
    s.upsert([make_ki(f"Person {i}", "Here") for i in range(3)])  # indices built on these 3 rows
    assert s.unindexed_rows() == 0 and not s._compactor.pending()
    s.upsert([make_ki(f"Person {i}", "There") for i in range(3, 7)])
    assert s.unindexed_rows() == 4 and not s._compactor.pending()
    s.upsert([make_ki("Person 7", "There")])
    assert s.unindexed_rows() == 5 and s._compactor.pending()
    s.close()


def test_maintenance_is_requested_after_the_write_bound_deletes_included(tmp_path: Path) -> None:
    s = _store(tmp_path, **_held(maintain_every_writes=3))
    kis = [make_ki(f"Person {i}", "Here") for i in range(4)]
    s.upsert(kis[:2])
    s.upsert(kis[2:])
    assert not s._compactor.pending()
    assert s.delete([kis[0].id]) == 1  # the third committed write
    assert s._compactor.pending()
    s.close()


def test_inline_maintenance_folds_unindexed_rows_at_the_bound(tmp_path: Path) -> None:
    s = _store(tmp_path, **_held(maintain_unindexed_rows=4, background_compaction=False))
    s.upsert([make_ki(f"Person {i}", "Here") for i in range(2)])
    s.upsert([make_ki(f"Person {i}", "There") for i in range(2, 5)])
    assert s.unindexed_rows() == 3 and s.fragment_count() == 2
    s.upsert([make_ki("Person 5", "There")])  # 4 unindexed: optimize() runs inside this upsert
    assert s.unindexed_rows() == 0 and s.fragment_count() < 3 and s.count() == 6


def test_compactor_starts_under_a_write_stream_after_max_wait() -> None:
    from kitune.retrieval.lance_maintenance import Compactor

    runs: list[int] = []
    waiting = Compactor(lambda: runs.append(1), quiet_s=10_000.0, max_wait_s=None)
    waiting.wrote()
    waiting.request()
    assert not waiting.wait(0.3) and runs == []  # never quiet: the pre-39.5 compactor never starts
    waiting.close(timeout=5)
    bounded = Compactor(lambda: runs.append(2), quiet_s=10_000.0, max_wait_s=0.0)
    bounded.wrote()
    bounded.request()
    assert bounded.wait(30) and runs == [2] and bounded.stats.runs == 1
    bounded.close(timeout=5)


def test_queries_during_background_maintenance_return_the_same_results(tmp_path: Path) -> None:
    """Every query while optimize() runs in the background reads one whole snapshot: nothing lost.

    Membership is compared on results large enough to hold every match; the exact ranking of the
    tag and (exact, below the ANN threshold) semantic branches too. BM25 scores may move once the
    FTS index covers the new rows, so a ranked lexical/hybrid answer during the run must equal the
    one before or the one after it.
    """
    import threading

    from kitune.schema import QueryPlan

    s = _store(
        tmp_path,
        maintain_unindexed_rows=6,
        maintain_every_writes=0,
        compact_every_fragments=1000,
        compaction_quiet_s=0.0,
        compaction_max_wait_s=0.0,
    )
    people = [("Ada Lovelace", "London"), ("Grace Hopper", "Arlington"), ("Alan Turing", "Wilmslow")]
    s.upsert([make_ki(p, c, title=f"{p} lived in {c}.") for p, c in people])
    s.upsert([make_ki(f"Person {i}", "London", title=f"Person {i} lived in London.") for i in range(5)])
    assert s.unindexed_rows() == 5 and not s._compactor.pending()
    ranked = [
        QueryPlan(entity_tags=("entity:london",), size=5),
        QueryPlan(semantic="Grace Hopper Arlington", size=5),
    ]
    scored = [
        QueryPlan(lexical="lived in London", size=5),
        QueryPlan.plain("Where did Ada Lovelace live?", size=5),
    ]
    everything = [p.model_copy(update={"size": 50}) for p in (*ranked, *scored)]

    def ids(p: QueryPlan) -> list[str]:
        return [h.ki.id for h in s.search(p).hits]

    def stable() -> tuple[list[list[str]], list[list[str]]]:
        return [ids(p) for p in ranked], [sorted(ids(p)) for p in everything]

    def bm25() -> list[list[str]]:
        return [ids(p) for p in scored]

    table_type = type(s._table)
    real_optimize = table_type.optimize
    started, release = threading.Event(), threading.Event()

    def held_optimize(self: object, **kw: object) -> None:
        if threading.current_thread().name == "kitune-lance-compactor":
            started.set()
            release.wait(30)
        real_optimize(self, **kw)  # type: ignore[arg-type]

    table_type.optimize = held_optimize  # type: ignore[method-assign]
    try:
        s.upsert([make_ki("Person 9", "London", title="Person 9 lived in London.")])  # 6th unindexed row
        assert started.wait(30), "maintenance was not started at the bound"
        expected, before = stable(), bm25()  # the new KI is visible before maintenance commits
        assert len(expected[1][0]) == 7 and len(expected[0][0]) == 5  # every London KI, then the top 5
        release.set()
        seen: list[list[list[str]]] = []
        while s._compactor.pending():  # queries while optimize() runs in the background
            assert stable() == expected
            seen.append(bm25())
        assert s.wait_for_maintenance(60)
    finally:
        table_type.optimize = real_optimize  # type: ignore[method-assign]
        release.set()
    assert s.compaction.runs == 1 and s.unindexed_rows() == 0
    after = bm25()
    assert stable() == expected
    assert all(answer in (before, after) for answer in seen)
    s.close()
