"""Draft a domain extractor: the neutral extractor instruction + a section built from a description.

The draft is **deterministic**: no LM call. The LM only writes the
:class:`~kitune.programs.domain_describer.DomainDescription`; :func:`draft_extractor` appends a
"domain focus" section rendered from the packaged template ``prompts/extractor_drafter.txt``
(one line per aspect: domain, document kinds, entity types, predicates, record fields,
disambiguating details, date range; a line whose every placeholder is empty is left out), . A dialogue
corpus (chat sessions) starts from the packaged ``prompts/extractor_dialogue.txt`` instead of the
neutral prose instruction: facts about the people, named, cited by turn number, with relative
dates resolved against the session date (the date-range line, which asks to keep dates as
written, is then left out). The
same description, pins and neutral text therefore always give the same draft (and the same
``extractor@<sha8>`` version), and pinned entity types cannot be lost by generation.

Pinned entity types (``--pin-types``) are enforced twice:

1. they head the entity-type list whatever the description says (the ones the description
   lacks are reported in :attr:`DraftedInstruction.pins_restored`);
2. :func:`ensure_pinned_types` checks the final text and appends an "Always cover …" line for any
   pin not mentioned — the same guard works on any instruction, e.g. one an optimiser rewrote.
"""

from __future__ import annotations

import difflib
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass

from kitune.programs.domain_describer import DomainDescription
from kitune.programs.instructions import instruction_version, load_instruction

__all__ = [
    "DraftedInstruction",
    "draft_extractor",
    "ensure_pinned_types",
    "instruction_diff",
    "merge_entity_types",
    "normalise_type",
]


@dataclass(frozen=True)
class DraftedInstruction:
    """A drafted extractor instruction and how it was built."""

    text: str
    """The full instruction: neutral text, a blank line, the domain section."""
    version: str
    """``extractor@<sha8>`` of ``text``."""
    neutral_version: str
    """``extractor@<sha8>`` of the neutral text it started from."""
    entity_types: tuple[str, ...]
    """Entity types the draft asks to cover: pins first, then the described ones."""
    predicates: tuple[str, ...]
    """Preferred predicates from the description."""
    pins_restored: tuple[str, ...]
    """Pinned types the description did not list (added back)."""
    diff: str
    """Unified diff from the neutral text to ``text``."""


def normalise_type(name: str) -> str:
    """Lowercase, single-spaced entity type (``"Film_Director "`` → ``"film director"``)."""
    return " ".join(name.lower().replace("_", " ").split())


def merge_entity_types(pins: Sequence[str], described: Sequence[str]) -> tuple[str, ...]:
    """Pins first (in the given order), then described types not already present; de-duplicated.

    Both sides are compared after :func:`normalise_type`; empty names are dropped.
    """
    out: list[str] = []
    for name in (*pins, *described):
        norm = normalise_type(name)
        if norm and norm not in out:
            out.append(norm)
    return tuple(out)


def _mentions(text: str, name: str) -> bool:
    pattern = (
        r"(?<![a-z0-9])" + re.escape(normalise_type(name)).replace(r"\ ", r"[\s_-]+") + r"s?(?![a-z0-9])"
    )
    return re.search(pattern, text.lower()) is not None


def ensure_pinned_types(text: str, pins: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """Make sure every pinned entity type is named in an instruction.

    Args:
        text: any extractor instruction.
        pins: entity types that must be covered.

    Returns:
        ``(text, added)``: ``text`` unchanged when every pin is mentioned (case-insensitive, whole
        words, ``_``/``-``/space alike, plural ``s`` allowed); otherwise ``text`` plus the line
        ``"Always cover these entity types: a, b."`` naming the missing pins in pin order.
        Deterministic.
    """
    missing = tuple(
        dict.fromkeys(normalise_type(p) for p in pins if normalise_type(p) and not _mentions(text, p))
    )
    if not missing:
        return text, ()
    return f"{text.rstrip()}\nAlways cover these entity types: {', '.join(missing)}.", missing


def instruction_diff(
    before: str, after: str, *, before_name: str = "neutral", after_name: str = "draft"
) -> str:
    """Unified diff of two instruction texts, line by line ("" when equal)."""
    return "".join(
        difflib.unified_diff(
            (before.rstrip("\n") + "\n").splitlines(keepends=True),
            (after.rstrip("\n") + "\n").splitlines(keepends=True),
            fromfile=before_name,
            tofile=after_name,
        )
    )


def _join(items: Sequence[str]) -> str:
    return ", ".join(i.rstrip(".") for i in items)


def _render_section(values: dict[str, str]) -> str:
    template = load_instruction("extractor_drafter").text
    lines: list[str] = []
    for line in template.splitlines():
        names = [name for _, name, _, _ in string.Formatter().parse(line) if name]
        if names and not any(values.get(n, "") for n in names if n != "corpus_name"):
            continue
        lines.append(line.format(**values).replace(" .", ".").rstrip())
    return "\n".join(lines)


def draft_extractor(
    description: DomainDescription,
    *,
    corpus_name: str,
    pin_types: Sequence[str] = (),
    neutral: str | None = None,
    dialogue: bool = False,
) -> DraftedInstruction:
    """Specialise the neutral extractor instruction for one domain.

    Args:
        description: the domain description (from the LM or the fallback).
        corpus_name: shown in the section heading.
        pin_types: entity types that must be covered whatever the description says.
        neutral: the starting instruction; None loads the packaged ``extractor`` prompt.
        dialogue: the corpus is chat sessions (:class:`kitune.data.sampling.LoadedCorpus` kind
            ``dialogue``): the default starting instruction is the packaged
            ``extractor_dialogue`` and the keep-dates-as-written line is dropped (dialogue facts
            carry resolved dates).

    Returns:
        :class:`DraftedInstruction`. Same arguments ⇒ same text and version.
    """
    default = "extractor_dialogue" if dialogue else "extractor"
    base = (neutral if neutral is not None else load_instruction(default).text).strip()
    types = merge_entity_types(pin_types, description.entity_types)
    described = {normalise_type(t) for t in description.entity_types}
    restored = tuple(t for t in merge_entity_types(pin_types, ()) if t not in described)
    fields = "; ".join(f"{k} = {v.rstrip('.')}" if v else k for k, v in description.fields.items())
    values = {
        "corpus_name": corpus_name,
        "domain": description.domain.rstrip("."),
        "summary": description.summary,
        "document_kinds": _join(description.document_kinds),
        "entity_types": _join(types),
        "predicates": _join(description.predicates),
        "fields": fields,
        "disambiguating_details": _join(description.disambiguating_details),
        "date_range": description.date_range.label() if description.date_range and not dialogue else "",
    }
    text = f"{base}\n\n{_render_section(values)}"
    text, _ = ensure_pinned_types(text, pin_types)
    return DraftedInstruction(
        text=text,
        version=instruction_version("extractor", text),
        neutral_version=instruction_version("extractor", base),
        entity_types=types,
        predicates=description.predicates,
        pins_restored=restored,
        diff=instruction_diff(base, text),
    )
