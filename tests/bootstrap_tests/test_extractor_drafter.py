"""The deterministic extractor draft: domain section, pinned entity types, diff."""

from __future__ import annotations

from kitune.programs.domain_describer import DomainDescription
from kitune.programs.extractor_drafter import (
    draft_extractor,
    ensure_pinned_types,
    instruction_diff,
    merge_entity_types,
)
from kitune.programs.instructions import instruction_version, load_instruction

DESC = DomainDescription(
    domain="Payments of a web shop.",
    summary="One record per payment.",
    document_kinds=["payment record"],
    entity_types=["customer", "payment"],
    predicates=["paid_by", "refund_of"],
    fields={"amount_eur": "amount in euros.", "status": ""},
    disambiguating_details=["payment date"],
    date_range={"start": "2024-01-10", "end": "2024-09-18"},  # type: ignore[arg-type]
)


def test_draft_is_neutral_text_plus_a_domain_section() -> None:
    neutral = load_instruction("extractor").text
    d = draft_extractor(DESC, corpus_name="shop", pin_types=["Invoice", "customer"])
    assert d.text.startswith(neutral + "\n\n")
    section = d.text[len(neutral) + 2 :].splitlines()
    assert section == [
        "Domain focus (shop): Payments of a web shop. One record per payment.",
        "Documents here are: payment record.",
        "Entity types to cover whenever they appear, each with its own facts: invoice, customer, payment.",
        "Prefer these predicates when they fit, before the general ones above: paid_by, refund_of.",
        "Record fields and their meaning (use the meaning, not the field name, in titles and descriptions): "
        "amount_eur = amount in euros; status.",
        "Details that tell similar entities apart in this collection; state them whenever the document "
        "gives them: payment date.",
        "Dates seen in this collection span 2024-01-10 – 2024-09-18; keep every date exactly as written.",
    ]
    assert d.entity_types == ("invoice", "customer", "payment")
    assert d.pins_restored == ("invoice",)
    assert d.version == instruction_version("extractor", d.text)
    assert d.neutral_version == load_instruction("extractor").version


def test_same_inputs_same_draft() -> None:
    a = draft_extractor(DESC, corpus_name="shop", pin_types=["invoice"])
    b = draft_extractor(DESC.model_copy(), corpus_name="shop", pin_types=["invoice"])
    assert a == b


def test_empty_aspects_leave_no_lines() -> None:
    d = draft_extractor(DomainDescription(domain="Films"), corpus_name="c", neutral="Extract facts.")
    assert d.text == "Extract facts.\n\nDomain focus (c): Films."
    assert d.diff.splitlines()[:2] == ["--- neutral", "+++ draft"]
    assert "+Domain focus (c): Films." in d.diff.splitlines()


def test_pins_survive_a_description_that_dropped_them() -> None:
    d = draft_extractor(
        DomainDescription(domain="Films", entity_types=["film"]),
        corpus_name="c",
        pin_types=["award", "Film Director"],
    )
    assert "facts: award, film director, film." in d.text
    assert d.pins_restored == ("award", "film director")
    assert ensure_pinned_types(d.text, ["award", "film director"]) == (d.text, ())


def test_ensure_pinned_types_appends_only_the_missing_ones() -> None:
    text = "Extract people and organisations. Cover every film_director."
    new, added = ensure_pinned_types(text, ["person", "Film Director", "organisation", "Award", "award"])
    assert added == ("person", "award")  # "people" is not "person"; plural "organisations" counts
    assert new == text + "\nAlways cover these entity types: person, award."
    assert ensure_pinned_types(new, ["person", "award"]) == (new, ())


def test_merge_entity_types_keeps_pins_first() -> None:
    assert merge_entity_types(["B", " a "], ["a", "c", ""]) == ("b", "a", "c")


def test_instruction_diff_is_empty_for_equal_texts() -> None:
    assert instruction_diff("x\n", "x") == ""


def test_dialogue_draft_starts_from_the_dialogue_instruction_and_drops_keep_dates_as_written() -> None:
    # issue 17: chat sessions get facts about named people, cited by turn, with resolved dates;
    # the generic "keep every date exactly as written" line would contradict that
    prose = draft_extractor(DESC, corpus_name="chat")
    chat = draft_extractor(DESC, corpus_name="chat", dialogue=True)
    dialogue = load_instruction("extractor_dialogue").text
    assert prose.text.startswith(load_instruction("extractor").text + "\n\n")
    assert chat.text.startswith(dialogue + "\n\nDomain focus (chat): Payments of a web shop.")
    assert "keep every date exactly as written" in prose.text
    assert "keep every date exactly as written" not in chat.text
    assert "8 May 2023 is 7 May 2023" in dialogue and "[n] Speaker:" in dialogue
    assert chat.version != prose.version
    assert chat.version == draft_extractor(DESC, corpus_name="chat", dialogue=True).version
