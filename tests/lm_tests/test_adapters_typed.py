"""Adapters read type-annotated values (``int[90]``, ``bool[False]``) a model copied from its prompt."""

from __future__ import annotations

import dspy
import pytest
from dspy.utils.exceptions import AdapterParseError

from kitune.lm import KituneChatAdapter, KituneJSONAdapter, LocalJSONAdapter, typed_value, unwrap_typed


class Verdict(dspy.Signature):  # type: ignore[misc]
    """Grade."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField()
    correct: bool = dspy.OutputField()
    confidence: int = dspy.OutputField()
    score: float = dspy.OutputField()


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("int[90]", "90"),
        (" Int[ 90 ] ", "90"),
        ("integer[-3]", "-3"),
        ("float[0.5]", "0.5"),
        ("bool[False]", "false"),
        ("bool[yes]", "true"),
        ("boolean['True']", "true"),
        ("str[Paris]", "Paris"),
        ('str["New York"]', "New York"),
        ("int[high]", None),
        ("bool[maybe]", None),
        ("90", None),
        ("list[1]", None),
        ("int[90] and more", None),
    ],
)
def test_typed_value(text: str, value: str | None) -> None:
    assert typed_value(text) == value


def test_unwrap_typed_keeps_json_json_and_sections_bare() -> None:
    assert unwrap_typed('{"a": "int[90]", "b": "bool[False]", "c": "str[Paris]", "d": "int[x]"}') == (
        '{"a": 90, "b": false, "c": "Paris", "d": "int[x]"}'
    )
    assert unwrap_typed("[[ ## correct ## ]]\nbool[True]\n[[ ## confidence ## ]]\nint[7]") == (
        "[[ ## correct ## ]]\ntrue\n[[ ## confidence ## ]]\n7"
    )


@pytest.mark.parametrize("adapter", [KituneJSONAdapter(), LocalJSONAdapter()])
def test_json_adapters_coerce_typed_values(adapter: dspy.Adapter) -> None:
    reply = (
        '{"answer": "str[Paris]", "correct": "bool[False]", "confidence": "int[90]", "score": "float[0.25]"}'
    )
    assert adapter.parse(Verdict, reply) == {
        "answer": "Paris",
        "correct": False,
        "confidence": 90,
        "score": 0.25,
    }
    with pytest.raises(AdapterParseError):
        dspy.JSONAdapter().parse(Verdict, reply)  # what the plain adapter does with it


def test_chat_adapter_coerces_typed_values() -> None:
    reply = (
        "[[ ## answer ## ]]\nParis\n\n[[ ## correct ## ]]\nbool[True]\n\n[[ ## confidence ## ]]\nint[90]\n\n"
        "[[ ## score ## ]]\nfloat[1.5]\n\n[[ ## completed ## ]]"
    )
    got = KituneChatAdapter().parse(Verdict, reply)
    assert got == {"answer": "Paris", "correct": True, "confidence": 90, "score": 1.5}


def test_value_that_fits_no_type_still_fails_with_the_models_own_text() -> None:
    reply = '{"answer": "Paris", "correct": "bool[maybe]", "confidence": "int[90]", "score": 1}'
    with pytest.raises(AdapterParseError) as info:
        KituneJSONAdapter().parse(Verdict, reply)
    assert info.value.lm_response == reply
