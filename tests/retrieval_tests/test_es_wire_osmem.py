"""kitune's Elasticsearch requests over real HTTP against osmem-server (issue 14 item 5).

``osmem-server`` (PyPI, MIT) is an in-memory OpenSearch-compatible server. The official
``elasticsearch`` client talks to it once one thing is undone: the 9.x client always sends
``application/vnd.elasticsearch+json; compatible-with=9`` media types, which an OpenSearch API
refuses with 406, so the client here uses a transport node that sends plain
``application/json`` (:class:`PlainJsonNode`) — the requests themselves are the client's.

Covered over the wire: bulk bodies and per-item outcomes (:func:`bulk_write`), refresh, the
Query DSL filters (:func:`to_es_filter`) checked against the reference store on the same KIs,
get/mget round trips (:func:`source_to_ki`), delete-by-query, shard stats (fingerprint), a
terms aggregation, a lexical ``match`` search, and error wrapping of real error responses.

NOT covered here (osmem has no such APIs; they are checked against golden files and Elastic's
ES|QL grammar, and by the live suite when ``KITUNE_ES_URL`` is set): ES|QL (FORK/FUSE, MATCH,
STATS), ``semantic_text`` and inference endpoints, kNN/hybrid search, update-by-query scripts
(set_status, sweep, mark_seen), point-in-time paging, and the version/inference start-up checks
of a real Elasticsearch.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from kitune.errors import ConfigError
from kitune.retrieval.es_client import ElasticsearchRequestError, bulk_write, wrap_es_error
from kitune.retrieval.es_query import es_mapping, ki_to_source, source_to_ki, stats_fingerprint, to_es_filter
from kitune.retrieval.fusion import aggregate
from kitune.retrieval.memory import MemoryStore
from kitune.schema import Filter
from kitune.testing.store_contract import make_ki

osmem_server = pytest.importorskip("osmem_server", reason="osmem-server (dev extra) is not installed")
elasticsearch = pytest.importorskip("elasticsearch")

_COMPAT = re.compile(r"application/vnd\.elasticsearch\+([a-z-]+); compatible-with=\d+")


def _plain_json_node() -> type:
    from elastic_transport import Urllib3HttpNode

    class PlainJsonNode(Urllib3HttpNode):  # type: ignore[misc]
        """Sends ``application/json`` where the 9.x client sends its compatibility media type."""

        def perform_request(self, method, target, body=None, headers=None, request_timeout=None):  # type: ignore[no-untyped-def]
            if headers is not None:
                headers = headers.copy()
                for name in ("accept", "content-type"):
                    if name in headers:
                        headers[name] = _COMPAT.sub(r"application/\1", headers[name])
            return super().perform_request(
                method, target, body=body, headers=headers, request_timeout=request_timeout
            )

    return PlainJsonNode


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    srv = osmem_server.OsmemServer.start(freeze=False, japanese=False)
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def client(server: Any) -> Iterator[Any]:
    es = elasticsearch.Elasticsearch(server.url, node_class=_plain_json_node(), request_timeout=30)
    yield es
    es.indices.delete(index="kitune-kis", ignore_unavailable=True)
    es.close()


def _index(es: Any) -> None:
    mapping = es_mapping("unused")
    for name in ("title", "description"):  # OpenSearch has no semantic_text: plain text here
        mapping["properties"][name] = {"type": "text"}
    es.indices.create(index="kitune-kis", mappings=mapping)


def _kis() -> list[Any]:
    return [
        make_ki("Marie Curie", "Warsaw", docid="d1", predicate="born_in", tags=["person"], confidence=90),
        make_ki("Marie Curie", "Nobel Prize", docid="d1", predicate="won", tags=["person", "award"]),
        make_ki(
            "Eiffel Tower", "Paris", docid="d2", predicate="located_in", tags=["landmark"], confidence=70
        ),
        make_ki(
            "Louvre", "Paris", docid="d2", predicate="located_in", tags=["landmark", "museum"], confidence=40
        ),
        make_ki("Old Bridge", "Mostar", docid="d3", tags=["landmark"], status="expired"),
        make_ki(
            "Pierre Curie", "Marie Curie", docid="d3", predicate="married_to", tags=["person"], status="stale"
        ),
    ]


def test_bulk_refresh_filters_and_round_trip_over_http(client: Any) -> None:
    _index(client)
    kis = _kis()
    result = bulk_write(client, "kitune-kis", [(k.id, ki_to_source(k)) for k in kis], chunk_size=4)
    assert (result.submitted, result.indexed, result.failed) == (6, 6, [])
    client.indices.refresh(index="kitune-kis")
    reference = MemoryStore()
    reference.upsert(kis)
    filters = [
        Filter(),
        Filter(statuses=("expired",)),
        Filter(tags_all=("landmark", "museum")),
        Filter(tags_any=("award", "museum")),
        Filter(doc_ids=("d2", "d3")),
        Filter(min_confidence=75),
        Filter(subtypes=("disambiguation",)),
        Filter().model_copy(update={"subjects": ("Marie Curie",), "predicates": ("won",)}),
    ]
    for f in filters:
        query = to_es_filter(f)
        got = client.count(index="kitune-kis", query=query) if query else client.count(index="kitune-kis")
        assert got["count"] == reference.count(f), f
    for k in kis:
        back = source_to_ki(client.get(index="kitune-kis", id=k.id)["_source"])
        assert back.model_dump(mode="json") == k.model_dump(mode="json")
    docs = client.mget(index="kitune-kis", ids=[kis[0].id, "ki-missing"])["docs"]
    assert [d["found"] for d in docs] == [True, False]


def test_bulk_reports_item_errors_from_a_real_server(client: Any) -> None:
    _index(client)
    good = make_ki("Ada Lovelace", "London")
    bad = ki_to_source(make_ki("Grace Hopper", "Arlington"))
    bad["not_in_mapping"] = 1  # dynamic: strict rejects the document, not the request
    result = bulk_write(client, "kitune-kis", [(good.id, ki_to_source(good)), ("ki-bad", bad)], refresh=True)
    assert result.indexed == 1 and [f.id for f in result.failed] == ["ki-bad"]
    assert result.failed[0].status == 400 and "strict" in result.failed[0].reason
    assert client.count(index="kitune-kis")["count"] == 1


def test_streaming_bulk_chunks_keep_going_past_a_failed_item(client: Any) -> None:
    _index(client)
    kis = _kis()
    bad = ki_to_source(make_ki("Grace Hopper", "Arlington"))
    bad["not_in_mapping"] = 1
    docs = (
        [(k.id, ki_to_source(k)) for k in kis[:3]]
        + [("ki-bad", bad)]
        + [(k.id, ki_to_source(k)) for k in kis[3:]]
    )
    result = bulk_write(client, "kitune-kis", docs, chunk_size=2, refresh=True)  # 4 requests
    assert (result.submitted, result.indexed) == (7, 6) and [(f.id, f.status) for f in result.failed] == [
        ("ki-bad", 400)
    ]
    assert "strict_dynamic_mapping_exception" in result.failed[0].reason
    assert client.count(index="kitune-kis")["count"] == 6  # the chunks after the failed item ran
    with pytest.raises(elasticsearch.NotFoundError):
        client.get(index="kitune-kis", id="ki-bad")


def test_terms_aggregation_and_lexical_search_agree_with_kitune(client: Any) -> None:
    _index(client)
    kis = _kis()
    bulk_write(client, "kitune-kis", [(k.id, ki_to_source(k)) for k in kis], refresh="wait_for")
    resp = client.search(index="kitune-kis", size=0, aggs={"t": {"terms": {"field": "tags", "size": 50}}})
    buckets = {b["key"]: b["doc_count"] for b in resp["aggregations"]["t"]["buckets"]}
    plain = {k: v for k, v in buckets.items() if ":" not in k}
    assert plain == aggregate(kis).by_tag
    hits = client.search(index="kitune-kis", query={"match": {"title_text": "Louvre museum"}}, size=3)
    assert hits["hits"]["hits"][0]["_id"] == kis[3].id


def test_delete_by_query_and_fingerprint_stats(client: Any) -> None:
    _index(client)
    kis = _kis()
    bulk_write(client, "kitune-kis", [(k.id, ki_to_source(k)) for k in kis], refresh="wait_for")

    def fingerprint() -> str:
        return stats_fingerprint(client.indices.stats(index="kitune-kis", level="shards").body, "kitune-kis")

    before = fingerprint()
    client.count(index="kitune-kis")
    client.search(index="kitune-kis", query={"match": {"title_text": "Paris"}})
    assert fingerprint() == before  # reads leave max_seq_no alone
    deleted = client.delete_by_query(index="kitune-kis", query={"ids": {"values": [kis[0].id]}}, refresh=True)
    assert deleted["deleted"] == 1 and client.count(index="kitune-kis")["count"] == 5
    after = fingerprint()
    assert after != before and after.startswith("elasticsearch:kitune-kis:")
    bulk_write(client, "kitune-kis", [(kis[1].id, ki_to_source(kis[1]))], refresh=True)  # re-write one KI
    assert fingerprint() not in (before, after)


def test_real_error_responses_are_wrapped_and_opensearch_is_named(client: Any) -> None:
    from elasticsearch import ApiError

    from kitune.retrieval.elasticsearch import ElasticsearchStore

    with pytest.raises(ApiError) as info:
        client.esql.query(query="FROM kitune-kis | LIMIT 1")  # osmem has no ES|QL endpoint
    err = wrap_es_error("ES|QL query", "kitune-kis", info.value)
    assert isinstance(err, ElasticsearchRequestError) and err.status == info.value.meta.status
    assert f"HTTP {err.status}" in str(err) and err.reason
    with pytest.raises(ConfigError) as refused:
        ElasticsearchStore(client, index="kitune-kis", inference_id="e")  # reports OpenSearch 3.8.0
    assert str(refused.value).startswith(  # named as OpenSearch, not taken for an old Elasticsearch
        "the cluster is OpenSearch 3.8.0, not Elasticsearch: kitune's Elasticsearch store needs "
        "Elasticsearch 8.18.0+"
    )
