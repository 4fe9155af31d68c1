"""Deterministic embedders for tests (re-exported from :mod:`kitune.retrieval.embedders`)."""

from __future__ import annotations

from kitune.retrieval.embedders import Embedder, HashEmbedder, l2_normalize

__all__ = ["Embedder", "HashEmbedder", "l2_normalize"]
