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
from datetime import date
from decimal import Decimal, InvalidOperation

__all__ = [
    "FoldedText",
    "contains_answer",
    "contains_number",
    "exact_match",
    "find_span",
    "fold_map",
    "fold_text",
    "normalize_answer",
    "number_values",
    "parse_date",
    "token_f1",
    "whole_number",
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
# Punctuation that becomes a space: all of _PUNCT except a decimal point between digits and a
# hyphen between letters ("a-ha" stays one word, so its "a" is never read as an article).
_PUNCT_RE = re.compile(
    rf"(?!(?<=\d)\.(?=\d))(?!(?<={_LETTER})-(?={_LETTER}))[{re.escape(''.join(sorted(_PUNCT)))}]"
)
_CURRENCY_BEFORE = r"(?P<cur>us\$|[$€£¥₹₩])?\s?"
_CURRENCY_WORDS = "usd|eur|gbp|jpy|cny|inr|chf|cad|aud|dollars?|euros?|yen"
# A number: ASCII digits, no leading zero (``007`` and ``05`` are codes, kept verbatim), optional
# thousands separators and decimals. It never starts or ends inside a word (``4th``, ``1990s``,
# ``3D``, ``2x``) and is never hyphen-joined to a word (``B-52``, ``7-Eleven``).
_NUMBER = re.compile(
    rf"{_CURRENCY_BEFORE}(?<![\w.,])(?<!\w-)"
    r"(?P<num>(?:[1-9][0-9]{0,2}(?:,[0-9]{3})+|[1-9][0-9]*|0)(?:\.[0-9]+)?)(?![\d]|[.,]\d)"
    r"(?:\s?(?P<suffix>bn|mn|k|m|b)(?![\w]))?"
    r"(?:\s+(?P<scale>thousand|million|billion|trillion)s?(?![\w]))?"
    r"(?:\s?(?P<pct>%|percent(?![\w])|per\s+cent(?![\w])|pct(?![\w])))?"
    rf"(?:\s?(?P<code>{_CURRENCY_WORDS})(?![\w]))?"
    r"(?!\w|-\w)"
)
_NUMBER_ANY_CASE = re.compile(_NUMBER.pattern, re.IGNORECASE)
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
_CURRENCIES = {
    "$": "USD",
    "us$": "USD",
    "usd": "USD",
    "dollar": "USD",
    "dollars": "USD",
    "€": "EUR",
    "eur": "EUR",
    "euro": "EUR",
    "euros": "EUR",
    "£": "GBP",
    "gbp": "GBP",
    "¥": "JPY",
    "jpy": "JPY",
    "yen": "JPY",
    "cny": "CNY",
    "₹": "INR",
    "inr": "INR",
    "₩": "KRW",
    "chf": "CHF",
    "cad": "CAD",
    "aud": "AUD",
}
_CONFLICT = "conflict"
_NUMBER_TOKEN = re.compile(r"^\d+(?:\.\d+)?$")
_YES_NO = frozenset({"yes", "no", "noanswer"})


def _number_value(m: re.Match[str]) -> str:
    value = Decimal(m.group("num").replace(",", ""))
    suffix = m.group("suffix")
    if suffix:
        suffix = suffix.lower()
    has_currency = bool(m.group("cur") or m.group("code"))
    exponent = 0
    if suffix and (has_currency or suffix in ("bn", "mn")):
        exponent += _SCALES[suffix]
        suffix = None
    if m.group("scale"):
        exponent += _SCALES[m.group("scale").lower()]
    text = format((value.scaleb(exponent)).normalize(), "f")
    if suffix and m.start("suffix") > m.end("num"):  # "3 m" is a number and a unit: two tokens
        return f" {text} {suffix} "
    return f" {text}{suffix or ''} "


def _number_unit(m: re.Match[str]) -> str | None:
    """The one unit of a number phrase: a currency code, ``%``, None, or ``conflict``."""
    units = {_CURRENCIES[g.lower()] for g in (m.group("cur"), m.group("code")) if g}
    if m.group("pct"):
        units.add("%")
    if len(units) > 1:
        return _CONFLICT
    return units.pop() if units else None


def whole_number(text: str) -> tuple[str, str | None] | None:
    """``(value, unit)`` when the WHOLE answer is one number phrase, else None.

    A number phrase is :data:`_NUMBER`: optional currency symbol, digits with optional thousands
    separators and decimals, optional scale word or suffix, optional percent mark, optional
    currency code — and nothing else (a trailing full stop is allowed). ``"1.5 million"`` →
    ``("1500000", None)``; ``"$2,000"`` → ``("2000", "USD")``; ``"€2,000"`` → ``("2000", "EUR")``;
    ``"4th"``, ``"Apollo 11"``, ``"007"`` → None. Unit ``conflict`` means two different units.
    """
    s = fold_text(text).lower().strip()
    s = s[:-1].rstrip() if s.endswith(".") else s
    m = _NUMBER.fullmatch(s)
    if m is None:
        return None
    value = _number_value(m).strip()
    if not _NUMBER_TOKEN.match(value):  # an unscaled suffix (``5k``, ``100m``) is not a value
        return None
    return value, _number_unit(m)


def _same_whole_number(a: tuple[str, str | None], b: tuple[str, str | None]) -> bool:
    """Equal values, and units that agree (a missing unit matches any; ``conflict`` matches none)."""
    if _CONFLICT in (a[1], b[1]):
        return False
    return a[0] == b[0] and (a[1] is None or b[1] is None or a[1] == b[1])


def _collapse_abbreviation(m: re.Match[str]) -> str:
    return "".join(ch for ch in m.group(0) if ch not in ". \t")


def normalize_answer(text: str) -> str:
    """Normalise an answer for exact match / token F1.

    Steps, applied identically to gold and prediction, and repeated until the text no longer
    changes, so the result is idempotent (``normalize_answer(normalize_answer(x)) ==
    normalize_answer(x)``, a property test): one pass can expose a new word to an earlier step
    (``"x_1.0"`` → ``"x 1.0"`` → ``"x 1"``; ``"b-52.50"`` → ``"b 52.5"``). ``"3,05"`` is not a
    number (a comma groups three digits) and ``"05"`` is a code, so it stays ``"3 05"``.

    1. :func:`fold_text` (NFC, widths, ligatures; U+2019, U+2032, U+02BC … all become ``'``);
    2. dotted abbreviations collapse: ``U.S.`` / ``U.S`` → ``US``, ``a.m.`` → ``am``,
       ``A.A. Milne`` → ``AA Milne``, ``J. K. Rowling`` → ``JK Rowling``;
    3. lower-case;
    4. stand-alone numbers become values (policy; never a number inside a word, an ordinal,
       a hyphen-joined name or a leading-zero code: ``19th``, ``B-52``, ``007`` stay):
       thousands separators go (``1,000`` → ``1000``), trailing
       decimal zeros go (``3.50`` → ``3.5``), scale words multiply (``1.5 million`` →
       ``1500000``; ``bn``/``mn`` always, ``k``/``M``/``B`` only next to a currency, since
       ``5K`` or ``100m`` alone are usually distances). A unit letter that is not a scale keeps
       its spacing: ``"3 m"`` stays two tokens ``3 m`` (as the official scripts split it; never
       glued into ``3m``), ``"100m"`` stays one; ``"3 a.m."`` is ``3 am`` (step 2). Currency
       symbols and codes next to a number (``$``, ``US$``, ``€``, ``USD``, ``dollars`` …) are
       dropped, and so are percent marks (``%``, ``percent``, ``per cent``): like the SQuAD
       script, which deletes ``$`` and ``%`` as punctuation, a unit is never the only
       difference that fails an answer, and a fraction is never turned into a percentage
       (``0.5`` ≠ ``50%``);
    5. the articles a/an/the are dropped only where they stand as separate words
       (``A-ha`` keeps its ``a``);
    6. punctuation becomes a space, except apostrophes, decimal points between digits and
       hyphens between letters (``a-ha``, ``jean-paul`` stay one word, as the SQuAD script,
       which deletes the hyphen, keeps them one word; ``B-52`` and ``COVID-19`` split);
       apostrophes at word edges (quotes) go, inside words they stay (``o'neill's``);
       whitespace collapses.

    Args:
        text: an answer string.

    Returns:
        The normalised string (may be empty).
    """
    s = _normalize_once(text)
    for _ in range(_MAX_PASSES):
        again = _normalize_once(s)
        if again == s:
            return s
        s = again
    return s  # pragma: no cover - no input needs more passes (property test in test_text.py)


_MAX_PASSES = 8


def _normalize_once(text: str) -> str:
    s = _ABBREVIATION.sub(_collapse_abbreviation, fold_text(text)).lower()
    s = _NUMBER.sub(_number_value, s)
    s = " ".join(t for t in s.split() if t.strip(string.punctuation + "'") not in _ARTICLES)
    s = _PUNCT_RE.sub(" ", s)
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


# Capitalised words that may stand before a stated number without making it part of a name
# ("In 1990", "About 72"); any other capitalised word before a number names something
# ("Apollo 11", "Boeing 747", "Windows 10"), so that number is not a stated value.
_NUMBER_LEADS = frozenset(
    "in on at by about around approximately roughly nearly almost over under since from until "
    "circa only exactly just some total answer it is was were are the and or of to than more less "
    "up after before".split()
)


def contains_number(text: str, gold: str) -> bool:
    """True when ``gold`` is a whole number and ``text`` states exactly that one value.

    Only stand-alone number phrases of ``text`` count (see :func:`exact_match`): not a number
    inside a word or an ordinal (``4th``, ``1990s``), not one hyphen-joined to a word (``B-52``),
    not a code with a leading zero (``007``), and not one directly after a capitalised word that
    names something (``Apollo 11``, ``Boeing 747``; a capitalised function word such as ``In`` or
    ``About`` is fine). ``"The answer is 72, in total."`` states 72; ``"between 70 and 72"``
    states two values and matches neither. Units agree as in :func:`exact_match`.

    Args:
        text: the prediction (any string).
        gold: the gold answer; a non-number gold returns False.
    """
    want = whole_number(gold)
    if want is None:
        return False
    folded = fold_text(text)
    stated: list[tuple[str, str | None]] = []
    for m in _NUMBER_ANY_CASE.finditer(folded):
        before = re.search(r"([^\W\d_][\w']*)\s*$", folded[: m.start()])
        if before and before.group(1)[0].isupper() and before.group(1).lower() not in _NUMBER_LEADS:
            continue
        value = _number_value(m).strip()
        if _NUMBER_TOKEN.match(value) and (value, _number_unit(m)) not in stated:
            stated.append((value, _number_unit(m)))
    if len({v for v, _ in stated}) != 1:
        return False
    return all(_same_whole_number(got, want) for got in stated)


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

    Number rule: when the WHOLE prediction and the WHOLE gold are each one number phrase
    (optional currency symbol, digits with optional thousands separators and decimals, an
    optional scale word or suffix, optional percent mark, optional currency code), they are
    compared as values with their unit: ``"2,000"`` = ``"2000"``, ``"1.5 million"`` =
    ``"1,500,000"``, ``"$2,000"`` = ``"2,000 dollars"``, but ``"€2,000"`` ≠ ``"$2,000"`` (different
    currencies differ; a side with no unit matches any unit: ``"2,000"`` = ``"$2,000"``). A
    number inside a word or an ordinal is never read as a number (``"4th"`` ≠ ``"4"``,
    ``"1990s"`` ≠ ``"1990"``, ``"B-52"`` ≠ ``"52"``, ``"Apollo 11"`` ≠ ``"11"``), and a digit
    string with a leading zero is a code, not a quantity (``"007"`` ≠ ``"7"``, like the SQuAD
    script). Otherwise the normalised strings must be equal (see :func:`normalize_answer`).

    Args:
        prediction: the predicted answer.
        golds: the gold answer, or the gold answer plus its aliases.
    """
    candidates = [golds] if isinstance(golds, str) else list(golds)
    pred = normalize_answer(prediction)
    pred_number = whole_number(prediction)
    for g in candidates:
        if g is None:
            continue
        gold_number = whole_number(g)
        if pred_number is not None and gold_number is not None:
            if _same_whole_number(pred_number, gold_number):
                return True
        elif pred == normalize_answer(g):
            return True
    return False


def token_f1(prediction: str, golds: list[str] | tuple[str, ...] | str) -> float:
    """Token-level F1 (SQuAD definition) against the best-matching gold.

    HotpotQA's yes/no rule applies: when the normalised gold or prediction is ``yes``, ``no`` or
    ``noanswer``, anything but the identical answer scores 0.0. When both sides are whole
    number phrases (see :func:`exact_match`) the score is all or nothing: 1.0 for the same value
    and unit, else 0.0. Numbers inside words stay one token (``"19th"`` is never ``19 th``).

    Args:
        prediction: the predicted answer.
        golds: the gold answer, or the gold answer plus its aliases.

    Returns:
        The maximum F1 over golds, in 0.0–1.0. Empty vs empty scores 1.0; empty vs non-empty 0.0.
    """
    candidates = [golds] if isinstance(golds, str) else list(golds)
    pred_norm = normalize_answer(prediction)
    pred_tokens = pred_norm.split()
    pred_number = whole_number(prediction)
    best = 0.0
    for gold in candidates:
        if gold is None:
            continue
        gold_norm = normalize_answer(gold)
        if (pred_norm in _YES_NO or gold_norm in _YES_NO) and pred_norm != gold_norm:
            continue
        gold_number = whole_number(gold)
        if pred_number is not None and gold_number is not None:
            if _same_whole_number(pred_number, gold_number):
                return 1.0
            continue
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


_MONTHS = {
    name: i + 1
    for i, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        )
    )
    for name in names
}
_MONTH = rf"(?P<month>{'|'.join(sorted(_MONTHS, key=len, reverse=True))})\.?"
_DAY = r"(?P<day>[0-9]{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>[0-9]{4})"
_DATE_FORMS = (
    re.compile(r"(?P<year>[0-9]{4})-(?P<mon>[0-9]{2})-(?P<day>[0-9]{2})"),
    re.compile(rf"(?:the\s+)?{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}"),
    re.compile(rf"{_MONTH}\s+{_DAY},?\s+{_YEAR}"),
)


def parse_date(text: str) -> date | None:
    """The calendar date when the WHOLE answer is a full date in one of the documented forms.

    Forms (English month names or their abbreviations, any case, an optional trailing full
    stop): ISO ``2022-05-07``; day first ``7 May 2022``, ``7th May 2022``, ``the 7th of May,
    2022``; month first ``May 7, 2022``, ``May 7th 2022``, ``Sept. 7 2022``. Numeric day/month
    orders (``05/07/2022``) are ambiguous and not read; partial dates (``May 2022``) are not dates.

    Args:
        text: an answer string.

    Returns:
        The date, or None when ``text`` is not one full date or names no real day (``30 February``).
    """
    s = " ".join(fold_text(text).lower().split())
    s = s[:-1] if s.endswith(".") else s
    for form in _DATE_FORMS:
        m = form.fullmatch(s)
        if m is None:
            continue
        groups = m.groupdict()
        month = int(groups["mon"]) if groups.get("mon") else _MONTHS[groups["month"]]
        try:
            return date(int(groups["year"]), month, int(groups["day"]))
        except ValueError:
            return None
    return None
