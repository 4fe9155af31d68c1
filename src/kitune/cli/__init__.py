"""The ``kitune`` command line (Typer). Thin: parse arguments → :mod:`kitune.service` → print.

Each command group lives in its own module in this package and exposes ``register(app)``.
``kitune --help`` lists the commands by the job a user is doing (:data:`PANELS`: build KIs,
serve, measure, tune, operate), in the order the README and docs/guide.md meet them, not in
registration order; a new command must be placed in :data:`PANELS`
(``tests/cli_tests/test_help_panels.py``).
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup
from typer.models import CommandInfo, TyperInfo

__all__ = ["PANELS", "app", "main"]

PANELS: dict[str, tuple[str, ...]] = {
    "Build KIs": ("extract", "bootstrap", "index", "export"),
    "Serve": ("context", "serve", "mcp"),
    "Measure": ("eval", "report", "signals"),
    "Tune": ("demo", "optimize", "traces", "loop", "prompts", "drift", "review"),
    "Operate": ("config", "lm", "status", "stats", "expire", "reindex"),
}
"""Help panel → its commands and command groups, in the order ``--help`` shows them."""

_ORDER = {name: i for i, name in enumerate(n for names in PANELS.values() for n in names)}
_PANEL_OF = {name: panel for panel, names in PANELS.items() for name in names}


class _JobOrderedGroup(TyperGroup):
    """Lists the commands in :data:`PANELS` order (unplaced ones last, by name)."""

    def list_commands(self, ctx: Any) -> list[str]:  # typer's vendored click.Context
        return sorted(super().list_commands(ctx), key=lambda n: (_ORDER.get(n, len(_ORDER)), n))


app = typer.Typer(
    name="kitune",
    cls=_JobOrderedGroup,
    help=(
        "kitune pre-computes Knowledge Indicators (KIs) from a corpus for LLM agents, measures an "
        "agent with them against a search-and-fetch baseline, and tunes its own prompts.\n\n"
        "Typical flow: kitune extract → kitune context → kitune eval → kitune optimize. "
        "`kitune demo` runs the whole loop on the bundled fixture with the embedded local model."
    ),
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)

_REGISTERED = False


def _hide_flag_types() -> None:
    """Show no ``<bool>`` type next to on/off flags (``--json``, ``--no-judge``) in ``--help``.

    Typer's rich help prints the Python type of every option; for a flag that takes no value
    the ``<bool>`` only suggests one must be given.
    """
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich
    if getattr(shown, "_kitune_flags_hidden", False):
        return

    def display_type_rich(self: TyperOption, ctx: typer.Context) -> str | None:
        return None if self.is_flag and self.metavar is None else shown(self, ctx)

    display_type_rich._kitune_flags_hidden = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign,assignment]


def _version(value: bool) -> None:
    if value:
        from kitune import __version__

        typer.echo(f"kitune {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print kitune's version and exit."
    ),
) -> None:
    """kitune: Knowledge Indicators for LLM agents."""


def _register() -> None:
    global _REGISTERED
    if _REGISTERED:
        return
    _hide_flag_types()
    from kitune.cli import (
        bootstrap_cmds,
        config_cmds,
        context_cmds,
        eval_cmds,
        export_cmds,
        extract_cmds,
        lm_cmds,
        loop_cmds,
        mcp_cmds,
        review_cmds,
        signals_cmds,
        status_cmds,
        store_cmds,
        traces_cmds,
        watch_cmds,
    )

    for module in (
        config_cmds,
        lm_cmds,
        bootstrap_cmds,
        store_cmds,
        extract_cmds,
        context_cmds,
        eval_cmds,
        loop_cmds,
        traces_cmds,
        watch_cmds,
        signals_cmds,
        review_cmds,
        export_cmds,
        mcp_cmds,
        status_cmds,
    ):
        module.register(app)
    _place_in_panels()
    _REGISTERED = True


def _place_in_panels() -> None:
    """Put every registered command and group in its :data:`PANELS` help panel."""
    infos: list[CommandInfo | TyperInfo] = [*app.registered_commands, *app.registered_groups]
    for info in infos:
        name = info.name or (info.callback.__name__.replace("_", "-") if info.callback else None)
        if name in _PANEL_OF:
            info.rich_help_panel = _PANEL_OF[name]


def main() -> None:
    """Console-script entry point."""
    import os

    # Offline by default: LiteLLM otherwise tries to download its price list at import time
    # (several warnings and ~7 s on a machine without internet).
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from kitune.cli.common import configure_logging

    configure_logging()  # once, for every command (LiteLLM's lines were printed twice under `mcp`)
    _register()
    app()
