"""HTTP API hardening (issue 8 item 4): fuzzing, auth, no raw query passthrough, no leaks.

Covered elsewhere (docs/failure-cases-coverage.md): body cap 413 (tests/test_server.py),
``size`` bounds, refusing a public bind without a token
(tests/cli_tests/test_context_cmds.py::test_serve_refuses_public_host_without_token).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

from kitune.config import KituneConfig, RetrievalConfig
from kitune.errors import StoreUnavailableError
from kitune.ki import KI
from kitune.retrieval.elasticsearch import compile_esql
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryStore
from kitune.schema import QueryPlan
from kitune.server import create_app

TOKEN = "tok-s3cret-0123456789"
SECRET = "sk-live-DO-NOT-LEAK-42"


def _store() -> MemoryStore:
    s = MemoryStore(embedder=HashEmbedder(dim=32))
    s.upsert(
        [
            KI.from_fact(
                docid=f"d{i}",
                title=f"Acme plant {i} is in Springfield.",
                description=f"Acme plant {i} is in Springfield, per the register.",
                subject=f"Acme plant {i}",
                predicate="located_in",
                obj="Springfield",
                evidence=[f"plant {i} Springfield"],
                confidence=80,
                tags=["org"],
            )
            for i in range(4)
        ]
    )
    return s


CFG = KituneConfig(retrieval=RetrievalConfig(max_size=10))
APP = create_app(CFG, store=_store(), api_token=TOKEN)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_schemathesis_fuzz_never_gets_a_5xx(case: Any) -> None:
    """Every generated request (valid and invalid per the schema), with the token: no 5xx."""
    response = case.call_and_validate(
        headers={"Authorization": f"Bearer {TOKEN}"}, checks=[not_a_server_error]
    )
    assert response.status_code < 500, (case.body, response.text)
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"} and {"type", "message"} <= set(body["error"])
        assert "Traceback" not in response.text


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    body=st.one_of(
        _json_values.map(lambda v: json.dumps(v).encode()),
        st.fixed_dictionaries(
            {"query": st.text(max_size=300)},
            optional={"size": _json_values, "execute": _json_values, "esql": st.text(max_size=20)},
        ).map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=200),
    )
)
def test_raw_body_fuzz_is_never_a_5xx_and_never_leaks(body: bytes) -> None:
    client = TestClient(APP, raise_server_exceptions=False)
    r = client.post(
        "/api/_get_context",
        content=body,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    assert r.status_code in (200, 400, 413, 422), (body, r.status_code, r.text)
    assert "Traceback" not in r.text and TOKEN not in r.text


def test_auth_is_checked_before_the_body_and_the_token_is_compared_exactly() -> None:
    client = TestClient(APP, raise_server_exceptions=False)
    body = {"query": "Where is Acme plant 1?"}
    assert client.post("/api/_get_context", json=body).status_code == 401
    wrong = client.post("/api/_get_context", json=body, headers={"Authorization": f"Bearer {TOKEN}x"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
    prefix = client.post("/api/_get_context", json=body, headers={"Authorization": f"Bearer {TOKEN[:-1]}"})
    assert prefix.status_code == 401
    ok = client.post("/api/_get_context", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and ok.json()["kis"]
    assert client.get("/healthz").status_code == 200  # liveness needs no token


def test_raw_query_fields_are_rejected_not_passed_through() -> None:
    client = TestClient(APP, raise_server_exceptions=False)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for extra in (
        {"esql": "FROM kis | LIMIT 10000"},
        {"plan": {"lexical": "x"}},
        {"filters": {"status": "*"}},
    ):
        r = client.post("/api/_get_context", json={"query": "Acme", **extra}, headers=auth)
        assert r.status_code == 422, extra
        assert "extra" in r.json()["error"]["message"].lower() or "not permitted" in r.text.lower()


@pytest.mark.parametrize(
    "hostile",
    [
        'Acme" | DROP kis | EVAL x = "',
        "Acme') OR 1=1 --",
        "x | STATS c = COUNT(*) BY tags",
        "?lexical ?semantic ?status0",
    ],
)
def test_esql_values_are_parameters_never_query_text(hostile: str) -> None:
    plan = QueryPlan.plain(hostile, size=5)
    q = compile_esql(plan, "kitune-kis", RetrievalConfig())
    assert hostile not in q.query
    for token in ("DROP", "1=1", "COUNT(*)"):
        if token in hostile:
            assert token not in q.query
    assert {"lexical": plan.lexical} in q.params and {"semantic": plan.semantic} in q.params


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (RuntimeError(f"connect failed: postgres://admin:{SECRET}@db:5432"), 500),
        (
            StoreUnavailableError(f"es at https://elastic:{SECRET}@es:9200 refused", backend="elasticsearch"),
            503,
        ),
    ],
)
def test_errors_never_leak_secrets_or_stack_traces(exc: Exception, status: int) -> None:
    class Broken(MemoryStore):
        def search(self, plan: QueryPlan) -> Any:
            raise exc

    app = create_app(CFG, store=Broken(embedder=HashEmbedder(dim=32)), api_token=TOKEN)
    r = TestClient(app, raise_server_exceptions=False).post(
        "/api/_get_context", json={"query": "Acme"}, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert r.status_code == status
    assert SECRET not in r.text and "Traceback" not in r.text and "postgres" not in r.text
    assert r.json()["error"]["type"] in ("internal_error", "store_unavailable")
