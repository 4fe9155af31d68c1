"""The embedded default KI store on LanceDB (in-process, on disk, no server).

One table holds every KI: the KI JSON plus flat columns (``id``, ``title``, ``description``,
``tags``, ``docids``, ``status``, ``confidence``, ``subtype``, ``last_seen_us``,
``expires_at_us``, ``vector``). Retrieval runs three branches — tags via the label-list index,
BM25 (native FTS) on ``title``, cosine vector search on the description embedding — and fuses
them in Python with :func:`kitune.retrieval.fusion.rrf_fuse`, like every backend.

LanceDB 0.40 gotchas handled here (each has a test in ``tests/retrieval_tests/test_lance.py``):

* **Label-list index and list field names.** A ``list<element: string>`` column (what Polars or
  Parquet writers produce) makes the planner wrap the column in a ``CAST`` and silently skip the
  LABEL_LIST index. Every write is cast to :data:`KI_SCHEMA` (``list<item: string>``), and a table
  opened with the wrong list type is rejected with the fix.
* **``order_by`` + scalar-indexed filter.** Ordering by a column absent from ``select()`` while
  the filter hits a scalar index raises ``TakeExec requires … _rowid``; every ordered query here
  selects its order column.
* **Fragments and unindexed rows.** Each commit adds a fragment, and rows committed after an
  index was built are searched without it (a flat scan) until ``optimize()`` folds them in; reads
  slow down with both. Writes go in batches of ``write_batch_size``; after a write, maintenance
  (LanceDB's ``optimize()``: compaction + index update + cleanup, as its documentation
  prescribes) is requested once the table has ``compact_every_fragments`` fragments, once an
  index leaves ``maintain_unindexed_rows`` rows unindexed (``index_stats``' ``num_unindexed_rows``)
  or after ``maintain_every_writes`` writes. A background compactor
  (:mod:`kitune.retrieval.lance_maintenance`) runs it off the write path, in a quiet moment or at
  the latest ``compaction_max_wait_s`` after the request, on a table handle of its own: queries
  never wait for it and read the version they opened until the maintained one is committed
  (``background_compaction=False``: inline, as before). Bulk loads call
  :meth:`LanceStore.optimize` themselves. The ANN index is built by maintenance, never inside
  an ``upsert``.
* **Durability.** Lance commits are atomic (a version exists once its manifest is written), so a
  killed process never loses a committed batch and never exposes a half-written one. Lance does
  not fsync, so after every committed batch the new files and their folders are fsync'ed: a
  committed batch also survives power loss once ``upsert`` returns.

Filters are pushed down as SQL ``where`` strings (:mod:`kitune.retrieval.lance_sql`).
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kitune.config import KituneConfig, LanceStoreConfig, RetrievalConfig
from kitune.errors import ConfigError, DocumentNotFoundError, StoreError, StoreUnavailableError
from kitune.ki import KI, KIStatus
from kitune.retrieval.base import Hit, SearchResult, StoreBackend, SweepResult, WriteFailure, WriteResult
from kitune.retrieval.embedders import Embedder, HashEmbedder, create_embedder
from kitune.retrieval.fusion import aggregate, branch_weights, rrf_fuse
from kitune.retrieval.lance_maintenance import CompactionStats, Compactor, retry_conflicts
from kitune.retrieval.lance_search import (
    branch_lexical,
    branch_semantic,
    branch_tag,
    compile_plan,
    fts_config,
    fts_state,
)
from kitune.retrieval.lance_sql import (
    EPOCH,
    SAFE_VALUE_RE,
    STATUSES,
    SUBTYPES,
    check_table_schema,
    filter_to_sql,
    fsync_path,
    ki_rows,
    ki_schema,
    micros,
    sql_and,
    sql_quote,
    table_names,
)
from kitune.retrieval.rules import effective_filter, validate_ki
from kitune.schema import Filter, QueryPlan

__all__ = [
    "PLUGINS",
    "LanceStore",
    "filter_to_sql",
    "ki_schema",
    "lance_path",
    "lance_table_exists",
    "open_lance",
    "sql_quote",
]

_ID_COLUMNS = ["id", "json", "status", "last_seen_us"]


class LanceStore:
    """LanceDB-backed :class:`~kitune.retrieval.base.Store` (see the module docstring).

    Args:
        path: database folder (created if missing).
        embedder: embeds descriptions and semantic queries; its ``dim`` fixes the vector column.
        config: table name, write batch size, compaction threshold.
        retrieval: RRF constant, branch weights, branch size, confidence floor.
        fsync: fsync new files after each committed batch (default True).
        read_consistency: how often reads check for commits made by other processes (None: never;
            writes made through this instance are always visible at once).

    Raises:
        StoreUnavailableError: the folder cannot be opened as a LanceDB database.
        StoreError: an existing table has a different vector size or a ``list<element>`` tags
            column (see the module docstring).
    """

    backend = "lancedb"
    ann_min_rows = 10_000
    """Build an ANN (IVF_HNSW_SQ, cosine) index once the table has this many rows; below it,
    vector search is exact (brute force), which is faster at that size."""

    def __init__(
        self,
        path: str | Path,
        embedder: Embedder | None = None,
        *,
        config: LanceStoreConfig | None = None,
        retrieval: RetrievalConfig | None = None,
        fsync: bool = True,
        read_consistency: timedelta | None = timedelta(seconds=5),
    ) -> None:
        import lancedb

        self.path = Path(path)
        self.embedder = embedder or HashEmbedder()
        self.config = config or LanceStoreConfig()
        self.retrieval = retrieval or RetrievalConfig()
        self.fsync = fsync
        self.schema = ki_schema(self.embedder.dim)
        self._write_lock = threading.RLock()
        self._synced: set[str] = set()
        self._indexed_rows = -1
        self._has_fts = False
        self._maintenance_versions: dict[int, int] = {}
        self._sync_lock = threading.Lock()
        self._maint_lock = threading.Lock()
        self._writes = 0
        self._writes_at_maintenance = 0
        self._compactor = Compactor(
            self._background_maintain,
            quiet_s=self.config.compaction_quiet_s,
            max_wait_s=self.config.compaction_max_wait_s,
        )
        self._maint_table: Any = None
        self._stale_view = False
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._db = lancedb.connect(str(self.path), read_consistency_interval=read_consistency)
            names = table_names(self._db)
        except Exception as e:  # lancedb raises plain OSError/RuntimeError here
            raise StoreUnavailableError(
                f"cannot open LanceDB at {self.path}: {e}", backend=self.backend
            ) from e
        name = self.config.table
        if name in names:
            self._table = self._db.open_table(name)
            check_table_schema(self._table.schema, self.config.table, self.path, self.embedder.dim)
            self._has_fts = fts_state(self._table, "title") != "missing"
        else:
            self._table = self._db.create_table(name, schema=self.schema)
            self._sync_files()

    # -- housekeeping -------------------------------------------------------------------------
    @property
    def table_dir(self) -> Path:
        """The table's folder on disk."""
        return self.path / f"{self.config.table}.lance"

    def _sync_files(self) -> None:
        """Fsync every file under the table folder not synced before, then every folder."""
        if not self.fsync:
            return
        with self._sync_lock:
            self._sync_files_locked()

    def _sync_files_locked(self) -> None:
        root = self.table_dir
        for dirpath, _dirnames, filenames in os.walk(root):
            for fn in filenames:
                full = os.path.join(dirpath, fn)
                if full not in self._synced:
                    fsync_path(Path(full))
                    self._synced.add(full)
            fsync_path(Path(dirpath), directory=True)
        fsync_path(self.path, directory=True)

    def fragment_count(self) -> int:
        """Number of data fragments (grows by one per commit until compaction)."""
        stats: Any = self._table.stats()
        return int(stats["fragment_stats"]["num_fragments"])

    def _ensure_indices(self, *, ann: bool = False, table: Any = None) -> None:
        """Create the missing scalar/FTS indices (cheap); with ``ann``, also the vector index (slow)."""
        table = self._table if table is None else table
        rows = table.count_rows()
        if rows == 0 or (rows == self._indexed_rows and not ann):
            return
        from lancedb.index import Bitmap, BTree, HnswSq, LabelList

        existing = {tuple(i.columns): i.index_type for i in table.list_indices()}
        wanted: list[tuple[str, Any]] = [
            ("id", BTree()),
            ("tags", LabelList()),
            ("docids", LabelList()),
            ("status", Bitmap()),
            ("title", fts_config()),
        ]
        if fts_state(table, "title") == "stale":  # an older tokenizer: rebuild with the current one
            existing.pop(("title",), None)
        for col, cfg in wanted:
            if (col,) not in existing:
                retry_conflicts(functools.partial(table.create_index, col, config=cfg, replace=True))
        if ann and rows >= self.ann_min_rows and ("vector",) not in existing:
            # IVF_HNSW_SQ; lancedb's config API (its metric=/index_type= form is deprecated)
            table.create_index("vector", config=HnswSq(distance_type="cosine"))
        self._indexed_rows = rows
        self._has_fts = True

    def unindexed_rows(self) -> int:
        """Rows that some index of the table does not cover yet (the largest ``num_unindexed_rows``).

        LanceDB searches these rows without the index (a flat scan) until ``optimize()`` folds
        them in. 0 when the table has no index. The vector index is not asked: ``optimize()``
        updates every index at once, so the scalar and FTS indices count the same rows, and
        LanceDB's vector index statistics load its centroids (memory, and a warning per call).
        """
        counts = [0]
        for index in self._table.list_indices():
            if list(index.columns) == ["vector"]:
                continue
            stats = self._table.index_stats(index.name)
            if stats is not None:
                counts.append(int(stats.num_unindexed_rows))
        return max(counts)

    def _needs_maintenance(self) -> bool:
        """True once a bound of the module docstring is reached (cheap checks first)."""
        c = self.config
        if c.maintain_every_writes and self._writes - self._writes_at_maintenance >= c.maintain_every_writes:
            return True
        if self.fragment_count() >= c.compact_every_fragments:
            return True
        if c.maintain_unindexed_rows and self.unindexed_rows() >= c.maintain_unindexed_rows:
            return True
        if self._table.count_rows() < self.ann_min_rows:
            return False
        return not any(tuple(i.columns) == ("vector",) for i in self._table.list_indices())

    def _maintain(self, table: Any = None) -> None:
        """Build the ANN index if due, compact and fold new rows into the indices (on ``table``)."""
        table = self._table if table is None else table
        with self._maint_lock:
            writes, before = self._writes, int(table.version)
            data_version = self._maintenance_versions.get(before, before)
            self._ensure_indices(ann=True, table=table)
            table.optimize()
            self._writes_at_maintenance = writes
            if self._writes == writes:  # nothing was written meanwhile: this version holds the same KIs
                self._maintenance_versions[int(table.version)] = data_version
            self._sync_files()

    def _background_maintain(self) -> None:
        """The compactor's run: :meth:`_maintain` on a table handle of its own, without the write lock.

        LanceDB serialises the operations of one table handle, so compacting through the writer's
        handle would block its next upsert; a second handle does not. A concurrent write wins the
        commit and this raises a retryable conflict, which the compactor retries.
        """
        if self._maint_table is None:
            import lancedb

            self._maint_table = lancedb.connect(str(self.path)).open_table(self.config.table)
        else:
            self._maint_table.checkout_latest()
        self._maintain(self._maint_table)
        self._stale_view = True  # the writer's handle moves to the compacted version on its next use

    def _refresh_view(self) -> None:
        if self._stale_view:
            self._stale_view = False
            self._table.checkout_latest()  # type: ignore[no-untyped-call]  # lancedb leaves it untyped

    def optimize(self) -> None:
        """Compact fragments, build the ANN index if due and fold new rows into the indices, now.

        Synchronous and exclusive (holds the write lock): call it after a bulk load so the first
        queries are fast. Routine compaction happens in the background (see the module docstring).
        """
        with self._write_lock:
            self._maintain()
            self._compactor.cancel_pending()

    @property
    def compaction(self) -> CompactionStats:
        """What the background compactor did: runs, preempted attempts, last duration."""
        return self._compactor.stats

    def wait_for_maintenance(self, timeout: float | None = None) -> bool:
        """Block until no background compaction is pending (True) or ``timeout`` s pass (False).

        On True, this instance reads the compacted version from then on.
        """
        done = self._compactor.wait(timeout)
        if done:
            with self._write_lock:
                self._refresh_view()
        return done

    def _after_write(self) -> None:
        """Bookkeeping after a committed write (caller holds the write lock)."""
        self._writes += 1
        self._compactor.wrote()
        self._refresh_view()
        self._sync_files()

    # -- writes -------------------------------------------------------------------------------
    def upsert(self, kis: Sequence[KI]) -> WriteResult:
        """Insert or replace KIs by id, in committed batches of ``write_batch_size``.

        Invalid KIs and batches the engine rejects are reported in ``failed``; the rest are written.
        """
        failed: list[WriteFailure] = []
        good: dict[str, KI] = {}
        copies: dict[str, int] = {}  # valid submissions per id: all count as indexed or all as failed
        for ki in kis:
            try:
                v = validate_ki(ki)
                sql_quote(v.id)
                for t in (*v.tags, *v.evidence_doc_ids):
                    sql_quote(t)
            except (ValidationError, StoreError, AttributeError, TypeError) as e:
                failed.append(WriteFailure(id=str(getattr(ki, "id", "?")), reason=f"invalid KI: {e}"))
                continue
            good.pop(v.id, None)  # last duplicate wins, in submission order
            good[v.id] = v
            copies[v.id] = copies.get(v.id, 0) + 1
        batch_size = self.config.write_batch_size
        items = list(good.values())
        written = 0
        with self._write_lock:
            for start in range(0, len(items), batch_size):
                batch = items[start : start + batch_size]
                try:
                    vectors = self.embedder.embed([k.description for k in batch])
                    data = ki_rows(batch, vectors, self.schema)
                    retry_conflicts(functools.partial(self._merge_rows, data))
                except Exception as e:  # one failed commit reports its batch, never aborts the rest
                    failed.extend(
                        WriteFailure(id=k.id, reason=f"LanceDB write failed: {e}")
                        for k in batch
                        for _ in range(copies[k.id])
                    )
                    continue
                written += sum(copies[k.id] for k in batch)
                self._after_write()
            if written:
                self._ensure_indices()
                self._schedule_maintenance()
        return WriteResult(submitted=len(kis), indexed=written, failed=failed)

    def _schedule_maintenance(self) -> None:
        """Request maintenance when due (caller holds the write lock; a pending request is enough)."""
        if self.config.background_compaction and self._compactor.pending():
            return
        if not self._needs_maintenance():
            return
        if self.config.background_compaction:
            self._compactor.request()
        else:
            self.optimize()

    def delete(self, ki_ids: Sequence[str]) -> int:
        """Delete KIs by id; unknown ids are ignored. Returns how many were deleted."""
        ids = list(dict.fromkeys(ki_ids))
        if not ids:
            return 0
        pred = "id IN (" + ", ".join(sql_quote(i) for i in ids) + ")"
        with self._write_lock:
            n = self._table.count_rows(pred)
            if n:
                retry_conflicts(lambda: self._table.delete(pred))
                self._after_write()
                self._schedule_maintenance()
            return n

    def set_status(self, filters: Filter, status: KIStatus) -> int:
        """Set ``status`` on every KI passing ``filters``; returns how many changed."""
        if status not in STATUSES:
            raise StoreError(f"unknown status {status!r}: use active, stale or expired", backend=self.backend)
        pred = sql_and(filter_to_sql(filters), f"status != {sql_quote(status)}") or "true"
        with self._write_lock:
            result = retry_conflicts(lambda: self._table.update(where=pred, values={"status": status}))
            self._after_write()
            self._schedule_maintenance()
        return int(result.rows_updated)

    def sweep(
        self, now: datetime, stale_after: timedelta, *, retention: Mapping[str, timedelta] | None = None
    ) -> SweepResult:
        """Run the lifecycle sweep with two ``update(where=...)`` calls per distinct window.

        Expire KIs unseen for twice their window or past ``expires_at``, then mark KIs unseen
        for their window stale (window: ``retention[subtype]``, else ``stale_after``). Status only
        moves forward; nothing is deleted.
        """
        now_us = micros(now)
        overrides = {k: v for k, v in (retention or {}).items() if k in SUBTYPES}
        groups: list[tuple[str | None, timedelta]] = [
            (f"subtype = {sql_quote(k)}", v) for k, v in sorted(overrides.items())
        ]
        rest = (
            "subtype NOT IN (" + ", ".join(sql_quote(k) for k in sorted(overrides)) + ")"
            if overrides
            else None
        )
        groups.append((rest, stale_after))
        expired = stale = 0
        with self._write_lock:
            for subtype_pred, window in groups:
                window_us = window // timedelta(microseconds=1)
                expire_pred = sql_and(
                    subtype_pred,
                    f"status != 'expired' AND (last_seen_us < {now_us - 2 * window_us} "
                    f"OR (expires_at_us IS NOT NULL AND expires_at_us <= {now_us}))",
                )
                stale_pred = sql_and(
                    subtype_pred, f"status = 'active' AND last_seen_us < {now_us - window_us}"
                )
                expired += retry_conflicts(
                    functools.partial(self._table.update, where=expire_pred, values={"status": "expired"})
                ).rows_updated
                stale += retry_conflicts(
                    functools.partial(self._table.update, where=stale_pred, values={"status": "stale"})
                ).rows_updated
            self._after_write()
            self._schedule_maintenance()
        return SweepResult(stale=int(stale), expired=int(expired))

    def mark_seen(self, ki_ids: Sequence[str], now: datetime) -> int:
        """Set ``last_seen = now`` and status ``active`` on the given KIs (column update, no re-embedding).

        Returns how many KIs were found. Unknown or unsafe ids are ignored.
        """
        ids = [i for i in dict.fromkeys(ki_ids) if SAFE_VALUE_RE.match(i)]
        n = 0
        with self._write_lock:
            for start in range(0, len(ids), 500):
                pred = "id IN (" + ", ".join(sql_quote(i) for i in ids[start : start + 500]) + ")"
                result = retry_conflicts(
                    functools.partial(
                        self._table.update,
                        where=pred,
                        values={"status": "active", "last_seen_us": micros(now)},
                    )
                )
                n += int(result.rows_updated)
            self._after_write()
            self._schedule_maintenance()
        return n

    def _merge_rows(self, data: Any) -> Any:
        """Upsert ``data`` (an Arrow table of KI rows) by id in one commit."""
        return (
            self._table.merge_insert("id")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute(data)
        )

    def fingerprint(self) -> str:
        """``lancedb:<table folder>@<version>``: the table version moves on every commit.

        Versions made by this instance's own compaction (:meth:`optimize`) map back to the data
        version they compacted, so compaction alone does not change the fingerprint.
        """
        version = int(self._table.version)
        version = self._maintenance_versions.get(version, version)
        return f"lancedb:{self.table_dir}@{version}"

    # -- reads --------------------------------------------------------------------------------
    @staticmethod
    def _to_ki(row: dict[str, Any]) -> KI:
        ki = KI.model_validate(json.loads(row["json"]))
        ki.payload.status = row["status"]  # status lives in its column (update-by-filter)
        seen_us = row.get("last_seen_us")  # so does last_seen (mark_seen)
        if seen_us is not None and micros(ki.payload.last_seen) != seen_us:
            ki.payload.last_seen = EPOCH + timedelta(microseconds=int(seen_us))
        return ki

    def get(self, ki_id: str) -> KI:
        """Return a copy of one KI; raises DocumentNotFoundError for an unknown id."""
        try:
            pred = f"id = {sql_quote(ki_id)}"
        except StoreError:
            raise DocumentNotFoundError(ki_id, backend=self.backend) from None
        rows = self._table.search().where(pred).select(_ID_COLUMNS).limit(1).to_list()
        if not rows:
            raise DocumentNotFoundError(ki_id, backend=self.backend)
        return self._to_ki(rows[0])

    def _fetch(self, ids: Sequence[str]) -> dict[str, KI]:
        if not ids:
            return {}
        pred = "id IN (" + ", ".join(sql_quote(i) for i in ids) + ")"
        rows = self._table.search().where(pred).select(_ID_COLUMNS).limit(len(ids)).to_list()
        return {r["id"]: self._to_ki(r) for r in rows}

    def count(self, filters: Filter | None = None) -> int:
        """Count KIs passing ``filters`` (all statuses when None)."""
        pred = filter_to_sql(filters)
        return int(self._table.count_rows(pred) if pred else self._table.count_rows())

    def iter_kis(self, filters: Filter | None = None, *, page_size: int = 1000) -> Iterator[KI]:
        """Yield KIs passing ``filters`` (all when None), by id ascending, ``page_size`` per read."""
        from lancedb.query import ColumnOrdering

        base = filter_to_sql(filters)
        last: str | None = None
        while True:
            pred = sql_and(base, f"id > {sql_quote(last)}" if last is not None else None)
            query = self._table.search()
            if pred:
                query = query.where(pred)
            # the order column is always selected: ordering by an unselected column under a
            # scalar-indexed filter fails with "TakeExec requires … _rowid" (LanceDB 0.40)
            rows = (
                query.select(_ID_COLUMNS)
                .order_by([ColumnOrdering(column_name="id", ascending=True)])
                .limit(page_size)
                .to_list()
            )
            for r in rows:
                yield self._to_ki(r)
            if len(rows) < page_size:
                return
            last = rows[-1]["id"]

    def compile(self, plan: QueryPlan) -> dict[str, Any]:
        """The plan as this store runs it: per-branch SQL filters and the RRF settings (JSON-able)."""
        return compile_plan(plan, self.config.table, self.retrieval)

    def search(self, plan: QueryPlan) -> SearchResult:
        """Hybrid tag + BM25 + vector retrieval fused with weighted RRF in Python."""
        t0 = time.perf_counter()
        self._refresh_view()
        r = self.retrieval
        where = filter_to_sql(effective_filter(plan, r))
        n = r.branch_size
        rankings: dict[str, list[str]] = {}
        if self._table.count_rows() > 0:
            if plan.entity_tags:
                rankings["tag"] = branch_tag(self._table, plan, where, n)
            if plan.lexical.strip():
                rankings["lexical"] = self._lexical(plan, where, n)
            if plan.semantic.strip():
                rankings["semantic"] = branch_semantic(
                    self._table, self.embedder.embed([plan.semantic])[0], where, n
                )
        fused = rrf_fuse(rankings, branch_weights(r), r.rrf_k)[: plan.size]
        kis = self._fetch([f.id for f in fused])
        hits = [
            Hit(ki=kis[f.id], score=f.score, rank=rank, branches=f.branches)
            for rank, f in enumerate((f for f in fused if f.id in kis), start=1)
        ]
        return SearchResult(
            hits=hits,
            aggregations=aggregate(h.ki for h in hits),
            compiled=self.compile(plan),
            took_ms=(time.perf_counter() - t0) * 1000,
        )

    def _lexical(self, plan: QueryPlan, where: str | None, n: int) -> list[str]:
        if not self._has_fts:  # another process may have built it since we opened the table
            self._has_fts = fts_state(self._table, "title") != "missing"
            if not self._has_fts:
                return []
        return branch_lexical(self._table, plan, where, n)

    def close(self) -> None:
        """Let a background compaction in progress finish, flush (fsync) and release the table. Idempotent."""
        self._compactor.close()
        with self._write_lock:
            self._sync_files()


def lance_path(cfg: KituneConfig) -> Path:
    """The LanceDB folder of ``cfg``.

    ``store.path`` when the store is LanceDB and it is set, else ``<workdir>/lancedb`` (the
    baseline corpus tables live there whatever the KI store is).
    """
    path = getattr(cfg.store, "path", None)
    return Path(path) if path is not None else Path(cfg.workdir) / "lancedb"


def _section(cfg: KituneConfig) -> LanceStoreConfig:
    if not isinstance(cfg.store, LanceStoreConfig):
        raise ConfigError(
            f"store.type is {cfg.store.type!r}, not lancedb: open it with kitune.retrieval.create_store"
        )
    return cfg.store


def open_lance(cfg: KituneConfig, embedder: Embedder | None = None) -> LanceStore:
    """The LanceDB KI store of ``cfg`` (table ``store.table`` under :func:`lance_path`).

    Raises:
        ConfigError: ``cfg.store`` is not a LanceDB section.
        StoreUnavailableError: the folder cannot be opened.
    """
    return LanceStore(
        lance_path(cfg),
        embedder or create_embedder(cfg.embedder),
        config=_section(cfg),
        retrieval=cfg.retrieval,
    )


def lance_table_exists(cfg: KituneConfig) -> bool:
    """True when ``cfg``'s KI table is on disk (reading must not create an empty one)."""
    return (lance_path(cfg) / f"{_section(cfg).table}.lance").exists()


PLUGINS = {"lancedb": StoreBackend("lancedb", LanceStoreConfig, open_lance, lance_table_exists)}
"""The embedded default backend, registered by :data:`kitune.retrieval.backends.STORES`."""
