"""The domain describer: robust parsing of drifting replies, validation, retry and fallback."""

from __future__ import annotations

import json

import dspy
import pytest
from dspy.utils import DummyLM

from kitune.errors import ParseError
from kitune.programs.domain_describer import (
    DomainDescriber,
    DomainDescription,
    parse_description,
    render_sample,
    to_predicate,
)
from kitune.schema import Document

GOOD = {
    "domain": "Encyclopedia paragraphs about films, rivers and chemists",
    "summary": "Short reference paragraphs.",
    "document_kinds": ["encyclopedia paragraph"],
    "entity_types": ["Person", "film", "river"],
    "predicates": ["directed_by", "flows_through"],
    "fields": {},
    "query_patterns": ["Who directed X?"],
    "date_range": {"start": "1810", "end": "1919"},
    "disambiguating_details": ["birth year"],
}
DOCS = [Document(docid="1", title="Film1", text="The film Film1 was directed by Ana Ruiz.")]


def test_parses_fenced_reply_after_reasoning() -> None:
    raw = "<think>Let me look.</think>Here it is:\n```json\n" + json.dumps(GOOD) + "\n```"
    d, counts = parse_description(raw)
    assert d.domain == GOOD["domain"]
    assert d.entity_types == ("person", "film", "river")
    assert d.date_range is not None and d.date_range.label() == "1810 – 1919"
    assert counts["think_stripped"] == 1 and counts["fence_stripped"] == 1


def test_aliases_wrappers_and_shape_drift() -> None:
    raw = json.dumps(
        {
            "description": {
                "topic": "Payments",
                "entities": "Customer, Payment, customer",
                "relations": ["Paid By", "refund of", "9", "x"],
                "dates": "2024-01-10 to 2024-09-18",
                "field_meanings": [{"name": "amount_eur", "meaning": "amount in euros"}, "status"],
                "queries": "refunds last month; payments by customer",
            }
        }
    )
    d, counts = parse_description(raw)
    assert counts["wrapper_unwrapped"] == 1
    assert d.domain == "Payments"
    assert d.entity_types == ("customer", "payment")
    assert d.predicates == ("paid_by", "refund_of")  # "9" and "x" are no usable predicate
    assert d.date_range is not None and (d.date_range.start, d.date_range.end) == ("2024-01-10", "2024-09-18")
    assert d.fields == {"amount_eur": "amount in euros", "status": ""}
    assert d.query_patterns == ("refunds last month", "payments by customer")


def test_date_range_forms() -> None:
    assert DomainDescription(domain="x", date_range="1990-2020").date_range.label() == "1990 – 2020"  # type: ignore[arg-type,union-attr]
    assert DomainDescription(domain="x", date_range="2019-05-01").date_range.label() == "2019-05-01"  # type: ignore[arg-type,union-attr]
    assert DomainDescription(domain="x", date_range=["1900", None]).date_range.label() == "1900"  # type: ignore[arg-type,union-attr]
    assert DomainDescription(domain="x", date_range={"start": "unknown", "end": "null"}).date_range is None  # type: ignore[arg-type]
    assert DomainDescription(domain="x", date_range=None).date_range is None


def test_lists_are_capped_and_strings_cut() -> None:
    d = DomainDescription(domain="d" * 300, entity_types=[f"type{i}" for i in range(30)])  # type: ignore[arg-type]
    assert len(d.domain) == 120 and d.domain.endswith("…")
    assert len(d.entity_types) == 12


def test_to_predicate() -> None:
    assert to_predicate("Directed By") == "directed_by"
    assert to_predicate("  2nd-place finish ") == "nd_place_finish"
    assert to_predicate("a" * 40) == "a" * 32
    assert to_predicate("??") == ""


def test_no_domain_or_no_json_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="domain"):
        parse_description(json.dumps({"entity_types": ["person"]}))
    with pytest.raises(ParseError, match="no JSON object found"):
        parse_description("I think this is about films.")


def test_render_sample_cuts_long_documents() -> None:
    docs = [Document(docid="7", title="T", text="word " * 200), Document(docid="8", text="short")]
    text = render_sample(docs, doc_chars=50)
    assert text.startswith("[7] T\n") and " …\n\n[8]\nshort" in text


def test_describe_with_dummy_lm_makes_one_call() -> None:
    lm = DummyLM([{"description_json": json.dumps(GOOD)}])
    with dspy.context(lm=lm):
        res = DomainDescriber().describe(DOCS, corpus_name="dev", questions=["Who directed Film1?"])
    assert res.status == "ok" and res.lm_calls == 1
    assert res.description.predicates == ("directed_by", "flows_through")
    prompt = lm.history[0]["messages"][-1]["content"]
    assert "[1] Film1" in prompt and "- Who directed Film1?" in prompt and "none (prose documents)" in prompt


def test_unusable_replies_fall_back_after_one_retry() -> None:
    lm = DummyLM([{"description_json": "no idea"}, {"description_json": '{"summary": "films"}'}])
    with dspy.context(lm=lm):
        res = DomainDescriber().describe(
            DOCS,
            corpus_name="pay",
            kind="records",
            fields={"amount": "in 3 of 3 records"},
            pin_types=["Invoice"],
        )
    assert res.status == "fallback" and res.lm_calls == 2
    assert "domain" in res.error
    assert res.description.domain == "pay corpus"
    assert res.description.entity_types == ("invoice",)
    assert res.description.fields == {"amount": ""}
    assert "amount: in 3 of 3 records" in lm.history[0]["messages"][-1]["content"]
