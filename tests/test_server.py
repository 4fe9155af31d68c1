from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from kitune.config import KituneConfig, RetrievalConfig
from kitune.errors import ConfigError, DocumentNotFoundError, KituneError, StoreUnavailableError
from kitune.ki import KI
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryStore
from kitune.server import create_app, is_loopback_host


def _ki(docid: str, subject: str, obj: str, title: str) -> KI:
    return KI.from_fact(
        docid=docid,
        title=title,
        description=f"{title} Stated in the annual report.",
        subject=subject,
        predicate="related_to",
        obj=obj,
        evidence=[title],
        confidence=80,
        tags=["org"],
    )


@pytest.fixture
def cfg() -> KituneConfig:
    return KituneConfig(retrieval=RetrievalConfig(max_size=5))


@pytest.fixture
def store() -> MemoryStore:
    s = MemoryStore(embedder=HashEmbedder(dim=64))
    s.upsert(
        [
            _ki("d1", "Acme Corp", "Springfield", "Acme Corp is headquartered in Springfield."),
            _ki("d1", "Acme Corp", "1999", "Acme Corp was founded in 1999."),
            _ki("d2", "Globex", "Shelbyville", "Globex is headquartered in Shelbyville."),
        ]
    )
    return s


@pytest.fixture
def client(cfg: KituneConfig, store: MemoryStore) -> TestClient:
    return TestClient(create_app(cfg, store=store), raise_server_exceptions=False)


def test_get_context_returns_kis_and_aggregations(client: TestClient) -> None:
    r = client.post("/api/_get_context", json={"query": "Where is Acme Corp headquartered?", "size": 2})
    assert r.status_code == 200
    body = r.json()
    assert body["kis"][0]["title"] == "Acme Corp is headquartered in Springfield."
    assert len(body["kis"]) == 2
    assert set(body["kis"][0]) == {"id", "title", "description", "tags", "evidence_doc_ids", "score"}
    assert body["aggregations"]["by_entity"]["acme-corp"] == 2
    assert body["aggregations"]["by_doc"] == {"d1": 2}
    assert body["executed"] is True and body["rewrite_fell_back"] is False
    assert body["rewrite_tokens"] == {"input": 0, "output": 0}
    assert body["compiled_query"]["backend"] == "memory"
    assert body["plan"]["size"] == 2


def test_execute_false_returns_only_the_compiled_query(client: TestClient, store: MemoryStore) -> None:
    r = client.post("/api/_get_context", json={"query": "Acme Corp", "execute": False})
    assert r.status_code == 200
    body = r.json()
    assert body["kis"] == [] and body["executed"] is False
    assert body["aggregations"] == {"by_tag": {}, "by_doc": {}, "by_entity": {}}
    assert body["compiled_query"]["plan"]["lexical"] == "Acme Corp"
    assert body["compiled_query"]["plan"]["size"] == 5  # default_size 10 clamped to max_size 5


@pytest.mark.parametrize(
    "payload",
    [
        {"query": "Acme", "size": 0},
        {"query": "Acme", "size": 6},  # above cfg.retrieval.max_size
        {"query": "Acme", "size": "3"},
        {"query": ""},
        {"query": "   "},
        {"query": "x" * 2001},
        {"size": 3},
        {"query": "Acme", "unexpected": 1},
    ],
    ids=["size0", "size-over-max", "size-str", "empty", "blank", "too-long", "missing", "extra-key"],
)
def test_bad_requests_are_422_with_clear_messages(client: TestClient, payload: dict) -> None:
    r = client.post("/api/_get_context", json=payload)
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["type"] == "validation_error"
    assert err["message"].startswith("invalid request: body")
    assert err["details"] and all("loc" in d and "msg" in d for d in err["details"])


def test_size_bound_message_names_the_limit(client: TestClient) -> None:
    r = client.post("/api/_get_context", json={"query": "Acme", "size": 6})
    assert "less than or equal to 5" in r.json()["error"]["message"]


def test_invalid_json_is_422(client: TestClient) -> None:
    r = client.post("/api/_get_context", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422


def test_oversized_body_is_413(client: TestClient) -> None:
    big = json.dumps({"query": "a" * 100_000}).encode()
    r = client.post("/api/_get_context", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"]["type"] == "body_too_large"


def test_streamed_oversized_body_is_413(client: TestClient) -> None:
    def chunks():
        yield b'{"query": "'
        for _ in range(100):
            yield b"a" * 1024
        yield b'"}'

    r = client.post("/api/_get_context", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


class _Broken:
    backend = "broken"

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def compile(self, plan):
        raise self.exc

    def search(self, plan):
        raise self.exc


@pytest.mark.parametrize(
    ("exc", "status", "type_", "message"),
    [
        (
            ConfigError("retrieval.rrf_k must be >= 1: fix the config"),
            422,
            "config_error",
            "retrieval.rrf_k must be >= 1: fix the config",
        ),
        (DocumentNotFoundError("ki-123"), 404, "not_found", "no document or KI with id 'ki-123'"),
        (
            StoreUnavailableError("connect to https://user:s3cret@es.example:9200 failed"),
            503,
            "store_unavailable",
            "the KI store is unavailable: check that its backend is running and configured",
        ),
        (
            KituneError("token sk-SECRET leaked in message"),
            500,
            "internal_error",
            "internal error while answering the request; see the server log",
        ),
        (
            RuntimeError("Traceback (most recent call last): sk-SECRET"),
            500,
            "internal_error",
            "internal error while answering the request; see the server log",
        ),
    ],
    ids=["config", "not-found", "unavailable", "kitune-other", "unexpected"],
)
def test_error_table(cfg: KituneConfig, exc: Exception, status: int, type_: str, message: str) -> None:
    client = TestClient(create_app(cfg, store=_Broken(exc)), raise_server_exceptions=False)  # type: ignore[arg-type]
    r = client.post("/api/_get_context", json={"query": "Acme"})
    assert r.status_code == status
    assert r.json() == {"error": {"type": type_, "message": message}}
    assert "Traceback" not in r.text and "s3cret" not in r.text and "sk-SECRET" not in r.text


def test_openapi_and_healthz(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok", "kis": 3}


def test_healthz_is_not_ok_on_an_empty_served_table(cfg: KituneConfig) -> None:
    # issue 37: a served table with no active KI answers every look-up with nothing
    empty = MemoryStore(embedder=HashEmbedder(dim=64))
    versions = {"extractor": "kitune-x-extractor v2 (production)", "store": "kis-abcd1234"}
    client = TestClient(create_app(cfg, store=empty, versions=versions), raise_server_exceptions=False)
    r = client.get("/healthz")
    assert r.status_code == 503
    assert r.json() == {"status": "empty", "kis": 0, "serving": versions, "table": "kis-abcd1234"}
    empty.upsert([_ki("d1", "Acme Corp", "Springfield", "Acme Corp is headquartered in Springfield.")])
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["kis"] == 1
    spec = client.get("/openapi.json").json()
    op = spec["paths"]["/api/_get_context"]["post"]
    assert "200" in op["responses"]
    req = spec["components"]["schemas"]["ContextRequest"]["properties"]
    assert req["size"]["maximum"] == 5 and req["size"]["minimum"] == 1
    assert req["query"]["maxLength"] == 2000
    assert "ContextResponse" in spec["components"]["schemas"]


def test_bearer_token_required_when_set(
    cfg: KituneConfig, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KITUNE_API_TOKEN", "t0ken-value")
    client = TestClient(create_app(cfg, store=store), raise_server_exceptions=False)
    assert client.post("/api/_get_context", json={"query": "Acme"}).status_code == 401
    bad = client.post("/api/_get_context", json={"query": "Acme"}, headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and bad.headers["www-authenticate"] == "Bearer"
    assert "t0ken-value" not in bad.text
    auth = {"Authorization": "Bearer t0ken-value"}
    ok = client.post("/api/_get_context", json={"query": "Acme"}, headers=auth)
    assert ok.status_code == 200
    assert client.get("/healthz").status_code == 200


def test_lazy_store_creation_failure_is_503(cfg: KituneConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    import kitune.retrieval as retrieval

    def boom(_cfg):
        raise StoreUnavailableError("cannot open /secret/path")

    monkeypatch.setattr(retrieval, "create_store", boom, raising=False)
    client = TestClient(create_app(cfg), raise_server_exceptions=False)
    r = client.post("/api/_get_context", json={"query": "Acme"})
    assert r.status_code == 503 and "/secret/path" not in r.text


def test_is_loopback_host() -> None:
    assert is_loopback_host("127.0.0.1") and is_loopback_host("localhost") and is_loopback_host("::1")
    assert not any(is_loopback_host(h) for h in ("0.0.0.0", "10.1.2.3", "example.com"))


def test_rewriter_runs_behind_the_endpoint(cfg: KituneConfig, store: MemoryStore) -> None:
    from dspy.utils import DummyLM

    from kitune.programs.query_rewriter import QueryRewriter

    rw = QueryRewriter()
    rw.set_lm(
        DummyLM(
            [
                {
                    "plan_json": '{"entity_tags": ["Globex"], "lexical": "Globex headquartered", "semantic": "HQ"}'  # noqa: E501
                },
                {"plan_json": "no plan today"},
            ]
        )
    )
    client = TestClient(create_app(cfg, store=store, rewriter=rw), raise_server_exceptions=False)
    body = client.post("/api/_get_context", json={"query": "Where does the rival firm Globex sit?"}).json()
    assert body["plan"]["entity_tags"] == ["entity:globex"] and body["rewrite_fell_back"] is False
    assert body["kis"][0]["title"] == "Globex is headquartered in Shelbyville."
    body2 = client.post("/api/_get_context", json={"query": "Where is Acme Corp headquartered?"}).json()
    assert body2["rewrite_fell_back"] is True and body2["rewrite_reason"].startswith("no_json")
    assert body2["kis"][0]["title"] == "Acme Corp is headquartered in Springfield."


def test_rewrite_failure_is_logged_and_no_provider_text_reaches_the_response(
    cfg: KituneConfig, store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 16: a wrong key answered 200 with the 401 text (gateway URL included) in every body.
    from kitune.programs.query_rewriter import RewriteResult, RewriteTokens
    from kitune.schema import QueryPlan

    reason = "lm_error: LMAuthError: HTTP 401 from https://gw.example.com/v1 for model m: key rejected"

    class FailingRewriter:
        def rewrite(self, query: str, *, size: int, ledger: object = None) -> RewriteResult:
            return RewriteResult(
                plan=QueryPlan.plain(query, size=size), fell_back=True, reason=reason, tokens=RewriteTokens()
            )

    app = create_app(cfg, store=store, rewriter=FailingRewriter())  # type: ignore[arg-type]
    client = TestClient(app, raise_server_exceptions=False)
    with caplog.at_level("WARNING", logger="kitune.server"):
        r = client.post("/api/_get_context", json={"query": "Where is Acme Corp headquartered?"})
    assert r.status_code == 200
    body = r.json()
    assert body["rewrite_fell_back"] is True and body["rewrite_reason"] == "lm_error"

    # no provider text in the body; timing fields (``*_ms`` floats) can contain the digits 401
    def untimed(node: object) -> object:
        if isinstance(node, dict):
            return {k: untimed(v) for k, v in node.items() if not k.endswith("_ms")}
        return [untimed(v) for v in node] if isinstance(node, list) else node

    assert "gw.example.com" not in r.text and "401" not in json.dumps(untimed(body))
    assert any("gw.example.com" in rec.getMessage() and rec.levelname == "WARNING" for rec in caplog.records)


def test_openapi_documents_error_bodies_and_401_413(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    responses = schema["paths"]["/api/_get_context"]["post"]["responses"]
    assert {"200", "401", "413", "422", "500", "503"} <= set(responses)
    ref = responses["422"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.endswith("/ErrorBody")
    assert set(schema["components"]["schemas"]["ErrorBody"]["properties"]) == {"error"}
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    real = client.post("/api/_get_context", json={"query": ""}).json()
    assert set(real) == {"error"} and real["error"]["type"] == "validation_error"


def test_docs_are_served_without_a_cdn(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    assert "cdn.jsdelivr" not in page.text and "unpkg" not in page.text
    assert "/docs-assets/swagger-ui-bundle.js" in page.text
    js = client.get("/docs-assets/swagger-ui-bundle.js")
    assert js.status_code == 200 and "SwaggerUIBundle" in js.text
    assert client.get("/docs-assets/secrets.txt").status_code == 404
    assert client.get("/redoc").status_code == 404  # its assets come from a CDN: not offered


def test_docs_without_swagger_assets_list_the_endpoints(
    cfg: KituneConfig, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kitune.server as server

    monkeypatch.setattr(server, "_swagger_assets", lambda: None)
    client = TestClient(create_app(cfg, store=store), raise_server_exceptions=False)
    page = client.get("/docs")
    assert page.status_code == 200
    assert "<code>/api/_get_context</code>" in page.text and "<code>POST</code>" in page.text
    assert "401, 413" in page.text
