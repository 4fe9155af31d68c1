"""``kitune prompts list|show|diff|promote|rollback``: the prompt registry from the shell.

Thin: parse arguments → :mod:`kitune.service.prompts` → print Rich tables. ``optimize``,
``drift`` and ``demo`` are added here by the optimisation loop.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kitune.cli.common import ConfigOption, fail, get_config
from kitune.errors import KituneError

__all__ = ["prompts_app", "register"]

prompts_app = typer.Typer(
    help="Versioned prompts in the MLflow prompt registry (aliases: candidate, production).",
    no_args_is_help=True,
)

out = Console()


def _when(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M")


@prompts_app.command("list")
def list_cmd(config: ConfigOption = None) -> None:
    """List registered prompts with their latest version and aliases."""
    from kitune.service.prompts import list_prompts

    cfg = get_config(config)
    try:
        rows = list_prompts(cfg)
    except KituneError as e:
        fail(str(e))
    if not rows:
        out.print(f"No prompts registered yet in {cfg.mlflow_uri} (run `kitune optimize` first).")
        return
    table = Table(title=f"Prompts in {cfg.mlflow_uri}")
    table.add_column("name")
    table.add_column("latest", justify="right")
    table.add_column("production", justify="right")
    table.add_column("candidate", justify="right")
    for row in rows:
        table.add_row(
            row.name,
            str(row.latest_version),
            str(row.aliases.get("production", "-")),
            str(row.aliases.get("candidate", "-")),
        )
    out.print(table)


@prompts_app.command("show")
def show_cmd(
    name: Annotated[str, typer.Argument(help="Prompt name, e.g. kitune-fixture-extractor.")],
    version: Annotated[str | None, typer.Option("--version", "-v", help="Version number.")] = None,
    alias: Annotated[
        str | None, typer.Option("--alias", "-a", help="Alias: production or candidate.")
    ] = None,
    history: Annotated[
        bool, typer.Option("--versions", help="List every version instead of one text.")
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Print one version's text (default: production, else latest), or --versions for all."""
    from kitune.service.prompts import prompt_versions, show_prompt

    cfg = get_config(config)
    try:
        if history:
            table = Table(title=name)
            for col in ("version", "aliases", "created (UTC)", "commit message", "chars"):
                table.add_column(col)
            for v in prompt_versions(cfg, name):
                table.add_row(
                    str(v.version),
                    ", ".join(v.aliases) or "-",
                    _when(v.created_ms),
                    v.commit_message or "-",
                    str(len(v.text)),
                )
            out.print(table)
            return
        pv = show_prompt(cfg, name, version=version, alias=alias)
    except (KituneError, ValueError) as e:
        fail(str(e))
    aliases = escape(f" [{', '.join(pv.aliases)}]") if pv.aliases else ""
    out.print(f"[bold]{escape(pv.name)}[/] version {pv.version}{aliases}", highlight=False)
    if pv.commit_message:
        out.print(f"commit: {pv.commit_message}", highlight=False, markup=False)
    user_tags = {k: v for k, v in pv.tags.items() if not k.startswith("kitune.")}
    if user_tags:
        out.print("tags: " + ", ".join(f"{k}={v}" for k, v in sorted(user_tags.items())), markup=False)
    out.rule()
    out.print(pv.text, markup=False, highlight=False)


@prompts_app.command("diff")
def diff_cmd(
    name: Annotated[str, typer.Argument(help="Prompt name.")],
    v1: Annotated[str, typer.Argument(help="From version (or alias).")],
    v2: Annotated[str, typer.Argument(help="To version (or alias).")],
    config: ConfigOption = None,
) -> None:
    """Unified diff between two versions of a prompt."""
    from kitune.service.prompts import diff_prompt_versions

    cfg = get_config(config)
    try:
        text = diff_prompt_versions(cfg, name, v1, v2)
    except KituneError as e:
        fail(str(e))
    if not text:
        out.print(f"{name}: versions {v1} and {v2} are identical.", highlight=False)
        return
    for line in text.splitlines():
        style = "green" if line.startswith("+") else "red" if line.startswith("-") else None
        out.print(line, style=style, markup=False, highlight=False)


@prompts_app.command("promote")
def promote_cmd(
    name: Annotated[str, typer.Argument(help="Prompt name.")],
    version: Annotated[str, typer.Argument(help="Version to put in production.")],
    config: ConfigOption = None,
) -> None:
    """Point the production alias at VERSION (recorded so rollback can undo it)."""
    from kitune.service.prompts import promote_prompt

    cfg = get_config(config)
    try:
        pv = promote_prompt(cfg, name, version)
    except KituneError as e:
        fail(str(e))
    out.print(f"{pv.name}: production → version {pv.version}", highlight=False)


@prompts_app.command("rollback")
def rollback_cmd(
    name: Annotated[str, typer.Argument(help="Prompt name.")],
    config: ConfigOption = None,
) -> None:
    """Move production back to the previous production version."""
    from kitune.service.prompts import rollback_prompt

    cfg = get_config(config)
    try:
        pv = rollback_prompt(cfg, name)
    except KituneError as e:
        fail(str(e))
    out.print(f"{pv.name}: production rolled back to version {pv.version}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``kitune prompts`` to ``app``."""
    app.add_typer(prompts_app, name="prompts")
