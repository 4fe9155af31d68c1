"""Dialogue documents: turns with ids, chunks on turn boundaries, relative dates, an indexed view.

A dialogue document (LoCoMo layout, one chat session) is a header line followed by one line per
turn::

    Conversation between Caroline and Melanie, session 1 (1:56 pm on 8 May, 2023)
    [D1:3] Caroline: I went to a LGBTQ support group yesterday and it was so powerful.

The turn id ``D<session>:<turn>`` is the natural evidence handle (like a sentence number): an
extractor can cite it, the cited turn's text can be copied verbatim as the evidence span, and a
KI's evidence span can be mapped back to the turns it quotes (:func:`turns_for_span`).
Relative dates are resolved against the session date to a day or a range of days
(:func:`relative_date_range`: "yesterday" said on Monday 8 May 2023 is 7 May 2023, "last
Saturday" 6 May 2023, "last weekend" 6-7 May 2023) and listed *beside* the verbatim turns in
:func:`turn_indexed_view`, never written into them, so an evidence span copied from the view is
still found verbatim in the original document.

Prose documents (no turn lines) are indexed by sentence instead (``S1``, ``S2``, …), so the same
functions work on any corpus.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from kitune.text import find_span

__all__ = [
    "DateRange",
    "Session",
    "Unit",
    "annotate_dates",
    "chunk_session",
    "dialogue_tags",
    "format_date",
    "indexed_units",
    "ki_turn_ids",
    "numbered_turn_view",
    "parse_session",
    "parse_session_date",
    "relative_date_range",
    "resolve_relative_date",
    "text_for_units",
    "turn_indexed_view",
    "turns_for_span",
]

_TURN_LINE = re.compile(r"^\[(D(\d+):(\d+))\]\s*([^:\n]{1,80}?):[ \t]?(.*)$", re.MULTILINE)
_TURN_ID = re.compile(r"\bD(\d+):(\d+)\b")
_TURN_TAG = re.compile(r"^d(\d+)-(\d+)$")
_SENTENCE = re.compile(r"[^.!?\n]+(?:[.!?]+[\"')\]]*|$)")
_HEADER_DATE = re.compile(r"\(([^()]*\d{4})\)\s*$")


@dataclass(frozen=True)
class Unit:
    """One citable unit of a document: a dialogue turn or a prose sentence."""

    unit_id: str
    """``D3:5`` for a turn, ``S4`` (1-based) for a sentence."""
    text: str
    """The unit's text, verbatim (a turn's full line, ``[D3:5] Speaker: text``; a sentence)."""
    start: int
    """Character offset of ``text`` in the document."""
    end: int
    """``document[start:end] == text``."""
    speaker: str = ""
    """The turn's speaker; empty for sentences."""


@dataclass(frozen=True)
class Session:
    """A parsed dialogue session."""

    header: str
    """The text before the first turn (speakers, session number, date), stripped."""
    date_text: str
    """The session date as written (``"1:56 pm on 8 May, 2023"``), empty when unknown."""
    date: date | None
    """The parsed session date, None when missing or unparseable."""
    turns: tuple[Unit, ...]
    """Turns in order; empty when the text has no turn lines."""


_DATE_FORMATS = ("%d %B %Y", "%d %b %Y", "%B %d %Y", "%b %d %Y", "%Y-%m-%d", "%d/%m/%Y")


def parse_session_date(value: str) -> date | None:
    """Parse a session date such as ``"1:56 pm on 8 May, 2023"``, ``"8 May 2023"`` or ``"2023-05-08"``.

    A leading clock time (``"1:56 pm on"``) and commas are ignored.

    Returns:
        The date, or None when ``value`` matches none of the formats (day month year, month day
        year, ISO, day/month/year).
    """
    s = re.sub(r"^\s*\d{1,2}[:.]\d{2}\s*(?:[ap]\.?m\.?)?\s*(?:on\s+)?", "", value.strip(), flags=re.I)
    s = re.sub(r"\s+", " ", s.replace(",", " ")).strip()
    s = re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", s)
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(s, fmt).date()
        except ValueError:
            continue
    return None


def format_date(d: date) -> str:
    """``7 May 2023`` (day without a leading zero, full month name, year)."""
    return f"{d.day} {d:%B %Y}"


def parse_session(text: str, *, date_text: str = "") -> Session:
    """Split a dialogue document into its header and turns.

    Args:
        text: the document text.
        date_text: the session date from the corpus (``Document.metadata["date"]``); when empty,
            a trailing ``(… 2023)`` in the header is used.

    Returns:
        A :class:`Session`; ``turns`` is empty for prose (no ``[D<n>:<m>] Speaker:`` lines).
    """
    turns = tuple(
        Unit(unit_id=m.group(1), text=m.group(0), start=m.start(), end=m.end(), speaker=m.group(4).strip())
        for m in _TURN_LINE.finditer(text)
    )
    header = (text[: turns[0].start] if turns else text.split("\n", 1)[0]).strip()
    if not date_text:
        m = _HEADER_DATE.search(header)
        date_text = m.group(1).strip() if m else ""
    return Session(header=header, date_text=date_text, date=parse_session_date(date_text), turns=turns)


def indexed_units(text: str) -> list[Unit]:
    """The document's citable units: its turns when it is a dialogue, else its sentences ``S1…``.

    Sentences are maximal runs without ``.!?`` or a newline, ended by those marks; blank ones
    are skipped. ``text[u.start:u.end] == u.text`` for every unit.
    """
    turns = parse_session(text).turns
    if turns:
        return list(turns)
    units: list[Unit] = []
    for m in _SENTENCE.finditer(text):
        raw = m.group(0)
        lead = len(raw) - len(raw.lstrip())
        body = raw.strip()
        if body:
            start = m.start() + lead
            units.append(Unit(unit_id=f"S{len(units) + 1}", text=body, start=start, end=start + len(body)))
    return units


def text_for_units(text: str, unit_ids: Iterable[str]) -> str:
    """The cited units' text, verbatim, in document order, joined with a newline.

    For a turn, the text after ``Speaker:`` (what was said), so it can serve as the evidence
    span of a fact citing ``[D3:5]``. Unknown ids are ignored; ``""`` when none is known.
    """
    wanted = set(unit_ids)
    out = []
    for u in indexed_units(text):
        if u.unit_id in wanted:
            out.append(u.text.split(":", 2)[-1].strip() if u.speaker else u.text)
    return "\n".join(out)


def turns_for_span(text: str, span: str) -> list[str]:
    """The ids of the units an evidence span overlaps (matched with :func:`kitune.text.find_span`).

    Returns:
        Unit ids in document order; ``[]`` when the span is not found verbatim.
    """
    found = find_span(text, span)
    if found is None:
        return []
    start, end = found
    return [u.unit_id for u in indexed_units(text) if u.start < end and start < u.end]


def chunk_session(text: str, max_chars: int) -> list[str]:
    """Split a long dialogue on turn boundaries, repeating the header (and so the date) in each chunk.

    Args:
        text: the session text (a prose document is returned whole: use the extractor's own
            splitter for prose).
        max_chars: target chunk size in characters (>= 1). A single turn longer than this gets
            a chunk of its own (turns are never cut).

    Returns:
        Chunks in order; ``[text]`` when it fits or has no turns. Every turn line appears in
        exactly one chunk, verbatim, and each chunk starts with the header line.

    Raises:
        ValueError: ``max_chars`` < 1.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    session = parse_session(text)
    if len(text) <= max_chars or not session.turns:
        return [text]
    head = session.header
    chunks: list[str] = []
    lines: list[str] = []
    size = len(head)
    for turn in session.turns:
        add = len(turn.text) + 1
        if lines and size + add > max_chars:
            chunks.append("\n".join([head, *lines]))
            lines, size = [], len(head)
        lines.append(turn.text)
        size += add
    if lines:
        chunks.append("\n".join([head, *lines]))
    return chunks


_NUMBER = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "a couple of": 2, "couple of": 2,
}  # fmt: skip
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WEEKDAY_ABBR = {
    "mon": 0, "tue": 1, "tues": 1, "wed": 2, "weds": 2, "thu": 3, "thur": 3, "thurs": 3,
    "fri": 4, "sat": 5, "sun": 6,
}  # fmt: skip
_UNIT_RE = r"(day|week|month|year|weekend)s?"
_NUM_RE = r"(\d+|a couple of|couple of|an?|one|two|three|four|five|six|seven|eight|nine|ten)"
# Weekday abbreviations only when capitalised ("last Fri", "Last Tues"): "I last sat down" and
# "the last sun of summer" are not dates.
_ABBR_RE = "|".join(sorted((a.capitalize() for a in _WEEKDAY_ABBR), key=len, reverse=True))
_RELATIVE = re.compile(
    rf"\b(?:(?i:the day before yesterday|day before yesterday|yesterday|today|tonight|tomorrow|last night"
    rf"|this (?:morning|afternoon|evening)"
    rf"|(?:last|this|next|past) (?:week|weekend|month|year|{'|'.join(_WEEKDAYS)})"
    rf"|{_NUM_RE} {_UNIT_RE} ago)"
    rf"|(?i:last|this|next|past) (?:{_ABBR_RE})(?![a-z]))\b",
)


@dataclass(frozen=True)
class DateRange:
    """An inclusive span of calendar days a relative time expression names."""

    start: date
    """First day."""
    end: date
    """Last day (``end >= start``; equal for a single day)."""

    @property
    def is_day(self) -> bool:
        """True when the range is one day."""
        return self.start == self.end

    def __str__(self) -> str:
        """``7 May 2023``; a whole month ``April 2023``; a whole year ``2022``; else a span.

        Spans: ``20-21 May 2023`` (same month), ``29 April - 5 May 2023`` (same year),
        ``26 December 2022 - 1 January 2023``.
        """
        a, b = self.start, self.end
        if a == b:
            return format_date(a)
        if a == date(a.year, 1, 1) and b == date(a.year, 12, 31):
            return str(a.year)
        if a.day == 1 and b == _month_end(a):
            return f"{a:%B %Y}"
        if (a.year, a.month) == (b.year, b.month):
            return f"{a.day}-{format_date(b)}"
        if a.year == b.year:
            return f"{a.day} {a:%B} - {format_date(b)}"
        return f"{format_date(a)} - {format_date(b)}"


def _add_months(d: date, months: int) -> date:
    y, m = divmod(d.month - 1 + months, 12)
    return date(d.year + y, m + 1, 1)


def _month_end(d: date) -> date:
    return _add_months(d, 1) - timedelta(days=1)


def _week_of(d: date) -> DateRange:
    monday = d - timedelta(days=d.weekday())
    return DateRange(monday, monday + timedelta(days=6))


def _weekend_of_week(d: date) -> DateRange:
    saturday = d - timedelta(days=d.weekday()) + timedelta(days=5)
    return DateRange(saturday, saturday + timedelta(days=1))


def _weekday_number(word: str) -> int | None:
    if word in _WEEKDAYS:
        return _WEEKDAYS.index(word)
    return _WEEKDAY_ABBR.get(word.rstrip("."))


def relative_date_range(expression: str, anchor: date) -> DateRange | None:
    """The days a relative time expression names, said on ``anchor`` (the session date).

    The table (weeks run Monday to Sunday; "past" means "last"; any case; a weekday may be written
    in full or abbreviated ``Mon``, ``Tue``/``Tues``, ``Wed``/``Weds``, ``Thu``/``Thur``/``Thurs``,
    ``Fri``, ``Sat``, ``Sun``):

    ===============================================  ==============================================
    expression                                        range
    ===============================================  ==============================================
    ``today``, ``tonight``, ``this morning`` …        the anchor day
    ``yesterday``, ``last night``                     the day before
    ``the day before yesterday``                      two days before
    ``tomorrow``                                      the day after
    ``last Saturday``, ``Last Fri``                   the latest such weekday *before* the anchor day
    ``this Saturday``                                 that weekday in the anchor's week
    ``next Saturday``                                 the first such weekday *after* the anchor day
    ``last week`` / ``this week`` / ``next week``     the Monday-Sunday week before / of / after
    ``last weekend``                                  the latest Saturday-Sunday wholly before the
                                                      anchor day
    ``this weekend`` / ``next weekend``               Saturday-Sunday of the anchor's / next week
    ``last month`` / ``this month`` / ``next month``  the calendar month
    ``last year`` / ``this year`` / ``next year``     the calendar year
    ``two days ago``, ``3 days ago``                  that day
    ``two weeks ago``                                 the week holding the day 14 days before
    ``two weekends ago``                              the weekend before last weekend
    ``a month ago``, ``two years ago``                that calendar month / year
    ===============================================  ==============================================

    Numbers are digits, ``a``/``an``, ``one``…``ten`` or ``a couple of``.

    Args:
        expression: the expression, e.g. ``"last Tues"`` (surrounding spaces and a final full stop
            are ignored).
        anchor: the date it was said on.

    Returns:
        The :class:`DateRange` (one day for the day forms); None for an expression not in the
        table (``"a few days ago"``, ``"recently"``).
    """
    e = re.sub(r"\s+", " ", expression.strip().rstrip(".").lower())
    fixed = {
        "today": 0, "tonight": 0, "this morning": 0, "this afternoon": 0, "this evening": 0,
        "yesterday": -1, "last night": -1, "day before yesterday": -2, "the day before yesterday": -2,
        "tomorrow": 1,
    }  # fmt: skip
    if e in fixed:
        day = anchor + timedelta(days=fixed[e])
        return DateRange(day, day)
    m = re.fullmatch(r"(last|this|next|past) (\w+)", e)
    if m:
        rel, unit = m.group(1), m.group(2)
        step = {"last": -1, "past": -1, "this": 0, "next": 1}[rel]
        if unit == "month":
            first = _add_months(anchor, step)
            return DateRange(first, _month_end(first))
        if unit == "year":
            return DateRange(date(anchor.year + step, 1, 1), date(anchor.year + step, 12, 31))
        if unit == "week":
            return _week_of(anchor + timedelta(weeks=step))
        if unit == "weekend":
            return _weekend(anchor, step)
        weekday = _weekday_number(unit)
        if weekday is None:
            return None
        if step == 0:
            day = _week_of(anchor).start + timedelta(days=weekday)
        elif step < 0:
            day = anchor - timedelta(days=(anchor.weekday() - weekday - 1) % 7 + 1)
        else:
            day = anchor + timedelta(days=(weekday - anchor.weekday() - 1) % 7 + 1)
        return DateRange(day, day)
    m = re.fullmatch(rf"{_NUM_RE} {_UNIT_RE} ago", e)
    if m:
        n, unit = _NUMBER.get(m.group(1)) or int(m.group(1)), m.group(2)
        if unit == "day":
            day = anchor - timedelta(days=n)
            return DateRange(day, day)
        if unit == "week":
            return _week_of(anchor - timedelta(weeks=n))
        if unit == "weekend":
            return _weekend(anchor, -n)
        if unit == "month":
            first = _add_months(anchor, -n)
            return DateRange(first, _month_end(first))
        return DateRange(date(anchor.year - n, 1, 1), date(anchor.year - n, 12, 31))
    return None


def _weekend(anchor: date, step: int) -> DateRange:
    """Saturday-Sunday ``step`` weekends from the anchor's (0: its week's; -1: latest wholly before it)."""
    if step >= 0:
        return _weekend_of_week(anchor + timedelta(weeks=step))
    this = _weekend_of_week(anchor)
    latest = this if this.end < anchor else _weekend_of_week(anchor - timedelta(weeks=1))
    shift = timedelta(weeks=-step - 1)
    return DateRange(latest.start - shift, latest.end - shift)


def resolve_relative_date(expression: str, anchor: date) -> str | None:
    """:func:`relative_date_range` as text (``"7 May 2023"``, ``"1-7 May 2023"``, ``"April 2023"``).

    Args:
        expression: e.g. ``"yesterday"``, ``"last week"``, ``"two days ago"``, ``"Last Fri"``.
        anchor: the session date.

    Returns:
        ``str(DateRange)``; None for an expression the table does not hold.
    """
    found = relative_date_range(expression, anchor)
    return str(found) if found is not None else None


def annotate_dates(text: str, anchor: date) -> list[tuple[str, str]]:
    """Every relative time expression in ``text`` with its resolution, in order of appearance.

    Returns:
        ``(expression as written, resolution)`` pairs; expressions that do not resolve are left out.
    """
    out = []
    for m in _RELATIVE.finditer(text):
        resolved = resolve_relative_date(m.group(0), anchor)
        if resolved is not None:
            out.append((m.group(0), resolved))
    return out


def turn_indexed_view(text: str, *, date_text: str = "") -> str:
    """The document as an extractor should see it: units by id, verbatim, plus resolved dates.

    For a dialogue: the header, ``Session date: 8 May 2023`` (when known), every turn line as
    is (``[D1:3] Caroline: …``), then, when any turn holds a relative time expression,
    ``Relative dates resolved against the session date:`` with one ``- [D1:3] "yesterday" =
    7 May 2023`` line each. For prose: one ``[S<n>] sentence`` line per sentence. Each turn or
    sentence text is a verbatim substring of ``text``, so evidence copied from the view passes
    a verbatim check against the original.

    Args:
        text: the document text.
        date_text: the session date (``Document.metadata["date"]``); default: from the header.
    """
    session = parse_session(text, date_text=date_text)
    if not session.turns:
        return "\n".join(f"[{u.unit_id}] {u.text}" for u in indexed_units(text))
    return _session_view(session, [t.unit_id for t in session.turns], [t.text for t in session.turns])


def _session_view(session: Session, labels: Sequence[str], lines: Sequence[str]) -> str:
    """Header, ``Session date:`` (when known), one line per turn, then the resolved relative dates.

    ``labels[i]`` names turn ``i`` in the date notes (``D1:3`` or ``3``); ``lines[i]`` is how the
    turn itself is shown.
    """
    out = [session.header]
    if session.date is not None:
        out.append(f"Session date: {format_date(session.date)}")
    out += lines
    if session.date is not None:
        notes = [
            f'- [{label}] "{expr}" = {resolved}'
            for label, t in zip(labels, session.turns, strict=True)
            for expr, resolved in annotate_dates(t.text, session.date)
        ]
        if notes:
            out += ["", "Relative dates resolved against the session date:", *notes]
    return "\n".join(out)


def numbered_turn_view(text: str, *, date_text: str = "") -> tuple[str, list[tuple[int, int]]]:
    """A dialogue as the sentence-indexed extractor sees it: turns numbered ``[1]``, ``[2]`` and so on.

    The view is the header, ``Session date: 8 May 2023`` (when known), one ``[n] Speaker: text``
    line per turn (the turn line without its ``[D3:5]`` id, verbatim), then the relative dates
    resolved against the session date, ``- [n] "yesterday" = 7 May 2023``. The model cites turn
    numbers like sentence numbers (:func:`kitune.programs.sentences.resolve_citations`), and the
    returned spans turn a citation back into verbatim text.

    Args:
        text: the dialogue document or chunk.
        date_text: the session date (``Document.metadata["date"]``); default: from the header.

    Returns:
        ``(view, spans)``: ``spans[n - 1]`` is the ``(start, end)`` offset in ``text`` of turn
        ``n``'s ``Speaker: text``. For prose (no turn lines) ``("", [])``.
    """
    session = parse_session(text, date_text=date_text)
    if not session.turns:
        return "", []
    spans: list[tuple[int, int]] = []
    for t in session.turns:
        head = t.text.index("]") + 1
        head += len(t.text[head:]) - len(t.text[head:].lstrip())
        spans.append((t.start + head, t.end))
    numbers = [str(n) for n in range(1, len(spans) + 1)]
    shown = [f"[{n}] {text[s:e]}" for n, (s, e) in zip(numbers, spans, strict=True)]
    return _session_view(session, numbers, shown), spans


def dialogue_tags(text: str, spans: Iterable[str], *, date_text: str = "") -> list[str]:
    """KI tags carrying a fact's evidence turns and session date (valid KI tags, plain form).

    ``d3-5`` for each turn an evidence span quotes (document order, read back by
    :func:`ki_turn_ids`), then ``session-2023-05-08`` for the session date when known.

    Args:
        text: the dialogue document (or chunk) the spans were checked against.
        spans: the fact's verbatim evidence spans.
        date_text: the session date (``Document.metadata["date"]``); default: from the header.

    Returns:
        The tags, unique; ``[]`` for prose (no turns) when no date is known.
    """
    turns: dict[str, None] = {}
    for span in spans:
        for t in turns_for_span(text, span):
            if t.startswith("D"):
                turns.setdefault("d" + t[1:].replace(":", "-"), None)
    out = list(turns)
    session = parse_session(text, date_text=date_text)
    if session.turns and session.date is not None:
        out.append(f"session-{session.date.isoformat()}")
    return out


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def ki_turn_ids(ki: Mapping[str, Any], documents: Mapping[str, str]) -> set[tuple[str, str]]:
    """The (doc id, turn id) pairs a KI's evidence covers.

    Two sources, united: turn ids the KI names explicitly (``D3:5`` anywhere in its title,
    description, payload properties or evidence, or a ``d3-5`` tag), attributed to each of its
    evidence documents that holds that turn; and the turns its evidence spans quote verbatim in
    each evidence document (:func:`turns_for_span`).

    Args:
        ki: a KI as a JSON dict (a ``kis.jsonl`` line, or ``KI.model_dump(mode="json")``).
        documents: doc id → text for the documents the KI may cite.

    Returns:
        ``{(docid, "D3:5"), …}``; empty when nothing maps (prose documents give sentence ids).
    """
    payload = ki.get("payload") or {}
    doc_ids = [str(d) for d in ki.get("evidence_doc_ids") or []]
    named = {
        f"D{a}:{b}"
        for s in _strings([ki.get("title"), ki.get("description"), payload])
        for a, b in _TURN_ID.findall(s)
    }
    named |= {f"D{m.group(1)}:{m.group(2)}" for t in ki.get("tags") or [] if (m := _TURN_TAG.match(str(t)))}
    out: set[tuple[str, str]] = set()
    for docid in doc_ids:
        text = documents.get(docid)
        if text is None:
            continue
        have = {u.unit_id for u in parse_session(text).turns}
        out |= {(docid, t) for t in named & have}
        for span in _strings(payload.get("evidence") or []):
            out |= {(docid, t) for t in turns_for_span(text, span)}
    return out
