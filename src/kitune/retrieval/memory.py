"""Pure-Python, in-process reference stores.

Pure-Python, in-process reference stores: :class:`MemoryStore` (KIs) and
:class:`MemoryCorpusStore` (raw documents).

They implement the contracts in :mod:`kitune.retrieval.base` with the shared ranking code in
:mod:`kitune.retrieval.fusion` and the contract's rules in :mod:`kitune.retrieval.rules`, hold
everything in dicts (nothing on disk), and are what tests
across the project use as a store. Brute force: fine up to tens of thousands of KIs.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from pydantic import ValidationError

from kitune.config import KituneConfig, MemoryStoreConfig, RetrievalConfig
from kitune.errors import ConfigError, DocumentNotFoundError
from kitune.ki import KI, KIStatus
from kitune.retrieval.base import (
    CorpusHit,
    Hit,
    SearchResult,
    StoreBackend,
    SweepResult,
    WriteFailure,
    WriteResult,
)
from kitune.retrieval.embedders import Embedder, HashEmbedder, create_embedder
from kitune.retrieval.fusion import BM25, aggregate, branch_weights, chunk_text, rrf_fuse
from kitune.retrieval.rules import (
    effective_filter,
    group_chunks,
    passes,
    sweep_status,
    tag_forms,
    tag_matches,
    validate_ki,
)
from kitune.schema import Document, Filter, QueryPlan

__all__ = ["PLUGINS", "MemoryCorpusStore", "MemoryStore", "memory_store_exists", "open_memory"]


class MemoryStore:
    """In-process :class:`~kitune.retrieval.base.Store` (reference implementation).

    Branches: *tag* ranks KIs by how many of ``plan.entity_tags`` they carry; *lexical* is BM25
    over titles; *semantic* is cosine between the plan's semantic text and description vectors.
    Filters apply before every branch. Thread-safe (one lock).

    Args:
        embedder: embeds descriptions and semantic queries; default ``HashEmbedder()``.
        retrieval: RRF constant, branch weights, branch size, confidence floor.
    """

    backend = "memory"

    def __init__(self, embedder: Embedder | None = None, retrieval: RetrievalConfig | None = None) -> None:
        self.embedder = embedder or HashEmbedder()
        self.retrieval = retrieval or RetrievalConfig()
        self._kis: dict[str, KI] = {}
        self._vectors: dict[str, np.ndarray] = {}
        self._lock = threading.RLock()
        self._bm25: BM25 | None = None
        self._instance = uuid.uuid4().hex[:12]
        self._generation = 0

    def fingerprint(self) -> str:
        """``memory:<instance>:<writes>``; the counter grows on every write that changes a KI."""
        with self._lock:
            return f"memory:{self._instance}:{self._generation}"

    def optimize(self) -> None:
        """Nothing to compact."""
        return None

    # -- writes -------------------------------------------------------------------------------
    def upsert(self, kis: Sequence[KI]) -> WriteResult:
        """Insert or replace KIs by id.

        Insert or replace KIs by id; the last duplicate in ``kis`` wins. Invalid KIs are
        reported in ``failed`` and never abort the rest.
        """
        good: dict[str, KI] = {}
        failed: list[WriteFailure] = []
        for ki in kis:
            try:
                good[ki.id] = validate_ki(ki)
            except (ValidationError, AttributeError, TypeError) as e:
                failed.append(WriteFailure(id=str(getattr(ki, "id", "?")), reason=f"invalid KI: {e}"))
        # a duplicate id counts once per submission: later copies replace earlier ones
        duplicates = len(kis) - len(failed) - len(good)
        if good:
            vectors = self.embedder.embed([k.description for k in good.values()])
            with self._lock:
                for (ki_id, ki), vec in zip(good.items(), vectors, strict=True):
                    self._kis[ki_id] = ki
                    self._vectors[ki_id] = vec
                self._bm25 = None
                self._generation += 1
        return WriteResult(submitted=len(kis), indexed=len(good) + duplicates, failed=failed)

    def delete(self, ki_ids: Sequence[str]) -> int:
        """Delete KIs by id; unknown ids are ignored. Returns how many were deleted."""
        with self._lock:
            n = 0
            for i in dict.fromkeys(ki_ids):
                if self._kis.pop(i, None) is not None:
                    self._vectors.pop(i, None)
                    n += 1
            if n:
                self._bm25 = None
                self._generation += 1
            return n

    def set_status(self, filters: Filter, status: KIStatus) -> int:
        """Set ``payload.status`` on every KI passing ``filters``; returns how many changed."""
        with self._lock:
            n = 0
            for ki in self._kis.values():
                if passes(filters, ki) and ki.payload.status != status:
                    ki.payload.status = status
                    n += 1
            self._generation += bool(n)
            return n

    def sweep(
        self, now: datetime, stale_after: timedelta, *, retention: Mapping[str, timedelta] | None = None
    ) -> SweepResult:
        """Move KIs forward in their lifecycle (see :func:`sweep_status`); never deletes."""
        stale = expired = 0
        with self._lock:
            for ki in self._kis.values():
                target = sweep_status(ki, now, stale_after, retention)
                if target is not None:
                    ki.payload.status = target
                    stale += target == "stale"
                    expired += target == "expired"
            self._generation += bool(stale or expired)
        return SweepResult(stale=stale, expired=expired)

    def mark_seen(self, ki_ids: Sequence[str], now: datetime) -> int:
        """Set ``last_seen = now`` and status ``active`` on the given KIs; returns how many exist."""
        with self._lock:
            n = 0
            for i in dict.fromkeys(ki_ids):
                ki = self._kis.get(i)
                if ki is not None:
                    ki.payload.last_seen = now
                    ki.payload.status = "active"
                    n += 1
            self._generation += bool(n)
            return n

    # -- reads --------------------------------------------------------------------------------
    def get(self, ki_id: str) -> KI:
        """Return a copy of one KI; raises DocumentNotFoundError for an unknown id."""
        with self._lock:
            ki = self._kis.get(ki_id)
            if ki is None:
                raise DocumentNotFoundError(ki_id, backend=self.backend)
            return ki.model_copy(deep=True)

    def count(self, filters: Filter | None = None) -> int:
        """Count KIs passing ``filters`` (all statuses when None)."""
        with self._lock:
            if filters is None:
                return len(self._kis)
            return sum(1 for ki in self._kis.values() if passes(filters, ki))

    def iter_kis(self, filters: Filter | None = None) -> Iterator[KI]:
        """Yield copies of KIs passing ``filters`` (all when None), by id ascending."""
        with self._lock:
            ids = sorted(i for i, ki in self._kis.items() if filters is None or passes(filters, ki))
        for i in ids:
            with self._lock:
                ki = self._kis.get(i)
                copy = ki.model_copy(deep=True) if ki is not None else None
            if copy is not None:
                yield copy

    def compile(self, plan: QueryPlan) -> dict[str, Any]:
        """The plan as this store runs it (a JSON-able dict)."""
        r = self.retrieval
        return {
            "backend": self.backend,
            "plan": plan.model_dump(mode="json"),
            "filters": effective_filter(plan, r).model_dump(mode="json"),
            "rrf_k": r.rrf_k,
            "weights": branch_weights(r),
            "branch_size": r.branch_size,
        }

    def search(self, plan: QueryPlan) -> SearchResult:
        """Hybrid tag + BM25 + vector retrieval fused with weighted RRF (see the class doc)."""
        t0 = time.perf_counter()
        r = self.retrieval
        flt = effective_filter(plan, r)
        n = r.branch_size
        with self._lock:
            pool = sorted(i for i, ki in self._kis.items() if passes(flt, ki))
            rankings: dict[str, list[str]] = {}
            if plan.entity_tags and pool:
                forms = tag_forms(plan.entity_tags)
                counted = [(i, tag_matches(forms, self._kis[i].tags)) for i in pool]
                counted = [c for c in counted if c[1] > 0]
                counted.sort(key=lambda c: (-c[1], c[0]))
                rankings["tag"] = [i for i, _ in counted[:n]]
            if plan.lexical.strip() and pool:
                if self._bm25 is None:
                    self._bm25 = BM25({i: k.title for i, k in self._kis.items()})
                rankings["lexical"] = [i for i, _ in self._bm25.rank(plan.lexical, pool, limit=n)]
            if plan.semantic.strip() and pool:
                q = self.embedder.embed([plan.semantic])[0]
                matrix = np.stack([self._vectors[i] for i in pool])
                sims = matrix @ q
                order = sorted(range(len(pool)), key=lambda j: (-float(sims[j]), pool[j]))[:n]
                rankings["semantic"] = [pool[j] for j in order]
            fused = rrf_fuse(rankings, branch_weights(r), r.rrf_k)[: plan.size]
            hits = [
                Hit(ki=self._kis[f.id].model_copy(deep=True), score=f.score, rank=rank, branches=f.branches)
                for rank, f in enumerate(fused, start=1)
            ]
        return SearchResult(
            hits=hits,
            aggregations=aggregate(h.ki for h in hits),
            compiled=self.compile(plan),
            took_ms=(time.perf_counter() - t0) * 1000,
        )

    def close(self) -> None:
        """Nothing to flush; idempotent."""
        return None


class MemoryCorpusStore:
    """In-process corpus store.

    In-process :class:`~kitune.retrieval.base.CorpusStore`: documents cut into passages of at
    most ``chunk_chars``, searched by BM25 + cosine, fused with RRF, grouped per document.

    Args:
        embedder: default ``HashEmbedder()``.
        chunk_chars: passage size at indexing time (≥ 20).
        rrf_k: RRF constant.
    """

    backend = "memory"

    def __init__(self, embedder: Embedder | None = None, *, chunk_chars: int = 700, rrf_k: int = 60) -> None:
        self.embedder = embedder or HashEmbedder()
        self.chunk_chars = chunk_chars
        self.rrf_k = rrf_k
        self._docs: dict[str, Document] = {}
        self._chunks: dict[str, tuple[str, str]] = {}  # chunk id -> (docid, text)
        self._vectors: dict[str, np.ndarray] = {}
        self._bm25: BM25 | None = None
        self._lock = threading.RLock()

    def add_documents(self, docs: Sequence[Document]) -> WriteResult:
        """Insert or replace documents by ``docid`` (last duplicate wins)."""
        failed: list[WriteFailure] = []
        good: dict[str, Document] = {}
        for d in docs:
            if not isinstance(d, Document) or not d.docid:
                failed.append(
                    WriteFailure(id=str(getattr(d, "docid", "?")), reason="not a Document with a docid")
                )
            else:
                good[d.docid] = d
        with self._lock:
            for docid, d in good.items():
                for cid in [c for c, (owner, _) in self._chunks.items() if owner == docid]:
                    del self._chunks[cid]
                    self._vectors.pop(cid, None)
                self._docs[docid] = d
                passages = chunk_text(f"{d.title}\n\n{d.text}" if d.title else d.text, self.chunk_chars) or [
                    d.title
                ]
                vecs = self.embedder.embed(passages)
                for n, (p, v) in enumerate(zip(passages, vecs, strict=True)):
                    cid = f"{docid}#{n}"
                    self._chunks[cid] = (docid, p)
                    self._vectors[cid] = v
            self._bm25 = None
        return WriteResult(submitted=len(docs), indexed=len(docs) - len(failed), failed=failed)

    def search(
        self, query: str, *, k: int = 10, snippets_per_hit: int = 3, snippet_chars: int = 700
    ) -> list[CorpusHit]:
        """Search passages and group them per document.

        Return at most ``k`` documents, best first (ties by docid), each with up to
        ``snippets_per_hit`` passages of at most ``snippet_chars``.
        """
        with self._lock:
            if not query.strip() or not self._chunks:
                return []
            if self._bm25 is None:
                self._bm25 = BM25({c: t for c, (_, t) in self._chunks.items()})
            n = max(50, k * snippets_per_hit * 3)
            lexical = [c for c, _ in self._bm25.rank(query, limit=n)]
            ids = sorted(self._chunks)
            sims = np.stack([self._vectors[c] for c in ids]) @ self.embedder.embed([query])[0]
            semantic = [ids[j] for j in sorted(range(len(ids)), key=lambda j: (-float(sims[j]), ids[j]))[:n]]
            fused = rrf_fuse({"lexical": lexical, "semantic": semantic}, {}, self.rrf_k)
            titles = {d: doc.title for d, doc in self._docs.items()}
            return group_chunks(
                [(f.id, f.score) for f in fused],
                self._chunks,
                titles,
                query,
                k=k,
                snippets_per_hit=snippets_per_hit,
                snippet_chars=snippet_chars,
            )

    def get(self, docid: str) -> Document:
        """Return the full document; raises DocumentNotFoundError for an unknown id."""
        with self._lock:
            if docid not in self._docs:
                raise DocumentNotFoundError(docid, backend=self.backend)
            return self._docs[docid]

    def count(self) -> int:
        """Number of documents."""
        with self._lock:
            return len(self._docs)


_SHARED: dict[tuple[str, str], MemoryStore] = {}
_SHARED_LOCK = threading.Lock()


def _key(cfg: KituneConfig) -> tuple[str, str]:
    if not isinstance(cfg.store, MemoryStoreConfig):
        raise ConfigError(
            f"store.type is {cfg.store.type!r}, not memory: open it with kitune.retrieval.create_store"
        )
    return str(cfg.workdir), cfg.store.table


def open_memory(cfg: KituneConfig, embedder: Embedder | None = None) -> MemoryStore:
    """The process's in-memory KI store for ``cfg``'s workdir and ``store.table`` (created on first use).

    Every open of the same workdir and table in one process returns the same store, so an
    extraction and the evaluation after it see the same KIs; nothing survives the process.

    Raises:
        ConfigError: ``cfg.store`` is not a memory section.
    """
    key = _key(cfg)
    with _SHARED_LOCK:
        store = _SHARED.get(key)
        if store is None:
            store = _SHARED[key] = MemoryStore(embedder or create_embedder(cfg.embedder), cfg.retrieval)
        return store


def memory_store_exists(cfg: KituneConfig) -> bool:
    """True when this process opened ``cfg``'s in-memory table before."""
    with _SHARED_LOCK:
        return _key(cfg) in _SHARED


PLUGINS = {"memory": StoreBackend("memory", MemoryStoreConfig, open_memory, memory_store_exists)}
"""The in-process backend, registered by :data:`kitune.retrieval.backends.STORES`."""
