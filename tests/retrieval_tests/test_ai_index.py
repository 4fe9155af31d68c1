"""KIs in Elastic's published ``ai-index@mappings`` shape: golden mapping, documents, limits, serving."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_elasticsearch import FakeES
from test_esql_grammar import _load_91, _load_92

from kitune.config import RetrievalConfig
from kitune.errors import ConfigError, DataError, StoreError
from kitune.ki import utcnow
from kitune.retrieval.ai_index import (
    AI_INDEX_FIELDS,
    PUBLISHED_MAPPING,
    ai_document_to_ki,
    ai_index_mapping,
    check_document_types,
    ki_to_ai_document,
    validate_ai_document,
)
from kitune.retrieval.elasticsearch import ElasticsearchStore
from kitune.retrieval.es_query import (
    check_mapping_current,
    compile_branch_queries,
    compile_esql,
    compile_facets,
    sweep_queries,
    to_es_filter,
)
from kitune.schema import Filter, QueryPlan
from kitune.testing.store_contract import make_ki

GOLDEN = Path(__file__).parent / "golden" / "ai-index@mappings.json"


def published() -> dict:
    """The published component file, its version placeholder filled the way Elasticsearch does."""
    text = GOLDEN.read_text(encoding="utf-8").replace("${xpack.stack.ai-index.template.version}", "1")
    return json.loads(text)


def test_published_mapping_equals_the_golden_file() -> None:
    data = published()
    assert data["template"]["mappings"] == PUBLISHED_MAPPING
    assert data["_meta"] == {
        "description": "Template mappings applied by default to AI indices.",
        "managed": True,
    }


def test_kitune_index_mapping_keeps_every_published_field_and_adds_three() -> None:
    mapping = ai_index_mapping("my-elser")
    props = mapping["properties"]
    for name, spec in PUBLISHED_MAPPING["properties"].items():
        assert props[name]["type"] == spec["type"]
        for sub, sub_spec in spec.get("fields", {}).items():
            assert props[name]["fields"][sub] == {**sub_spec, "inference_id": "my-elser"}
    assert set(props) - set(PUBLISHED_MAPPING["properties"]) == {"id", "expires_at", "governance"}
    assert props["governance"]["properties"]["lifecycle"]["properties"]["status"] == {"type": "keyword"}
    assert "inference_id" not in json.dumps(ai_index_mapping())  # default endpoint, as published


def test_export_documents_fit_the_published_field_types_and_round_trip() -> None:
    ki = make_ki("Marie Curie", "Warsaw", docid="d1", predicate="born_in", tags=["person"], status="stale")
    ki = ki.model_copy(update={"payload": ki.payload.model_copy(update={"expires_at": utcnow()})})
    doc = ki_to_ai_document(ki)
    assert check_document_types(doc, ai_index_mapping()) == []
    # against the published component alone, only kitune's three additions are unmapped
    assert check_document_types(doc, PUBLISHED_MAPPING) == [
        "id: not in the mapping",
        "governance: not in the mapping",
        "expires_at: not in the mapping",
    ]
    assert doc["type"] == "knowledge_indicator" and doc["references"] == [{"uri": "index://corpus"}]
    assert doc["governance"] == {"lifecycle": {"status": "stale"}} and doc["content"] == "Marie Curie Warsaw"
    assert doc["attributes"]["confidence"] == 80 and doc["attributes"]["evidence_doc_ids"] == ["d1"]
    assert doc["@timestamp"] == ki.payload.last_seen.isoformat().replace("+00:00", "Z")
    back = ai_document_to_ki(doc)
    assert back.model_dump(mode="json") == ki.model_dump(mode="json")
    # an update-by-query changes the status in governance only: that wins
    doc["governance"]["lifecycle"]["status"] = "expired"
    assert ai_document_to_ki(doc).payload.status == "expired"
    with pytest.raises(DataError, match="no kitune attributes"):
        ai_document_to_ki({"id": "x", "title": "t", "description": "d", "attributes": {}})


def test_type_check_catches_wrong_types() -> None:
    bad = {"title": 3, "tags": ["a", 1], "@timestamp": "yesterday", "attributes": [], "references": ["x"]}
    assert check_document_types(bad, PUBLISHED_MAPPING) == [
        "title: text needs strings, got int",
        "tags: keyword needs strings, got list",
        "@timestamp: date needs an ISO-8601 string, got 'yesterday'",
        "attributes: flattened needs an object",
        "references: object needs objects, got str",
    ]


def test_limits_are_validated_with_clear_errors() -> None:
    base = ki_to_ai_document(make_ki("A", "B"))
    with pytest.raises(DataError, match=r"KI ki-\w+: title length is 513, over the AI-index limit of 512"):
        validate_ai_document({**base, "title": "x" * 513})
    with pytest.raises(DataError, match="description length is 2049, over the AI-index limit of 2048"):
        validate_ai_document({**base, "description": "x" * 2049})
    validate_ai_document({**base, "title": "x" * 512, "description": "y" * 2048})  # at the limits: fine
    many = make_ki("A", "B", tags=[f"t{i}" for i in range(99)])  # + entity:a, entity:b, doc:d1 = 102
    with pytest.raises(
        DataError, match="the number of tags is 102, over the AI-index limit of 100: drop tags"
    ):
        ki_to_ai_document(many)
    with pytest.raises(DataError, match="attribute 'evidence' list size is 101"):
        validate_ai_document({**base, "attributes": {**base["attributes"], "evidence": ["e"] * 101}})


def test_each_length_limit_names_the_item_its_size_the_limit_and_the_fix() -> None:
    base = ki_to_ai_document(make_ki("A", "B"))
    attrs = base["attributes"]
    cases = [
        (
            {"tags": ["ok", "z" * 257, "w" * 300]},
            "tag 'zzzz.*… length is 257, over the AI-index limit of 256: shorten it",
        ),
        (
            {"attributes": {**attrs, "k" * 257: 1}},
            "an attribute key length is 257, over the AI-index limit of 256",
        ),
        (
            {"attributes": {**attrs, "note": "v" * 10_001}},
            "attribute 'note' length is 10001, over .* of 10000",
        ),
        (
            {"attributes": {**attrs, "evidence": ["a", "b" * 10_001, "c" * 20_000]}},
            "a value of attribute 'evidence' length is 10001, over the AI-index limit of 10000: shorten it",
        ),
        (
            {"content": "c" * 65_537},
            "content length is 65537, over the AI-index limit of 65536: shorten the content",
        ),
    ]
    for change, message in cases:
        with pytest.raises(DataError, match=message):
            validate_ai_document({**base, **change})
    validate_ai_document({**base, "tags": ["z" * 256], "attributes": {**attrs, "note": "v" * 10_000}})


def test_queries_use_the_ai_index_fields_and_parse_with_both_grammars() -> None:
    plan = QueryPlan(
        entity_tags=("entity:marie-curie",),
        lexical="Marie Curie",
        semantic="Where was she born?",
        filters=Filter(tags_any=("person",), doc_ids=("d1",), min_confidence=97),
        size=5,
    )
    q = compile_esql(plan, "ai-index-idx-kis", RetrievalConfig(), AI_INDEX_FIELDS)
    assert "| WHERE governance.lifecycle.status IN (?status0)" in q.query
    assert "MATCH(title, ?lexical)" in q.query
    assert "MATCH(description.semantic, ?semantic) OR MATCH(title.semantic, ?semantic)" in q.query
    assert q.filter == {
        "bool": {
            "filter": [
                {"terms": {"tags": ["person"]}},
                {"terms": {"attributes.evidence_doc_ids": ["d1"]}},
                {"terms": {"attributes.confidence": ["97", "98", "99", "100"]}},
            ]
        }
    }
    parse_91, parse_92 = _load_91(), _load_92()
    assert parse_92(q.query) == []
    for branch in compile_branch_queries(plan, "ai-index-idx-kis", RetrievalConfig(), AI_INDEX_FIELDS):
        assert parse_91(branch.query) == [] and parse_92(branch.query) == []
    facet = compile_facets("ai-index-idx-kis", None, "status", 10, AI_INDEX_FIELDS)
    assert "BY governance.lifecycle.status" in facet.query and parse_92(facet.query) == []
    with pytest.raises(StoreError, match="ES\\|QL does not read flattened attributes"):
        compile_facets("ai-index-idx-kis", None, "doc", 10, AI_INDEX_FIELDS)
    assert to_es_filter(Filter(statuses=("stale",)), fields=AI_INDEX_FIELDS) == {
        "bool": {"filter": [{"terms": {"governance.lifecycle.status": ["stale"]}}]}
    }
    expire, stale = sweep_queries(utcnow(), __import__("datetime").timedelta(days=7), fields=AI_INDEX_FIELDS)[
        :2
    ]
    assert '"@timestamp"' in json.dumps(expire[0]) and '"governance.lifecycle.status"' in json.dumps(stale[0])


def test_elasticsearch_store_serves_an_ai_index() -> None:
    client = FakeES()
    store = ElasticsearchStore(client, index="ai-index-idx-kis", inference_id="e", mapping="ai-index")
    assert client.mappings["ai-index-idx-kis"] == ai_index_mapping("e")
    kis = [make_ki("Beta", "X", tags=["person"]), make_ki("Alpha", "X")]
    assert store.upsert(kis).ok
    sent = client.docs[kis[0].id]
    assert sent["governance"] == {"lifecycle": {"status": "active"}} and "title_text" not in sent
    result = store.search(QueryPlan(lexical="X", semantic="X", size=5))
    assert [h.ki.model_dump(mode="json") for h in result.hits] == [
        k.model_dump(mode="json") for k in sorted(kis, key=lambda k: k.id)
    ]
    assert "MATCH(title, ?lexical)" in client.esql_calls[0]["query"]
    too_many = make_ki("Gamma", "Y", tags=[f"t{i}" for i in range(99)])
    result = store.upsert([too_many, make_ki("Delta", "Z")])
    assert result.indexed == 1 and "over the AI-index limit of 100" in result.failed[0].reason
    # the same index opened with kitune's layout is refused, and vice versa
    with pytest.raises(ConfigError, match="earlier kitune mapping"):
        check_mapping_current({"ai-index-idx-kis": {"mappings": ai_index_mapping("e")}})
    with pytest.raises(ConfigError, match="not an AI index kitune can serve"):
        check_mapping_current({"old": {"mappings": PUBLISHED_MAPPING}}, AI_INDEX_FIELDS)
