"""Text embedders (protocol, deterministic hashing, offline WordLlama).

Text embedders: the :class:`Embedder` protocol, a deterministic :class:`HashEmbedder` for tests,
and :class:`WordLlamaEmbedder`, the offline default (its model ships inside the ``wordllama`` wheel).

Every embedder returns a ``numpy.float32`` array of shape ``(n, dim)`` whose rows are
L2-normalised (an all-zero row stays zero, e.g. for an empty text), so cosine similarity is a dot
product.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from kitune.errors import ConfigError
from kitune.retrieval.fusion import tokenize

if TYPE_CHECKING:
    from kitune.config import EmbedderConfig

__all__ = ["Embedder", "HashEmbedder", "WordLlamaEmbedder", "create_embedder", "l2_normalize"]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit vectors.

    Implementations are deterministic (same text → same vector) and thread-safe.
    """

    dim: int
    """Vector dimension."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``.

        Returns:
            ``float32`` array of shape ``(len(texts), dim)``, rows L2-normalised (zero rows for
            texts with no content).
        """
        ...


def l2_normalize(matrix: np.ndarray) -> np.ndarray:
    """Return ``matrix`` (shape ``(n, dim)``) as float32 with unit-length rows; zero rows stay zero."""
    m = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: np.ndarray = (m / norms).astype(np.float32, copy=False)
    return out


class HashEmbedder:
    """Deterministic bag-of-features embedder (feature hashing of words and char 3-grams).

    Texts sharing words or word fragments get similar vectors, which is enough for tests and for a
    dependency-free fallback. Words are :func:`~kitune.retrieval.fusion.tokenize` tokens (any
    script, case-folded, CJK as character bigrams), the same as the lexical branch. No global RNG
    is used: each feature's bucket and sign come from a BLAKE2b digest keyed by ``seed``.

    Args:
        dim: vector dimension, ≥ 8.
        seed: changes every feature's bucket; vectors from different seeds are not comparable.

    Raises:
        ConfigError: ``dim`` < 8.
    """

    def __init__(self, dim: int = 256, seed: int = 0) -> None:
        if dim < 8:
            raise ConfigError(f"HashEmbedder dim={dim} is too small: use dim >= 8")
        self.dim = dim
        self.seed = seed
        self._key = str(seed).encode("utf-8")[:64]

    def _features(self, text: str) -> list[tuple[str, float]]:
        words = tokenize(text)
        feats: list[tuple[str, float]] = [("w:" + w, 1.0) for w in words]
        for w in words:
            padded = f"#{w}#"
            feats.extend(("c:" + padded[i : i + 3], 0.5) for i in range(max(1, len(padded) - 2)))
        return feats

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` → ``float32`` array ``(n, dim)``, unit rows (zero rows for empty texts)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for feat, weight in self._features(text):
                digest = hashlib.blake2b(feat.encode("utf-8"), digest_size=8, key=self._key).digest()
                value = int.from_bytes(digest, "little")
                bucket = value % self.dim
                sign = 1.0 if (value >> 63) & 1 else -1.0
                out[row, bucket] += sign * weight
        return l2_normalize(out)


class WordLlamaEmbedder:
    """The offline default: WordLlama static embeddings (model files ship in the wheel).

    ``wordllama`` looks for its tokenizer in a user cache folder; we point ``cache_dir`` at the
    installed package, where both the weights and the tokenizer config live, and forbid downloads.

    Args:
        dim: truncated Matryoshka dimension: 64, 128, 256, 512 or 1024 (the wheel ships 256 only,
            which also serves every smaller dim).

    Raises:
        ConfigError: ``wordllama`` is not installed or its files are missing for ``dim``.
    """

    _lock = threading.Lock()

    def __init__(self, dim: int = 256) -> None:
        root = logging.getLogger()
        level, handlers = root.level, list(root.handlers)
        try:
            import wordllama
            from wordllama import WordLlama
        except ImportError as e:  # pragma: no cover - pinned dependency
            raise ConfigError(
                "wordllama is not installed: pip install wordllama, or set embedder.type=hash"
            ) from e
        finally:
            # wordllama calls logging.basicConfig(level=INFO) at import: that turns on every
            # library's INFO logs (LiteLLM logs each call twice), so undo it.
            root.setLevel(level)
            for h in root.handlers[:]:
                if h not in handlers:
                    root.removeHandler(h)
        package_dir = Path(wordllama.__file__).resolve().parent
        load_dim = 256 if dim <= 256 else dim
        try:
            with self._lock:
                self._model = WordLlama.load(
                    cache_dir=package_dir, disable_download=True, dim=load_dim, trunc_dim=dim
                )
        except Exception as e:
            raise ConfigError(
                f"could not load the WordLlama model (dim={dim}) from {package_dir}: {e}; "
                "use embedder.dim=256 (the shipped size) or embedder.type=hash"
            ) from e
        self.dim = dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` → ``float32`` array ``(n, dim)``, unit rows."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._model.embed(list(texts), norm=False)
        return l2_normalize(np.asarray(vectors)[:, : self.dim])


def create_embedder(cfg: EmbedderConfig) -> Embedder:
    """Build the embedder ``cfg`` names (``wordllama`` or ``hash``).

    Raises:
        ConfigError: the embedder cannot be built (see the class docs).
    """
    if cfg.type == "hash":
        return HashEmbedder(dim=cfg.dim)
    if cfg.type == "wordllama":
        return WordLlamaEmbedder(dim=cfg.dim)
    raise ConfigError(f"unknown embedder.type {cfg.type!r}: use wordllama or hash")
