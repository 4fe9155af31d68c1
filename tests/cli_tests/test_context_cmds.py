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
        docid=docid,
        title=title,
        description=f"{title} From the registry.",
        subject=subject,
        predicate="related_to",
        obj=obj,
        evidence=[title],
        confidence=80,
        tags=["org"],
    )


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> typer.Typer:
    import kitune.retrieval as retrieval

    store = MemoryStore(embedder=HashEmbedder(dim=64))
    store.upsert(
        [
            _ki("d1", "Acme Corp", "Springfield", "Acme Corp is headquartered in Springfield."),
            _ki("d2", "Globex", "Shelbyville", "Globex is headquartered in Shelbyville."),
        ]
    )
    monkeypatch.setattr(retrieval, "create_store", lambda cfg: store)
    a = typer.Typer()
    context_cmds.register(a)
    return a


def test_context_json(app: typer.Typer) -> None:
    r = CliRunner().invoke(
        app, ["context", "Where is Acme Corp headquartered?", "--no-rewrite", "--json", "--size", "1"]
    )
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


def _use_rewrite_lm(monkeypatch: pytest.MonkeyPatch, lm: object) -> None:
    """Make the CLI's rewriter use ``lm`` (an object with ``forward``) instead of a real provider."""
    import kitune.lm as lm_mod
    from kitune.programs.query_rewriter import QueryRewriter

    monkeypatch.setattr(lm_mod, "build_lm", lambda cfg, role, **kw: lm)
    monkeypatch.setattr(lm_mod, "adapter_for", lambda lm: None)
    monkeypatch.setattr(QueryRewriter, "set_lm", lambda self, lm: setattr(self, "_test_lm", lm))
    monkeypatch.setattr(QueryRewriter, "get_lm", lambda self: self._test_lm)


class _RefusingLM:
    """A rewrite LM whose provider rejects the key (counts calls)."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, **kwargs: object) -> None:
        from kitune.errors import LMAuthError

        self.calls += 1
        raise LMAuthError(
            "HTTP 401 from http://gw.test/v1 for model m: the key in $GW_KEY (…abcd) was rejected"
        )


class _OkLM:
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def forward(self, **kwargs: object) -> None:
        self.calls.append(dict(kwargs))


def test_context_on_an_empty_store_refuses_before_any_llm_call(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 16: `kitune context` on an empty KI store spent rewrite tokens and printed nothing useful.
    import kitune.retrieval as retrieval

    monkeypatch.setattr(retrieval, "create_store", lambda cfg: MemoryStore(embedder=HashEmbedder(dim=64)))
    lm = _RefusingLM()
    _use_rewrite_lm(monkeypatch, lm)
    import kitune.lm as lm_mod

    built: list[str] = []
    monkeypatch.setattr(lm_mod, "build_lm", lambda cfg, role, **kw: built.append(role) or lm)
    a = typer.Typer()
    context_cmds.register(a)
    r = CliRunner().invoke(a, ["context", "Where is Acme Corp headquartered?"])
    assert r.exit_code == 2, r.output
    assert "holds no KIs" in r.output and "kitune extract" in r.output
    assert lm.calls == 0 and built == []  # refused before the rewrite LM was even built


def test_serve_with_a_refused_key_exits_2_at_start_and_never_serves(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    served: list[object] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: served.append(a))
    lm = _RefusingLM()
    _use_rewrite_lm(monkeypatch, lm)
    r = CliRunner().invoke(app, ["serve"])
    assert r.exit_code == 2, r.output
    assert "refused the key at start-up" in r.output and "$GW_KEY" in r.output and "--no-rewrite" in r.output
    assert lm.calls == 1 and served == []


def test_serve_warms_the_rewrite_lm_up_before_serving(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    served: list[object] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: served.append(a))
    lm = _OkLM()
    _use_rewrite_lm(monkeypatch, lm)
    r = CliRunner().invoke(app, ["serve", "--refresh-s", "0"])
    assert r.exit_code == 0, r.output
    assert "rewrite LM ready" in r.output and len(served) == 1
    assert len(lm.calls) == 1 and lm.calls[0]["max_tokens"] == 4


def test_context_says_why_the_rewrite_fell_back(app: typer.Typer, monkeypatch: pytest.MonkeyPatch) -> None:
    # newcomer check: "rewrite fell back to the plain plan" gave no reason
    _use_rewrite_lm(monkeypatch, _OkLM())  # replies nothing: no plan to parse
    r = CliRunner().invoke(app, ["context", "Where is Globex headquartered?"], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert "Globex is headquartered in Shelbyville." in r.stdout
    out = " ".join(r.stdout.split())
    assert "(rewrite fell back to the plain plan: lm_error: " in out
