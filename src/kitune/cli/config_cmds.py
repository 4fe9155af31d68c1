"""``kitune config show``: print the effective configuration with secrets masked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from kitune.cli.common import ConfigOption, fail, get_config

config_app = typer.Typer(help="Inspect the effective configuration.", no_args_is_help=True)


@config_app.command("show")
def show(
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of YAML.")] = False,
) -> None:
    """Print the effective configuration (file + KITUNE_* env), with API keys masked.

    Every `*_env` setting is followed by a `*_value` line showing what that environment
    variable holds (base URLs in full, keys as the last 4 characters, or <unset>).
    """
    import yaml

    from kitune.config import ROLES, mask_secrets

    cfg = get_config(config)
    data = mask_secrets(cfg)
    data["resolved_models"] = {role: cfg.lm.model_label(role) for role in ROLES}
    if as_json:
        typer.echo(json.dumps(data, indent=2, default=str))
    else:
        typer.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def register(app: typer.Typer) -> None:
    """Add ``kitune config`` to ``app``."""
    app.add_typer(config_app, name="config")


_ = (Path, fail)
