"""Record models carry the lenient reading (aliases, envelope, confidence) as validators; schema unchanged."""

from __future__ import annotations

from collections import Counter

import pytest
from pydantic import ValidationError

from kitune.lm import RecordError, Records
from kitune.programs.records import DEFAULT_CONFIDENCE, FactRecord, PlanDraft, SentenceFactRecord
from kitune.programs.sentences import resolve_citations, sentence_spans

TEXT_FIELDS = ("title", "description", "subject", "predicate", "object")


def test_the_validators_leave_the_schema_the_model_is_shown_alone() -> None:
    # the schema is the prompt (and the recorded requests' bytes): confidence stays required with
    # no default although a missing one is defaulted by the validator
    fact = FactRecord.model_json_schema()
    assert fact["required"] == [*TEXT_FIELDS, "evidence_span", "confidence"]
    assert "default" not in fact["properties"]["confidence"]
    assert (
        fact["description"]
        == "One fact as the extractor writes it (the items of the extractor's ``facts`` output)."
    )
    sentence = SentenceFactRecord.model_json_schema()
    assert sentence["required"] == [*TEXT_FIELDS, "evidence_sentences", "confidence"]
    assert list(PlanDraft.model_json_schema()["properties"]) == [
        "entity_tags",
        "lexical",
        "semantic",
        "filters",
    ]
    assert "LIST_KEYS" not in fact["properties"]


def test_aliases_case_typed_values_and_tags_are_read_and_counted() -> None:
    counts: Counter[str] = Counter()
    record = FactRecord.model_validate(
        {
            "Title": " Acme was founded ",
            "DESC": "Acme was founded in 1999.",
            "subj": "str[Acme]",
            "Relation": "founded_in",
            "object": 1999,
            "quote": "Acme was founded in 1999",
            "tags": "org, company",
        },
        context={"counts": counts},
    )
    assert record == FactRecord(
        title="Acme was founded",
        description="Acme was founded in 1999.",
        subject="Acme",
        predicate="founded_in",
        object="1999",
        evidence_span="Acme was founded in 1999",
        confidence=DEFAULT_CONFIDENCE,
        tags=["org", "company"],
    )
    assert counts == {"aliased_keys": 4, "confidence_defaulted": 1}
    with pytest.raises(ValidationError):  # one record: frozen like the candidate it replaced
        record.title = "changed"  # type: ignore[misc]


def test_one_envelope_level_is_unwrapped_and_counted() -> None:
    inner = {name: "x" for name in (*TEXT_FIELDS, "evidence_span")}
    counts: Counter[str] = Counter()
    record = FactRecord.model_validate({"type": "function", "parameters": inner}, context={"counts": counts})
    assert record.subject == "x" and counts == {"envelope_unwrapped": 1, "confidence_defaulted": 1}


@pytest.mark.parametrize(
    ("change", "kind", "missing"),
    [
        ({"object": "   "}, "missing_fields", ("object",)),
        ({"object": {"name": "x"}}, "bad_type", ()),
        ({"confidence": 140}, "bad_confidence", ()),
        ({"confidence": "high"}, "bad_confidence", ()),
    ],
)
def test_a_bad_record_is_rejected_with_its_reason(
    change: dict[str, object], kind: str, missing: tuple[str, ...]
) -> None:
    values = {name: "x" for name in (*TEXT_FIELDS, "evidence_span")} | change
    with pytest.raises(ValidationError) as info:
        FactRecord.model_validate(values)
    error = info.value.errors()[0]
    assert error["type"] == kind and tuple(error["ctx"]["missing"]) == missing


def test_a_sentence_record_reads_its_citation_under_any_key_and_ignores_a_quote() -> None:
    base = {name: "x" for name in TEXT_FIELDS}
    assert SentenceFactRecord.model_validate({**base, "evidence": "[3, 4]"}).evidence_sentences == [3, 4]
    assert SentenceFactRecord.model_validate({**base, "Sentence_IDs": 2.0}).evidence_sentences == [2]
    quoted = SentenceFactRecord.model_validate({**base, "evidence_quote": "a quote", "confidence": 0.7})
    assert quoted.evidence_sentences == [] and quoted.confidence == 70


def test_plan_draft_reads_null_and_a_single_tag_but_not_a_list_for_text() -> None:
    assert PlanDraft.model_validate({"entity_tags": "Acme", "lexical": None, "filters": None}) == PlanDraft(
        entity_tags=["Acme"]
    )
    with pytest.raises(ValidationError):
        PlanDraft.model_validate({"lexical": ["acme"]})


def test_resolve_citations_copies_the_sentences_and_rejects_a_record_citing_none() -> None:
    text = "Acme was founded in 1999. It is in Springfield. It has 12 staff."
    spans = sentence_spans(text)
    base = {name: "x" for name in TEXT_FIELDS}
    records = Records(
        [
            SentenceFactRecord.model_validate({**base, "object": "1999", "evidence_sentences": [1]}),
            SentenceFactRecord.model_validate({**base, "object": "none", "evidence_sentences": [9]}),
            SentenceFactRecord.model_validate({**base, "object": "staff", "evidence_sentences": [3, 1]}),
        ],
        errors=[RecordError(1, "bad_type", "earlier drop")],
        counters={"bare_list": 1, "records_rejected": 1},
    )
    facts = resolve_citations(records, text, spans)
    assert [(f.object, f.evidence_span) for f in facts] == [
        ("1999", "Acme was founded in 1999."),
        ("staff", "It has 12 staff."),
    ]
    # the reply was [1999, <earlier drop>, none, staff]: the new error sits at the reply's place 2
    assert [(e.index, e.reason, e.missing_fields) for e in facts.errors] == [
        (1, "bad_type", ()),
        (2, "missing_fields", ("evidence_span",)),
    ]
    assert facts.counters == {
        "bare_list": 1,
        "records_rejected": 2,
        "bad_sentence_number": 1,
        "evidence_sentences_trimmed": 1,
    }
