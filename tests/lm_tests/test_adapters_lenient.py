"""kitune's adapters read replies leniently (per record, JSON anywhere) and send DSPy's requests unchanged."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, ClassVar

import dspy
import pytest
from pydantic import BaseModel, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from kitune.lm import (
    KituneChatAdapter,
    KituneJSONAdapter,
    LocalJSONAdapter,
    Records,
    ReplyParseError,
    read_records,
    record_list_field,
)


class Item(BaseModel):
    """One item."""

    name: str
    score: int

    @model_validator(mode="before")
    @classmethod
    def _lenient(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and "label" in data and "name" not in data:  # an alias, counted
            info.context["counts"]["aliased"] += 1  # type: ignore[index]
            data = {**data, "name": data["label"]}
        if isinstance(data, dict) and isinstance(data.get("score"), int) and data["score"] > 100:
            raise PydanticCustomError("bad_score", "{message}", {"message": f"score {data['score']} > 100"})
        return data


class ListItems(dspy.Signature):  # type: ignore[misc]
    """List the items."""

    text: str = dspy.InputField()
    items: list[Item] = dspy.OutputField()


class Plan(BaseModel):
    """A plan."""

    goal: str
    steps: int = 1


class MakePlan(dspy.Signature):  # type: ignore[misc]
    """Plan."""

    question: str = dspy.InputField()
    plan: Plan = dspy.OutputField()


class Grade(dspy.Signature):  # type: ignore[misc]
    """Grade."""

    answer: str = dspy.InputField()
    correct: bool = dspy.OutputField()
    confidence: int = dspy.OutputField()


GOOD_A = '{"name": "a", "score": 1}'
GOOD_C = '{"label": "c", "score": 3}'
BAD_QUOTE = '{"name": "b "quoted" b", "score": 2}'  # an unescaped quote: json_repair can "fix" it


@pytest.mark.parametrize("adapter", [KituneChatAdapter(), KituneJSONAdapter(), LocalJSONAdapter()])
def test_a_record_list_is_read_per_record_and_a_repaired_record_is_never_kept(adapter: dspy.Adapter) -> None:
    reply = (
        "[[ ## items ## ]]\n[" + ", ".join([GOOD_A, BAD_QUOTE, '{"name": "d", "score": 500}', GOOD_C]) + "]"
    )
    items = adapter.parse(ListItems, reply)["items"]
    assert isinstance(items, Records)
    assert [(i.name, i.score) for i in items] == [("a", 1), ("c", 3)]
    assert [(e.index, e.reason) for e in items.errors] == [(1, "malformed_json"), (2, "bad_score")]
    assert "quoted" in items.errors[0].message and items.errors[1].message == "score 500 > 100"
    assert items.counters == {"bare_list": 1, "records_malformed": 1, "aliased": 1, "records_rejected": 2}
    assert not items.is_malformed


def test_dspy_own_json_parse_would_keep_the_repaired_record() -> None:
    # why the record list bypasses DSPy's parse: json_repair turns the broken record into a valid one
    reply = '{"items": [' + ", ".join([GOOD_A, BAD_QUOTE]) + "]}"
    dspy_items = dspy.JSONAdapter().parse(ListItems, reply)["items"]
    assert [i.name for i in dspy_items] == ["a", 'b "quoted" b']
    assert [i.name for i in KituneJSONAdapter().parse(ListItems, reply)["items"]] == ["a"]


def test_records_under_the_field_name_inside_a_fence_after_reasoning() -> None:
    reply = '<think>let me see</think>\n```json\n{"ITEMS": [' + GOOD_A + "]}\n```"
    items = KituneJSONAdapter().parse(ListItems, reply)["items"]
    assert [i.name for i in items] == ["a"]
    assert items.counters == {"think_stripped": 1, "fence_stripped": 1}


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("I found three items.", "no_json"),
        ('[{"name": "a", "sco', "cut_off"),
        ('{"name": "a" "score": 1}', "malformed_json"),
    ],
)
def test_a_reply_without_usable_json_raises_with_its_reason(reply: str, reason: str) -> None:
    with pytest.raises(ReplyParseError) as info:
        KituneChatAdapter().parse(ListItems, reply)
    assert info.value.reason == reason and info.value.lm_response == reply
    assert info.value.detail.startswith(
        {"no_json": "no JSON object found", "cut_off": "JSON cut off"}.get(reason, "malformed JSON")
    )


def test_every_record_rejected_is_an_empty_list_with_errors() -> None:
    items = KituneChatAdapter().parse(ListItems, '{"items": [{"name": "a"}, "just text"]}')["items"]
    assert list(items) == [] and items.is_malformed
    assert [(e.index, e.reason, e.missing_fields) for e in items.errors] == [
        (0, "missing_fields", ("score",)),
        (1, "not_an_object", ()),
    ]


@pytest.mark.parametrize(
    "reply",
    [
        'Here is the plan: {"goal": "find it", "steps": 2} as asked.',  # prose around the object
        '{"plan": {"goal": "find it", "steps": 2}}',  # under the field name
        json.dumps({"json": json.dumps({"goal": "find it", "steps": 2})}),  # stringified
        "[[ ## plan_json ## ]]\n{'goal': 'find it', 'steps': 2}",  # a Python literal under another field
    ],
)
def test_a_model_typed_output_is_read_from_the_first_object_anywhere(reply: str) -> None:
    assert KituneChatAdapter().parse(MakePlan, reply)["plan"] == Plan(goal="find it", steps=2)


def test_an_object_that_fails_the_type_is_invalid_fields_not_no_json() -> None:
    with pytest.raises(ReplyParseError) as info:
        KituneJSONAdapter().parse(MakePlan, '{"goal": ["not", "text"]}')
    assert info.value.reason == "invalid_fields" and "'plan'" in info.value.detail


def test_scalar_fields_from_a_json_object_with_typed_values() -> None:
    reply = 'Verdict: {"Correct": "bool[True]", "confidence": "int[85]"}'
    assert KituneChatAdapter().parse(Grade, reply) == {"correct": True, "confidence": 85}
    with pytest.raises(ReplyParseError) as info:
        KituneChatAdapter().parse(Grade, 'Verdict: {"correct": true}')
    assert info.value.reason == "invalid_fields" and "'confidence'" in info.value.detail


def test_record_list_field_is_the_only_output_list_of_models() -> None:
    assert record_list_field(ListItems) == ("items", Item)
    assert record_list_field(MakePlan) is None and record_list_field(Grade) is None


def test_read_records_uses_the_models_list_keys() -> None:
    class Keyed(Item):
        LIST_KEYS: ClassVar[tuple[str, ...]] = ("entries",)

    records = read_records('{"entries": [' + GOOD_A + "]}", Keyed)
    assert [r.name for r in records] == ["a"] and records.errors == ()
    counts: Counter[str] = Counter()
    Item.model_validate({"label": "x", "score": 1}, context={"counts": counts})
    assert counts == {"aliased": 1}


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [(KituneChatAdapter(), dspy.ChatAdapter()), (KituneJSONAdapter(), dspy.JSONAdapter())],
)
@pytest.mark.parametrize("signature", [ListItems, MakePlan, Grade])
def test_requests_are_formatted_exactly_as_dspy_formats_them(
    ours: dspy.Adapter, theirs: dspy.Adapter, signature: type[dspy.Signature]
) -> None:
    inputs = {name: "some input" for name in signature.input_fields}
    assert ours.format(signature, [], inputs) == theirs.format(signature, [], inputs)


def test_the_chat_adapters_json_fallback_is_lenient_too() -> None:
    fallback = KituneChatAdapter()._make_json_adapter_fallback()
    assert isinstance(fallback, KituneJSONAdapter)
