"""The baseline's corpus store on LanceDB.

The baseline's corpus store on LanceDB: raw documents, chunked into passages, searched with
BM25 (native FTS) + cosine vectors, fused with RRF and grouped per document.

Two tables in one database folder: ``<prefix>docs`` (full documents, for ``get``) and
``<prefix>chunks`` (passages of at most ``chunk_chars`` with their vectors). Durability follows
:class:`kitune.retrieval.lance.LanceStore` (atomic commits, fsync after each write).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa

from kitune.errors import DocumentNotFoundError, StoreError, StoreUnavailableError
from kitune.retrieval.base import CorpusHit, WriteFailure, WriteResult
from kitune.retrieval.embedders import Embedder, HashEmbedder
from kitune.retrieval.fusion import chunk_text, rrf_fuse
from kitune.retrieval.lance_search import fts_config, fts_state
from kitune.retrieval.lance_sql import fsync_path as _fsync_path
from kitune.retrieval.lance_sql import sql_quote, table_names
from kitune.retrieval.rules import group_chunks
from kitune.schema import Document

__all__ = ["LanceCorpusStore"]

_DOC_SCHEMA = pa.schema(
    [
        pa.field("docid", pa.string(), nullable=False),
        pa.field("title", pa.string()),
        pa.field("text", pa.string()),
        pa.field("url", pa.string()),
        pa.field("source", pa.string()),
        pa.field("metadata", pa.string()),
    ]
)


def _chunk_schema(dim: int) -> pa.Schema:
    return pa.schema(
        [
            pa.field("chunk_id", pa.string(), nullable=False),
            pa.field("docid", pa.string()),
            pa.field("text", pa.string()),
            pa.field("vector", pa.list_(pa.float32(), dim)),
        ]
    )


class LanceCorpusStore:
    """LanceDB :class:`~kitune.retrieval.base.CorpusStore`.

    Args:
        path: database folder (created if missing).
        embedder: embeds passages and queries.
        chunk_chars: passage size at indexing time (≥ 20); snippets are cut to ``snippet_chars``
            at search time.
        prefix: table-name prefix, so one folder can hold several corpora.
        rrf_k: RRF constant for fusing BM25 and vector passage rankings.

    Raises:
        StoreUnavailableError: the folder cannot be opened.
    """

    backend = "lancedb"

    def __init__(
        self,
        path: str | Path,
        embedder: Embedder | None = None,
        *,
        chunk_chars: int = 700,
        prefix: str = "corpus_",
        rrf_k: int = 60,
    ) -> None:
        import lancedb

        self.path = Path(path)
        self.embedder = embedder or HashEmbedder()
        self.chunk_chars = chunk_chars
        self.rrf_k = rrf_k
        self._lock = threading.RLock()
        self._chunk_schema = _chunk_schema(self.embedder.dim)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            db = lancedb.connect(str(self.path))
            names = table_names(db)
        except Exception as e:
            raise StoreUnavailableError(
                f"cannot open LanceDB at {self.path}: {e}", backend=self.backend
            ) from e
        docs_name, chunks_name = f"{prefix}docs", f"{prefix}chunks"
        self._docs = (
            db.open_table(docs_name) if docs_name in names else db.create_table(docs_name, schema=_DOC_SCHEMA)
        )
        self._chunks = (
            db.open_table(chunks_name)
            if chunks_name in names
            else db.create_table(chunks_name, schema=self._chunk_schema)
        )
        dim = self._chunks.schema.field("vector").type.list_size
        if dim != self.embedder.dim:
            raise StoreError(
                f"corpus store at {self.path} holds {dim}-dim vectors but the embedder makes "
                f"{self.embedder.dim}-dim ones: set embedder.dim={dim} or use a new path",
                backend=self.backend,
            )
        fts = fts_state(self._chunks, "text")
        self._has_fts = fts != "missing"
        self._fts_current = fts == "current"

    def _sync(self) -> None:
        for sub in self.path.iterdir():
            if sub.is_dir():
                for f in sub.rglob("*"):
                    _fsync_path(f, directory=f.is_dir())
                _fsync_path(sub, directory=True)
        _fsync_path(self.path, directory=True)

    def add_documents(self, docs: Sequence[Document]) -> WriteResult:
        """Insert or replace documents by ``docid`` (last duplicate wins), re-chunking them.

        Documents whose docid has characters outside ``[A-Za-z0-9._:/@+-]`` are reported failed.
        """
        failed: list[WriteFailure] = []
        good: dict[str, Document] = {}
        copies: dict[str, int] = {}
        for d in docs:
            try:
                sql_quote(d.docid)
            except (StoreError, AttributeError, TypeError) as e:
                failed.append(WriteFailure(id=str(getattr(d, "docid", "?")), reason=str(e)))
                continue
            good.pop(d.docid, None)
            good[d.docid] = d
            copies[d.docid] = copies.get(d.docid, 0) + 1
        if not good:
            return WriteResult(submitted=len(docs), indexed=0, failed=failed)
        chunk_rows: dict[str, list[object]] = {n: [] for n in self._chunk_schema.names}
        for d in good.values():
            passages = chunk_text(f"{d.title}\n\n{d.text}" if d.title else d.text, self.chunk_chars) or [
                d.title or " "
            ]
            vecs = self.embedder.embed(passages)
            for n, (p, v) in enumerate(zip(passages, vecs, strict=True)):
                chunk_rows["chunk_id"].append(f"{d.docid}#{n}")
                chunk_rows["docid"].append(d.docid)
                chunk_rows["text"].append(p)
                chunk_rows["vector"].append(np.asarray(v, dtype=np.float32))
        doc_rows = pa.Table.from_pylist(
            [
                {
                    "docid": d.docid,
                    "title": d.title,
                    "text": d.text,
                    "url": d.url,
                    "source": d.source,
                    "metadata": json.dumps(d.metadata, sort_keys=True),
                }
                for d in good.values()
            ],
            schema=_DOC_SCHEMA,
        )
        ids = "docid IN (" + ", ".join(sql_quote(i) for i in good) + ")"
        with self._lock:
            try:
                self._chunks.delete(ids)
                self._chunks.add(pa.Table.from_pydict(chunk_rows, schema=self._chunk_schema))
                self._docs.merge_insert(
                    "docid"
                ).when_matched_update_all().when_not_matched_insert_all().execute(doc_rows)
            except Exception as e:
                failed.extend(
                    WriteFailure(id=i, reason=f"LanceDB write failed: {e}")
                    for i in good
                    for _ in range(copies[i])
                )
                return WriteResult(submitted=len(docs), indexed=0, failed=failed)
            self._ensure_indices()
            self._sync()
        return WriteResult(submitted=len(docs), indexed=sum(copies.values()), failed=failed)

    def _ensure_indices(self) -> None:
        from lancedb.index import BTree

        if not self._fts_current:  # missing, or built with an older tokenizer (see FTS_TOKENIZER)
            self._chunks.create_index("text", config=fts_config(), replace=True)
            self._chunks.create_index("docid", config=BTree(), replace=True)
            self._docs.create_index("docid", config=BTree(), replace=True)
            self._has_fts = self._fts_current = True
        elif cast(Any, self._chunks.stats())["fragment_stats"]["num_fragments"] >= 32:
            self._chunks.optimize()
            self._docs.optimize()

    def search(
        self, query: str, *, k: int = 10, snippets_per_hit: int = 3, snippet_chars: int = 700
    ) -> list[CorpusHit]:
        """Search passages and group them per document.

        Return at most ``k`` documents, best first, each with up to ``snippets_per_hit`` passages
        of at most ``snippet_chars`` (BM25 + vector passage rankings fused with RRF).
        """
        from lancedb.query import MatchQuery

        if not query.strip() or self._chunks.count_rows() == 0:
            return []
        n = max(50, k * snippets_per_hit * 3)
        chunks: dict[str, tuple[str, str]] = {}
        lexical: list[str] = []
        match = MatchQuery(query, "text")  # type: ignore[call-arg]  # pydantic defaults
        if self._has_fts:
            rows = (
                self._chunks.search(match, query_type="fts")
                .select(["chunk_id", "docid", "text", "_score"])
                .limit(n)
                .to_list()
            )
            rows.sort(key=lambda r: (-float(r["_score"]), r["chunk_id"]))
            lexical = [r["chunk_id"] for r in rows]
            chunks.update({r["chunk_id"]: (r["docid"], r["text"]) for r in rows})
        vec = self.embedder.embed([query])[0]
        search: Any = self._chunks.search(vec, vector_column_name="vector", query_type="vector")
        rows = (
            search.distance_type("cosine")
            .select(["chunk_id", "docid", "text", "_distance"])
            .limit(n)
            .to_list()
        )
        rows.sort(key=lambda r: (round(float(r["_distance"]), 6), r["chunk_id"]))
        semantic = [r["chunk_id"] for r in rows]
        chunks.update({r["chunk_id"]: (r["docid"], r["text"]) for r in rows})
        fused = rrf_fuse({"lexical": lexical, "semantic": semantic}, {}, self.rrf_k)
        docids = list(dict.fromkeys(chunks[f.id][0] for f in fused))[: max(k, 1) * 4]
        titles = self._titles(docids)
        return group_chunks(
            [(f.id, f.score) for f in fused],
            chunks,
            titles,
            query,
            k=k,
            snippets_per_hit=snippets_per_hit,
            snippet_chars=snippet_chars,
        )

    def _titles(self, docids: Sequence[str]) -> dict[str, str]:
        if not docids:
            return {}
        pred = "docid IN (" + ", ".join(sql_quote(d) for d in docids) + ")"
        rows = self._docs.search().where(pred).select(["docid", "title"]).limit(len(docids)).to_list()
        return {r["docid"]: r["title"] or "" for r in rows}

    def get(self, docid: str) -> Document:
        """Return the full document; raises DocumentNotFoundError for an unknown id."""
        try:
            pred = f"docid = {sql_quote(docid)}"
        except StoreError:
            raise DocumentNotFoundError(docid, backend=self.backend) from None
        rows = self._docs.search().where(pred).limit(1).to_list()
        if not rows:
            raise DocumentNotFoundError(docid, backend=self.backend)
        r = rows[0]
        return Document(
            docid=r["docid"],
            text=r["text"] or "",
            title=r["title"] or "",
            url=r["url"] or "",
            source=r["source"] or "",
            metadata=json.loads(r["metadata"] or "{}"),
        )

    def count(self) -> int:
        """Number of documents."""
        return int(self._docs.count_rows())

    def close(self) -> None:
        """Fsync and release. Idempotent."""
        with self._lock:
            self._sync()
