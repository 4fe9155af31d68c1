"""Parsing real model output into fact candidates: cases P1, P2, P3 and G1."""

from __future__ import annotations

import json

import dspy
import pytest

from kitune.errors import ParseError
from kitune.lm import REPLY_FAILURES, extract_json, reply_failure, reset_format_memory
from kitune.programs.fact_extractor import DocExtraction, FactExtractor
from kitune.programs.parsing import coerce_record, parse_facts
from kitune.programs.records import DEFAULT_CONFIDENCE, FIELD_ALIASES, FactRecord, coerce_confidence
from kitune.schema import Document
from kitune.testing.lm import stub_server_lm
from kitune.testing.openai_stub import Reply, StubServer

P1_A = """<think>
The user wants facts from the document. Let me list them carefully...
</think>
```json
{"indicators": [{"title": "Acme HQ location", "description": "Where Acme is based",
  "subject": "Acme Corp", "predicate": "headquartered_in", "object": "Springfield",
  "evidence_span": "Acme Corp is headquartered in Springfield",
  "confidence": 90, "tags": ["org"]}]}
```"""

P1_B = """Let me analyze the provided document step by step:
1. Identify the organisations mentioned
2. Identify their locations"""

P2 = """[{"title": "Founding year", "subj": "Acme Corp", "predicate": "founded_in",
  "obj": "1999", "evidence": "Acme Corp was founded in 1999", "confidence": 80}]"""

_TSPOE = (
    '"title": "T", "description": "D", "subject": "S", "predicate": "p", '
    '"object": "O", "evidence_span": "E", "confidence": 60, "tags": []'
)
P3_A = '{"json_input": {' + _TSPOE + "}}"
P3_B = '{"type": "function", "name": "json_tool_call", "parameters": {' + _TSPOE + "}}"
P3_C = json.dumps({"json": "{" + _TSPOE + "}"})
P3_D = '{"result": {"title": "T"}, "subject": "S"}'

EXPECTED_TSPOE = FactRecord(
    title="T",
    description="D",
    subject="S",
    predicate="p",
    object="O",
    evidence_span="E",
    confidence=60,
    tags=(),
)


def _g1_record(obj: object, confidence: object) -> dict[str, object]:
    return {
        "title": "t",
        "description": "d",
        "subject": "Acme",
        "predicate": "p",
        "object": obj,
        "evidence_span": "e",
        "confidence": confidence,
    }


def test_p1_a_think_block_and_fence_are_stripped() -> None:
    parsed = parse_facts(P1_A)
    assert parsed.records == (
        FactRecord(
            title="Acme HQ location",
            description="Where Acme is based",
            subject="Acme Corp",
            predicate="headquartered_in",
            object="Springfield",
            evidence_span="Acme Corp is headquartered in Springfield",
            confidence=90,
            tags=("org",),
        ),
    )
    assert parsed.errors == ()
    assert parsed.counters["think_stripped"] == 1
    assert parsed.counters["fence_stripped"] == 1


def test_p1_b_no_json_raises_parse_error_keeping_raw() -> None:
    with pytest.raises(ParseError, match="no JSON object found") as info:
        parse_facts(P1_B)
    assert info.value.raw == P1_B


def test_prose_with_bracketed_numbers_is_not_json() -> None:
    with pytest.raises(ParseError, match="no JSON object found"):
        extract_json("Step [1] then step [2]: nothing to report.")


def test_empty_array_is_zero_facts_not_an_error() -> None:
    parsed = parse_facts("[]")
    assert parsed.records == () and parsed.errors == () and not parsed.is_malformed


def test_p2_bare_list_with_aliases_is_mapped() -> None:
    parsed = parse_facts(P2)
    assert parsed.records == ()
    # P2 has no description: the aliases map subj/obj/evidence, but the record is still
    # rejected with a field-level error instead of being persisted with an empty field.
    assert len(parsed.errors) == 1
    assert parsed.errors[0].reason == "missing_fields"
    assert parsed.errors[0].missing_fields == ("description",)
    assert parsed.counters["bare_list"] == 1
    assert parsed.counters["aliased_keys"] == 3
    assert parsed.is_malformed


def test_p2_bare_list_with_aliases_and_all_fields_is_accepted() -> None:
    record = json.loads(P2)[0] | {"description": "Acme Corp was founded in 1999."}
    parsed = parse_facts(json.dumps([record]))
    assert parsed.records == (
        FactRecord(
            title="Founding year",
            description="Acme Corp was founded in 1999.",
            subject="Acme Corp",
            predicate="founded_in",
            object="1999",
            evidence_span="Acme Corp was founded in 1999",
            confidence=80,
        ),
    )


def test_alias_table_is_explicit() -> None:
    assert FIELD_ALIASES["subj"] == "subject"
    assert FIELD_ALIASES["obj"] == "object"
    assert FIELD_ALIASES["evidence"] == "evidence_span"
    # An unknown key is never renamed: "entity_name" does not become the subject.
    with pytest.raises(ParseError) as info:
        coerce_record(
            {
                "entity_name": "Acme",
                "title": "t",
                "description": "d",
                "predicate": "p",
                "object": "o",
                "evidence_span": "e",
            }
        )
    assert info.value.missing_fields == ("subject",)


def test_canonical_key_wins_over_alias() -> None:
    rec = coerce_record(
        {
            "title": "t",
            "description": "d",
            "subject": "Real",
            "subj": "Alias",
            "predicate": "p",
            "object": "o",
            "evidence_span": "e",
            "confidence": 10,
        }
    )
    assert rec.subject == "Real"


@pytest.mark.parametrize("raw", [P3_A, P3_B, P3_C], ids=["A-json_input", "B-tool-envelope", "C-stringified"])
def test_p3_one_wrapper_level_is_unwrapped(raw: str) -> None:
    parsed = parse_facts(raw)
    assert parsed.records == (EXPECTED_TSPOE,)
    assert parsed.errors == ()
    assert parsed.counters["envelope_unwrapped"] == 1


def test_p3_d_partial_fragments_stay_rejected_with_missing_fields() -> None:
    parsed = parse_facts(P3_D)
    assert parsed.records == ()
    assert parsed.errors[0].missing_fields == ("title", "description", "predicate", "object", "evidence_span")
    assert "envelope_unwrapped" not in parsed.counters
    with pytest.raises(ParseError) as info:
        coerce_record(json.loads(P3_D))
    assert info.value.missing_fields == ("title", "description", "predicate", "object", "evidence_span")


def test_envelope_around_a_facts_list_is_unwrapped() -> None:
    raw = json.dumps({"parameters": {"facts": [json.loads("{" + _TSPOE + "}")]}})
    parsed = parse_facts(raw)
    assert parsed.records == (EXPECTED_TSPOE,)
    assert parsed.counters["envelope_unwrapped"] == 1


def test_g1_confidence_policy_keeps_valid_siblings() -> None:
    raw = json.dumps(
        [
            _g1_record(1999, 0.85),
            _g1_record("Beta", "85%"),
            _g1_record("Gamma", 140),
            _g1_record("Delta", "high"),
            _g1_record("Eps", 72),
        ]
    )
    parsed = parse_facts(raw)
    assert [(r.object, r.confidence) for r in parsed.records] == [("1999", 85), ("Beta", 85), ("Eps", 72)]
    assert [(e.index, e.reason) for e in parsed.errors] == [(2, "bad_confidence"), (3, "bad_confidence")]
    assert "140" in parsed.errors[0].message and "not clamped" in parsed.errors[0].message
    assert "'high'" in parsed.errors[1].message
    assert parsed.counters["records_rejected"] == 2


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.85, 85), ("85%", 85), (72, 72), ("72", 72), ("0.5", 50), (1, 1), (0, 0), (100, 100), (72.4, 72)],
)
def test_coerce_confidence_accepts(value: object, expected: int) -> None:
    assert coerce_confidence(value) == expected


@pytest.mark.parametrize("value", [140, "high", True, -3, "120%", float("nan"), None])
def test_coerce_confidence_rejects(value: object) -> None:
    with pytest.raises(ValueError):
        coerce_confidence(value)


def test_missing_confidence_defaults_and_is_counted() -> None:
    counts: dict[str, int] = {}
    from collections import Counter

    c: Counter[str] = Counter()
    rec = coerce_record(
        {
            "title": "t",
            "description": "d",
            "subject": "s",
            "predicate": "p",
            "object": "o",
            "evidence_span": "e",
        },
        c,
    )
    counts.update(c)
    assert rec.confidence == DEFAULT_CONFIDENCE
    assert counts == {"confidence_defaulted": 1}


def test_non_scalar_string_field_is_rejected_not_stringified() -> None:
    parsed = parse_facts(json.dumps([_g1_record({"name": "x"}, 50), _g1_record(True, 50)]))
    assert parsed.records == ()
    assert [e.reason for e in parsed.errors] == ["bad_type", "bad_type"]
    assert "'object'" in parsed.errors[0].message


def test_blank_required_field_counts_as_missing() -> None:
    parsed = parse_facts(json.dumps([_g1_record("   ", 50)]))
    assert parsed.errors[0].missing_fields == ("object",)


def test_json_string_holding_the_array_is_decoded() -> None:
    raw = json.dumps(json.dumps([json.loads("{" + _TSPOE + "}")]))
    assert parse_facts(raw).records == (EXPECTED_TSPOE,)


def test_unclosed_think_block_before_json() -> None:
    raw = "<think>hmm, let me see\n[" + "{" + _TSPOE + "}]"
    parsed = parse_facts(raw)
    assert parsed.records == (EXPECTED_TSPOE,)
    assert parsed.counters["think_stripped"] == 1


def test_non_object_items_are_errors_not_crashes() -> None:
    parsed = parse_facts('{"facts": ["just a string", {' + _TSPOE + "}]}")
    assert parsed.records == (EXPECTED_TSPOE,)
    assert [(e.index, e.reason) for e in parsed.errors] == [(0, "not_an_object")]


def test_array_cut_off_at_the_token_limit_keeps_its_complete_records() -> None:
    one = "{" + _TSPOE + "}"
    raw = '```json\n{"facts": [' + one + ", " + one.replace('"O"', '"O2"') + ', {"title": "cut off here'
    parsed = parse_facts(raw)
    assert [r.object for r in parsed.records] == ["O", "O2"]
    assert parsed.counters["truncated_salvaged"] == 1


def test_cut_off_inside_the_first_record_is_reported_as_cut_off() -> None:
    with pytest.raises(ParseError) as info:
        parse_facts('[{"title": "T", "description": "half')
    assert str(info.value) == (
        "JSON cut off: the JSON array opened at character 0 never closes (the reply ended inside it, "
        "e.g. at its token limit) and holds no complete record"
    )
    assert reply_failure(info.value) == "cut_off"
    assert info.value.raw == '[{"title": "T", "description": "half'


def test_malformed_object_is_reported_as_malformed_not_as_no_json() -> None:
    raw = 'Here you go: {"title": "T", "subject": "S" "object": "O"} as asked.'
    with pytest.raises(ParseError) as info:
        parse_facts(raw)
    assert str(info.value) == (
        "malformed JSON: the JSON object at characters 13-57 does not parse (Expecting ',' delimiter "
        "at line 1 column 31) and holds no well-formed record"
    )
    assert reply_failure(info.value) == "malformed_json"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("I cannot find any facts [1] in this {see above} text.", "no_json"),
        ('["only", "strings"] and then {"title": "T" "x": 1}', "malformed_json"),
        ('```json\n{"facts": [{"title": "Acme was fou', "cut_off"),
        ('<think>{"a": </think> plain prose', "no_json"),
    ],
)
def test_each_reply_failure_has_its_own_reason(raw: str, reason: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_facts(raw)
    assert reply_failure(info.value) == reason
    assert str(info.value).startswith(REPLY_FAILURES[reason] + ": ")


def test_record_errors_are_not_reply_failures() -> None:
    with pytest.raises(ParseError) as info:
        coerce_record({"title": "T"})
    assert reply_failure(info.value) == ""


# --- One bad record never costs its neighbours (issue 13 item 5) -----------------------------


def _rec(obj: str, evidence: str) -> str:
    return json.dumps(
        {
            "title": f"Acme {obj}",
            "description": "D",
            "subject": "Acme",
            "predicate": "p",
            "object": obj,
            "evidence_span": evidence,
            "confidence": 70,
            "tags": [],
        }
    )


BAD_QUOTE = (
    '{"title": "Jane Roe said "we will grow"", "description": "D", "subject": "Jane Roe", '
    '"predicate": "said", "object": "growth", "evidence_span": "E", "confidence": 70, "tags": []}'
)


def test_array_with_one_bad_record_in_the_middle_keeps_the_others_and_reports_it() -> None:
    raw = (
        "["
        + ", ".join(
            [
                _rec("1999", "e1"),
                _rec("Springfield", "e2"),
                BAD_QUOTE,
                _rec("412", "e4"),
                _rec("Jane Roe", "e5"),
            ]
        )
        + "]"
    )
    parsed = parse_facts(raw)
    assert [r.object for r in parsed.records] == ["1999", "Springfield", "412", "Jane Roe"]
    assert [(e.index, e.reason) for e in parsed.errors] == [(2, "malformed_json")]
    assert "we will grow" in parsed.errors[0].message
    assert parsed.counters["records_malformed"] == 1
    assert "truncated_salvaged" not in parsed.counters  # a bad record is not a cut-off reply


def test_bad_record_inside_a_wrapper_and_a_fence() -> None:
    raw = '```json\n{"facts": [' + _rec("A", "e1") + ", " + BAD_QUOTE + ", " + _rec("C", "e3") + "]}\n```"
    parsed = parse_facts(raw)
    assert [r.object for r in parsed.records] == ["A", "C"]
    assert [(e.index, e.reason) for e in parsed.errors] == [(1, "malformed_json")]


def test_missing_comma_record_reported_and_cut_tail_counted() -> None:
    broken = (
        '{"title": "X", "description": "D" "subject": "S", "predicate": "p", "object": "X", '
        '"evidence_span": "E"}'
    )
    raw = "[" + _rec("A", "e1") + ", " + broken + ", " + _rec("C", "e3") + ', {"title": "cut'
    parsed = parse_facts(raw)
    assert [r.object for r in parsed.records] == ["A", "C"]
    assert [(e.index, e.reason) for e in parsed.errors] == [(1, "malformed_json"), (3, "malformed_json")]
    assert parsed.counters["truncated_salvaged"] == 1
    assert parsed.counters["records_malformed"] == 2


# --- the extractor reports a reply cut twice and a malformed one differently (issue 25) -------


def _extract_with_replies(*replies: Reply) -> DocExtraction:
    reset_format_memory()
    with StubServer() as stub:
        stub.push(*replies)
        doc = Document(docid="d1", text="Acme Corp was founded in 1999 by Jane Roe.")
        with dspy.context(lm=stub_server_lm(stub.base_url)):
            return FactExtractor(max_retry_tokens=1024).extract_document(doc)


def test_reply_cut_twice_and_malformed_reply_fail_for_different_reasons() -> None:
    cut = '{"facts": [{"title": "Acme Corp was founded in 1999", "description": "Acme Corp was fou'
    twice = _extract_with_replies(
        Reply.ok(cut, finish_reason="length"), Reply.ok(cut, finish_reason="length")
    )
    malformed = '{"facts": [{"title": "Acme Corp was founded in 1999" "subject": "Acme Corp"}]}'
    bad = _extract_with_replies(Reply.ok(malformed), Reply.ok(malformed))
    assert twice.status == bad.status == "failed"
    assert twice.error == (
        "JSON cut off: the JSON object opened at character 0 never closes (the reply ended inside it, "
        "e.g. at its token limit) and holds no complete record"
    )
    assert twice.counters["truncated_replies"] == 2 and twice.counters["truncation_retries"] == 1
    assert bad.error == (
        "malformed JSON: the JSON object at characters 0-78 does not parse (Expecting ',' delimiter at "
        "line 1 column 54) and holds no well-formed record"
    )
    assert twice.raw == cut and bad.raw == malformed


def test_typed_bracket_confidence_and_fields_are_coerced() -> None:
    assert coerce_confidence("int[90]") == 90
    assert coerce_confidence("float[0.85]") == 85
    with pytest.raises(ValueError):
        coerce_confidence("int[high]")
    record = {
        "title": "Acme Corp was founded in 1999",
        "description": "Acme Corp was founded in 1999.",
        "subject": "str[Acme Corp]",
        "predicate": "founded_in",
        "object": "int[1999]",
        "evidence_span": "Acme Corp was founded in 1999",
        "confidence": "int[90]",
    }
    parsed = parse_facts(json.dumps([record]))
    assert parsed.errors == ()
    assert (parsed.records[0].subject, parsed.records[0].object, parsed.records[0].confidence) == (
        "Acme Corp",
        "1999",
        90,
    )


def test_extractor_keeps_a_fact_whose_confidence_came_back_typed() -> None:
    from dspy.utils import DummyLM

    record = {
        "title": "Acme Corp was founded in 1999",
        "description": "Acme Corp was founded in 1999 by Jane Roe.",
        "subject": "Acme Corp",
        "predicate": "founded_in",
        "object": "1999",
        "evidence_span": "Acme Corp was founded in 1999",
        "confidence": "int[90]",
    }
    lm = DummyLM([{"facts": json.dumps([record])}])
    doc = Document(docid="d1", text="Acme Corp was founded in 1999 by Jane Roe.")
    with dspy.context(lm=lm):
        result = FactExtractor().extract_document(doc)
    assert result.status == "ok" and [k.payload.confidence for k in result.kis] == [90]
    assert "records_rejected" not in result.counters
