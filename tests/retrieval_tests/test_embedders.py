"""Embedders: deterministic, unit-norm, similar texts closer than unrelated ones."""

from __future__ import annotations

import numpy as np
import pytest

from kitune.config import EmbedderConfig
from kitune.errors import ConfigError
from kitune.retrieval.embedders import (
    Embedder,
    HashEmbedder,
    WordLlamaEmbedder,
    create_embedder,
    l2_normalize,
)


def test_hash_embedder_is_deterministic_and_unit_norm() -> None:
    e1, e2 = HashEmbedder(dim=64, seed=3), HashEmbedder(dim=64, seed=3)
    a = e1.embed(["Marie Curie was born in Warsaw.", "", "Paris"])
    b = e2.embed(["Marie Curie was born in Warsaw.", "", "Paris"])
    assert a.dtype == np.float32 and a.shape == (3, 64)
    np.testing.assert_array_equal(a, b)
    assert np.linalg.norm(a[0]) == pytest.approx(1.0, abs=1e-5)
    assert np.linalg.norm(a[1]) == 0.0  # empty text → zero row


def test_hash_embedder_seed_changes_vectors_and_similarity_is_meaningful() -> None:
    e = HashEmbedder(dim=256)
    v = e.embed(
        ["Curie born in Warsaw Poland", "Marie Curie was born in Warsaw", "stock prices fell sharply"]
    )
    assert float(v[0] @ v[1]) > float(v[0] @ v[2]) + 0.2
    other = HashEmbedder(dim=256, seed=1).embed(["Curie born in Warsaw Poland"])
    assert not np.allclose(v[0], other[0])


def test_hash_embedder_rejects_tiny_dim() -> None:
    with pytest.raises(ConfigError, match="dim >= 8"):
        HashEmbedder(dim=4)


def test_l2_normalize_keeps_zero_rows() -> None:
    out = l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]]))
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]], rtol=1e-6)


def test_wordllama_loads_offline_and_normalises() -> None:
    e = WordLlamaEmbedder(dim=256)
    assert isinstance(e, Embedder)
    v = e.embed(
        ["The capital of France is Paris.", "Paris is France's capital city.", "quantum chromodynamics"]
    )
    assert v.shape == (3, 256) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-5)
    assert float(v[0] @ v[1]) > float(v[0] @ v[2])
    assert e.embed([]).shape == (0, 256)


def test_create_embedder_dispatches() -> None:
    assert isinstance(create_embedder(EmbedderConfig(type="hash", dim=32)), HashEmbedder)
    assert create_embedder(EmbedderConfig(type="hash", dim=32)).dim == 32
    assert isinstance(create_embedder(EmbedderConfig(type="wordllama", dim=128)), WordLlamaEmbedder)


def test_wordllama_import_leaves_the_root_logger_alone() -> None:
    """wordllama calls logging.basicConfig(level=INFO) at import; that made LiteLLM log every call."""
    import importlib
    import logging
    import sys

    from kitune.retrieval.embedders import WordLlamaEmbedder

    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    for h in saved[1]:  # basicConfig only acts on a root logger without handlers (as in a CLI run)
        root.removeHandler(h)
    root.setLevel(logging.WARNING)
    try:
        for mod in [m for m in sys.modules if m == "wordllama" or m.startswith("wordllama.")]:
            del sys.modules[mod]  # force the import-time basicConfig to run again
        importlib.invalidate_caches()
        WordLlamaEmbedder(dim=64)
        assert (root.level, root.handlers) == (logging.WARNING, [])
    finally:
        root.setLevel(saved[0])
        for h in saved[1]:
            root.addHandler(h)


def test_hash_embedder_sees_every_script() -> None:
    # The old [a-z0-9]+ word pattern gave Cyrillic, Greek and CJK texts an all-zero vector.
    e = HashEmbedder(dim=64)
    v = e.embed(["Москва — столица России", "Ελλάδα", "北京是中国的首都", "中国首都", "Paris is in France"])
    assert [float(np.linalg.norm(row)) for row in v] == pytest.approx([1.0] * 5)
    assert float(v[2] @ v[3]) > float(v[2] @ v[4])
    zurich = e.embed(["Zürich", "ZÜRICH", "z rich"])
    assert np.array_equal(zurich[0], zurich[1])
    assert not np.array_equal(zurich[0], zurich[2])
