from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from kitune.cli import context_cmds
from kitune.ki import KI
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryStore


def _ki(docid: str, subject: str, obj: str, title: str) -> KI:
    return KI.from_fact(
        docid=docid, title=title, description=f"{title} From the registry.", subject=subject,
        predicate="related_to", obj=obj, evidence=[title], confidence=80, tags=["org"],
    )


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> typer.Typer:
    import kitune.retrieval as retrieval

    store = MemoryStore(embedder=HashEmbedder(dim=64))
    store.upsert([
        _ki("d1", "Acme Corp", "Springfield", "Acme Corp is headquartered in Springfield."),
        _ki("d2", "Globex", "Shelbyville", "Globex is headquartered in Shelbyville."),
    ])
    monkeypatch.setattr(retrieval, "create_store", lambda cfg: store)
    a = typer.Typer()
    context_cmds.register(a)
    return a


def test_context_json(app: typer.Typer) -> None:
    r = CliRunner().invoke(app, ["context", "Where is Acme Corp headquartered?", "--no-rewrite", "--json",
                                 "--size", "1"])
    assert r.exit_code == 0, r.output
    body = json.loads(r.stdout)
    assert [k["title"] for k in body["kis"]] == ["Acme Corp is headquartered in Springfield."]
    assert body["aggregations"]["by_doc"] == {"d1": 1}


def test_context_table_and_no_execute(app: typer.Typer) -> None:
    wide = {"COLUMNS": "200"}
    r = CliRunner().invoke(app, ["context", "Where is Globex headquartered?", "--no-rewrite"], env=wide)
    assert r.exit_code == 0, r.output
    assert "Globex is headquartered in Shelbyville." in r.stdout
    assert "aggregations" in r.stdout and "globex (1)" in r.stdout
    r2 = CliRunner().invoke(app, ["context", "Globex", "--no-rewrite", "--no-execute"])
    assert r2.exit_code == 0 and "compiled query" in r2.stdout and '"lexical": "Globex"' in r2.stdout


def test_serve_refuses_public_host_without_token(app: typer.Typer) -> None:
    r = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--no-rewrite"])
    assert r.exit_code == 2
    assert "KITUNE_API_TOKEN" in r.output
