"""Typed outputs of the programs: what each DSPy signature asks the model to return.

The output *format* of every program comes from these types, not from its instruction text:
DSPy's adapters render them (ChatAdapter shows the JSON schema; JSONAdapter sends it as
``response_format``; :class:`kitune.lm.LocalJSONAdapter` sends ``json_object`` + schema, which
llama.cpp turns into a grammar). Optimisers rewrite instructions only, so they can no longer
rewrite the format away.

Confidence policy (the one policy, G1 in ``shared/cases/failure-cases.md``), applied by
:func:`kitune.programs.parsing.coerce_confidence` wherever a model states a confidence:
an integer 0–100 is taken as is; a value in (0, 1] with a fractional part is a fraction
(``0.85`` → 85); a percent string is a percentage (``"85%"`` → 85); other fractional values in
range are rounded; anything outside 0–100 (``140``) or not numeric (``"high"``, booleans) is
invalid — never clamped, never mapped to a default. An invalid confidence rejects a fact record
(its siblings are kept); a missing one gets :data:`kitune.programs.parsing.DEFAULT_CONFIDENCE`
and is counted.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["FactRecord", "GradingVerdict"]


class FactRecord(BaseModel):
    """One fact as the extractor writes it (the items of the extractor's ``facts`` output)."""

    model_config = ConfigDict(extra="ignore")

    title: str = Field(
        description="One natural sentence of at most 140 characters that states the fact and ends on "
        "its value where possible, e.g. 'Ada Lovelace was born in London'."
    )
    description: str = Field(
        description="2-3 sentences, at most 350 characters, that make the fact self-contained: who or "
        "what, the relation, the value, and the date, place or role that pins it down."
    )
    subject: str = Field(description="The entity the fact is about, named in full as in the text.")
    predicate: str = Field(
        description="A reusable snake_case relation of at most 32 characters, e.g. born_in, founded_by."
    )
    object: str = Field(description="The value: an entity, a date, a number or a short phrase, as written.")
    evidence_span: str = Field(
        description="An exact quote copied character for character from the text that supports the fact "
        "(one sentence or clause; no paraphrase, no changed punctuation)."
    )
    confidence: int = Field(ge=0, le=100, description="How sure you are that the fact is right, 0-100.")
    tags: list[str] = Field(
        default_factory=list,
        description="A few lowercase keywords (letters, digits, hyphens), e.g. person, organization, date.",
    )


class GradingVerdict(BaseModel):
    """The judge's typed verdict (kept for adapters that return one object)."""

    model_config = ConfigDict(extra="ignore")

    extracted_final_answer: str = Field(
        description="The final exact answer found in the response, or 'None' when there is none."
    )
    reasoning: str = Field(description="Why the extracted answer matches the correct answer or not.")
    correct: bool = Field(description="True when the extracted answer matches the correct answer or an alias.")
    confidence: int = Field(ge=0, le=100, description="Confidence in this grading, 0-100.")
