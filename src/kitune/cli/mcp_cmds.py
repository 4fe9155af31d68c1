"""``kitune mcp``: serve get_context, search_documents and get_document to any MCP client.

Thin: load the config, build the KI store (and, unless ``--no-rewrite``, the rewrite-role LM),
hand them to :func:`kitune.mcp_server.create_mcp_server` and run the chosen transport. With
``--transport stdio`` nothing but MCP messages is written to stdout (logs go to stderr).
"""

from __future__ import annotations

import os
from typing import Annotated, Literal

import typer

from kitune.cli.common import ConfigOption, fail, get_config
from kitune.cli.context_cmds import PackagedOption, PromptVersionOption
from kitune.errors import KituneError

__all__ = ["mcp_command", "register"]


def mcp_command(
    transport: Annotated[
        Literal["stdio", "http"],
        typer.Option("--transport", "-t", help="stdio (the client starts kitune) or http (streamable HTTP)."),
    ] = "stdio",
    host: Annotated[
        str, typer.Option(help="http: interface to bind; non-loopback needs KITUNE_API_TOKEN.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="http: TCP port (endpoint /mcp).")] = 8765,
    no_rewrite: Annotated[
        bool, typer.Option("--no-rewrite", help="Skip the LLM rewrite; search with the question as typed.")
    ] = False,
    prompt_version: PromptVersionOption = None,
    packaged: PackagedOption = False,
    config: ConfigOption = None,
) -> None:
    """Serve kitune's context tools over the Model Context Protocol (stdio or streamable HTTP).

    Serves the production prompt versions and their KI table, like ``kitune serve`` (printed on
    stderr; stdout is the protocol); --prompt-version or --packaged choose others.
    """
    if transport not in ("stdio", "http"):
        fail(f"--transport {transport!r}: use stdio or http")
    try:
        from kitune.mcp_server import check_bind, create_mcp_server, run_mcp
    except ImportError:
        fail("kitune mcp needs the MCP SDK: pip install 'kitune[server]'")
    from kitune.server import API_TOKEN_ENV

    token = os.environ.get(API_TOKEN_ENV) or None
    if transport == "http":
        try:
            check_bind(host, token)
        except KituneError as e:
            fail(str(e))
    cfg = get_config(config)
    from kitune.cli.context_cmds import _build, _warn_empty, resolve_setting

    shown = ("extractor",) if no_rewrite else ("extractor", "rewriter")
    setting = resolve_setting(cfg, prompt_version, packaged, programs=shown)
    store, rewriter, ledger = _build(cfg, setting, use_rewriter=not no_rewrite, on_empty=_warn_empty)
    server = create_mcp_server(cfg, store=store, rewriter=rewriter, ledger=ledger)
    try:
        run_mcp(
            server, transport="http" if transport == "http" else "stdio", host=host, port=port, token=token
        )
    except KeyboardInterrupt:
        pass
    finally:
        store.close()


def register(app: typer.Typer) -> None:
    """Add ``kitune mcp`` to ``app``."""
    app.command("mcp")(mcp_command)
