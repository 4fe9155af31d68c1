from __future__ import annotations

import json

import pytest

from kitune.errors import ParseError
from kitune.evaluation.protocol import AnswerAction, ToolAction, parse_action, parse_confidence


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"tool": "search", "args": {"query": "x"}}', ToolAction("search", {"query": "x"})),
        (
            'Thinking...\n```json\n{"name": "search", "arguments": "{\\"query\\": \\"y\\"}"}\n```',
            ToolAction("search", {"query": "y"}),
        ),
        (
            '{"action": {"tool": "get_by_doc_id", "parameters": {"docid": "7"}}}',
            ToolAction("get_by_doc_id", {"docid": "7"}),
        ),
        (
            '{"function": {"name": "search", "arguments": {"query": "z"}}}',
            ToolAction("search", {"query": "z"}),
        ),
        (
            'e.g. {"answer": {"exact_answer": "<the answer only>"}} ... final: '
            '{"answer": {"explanation": "[1]", "exact_answer": " Paris ", "confidence": "85%"}}',
            AnswerAction("[1]", "Paris", 85),
        ),
        ('{"answer": "Rome", "confidence": 0.7}', AnswerAction("", "Rome", 70)),
        (
            '{"answer": {"explanation": "e"}, "exact_answer": "Oslo", "confidence": 80}',
            AnswerAction("e", "Oslo", 80),
        ),
        (
            '{"exact_answer": 1793, "explanation": "e", "confidence": 101}',
            AnswerAction("e", "1793", 50),
        ),  # 101: out of range → unknown
    ],
)
def test_parse_action_variants(text: str, expected: object) -> None:
    assert parse_action(text) == expected


def test_parse_errors() -> None:
    with pytest.raises(ParseError, match="no JSON object") as e:
        parse_action("I think it is Paris")
    assert e.value.raw == "I think it is Paris"
    with pytest.raises(ParseError, match="neither a tool call"):
        parse_action('{"foo": 1}')


def test_several_different_actions_are_ambiguous_and_none_is_run() -> None:
    # issue 25: the last object used to run; now exactly one action runs, never a guess
    prose = (
        'I could search {"tool": "search", "args": {"query": "Paris"}} or fetch '
        '{"tool": "get_by_doc_id", "args": {"docid": "d1"}} next.'
    )
    with pytest.raises(ParseError) as e:
        parse_action(prose)
    assert str(e.value) == (
        "reply held 2 different actions (search, get_by_doc_id): reply with exactly ONE JSON object; "
        "nothing was run"
    )
    assert e.value.raw == prose
    example_then_answer = 'e.g. {"tool": "x"} ... final: {"answer": {"exact_answer": "Paris"}}'
    with pytest.raises(ParseError, match=r"^reply held 2 different actions \(x, answer\)"):
        parse_action(example_then_answer)
    # the same action twice is one action
    call = '{"tool": "search", "args": {"query": "Paris"}}'
    assert parse_action(f"{call}\n{call}") == ToolAction("search", {"query": "Paris"})


def test_parse_confidence() -> None:
    # one policy with the extractor and judge (issue 13): out-of-range values are not clamped but
    # unknown (50), like words, None and booleans
    assert [parse_confidence(v) for v in ("85%", 0.85, 1, 250, -3, "high", None, True)] == [
        85,
        85,
        1,
        50,
        50,
        50,
        50,
        50,
    ]


def test_template_placeholders_are_rejected() -> None:
    # seen with a 270M local model: it copied the format template verbatim
    reply = json.dumps(
        {"answer": {"exact_answer": "<the answer only, as short as possible>", "confidence": 5}}
    )
    with pytest.raises(ParseError, match="template placeholder"):
        parse_action(reply)
    assert (
        parse_action('{"answer": {"exact_answer": "<3 hearts", "confidence": 5}}').exact_answer == "<3 hearts"
    )
