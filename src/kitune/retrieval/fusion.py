"""Pieces every backend shares, so all stores rank, fuse, facet and cut snippets the same way.

* :func:`rrf_fuse` — weighted reciprocal rank fusion with a deterministic tie-break by id.
* :func:`aggregate` — facets (by tag, by doc, by entity) over a result list.
* :func:`tokenize`, :class:`BM25` — the lexical scoring the in-process stores use.
* :func:`chunk_text`, :func:`trim_snippet` — passages for the corpus store.
* :func:`branch_weights` — the per-branch RRF weights from :class:`~kitune.config.RetrievalConfig`.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, NamedTuple

import regex

from kitune.retrieval.base import Aggregations
from kitune.text import fold_text

if TYPE_CHECKING:
    from kitune.config import RetrievalConfig
    from kitune.ki import KI

__all__ = [
    "BM25",
    "BRANCHES",
    "Fused",
    "aggregate",
    "branch_weights",
    "chunk_text",
    "rrf_fuse",
    "tokenize",
    "trim_snippet",
]

BRANCHES = ("tag", "lexical", "semantic")
"""Branch names, in the order every backend runs them."""

_TOKEN_RE = regex.compile(r"[\p{L}\p{N}][\p{L}\p{N}\p{M}]*")
"""A token: a letter or digit of any script, then letters, digits and combining marks (Devanagari
vowel signs, Thai tone marks…). Underscore and punctuation split tokens."""

_CJK = r"\p{Han}\p{scx=Hiragana}\p{scx=Katakana}\p{Hangul}"
_CJK_PIECE_RE = regex.compile(rf"([{_CJK}]+)|[^{_CJK}]+")
"""A token's runs of CJK (Han, Hiragana, Katakana incl. ``ー``, Hangul) and of everything else."""


class Fused(NamedTuple):
    """One fused item: ``(id, score, branch_ranks)``."""

    id: str
    score: float
    """Σ weight_b / (k + rank_b) over the branches that returned the id, higher is better (the exact
    sum, computed with :class:`fractions.Fraction`, rounded once to a float)."""
    branches: dict[str, int]
    """Branch name → 1-based rank in that branch."""


def rrf_fuse(rankings: Mapping[str, Sequence[str]], weights: Mapping[str, float], k: int = 60) -> list[Fused]:
    """Weighted reciprocal rank fusion.

    Args:
        rankings: branch name → ids, best first (duplicates after the first are ignored).
        weights: branch name → weight ≥ 0 (missing → 1.0). A weight of 0 keeps the branch's ranks
            in ``branches`` but adds nothing to the score.
        k: the RRF constant (≥ 1) in ``weight / (k + rank)``.

    Returns:
        Every id seen, by score descending, ties broken by id ascending (deterministic). Scores are
        summed exactly (each weight taken as its decimal ``repr``, e.g. ``0.3`` = 3/10), so equal
        fractions tie exactly: ranks (10, 10) and (4, 25) at ``k=10`` both score 1/10 and are
        ordered by id, never by floating-point rounding.

    Raises:
        ValueError: a weight is negative, NaN or infinite (names the branch).
    """
    scores: dict[str, Fraction] = {}
    ranks: dict[str, dict[str, int]] = {}
    for branch, ids in rankings.items():
        raw = float(weights.get(branch, 1.0))
        if not math.isfinite(raw) or raw < 0:
            raise ValueError(f"RRF weight for branch {branch!r} is {raw}: use a finite weight >= 0")
        w = Fraction(repr(raw))
        seen: set[str] = set()
        rank = 0
        for item in ids:
            if item in seen:
                continue
            seen.add(item)
            rank += 1
            scores[item] = scores.get(item, Fraction(0)) + w / (k + rank)
            ranks.setdefault(item, {})[branch] = rank
    ordered = sorted(scores, key=lambda i: (-scores[i], i))
    return [Fused(i, float(scores[i]), ranks[i]) for i in ordered]


def branch_weights(cfg: RetrievalConfig) -> dict[str, float]:
    """Return ``{"tag": …, "lexical": …, "semantic": …}`` from the retrieval config."""
    return {"tag": cfg.tag_weight, "lexical": cfg.lexical_weight, "semantic": cfg.semantic_weight}


def _top(counter: Counter[str]) -> dict[str, int]:
    return dict(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def aggregate(kis: Iterable[KI]) -> Aggregations:
    """Count plain tags, evidence docs and entity slugs over ``kis``.

    Returns:
        :class:`Aggregations` with each mapping ordered by count descending, then key ascending.
        ``by_tag`` skips ``entity:``/``doc:`` tags; ``by_entity`` keys are slugs without the prefix.
    """
    tags: Counter[str] = Counter()
    docs: Counter[str] = Counter()
    entities: Counter[str] = Counter()
    for ki in kis:
        for tag in ki.tags:
            if tag.startswith("entity:"):
                entities[tag[len("entity:") :]] += 1
            elif not tag.startswith("doc:"):
                tags[tag] += 1
        for doc in dict.fromkeys(ki.evidence_doc_ids):
            docs[doc] += 1
    return Aggregations(by_tag=_top(tags), by_doc=_top(docs), by_entity=_top(entities))


def tokenize(text: str) -> list[str]:
    """Split ``text`` into the lexical tokens every in-process store's BM25 uses.

    The text is folded (:func:`~kitune.text.fold_text`: quotes, dashes, whitespace), NFKC-normalised
    and case-folded (``"Straße"`` → ``"strasse"``, full-width ``"ＡＢＣ"`` → ``"abc"``), then split into
    runs of letters, digits and combining marks of any script. Within a run, CJK text (Han,
    Hiragana, Katakana, Hangul), which has no spaces between words, becomes overlapping character
    bigrams (``"北京大学"`` → ``["北京", "京大", "大学"]``; a lone CJK character stays a unigram),
    and the non-CJK rest of the run stays one token (``"東京2020"`` → ``["東京", "2020"]``).

    Args:
        text: any string.

    Returns:
        Tokens in text order (repeats kept), e.g. ``tokenize("Zürich") == ["zürich"]``,
        ``tokenize("Москва")`` == ``["москва"]``.
    """
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", fold_text(text)).casefold())
    tokens: list[str] = []
    for run in _TOKEN_RE.findall(folded):
        if run.isascii():
            tokens.append(run)
            continue
        for piece in _CJK_PIECE_RE.finditer(run):
            part = piece.group()
            if piece.group(1) is None:
                tokens.append(part)
            elif len(part) == 1:
                tokens.append(part)
            else:
                tokens.extend(part[i : i + 2] for i in range(len(part) - 1))
    return tokens


class BM25:
    """Okapi BM25 over a fixed set of texts (``k1=1.2``, ``b=0.75``).

    Args:
        texts: id → text.
    """

    def __init__(self, texts: Mapping[str, str], *, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self._tf: dict[str, Counter[str]] = {i: Counter(tokenize(t)) for i, t in texts.items()}
        self._len = {i: sum(c.values()) for i, c in self._tf.items()}
        self._avg = (sum(self._len.values()) / len(self._len)) if self._len else 0.0
        df: Counter[str] = Counter()
        for c in self._tf.values():
            df.update(c.keys())
        n = len(self._tf)
        self._idf = {t: math.log(1 + (n - d + 0.5) / (d + 0.5)) for t, d in df.items()}

    def rank(
        self, query: str, candidates: Iterable[str] | None = None, limit: int = 50
    ) -> list[tuple[str, float]]:
        """Score ``candidates`` (default: all) against ``query``.

        Returns:
            Up to ``limit`` ``(id, score)`` pairs with score > 0, best first, ties by id ascending.
        """
        terms = list(dict.fromkeys(tokenize(query)))
        terms = [t for t in terms if t in self._idf]
        if not terms:
            return []
        pool = self._tf.keys() if candidates is None else [c for c in candidates if c in self._tf]
        scored: list[tuple[str, float]] = []
        for i in pool:
            tf = self._tf[i]
            norm = self.k1 * (1 - self.b + self.b * self._len[i] / (self._avg or 1.0))
            s = 0.0
            for t in terms:
                f = tf.get(t, 0)
                if f:
                    s += self._idf[t] * f * (self.k1 + 1) / (f + norm)
            if s > 0:
                scored.append((i, s))
        scored.sort(key=lambda p: (-p[1], p[0]))
        return scored[:limit]


def chunk_text(text: str, max_chars: int = 700) -> list[str]:
    """Split text into passages of bounded size.

    Split ``text`` into passages of at most ``max_chars``, cutting at paragraph, sentence or word
    boundaries where possible. Whitespace-only text gives ``[]``.

    Raises:
        ValueError: ``max_chars`` < 20.
    """
    if max_chars < 20:
        raise ValueError(f"chunk max_chars={max_chars} is too small: use at least 20")
    text = text.strip()
    chunks: list[str] = []
    while text:
        if len(text) <= max_chars:
            chunks.append(text)
            break
        window = text[:max_chars]
        cut = -1
        for sep in ("\n\n", "\n", ". ", "? ", "! ", "; ", " "):
            pos = window.rfind(sep)
            if pos >= max_chars // 3:
                cut = pos + len(sep.rstrip()) if sep.strip() else pos
                break
        if cut <= 0:
            cut = max_chars
        chunks.append(text[:cut].strip())
        text = text[cut:].strip()
    return [c for c in chunks if c]


def trim_snippet(passage: str, query: str, max_chars: int) -> str:
    """Cut ``passage`` to at most ``max_chars``, centred on the first query term it contains."""
    if len(passage) <= max_chars:
        return passage
    start = 0
    for term in tokenize(query):
        match = re.search(re.escape(term), passage, flags=re.IGNORECASE)
        if match:
            start = max(0, min(match.start() - max_chars // 3, len(passage) - max_chars))
            break
    return passage[start : start + max_chars]
