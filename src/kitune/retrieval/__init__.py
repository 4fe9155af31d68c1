"""KI stores and the baseline corpus store.

Build them from config with :func:`create_store` / :func:`create_corpus_store`; tests use
:class:`MemoryStore` / :class:`MemoryCorpusStore` with a :class:`HashEmbedder`. The
Elasticsearch backend is imported lazily (``pip install 'kitune[elasticsearch]'``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kitune.config import ElasticsearchStoreConfig, LanceStoreConfig
from kitune.errors import ConfigError
from kitune.retrieval.base import (
    Aggregations,
    CorpusHit,
    CorpusStore,
    Hit,
    SearchResult,
    Store,
    SweepResult,
    WriteFailure,
    WriteResult,
)
from kitune.retrieval.elasticsearch import ElasticsearchStore
from kitune.retrieval.embedders import Embedder, HashEmbedder, WordLlamaEmbedder, create_embedder
from kitune.retrieval.fusion import aggregate, rrf_fuse
from kitune.retrieval.lance import LanceStore
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
    "SweepResult",
    "WordLlamaEmbedder",
    "WriteFailure",
    "WriteResult",
    "aggregate",
    "create_corpus_store",
    "create_embedder",
    "create_store",
    "lance_path",
    "rrf_fuse",
]


def lance_path(cfg: KituneConfig) -> Path:
    """Return the LanceDB folder for ``cfg``.

    The LanceDB folder: ``store.path`` when the store is LanceDB and it is set, else
    ``<workdir>/lancedb``.
    """
    path = getattr(cfg.store, "path", None)
    return Path(path) if path is not None else Path(cfg.workdir) / "lancedb"


def create_store(cfg: KituneConfig, *, embedder: Embedder | None = None) -> Store:
    """Build the KI store ``cfg.store`` names.

    Args:
        cfg: the whole config (store, embedder, retrieval sections are used).
        embedder: overrides ``cfg.embedder`` (LanceDB only; Elasticsearch embeds server-side).

    Raises:
        ConfigError: unknown store type, or the ``elasticsearch`` extra is not installed.
        StoreUnavailableError: the backend cannot be opened or reached.
    """
    store_cfg = cfg.store
    store_type = store_cfg.type
    if isinstance(store_cfg, LanceStoreConfig):
        return LanceStore(
            lance_path(cfg),
            embedder or create_embedder(cfg.embedder),
            config=store_cfg,
            retrieval=cfg.retrieval,
        )
    if isinstance(store_cfg, ElasticsearchStoreConfig):
        try:
            import elasticsearch  # noqa: F401
        except ImportError as e:
            raise ConfigError(
                "store.type=elasticsearch needs the Elasticsearch client: pip install 'kitune[elasticsearch]'"
            ) from e

        return ElasticsearchStore.from_config(store_cfg, retrieval=cfg.retrieval)
    raise ConfigError(f"unknown store.type {store_type!r}: use lancedb or elasticsearch")


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
