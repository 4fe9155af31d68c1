"""create_store / create_corpus_store dispatch and their errors."""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest

import kitune.retrieval as retrieval
from kitune.config import ElasticsearchStoreConfig, EmbedderConfig, KituneConfig
from kitune.errors import ConfigError
from kitune.retrieval import create_corpus_store, create_store, lance_path
from kitune.retrieval.lance import LanceStore
from kitune.retrieval.lance_corpus import LanceCorpusStore


def _cfg(tmp_path: Path, **kw: object) -> KituneConfig:
    return KituneConfig(workdir=tmp_path, embedder=EmbedderConfig(type="hash", dim=16), **kw)  # type: ignore[arg-type]


def test_default_is_lancedb_under_workdir(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    store = create_store(cfg)
    assert isinstance(store, LanceStore) and store.backend == "lancedb"
    assert lance_path(cfg) == tmp_path / "lancedb" and (tmp_path / "lancedb" / "kis.lance").is_dir()
    assert store.embedder.dim == 16
    corpus = create_corpus_store(cfg)
    assert isinstance(corpus, LanceCorpusStore) and corpus.chunk_chars == 700


def test_missing_elasticsearch_extra_names_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def fake_import(name: str, *args: object, **kwargs: object) -> object:
        if name == "elasticsearch" or name.startswith("elasticsearch."):
            raise ImportError("No module named 'elasticsearch'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ConfigError, match=r"pip install 'kitune\[elasticsearch\]'"):
        create_store(_cfg(tmp_path, store=ElasticsearchStoreConfig()))


def test_public_names() -> None:
    assert set(retrieval.__all__) >= {
        "create_store",
        "create_corpus_store",
        "MemoryStore",
        "HashEmbedder",
        "Store",
    }
    for name in retrieval.__all__:
        assert hasattr(retrieval, name), name
