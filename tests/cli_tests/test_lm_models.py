"""``kitune lm models``: model names are never cut at 80 columns."""

from __future__ import annotations

import pytest
from rich.console import Console
from typer.testing import CliRunner

from kitune.cli import _register, app, lm_cmds
from kitune.localmodel import PACKAGED_MODELS


def test_model_names_shown_whole_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    _register()
    # Rich fixes a console's width when it is built: the module's console may have been built
    # while another test set COLUMNS, so this test gives it an 80-column one of its own
    monkeypatch.setattr(lm_cmds, "out", Console(width=80))
    r = CliRunner().invoke(app, ["lm", "models"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    for name in PACKAGED_MODELS:
        assert any(f"│ {name} " in line for line in lines), name
    assert "…" not in r.output
