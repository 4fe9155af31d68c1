"""``kitune mcp``: serve get_context, search_documents and get_document to any MCP client.

Thin: load the config, build the KI store (and, unless ``--no-rewrite``, the rewrite-role LM),
hand them to :func:`kitune.mcp_server.create_mcp_server` and run the chosen transport.

With ``--transport stdio`` stdout is the protocol and the server owns it from the command's
first line: until the transport takes it, file descriptor 1 (and so ``sys.stdout``, and C
libraries writing to fd 1) points at stderr, so whatever a library prints while it is imported
or while the store and the LM are built lands on stderr, never on the wire (even unbuffered,
``python -u``). The transport then serves the real stdout and sends stray output to stderr
itself while it runs; on the way out fd 1 is diverted again.

Like ``kitune serve``, the production prompt versions are re-read at most every ``--refresh-s``
seconds (default 30), so a ``kitune prompts promote`` / ``rollback`` is served without a restart.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Annotated, Literal

import typer

from kitune.cli.common import ConfigOption, configure_logging, fail, get_config
from kitune.cli.context_cmds import (
    NoRewriteOption,
    PackagedOption,
    PromptAliasOption,
    PromptVersionOption,
    RefreshOption,
    prompt_specs,
    start_serving,
)
from kitune.errors import KituneError

__all__ = ["StdoutForTheWire", "mcp_command", "register"]


class StdoutForTheWire:
    """Keep the process's stdout for the MCP stdio transport (a context manager).

    While entered, fd 1 points at stderr; :meth:`handed_to_transport` points it back at the real
    stdout only around the transport's run. Python's ``sys.stdout`` writes to fd 1, so it
    follows; it is flushed before every switch, so text buffered while diverted never reaches
    the wire. When stdout is not a file descriptor (captured in tests), nothing is diverted.
    """

    def __init__(self) -> None:
        self._wire: int | None = None

    def __enter__(self) -> StdoutForTheWire:
        sys.stdout.flush()
        try:
            self._wire = os.dup(1)
            os.dup2(2, 1)
        except OSError:  # no fd 1 / fd 2 to work with: leave stdout as it is
            self._wire = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._wire is None:
            return
        sys.stdout.flush()  # what was buffered while diverted goes to stderr, not the wire
        os.dup2(self._wire, 1)
        os.close(self._wire)
        self._wire = None

    @contextmanager
    def handed_to_transport(self) -> Iterator[None]:
        """The real stdout on fd 1 for the duration (the transport claims it), diverted again after."""
        if self._wire is None:
            yield
            return
        sys.stdout.flush()
        os.dup2(self._wire, 1)
        try:
            yield
        finally:
            sys.stdout.flush()
            os.dup2(2, 1)


def mcp_command(
    transport: Annotated[
        Literal["stdio", "http"],
        typer.Option("--transport", "-t", help="stdio (the client starts kitune) or http (streamable HTTP)."),
    ] = "stdio",
    host: Annotated[
        str, typer.Option(help="http: interface to bind; non-loopback needs KITUNE_API_TOKEN.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="http: TCP port (endpoint /mcp).")] = 8765,
    no_rewrite: NoRewriteOption = False,
    prompt_version: PromptVersionOption = None,
    prompt_alias: PromptAliasOption = None,
    packaged: PackagedOption = False,
    refresh_s: RefreshOption = 30.0,
    config: ConfigOption = None,
) -> None:
    """Serve kitune's context tools over the Model Context Protocol (stdio or streamable HTTP).

    Serves the production prompt versions and their KI table, like ``kitune serve`` (printed on
    stderr; stdout is the protocol), re-read every --refresh-s seconds; --prompt-version or
    --packaged choose others (then fixed).

    Examples:
    kitune mcp
    kitune mcp --transport http --port 8765
    """
    if transport not in ("stdio", "http"):
        fail(f"--transport {transport!r}: use stdio or http")
    with StdoutForTheWire() if transport == "stdio" else nullcontext() as wire:
        _serve(
            transport,
            host,
            port,
            no_rewrite,
            prompt_specs(prompt_version, prompt_alias),
            packaged,
            refresh_s,
            config,
            wire,
        )


def _serve(
    transport: str,
    host: str,
    port: int,
    no_rewrite: bool,
    prompt_version: list[str] | None,
    packaged: bool,
    refresh_s: float,
    config: Path | None,
    wire: StdoutForTheWire | None,
) -> None:
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
    import litellm  # noqa: F401  # imported now, so its loggers exist before they are configured

    configure_logging()  # after the MCP SDK and LiteLLM set up theirs: each line once on stderr
    cfg = get_config(config)
    serving = start_serving(
        cfg, prompt_version=prompt_version, packaged=packaged, no_rewrite=no_rewrite, refresh_s=refresh_s
    )
    store = serving.served.store
    server = create_mcp_server(
        cfg,
        store=store,
        rewriter=serving.served.rewriter,
        ledger=serving.ledger,
        versions=serving.served.versions,
        setting_source=serving.source,
        refresh_s=refresh_s if serving.source is not None else 30.0,
        request_log=serving.request_log,
    )
    try:
        with wire.handed_to_transport() if wire is not None else nullcontext():
            run_mcp(
                server,
                transport="http" if transport == "http" else "stdio",
                host=host,
                port=port,
                token=token,
            )
    except KeyboardInterrupt:
        pass
    finally:
        if serving.request_log is not None:
            serving.request_log.close()
        store.close()


def register(app: typer.Typer) -> None:
    """Add ``kitune mcp`` to ``app``."""
    app.command("mcp")(mcp_command)
