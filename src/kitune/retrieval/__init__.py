"""KI stores and the baseline corpus store.

Build them from config with :func:`create_store` / :func:`create_corpus_store`; tests use
:class:`MemoryStore` / :class:`MemoryCorpusStore` with a :class:`HashEmbedder`. Which backend
``store.type`` opens is the store registry's business (:mod:`kitune.retrieval.backends`); the
Elasticsearch client is imported only when that backend opens (``pip install 'kitune[elasticsearch]'``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kitune.retrieval.backends import register_store_backend, store_backend, store_exists, store_types
from kitune.retrieval.base import (
    Aggregations,
    CorpusHit,
    CorpusStore,
    Hit,
    SearchResult,
    Store,
    StoreBackend,
    SweepResult,
    WriteFailure,
    WriteResult,
)
from kitune.retrieval.embedders import Embedder, HashEmbedder, WordLlamaEmbedder, create_embedder
from kitune.retrieval.fusion import aggregate, rrf_fuse
from kitune.retrieval.lance import lance_path
from kitune.retrieval.lance_corpus import LanceCorpusStore
from kitune.retrieval.memory import MemoryCorpusStore, MemoryStore

if TYPE_CHECKING:
    from kitune.config import KituneConfig

__all__ = [
    "Aggregations",
    "CorpusHit",
    "CorpusStore",
    "Embedder",
    "HashEmbedder",
    "Hit",
    "MemoryCorpusStore",
    "MemoryStore",
    "SearchResult",
    "Store",
    "StoreBackend",
    "SweepResult",
    "WordLlamaEmbedder",
    "WriteFailure",
    "WriteResult",
    "aggregate",
    "create_corpus_store",
    "create_embedder",
    "create_store",
    "lance_path",
    "register_store_backend",
    "rrf_fuse",
    "store_backend",
    "store_exists",
    "store_types",
]


def create_store(cfg: KituneConfig, *, embedder: Embedder | None = None) -> Store:
    """Build the KI store ``cfg.store`` names, through the store registry (:mod:`kitune.retrieval.backends`).

    Args:
        cfg: the whole config (store, embedder, retrieval sections are used).
        embedder: overrides ``cfg.embedder`` where the backend embeds locally (LanceDB, memory;
            Elasticsearch embeds server-side).

    Raises:
        ConfigError: unknown store type, or the backend's extra is not installed.
        StoreUnavailableError: the backend cannot be opened or reached.
    """
    backend = store_backend(cfg)
    return backend.open(cfg, embedder)


def create_corpus_store(cfg: KituneConfig, *, embedder: Embedder | None = None) -> CorpusStore:
    """Build the baseline corpus store from config.

    Build the baseline corpus store (LanceDB tables ``corpus_docs``/``corpus_chunks`` under
    :func:`lance_path`), with passages of ``retrieval.snippet_chars``.

    Raises:
        StoreUnavailableError: the folder cannot be opened.
    """
    return LanceCorpusStore(
        lance_path(cfg),
        embedder or create_embedder(cfg.embedder),
        chunk_chars=cfg.retrieval.snippet_chars,
        rrf_k=cfg.retrieval.rrf_k,
    )
