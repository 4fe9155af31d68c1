"""Synthetic but realistic KIs for the retrieval benchmarks, and a fast deterministic embedder.

:func:`synthetic_kis` makes ``n`` KIs shaped like the extractor's output: titles of about 80
characters (one sentence ending on the value), descriptions of about 250 characters (2–3
sentences), a subject/predicate/object triple, 1–3 plain tags, ``entity:`` tags for the subject
and object drawn from a Zipf distribution (a few entities are in thousands of KIs, most in a
handful, as in a real extraction) and a ``doc:`` tag (about 10 KIs per document, as in the
published run: 25k docs → 240k KIs). Same ``(n, seed)`` ⇒ the same KIs, in the same order.

:class:`RandomVectorEmbedder` maps each text to a unit vector seeded by a hash of the text: as
fast as a lookup, deterministic, with no semantic structure (the worst case for an ANN index's
clustering). Use it when embedding 250k texts with a real model would dominate the run.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta

import numpy as np

from kitune.ki import KI

__all__ = ["RandomVectorEmbedder", "synthetic_kis", "zipf_weights"]

_SYLLABLES = (
    "ka ri to me la su no vi da ren mor tal ben cor fin gar hel jon kel lis mar nor pel "
    "quin ros sal tem ul vor wen yar zel an el ol ur is ber dor fen gil hom"
).split()

_PREDICATES = (
    ("founded_by", "was founded by"),
    ("located_in", "is located in"),
    ("born_in", "was born in"),
    ("member_of", "is a member of"),
    ("position_held", "held the position of"),
    ("directed_by", "was directed by"),
    ("co_authored_with", "co-authored a paper with"),
    ("married_to", "was married to"),
    ("headquartered_in", "is headquartered in"),
    ("won_award", "won the award"),
    ("part_of", "is part of"),
    ("performed_by", "was performed by"),
)

_PLAIN_TAGS = (
    "person", "organisation", "place", "event", "film", "music", "sport", "politics", "science",
    "history", "award", "company", "city", "river", "book", "election", "university", "war",
)  # fmt: skip

_FILLER = (
    "according to the records of that period",
    "as noted by several contemporary sources",
    "which was later confirmed in an official report",
    "during a period of rapid growth in the region",
    "after a long public debate about its future",
    "following an announcement made earlier that year",
)


def zipf_weights(n: int, s: float = 1.1) -> list[float]:
    """Cumulative Zipf weights for ranks 1..n (``1/rank**s``), for ``random.choices(cum_weights=)``.

    Raises:
        ValueError: ``n`` < 1 or ``s`` <= 0.
    """
    if n < 1 or s <= 0:
        raise ValueError(f"zipf_weights needs n >= 1 and s > 0, got n={n}, s={s}")
    total = 0.0
    cum: list[float] = []
    for rank in range(1, n + 1):
        total += 1.0 / rank**s
        cum.append(total)
    return cum


def _name(rng: random.Random, words: int) -> str:
    parts = []
    for _ in range(words):
        syl = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
        parts.append(syl.capitalize())
    return " ".join(parts)


def _fit(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[: limit - 1].rsplit(" ", 1)[0]
    return cut.rstrip(",;") + "."


def synthetic_kis(
    n: int,
    *,
    seed: int = 0,
    n_entities: int | None = None,
    kis_per_doc: int = 10,
    now: datetime | None = None,
    zipf_s: float = 0.8,
) -> Iterator[KI]:
    """Yield ``n`` synthetic KIs (see the module docstring), deterministic from ``seed``.

    Args:
        n: how many KIs (≥ 0).
        seed: RNG seed (a local ``random.Random``; the global RNG is untouched).
        n_entities: size of the entity vocabulary (default ``max(50, n // 4)``).
        kis_per_doc: KIs sharing one ``doc:`` tag (≥ 1).
        now: ``last_seen`` of the newest KI; ages spread over the 21 days before it, so a
            lifecycle sweep with a 7-day window has stale and expired KIs to mark (UTC; default
            2026-01-01).
        zipf_s: Zipf exponent of entity popularity.

    Yields:
        Valid :class:`KI` objects with distinct ids.
    """
    rng = random.Random(seed)
    ents = n_entities or max(50, n // 4)
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < ents:
        name = _name(rng, rng.choice((1, 2, 2, 3)))
        if name.lower() not in seen:
            seen.add(name.lower())
            names.append(name)
    cum = zipf_weights(ents, zipf_s)
    base = now or datetime(2026, 1, 1, tzinfo=UTC)
    ids: set[str] = set()
    i = 0
    while i < n:
        docid = str(100000 + i // max(1, kis_per_doc))
        subj, obj = rng.choices(names, cum_weights=cum, k=2)
        pred, phrase = rng.choice(_PREDICATES)
        year = rng.randint(1850, 2024)
        place = rng.choice(names)
        title = _fit(f"{subj} {phrase} {obj} in {year}, per records kept in {place}.", 130)
        description = _fit(
            f"{subj} {phrase} {obj} in {year}, {rng.choice(_FILLER)}. "
            f"The relation was documented in {place} and involved {rng.randint(2, 900)} people "
            f"over {rng.randint(1, 40)} years. {obj} is also associated with {rng.choice(names)} "
            f"and {rng.choice(_PLAIN_TAGS)} activities.",
            330,
        )
        tags = rng.sample(_PLAIN_TAGS, rng.randint(1, 3))
        last_seen = base - timedelta(seconds=rng.randint(0, 21 * 86400))
        ki = KI.from_fact(
            docid=docid,
            title=title,
            description=description,
            subject=subj,
            predicate=pred,
            obj=obj,
            evidence=[f"{subj} {phrase} {obj}"],
            confidence=rng.randint(40, 100),
            tags=tags,
            corpus="synthetic",
            now=last_seen,
        )
        if ki.id in ids:  # same (doc, subject, predicate, object) drawn twice: draw again
            continue
        ids.add(ki.id)
        i += 1
        yield ki


class RandomVectorEmbedder:
    """Unit vectors seeded by a BLAKE2b hash of the text (deterministic, no semantics).

    Args:
        dim: vector dimension (≥ 8).
    """

    def __init__(self, dim: int = 256) -> None:
        if dim < 8:
            raise ValueError(f"dim={dim} is too small: use dim >= 8")
        self.dim = dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``float32`` array ``(len(texts), dim)`` with unit rows; same text ⇒ same row."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            seed = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
            vec = np.random.default_rng(seed).standard_normal(self.dim)
            out[row] = vec / np.linalg.norm(vec)
        return out
