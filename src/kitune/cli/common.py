"""Shared CLI helpers: the --config option, config loading with clean errors, failure exit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from kitune.config import KituneConfig, load_config
from kitune.errors import KituneError

__all__ = ["ConfigOption", "console", "fail", "get_config"]

console = Console(stderr=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config", "-c", help="YAML/TOML config file (default: $KITUNE_CONFIG, else built-in defaults).",
        show_default=False,
    ),
]


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``message`` in red on stderr and exit with ``code``."""
    # soft_wrap: a path or a command in the message is never broken at the 80th column.
    # escape: a message quoting "[...]" (a JSON list, a choice) is shown as written, not as markup.
    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def get_config(path: Path | None, overrides: dict[str, object] | None = None) -> KituneConfig:
    """Load the config or exit 2 with the ConfigError message (no traceback)."""
    try:
        return load_config(path, overrides)
    except KituneError as e:
        fail(str(e))
