"""Dialogue helpers: turns with ids, chunking on turn boundaries, relative dates, turn-indexed view."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from kitune.data.dialogue import (
    DateRange,
    annotate_dates,
    chunk_session,
    dialogue_tags,
    format_date,
    indexed_units,
    ki_turn_ids,
    numbered_turn_view,
    parse_session,
    parse_session_date,
    relative_date_range,
    resolve_relative_date,
    text_for_units,
    turn_indexed_view,
    turns_for_span,
)
from kitune.text import find_span

LOCOMO = (Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "locomo").resolve()

SESSION = (
    "Conversation between Caroline and Melanie, session 1 (1:56 pm on 8 May, 2023)\n"
    "[D1:1] Caroline: Hey Mel! Good to see you!\n"
    "[D1:2] Melanie: Hey Caroline! I'm swamped: kids & work.\n"
    "[D1:3] Caroline: I went to a LGBTQ support group yesterday and it was so powerful.\n"
    "[D1:4] Melanie: I painted that lake sunrise last year! [shares a photo: a lake at dawn]"
)
MAY8 = date(2023, 5, 8)


def test_parse_session_turns_offsets_and_date() -> None:
    s = parse_session(SESSION)
    assert s.header == "Conversation between Caroline and Melanie, session 1 (1:56 pm on 8 May, 2023)"
    assert s.date_text == "1:56 pm on 8 May, 2023" and s.date == MAY8
    assert [(t.unit_id, t.speaker) for t in s.turns] == [
        ("D1:1", "Caroline"),
        ("D1:2", "Melanie"),
        ("D1:3", "Caroline"),
        ("D1:4", "Melanie"),
    ]
    assert all(SESSION[t.start : t.end] == t.text for t in s.turns)
    assert s.turns[1].text == "[D1:2] Melanie: Hey Caroline! I'm swamped: kids & work."
    assert parse_session(SESSION, date_text="9 June 2023").date == date(2023, 6, 9)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1:56 pm on 8 May, 2023", MAY8),
        ("12:09 am on 13 September, 2023", date(2023, 9, 13)),
        ("8 May 2023", MAY8),
        ("May 8th, 2023", MAY8),
        ("2023-05-08", MAY8),
        ("sometime", None),
    ],
)
def test_parse_session_date(value: str, expected: date | None) -> None:
    assert parse_session_date(value) == expected


# MAY8 is a Monday; THU25 (25 May 2023, a Thursday) is a LoCoMo session date: conversation 26's
# gold for "When did Melanie run a charity race?" is "The sunday before 25 May 2023" = 21 May.
THU25 = date(2023, 5, 25)


@pytest.mark.parametrize(
    ("expr", "on_monday_8_may", "on_thursday_25_may"),
    [
        ("yesterday", "7 May 2023", "24 May 2023"),
        ("Yesterday", "7 May 2023", "24 May 2023"),
        ("last night", "7 May 2023", "24 May 2023"),
        ("the day before yesterday", "6 May 2023", "23 May 2023"),
        ("today", "8 May 2023", "25 May 2023"),
        ("tonight", "8 May 2023", "25 May 2023"),
        ("tomorrow", "9 May 2023", "26 May 2023"),
        ("last Saturday", "6 May 2023", "20 May 2023"),
        ("last Sunday", "7 May 2023", "21 May 2023"),
        ("Last Fri", "5 May 2023", "19 May 2023"),
        ("last Tues", "2 May 2023", "23 May 2023"),
        ("last Monday", "1 May 2023", "22 May 2023"),
        ("past Thurs.", "4 May 2023", "18 May 2023"),
        ("this Saturday", "13 May 2023", "27 May 2023"),
        ("next Friday", "12 May 2023", "26 May 2023"),
        ("last weekend", "6-7 May 2023", "20-21 May 2023"),
        ("this weekend", "13-14 May 2023", "27-28 May 2023"),
        ("next weekend", "20-21 May 2023", "3-4 June 2023"),
        ("last week", "1-7 May 2023", "15-21 May 2023"),
        ("this week", "8-14 May 2023", "22-28 May 2023"),
        ("next week", "15-21 May 2023", "29 May - 4 June 2023"),
        ("last month", "April 2023", "April 2023"),
        ("next month", "June 2023", "June 2023"),
        ("last year", "2022", "2022"),
        ("two days ago", "6 May 2023", "23 May 2023"),
        ("a couple of days ago", "6 May 2023", "23 May 2023"),
        ("two weeks ago", "24-30 April 2023", "8-14 May 2023"),
        ("two weekends ago", "29-30 April 2023", "13-14 May 2023"),
        ("a month ago", "April 2023", "April 2023"),
        ("3 years ago", "2020", "2020"),
        ("a year ago", "2022", "2022"),
        ("a few days ago", None, None),
        ("recently", None, None),
    ],
)
def test_relative_date_table(expr: str, on_monday_8_may: str | None, on_thursday_25_may: str | None) -> None:
    assert resolve_relative_date(expr, MAY8) == on_monday_8_may
    assert resolve_relative_date(expr, THU25) == on_thursday_25_may


def test_relative_dates_are_dates_or_ranges() -> None:
    assert relative_date_range("last Saturday", THU25) == DateRange(date(2023, 5, 20), date(2023, 5, 20))
    assert relative_date_range("last weekend", THU25) == DateRange(date(2023, 5, 20), date(2023, 5, 21))
    assert relative_date_range("next month", THU25) == DateRange(date(2023, 6, 1), date(2023, 6, 30))
    assert relative_date_range("last week", date(2023, 1, 4)) == DateRange(
        date(2022, 12, 26), date(2023, 1, 1)
    )
    assert str(DateRange(date(2022, 12, 26), date(2023, 1, 1))) == "26 December 2022 - 1 January 2023"
    assert relative_date_range("yesterday", THU25).is_day  # type: ignore[union-attr]
    # said on a weekend day, "last weekend" is the one before it
    assert str(relative_date_range("last weekend", date(2023, 5, 28))) == "20-21 May 2023"
    assert str(relative_date_range("this weekend", date(2023, 5, 28))) == "27-28 May 2023"


def test_month_arithmetic_crosses_years() -> None:
    assert resolve_relative_date("last month", date(2023, 1, 20)) == "December 2022"
    assert resolve_relative_date("next month", date(2022, 12, 31)) == "January 2023"
    assert resolve_relative_date("yesterday", date(2023, 3, 1)) == "28 February 2023"
    assert format_date(date(2023, 7, 5)) == "5 July 2023"


def test_annotate_dates_in_order() -> None:
    text = (
        "Yesterday I ran; last week I swam; a few days ago I rested; next month I fly. Last Fri and "
        "last Tues were fun, last night too. I last sat down with him on the last sun-lit day."
    )
    assert annotate_dates(text, MAY8) == [
        ("Yesterday", "7 May 2023"),
        ("last week", "1-7 May 2023"),
        ("next month", "June 2023"),
        ("Last Fri", "5 May 2023"),
        ("last Tues", "2 May 2023"),
        ("last night", "7 May 2023"),
    ]  # "last sat down" and "last sun-lit" are not weekdays


def test_turn_indexed_view_keeps_turns_verbatim_and_lists_dates() -> None:
    view = turn_indexed_view(SESSION)
    lines = view.splitlines()
    assert lines[1] == "Session date: 8 May 2023"
    assert lines[2:6] == SESSION.splitlines()[1:]
    assert lines[-3:] == [
        "Relative dates resolved against the session date:",
        '- [D1:3] "yesterday" = 7 May 2023',
        '- [D1:4] "last year" = 2022',
    ]
    assert all(find_span(SESSION, line) for line in lines[2:6])  # copied evidence stays verbatim
    prose = "Paris is the capital. It is large!\nLyon is smaller"
    assert turn_indexed_view(prose) == "[S1] Paris is the capital.\n[S2] It is large!\n[S3] Lyon is smaller"


def test_units_spans_and_verbatim_copy() -> None:
    assert [u.unit_id for u in indexed_units(SESSION)] == ["D1:1", "D1:2", "D1:3", "D1:4"]
    assert turns_for_span(SESSION, "support group yesterday") == ["D1:3"]
    assert turns_for_span(SESSION, "see you!\n[D1:2] Melanie: Hey") == ["D1:1", "D1:2"]
    assert turns_for_span(SESSION, "not in the text") == []
    assert text_for_units(SESSION, ["D1:3", "D1:1", "D9:9"]) == (
        "Hey Mel! Good to see you!\nI went to a LGBTQ support group yesterday and it was so powerful."
    )
    assert find_span(SESSION, text_for_units(SESSION, ["D1:2"])) is not None
    units = indexed_units("One. Two!")
    assert [(u.unit_id, u.text, u.start) for u in units] == [("S1", "One.", 0), ("S2", "Two!", 5)]


def test_chunk_session_on_turn_boundaries_with_header() -> None:
    chunks = chunk_session(SESSION, 200)
    head = SESSION.splitlines()[0]
    assert len(chunks) == 3 and all(c.startswith(head + "\n[D1:") for c in chunks)
    turn_lines = [line for c in chunks for line in c.splitlines()[1:]]
    assert turn_lines == SESSION.splitlines()[1:]  # every turn once, verbatim, in order
    assert chunk_session(SESSION, 10_000) == [SESSION]
    assert chunk_session("plain prose " * 100, 50) == ["plain prose " * 100]
    assert len(chunk_session(SESSION, 1)) == 4  # one turn per chunk, never cut
    with pytest.raises(ValueError, match="max_chars"):
        chunk_session(SESSION, 0)


def test_ki_turn_ids_named_and_quoted() -> None:
    docs = {"26001": SESSION}
    ki = {
        "title": "Caroline went to an LGBTQ support group on 7 May 2023",
        "description": "Said in [D1:3].",
        "tags": ["event", "d1-4", "entity:caroline"],
        "evidence_doc_ids": ["26001", "missing"],
        "payload": {"evidence": ["Hey Mel! Good to see you!"], "properties": {"turn": "D1:9"}},
    }
    # D1:9 is named but not a turn of the document: ignored
    assert ki_turn_ids(ki, docs) == {("26001", "D1:3"), ("26001", "D1:4"), ("26001", "D1:1")}
    assert ki_turn_ids({"evidence_doc_ids": ["26001"], "payload": {}}, docs) == set()


def test_real_locomo_sessions() -> None:
    if not LOCOMO.is_dir():
        pytest.skip("shared LoCoMo data not found")
    docs = [json.loads(line) for line in (LOCOMO / "corpus.jsonl").read_text().splitlines()]
    n_turns = 0
    for d in docs:
        s = parse_session(d["text"], date_text=d["date"])
        assert s.date is not None and s.turns, d["docid"]
        session = int(d["docid"]) % 1000
        assert all(t.unit_id.startswith(f"D{session}:") for t in s.turns)
        n_turns += len(s.turns)
        for c in chunk_session(d["text"], 2000):
            assert len(c) <= 2000 or c.count("\n[D") == 1
    assert n_turns == 2760
    first = docs[0]
    assert turn_indexed_view(first["text"], date_text=first["date"]).endswith(
        '- [D1:3] "yesterday" = 7 May 2023\n- [D1:14] "last year" = 2022'
    )


def test_dialogue_tags_are_valid_ki_tags_and_read_back() -> None:
    from kitune.ki import KI

    tags = dialogue_tags(SESSION, ["support group yesterday", "Hey Mel!", "nowhere"])
    assert tags == ["d1-3", "d1-1", "session-2023-05-08"]
    ki = KI.from_fact(
        docid="26001",
        title="Caroline went to an LGBTQ support group on 7 May 2023",
        description="Caroline said she went to an LGBTQ support group the day before the session.",
        subject="Caroline",
        predicate="attended",
        obj="LGBTQ support group",
        evidence=["support group yesterday"],
        confidence=80,
        tags=tags,
    )
    assert ki_turn_ids(ki.model_dump(mode="json"), {"26001": SESSION}) == {
        ("26001", "D1:3"),
        ("26001", "D1:1"),
    }
    assert dialogue_tags("Plain prose. Another.", ["Plain prose."]) == []


def test_numbered_turn_view_numbers_turns_and_maps_each_number_to_verbatim_text() -> None:
    view, spans = numbered_turn_view(SESSION)
    assert view.splitlines()[:3] == [
        "Conversation between Caroline and Melanie, session 1 (1:56 pm on 8 May, 2023)",
        "Session date: 8 May 2023",
        "[1] Caroline: Hey Mel! Good to see you!",
    ]
    assert "[3] Caroline: I went to a LGBTQ support group yesterday and it was so powerful." in view
    assert '- [3] "yesterday" = 7 May 2023' in view and '- [4] "last year" = 2022' in view
    assert "D1:" not in view  # numbers only: the model cites them like sentence numbers
    assert len(spans) == 4
    assert SESSION[slice(*spans[1])] == "Melanie: Hey Caroline! I'm swamped: kids & work."
    assert SESSION[slice(*spans[3])].endswith("[shares a photo: a lake at dawn]")
    assert numbered_turn_view("Just prose. No turns.") == ("", [])
