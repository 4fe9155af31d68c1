"""Source-description KIs: what a bootstrapped corpus holds, as KIs built from its description.

:func:`source_description_kis` turns a :class:`~kitune.programs.domain_describer.DomainDescription`
into a few KIs (no LM call, deterministic ids) that
:func:`kitune.service.workflows.bootstrap.bootstrap_corpus` upserts into the store, tagged
:data:`SOURCE_DESCRIPTION_TAG`.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import ValidationError

from kitune.ki import KI, KIPayload, KIProperties, doc_tag, entity_tag, ki_id, slugify, utcnow
from kitune.programs.domain_describer import DomainDescription

__all__ = ["SOURCE_DESCRIPTION_TAG", "cut_text", "source_description_kis"]

SOURCE_DESCRIPTION_TAG = "source-description"
"""Plain tag on every source-description KI (filter on it, or on subtype ``source_description``)."""


def cut_text(text: str, limit: int) -> str:
    """``text`` with whitespace collapsed, cut to at most ``limit`` characters ending in ``…``."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip(" ,;") + "…"


def source_description_kis(
    description: DomainDescription,
    *,
    corpus_name: str,
    kind: str,
    n_documents: int,
    confidence: int = 70,
    prompt_version: str = "",
    now: datetime | None = None,
) -> tuple[list[KI], dict[str, str]]:
    """Build the KIs that describe the source itself (no LM call; deterministic ids).

    One KI per aspect the description has: what the collection holds (always), its entity
    types and relations, its record fields (records only), its date range, how it is queried.
    Each has ``payload.subtype="source_description"`` and ``payload.type="domain_description"``
    (its evidence is the description, quoted as ``"description.<key>: <value>"``), subject
    ``corpus_name``, doc id ``source-<corpus slug>``, and tags ``source-description``,
    ``entity:<corpus slug>``, ``doc:source-<corpus slug>`` plus an ``entity:`` and a plain tag per
    main entity type (at most five).

    Returns:
        ``(kis, rejected)``: valid KIs in aspect order, and predicate → reason for any that broke
        the KI rules (recorded, not raised).
    """
    slug = slugify(corpus_name) or "corpus"
    docid = f"source-{slug}"
    d = description
    types = list(d.entity_types[:5])
    type_tags = [entity_tag(t) for t in types if entity_tag(t) != "entity:"]
    plain = [slugify(t) for t in types if slugify(t)]
    base_tags = [SOURCE_DESCRIPTION_TAG, entity_tag(corpus_name), *type_tags, *plain]
    unit = "records" if kind == "records" else "documents"
    kinds = ", ".join(d.document_kinds) or unit
    aspects: list[tuple[str, str, str, str, str]] = [
        (
            "holds_documents_about",
            d.domain,
            f"The {corpus_name} collection holds {kinds} about {d.domain}",
            f"{d.summary} It has {n_documents} {unit}. "
            f"Main entity types: {', '.join(types) or 'not described'}.",
            f"description.domain: {d.domain}",
        )
    ]
    if d.entity_types:
        rel = ", ".join(d.predicates) or "not described"
        aspects.append(
            (
                "covers_entity_types",
                ", ".join(d.entity_types),
                f"The {corpus_name} collection has facts about: {', '.join(d.entity_types)}",
                f"Entity types in the {corpus_name} collection: {', '.join(d.entity_types)}. "
                f"Relations between them: {rel}.",
                f"description.entity_types: {', '.join(d.entity_types)}",
            )
        )
    if kind == "records" and d.fields:
        names = ", ".join(d.fields)
        meanings = "; ".join(f"{k} = {v}" if v else k for k, v in d.fields.items())
        aspects.append(
            (
                "has_fields",
                names,
                f"The {corpus_name} records have the fields {names}",
                f"Each {corpus_name} record has these fields: {meanings}.",
                f"description.fields: {meanings}",
            )
        )
    if d.date_range is not None and d.date_range.label():
        label = d.date_range.label()
        aspects.append(
            (
                "spans_dates",
                label,
                f"The {corpus_name} collection covers dates {label}",
                f"Dates seen in a sample of the {corpus_name} collection range over {label}.",
                f"description.date_range: {label}",
            )
        )
    if d.query_patterns:
        patterns = "; ".join(d.query_patterns)
        aspects.append(
            (
                "is_queried_by",
                patterns,
                f"The {corpus_name} collection is asked questions such as: {d.query_patterns[0]}",
                f"Typical questions about the {corpus_name} collection: {patterns}.",
                f"description.query_patterns: {patterns}",
            )
        )
    kis: list[KI] = []
    rejected: dict[str, str] = {}
    stamp = now or utcnow()
    for predicate, obj, title, text, evidence in aspects:
        obj_cut = cut_text(obj, 200)
        try:
            kis.append(
                KI(
                    id=ki_id(docid, corpus_name, predicate, obj_cut),
                    title=cut_text(title, 140),
                    description=cut_text(text, 350),
                    references=[f"index://{corpus_name}"],
                    tags=[*base_tags, doc_tag(docid)],
                    evidence_doc_ids=[docid],
                    payload=KIPayload(
                        type="domain_description",
                        subtype="source_description",
                        properties=KIProperties(
                            subject=corpus_name, predicate=predicate, object=obj_cut, docid=docid
                        ),
                        evidence=[cut_text(evidence, 300)],
                        confidence=confidence,
                        last_seen=stamp,
                    ),
                    prompt_version=prompt_version,
                )
            )
        except ValidationError as e:
            rejected[predicate] = "; ".join(err["msg"] for err in e.errors())[:300]
    return kis, rejected
