"""``kitune context`` (one question → KIs + facets) and ``kitune serve`` (the HTTP API).

Both call :func:`kitune.service.serving.context.get_context` with what
:func:`kitune.service.serving.prompts.production_setting` resolves: the rewriter prompt under the
``production`` alias (``--prompt-version`` picks another, ``--packaged`` the packaged one) and
the KI table built with the production extractor. The versions used are printed on stderr.
The store and the rewriter with its LM (``kitune.lm.build_lm(cfg, "rewrite")``; ``--no-rewrite``
skips the LM and uses plain plans) are built by :func:`kitune.service.serving.setting.build_served`,
as for ``kitune mcp`` (:func:`start_serving`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kitune.cli.common import ConfigOption, console, fail, get_config, preload_litellm
from kitune.errors import KituneError

if TYPE_CHECKING:
    from kitune.config import KituneConfig
    from kitune.programs.query_rewriter import QueryRewriter
    from kitune.retrieval.base import Store
    from kitune.service.serving.context import ContextResponse
    from kitune.service.serving.prompts import ProductionSetting
    from kitune.service.serving.setting import ServedRequestLog, ServedSetting
    from kitune.usage import TokenLedger

__all__ = [
    "NoRewriteOption",
    "PackagedOption",
    "PromptAliasOption",
    "PromptVersionOption",
    "RefreshOption",
    "Serving",
    "print_context",
    "prompt_specs",
    "register",
    "resolve_setting",
    "start_serving",
]

NoRewriteOption = Annotated[
    bool, typer.Option("--no-rewrite", help="Skip the LLM rewrite; search with the question as typed.")
]
PromptVersionOption = Annotated[
    list[str] | None,
    typer.Option(
        "--prompt-version",
        metavar="PROGRAM=VERSION",
        help="Use this registered version instead of production: PROGRAM=VERSION (extractor=3, "
        "rewriter=candidate) or an alias for every program (candidate). Repeatable.",
        show_default=False,
    ),
]
RefreshOption = Annotated[
    float,
    typer.Option(
        "--refresh-s",
        min=0,
        help="Re-read the production prompt versions at most this often (seconds); a promote or "
        "rollback is served from then on. 0: resolve once at start.",
    ),
]
PromptAliasOption = Annotated[
    str | None,
    typer.Option(
        "--prompt-alias",
        metavar="ALIAS",
        help="Use every program's prompt at this alias instead of production (candidate, latest, "
        "production); --prompt-version PROGRAM=VERSION overrides it for one program.",
        show_default=False,
    ),
]


def prompt_specs(prompt_version: list[str] | None, prompt_alias: str | None) -> list[str]:
    """``--prompt-alias`` then ``--prompt-version`` as one selection list (a later spec wins).

    Exits 2 naming ``--prompt-alias`` and the fix when the alias is empty, a version number or a
    ``PROGRAM=VERSION`` pair (those are ``--prompt-version`` values).
    """
    if prompt_alias is not None:
        alias = prompt_alias.strip()
        if not alias or "=" in alias or alias.lstrip("vV").isdigit():
            example = alias if "=" in alias else f"extractor={alias.lstrip('vV') or 3}"
            fail(
                f"--prompt-alias {prompt_alias!r}: takes an alias for every program (production, candidate, "
                f"latest); for one program's version use --prompt-version PROGRAM=VERSION, e.g. "
                f"--prompt-version {example}"
            )
    return [*([prompt_alias.strip()] if prompt_alias else []), *(prompt_version or [])]


PackagedOption = Annotated[
    bool,
    typer.Option(
        "--packaged",
        help="Use the packaged prompts (and their KI table), not the registry's production ones.",
    ),
]


def resolve_setting(
    cfg: KituneConfig, prompt_version: list[str] | None, packaged: bool, *, programs: tuple[str, ...]
) -> ProductionSetting:
    """Resolve the prompt versions a CLI command runs, print them on stderr; exit 2 on a bad choice.

    Wraps :func:`kitune.service.serving.prompts.production_setting` (``--prompt-version``, ``--packaged``).
    """
    from kitune.service.serving.prompts import describe_setting, parse_prompt_selection, production_setting

    try:
        setting = production_setting(
            cfg, select=parse_prompt_selection(prompt_version or []), packaged=packaged
        )
    except KituneError as e:
        fail(str(e))
    for line in describe_setting(setting, programs):
        console.print(line, highlight=False, markup=False)
    return setting


def _build(
    cfg: KituneConfig,
    setting: ProductionSetting,
    *,
    programs: tuple[str, ...],
    use_rewriter: bool,
    on_empty: Callable[[str], None] | None = None,
) -> tuple[ServedSetting, TokenLedger]:
    """The setting's store and (unless disabled) its rewriter with its LM; exits 2 on KituneError.

    :func:`kitune.service.serving.setting.build_served`; ``on_empty`` is called with a message
    when the store holds no KI, before any LM is built.
    """
    from kitune.service.serving.setting import build_served
    from kitune.usage import TokenLedger

    ledger = TokenLedger()
    try:
        served = build_served(
            cfg, setting, programs=programs, use_rewriter=use_rewriter, ledger=ledger, on_empty=on_empty
        )
        if served.rewriter is not None:
            preload_litellm()  # the import must not count as the first rewrite's latency
    except KituneError as e:
        fail(f"{e}" + ("" if not use_rewriter else " (or pass --no-rewrite to search without the LLM)"))
    return served, ledger


def _warn_empty(message: str) -> None:
    console.print(f"[yellow]warning:[/] {escape(message)}; every answer is empty until then", soft_wrap=True)


def _check_rewriter(rewriter: QueryRewriter, store: Store) -> None:
    """One tiny call to the rewrite LM at start: exit 2 when it refuses the key, warn on other failures.

    Without it a wrong key answers every request with the plain query (HTTP 200) and the log
    shows nothing; the call also pays the model's start-up before the first request does.
    """
    import time

    from kitune.errors import LMAuthError, LMError

    lm = rewriter.get_lm()
    t0 = time.perf_counter()
    try:
        lm.forward(messages=[{"role": "user", "content": "Reply with OK."}], max_tokens=4, cache=False)
    except LMAuthError as e:
        store.close()
        fail(
            f"the rewrite LM refused the key at start-up: {e} (or pass --no-rewrite to serve without the LLM)"
        )
    except LMError as e:
        console.print(
            f"[yellow]warning:[/] the rewrite LM did not answer at start-up ({escape(str(e)[:300])}); "
            "requests fall back to the plain plan until it does",
            soft_wrap=True,
        )
        return
    ms = (time.perf_counter() - t0) * 1000
    console.print(f"rewrite LM ready ({ms:.0f} ms for a warm-up call)", highlight=False, markup=False)


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
    why = f": {resp.rewrite_reason}" if resp.rewrite_reason else ""
    note = f" (rewrite fell back to the plain plan{why})" if resp.rewrite_fell_back else ""
    console.print(
        f"rewrite tokens: {resp.rewrite_tokens.input} in / {resp.rewrite_tokens.output} out{note}; "
        f"{resp.took_ms:.0f} ms"
    )


def context(
    question: Annotated[str, typer.Argument(help="The question to retrieve KIs for.")],
    size: Annotated[int, typer.Option("--size", min=1, help="KIs to return (capped by max_size).")] = (10),
    no_execute: Annotated[
        bool, typer.Option("--no-execute", help="Print the compiled query without running it.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the response as JSON.")] = False,
    no_rewrite: NoRewriteOption = False,
    prompt_version: PromptVersionOption = None,
    prompt_alias: PromptAliasOption = None,
    packaged: PackagedOption = False,
    config: ConfigOption = None,
) -> None:
    """Retrieve KIs, facets and the compiled query for one question (same as the HTTP API).

    Uses the production rewriter prompt and the KI table of the production extractor (printed
    on stderr); --prompt-version or --packaged choose others.

    Examples:
    kitune context "Who founded the company that built X?"
    kitune context "Who founded the company that built X?" --size 5 --json
    """
    from kitune.optimizers.program_task import read_programs
    from kitune.service.serving.context import get_context

    cfg = get_config(config)
    if not question.strip():
        fail("the question is blank: pass the question text")
    shown = read_programs(rewrite=not no_rewrite)
    setting = resolve_setting(cfg, prompt_specs(prompt_version, prompt_alias), packaged, programs=shown)
    served, ledger = _build(cfg, setting, programs=shown, use_rewriter=not no_rewrite, on_empty=fail)
    store = served.store
    try:
        resp = get_context(
            question,
            store=store,
            rewriter=served.rewriter,
            size=size,
            execute=not no_execute,
            cfg=cfg,
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
    prompt_version: PromptVersionOption = None,
    prompt_alias: PromptAliasOption = None,
    packaged: PackagedOption = False,
    refresh_s: RefreshOption = 30.0,
    config: ConfigOption = None,
) -> None:
    """Serve POST /api/_get_context (OpenAPI at /docs and /openapi.json, liveness at /healthz).

    Serves the production rewriter prompt and the production extractor's KI table (printed at
    start, and in GET /healthz); a kitune promote/rollback takes effect from the next request
    (other registry changes within --refresh-s seconds). Every request is recorded in the
    tracking store (MLflow, run "serve") with the prompt versions that answered it.

    Examples:
    kitune serve
    kitune serve --port 8080 --config kitune.yaml
    """
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
    serving = start_serving(
        cfg,
        prompt_version=prompt_specs(prompt_version, prompt_alias),
        packaged=packaged,
        no_rewrite=no_rewrite,
        refresh_s=refresh_s,
    )
    store, rewriter = serving.served.store, serving.served.rewriter
    if rewriter is not None:
        _check_rewriter(rewriter, store)
    app = create_app(
        cfg,
        store=store,
        rewriter=rewriter,
        ledger=serving.ledger,
        versions=serving.served.versions,
        setting_source=serving.source,
        refresh_s=refresh_s,
        request_log=serving.request_log,
    )
    try:
        uvicorn.run(app, host=host, port=port, log_level="info")
    finally:
        if serving.request_log is not None:
            serving.request_log.close()
        store.close()


@dataclass(frozen=True)
class Serving:
    """What ``kitune serve`` and ``kitune mcp`` start with (:func:`start_serving`)."""

    served: ServedSetting
    """The store, the rewriter (None with ``--no-rewrite``) and the version labels."""
    ledger: TokenLedger
    """The token ledger the rewrite LM records into."""
    source: Callable[[Mapping[str, str]], ServedSetting | None] | None
    """:func:`kitune.service.serving.setting.follow_production` when production is followed (no
    ``--prompt-version``, no ``--packaged``, ``--refresh-s`` > 0), else None (fixed)."""
    request_log: ServedRequestLog | None = None
    """Every served request recorded in the tracking store (``cfg.mlflow_uri``) with its prompt
    versions; close it when the server stops."""


def start_serving(
    cfg: KituneConfig,
    *,
    prompt_version: list[str] | None,
    packaged: bool,
    no_rewrite: bool,
    refresh_s: float,
) -> Serving:
    """Resolve and build what a server serves (versions printed on stderr); exits 2 on a bad choice.

    An empty KI table is a warning, not a refusal: a server may be started before the first
    extraction.
    """
    from kitune.optimizers.program_task import read_programs
    from kitune.service.serving.setting import ServedRequestLog, follow_production
    from kitune.tracking.tracker_base import BaseTracker
    from kitune.tracking.trackers import create_tracker

    shown = read_programs(rewrite=not no_rewrite)
    setting = resolve_setting(cfg, prompt_version, packaged, programs=shown)
    served, ledger = _build(cfg, setting, programs=shown, use_rewriter=not no_rewrite, on_empty=_warn_empty)
    follow = not packaged and not prompt_version and refresh_s > 0
    source = follow_production(cfg, shown, use_rewriter=not no_rewrite, ledger=ledger) if follow else None
    tracker = create_tracker(cfg)
    request_log = ServedRequestLog(tracker) if isinstance(tracker, BaseTracker) else None
    return Serving(served=served, ledger=ledger, source=source, request_log=request_log)


def register(app: typer.Typer) -> None:
    """Add ``kitune context`` and ``kitune serve`` to ``app``."""
    app.command("context")(context)
    app.command("serve")(serve)
