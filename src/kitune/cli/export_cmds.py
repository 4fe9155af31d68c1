"""``kitune export --format elastic-ai-index`` and ``kitune index create --mapping …`` (thin)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from kitune.cli.common import ConfigOption, fail, fail_with, get_config
from kitune.errors import KituneError

__all__ = ["export_cmd", "index_create", "register"]

_out = Console(stderr=True)

FORMATS = ("elastic-ai-index",)
MAPPINGS = ("kitune", "ai-index")


def export_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output file (JSONL documents, or a _bulk body).")],
    fmt: Annotated[
        str, typer.Option("--format", help="elastic-ai-index: Elastic's ai-index@mappings shape.")
    ] = ("elastic-ai-index"),
    status: Annotated[
        str, typer.Option("--status", help="Comma-separated lifecycle statuses to export.")
    ] = "active,stale,expired",
    bulk_index: Annotated[
        str | None, typer.Option("--bulk-index", help="Write an Elasticsearch _bulk body for this index.")
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Export the production KI table's KIs as documents of Elastic's published AI-index shape.

    Each KI becomes one ai-index@mappings document: title, description, content (the evidence
    spans), tags, references.uri, @timestamp (last seen), attributes (kitune's payload) and
    governance.lifecycle.status. A KI over an AI-index limit (title 512, description 2,048
    characters, 100 tags) is skipped and listed; the exit code is then 1.

    Example: kitune export --format elastic-ai-index --out kis.ndjson --bulk-index ai-index-idx-kis
    """
    from kitune.service.serving.export import export_ai_index
    from kitune.service.serving.setting import open_serving_store

    if fmt not in FORMATS:
        fail(f"--format {fmt!r}: use {', '.join(FORMATS)}")
    statuses = tuple(s.strip() for s in status.split(",") if s.strip())
    if not statuses or any(s not in ("active", "stale", "expired") for s in statuses):
        fail(f"--status {status!r}: use a comma-separated subset of active, stale, expired")
    cfg = get_config(config)
    try:
        store = open_serving_store(cfg, read_only=True)
        if store is None:
            fail("no KIs yet: the production KI table does not exist (fill it with `kitune extract`)")
        try:
            report = export_ai_index(store, out, statuses=statuses, bulk_index=bulk_index)
        finally:
            store.close()
    except (KituneError, ValueError) as e:
        fail_with(e)
    typer.echo(f"{report.path}: {report.written} KI document(s) written, {len(report.failed)} over a limit")
    for _ki_id, why in report.failed[:20]:
        _out.print(f"[yellow]skipped:[/] {escape(why)}")
    if not report.ok:
        raise typer.Exit(1)


def index_create(
    mapping: Annotated[
        str | None,
        typer.Option(
            "--mapping",
            help="ai-index: Elastic's published ai-index@mappings shape; kitune: kitune's own layout.",
            show_default=False,
        ),
    ] = None,
    index: Annotated[
        str | None,
        typer.Option("--index", help="Index name (default: store.index of the config).", show_default=False),
    ] = None,
    print_only: Annotated[
        bool,
        typer.Option("--print", help="Print the mapping as JSON and create nothing (no cluster needed)."),
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Create the configured Elasticsearch index with the chosen mapping.

    --mapping ai-index gives Elastic's published ai-index@mappings shape (what `kitune export
    --format elastic-ai-index` writes); --mapping kitune gives kitune's own layout. The config's
    store must be Elasticsearch (store.type: elasticsearch); --print needs no cluster.

    Example: kitune index create --mapping ai-index --index ai-index-idx-kis
    """
    from kitune.retrieval.ai_index import ai_index_mapping
    from kitune.retrieval.es_query import es_mapping

    if mapping is None:
        fail(
            "kitune index create needs --mapping: ai-index or kitune (kitune index create --mapping ai-index)"
        )
    if mapping not in MAPPINGS:
        fail(f"--mapping {mapping!r}: use kitune or ai-index (kitune index create --mapping ai-index)")
    cfg = get_config(config)
    if print_only:
        inference_id = getattr(cfg.store, "inference_id", None)
        body = ai_index_mapping(inference_id) if mapping == "ai-index" else es_mapping(inference_id or "")
        typer.echo(json.dumps({"mappings": body}, indent=2, sort_keys=True))
        return
    from kitune.service.serving.export import create_index

    try:
        done = create_index(cfg, mapping="ai-index" if mapping == "ai-index" else "kitune", index=index)
    except KituneError as e:
        fail_with(e)
    typer.echo(
        f"index {done['index']} ready with the {done['mapping']} mapping; serve it with "
        f"store: {{type: elasticsearch, index: {done['index']}, mapping: {done['mapping']}}}"
    )


def register(app: typer.Typer) -> None:
    """Add ``kitune export`` to ``app`` (``kitune index create`` is registered by store_cmds)."""
    app.command("export")(export_cmd)
