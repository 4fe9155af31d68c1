"""Text normalisation shared by evidence checks, guardrails and answer scoring.

Two different foldings live here, and each is applied identically to both sides of a
comparison (so it is symmetric and idempotent):

* :func:`fold_text` — *presentation-only* folding for verbatim checks (evidence spans,
  the disambiguation-title guardrail). It maps typographic dashes, quotes, apostrophes,
  ellipses and exotic whitespace to ASCII, applies NFC and collapses runs of spaces. It never
  changes words, so a paraphrase still fails (case E1 in ``shared/cases/failure-cases.md``).
* :func:`normalize_answer` — SQuAD-style answer normalisation for EM/F1: fold_text, then
  lower-case, drop punctuation (but keep apostrophes inside words), drop articles, drop
  thousands separators (``1,000`` → ``1000``).
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter

__all__ = ["exact_match", "find_span", "fold_text", "normalize_answer", "token_f1"]

_CHAR_MAP: dict[int, str] = {}
for _cp in range(0x2010, 0x2016):  # hyphen, non-breaking hyphen, figure dash, en/em dash, bar
    _CHAR_MAP[_cp] = "-"
_CHAR_MAP[0x2212] = "-"  # minus sign
_CHAR_MAP[0x00AD] = ""  # soft hyphen: invisible
for _cp in (0x2018, 0x2019, 0x201A, 0x201B, 0x02BC, 0x2032, 0x00B4, 0x0060, 0xFF07):
    _CHAR_MAP[_cp] = "'"
for _cp in (0x201C, 0x201D, 0x201E, 0x201F, 0x2033, 0x00AB, 0x00BB, 0xFF02):
    _CHAR_MAP[_cp] = '"'
_CHAR_MAP[0x2026] = "..."
for _cp in (0x200B, 0x200C, 0x200D, 0xFEFF):  # zero-width characters
    _CHAR_MAP[_cp] = ""


def _fold_char(ch: str) -> str:
    mapped = _CHAR_MAP.get(ord(ch))
    if mapped is not None:
        return mapped
    if ch.isspace():
        return " "
    return ch


def _fold_with_offsets(text: str) -> tuple[str, list[int]]:
    """Fold ``text`` and return (folded, offsets) with ``offsets[i]`` = index in ``text``.

    ``offsets`` has ``len(folded) + 1`` entries; the last one is ``len(text)``. NFC is applied
    per character cluster so offsets stay exact for the usual precomposed input.
    """
    out: list[str] = []
    offsets: list[int] = []
    prev_space = True  # strips leading spaces
    for i, ch in enumerate(text):
        piece = unicodedata.normalize("NFC", _fold_char(ch))
        for p in piece:
            if p == " ":
                if prev_space:
                    continue
                prev_space = True
            else:
                prev_space = False
            out.append(p)
            offsets.append(i)
    # Strip one trailing space, if any.
    if out and out[-1] == " ":
        out.pop()
        offsets.pop()
    offsets.append(len(text))
    return "".join(out), offsets


def fold_text(text: str) -> str:
    """Fold presentation-only characters so honest quotes compare equal.

    Args:
        text: any string.

    Returns:
        The NFC string with dashes (U+2010–U+2015, U+2212) → ``-``, curly/prime/modifier
        apostrophes → ``'``, curly double quotes → ``"``, ``…`` → ``...``, every Unicode
        whitespace → one space (runs collapsed, ends stripped), zero-width characters removed.
        Idempotent: ``fold_text(fold_text(s)) == fold_text(s)``.
    """
    return _fold_with_offsets(unicodedata.normalize("NFC", text))[0]


def find_span(document: str, quote: str) -> tuple[int, int] | None:
    """Find ``quote`` verbatim in ``document`` after :func:`fold_text` on both sides.

    Args:
        document: the original document text.
        quote: the evidence span the model claims is verbatim.

    Returns:
        ``(start, end)`` character offsets into the *original* ``document`` such that
        ``document[start:end]`` is the matched slice (with its typographic characters), or
        ``None`` when the folded quote is empty or not a substring of the folded document.
        The first occurrence wins.
    """
    folded_quote = fold_text(quote)
    if not folded_quote:
        return None
    nfc_doc = unicodedata.normalize("NFC", document)
    folded_doc, offsets = _fold_with_offsets(nfc_doc)
    pos = folded_doc.find(folded_quote)
    if pos < 0:
        return None
    start = offsets[pos]
    end = offsets[pos + len(folded_quote) - 1] + 1
    if nfc_doc is not document and nfc_doc != document:
        # NFC changed the document's length; fall back to searching the NFC text's slice.
        sliced = nfc_doc[start:end]
        idx = document.find(sliced)
        if idx >= 0:
            return idx, idx + len(sliced)
    return start, end


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_PUNCT = set(string.punctuation) - {"'"}


def normalize_answer(text: str) -> str:
    """Normalise an answer for exact match / token F1.

    Steps, applied identically to gold and prediction: :func:`fold_text` (so U+2019, U+2032,
    U+02BC … all become ``'``), lower-case, remove thousands separators, replace punctuation
    other than apostrophes with spaces, drop apostrophes at word edges (quotes) but keep them
    inside words (``o'neill's``), drop the articles a/an/the, collapse whitespace.
    Idempotent.

    Args:
        text: an answer string.

    Returns:
        The normalised string (may be empty).
    """
    s = fold_text(text).lower()
    s = _THOUSANDS.sub("", s)
    s = "".join(" " if ch in _PUNCT else ch for ch in s)
    s = re.sub(r"(?<![a-z0-9])'|'(?![a-z0-9])", " ", s)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, golds: list[str] | tuple[str, ...] | str) -> bool:
    """Return True when the normalised prediction equals any normalised gold.

    Args:
        prediction: the predicted answer.
        golds: the gold answer, or the gold answer plus its aliases.
    """
    candidates = [golds] if isinstance(golds, str) else list(golds)
    pred = normalize_answer(prediction)
    return any(pred == normalize_answer(g) for g in candidates if g is not None)


def token_f1(prediction: str, golds: list[str] | tuple[str, ...] | str) -> float:
    """Token-level F1 (SQuAD definition) against the best-matching gold.

    Args:
        prediction: the predicted answer.
        golds: the gold answer, or the gold answer plus its aliases.

    Returns:
        The maximum F1 over golds, in 0.0–1.0. Empty vs empty scores 1.0; empty vs non-empty 0.0.
    """
    candidates = [golds] if isinstance(golds, str) else list(golds)
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for gold in candidates:
        gold_tokens = normalize_answer(gold).split()
        if not pred_tokens or not gold_tokens:
            best = max(best, float(pred_tokens == gold_tokens))
            continue
        common = Counter(pred_tokens) & Counter(gold_tokens)
        same = sum(common.values())
        if same == 0:
            continue
        precision = same / len(pred_tokens)
        recall = same / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best
