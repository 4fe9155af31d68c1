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
* **Fragments.** Each commit adds a fragment and reads slow down until ``optimize()``: writes go
  in batches of ``write_batch_size`` and the table is compacted once it has
  ``compact_every_fragments`` fragments.
* **Durability.** Lance commits are atomic (a version exists once its manifest is written), so a
  killed process never loses a committed batch and never exposes a half-written one. Lance does
  not fsync, so after every committed batch the new files and their folders are fsync'ed: a
  committed batch also survives power loss once ``upsert`` returns.

Filters are pushed down as SQL ``where`` strings built only from validated values (statuses and
subtypes from fixed sets, tags by regex, doc ids by a conservative regex), each quoted.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import ValidationError

from kitune.config import LanceStoreConfig, RetrievalConfig
from kitune.errors import DocumentNotFoundError, StoreError, StoreUnavailableError
from kitune.ki import KI, KIStatus
from kitune.retrieval.base import Hit, SearchResult, SweepResult, WriteFailure, WriteResult
from kitune.retrieval.embedders import Embedder, HashEmbedder
from kitune.retrieval.fusion import aggregate, branch_weights, rrf_fuse
from kitune.retrieval.memory import effective_filter, filter_triples, tag_forms, tag_matches, validate_ki
from kitune.schema import Filter, QueryPlan

__all__ = ["LanceStore", "filter_to_sql", "ki_schema", "sql_quote"]

_SAFE_VALUE_RE = re.compile(r"^[A-Za-z0-9._:/@+-]{1,256}$")
_STATUSES = ("active", "stale", "expired")
_SUBTYPES = ("dataset_fact", "disambiguation", "source_description")
_ID_COLUMNS = ["id", "json", "status", "last_seen_us"]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ki_schema(dim: int) -> pa.Schema:
    """The KI table schema for embeddings of ``dim`` floats (list fields named ``item``)."""
    strings = pa.list_(pa.field("item", pa.string()))
    return pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("title", pa.string()),
            pa.field("description", pa.string()),
            pa.field("tags", strings),
            pa.field("docids", strings),
            pa.field("status", pa.string()),
            pa.field("confidence", pa.int32()),
            pa.field("subtype", pa.string()),
            pa.field("last_seen_us", pa.int64()),
            pa.field("expires_at_us", pa.int64()),
            pa.field("json", pa.string()),
            pa.field("vector", pa.list_(pa.float32(), dim)),
        ]
    )


def sql_quote(value: str) -> str:
    """Quote a validated value as a SQL string literal.

    Raises:
        StoreError: ``value`` has characters outside ``[A-Za-z0-9._:/@+-]`` or is empty/over 256
            chars (ids, tags and doc ids never need more; LLM text never reaches SQL).
    """
    if not _SAFE_VALUE_RE.match(value):
        raise StoreError(
            f"refusing to put {value!r} into a LanceDB filter: ids, tags and doc ids may only use "
            "A-Z a-z 0-9 . _ : / @ + - (at most 256 chars)",
            backend="lancedb",
        )
    return "'" + value.replace("'", "''") + "'"


def _sql_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(sql_quote(v) for v in values) + "]"


def filter_to_sql(f: Filter | None) -> str | None:
    """Translate a :class:`~kitune.schema.Filter` into a LanceDB SQL ``where`` string.

    Returns:
        The predicate, or None when nothing is filtered.

    Raises:
        StoreError: a status/subtype outside the known sets, or an unsafe tag or doc id.
    """
    if f is None:
        return None
    if any(filter_triples(f)):
        raise StoreError(
            "subject/predicate filters are not supported by the embedded store (its table has no triple "
            "columns): filter by tags or doc ids, or use store.type=elasticsearch",
            backend="lancedb",
        )
    parts: list[str] = []
    if f.statuses and set(f.statuses) != set(_STATUSES):
        bad = [s for s in f.statuses if s not in _STATUSES]
        if bad:
            raise StoreError(f"unknown status {bad}: use active, stale or expired", backend="lancedb")
        parts.append("status IN (" + ", ".join(sql_quote(s) for s in f.statuses) + ")")
    if f.tags_all:
        parts.append(f"array_has_all(tags, {_sql_list(f.tags_all)})")
    if f.tags_any:
        parts.append(f"array_has_any(tags, {_sql_list(f.tags_any)})")
    if f.doc_ids:
        parts.append(f"array_has_any(docids, {_sql_list(f.doc_ids)})")
    if f.subtypes:
        bad = [s for s in f.subtypes if s not in _SUBTYPES]
        if bad:
            raise StoreError(f"unknown subtype {bad}: use one of {', '.join(_SUBTYPES)}", backend="lancedb")
        parts.append("subtype IN (" + ", ".join(sql_quote(s) for s in f.subtypes) + ")")
    if f.min_confidence > 0:
        parts.append(f"confidence >= {int(f.min_confidence)}")
    return " AND ".join(f"({p})" for p in parts) or None


def _and(*preds: str | None) -> str | None:
    kept = [p for p in preds if p]
    return " AND ".join(f"({p})" for p in kept) or None


def _micros(dt: datetime) -> int:
    """Exact microseconds since the epoch (integer arithmetic: no float rounding)."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - _EPOCH) // timedelta(microseconds=1)


def _fsync_path(path: Path, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._db = lancedb.connect(str(self.path), read_consistency_interval=read_consistency)
            names = self._db.table_names()
        except Exception as e:  # lancedb raises plain OSError/RuntimeError here
            raise StoreUnavailableError(
                f"cannot open LanceDB at {self.path}: {e}", backend=self.backend
            ) from e
        name = self.config.table
        if name in names:
            self._table = self._db.open_table(name)
            self._check_schema(self._table.schema)
            self._has_fts = any(tuple(i.columns) == ("title",) for i in self._table.list_indices())
        else:
            self._table = self._db.create_table(name, schema=self.schema)
            self._sync_files()

    # -- housekeeping -------------------------------------------------------------------------
    def _check_schema(self, schema: pa.Schema) -> None:
        for col in ("tags", "docids"):
            field = schema.field(col).type
            if pa.types.is_list(field) and field.value_field.name != "item":
                raise StoreError(
                    f"table {self.config.table!r} at {self.path} stores {col} as "
                    f"list<{field.value_field.name}: string>, which silently disables the label-list "
                    "index; re-create it (delete the folder and run `kitune index` again)",
                    backend=self.backend,
                )
        vec = schema.field("vector").type
        if vec.list_size != self.embedder.dim:
            raise StoreError(
                f"table {self.config.table!r} at {self.path} holds {vec.list_size}-dim vectors but the "
                f"embedder makes {self.embedder.dim}-dim ones: set embedder.dim={vec.list_size} or use a "
                "new store path",
                backend=self.backend,
            )

    @property
    def table_dir(self) -> Path:
        """The table's folder on disk."""
        return self.path / f"{self.config.table}.lance"

    def _sync_files(self) -> None:
        """Fsync every file under the table folder not synced before, then every folder."""
        if not self.fsync:
            return
        root = self.table_dir
        for dirpath, _dirnames, filenames in os.walk(root):
            for fn in filenames:
                full = os.path.join(dirpath, fn)
                if full not in self._synced:
                    _fsync_path(Path(full))
                    self._synced.add(full)
            _fsync_path(Path(dirpath), directory=True)
        _fsync_path(self.path, directory=True)

    def fragment_count(self) -> int:
        """Number of data fragments (grows by one per commit until compaction)."""
        stats: Any = self._table.stats()
        return int(stats["fragment_stats"]["num_fragments"])

    def _ensure_indices(self) -> None:
        rows = self._table.count_rows()
        if rows == 0 or rows == self._indexed_rows:
            return
        from lancedb.index import FTS, Bitmap, BTree, LabelList

        existing = {tuple(i.columns): i.index_type for i in self._table.list_indices()}
        wanted: list[tuple[str, Any]] = [
            ("id", BTree()),
            ("tags", LabelList()),
            ("docids", LabelList()),
            ("status", Bitmap()),
            ("title", FTS(with_position=False)),
        ]
        for col, cfg in wanted:
            if (col,) not in existing:
                self._table.create_index(col, config=cfg, replace=True)
        if rows >= self.ann_min_rows and ("vector",) not in existing:
            self._table.create_index(metric="cosine", vector_column_name="vector", index_type="IVF_HNSW_SQ")
        self._indexed_rows = rows
        self._has_fts = True

    def optimize(self) -> None:
        """Compact fragments and fold new rows into the indices (LanceDB ``optimize()``)."""
        with self._write_lock:
            before = int(self._table.version)
            data_version = self._maintenance_versions.get(before, before)
            self._ensure_indices()
            self._table.optimize()
            self._maintenance_versions[int(self._table.version)] = data_version
            self._sync_files()

    # -- writes -------------------------------------------------------------------------------
    def _rows(self, kis: Sequence[KI]) -> pa.Table:
        vectors = self.embedder.embed([k.description for k in kis])
        cols: dict[str, list[Any]] = {name: [] for name in self.schema.names}
        for ki, vec in zip(kis, vectors, strict=True):
            cols["id"].append(ki.id)
            cols["title"].append(ki.title)
            cols["description"].append(ki.description)
            cols["tags"].append(list(ki.tags))
            cols["docids"].append(list(ki.evidence_doc_ids))
            cols["status"].append(ki.payload.status)
            cols["confidence"].append(ki.payload.confidence)
            cols["subtype"].append(ki.payload.subtype)
            cols["last_seen_us"].append(_micros(ki.payload.last_seen))
            cols["expires_at_us"].append(_micros(ki.payload.expires_at) if ki.payload.expires_at else None)
            cols["json"].append(ki.model_dump_json())
            cols["vector"].append(np.asarray(vec, dtype=np.float32))
        # explicit schema: list<item: string>, never list<element: string> (label-list index)
        return pa.Table.from_pydict(cols, schema=self.schema)

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
                    data = self._rows(batch)
                    (
                        self._table.merge_insert("id")
                        .when_matched_update_all()
                        .when_not_matched_insert_all()
                        .execute(data)
                    )
                except Exception as e:  # one failed commit reports its batch, never aborts the rest
                    failed.extend(
                        WriteFailure(id=k.id, reason=f"LanceDB write failed: {e}")
                        for k in batch
                        for _ in range(copies[k.id])
                    )
                    continue
                written += sum(copies[k.id] for k in batch)
                self._sync_files()
                if self.fragment_count() >= self.config.compact_every_fragments:
                    self.optimize()
            if written:
                self._ensure_indices()
        return WriteResult(submitted=len(kis), indexed=written, failed=failed)

    def delete(self, ki_ids: Sequence[str]) -> int:
        """Delete KIs by id; unknown ids are ignored. Returns how many were deleted."""
        ids = list(dict.fromkeys(ki_ids))
        if not ids:
            return 0
        pred = "id IN (" + ", ".join(sql_quote(i) for i in ids) + ")"
        with self._write_lock:
            n = self._table.count_rows(pred)
            if n:
                self._table.delete(pred)
                self._sync_files()
            return n

    def set_status(self, filters: Filter, status: KIStatus) -> int:
        """Set ``status`` on every KI passing ``filters``; returns how many changed."""
        if status not in _STATUSES:
            raise StoreError(f"unknown status {status!r}: use active, stale or expired", backend=self.backend)
        pred = _and(filter_to_sql(filters), f"status != {sql_quote(status)}") or "true"
        with self._write_lock:
            result = self._table.update(where=pred, values={"status": status})
            self._sync_files()
        return int(result.rows_updated)

    def sweep(
        self, now: datetime, stale_after: timedelta, *, retention: Mapping[str, timedelta] | None = None
    ) -> SweepResult:
        """Run the lifecycle sweep with two ``update(where=...)`` calls per distinct window.

        Expire KIs unseen for twice their window or past ``expires_at``, then mark KIs unseen
        for their window stale (window: ``retention[subtype]``, else ``stale_after``). Status only
        moves forward; nothing is deleted.
        """
        now_us = _micros(now)
        overrides = {k: v for k, v in (retention or {}).items() if k in _SUBTYPES}
        groups: list[tuple[str | None, timedelta]] = [
            (f"subtype = {sql_quote(k)}", v) for k, v in sorted(overrides.items())
        ]
        rest = (
            "subtype NOT IN (" + ", ".join(sql_quote(k) for k in sorted(overrides)) + ")" if overrides else None
        )
        groups.append((rest, stale_after))
        expired = stale = 0
        with self._write_lock:
            for subtype_pred, window in groups:
                window_us = window // timedelta(microseconds=1)
                expire_pred = _and(
                    subtype_pred,
                    f"status != 'expired' AND (last_seen_us < {now_us - 2 * window_us} "
                    f"OR (expires_at_us IS NOT NULL AND expires_at_us <= {now_us}))",
                )
                stale_pred = _and(subtype_pred, f"status = 'active' AND last_seen_us < {now_us - window_us}")
                expired += self._table.update(where=expire_pred, values={"status": "expired"}).rows_updated
                stale += self._table.update(where=stale_pred, values={"status": "stale"}).rows_updated
            self._sync_files()
        return SweepResult(stale=int(stale), expired=int(expired))

    def mark_seen(self, ki_ids: Sequence[str], now: datetime) -> int:
        """Set ``last_seen = now`` and status ``active`` on the given KIs (column update, no re-embedding).

        Returns how many KIs were found. Unknown or unsafe ids are ignored.
        """
        ids = [i for i in dict.fromkeys(ki_ids) if _SAFE_VALUE_RE.match(i)]
        n = 0
        with self._write_lock:
            for start in range(0, len(ids), 500):
                pred = "id IN (" + ", ".join(sql_quote(i) for i in ids[start : start + 500]) + ")"
                result = self._table.update(
                    where=pred, values={"status": "active", "last_seen_us": _micros(now)}
                )
                n += int(result.rows_updated)
            if n:
                self._sync_files()
        return n

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
        if seen_us is not None and _micros(ki.payload.last_seen) != seen_us:
            ki.payload.last_seen = _EPOCH + timedelta(microseconds=int(seen_us))
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
            pred = _and(base, f"id > {sql_quote(last)}" if last is not None else None)
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
        r = self.retrieval
        where = filter_to_sql(effective_filter(plan, r))
        every = [form for pair in tag_forms(plan.entity_tags) for form in pair]
        tag_pred = _and(where, f"array_has_any(tags, {_sql_list(every)})") if plan.entity_tags else None
        return {
            "backend": self.backend,
            "table": self.config.table,
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

    def _branch_tag(self, plan: QueryPlan, where: str | None, n: int) -> list[str]:
        from lancedb.query import ColumnOrdering

        forms = tag_forms(plan.entity_tags)
        every = [form for pair in forms for form in pair]
        pred = _and(where, f"array_has_any(tags, {_sql_list(every)})")
        assert pred is not None
        rows = (
            self._table.search()
            .where(pred)
            .select(["id", "tags"])
            .order_by([ColumnOrdering(column_name="id", ascending=True)])
            .limit(max(n * 20, 200))
            .to_list()
        )
        counted = sorted(((tag_matches(forms, r["tags"]), r["id"]) for r in rows), key=lambda c: (-c[0], c[1]))
        return [i for _, i in counted[:n]]

    def _branch_lexical(self, plan: QueryPlan, where: str | None, n: int) -> list[str]:
        from lancedb.query import MatchQuery

        if not self._has_fts:  # another process may have built it since we opened the table
            self._has_fts = any(tuple(i.columns) == ("title",) for i in self._table.list_indices())
            if not self._has_fts:
                return []
        match = MatchQuery(plan.lexical, "title")  # type: ignore[call-arg]  # pydantic defaults
        query = self._table.search(match, query_type="fts")
        if where:
            query = query.where(where, prefilter=True)
        rows = query.select(["id", "_score"]).limit(n).to_list()
        rows.sort(key=lambda r: (-float(r["_score"]), r["id"]))
        return [r["id"] for r in rows]

    def _branch_semantic(self, plan: QueryPlan, where: str | None, n: int) -> list[str]:
        vec = self.embedder.embed([plan.semantic])[0]
        search: Any = self._table.search(vec, vector_column_name="vector", query_type="vector")
        query = search.distance_type("cosine")
        if where:
            query = query.where(where, prefilter=True)
        rows = query.select(["id", "_distance"]).limit(n).to_list()
        rows.sort(key=lambda r: (round(float(r["_distance"]), 6), r["id"]))
        return [r["id"] for r in rows]

    def search(self, plan: QueryPlan) -> SearchResult:
        """Hybrid tag + BM25 + vector retrieval fused with weighted RRF in Python."""
        t0 = time.perf_counter()
        r = self.retrieval
        where = filter_to_sql(effective_filter(plan, r))
        n = r.branch_size
        rankings: dict[str, list[str]] = {}
        if self._table.count_rows() > 0:
            if plan.entity_tags:
                rankings["tag"] = self._branch_tag(plan, where, n)
            if plan.lexical.strip():
                rankings["lexical"] = self._branch_lexical(plan, where, n)
            if plan.semantic.strip():
                rankings["semantic"] = self._branch_semantic(plan, where, n)
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

    def close(self) -> None:
        """Flush (fsync) and release the table. Idempotent."""
        with self._write_lock:
            self._sync_files()
