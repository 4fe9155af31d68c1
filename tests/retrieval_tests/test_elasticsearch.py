"""Elasticsearch backend without a server: mapping, bulk bodies and ES|QL against golden files,
the bulk retry logic against a fake client (case S1), the start-up inference check (case S2),
Warning headers (case S4). The live conformance run is in test_elasticsearch_live.py."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from elastic_transport import ApiResponseMeta, HttpHeaders
from elasticsearch import ApiError, NotFoundError

from kitune.config import RetrievalConfig
from kitune.errors import ConfigError, StoreError
from kitune.retrieval.elasticsearch import (
    ElasticsearchStore,
    bulk_operations,
    bulk_write,
    compile_esql,
    compile_facets,
    es_mapping,
    ki_to_source,
    parse_warnings,
    source_to_ki,
    to_es_filter,
)
from kitune.schema import Filter, QueryPlan
from kitune.testing.es_fakes import BulkOp, bulk_client, bulk_item
from kitune.testing.store_contract import make_ki

GOLDEN = Path(__file__).parent / "golden"


def _golden(name: str, actual: str) -> None:
    assert actual == (GOLDEN / name).read_text(encoding="utf-8"), f"golden {name} differs:\n{actual}"


def _meta(status: int, headers: dict[str, str] | None = None) -> ApiResponseMeta:
    return ApiResponseMeta(
        status=status, http_version="1.1", headers=HttpHeaders(headers or {}), duration=0.0, node=None
    )  # type: ignore[arg-type]


def test_mapping_golden() -> None:
    _golden("mapping.json", json.dumps(es_mapping("ki-e5-endpoint"), indent=2, sort_keys=True) + "\n")


def test_bulk_body_golden_and_source_roundtrip() -> None:
    ki = make_ki("Marie Curie", "Warsaw", docid="d1", predicate="born_in", tags=["person"])
    ops = bulk_operations("kitune-kis", [(ki.id, ki_to_source(ki))])
    _golden("bulk_body.ndjson", "".join(json.dumps(op, sort_keys=True) + "\n" for op in ops))
    source = ki_to_source(ki)
    source["status"] = "stale"  # status lives in its own field (update-by-query)
    back = source_to_ki(source)
    assert back.payload.status == "stale" and back.title == ki.title and back.id == ki.id


def test_esql_hybrid_golden_params_never_interpolated() -> None:
    evil = 'x" | DROP title | WHERE "1"=="1'
    plan = QueryPlan(
        entity_tags=("entity:marie-curie", "entity:warsaw"),
        lexical=evil,
        semantic="Where was Marie Curie born?",
        size=7,
        filters=Filter(tags_any=("person",), min_confidence=40),
    )
    q = compile_esql(plan, "kitune-kis", RetrievalConfig(rrf_k=40, tag_weight=2.0, branch_size=25))
    _golden("esql_hybrid.esql", q.query + "\n")
    _golden("esql_hybrid_request.json", json.dumps(q.to_json(), indent=2, sort_keys=True) + "\n")
    assert evil not in q.query and "Marie Curie" not in q.query
    assert {"lexical": evil} in q.params
    assert q.branches == ("tag", "lexical", "semantic")
    assert q.query.rstrip().endswith("| LIMIT 7")


def test_esql_single_branch_and_facets_golden() -> None:
    q = compile_esql(
        QueryPlan(lexical="Nobel Prize", filters=Filter(statuses=("active",))),
        "kitune-kis",
        RetrievalConfig(),
    )
    _golden("esql_lexical_only.esql", q.query + "\n")
    assert (
        "FORK" not in q.query
        and q.filter is None
        and q.params == [{"status0": "active"}, {"lexical": "Nobel Prize"}]
    )
    f = compile_facets("kitune-kis", Filter(doc_ids=("d1",)), by="tags", limit=50)
    _golden("esql_facets.esql", f.query + "\n")
    assert f.filter == {
        "bool": {
            "filter": [{"terms": {"status": ["active", "stale"]}}, {"terms": {"evidence_doc_ids": ["d1"]}}]
        }
    }
    with pytest.raises(StoreError, match="unknown facet"):
        compile_facets("kitune-kis", None, by="nope")
    with pytest.raises(StoreError, match="nothing to search"):
        compile_esql(
            QueryPlan.model_construct(entity_tags=(), lexical="", semantic="", filters=Filter(), size=3),
            "kitune-kis",
            RetrievalConfig(),
        )
    with pytest.raises(ConfigError, match="not a valid index name"):
        compile_facets("Bad Index", None)


def test_to_es_filter() -> None:
    assert to_es_filter(None) is None
    assert to_es_filter(Filter(statuses=("active", "stale", "expired"))) is None
    got = to_es_filter(
        Filter(tags_all=("a", "b"), subtypes=("disambiguation",), min_confidence=60), include_status=False
    )
    assert got == {
        "bool": {
            "filter": [
                {"term": {"tags": "a"}},
                {"term": {"tags": "b"}},
                {"terms": {"subtype": ["disambiguation"]}},
                {"range": {"confidence": {"gte": 60}}},
            ]
        }
    }


class ScriptedBulk:
    """``_bulk`` answers for :func:`bulk_client` (the real client): items fail by id with a per-id
    list of statuses consumed in order; ``whole_request`` statuses fail whole requests first."""

    def __init__(self, scripted: dict[str, list[int]], whole_request: list[int] | None = None) -> None:
        self.scripted = {k: list(v) for k, v in scripted.items()}
        self.whole_request = list(whole_request or [])
        self.calls: list[list[str]] = []
        self.params: list[dict[str, str]] = []

    def __call__(self, ops: list[BulkOp], params: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        ids = [action["index"]["_id"] for action, _ in ops]
        self.calls.append(ids)
        self.params.append(dict(params))
        if self.whole_request:
            status = self.whole_request.pop(0)
            etype = "es_rejected_execution_exception" if status == 429 else "illegal_argument_exception"
            return status, {"error": {"type": etype, "reason": "rejected"}, "status": status}
        items = []
        for (action, source), doc_id in zip(ops, ids, strict=True):
            script = self.scripted.get(doc_id)
            status = script.pop(0) if script else 201
            if source is not None and source.get("confidence") == "high":
                status = 400
            error = {
                400: {"type": "document_parsing_exception", "reason": "failed to parse field [confidence]"},
                429: {"type": "es_rejected_execution_exception", "reason": "rejected execution"},
            }.get(status)
            items.append(bulk_item(action, status, error))
        return 200, {"took": 1, "errors": any(i["index"]["status"] >= 300 for i in items), "items": items}


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Backoff sleeps of ``streaming_bulk`` (it calls ``time.sleep`` in its own module)."""
    recorded: list[float] = []
    monkeypatch.setattr("elasticsearch.helpers.actions.time.sleep", recorded.append)
    return recorded


def test_case_s1_partial_failures_and_429_retry(sleeps: list[float]) -> None:
    docs = [(f"d{i}", {"title": f"t{i}", "confidence": "high" if i in (10, 20) else 50}) for i in range(1000)]
    script = ScriptedBulk({"d700": [429]})
    result = bulk_write(bulk_client(script), "kitune-kis", docs, chunk_size=500, max_retries=5)
    assert result.submitted == 1000 and result.indexed == 998
    assert [(f.id, f.status) for f in result.failed] == [("d10", 400), ("d20", 400)]
    assert "document_parsing_exception" in result.failed[0].reason
    assert result.indexed + len(result.failed) == result.submitted and not result.ok
    assert [len(c) for c in script.calls] == [500, 500, 1]  # both chunks sent; only d700 retried
    assert script.calls[2] == ["d700"] and sleeps == [0.5]
    assert script.params == [{}, {}, {}]  # refresh=None is not sent


def test_case_s2_inference_errors_at_ingest_are_all_reported_failed(sleeps: list[float]) -> None:
    script = ScriptedBulk({"a": [400], "b": [400], "c": [400]})
    result = bulk_write(bulk_client(script), "ki-index", [("a", {}), ("b", {}), ("c", {})], refresh=True)
    assert (result.submitted, result.indexed, len(result.failed)) == (3, 0, 3)
    assert not result.ok and len(script.calls) == 1 and sleeps == []  # 4xx: never retried
    assert script.params == [{"refresh": "true"}]


def test_429_retries_are_bounded_with_exponential_backoff(sleeps: list[float]) -> None:
    script = ScriptedBulk({"a": [429] * 10})
    result = bulk_write(
        bulk_client(script),
        "i",
        [("a", {}), ("b", {})],
        max_retries=3,
        backoff_s=1.0,
        max_backoff_s=3.0,
    )
    assert (result.indexed, [(f.id, f.status) for f in result.failed]) == (1, [("a", 429)])
    assert sleeps == [1.0, 2.0, 3.0] and len(script.calls) == 4
    assert "429 after 3 retries" in result.failed[0].reason
    assert "es_rejected_execution_exception" in result.failed[0].reason


def test_whole_request_429_is_retried_and_400_is_not(sleeps: list[float]) -> None:
    script = ScriptedBulk({}, whole_request=[429])
    result = bulk_write(bulk_client(script), "i", [("a", {}), ("b", {})])
    assert result.ok and len(script.calls) == 2 and sleeps == [0.5]
    script = ScriptedBulk({}, whole_request=[400])
    result = bulk_write(bulk_client(script), "i", [("a", {}), ("b", {})], chunk_size=1)
    assert result.indexed == 1 and [f.id for f in result.failed] == ["a"] and len(script.calls) == 2
    assert result.failed[0].status == 400
    assert result.failed[0].reason == "bulk request failed: HTTP 400 illegal_argument_exception: rejected"
    script = ScriptedBulk({}, whole_request=[429, 429, 429])
    result = bulk_write(bulk_client(script), "i", [("a", {}), ("b", {})], max_retries=2)
    assert [(f.id, f.status) for f in result.failed] == [("a", 429), ("b", 429)] and len(script.calls) == 3
    assert result.failed[0].reason == (
        "429 after 2 retries: whole bulk request rejected: HTTP 429 es_rejected_execution_exception: rejected"
    )


def test_missing_items_are_reported_and_unreachable_cluster_raises() -> None:
    from elasticsearch import ConnectionError as ESConnectionError

    from kitune.errors import StoreUnavailableError

    def one_item_short(ops: list[BulkOp], params: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        return 200, {"took": 1, "errors": False, "items": [bulk_item(a, 201) for a, _ in ops[:-1]]}

    result = bulk_write(bulk_client(one_item_short), "i", [("a", {}), ("b", {}), ("c", {})], chunk_size=2)
    assert (result.indexed, [f.id for f in result.failed]) == (1, ["b", "c"])
    assert "no item for this document" in result.failed[0].reason

    def wrong_id(ops: list[BulkOp], params: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        items = [bulk_item({"index": {"_index": "i", "_id": "zz"}}, 201) for _ in ops[1:]]
        return 200, {"took": 1, "errors": False, "items": [bulk_item(ops[0][0], 201), *items]}

    result = bulk_write(bulk_client(wrong_id), "i", [("a", {}), ("b", {}), ("c", {})])
    assert (result.indexed, [f.id for f in result.failed]) == (1, ["b", "c"])  # items for no doc

    def refused(ops: list[BulkOp], params: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        raise ESConnectionError("connection refused")

    with pytest.raises(StoreUnavailableError, match="unreachable during bulk on index i"):
        bulk_write(bulk_client(refused), "i", [("a", {})])


class FakeES:
    """Just enough of the client for the start-up check and search."""

    def __init__(
        self,
        *,
        endpoint_exists: bool = True,
        esql_headers: dict[str, str] | None = None,
        version: str = "9.3.0",
    ) -> None:
        self.version = version
        self.created: list[str] = []
        self.esql_calls: list[dict[str, Any]] = []
        self.docs: dict[str, dict[str, Any]] = {}
        self._headers = esql_headers or {}

        def get_endpoint(*, inference_id: str) -> dict[str, Any]:
            if not endpoint_exists:
                raise NotFoundError("resource_not_found_exception", meta=_meta(404), body={})
            return {"endpoints": [{"inference_id": inference_id}]}

        self.inference = SimpleNamespace(get=get_endpoint)
        self.mappings: dict[str, dict[str, Any]] = {}

        def create(*, index: str, mappings: dict[str, Any]) -> None:
            self.created.append(index)
            self.mappings[index] = mappings

        self.indices = SimpleNamespace(
            exists=lambda *, index: index in self.created,
            create=create,
            get_mapping=lambda *, index: {index: {"mappings": self.mappings[index]}},
        )
        self.esql = SimpleNamespace(query=self._esql)
        # writes take the real client's path (streaming_bulk → client.options().bulk → NDJSON);
        # its _bulk requests are answered by self.answer_bulk (looked up per request)
        real = bulk_client(lambda ops, params: self.answer_bulk(ops, params))
        self._otel, self.transport, self.options = real._otel, real.transport, real.options

    def info(self) -> dict[str, Any]:
        return {"version": {"number": self.version, "build_flavor": "default"}}

    def _esql(self, **kwargs: Any) -> Any:
        self.esql_calls.append(kwargs)
        ids = sorted(self.docs)
        body = {
            "columns": [{"name": "_id", "type": "keyword"}, {"name": "_score", "type": "double"}],
            "values": [[i, 0.5] for i in ids],
        }
        return SimpleNamespace(body=body, meta=_meta(200, self._headers))

    def answer_bulk(self, ops: list[BulkOp], params: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        for action, src in ops:
            self.docs[action["index"]["_id"]] = dict(src or {})
        return 200, {"took": 1, "errors": False, "items": [bulk_item(action, 201) for action, _ in ops]}

    def mget(self, *, index: str, ids: list[str]) -> dict[str, Any]:
        return {"docs": [{"_id": i, "found": i in self.docs, "_source": self.docs.get(i)} for i in ids]}


def test_case_s2_missing_inference_endpoint_fails_fast_and_creates_no_index() -> None:
    client = FakeES(endpoint_exists=False)
    with pytest.raises(ConfigError, match="inference endpoint ki-e5-endpoint not found"):
        ElasticsearchStore(client, index="ki-index", inference_id="ki-e5-endpoint")
    assert client.created == []
    ok = FakeES()
    ElasticsearchStore(ok, index="ki-index", inference_id="ki-e5-endpoint")
    assert ok.created == ["ki-index"]


def test_case_s4_warning_header_marks_result_truncated_and_ties_break_by_id() -> None:
    warning = '299 Elasticsearch-9.1.0 "No limit defined, adding default limit of [1000]"'
    client = FakeES(esql_headers={"Warning": warning})
    store = ElasticsearchStore(client, index="kitune-kis", inference_id="e")
    kis = [make_ki("Beta", "X"), make_ki("Alpha", "X")]
    assert store.upsert(kis).ok
    result = store.search(QueryPlan(lexical="X", semantic="X", size=5))
    assert result.truncated and result.warnings == (warning,)
    assert [h.ki.id for h in result.hits] == sorted(k.id for k in kis)  # equal scores → id order
    assert result.compiled == client.esql_calls[0]["query"] and "| LIMIT 5" in result.compiled
    assert client.esql_calls[0]["params"][-1] == {"semantic": "X"}


def test_empty_plan_searches_nothing() -> None:
    client = FakeES()
    store = ElasticsearchStore(client, index="kitune-kis", inference_id="e")
    empty = QueryPlan.model_construct(entity_tags=(), lexical=" ", semantic="", filters=Filter(), size=3)
    assert store.search(empty).hits == [] and store.compile(empty) == ""
    assert client.esql_calls == []


def test_parse_warnings() -> None:
    assert parse_warnings(None) == (False, ())
    assert parse_warnings({"warning": '299 Elasticsearch "Line 1: evaluation of [x] failed"'})[0] is False
    truncated, warnings = parse_warnings({"Warning": '299 ES "a limit", 299 ES "b"'})
    assert truncated and len(warnings) == 2


class RecordingES(FakeES):
    """Records the bodies of the lifecycle and paging calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def update_by_query(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("update_by_query", kwargs))
        return {"updated": 2}

    def delete_by_query(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("delete_by_query", kwargs))
        return {"deleted": 1}

    def open_point_in_time(self, **kwargs: Any) -> dict[str, Any]:
        return {"id": "pit-1"}

    def close_point_in_time(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("close_point_in_time", kwargs))
        return {}

    def search(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("search", kwargs))
        ids = sorted(self.docs)
        after = kwargs.get("search_after")
        start = ids.index(after[0]) + 1 if after else 0
        page = ids[start : start + kwargs["size"]]
        hits = [{"_id": i, "_source": self.docs[i], "sort": [i]} for i in page]
        return {"hits": {"hits": hits}, "pit_id": "pit-1"}


def test_lifecycle_and_paging_requests() -> None:
    from datetime import timedelta

    from kitune.testing.store_contract import T0

    client = RecordingES()
    store = ElasticsearchStore(client, index="kitune-kis", inference_id="e")
    kis = [make_ki(f"Person {i}", "X") for i in range(5)]
    store.upsert(kis)
    assert store.set_status(Filter(doc_ids=("d1",)), "stale") == 2
    name, body = client.calls[-1]
    assert name == "update_by_query" and body["script"]["params"] == {"status": "stale"}
    assert body["query"]["bool"]["must_not"] == [{"term": {"status": "stale"}}]
    result = store.sweep(T0, timedelta(days=7))
    assert (result.stale, result.expired) == (2, 2)
    expired_q = client.calls[-2][1]["query"]["bool"]
    assert expired_q["should"][0] == {"range": {"last_seen": {"lt": "2026-10-18T12:00:00+00:00"}}}
    assert expired_q["should"][1] == {"range": {"expires_at": {"lte": "2026-11-01T12:00:00+00:00"}}}
    stale_q = client.calls[-1][1]["query"]["bool"]["filter"]
    assert stale_q[1] == {"range": {"last_seen": {"lt": "2026-10-25T12:00:00+00:00"}}}
    assert store.delete([kis[0].id, kis[0].id]) == 1
    assert client.calls[-1][1]["query"] == {"ids": {"values": [kis[0].id]}}
    got = [k.id for k in store.iter_kis(page_size=2)]
    assert got == sorted(k.id for k in kis)
    searches = [c for c in client.calls if c[0] == "search"]
    assert len(searches) == 3 and "from" not in searches[1][1] and searches[1][1]["search_after"]
    assert client.calls[-1][0] == "close_point_in_time"


# -- version routing, client RRF, error wrapping, mapping as published (issue 14) ---------------


def _reference_rrf(branches: dict[str, list[str]], weights: dict[str, float], k: int) -> list[str]:
    """FUSE RRF as Elastic documents it: score = sum over forks of weight / (rank_constant + rank)."""
    score: dict[str, float] = {}
    for name, ids in branches.items():
        for rank, i in enumerate(ids, start=1):
            score[i] = score.get(i, 0.0) + weights[name] / (k + rank)
    return sorted(score, key=lambda i: (-score[i], i))


class BranchES(FakeES):
    """Answers each ES|QL query from fixed per-branch hit lists; on 9.2+ it applies FUSE itself."""

    def __init__(self, version: str, hits: dict[str, list[tuple[str, float]]]) -> None:
        super().__init__(version=version)
        self.hits = hits

    def _esql(self, **kwargs: Any) -> Any:
        self.esql_calls.append(kwargs)
        q = kwargs["query"]
        present = [
            b
            for b, marker in (("tag", "MATCH(tags"), ("lexical", "title_text"), ("semantic", "description"))
            if marker in q
        ]
        if "FUSE RRF" in q:
            options = json.loads(q.split("FUSE RRF WITH ", 1)[1].split("\n", 1)[0])
            weights = {b: options["weights"][f"fork{n + 1}"] for n, b in enumerate(present)}
            ranked = {b: [i for i, _ in sorted(self.hits[b], key=lambda h: -h[1])] for b in present}
            fused = _reference_rrf(ranked, weights, options["rank_constant"])
            limit = int(q.rsplit("LIMIT ", 1)[1])
            values = [[i, 1.0 / (n + 1)] for n, i in enumerate(fused[:limit])]
        else:
            (branch,) = present
            values = [[i, s] for i, s in self.hits[branch]]
        body = {
            "columns": [{"name": "_id", "type": "keyword"}, {"name": "_score", "type": "double"}],
            "values": values,
        }
        return SimpleNamespace(body=body, meta=_meta(200))


def _branch_hits(kis: list[Any]) -> dict[str, list[tuple[str, float]]]:
    ids = [k.id for k in kis]
    return {
        "tag": [(ids[0], 3.0), (ids[1], 2.0), (ids[2], 1.0)],
        "lexical": [(ids[2], 9.0), (ids[3], 8.0), (ids[0], 7.0), (ids[4], 1.0)],
        "semantic": [(ids[4], 0.9), (ids[2], 0.8), (ids[1], 0.7)],
    }


def test_version_9_3_runs_one_fork_fuse_query() -> None:
    kis = [make_ki(f"Person {i}", "X") for i in range(5)]
    client = BranchES("9.3.0", _branch_hits(kis))
    store = ElasticsearchStore(client, index="kitune-kis", inference_id="e")
    store.upsert(kis)
    assert store.esql_mode == "fuse" and store.version == (9, 3, 0)
    plan = QueryPlan(entity_tags=("entity:person-0",), lexical="X", semantic="X", size=4)
    result = store.search(plan)
    assert len(client.esql_calls) == 1 and "| FUSE RRF WITH" in client.esql_calls[0]["query"]
    assert [h.ki.id for h in result.hits] == _reference_rrf(
        {b: [i for i, _ in h] for b, h in _branch_hits(kis).items()},
        {"tag": 1.0, "lexical": 1.0, "semantic": 1.0},
        60,
    )[:4]


@pytest.mark.parametrize("weights", [(1.0, 1.0, 1.0), (3.0, 0.5, 1.0), (0.0, 2.0, 1.0)])
def test_version_9_1_runs_each_branch_and_fuses_client_side_in_the_fuse_order(
    weights: tuple[float, ...],
) -> None:
    kis = [make_ki(f"Person {i}", "X") for i in range(5)]
    retrieval = RetrievalConfig(
        tag_weight=weights[0], lexical_weight=weights[1], semantic_weight=weights[2], rrf_k=20
    )
    plan = QueryPlan(entity_tags=("entity:person-0",), lexical="X", semantic="X", size=5)
    new = BranchES("9.3.1", _branch_hits(kis))
    old = BranchES("9.1.3", _branch_hits(kis))
    fused_server = ElasticsearchStore(new, index="kitune-kis", inference_id="e", retrieval=retrieval)
    fused_client = ElasticsearchStore(old, index="kitune-kis", inference_id="e", retrieval=retrieval)
    for s in (fused_server, fused_client):
        s.upsert(kis)
    assert fused_client.esql_mode == "per_branch"
    server_ids = [h.ki.id for h in fused_server.search(plan).hits]
    client_result = fused_client.search(plan)
    assert [h.ki.id for h in client_result.hits] == server_ids
    assert len(old.esql_calls) == 3 and not any(
        "FORK" in c["query"] or "FUSE" in c["query"] for c in old.esql_calls
    )
    assert all(c["query"].rstrip().endswith(f"| LIMIT {retrieval.branch_size}") for c in old.esql_calls)
    top = client_result.hits[0]
    assert top.branches == {
        b: n
        for b, hits in _branch_hits(kis).items()
        for n, (i, _) in enumerate(hits, start=1)
        if i == top.ki.id
    }
    assert client_result.compiled == fused_client.compile(plan) and client_result.compiled.count("FROM ") == 3


def test_old_cluster_gets_an_error_naming_the_minimum_and_serverless_gets_fuse() -> None:
    with pytest.raises(ConfigError, match=r"Elasticsearch 8\.10\.4 is too old.*minimum is 8\.18\.0"):
        ElasticsearchStore(FakeES(version="8.10.4"), index="kitune-kis", inference_id="e")
    assert ElasticsearchStore(FakeES(version="8.18.0"), index="i", inference_id="e").esql_mode == "per_branch"
    serverless = FakeES(version="8.11.0")
    serverless.info = lambda: {"version": {"number": "8.11.0", "build_flavor": "serverless"}}  # type: ignore[method-assign]
    assert ElasticsearchStore(serverless, index="i", inference_id="e").esql_mode == "fuse"


def test_every_client_error_becomes_a_store_error_with_status_and_reason() -> None:
    from elasticsearch import ConnectionError as ESConnectionError

    from kitune.errors import StoreUnavailableError
    from kitune.retrieval.elasticsearch import ElasticsearchRequestError

    client = FakeES(version="9.1.0")
    store = ElasticsearchStore(client, index="kitune-kis", inference_id="e")
    body = {
        "error": {
            "root_cause": [
                {"type": "verification_exception", "reason": "Found 1 problem\nline 3:3: Unknown column"}
            ],
            "type": "verification_exception",
            "reason": "Found 1 problem",
        },
        "status": 400,
    }

    def bad_request(**kwargs: Any) -> Any:
        raise ApiError("verification_exception", meta=_meta(400), body=body)

    client.esql = SimpleNamespace(query=bad_request)
    with pytest.raises(ElasticsearchRequestError) as info:
        store.search(QueryPlan(lexical="x"))
    err = info.value
    assert isinstance(err, StoreError) and (err.status, err.error_type) == (400, "verification_exception")
    assert "Unknown column" in err.reason and "HTTP 400" in str(err) and "kitune-kis" in str(err)

    def down(**kwargs: Any) -> Any:
        raise ESConnectionError("connection refused")

    client.count = down  # type: ignore[attr-defined]
    with pytest.raises(StoreUnavailableError, match="unreachable during count"):
        store.count()
    client.update_by_query = lambda **kw: (_ for _ in ()).throw(  # type: ignore[attr-defined]
        ApiError(
            "security_exception",
            meta=_meta(403),
            body={"error": {"type": "security_exception", "reason": "no"}},
        )
    )
    with pytest.raises(ElasticsearchRequestError, match=r"HTTP 403 security_exception: no .*privileges"):
        store.set_status(Filter(), "stale")
    failing_info = FakeES()
    failing_info.info = lambda: (_ for _ in ()).throw(ESConnectionError("refused"))  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailableError):
        ElasticsearchStore(failing_info, index="i", inference_id="e")


def test_mapping_is_as_published() -> None:
    props = es_mapping("ep")["properties"]
    semantic = {"type": "semantic_text", "inference_id": "ep"}
    assert props["title"] == semantic and props["description"] == semantic
    assert props["title_text"] == {"type": "text"}
    for name in ("type", "id", "references", "tags", "evidence_doc_ids", "subject", "predicate", "docid"):
        assert props[name] == {"type": "keyword"}, name
    assert props["object"] == {"type": "text"} and props["evidence"] == {"type": "text"}
    ki = make_ki("Marie Curie", "Warsaw", docid="d1", predicate="born_in")
    src = ki_to_source(ki)
    assert set(src) == set(props)  # dynamic: strict — every written field is mapped
    assert (src["subject"], src["predicate"], src["object"], src["docid"]) == (
        "Marie Curie",
        "born_in",
        "Warsaw",
        "d1",
    )
    assert src["title_text"] == src["title"] == ki.title and src["evidence"] == ki.payload.evidence


def test_tag_branch_matches_the_bare_slug_and_filters_on_subject_predicate() -> None:
    plan = QueryPlan(entity_tags=("entity:marie-curie",), lexical="born", size=3)
    q = compile_esql(plan, "kitune-kis", RetrievalConfig())
    assert "MATCH(tags, ?tag0) OR MATCH(tags, ?tag1)" in q.query
    assert {"tag0": "entity:marie-curie"} in q.params and {"tag1": "marie-curie"} in q.params
    flt = Filter().model_copy(update={"subjects": ("Marie Curie",), "predicates": ("born_in",)})
    assert to_es_filter(flt, include_status=False) == {
        "bool": {"filter": [{"terms": {"subject": ["Marie Curie"]}}, {"terms": {"predicate": ["born_in"]}}]}
    }


def test_reindex_copies_every_ki_with_the_new_fields() -> None:
    client = RecordingES()
    old = ElasticsearchStore(client, index="kitune-kis-v1", inference_id="e")
    client.mappings["kitune-kis-v1"] = {"properties": {"title": {"type": "text"}, "ki": {"type": "object"}}}
    with pytest.raises(ConfigError, match=r"earlier kitune mapping.*kitune reindex --from kitune-kis-v1"):
        ElasticsearchStore(client, index="kitune-kis-v1", inference_id="e")
    kis = [make_ki(f"Person {i}", "X", status="stale" if i == 2 else "active") for i in range(5)]
    for k in kis:  # documents written with the old mapping: no title_text/subject fields
        src = ki_to_source(k)
        client.docs[k.id] = {key: src[key] for key in ("id", "title", "description", "tags", "status", "ki")}
    new = ElasticsearchStore(client, index="kitune-kis-v2", inference_id="e")
    written: list[dict[str, Any]] = []

    def record(ops: list[BulkOp], params: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        assert all(action["index"]["_index"] == "kitune-kis-v2" for action, _ in ops)
        written.extend(src or {} for _, src in ops)
        return 200, {"took": 1, "errors": False, "items": [bulk_item(action, 201) for action, _ in ops]}

    client.answer_bulk = record  # type: ignore[method-assign]
    result = new.reindex_from("kitune-kis-v1", page_size=2)
    assert (result.submitted, result.indexed, result.failed) == (5, 5, [])
    assert sorted(d["id"] for d in written) == sorted(k.id for k in kis)
    assert all(d["title_text"] == d["title"] and d["subject"].startswith("Person") for d in written)
    assert next(d for d in written if d["id"] == kis[2].id)["status"] == "stale"
    assert old.index == "kitune-kis-v1" and "kitune-kis-v2" in client.created
    with pytest.raises(ConfigError, match="both kitune-kis-v2"):
        new.reindex_from("kitune-kis-v2")


def test_fingerprint_follows_primary_max_seq_no() -> None:
    from kitune.retrieval.es_query import stats_fingerprint

    def stats(seq: list[int], uuid: str = "u1") -> dict[str, Any]:
        shards = {
            str(n): [
                {"routing": {"primary": True}, "seq_no": {"max_seq_no": s}},
                {"routing": {"primary": False}, "seq_no": {"max_seq_no": s - 1}},
            ]
            for n, s in enumerate(seq)
        }
        return {"indices": {"kitune-kis": {"uuid": uuid, "shards": shards}}}

    base = stats_fingerprint(stats([4, 9]), "kitune-kis")
    assert base == stats_fingerprint(stats([4, 9]), "kitune-kis")
    assert base != stats_fingerprint(stats([4, 10]), "kitune-kis")  # one write on shard 1
    assert base != stats_fingerprint(stats([4, 9], uuid="u2"), "kitune-kis")  # index re-created
    replica_only = stats([4, 9])
    replica_only["indices"]["kitune-kis"]["shards"]["0"][1]["seq_no"]["max_seq_no"] = 99
    assert stats_fingerprint(replica_only, "kitune-kis") == base


# -- cluster identity (issue 25): a 9.x client against 8.x, and OpenSearch ----------------------------

import http.server  # noqa: E402
import threading  # noqa: E402
from collections.abc import Iterator  # noqa: E402

from elasticsearch import Elasticsearch, __versionstr__  # noqa: E402

from kitune.retrieval.es_client import cluster_info, version_mismatch, wrap_es_error  # noqa: E402

ES8_REFUSAL = {  # what Elasticsearch 8.x answers a 9.x client's compatible-with=9 media types
    "error": {
        "root_cause": [
            {"type": "media_type_header_exception", "reason": "Invalid media-type value on headers [Accept]"}
        ],
        "type": "media_type_header_exception",
        "reason": "Invalid media-type value on headers [Accept]",
        "caused_by": {
            "type": "status_exception",
            "reason": "Accept version must be either version 8 or 7, but found 9. "
            "Accept=application/vnd.elasticsearch+json; compatible-with=9",
        },
    },
    "status": 400,
}
OPENSEARCH_ROOT = {  # GET / of OpenSearch 2.11.0 (no X-Elastic-Product header)
    "name": "node-1",
    "cluster_name": "opensearch",
    "cluster_uuid": "Lk2a",
    "version": {
        "distribution": "opensearch",
        "number": "2.11.0",
        "build_type": "tar",
        "lucene_version": "9.7.0",
        "minimum_wire_compatibility_version": "7.10.0",
        "minimum_index_compatibility_version": "7.0.0",
    },
    "tagline": "The OpenSearch Project: https://opensearch.org/",
}


def _es8_root(number: str) -> dict[str, Any]:
    return {
        "name": "n",
        "version": {"number": number, "build_flavor": "default"},
        "tagline": "You Know, for Search",
    }


@pytest.fixture
def fake_cluster() -> Iterator[dict[str, Any]]:
    """An HTTP server answering ``GET /`` like Elasticsearch 8.x (``state["es8"]``) or OpenSearch."""
    state: dict[str, Any] = {"es8": "8.19.3", "accepts": []}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            accept = self.headers.get("accept", "")
            state["accepts"].append(accept)
            if state["es8"] is None:
                status, body, product = 200, OPENSEARCH_ROOT, None
            elif "compatible-with=9" in accept:
                status, body, product = 400, ES8_REFUSAL, "Elasticsearch"
            else:
                status, body, product = 200, _es8_root(state["es8"]), "Elasticsearch"
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            if product:
                self.send_header("x-elastic-product", product)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def test_a_9x_client_against_8x_names_both_versions_and_the_fix(fake_cluster: dict[str, Any]) -> None:
    client = Elasticsearch(fake_cluster["url"], request_timeout=5)
    with pytest.raises(ConfigError) as info:
        ElasticsearchStore(client, index="kitune-kis", inference_id="e")
    assert __versionstr__ == "9.5.1"  # the pinned client (pyproject's elasticsearch extra)
    assert str(info.value) == (
        "the elasticsearch Python client 9.5.1 sends 9.x media types (compatible-with=9) and Elasticsearch "
        "8.19.3 refuses them (HTTP 400 media_type_header_exception): kitune requires the 9.x client "
        "(elasticsearch>=9.5.1, its elasticsearch extra), which works with Elasticsearch 9.x clusters only: "
        "upgrade the cluster to Elasticsearch 9.x, or use the embedded store (store.type: lancedb)"
    )
    assert "<9" not in str(info.value)  # never a client pyproject's elasticsearch>=9.5.1 rules out
    # asked as the 9.x client does, then once more in the cluster's own dialect to read its version
    assert fake_cluster["accepts"] == [
        "application/vnd.elasticsearch+json; compatible-with=9",
        "application/vnd.elasticsearch+json; compatible-with=8",
    ]
    fake_cluster["es8"] = "8.15.1"  # older than 8.18 as well: the same fix (9.x) covers it
    with pytest.raises(ConfigError) as old:
        cluster_info(client)
    assert str(old.value).endswith(
        "Elasticsearch 8.15.1 refuses them (HTTP 400 media_type_header_exception): kitune requires the 9.x "
        "client (elasticsearch>=9.5.1, its elasticsearch extra), which works with Elasticsearch 9.x clusters "
        "only: upgrade the cluster to Elasticsearch 9.x, or use the embedded store (store.type: lancedb)"
    )


def test_the_refusal_mid_run_is_wrapped_with_the_same_explanation() -> None:
    from elasticsearch import BadRequestError

    e = BadRequestError("media_type_header_exception", meta=_meta(400), body=ES8_REFUSAL)
    err = wrap_es_error("ES|QL query", "kitune-kis", e)
    assert str(err) == (
        "Elasticsearch ES|QL query on index kitune-kis failed: HTTP 400 media_type_header_exception: Invalid "
        "media-type value on headers [Accept] — the elasticsearch Python client 9.5.1 sends 9.x media types "
        "(compatible-with=9) and an Elasticsearch 8.x cluster refuses them (HTTP 400 "
        "media_type_header_exception): kitune requires the 9.x client (elasticsearch>=9.5.1, its "
        "elasticsearch extra), which works with Elasticsearch 9.x clusters only: upgrade the cluster to "
        "Elasticsearch 9.x, or use the embedded store (store.type: lancedb)"
    )
    other = ApiError("verification_exception", meta=_meta(400), body={"error": {"type": "x", "reason": "y"}})
    assert version_mismatch(other) is None


def test_opensearch_is_named_with_its_version_and_what_to_do(fake_cluster: dict[str, Any]) -> None:
    fake_cluster["es8"] = None  # OpenSearch: no X-Elastic-Product header, the client refuses it
    client = Elasticsearch(fake_cluster["url"], request_timeout=5)
    expected = (
        "the cluster is OpenSearch 2.11.0, not Elasticsearch: kitune's Elasticsearch store needs "
        "Elasticsearch 8.18.0+ (ES|QL MATCH on semantic_text, FORK/FUSE), which OpenSearch does not have. "
        "Point the store URL (store.url_env, KITUNE_ES_URL) at an Elasticsearch cluster, or use the "
        "embedded store (store.type: lancedb)"
    )
    with pytest.raises(ConfigError) as info:
        ElasticsearchStore(client, index="kitune-kis", inference_id="e")
    assert str(info.value) == expected
    # an OpenSearch-compatible server that sends the product header (osmem) is named the same way
    passes = FakeES(version="2.11.0")
    passes.info = lambda: OPENSEARCH_ROOT  # type: ignore[method-assign]
    with pytest.raises(ConfigError) as same:
        ElasticsearchStore(passes, index="kitune-kis", inference_id="e")
    assert str(same.value) == expected
    # and a refusal on a later call says OpenSearch too, not "see Elasticsearch's reason above"
    from elasticsearch import UnsupportedProductError

    refused = UnsupportedProductError("not Elasticsearch", meta=_meta(200), body=OPENSEARCH_ROOT)
    assert (
        str(wrap_es_error("count", "kitune-kis", refused))
        == f"Elasticsearch count on index kitune-kis failed: {expected}"
    )
