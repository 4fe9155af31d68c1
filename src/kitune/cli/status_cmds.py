"""``kitune status``: what the serving commands serve now (prompt versions, KI table, KI count).

The same facts ``GET /healthz`` reports for a running server, read from the registry and the
store without creating anything; exit 1 when the served table holds no active KI.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from kitune.cli.common import ConfigOption, fail, fail_with, get_config
from kitune.errors import KituneError

__all__ = ["register", "status_cmd"]


def status_cmd(
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """Show the served prompt versions, the KI table and its active KI count (exit 1 when it is empty).

    Reads the prompt registry's production versions (the packaged prompts when none is
    registered) and counts the active KIs of the table they serve; creates nothing.

    Example: kitune status --json
    """
    from kitune.programs.instructions import prompt_name
    from kitune.service.serving.prompts import production_setting, setting_summary
    from kitune.service.serving.setting import active_kis

    cfg = get_config(config)
    try:
        setting = production_setting(cfg)
        n = active_kis(setting.store_cfg)
    except KituneError as e:
        fail_with(e)
    summary = setting_summary(setting)
    body = {
        "status": "ok" if n else "empty",
        "kis": n,
        "table": summary["store"],
        "prompts": summary["prompts"],
    }
    if as_json:
        typer.echo(json.dumps(body))
    else:
        for program, label in summary["prompts"].items():
            typer.echo(f"{program} prompt: {label}")
        typer.echo(f"KI table: {summary['store']} ({cfg.store.type}), {n} active KIs")
    if not n:
        fix = "run `kitune extract --data DIR` (same --config)"
        # only a registered production version has a previous one to roll back to
        if not summary["prompts"].get("extractor", "").startswith("packaged"):
            fix += f", or `kitune prompts rollback {prompt_name(cfg.corpus_name, 'extractor')}`"
        fail(f"the served KI table {summary['store']} holds no active KI: {fix}", code=1)


def register(app: typer.Typer) -> None:
    """Add ``kitune status`` to ``app``."""
    app.command("status")(status_cmd)
