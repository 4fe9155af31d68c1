"""Fact rules after generation: lengths, predicate, tags, source mentions, markers, evidence (E1)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest

from kitune.ki import ki_id
from kitune.programs.fact_extractor import split_text
from kitune.programs.guardrails import (
    Drop,
    apply_guardrails,
    check_fact,
    fact_values,
    normalize_predicate,
    normalize_tags,
)
from kitune.programs.records import FactRecord
from kitune.programs.sentences import sentence_spans


def _with(fact: FactRecord, **change: object) -> FactRecord:
    """``fact`` with fields changed as given, unvalidated (so the guardrails see the raw values)."""
    return fact.model_copy(update=change)


NOW = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
E1_DOC = (
    "The COVID\u201119 trial (n\u2009=\u2009412) reported a \u22123.5% change\u2026 \u201cpreliminary\u201d"
    " per the board\u2019s note; effective\u00a01 May."
)
Q_OK = (
    "The COVID-19 trial (n = 412) reported a -3.5% change... "
    '"preliminary" per the board\'s note; effective 1 May.'
)
Q_PARA = "The COVID-19 study (n = 412) reported a -3.5% change"
DOC = "Acme Corp was founded in 1999 by Jane Roe. Acme Corp is headquartered in Springfield."

BASE = FactRecord(
    title="Acme Corp was founded in 1999",
    description="Acme Corp, an industrial firm, was founded in 1999 by Jane Roe.",
    subject="Acme Corp",
    predicate="founded_in",
    object="1999",
    evidence_span="Acme Corp was founded in 1999",
    confidence=80,
    tags=("org",),
)


def test_valid_fact_becomes_ki_with_exact_fields() -> None:
    ki = check_fact(BASE, DOC, docid="d1", prompt_version="extractor@abcd1234", corpus="fixture", now=NOW)
    assert not isinstance(ki, Drop)
    assert ki.id == ki_id("d1", "Acme Corp", "founded_in", "1999")
    assert ki.tags == ["org", "entity:acme-corp", "entity:1999", "doc:d1"]
    assert ki.payload.evidence == ["Acme Corp was founded in 1999"]
    assert ki.payload.confidence == 80
    assert ki.payload.last_seen == NOW
    assert ki.references == ["index://fixture"]
    assert ki.prompt_version == "extractor@abcd1234"


def test_e1_honest_quote_matches_and_span_is_cut_from_original() -> None:
    fact = _with(BASE, evidence_span=Q_OK, subject="COVID-19 trial", object="412")
    ki = check_fact(fact, E1_DOC, docid="d2", now=NOW)
    assert not isinstance(ki, Drop)
    assert ki.payload.evidence == [E1_DOC]
    assert "\u2011" in ki.payload.evidence[0] and "\u2009" in ki.payload.evidence[0]


def test_e1_paraphrase_is_dropped() -> None:
    fact = _with(BASE, evidence_span=Q_PARA)
    drop = check_fact(fact, E1_DOC, docid="d2", now=NOW)
    assert isinstance(drop, Drop) and drop.reason == "evidence_not_found"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"title": "x" * 141}, "title_too_long"),
        ({"description": "y" * 351}, "description_too_long"),
        ({"predicate": "founded in (year)"}, "bad_predicate"),
        ({"predicate": "a" * 33}, "bad_predicate"),
        ({"predicate": "1st_founder"}, "bad_predicate"),
        ({"title": "This document says Acme was founded in 1999"}, "mentions_source"),
        ({"description": "According to the article, Acme was founded in 1999."}, "mentions_source"),
        ({"description": "The passage describes the founding of Acme in 1999."}, "mentions_source"),
        ({"description": "Acme appears in the dataset as a 1999 firm."}, "mentions_source"),
        ({"title": "BrowseComp answer: Acme founded 1999"}, "benchmark_marker"),
        ({"description": "MuSiQue question about Acme in 1999."}, "benchmark_marker"),
        ({"object": "HotpotQA"}, "benchmark_marker"),
        ({"description": "canary 3f2a1b4c-1234-4abc-9def-0123456789ab"}, "benchmark_marker"),
        ({"subject": " "}, "empty_field"),
        ({"evidence_span": "Acme Corp was founded in 2001", "object": "2001"}, "evidence_not_found"),
        ({"description": "qid: 4711. Acme Corp was founded in 1999."}, "forbidden_phrase"),
        ({"description": "Use this fact to answer founding questions about Acme."}, "forbidden_phrase"),
        ({"description": "It can anchor a criterion on founding dates for Acme."}, "forbidden_phrase"),
        ({"title": "Acme Corp was founded in 1999, known without re‑reading"}, "forbidden_phrase"),
    ],
)
def test_each_rule_drops_with_its_reason(change: dict[str, str], reason: str) -> None:
    drop = check_fact(_with(BASE, **change), DOC, docid="d1", now=NOW)
    assert isinstance(drop, Drop)
    assert drop.reason == reason


def test_predicate_and_tags_are_normalised_not_dropped() -> None:
    from collections import Counter

    counts: Counter[str] = Counter()
    fact = _with(BASE, predicate="Founded In", tags=("Org", "Tech Company", "!!"))
    ki = check_fact(fact, DOC, docid="d1", now=NOW, counters=counts)
    assert not isinstance(ki, Drop)
    assert ki.payload.properties.predicate == "founded_in"
    assert ki.tags[:2] == ["org", "tech-company"]
    assert counts == {"predicate_normalised": 1, "tags_normalised": 1}


def test_normalize_helpers() -> None:
    assert normalize_predicate("foundedBy") == "founded_by"
    assert normalize_predicate("member-of") == "member_of"
    assert normalize_tags(["Org", "org", "", "Zürich"]) == ["org", "zurich"]


def test_apply_guardrails_counts_drops_caps_and_dedupes() -> None:
    hq = _with(
        BASE,
        title="Acme Corp is headquartered in Springfield",
        description="Acme Corp has its headquarters in Springfield.",
        predicate="headquartered_in",
        object="Springfield",
        evidence_span="Acme Corp is headquartered in Springfield",
    )
    founder = _with(
        BASE,
        title="Acme Corp was founded by Jane Roe",
        description="Jane Roe founded Acme Corp in 1999.",
        predicate="founded_by",
        object="Jane Roe",
        evidence_span="founded in 1999 by Jane Roe",
    )
    bad = _with(BASE, title="The text says so", predicate="said")
    facts = [(BASE, DOC), (BASE, DOC), (bad, DOC), (hq, DOC), (founder, DOC)]
    result = apply_guardrails(facts, docid="d1", max_facts=2, now=NOW, prompt_version="extractor@x")
    assert [k.payload.properties.object for k in result.kis] == ["1999", "Springfield"]
    assert result.drop_counts == {"duplicate": 1, "mentions_source": 1, "over_cap": 1}
    assert len(result.kis) + len(result.drops) == len(facts)


def test_evidence_checked_against_the_given_chunk_text() -> None:
    chunk = DOC[DOC.index("Acme Corp is") :]
    result = apply_guardrails([(BASE, chunk)], docid="d1", max_facts=5, now=NOW)
    assert result.kis == ()
    assert result.drop_counts == {"evidence_not_found": 1}


def test_evidence_with_an_invented_full_stop_is_trimmed() -> None:
    doc = "Acme Corp was founded in 1999 -- and later moved to Springfield."
    fact = _with(BASE, evidence_span="Acme Corp was founded in 1999.")
    counts: Counter[str] = Counter()
    ki = check_fact(fact, doc, docid="d1", now=NOW, counters=counts)
    assert not isinstance(ki, Drop)
    assert ki.payload.evidence == ["Acme Corp was founded in 1999"]
    assert counts["evidence_trimmed"] == 1


def test_misquoted_evidence_is_repaired_from_the_sentence_holding_subject_and_object() -> None:
    fact = _with(BASE, evidence_span="Acme was set up in 1999 by its founder")
    counts: Counter[str] = Counter()
    ki = check_fact(fact, DOC, docid="d1", now=NOW, counters=counts)
    assert not isinstance(ki, Drop)
    assert ki.payload.evidence == ["Acme Corp was founded in 1999 by Jane Roe."]
    assert counts["evidence_repaired"] == 1


def test_repair_needs_subject_and_object_in_one_sentence() -> None:
    doc = "Acme Corp was founded by Jane Roe. The year 1999 saw a flood."
    fact = _with(BASE, evidence_span="Acme Corp was founded in 1999")
    assert isinstance(check_fact(fact, doc, docid="d1", now=NOW), Drop)
    # subject words (>= 4 letters) may stand apart in the sentence
    doc2 = "In 1999 the Acme trading Corp house opened."
    fact2 = _with(BASE, subject="Acme Trading", evidence_span="made up")
    ki = check_fact(fact2, doc2, docid="d1", now=NOW)
    assert not isinstance(ki, Drop) and ki.payload.evidence == [doc2]


def test_long_description_keeps_its_leading_sentences_that_fit() -> None:
    first = "Acme Corp, an industrial firm, was founded in 1999 by Jane Roe. "
    long = first + "It grew quickly. " * 30
    counts: Counter[str] = Counter()
    ki = check_fact(_with(BASE, description=long), DOC, docid="d1", now=NOW, counters=counts)
    assert not isinstance(ki, Drop)
    assert len(ki.description) <= 350 and ki.description.startswith(first.strip())
    assert ki.description.endswith("It grew quickly.")
    assert counts["description_trimmed"] == 1
    one_sentence = "x" * 351
    drop = check_fact(_with(BASE, description=one_sentence), DOC, docid="d1", now=NOW)
    assert isinstance(drop, Drop) and drop.reason == "description_too_long"


def test_nfd_document_stored_evidence_is_the_exact_original_slice() -> None:
    import unicodedata

    doc = unicodedata.normalize("NFD", "Café Müller was founded in Zürich in 1921. It closed in 1999.")
    fact = _with(
        BASE, subject="Café Müller", object="1921", evidence_span="Café Müller was founded in Zürich in 1921."
    )
    ki = check_fact(fact, doc, docid="d9", now=NOW)
    assert not isinstance(ki, Drop)
    assert ki.payload.evidence == [unicodedata.normalize("NFD", "Café Müller was founded in Zürich in 1921.")]
    assert ki.payload.evidence[0] in doc


def test_forbidden_phrases_are_dropped_and_counted_and_vague_predicates_counted() -> None:
    bad = _with(BASE, description="Acme Corp was founded in 1999. Use  this fact for dates.")
    vague = _with(BASE, predicate="affiliated_with", object="Jane Roe", evidence_span="by Jane Roe")
    result = apply_guardrails([(bad, DOC), (BASE, DOC), (vague, DOC)], docid="d1", max_facts=15, now=NOW)
    assert [k.payload.properties.predicate for k in result.kis] == ["founded_in", "affiliated_with"]
    assert result.drop_counts == {"forbidden_phrase": 1}
    assert result.counters["vague_predicate"] == 1


# ----------------------------------------------------------------------------- a repair never changes a value

ACME_DOC = "Acme signed the agreement on 1 May 2023. The deal was large."
SIGNED = FactRecord(
    title="Acme signed the agreement on 1 June 2023",
    description="Acme signed the agreement on 1 June 2023 after long talks.",
    subject="Acme",
    predicate="signed",
    object="the agreement",
    evidence_span="Acme signed the deal on 1 June 2023",
    confidence=90,
)


def test_repair_that_would_contradict_the_title_drops_the_fact_with_a_counted_reason() -> None:
    counts: Counter[str] = Counter()
    drop = check_fact(SIGNED, ACME_DOC, docid="d1", now=NOW, counters=counts)
    assert isinstance(drop, Drop)
    assert drop.reason == "evidence_mismatch"
    assert drop.detail == (
        "evidence 'Acme signed the deal on 1 June 2023' is not in the text, and 'Acme signed the "
        "agreement on 1 May 2023.' (which names the subject and object) does not state the fact's "
        "date 2023-06-01"
    )
    assert counts["evidence_repaired"] == 0
    result = apply_guardrails([(SIGNED, ACME_DOC)], docid="d1", max_facts=5, now=NOW)
    assert result.kis == () and result.drop_counts == {"evidence_mismatch": 1}


def test_correct_repair_is_still_kept_whatever_the_date_form() -> None:
    for doc in ("Acme signed the agreement on 1 June 2023.", "On June 1, 2023 Acme signed the agreement."):
        counts: Counter[str] = Counter()
        ki = check_fact(SIGNED, doc, docid="d1", now=NOW, counters=counts)
        assert not isinstance(ki, Drop), doc
        assert ki.payload.evidence == [doc]
        assert counts["evidence_repaired"] == 1


def test_repair_skips_a_contradicting_sentence_for_a_later_supporting_one() -> None:
    doc = "Acme signed the agreement on 1 May 2023. Acme signed the agreement again on 1 June 2023."
    ki = check_fact(SIGNED, doc, docid="d1", now=NOW)
    assert not isinstance(ki, Drop)
    assert ki.payload.evidence == ["Acme signed the agreement again on 1 June 2023."]


def test_repair_needs_every_number_of_title_and_description() -> None:
    fact = _with(
        BASE,
        title="Acme Corp was founded in 1999",
        description="Acme Corp was founded in 1999 with 1,500 staff.",
        evidence_span="Acme was set up in 1999",
    )
    drop = check_fact(fact, DOC, docid="d1", now=NOW)
    assert isinstance(drop, Drop) and drop.reason == "evidence_mismatch"
    assert drop.detail.endswith("does not state the fact's number 1500")
    ki = check_fact(fact, "Acme Corp was founded in 1999 with 1500 employees.", docid="d1", now=NOW)
    assert not isinstance(ki, Drop)


def test_verbatim_quote_is_not_subject_to_the_value_rule() -> None:
    # the quote is found as written: nothing is repaired, so nothing is swapped in
    fact = _with(SIGNED, evidence_span="Acme signed the agreement on 1 May 2023")
    ki = check_fact(fact, ACME_DOC, docid="d1", now=NOW)
    assert not isinstance(ki, Drop) and ki.payload.evidence == ["Acme signed the agreement on 1 May 2023"]


JUNE1_PARTS = {("month", "2023-06"), ("day", "06-01"), ("number", "2023"), ("number", "1")}


@pytest.mark.parametrize(
    ("text", "required", "supplied_extra"),
    [
        (
            "on 1 June 2023",
            {("date", "2023-06-01")},
            JUNE1_PARTS,
        ),
        (
            "June 1st, 2023",
            {("date", "2023-06-01")},
            JUNE1_PARTS,
        ),
        (
            "the 1st of June 2023",
            {("date", "2023-06-01")},
            JUNE1_PARTS,
        ),
        (
            "2023-06-01",
            {("date", "2023-06-01")},
            JUNE1_PARTS,
        ),
        ("in June 2023", {("month", "2023-06")}, {("number", "2023")}),
        ("on 1 June", {("day", "06-01")}, {("number", "1")}),
        ("1,500 staff and 3.50% of 2 units", {("number", "1500"), ("number", "3.5"), ("number", "2")}, set()),
        ("the 4th album of B‑52s", {("number", "4"), ("number", "52")}, set()),
        ("no digits here", set(), set()),
    ],
)
def test_fact_values(text: str, required: set[tuple[str, str]], supplied_extra: set[tuple[str, str]]) -> None:
    values = fact_values(text)
    assert values.required == required
    assert values.supplied == required | supplied_extra


# --- issue 40: a repair never contradicts the model's own quote; CJK sentences -------------------


def test_repair_rejects_a_sentence_contradicting_the_quote_when_the_title_states_no_number() -> None:
    fact = FactRecord(
        title="Acme signed the agreement with Beta",
        description="Acme signed a supply agreement with Beta.",
        subject="Acme",
        predicate="signed_with",
        object="Beta",
        evidence_span="Acme signed the agreement with Beta on 1 May 2023",
        confidence=80,
        tags=(),
    )
    doc = "Acme signed the agreement with Beta on 1 June 2023. Prices rose."
    counts: Counter[str] = Counter()
    drop = check_fact(fact, doc, docid="d1", now=NOW, counters=counts)
    assert drop == Drop(
        "evidence_mismatch",
        "Acme signed the agreement with Beta",
        "evidence 'Acme signed the agreement with Beta on 1 May 2023' is not in the text, and 'Acme "
        "signed the agreement with Beta on 1 June 2023.' (which names the subject and object) does "
        "not state the quote's date 2023-05-01",
    )
    assert counts["evidence_repaired"] == 0
    # a quote whose values the sentence does state is still repaired (here: a paraphrased verb)
    agreeing = _with(fact, evidence_span="Acme inked the agreement with Beta on 1 June 2023")
    ki = check_fact(agreeing, doc, docid="d1", now=NOW)
    assert not isinstance(ki, Drop)
    assert ki.payload.evidence == ["Acme signed the agreement with Beta on 1 June 2023."]


CJK_DOC = "東京タワーは1958年に完成した。東京タワーの高さは333メートルである！誰が設計したか？内藤多仲だ。"


def test_repair_in_a_cjk_paragraph_cuts_at_the_cjk_full_stop() -> None:
    fact = FactRecord(
        title="東京タワーの高さは333メートル",
        description="東京タワーの高さは333メートルである。",
        subject="東京タワー",
        predicate="height",
        object="333メートル",
        evidence_span="東京タワーの高さは333メートルです",  # paraphrased: not verbatim
        confidence=80,
        tags=(),
    )
    ki = check_fact(fact, CJK_DOC, docid="d1", now=NOW)
    assert not isinstance(ki, Drop)
    assert ki.payload.evidence == ["東京タワーの高さは333メートルである！"]


def test_cjk_sentences_are_numbered_and_cut_one_by_one() -> None:
    spans = sentence_spans(CJK_DOC)
    assert [CJK_DOC[a:b] for a, b in spans] == [
        "東京タワーは1958年に完成した。",
        "東京タワーの高さは333メートルである！",
        "誰が設計したか？",
        "内藤多仲だ。",
    ]
    chunks = [c for _, c in split_text(CJK_DOC, 30)]
    assert "".join(chunks) == CJK_DOC
    assert chunks[0] == "東京タワーは1958年に完成した。"  # cut at the last 。 in the window's second half
