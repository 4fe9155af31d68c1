"""KIs in Elastic's published AI-index shape (``ai-index@mappings``), pure: mapping, documents, limits.

**The published component.** Elasticsearch ships the component template ``ai-index@mappings``
(``x-pack/plugin/core/template-resources/src/main/resources/ai-index/ai-index@mappings.json`` in
elastic/elasticsearch; copied here from commit ``051530e169ceb9a8147dc22d25f6b7f59dc4a630`` —
an other stored revision, ``e9dddbe6…``, differs only by not having the two ``lowercase``
normalizers): ``@timestamp`` date; ``type`` keyword; ``title``, ``description`` and ``content``
``text`` each with a ``semantic_text`` sub-field ``.semantic``; ``tags`` keyword; ``attributes``
``flattened``; ``references.uri`` keyword. :data:`PUBLISHED_MAPPING` is that ``mappings`` body;
``tests/retrieval_tests/golden/ai-index@mappings.json`` holds the published file verbatim.
Limits (Kibana's Context Engine KI schema): title ≤ 512 characters, description ≤ 2,048,
content ≤ 65,536, ≤ 100 tags of ≤ 256 characters, ≤ 100 attributes whose keys are ≤ 256
characters and whose values are strings (≤ 10,000 characters), numbers, booleans or lists of
≤ 100 strings.

**kitune's index** (:func:`ai_index_mapping`): the published fields unchanged (the
``.semantic`` sub-fields get the configured inference endpoint) plus three fields the published
component leaves to dynamic mapping and Kibana's Context Engine reads: ``id`` keyword (the KI
id, also the document ``_id``), ``expires_at`` date and ``governance.lifecycle.status`` keyword
(kitune's lifecycle status: ``active`` / ``stale`` / ``expired``).

**A KI as a document** (:func:`ki_to_ai_document`): ``@timestamp`` = ``last_seen``; ``type`` =
``knowledge_indicator``; ``title``, ``description``; ``content`` = the verbatim evidence spans,
one per line (the description when there is none); ``tags``; ``references`` = ``[{"uri": r}]``;
``attributes`` = kitune's payload, flat: ``subject``, ``predicate``, ``object``, ``docid``,
``subtype``, ``payload_type``, ``confidence`` (number), ``status``, ``last_seen``,
``expires_at`` (when set), ``evidence`` and ``evidence_doc_ids`` (lists), ``prompt_version``.
:func:`ai_document_to_ki` reads it back (status from ``governance.lifecycle.status``,
``last_seen`` from ``@timestamp``, since updates change those).

**Serving it** (:data:`AI_INDEX_FIELDS`): the Elasticsearch store's field names for this layout —
lexical branch on ``title`` (BM25), semantic branch on ``description.semantic`` and
``title.semantic``, status in ``governance.lifecycle.status``, the payload filters on
``attributes.*`` (a ``flattened`` field indexes values as keywords, so the confidence floor is
a ``terms`` query over the allowed values 0–100, not a range).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kitune.errors import DataError
from kitune.ki import KI, KIPayload, KIProperties
from kitune.retrieval.es_query import EsFields

__all__ = [
    "AI_INDEX_FIELDS",
    "KI_TYPE",
    "LIMITS",
    "PUBLISHED_MAPPING",
    "PUBLISHED_SOURCE",
    "ai_document_to_ki",
    "ai_index_mapping",
    "check_document_types",
    "ki_to_ai_document",
    "validate_ai_document",
]

PUBLISHED_SOURCE = (
    "elastic/elasticsearch@051530e169ceb9a8147dc22d25f6b7f59dc4a630:"
    "x-pack/plugin/core/template-resources/src/main/resources/ai-index/ai-index@mappings.json"
)
"""Where :data:`PUBLISHED_MAPPING` was copied from."""

_TEXT_SEMANTIC: dict[str, Any] = {"type": "text", "fields": {"semantic": {"type": "semantic_text"}}}

PUBLISHED_MAPPING: dict[str, Any] = {
    "properties": {
        "@timestamp": {"type": "date"},
        "type": {"type": "keyword", "normalizer": "lowercase"},
        "title": copy.deepcopy(_TEXT_SEMANTIC),
        "description": copy.deepcopy(_TEXT_SEMANTIC),
        "content": copy.deepcopy(_TEXT_SEMANTIC),
        "tags": {"type": "keyword", "normalizer": "lowercase"},
        "attributes": {"type": "flattened"},
        "references": {"type": "object", "properties": {"uri": {"type": "keyword"}}},
    }
}
"""The ``template.mappings`` of the published ``ai-index@mappings`` component (module docstring)."""

KI_TYPE = "knowledge_indicator"
"""The ``type`` of a kitune KI document."""

LIMITS: dict[str, int] = {
    "title_chars": 512,
    "description_chars": 2048,
    "content_chars": 65536,
    "tags": 100,
    "tag_chars": 256,
    "attributes": 100,
    "attribute_key_chars": 256,
    "attribute_value_chars": 10_000,
    "attribute_list_values": 100,
}
"""The AI-index limits a document must respect (module docstring)."""

AI_INDEX_FIELDS = EsFields(
    name="ai-index",
    status="governance.lifecycle.status",
    doc_ids="attributes.evidence_doc_ids",
    subtype="attributes.subtype",
    subject="attributes.subject",
    predicate="attributes.predicate",
    confidence="attributes.confidence",
    confidence_numeric=False,
    last_seen="@timestamp",
    expires_at="expires_at",
    lexical="title",
    semantic=("description.semantic", "title.semantic"),
    esql_facets=frozenset({"tags", "status"}),
)
"""Where the Elasticsearch store finds each KI field in an AI index."""


def ai_index_mapping(inference_id: str | None = None) -> dict[str, Any]:
    """The index mapping ``kitune index create --mapping ai-index`` creates (module docstring).

    Args:
        inference_id: the ``semantic_text`` inference endpoint of the ``.semantic`` sub-fields
            (None: Elasticsearch's default endpoint, as published).

    Returns:
        A new dict: the published fields plus ``id``, ``expires_at`` and ``governance.lifecycle.status``.
    """
    mapping = copy.deepcopy(PUBLISHED_MAPPING)
    props = mapping["properties"]
    if inference_id:
        for name in ("title", "description", "content"):
            props[name]["fields"]["semantic"]["inference_id"] = inference_id
    props["id"] = {"type": "keyword"}
    props["expires_at"] = {"type": "date"}
    props["governance"] = {
        "type": "object",
        "properties": {"lifecycle": {"type": "object", "properties": {"status": {"type": "keyword"}}}},
    }
    return mapping


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat().replace("+00:00", "Z")


def ki_to_ai_document(ki: KI) -> dict[str, Any]:
    """One KI as an AI-index document (module docstring), checked against :data:`LIMITS`.

    Raises:
        DataError: a field breaks a limit (names the KI, the field, its size and the limit).
    """
    p = ki.payload
    props = p.properties
    attributes: dict[str, Any] = {
        "subject": props.subject,
        "predicate": props.predicate,
        "object": props.object,
        "docid": props.docid,
        "subtype": p.subtype,
        "payload_type": p.type,
        "confidence": p.confidence,
        "status": p.status,
        "last_seen": _iso(p.last_seen),
        "evidence": list(p.evidence),
        "evidence_doc_ids": list(ki.evidence_doc_ids),
        "prompt_version": ki.prompt_version,
    }
    if p.expires_at is not None:
        attributes["expires_at"] = _iso(p.expires_at)
    doc: dict[str, Any] = {
        "@timestamp": _iso(p.last_seen),
        "id": ki.id,
        "type": KI_TYPE,
        "title": ki.title,
        "description": ki.description,
        "content": "\n".join(p.evidence) or ki.description,
        "tags": list(ki.tags),
        "references": [{"uri": r} for r in ki.references],
        "attributes": attributes,
        "governance": {"lifecycle": {"status": p.status}},
    }
    if p.expires_at is not None:
        doc["expires_at"] = _iso(p.expires_at)
    validate_ai_document(doc)
    return doc


def _at_most(doc: Mapping[str, Any], what: str, size: int, limit: str, fix: str) -> None:
    """Raise when ``size`` is over ``LIMITS[limit]``: the KI id, ``what``, its size, the limit, ``fix``."""
    if size > LIMITS[limit]:
        raise DataError(
            f"KI {doc.get('id', '?')}: {what} is {size}, over the AI-index limit of {LIMITS[limit]}: {fix}"
        )


def validate_ai_document(doc: Mapping[str, Any]) -> None:
    """Check an AI-index document against :data:`LIMITS`.

    Raises:
        DataError: the first limit broken, naming the KI id, the field, its size, the limit and the fix.
    """
    title = str(doc.get("title") or "")
    if not title:
        raise DataError(f"KI {doc.get('id', '?')}: title is empty; an AI-index document needs a title")
    for field in ("title", "description", "content"):
        size = len(str(doc.get(field) or ""))
        _at_most(doc, f"{field} length", size, f"{field}_chars", f"shorten the {field}")
    tags = list(doc.get("tags") or [])
    _at_most(doc, "the number of tags", len(tags), "tags", "drop tags (entity:/doc: tags count)")
    for tag in tags:
        _at_most(doc, f"tag {str(tag)[:40]!r}… length", len(str(tag)), "tag_chars", "shorten it")
    attrs = doc.get("attributes") or {}
    _at_most(doc, "the number of attributes", len(attrs), "attributes", "store fewer attributes")
    for key, value in attrs.items():
        _at_most(doc, "an attribute key length", len(str(key)), "attribute_key_chars", "shorten it")
        if isinstance(value, str):
            _at_most(doc, f"attribute {key!r} length", len(value), "attribute_value_chars", "shorten it")
        if isinstance(value, list):
            _at_most(
                doc, f"attribute {key!r} list size", len(value), "attribute_list_values", "keep fewer values"
            )
            for v in value:
                what = f"a value of attribute {key!r} length"
                _at_most(doc, what, len(str(v)), "attribute_value_chars", "shorten it")
            if any(not isinstance(v, str) for v in value):
                raise DataError(f"KI {doc.get('id', '?')}: attribute {key!r} must be a list of strings")
        elif value is not None and not isinstance(value, str | int | float | bool):
            raise DataError(
                f"KI {doc.get('id', '?')}: attribute {key!r} is a {type(value).__name__}; "
                "AI-index attributes are strings, numbers, booleans or lists of strings"
            )


def _parse_time(value: Any) -> datetime:
    parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def ai_document_to_ki(doc: Mapping[str, Any]) -> KI:
    """Rebuild a KI from an AI-index document written by :func:`ki_to_ai_document`.

    Raises:
        DataError: the document lacks kitune's attributes (it was not written by kitune).
    """
    a = doc.get("attributes") or {}
    missing = [k for k in ("subject", "predicate", "object", "docid", "confidence") if k not in a]
    if missing or not doc.get("id"):
        raise DataError(
            f"AI-index document {doc.get('id', '?')} has no kitune attributes {missing}: it was not written "
            "by kitune (kitune export --format elastic-ai-index)"
        )
    status = ((doc.get("governance") or {}).get("lifecycle") or {}).get("status") or a.get("status", "active")
    seen = doc.get("@timestamp") or a.get("last_seen")
    expires = doc.get("expires_at") or a.get("expires_at")
    return KI(
        id=str(doc["id"]),
        title=str(doc["title"]),
        description=str(doc["description"]),
        references=[
            str(r["uri"]) for r in doc.get("references") or [] if isinstance(r, Mapping) and r.get("uri")
        ],
        tags=list(doc.get("tags") or []),
        evidence_doc_ids=list(a.get("evidence_doc_ids") or [a["docid"]]),
        payload=KIPayload(
            type=str(a.get("payload_type") or "fact"),
            subtype=a.get("subtype") or "dataset_fact",
            properties=KIProperties(
                subject=str(a["subject"]),
                predicate=str(a["predicate"]),
                object=str(a["object"]),
                docid=str(a["docid"]),
            ),
            evidence=list(a.get("evidence") or []),
            confidence=int(a["confidence"]),
            status=status,
            last_seen=_parse_time(seen) if seen else datetime.now(UTC),
            expires_at=_parse_time(expires) if expires else None,
        ),
        prompt_version=str(a.get("prompt_version") or ""),
    )


def _leaf_types(props: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for name, spec in props.items():
        path = f"{prefix}{name}"
        out[path] = str(spec.get("type", "object"))
        for sub, sub_spec in (spec.get("fields") or {}).items():
            out[f"{path}.{sub}"] = str(sub_spec.get("type"))
        if "properties" in spec:
            out.update(_leaf_types(spec["properties"], f"{path}."))
    return out


def check_document_types(doc: Mapping[str, Any], mapping: Mapping[str, Any]) -> list[str]:
    """Problems of a document against a mapping's field types (empty list: it fits).

    A ``text``/``keyword`` field takes a string (a keyword also a list of strings); ``date`` an
    ISO-8601 string; ``flattened`` an object; ``object`` an object or a list of objects whose
    fields fit; a field not in the mapping is a problem (it would be mapped dynamically).
    """
    types = _leaf_types(mapping.get("properties", {}))
    problems: list[str] = []

    def check(value: Any, path: str) -> None:
        kind = types.get(path)
        if kind is None:
            problems.append(f"{path}: not in the mapping")
            return
        if kind in ("text", "keyword"):
            values = value if kind == "keyword" and isinstance(value, list) else [value]
            if not all(isinstance(v, str) for v in values):
                problems.append(f"{path}: {kind} needs strings, got {type(value).__name__}")
        elif kind == "date":
            try:
                _parse_time(value)
            except (TypeError, ValueError):
                problems.append(f"{path}: date needs an ISO-8601 string, got {value!r}")
        elif kind == "flattened":
            if not isinstance(value, Mapping):
                problems.append(f"{path}: flattened needs an object")
        elif kind == "object":
            items = value if isinstance(value, list) else [value]
            for item in items:
                if not isinstance(item, Mapping):
                    problems.append(f"{path}: object needs objects, got {type(item).__name__}")
                    continue
                for k, v in item.items():
                    check(v, f"{path}.{k}")
        else:
            problems.append(f"{path}: unexpected mapping type {kind}")

    for key, value in doc.items():
        check(value, key)
    return problems
