"""Lone UTF-16 surrogates in replies: a split pair joined, a lone one read as U+FFFD and counted (issue 25).

A small model (qwen2.5-coder-1.5b on llama.cpp) wrote the JSON escape of half an emoji pair
(``"\\ud83d"``); ``json`` decodes it to a lone surrogate, which no UTF-8 writer or hasher accepts.
"""

from __future__ import annotations

from collections import Counter

import dspy
from pydantic import BaseModel

from kitune.lm import (
    KituneJSONAdapter,
    extract_json,
    find_json_object,
    read_records,
    repair_surrogates,
    track_parse_counts,
)
from kitune.programs.records import PlanDraft

HALF = "\\ud83d"  # the JSON escape of the high half of U+1F600, as the model wrote it
PAIR = "\\ud83d\\ude00"  # both halves: JSON decodes them to the emoji itself


class Item(BaseModel):
    """One item."""

    name: str
    score: int


class MakePlan(dspy.Signature):  # type: ignore[misc]
    """Plan."""

    question: str = dspy.InputField()
    plan: PlanDraft = dspy.OutputField()


def test_lone_surrogates_become_replacement_characters_and_pairs_are_joined() -> None:
    counts: Counter[str] = Counter()
    assert repair_surrogates("x\ud83d", counts) == "x\ufffd"
    assert repair_surrogates("\ude00x", counts) == "\ufffdx"  # a lone low half
    assert repair_surrogates("\ud83d\ud83d\ude00", counts) == "\ufffd\U0001f600"  # high, then a pair
    assert repair_surrogates("a\ud83d\ude00b", counts) == "a\U0001f600b"  # as json_repair leaves a pair
    assert counts == Counter({"surrogates_replaced": 3})
    nested = {"k\ud83d": ["\ud83d", ("ok", "\ude00")], "n": 1}
    assert repair_surrogates(nested, counts) == {"k\ufffd": ["\ufffd", ("ok", "\ufffd")], "n": 1}
    assert counts["surrogates_replaced"] == 6
    assert repair_surrogates(Item(name="\ud83d", score=1)) == Item(name="\ufffd", score=1)


def test_a_value_without_surrogates_is_returned_as_is() -> None:
    value = {"name": "Zürich \U0001f600", "items": ["a", 1, None]}
    counts: Counter[str] = Counter()
    assert repair_surrogates(value, counts) is value
    assert counts == Counter()


def test_a_records_reply_reads_the_pair_as_the_emoji_and_the_half_as_fffd() -> None:
    raw = f'[{{"name": "smile {PAIR}", "score": 1}}, {{"name": "{HALF}", "score": 2}}]'
    records = read_records(raw, Item)
    assert [(r.name, r.score) for r in records] == [("smile \U0001f600", 1), ("\ufffd", 2)]
    assert records.counters == {"bare_list": 1, "surrogates_replaced": 1}
    for r in records:  # every string can be written and hashed
        r.name.encode("utf-8")


def test_a_broken_array_keeps_a_well_formed_element_holding_an_escaped_pair() -> None:
    # json_repair leaves "\ud83d\ude00" as two surrogates while json joins them: compared repaired,
    # the well-formed first element is kept, and only the element missing its comma is malformed
    raw = f'[{{"name": "smile {PAIR}", "score": 1}}, {{"name": "b" "score": 2}}]'
    records = read_records(raw, Item)
    assert [(r.name, r.score) for r in records] == [("smile \U0001f600", 1)]
    assert [(e.index, e.reason) for e in records.errors] == [(1, "malformed_json")]
    assert records.counters["records_malformed"] == 1


def test_extract_json_and_a_python_literal_object_are_repaired_and_counted() -> None:
    counts: Counter[str] = Counter()
    assert extract_json(f'```json\n{{"goal": "{HALF}"}}\n```', counts) == {"goal": "\ufffd"}
    assert counts["surrogates_replaced"] == 1
    literal = "{'goal': '\\ud83d', 'steps': 2}"  # str(dict) form, read with ast.literal_eval
    assert find_json_object(literal, counts) == {"goal": "\ufffd", "steps": 2}
    assert counts["surrogates_replaced"] == 2


def test_the_adapter_repairs_typed_fields_and_reports_the_count() -> None:
    reply = f'{{"plan": {{"lexical": "smile {HALF}", "semantic": "Who smiled {PAIR}?"}}}}'
    with track_parse_counts() as notes:
        values = KituneJSONAdapter().parse(MakePlan, reply)
    plan = values["plan"]
    assert (plan.lexical, plan.semantic) == ("smile \ufffd", "Who smiled \U0001f600?")
    assert notes == [{"surrogates_replaced": 1}]
