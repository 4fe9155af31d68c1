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

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["FactRecord", "PlanDraft", "SentenceFactRecord"]


_TITLE = (
    "One natural sentence of at most 140 characters that states the fact and ends on its value where "
    "possible, e.g. 'Ada Lovelace was born in London'."
)
_DESCRIPTION = (
    "2-3 sentences, at most 350 characters, that make the fact self-contained: who or what, the "
    "relation, the value, and the date, place or role that pins it down."
)
_SUBJECT = "The entity the fact is about, named in full as in the text."
_PREDICATE = "A reusable snake_case relation of at most 32 characters, e.g. born_in, founded_by."
_OBJECT = "The value: an entity, a date, a number or a short phrase, as written."
_CONFIDENCE = "How sure you are that the fact is right, 0-100."
_TAGS = "A few lowercase keywords (letters, digits, hyphens), e.g. person, organization, date."


class FactRecord(BaseModel):
    """One fact as the extractor writes it (the items of the extractor's ``facts`` output)."""

    model_config = ConfigDict(extra="ignore")

    title: str = Field(description=_TITLE)
    description: str = Field(description=_DESCRIPTION)
    subject: str = Field(description=_SUBJECT)
    predicate: str = Field(description=_PREDICATE)
    object: str = Field(description=_OBJECT)
    evidence_span: str = Field(
        description="An exact quote copied character for character from the text that supports the fact "
        "(one sentence or clause; no paraphrase, no changed punctuation)."
    )
    confidence: int = Field(ge=0, le=100, description=_CONFIDENCE)
    tags: list[str] = Field(default_factory=list, description=_TAGS)


class SentenceFactRecord(BaseModel):
    """One fact in the sentence-indexed evidence mode: it cites sentence numbers, never quotes.

    kitune copies the cited sentences' text from the document, so the stored evidence is
    verbatim by construction and the model writes a few digits instead of a quote.
    """

    model_config = ConfigDict(extra="ignore")

    title: str = Field(description=_TITLE)
    description: str = Field(description=_DESCRIPTION)
    subject: str = Field(description=_SUBJECT)
    predicate: str = Field(description=_PREDICATE)
    object: str = Field(description=_OBJECT)
    evidence_sentences: list[int] = Field(
        description="The number(s) in [brackets] of the sentence(s) that state the fact; one is usually "
        "enough."
    )
    confidence: int = Field(ge=0, le=100, description=_CONFIDENCE)
    tags: list[str] = Field(default_factory=list, description=_TAGS)


class PlanDraft(BaseModel):
    """The values of a retrieval plan as the rewriter writes them (validated into a QueryPlan).

    Only values, never query text a store executes; ``size`` always comes from the caller.
    """

    model_config = ConfigDict(extra="ignore")

    entity_tags: list[str] = Field(
        default_factory=list,
        description="The proper names the question mentions, each as entity:<slug> (the name in lowercase, "
        "every run of other characters replaced by one hyphen: 'New York City' -> 'entity:new-york-city'). "
        "At most 20; empty when there are none.",
    )
    lexical: str = Field(
        default="",
        description="A few keywords likely to appear in the title of a fact that helps answer the question "
        "(names and relation words; no question words). At most 500 characters.",
    )
    semantic: str = Field(
        default="",
        description="One plain sentence describing the first fact needed, with the unknown left open. "
        "At most 1000 characters.",
    )
    filters: dict[str, Any] = Field(
        default_factory=dict,
        description='Usually {}; {"tags_any": ["<topic-tag>"]} only when the question is explicitly '
        "restricted to a topic.",
    )
