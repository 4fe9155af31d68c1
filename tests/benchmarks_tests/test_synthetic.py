"""The synthetic KI generator and the random-vector embedder: deterministic and realistic in shape."""

from __future__ import annotations

import statistics
from collections import Counter

import numpy as np
import pytest
from _synthetic import RandomVectorEmbedder, synthetic_kis, zipf_weights

from kitune.ki import TITLE_MAX_CHARS


def test_same_seed_same_kis_other_seed_other_kis() -> None:
    a = [k.model_dump_json() for k in synthetic_kis(300, seed=7)]
    b = [k.model_dump_json() for k in synthetic_kis(300, seed=7)]
    c = [k.model_dump_json() for k in synthetic_kis(300, seed=8)]
    assert a == b
    assert a != c


def test_lengths_ids_and_tags_look_like_extracted_kis() -> None:
    kis = list(synthetic_kis(2000, seed=1))
    assert len(kis) == 2000
    assert len({k.id for k in kis}) == 2000
    assert 70 <= statistics.mean(len(k.title) for k in kis) <= 110
    assert 220 <= statistics.mean(len(k.description) for k in kis) <= 300
    assert max(len(k.title) for k in kis) <= TITLE_MAX_CHARS
    assert all(any(t.startswith("entity:") for t in k.tags) for k in kis)
    assert len({k.evidence_doc_ids[0] for k in kis}) == 200  # 10 KIs per document


def test_entity_popularity_is_zipfian() -> None:
    kis = list(synthetic_kis(5000, seed=3))
    counts = Counter(t for k in kis for t in k.tags if t.startswith("entity:"))
    ranked = [c for _, c in counts.most_common()]
    assert ranked[0] > 20 * statistics.median(ranked)  # a heavy head …
    assert statistics.median(ranked) <= 5  # … and a long tail


def test_zipf_weights() -> None:
    assert zipf_weights(3, 1.0) == pytest.approx([1.0, 1.5, 1.5 + 1 / 3])
    with pytest.raises(ValueError):
        zipf_weights(0)


def test_random_vector_embedder_is_deterministic_unit_length() -> None:
    emb = RandomVectorEmbedder(dim=16)
    v = emb.embed(["alpha", "beta", "alpha"])
    assert v.shape == (3, 16) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(v[0], v[2])
    assert not np.allclose(v[0], v[1])
    assert np.array_equal(RandomVectorEmbedder(dim=16).embed(["alpha"])[0], v[0])
