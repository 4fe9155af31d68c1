"""``kitune --help`` groups the commands by job, in README order (issue 38, item 8)."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from kitune.cli import PANELS, _register, app


def _names() -> set[str]:
    _register()
    out = set()
    for info in [*app.registered_commands, *app.registered_groups]:
        out.add(info.name or info.callback.__name__.replace("_", "-"))  # type: ignore[union-attr]
    return out


def test_every_command_sits_in_exactly_one_panel() -> None:
    placed = [n for names in PANELS.values() for n in names]
    assert len(placed) == len(set(placed))  # no command in two panels
    assert set(placed) == _names()  # a new command must be placed; a removed one unlisted


def test_help_shows_the_panels_in_order_with_their_commands() -> None:
    _register()
    text = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    panels = re.findall(r"╭─ (.+?) ─", text)
    assert panels == ["Options", *PANELS]
    shown = re.findall(r"^│ ([a-z][a-z-]*) {2,}", text, flags=re.MULTILINE)
    assert shown == [n for names in PANELS.values() for n in names]
