"""``kitune context`` (one question → KIs + facets) and ``kitune serve`` (the HTTP API).

Both call :func:`kitune.service.context.get_context`; the store comes from
``kitune.retrieval.create_store(cfg)`` and the rewriter's LM from
``kitune.lm.build_lm(cfg, "rewrite")`` (``--no-rewrite`` skips the LM and uses plain plans).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from kitune.cli.common import ConfigOption, fail, get_config
from kitune.errors import KituneError

if TYPE_CHECKING:
    from kitune.config import KituneConfig
    from kitune.programs.query_rewriter import QueryRewriter
    from kitune.retrieval.base import Store
    from kitune.service.context import ContextResponse
    from kitune.usage import TokenLedger

__all__ = ["print_context", "register"]

NoRewriteOption = Annotated[
    bool, typer.Option("--no-rewrite", help="Skip the LLM rewrite; search with the question as typed.")
]


def _build(cfg: KituneConfig, *, use_rewriter: bool) -> tuple[Store, QueryRewriter | None, TokenLedger]:
    """Create the store and (unless disabled) the rewriter with its LM; exits 2 on KituneError."""
    from kitune.programs.query_rewriter import QueryRewriter
    from kitune.retrieval import create_store
    from kitune.usage import TokenLedger

    ledger = TokenLedger()
    try:
        store = create_store(cfg)
        rewriter: QueryRewriter | None = None
        if use_rewriter:
            from kitune.lm import adapter_for, build_lm

            lm = build_lm(cfg, "rewrite", ledger=ledger)
            rewriter = QueryRewriter(adapter=adapter_for(lm))
            rewriter.set_lm(lm)
    except KituneError as e:
        fail(f"{e}" + ("" if not use_rewriter else " (or pass --no-rewrite to search without the LLM)"))
    return store, rewriter, ledger


def print_context(resp: ContextResponse, console: Console) -> None:
    """Print a response as a Rich table of KIs plus one facet table."""
    if not resp.executed:
        compiled = resp.compiled_query
        text = compiled if isinstance(compiled, str) else json.dumps(compiled, indent=2, default=str)
        console.print("[bold]compiled query[/] (not executed):")
        console.print(text, markup=False, highlight=False)
        return
    table = Table(title=f"KIs for: {resp.query}", show_lines=False)
    table.add_column("#", justify="right")
    table.add_column("score", justify="right")
    table.add_column("title", ratio=1)
    table.add_column("docs")
    table.add_column("id", no_wrap=True)
    for i, k in enumerate(resp.kis, start=1):
        table.add_row(str(i), f"{k.score:.4f}", k.title, ", ".join(k.evidence_doc_ids), k.id)
    console.print(table)
    if not resp.kis:
        console.print("no KIs found")
    facets = Table(title="aggregations")
    facets.add_column("facet")
    facets.add_column("top values")
    for name, counts in (
        ("tags", resp.aggregations.by_tag),
        ("docs", resp.aggregations.by_doc),
        ("entities", resp.aggregations.by_entity),
    ):
        top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:8]
        facets.add_row(name, ", ".join(f"{k} ({v})" for k, v in top) or "-")
    console.print(facets)
    note = " (rewrite fell back to the plain plan)" if resp.rewrite_fell_back else ""
    console.print(
        f"rewrite tokens: {resp.rewrite_tokens.input} in / {resp.rewrite_tokens.output} out{note}; "
        f"{resp.took_ms:.0f} ms"
    )


def context(
    question: Annotated[str, typer.Argument(help="The question to retrieve KIs for.")],
    size: Annotated[int, typer.Option("--size", "-n", min=1, help="KIs to return (capped by max_size).")] = (
        10
    ),
    no_execute: Annotated[
        bool, typer.Option("--no-execute", help="Print the compiled query without running it.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the response as JSON.")] = False,
    no_rewrite: NoRewriteOption = False,
    config: ConfigOption = None,
) -> None:
    """Retrieve KIs, facets and the compiled query for one question (same as the HTTP API)."""
    from kitune.service.context import get_context

    cfg = get_config(config)
    if not question.strip():
        fail("the question is blank: pass the question text")
    store, rewriter, ledger = _build(cfg, use_rewriter=not no_rewrite)
    try:
        resp = get_context(
            question, store=store, rewriter=rewriter, size=size, execute=not no_execute, cfg=cfg,
            ledger=ledger,
        )
    except KituneError as e:
        fail(str(e))
    finally:
        store.close()
    if as_json:
        typer.echo(resp.model_dump_json(indent=2))
    else:
        print_context(resp, Console())


def serve(
    host: Annotated[
        str, typer.Option(help="Interface to bind; non-loopback needs KITUNE_API_TOKEN.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 8080,
    no_rewrite: NoRewriteOption = False,
    config: ConfigOption = None,
) -> None:
    """Serve POST /api/_get_context (OpenAPI at /docs and /openapi.json, liveness at /healthz)."""
    from kitune.server import API_TOKEN_ENV, create_app, is_loopback_host

    if not is_loopback_host(host) and not os.environ.get(API_TOKEN_ENV):
        fail(
            f"binding to {host} exposes the API beyond this machine: set {API_TOKEN_ENV} to a secret "
            "bearer token (clients send 'Authorization: Bearer <token>'), or use --host 127.0.0.1"
        )
    try:
        import uvicorn
    except ImportError:
        fail("kitune serve needs uvicorn: pip install 'kitune[server]'")
    cfg = get_config(config)
    store, rewriter, ledger = _build(cfg, use_rewriter=not no_rewrite)
    app = create_app(cfg, store=store, rewriter=rewriter, ledger=ledger)
    try:
        uvicorn.run(app, host=host, port=port, log_level="info")
    finally:
        store.close()


def register(app: typer.Typer) -> None:
    """Add ``kitune context`` and ``kitune serve`` to ``app``."""
    app.command("context")(context)
    app.command("serve")(serve)
