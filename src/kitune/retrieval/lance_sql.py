"""SQL and schema helpers of the LanceDB store: the table schema, safe quoting, filters as SQL.

Filters are pushed down as SQL ``where`` strings built only from validated values (statuses and
subtypes from fixed sets, tags by regex, doc ids by a conservative regex), each quoted.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from kitune.errors import StoreError
from kitune.ki import KI
from kitune.retrieval.rules import filter_triples
from kitune.schema import Filter

__all__ = [
    "EPOCH",
    "SAFE_VALUE_RE",
    "STATUSES",
    "SUBTYPES",
    "check_table_schema",
    "filter_to_sql",
    "fsync_path",
    "ki_rows",
    "ki_schema",
    "micros",
    "sql_and",
    "sql_list",
    "sql_quote",
    "table_names",
]

SAFE_VALUE_RE = re.compile(r"^[A-Za-z0-9._:/@+-]{1,256}$")
STATUSES = ("active", "stale", "expired")
SUBTYPES = ("dataset_fact", "disambiguation", "source_description")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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
    if not SAFE_VALUE_RE.match(value):
        raise StoreError(
            f"refusing to put {value!r} into a LanceDB filter: ids, tags and doc ids may only use "
            "A-Z a-z 0-9 . _ : / @ + - (at most 256 chars)",
            backend="lancedb",
        )
    return "'" + value.replace("'", "''") + "'"


def sql_list(values: Sequence[str]) -> str:
    """A SQL list literal of quoted values (see :func:`sql_quote`)."""
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
    if f.statuses and set(f.statuses) != set(STATUSES):
        bad = [s for s in f.statuses if s not in STATUSES]
        if bad:
            raise StoreError(f"unknown status {bad}: use active, stale or expired", backend="lancedb")
        parts.append("status IN (" + ", ".join(sql_quote(s) for s in f.statuses) + ")")
    if f.tags_all:
        parts.append(f"array_has_all(tags, {sql_list(f.tags_all)})")
    if f.tags_any:
        parts.append(f"array_has_any(tags, {sql_list(f.tags_any)})")
    if f.doc_ids:
        parts.append(f"array_has_any(docids, {sql_list(f.doc_ids)})")
    if f.subtypes:
        bad = [s for s in f.subtypes if s not in SUBTYPES]
        if bad:
            raise StoreError(f"unknown subtype {bad}: use one of {', '.join(SUBTYPES)}", backend="lancedb")
        parts.append("subtype IN (" + ", ".join(sql_quote(s) for s in f.subtypes) + ")")
    if f.min_confidence > 0:
        parts.append(f"confidence >= {int(f.min_confidence)}")
    return " AND ".join(f"({p})" for p in parts) or None


def sql_and(*preds: str | None) -> str | None:
    """AND the given predicates (None ones skipped); None when none is left."""
    kept = [p for p in preds if p]
    return " AND ".join(f"({p})" for p in kept) or None


def micros(dt: datetime) -> int:
    """Exact microseconds since the epoch (integer arithmetic: no float rounding)."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - EPOCH) // timedelta(microseconds=1)


def table_names(db: Any) -> set[str]:
    """Every table name of a LanceDB connection, following ``list_tables`` page by page.

    (``table_names()`` is deprecated since LanceDB 0.40 and returns only its first 10 names.)
    """
    names: set[str] = set()
    token: str | None = None
    while True:
        page = db.list_tables(page_token=token)
        names.update(page.tables)
        token = page.page_token
        if not token:
            return names


def fsync_path(path: Path, directory: bool = False) -> None:
    """Fsync one file or folder; errors (e.g. a file removed meanwhile) are ignored."""
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


def check_table_schema(schema: pa.Schema, table: str, path: Path, dim: int) -> None:
    """Refuse a KI table the store cannot use safely.

    Raises:
        StoreError: tags/docids stored as ``list<element: string>`` (silently disables the
            label-list index), or vectors of another size than the embedder's ``dim``.
    """
    for col in ("tags", "docids"):
        field = schema.field(col).type
        if pa.types.is_list(field) and field.value_field.name != "item":
            raise StoreError(
                f"table {table!r} at {path} stores {col} as "
                f"list<{field.value_field.name}: string>, which silently disables the label-list "
                "index; re-create it (delete the folder and run `kitune index` again)",
                backend="lancedb",
            )
    vec = schema.field("vector").type
    if vec.list_size != dim:
        raise StoreError(
            f"table {table!r} at {path} holds {vec.list_size}-dim vectors but the "
            f"embedder makes {dim}-dim ones: set embedder.dim={vec.list_size} or use a "
            "new store path",
            backend="lancedb",
        )


def ki_rows(kis: Sequence[KI], vectors: Any, schema: pa.Schema) -> pa.Table:
    """The table rows of ``kis`` (``vectors``: their description embeddings, same order)."""
    cols: dict[str, list[Any]] = {name: [] for name in schema.names}
    for ki, vec in zip(kis, vectors, strict=True):
        cols["id"].append(ki.id)
        cols["title"].append(ki.title)
        cols["description"].append(ki.description)
        cols["tags"].append(list(ki.tags))
        cols["docids"].append(list(ki.evidence_doc_ids))
        cols["status"].append(ki.payload.status)
        cols["confidence"].append(ki.payload.confidence)
        cols["subtype"].append(ki.payload.subtype)
        cols["last_seen_us"].append(micros(ki.payload.last_seen))
        cols["expires_at_us"].append(micros(ki.payload.expires_at) if ki.payload.expires_at else None)
        cols["json"].append(ki.model_dump_json())
        cols["vector"].append(np.asarray(vec, dtype=np.float32))
    # explicit schema: list<item: string>, never list<element: string> (label-list index)
    return pa.Table.from_pydict(cols, schema=schema)
