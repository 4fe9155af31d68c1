"""Tests for kitune.service.serving.prompts and the `kitune prompts` CLI group (one SQLite DB per module)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kitune.cli import _register, app
from kitune.config import load_config
from kitune.errors import PromptNotFoundError
from kitune.service.serving.prompts import list_prompts, show_prompt
from kitune.tracking.prompts import PromptRegistry

NAME = "kitune-fixture-judge"


@pytest.fixture(scope="module")
def db_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = f"sqlite:///{tmp_path_factory.mktemp('cli') / 'mlflow.db'}"
    reg = PromptRegistry(uri)
    reg.register(NAME, "Judge the answer.\nSay yes or no.\n", commit_message="seed", tags={"author": "test"})
    reg.register(NAME, "Judge the answer.\nSay yes or no, then a confidence.\n", commit_message="round 1")
    return uri


@pytest.fixture
def cli(db_uri: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> CliRunner:
    monkeypatch.setenv("KITUNE_TRACKING__TRACKING_URI", db_uri)
    monkeypatch.setenv("KITUNE_WORKDIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    _register()
    return CliRunner()


def test_service_functions(db_uri: str) -> None:
    cfg = load_config(None, {"tracking.tracking_uri": db_uri})
    rows = list_prompts(cfg)
    assert [(r.name, r.latest_version) for r in rows] == [(NAME, 2)]
    assert show_prompt(cfg, NAME, version=1).commit_message == "seed"
    with pytest.raises(ValueError, match="not both"):
        show_prompt(cfg, NAME, version=1, alias="production")
    with pytest.raises(PromptNotFoundError):
        show_prompt(cfg, "kitune-missing")


def test_cli_list_show_diff(cli: CliRunner) -> None:
    res = cli.invoke(app, ["prompts", "list"])
    assert res.exit_code == 0, res.output
    assert re.search(rf"{NAME}\s*│\s*2\s*│\s*-\s*│\s*-\s*│", res.output), res.output
    res = cli.invoke(app, ["prompts", "show", NAME, "--version", "1"])
    assert res.exit_code == 0, res.output
    assert "version 1" in res.output and "Say yes or no.\n" in res.output and "author=test" in res.output
    res = cli.invoke(app, ["prompts", "show", NAME, "--versions"])
    assert res.exit_code == 0 and "round 1" in res.output
    res = cli.invoke(app, ["prompts", "diff", NAME, "1", "2"])
    assert res.exit_code == 0, res.output
    assert "-Say yes or no." in res.output and "+Say yes or no, then a confidence." in res.output


def test_cli_promote_rollback_and_errors(cli: CliRunner) -> None:
    res = cli.invoke(app, ["prompts", "rollback", NAME])
    assert res.exit_code == 2 and "no alias 'production'" in res.output
    assert cli.invoke(app, ["prompts", "promote", NAME, "1"]).exit_code == 0
    res = cli.invoke(app, ["prompts", "promote", NAME, "2"])
    assert res.exit_code == 0 and "production → version 2" in res.output
    res = cli.invoke(app, ["prompts", "show", NAME, "--alias", "production"])
    assert "version 2 [production]" in res.output
    res = cli.invoke(app, ["prompts", "rollback", NAME])
    assert res.exit_code == 0 and "rolled back to version 1" in res.output
    res = cli.invoke(app, ["prompts", "show", "kitune-nope"])
    assert res.exit_code == 2 and "no prompt named 'kitune-nope'" in res.output
    res = cli.invoke(app, ["prompts", "promote", NAME, "7"])
    assert res.exit_code == 2 and "has no version 7" in res.output


def test_every_prompts_command_on_an_empty_workdir_creates_no_registry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # promote/rollback used to create <workdir>/mlflow.db (seconds of MLflow schema set-up) just
    # to report that the prompt does not exist.
    monkeypatch.delenv("KITUNE_TRACKING__TRACKING_URI", raising=False)
    monkeypatch.setenv("KITUNE_WORKDIR", str(tmp_path))
    _register()
    cli = CliRunner()
    for args in (
        ["list"],
        ["show", NAME],
        ["diff", NAME, "1", "2"],
        ["promote", NAME, "1"],
        ["rollback", NAME],
    ):
        res = cli.invoke(app, ["prompts", *args])
        assert res.exit_code == (0 if args == ["list"] else 2), (args, res.output)
    assert not (tmp_path / "mlflow.db").exists()
