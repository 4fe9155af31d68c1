"""Text normalisation shared by evidence checks, guardrails and answer scoring.

Two different foldings live here, and each is applied identically to both sides of a
comparison (so it is symmetric and idempotent):

* :func:`fold_text` — *presentation-only* folding for verbatim checks (evidence spans,
  the disambiguation-title guardrail). It never changes words, so a paraphrase still fails
  (case E1 in ``shared/cases/failure-cases.md``). What it folds, and nothing else:

  - canonical composition (NFC), so a decomposed (NFD) document — common from macOS and some
    PDF pipelines — matches a precomposed quote and the other way round;
  - compatibility *width* forms: full-width ASCII (``２０２４年``, ``（``), half-width katakana
    and CJK punctuation (``ｶﾞ`` → ``ガ``), full-/half-width signs (``￥``) — the NFKC mapping
    of those blocks only, so superscripts, fractions, circled digits and ``™`` stay distinct;
  - typographic ligatures U+FB00–U+FB06 (``ﬁ`` → ``fi``, ``ﬂ`` → ``fl`` …) as PDFs emit them;
  - typographic dashes, quotes, apostrophes and ellipses to ASCII; every Unicode whitespace to
    one space (runs collapsed, ends stripped); zero-width characters and soft hyphens removed.

* :func:`normalize_answer` — answer normalisation for EM/F1 (see its docstring for the rules
  on abbreviations, articles, numbers, currency and percentages).

:func:`find_span` locates a quote through an *offset map* from every folded character back to
the original characters it came from, so the span it returns is always an exact slice of the
original document, whatever folding the match needed.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

__all__ = [
    "FoldedText",
    "contains_answer",
    "exact_match",
    "find_span",
    "fold_map",
    "fold_text",
    "normalize_answer",
    "number_values",
    "token_f1",
]

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

# Compatibility blocks folded with their NFKC mapping (and nothing else of NFKC):
_COMPAT_RANGES: tuple[tuple[int, int], ...] = (
    (0xFB00, 0xFB06),  # Latin ligatures ﬀ ﬁ ﬂ ﬃ ﬄ ﬅ ﬆ
    (0xFF01, 0xFF5E),  # full-width ASCII
    (0xFF5F, 0xFFDC),  # full-width brackets, half-width CJK punctuation, katakana, hangul
    (0xFFE0, 0xFFE2),  # full-width ¢ £ ¬ (U+FFE3 ￣ is left: NFKC gives space + macron)
    (0xFFE4, 0xFFE6),  # full-width ¦ ¥ ₩
    (0xFFE8, 0xFFEE),  # half-width arrows and shapes
)


def _fold_plain(ch: str) -> str:
    mapped = _CHAR_MAP.get(ord(ch))
    if mapped is not None:
        return mapped
    return " " if ch.isspace() else ch


def _fold_char(ch: str) -> str:
    cp = ord(ch)
    if cp >= 0xFB00 and any(lo <= cp <= hi for lo, hi in _COMPAT_RANGES):
        return "".join(_fold_plain(c) for c in unicodedata.normalize("NFKC", ch))
    return _fold_plain(ch)


@dataclass(frozen=True)
class FoldedText:
    """A folded text plus, for each folded character, the original characters it came from.

    ``starts[k]:ends[k]`` is the slice of the original text that produced ``text[k]`` (a whole
    cluster: a base character and the combining marks NFC merged into it, or one ligature).
    """

    text: str
    """The folded text (equal to ``fold_text(original)``)."""
    starts: tuple[int, ...]
    """Per folded character: start offset of its source cluster in the original."""
    ends: tuple[int, ...]
    """Per folded character: end offset (exclusive) of its source cluster in the original."""

    def original_span(self, pos: int, length: int) -> tuple[int, int] | None:
        """The original ``(start, end)`` of ``text[pos:pos + length]``.

        None when the slice starts or ends inside a cluster (e.g. ``"i"`` out of ``"ﬁ"``), which is
        not a verbatim match.
        """
        if length < 1 or pos < 0 or pos + length > len(self.text):
            return None
        last = pos + length - 1
        if pos > 0 and (self.starts[pos - 1], self.ends[pos - 1]) == (self.starts[pos], self.ends[pos]):
            return None
        nxt = last + 1
        if nxt < len(self.text) and (self.starts[nxt], self.ends[nxt]) == (
            self.starts[last],
            self.ends[last],
        ):
            return None
        return self.starts[pos], self.ends[last]


def fold_map(text: str) -> FoldedText:
    """Fold ``text`` (see the module docstring) and keep the offset map back to it.

    Args:
        text: any string (the original document).

    Returns:
        :class:`FoldedText` whose ``text`` is ``fold_text(text)``. Linear in ``len(text)``.
    """
    c_start: list[int] = []  # per cluster: original start, end and folded piece
    c_end: list[int] = []
    c_piece: list[str] = []
    for i, ch in enumerate(text):
        piece = _fold_char(ch)
        if ord(ch) >= 0x300 and piece:
            last = len(c_piece) - 1
            while last >= 0 and not c_piece[last]:  # zero-width characters in between
                last -= 1
            if last >= 0:
                joined = c_piece[last] + piece
                composed = unicodedata.normalize("NFC", joined)
                if unicodedata.combining(piece[0]) or composed != joined:
                    c_end[last] = i + 1
                    c_piece[last] = composed
                    del c_start[last + 1 :], c_end[last + 1 :], c_piece[last + 1 :]
                    continue
            piece = unicodedata.normalize("NFC", piece)
        c_start.append(i)
        c_end.append(i + 1)
        c_piece.append(piece)
    out: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    prev_space = True  # strips leading spaces
    for start, end, piece in zip(c_start, c_end, c_piece, strict=True):
        for p in piece:
            if p == " ":
                if prev_space:
                    continue
                prev_space = True
            else:
                prev_space = False
            out.append(p)
            starts.append(start)
            ends.append(end)
    if out and out[-1] == " ":  # strip one trailing space
        out.pop()
        starts.pop()
        ends.pop()
    return FoldedText("".join(out), tuple(starts), tuple(ends))


def fold_text(text: str) -> str:
    """Fold presentation-only characters so honest quotes compare equal.

    Args:
        text: any string.

    Returns:
        The NFC string with width forms and ligatures folded, dashes (U+2010–U+2015, U+2212)
        → ``-``, curly/prime/modifier apostrophes → ``'``, curly double quotes → ``"``, ``…`` →
        ``...``, every Unicode whitespace → one space (runs collapsed, ends stripped),
        zero-width characters removed. Idempotent: ``fold_text(fold_text(s)) == fold_text(s)``.
    """
    return fold_map(text).text


def find_span(document: str, quote: str) -> tuple[int, int] | None:
    """Find ``quote`` verbatim in ``document`` after :func:`fold_text` on both sides.

    Args:
        document: the original document text.
        quote: the evidence span the model claims is verbatim.

    Returns:
        ``(start, end)`` offsets into the *original* ``document``: ``document[start:end]`` is an
        exact substring of the document (with its own accents, widths, ligatures and typographic
        characters) whose folded form equals the folded quote. None when the folded quote is
        empty, not a substring of the folded document, or only matches part of a folded cluster.
        The first occurrence wins.
    """
    needle = fold_text(quote)
    if not needle:
        return None
    folded = fold_map(document)
    pos = folded.text.find(needle)
    while pos >= 0:
        span = folded.original_span(pos, len(needle))
        if span is not None:
            return span
        pos = folded.text.find(needle, pos + 1)
    return None


_LETTER = r"[^\W\d_]"
_ABBREVIATION = re.compile(
    rf"(?<![\w.])(?:(?:{_LETTER}\.\s?)+{_LETTER}\.|(?:{_LETTER}\.)+{_LETTER}(?![\w.]))"
)
_ARTICLES = frozenset({"a", "an", "the"})
_PUNCT = set(string.punctuation) - {"'"}
_CURRENCY_BEFORE = r"(?P<cur>us\$|[$€£¥₹₩])?\s?"
_CURRENCY_WORDS = "usd|eur|gbp|jpy|cny|inr|chf|cad|aud|dollars?|euros?|yen"
_NUMBER = re.compile(
    rf"{_CURRENCY_BEFORE}(?<![\w.,])(?P<num>\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?|\d+(?:\.\d+)?)(?![\d]|[.,]\d)"
    r"(?:\s?(?P<suffix>bn|mn|k|m|b)(?![\w]))?"
    r"(?:\s+(?P<scale>thousand|million|billion|trillion)s?(?![\w]))?"
    r"(?:\s?(?P<pct>%|percent(?![\w])|per\s+cent(?![\w])|pct(?![\w])))?"
    rf"(?:\s?(?P<code>{_CURRENCY_WORDS})(?![\w]))?"
)
_SCALES = {
    "thousand": 3,
    "million": 6,
    "billion": 9,
    "trillion": 12,
    "k": 3,
    "m": 6,
    "mn": 6,
    "b": 9,
    "bn": 9,
}
_NUMBER_TOKEN = re.compile(r"^\d+(?:\.\d+)?$")
_YES_NO = frozenset({"yes", "no", "noanswer"})


def _number_value(m: re.Match[str]) -> str:
    value = Decimal(m.group("num").replace(",", ""))
    suffix = m.group("suffix")
    has_currency = bool(m.group("cur") or m.group("code"))
    exponent = 0
    if suffix and (has_currency or suffix in ("bn", "mn")):
        exponent += _SCALES[suffix]
        suffix = None
    if m.group("scale"):
        exponent += _SCALES[m.group("scale")]
    text = format((value.scaleb(exponent)).normalize(), "f")
    return f" {text}{suffix or ''} "


def _collapse_abbreviation(m: re.Match[str]) -> str:
    return "".join(ch for ch in m.group(0) if ch not in ". \t")


def normalize_answer(text: str) -> str:
    """Normalise an answer for exact match / token F1.

    Steps, applied identically to gold and prediction (idempotent):

    1. :func:`fold_text` (NFC, widths, ligatures; U+2019, U+2032, U+02BC … all become ``'``);
    2. dotted abbreviations collapse: ``U.S.`` / ``U.S`` → ``US``, ``a.m.`` → ``am``,
       ``A.A. Milne`` → ``AA Milne``, ``J. K. Rowling`` → ``JK Rowling``;
    3. lower-case;
    4. numbers become values (policy): thousands separators go (``1,000`` → ``1000``), trailing
       decimal zeros go (``3.50`` → ``3.5``), scale words multiply (``1.5 million`` →
       ``1500000``; ``bn``/``mn`` always, ``k``/``M``/``B`` only next to a currency, since
       ``5K`` or ``100m`` alone are usually distances). Currency symbols and codes next to a
       number (``$``, ``US$``, ``€``, ``USD``, ``dollars`` …) are dropped, and so are percent
       marks (``%``, ``percent``, ``per cent``): like the SQuAD script, which deletes ``$`` and
       ``%`` as punctuation, a unit is never the only difference that fails an answer, and a
       fraction is never turned into a percentage (``0.5`` ≠ ``50%``);
    5. the articles a/an/the are dropped only where they stand as separate words
       (``A-ha`` keeps its ``a``);
    6. punctuation other than apostrophes and decimal points becomes a space; apostrophes at
       word edges (quotes) go, inside words they stay (``o'neill's``); whitespace collapses.

    Args:
        text: an answer string.

    Returns:
        The normalised string (may be empty).
    """
    s = _ABBREVIATION.sub(_collapse_abbreviation, fold_text(text)).lower()
    s = _NUMBER.sub(_number_value, s)
    s = " ".join(t for t in s.split() if t.strip(string.punctuation + "'") not in _ARTICLES)
    s = re.sub(r"(?<=\d)\.(?=\d)", "\x00", s)  # decimal points survive punctuation removal
    s = "".join(" " if ch in _PUNCT else ch for ch in s).replace("\x00", ".")
    s = re.sub(r"(?<![a-z0-9])'|'(?![a-z0-9])", " ", s)
    return " ".join(s.split())


def number_values(text: str) -> list[Decimal]:
    """The distinct numeric values in ``text`` after :func:`normalize_answer`, in order.

    ``"$1.5B"`` → ``[Decimal("1500000000")]``; ``"between 70 and 72"`` → ``[70, 72]``.
    """
    out: list[Decimal] = []
    for token in normalize_answer(text).split():
        if _NUMBER_TOKEN.match(token):
            try:
                value = Decimal(token)
            except InvalidOperation:  # pragma: no cover - the regex admits only decimals
                continue
            if value not in out:
                out.append(value)
    return out


def _numeric_gold(gold: str) -> Decimal | None:
    tokens = normalize_answer(gold).split()
    if len(tokens) == 1 and _NUMBER_TOKEN.match(tokens[0]):
        return Decimal(tokens[0])
    return None


def _same_number(prediction: str, gold: str) -> bool:
    """Number rule: a one-number gold matches a prediction stating exactly that one value.

    ``"The answer is 72, in total."`` matches gold ``72``; two different values never match.
    """
    value = _numeric_gold(gold)
    return value is not None and number_values(prediction) == [value]


def contains_answer(text: str, golds: Iterable[str]) -> bool:
    """True when ``text`` contains a gold answer as whole words, after :func:`normalize_answer`.

    Both sides are normalised the same way; a gold that normalises to nothing never matches.
    """
    hay = f" {normalize_answer(text)} "
    for g in golds:
        n = normalize_answer(g)
        if n and f" {n} " in hay:
            return True
    return False


def exact_match(prediction: str, golds: list[str] | tuple[str, ...] | str) -> bool:
    """Return True when the normalised prediction equals any normalised gold.

    A gold that is a single number also matches a prediction whose only number has the same
    value (see :func:`normalize_answer` for how numbers are read).

    Args:
        prediction: the predicted answer.
        golds: the gold answer, or the gold answer plus its aliases.
    """
    candidates = [golds] if isinstance(golds, str) else list(golds)
    pred = normalize_answer(prediction)
    return any(
        pred == normalize_answer(g) or _same_number(prediction, g) for g in candidates if g is not None
    )


def token_f1(prediction: str, golds: list[str] | tuple[str, ...] | str) -> float:
    """Token-level F1 (SQuAD definition) against the best-matching gold.

    HotpotQA's yes/no rule applies: when the normalised gold or prediction is ``yes``, ``no`` or
    ``noanswer``, anything but the identical answer scores 0.0. A numeric gold matched by
    :func:`exact_match`'s number rule scores 1.0.

    Args:
        prediction: the predicted answer.
        golds: the gold answer, or the gold answer plus its aliases.

    Returns:
        The maximum F1 over golds, in 0.0–1.0. Empty vs empty scores 1.0; empty vs non-empty 0.0.
    """
    candidates = [golds] if isinstance(golds, str) else list(golds)
    pred_norm = normalize_answer(prediction)
    pred_tokens = pred_norm.split()
    best = 0.0
    for gold in candidates:
        if gold is None:
            continue
        gold_norm = normalize_answer(gold)
        if (pred_norm in _YES_NO or gold_norm in _YES_NO) and pred_norm != gold_norm:
            continue
        if _same_number(prediction, gold):
            return 1.0
        gold_tokens = gold_norm.split()
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
