"""CLI conventions from issue 16's paper cuts: --version, no <bool> on flags, one meaning of -n,
no bare exception class names, exit 2 for bad input."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from kitune import __version__
from kitune.cli import _register, app


@pytest.fixture(scope="module")
def root() -> Any:
    _register()
    cmd = typer.main.get_command(app)  # typer ships its own click: duck-typed below
    assert len(cmd.commands) > 10
    return cmd


def _commands(group: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for name, cmd in group.commands.items():
        full = f"{prefix}{name}"
        if hasattr(cmd, "commands"):
            out.extend(_commands(cmd, f"{full} "))
        else:
            out.append((full, cmd))
    return out


def test_version() -> None:
    _register()
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"kitune {__version__}"


def test_no_flag_shows_a_bool_type_in_help() -> None:
    _register()
    commands = (
        ["eval", "--help"],
        ["context", "--help"],
        ["extract", "--help"],
        ["config", "show", "--help"],
    )
    for args in commands:
        r = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
        assert r.exit_code == 0, r.output
        assert "<bool>" not in r.output, args
    r = CliRunner().invoke(app, ["eval", "--help"], env={"COLUMNS": "200"})
    # typed options keep their type
    assert "--no-judge" in r.output and "SKILL" in r.output and "<int range>" in r.output


def test_short_n_only_ever_means_number_of_questions(root: Any) -> None:
    users = {}
    for name, cmd in _commands(root):
        for p in cmd.params:
            if "-n" in getattr(p, "opts", []):
                users[name] = [o for o in p.opts if o.startswith("--")]
    assert users and all(longs == ["--questions"] for longs in users.values()), users


def test_failures_never_print_a_bare_exception_class_name() -> None:
    from kitune.cli.common import exit_code_for, fail_with
    from kitune.errors import ConfigError, DataError, LMAuthError, LMTimeoutError, StoreUnavailableError

    cases = [
        (DataError("q.jsonl:3: question 'b' has no question text"), 2, "error: q.jsonl:3"),
        (ConfigError("lm.judge.max_tokens: must be ≥ 1"), 2, "error: lm.judge"),
        (LMAuthError("HTTP 401 from http://gw/v1: the key in $K was rejected"), 2, "error: HTTP 401"),
        (
            LMTimeoutError("m at http://gw/v1 did not answer within 30 s", timeout_s=30.0),
            1,
            "error: LLM call failed: m at",
        ),
        (StoreUnavailableError("cannot reach http://es:9200"), 1, "error: KI store: cannot reach"),
    ]
    for error, code, start in cases:
        assert exit_code_for(error) == code

        t = typer.Typer()

        @t.command()
        def boom(e: Exception = error) -> None:
            fail_with(e)

        r = CliRunner().invoke(t, [])
        assert r.exit_code == code, r.output
        assert r.output.startswith(start), r.output
        assert type(error).__name__ not in r.output


def test_kitune_config_naming_a_missing_file_names_that_variable(tmp_path, monkeypatch) -> None:
    _register()
    monkeypatch.setenv("KITUNE_CONFIG", str(tmp_path / "nope.yaml"))
    r = CliRunner().invoke(app, ["config", "show"])
    assert r.exit_code == 2
    assert f"KITUNE_CONFIG={tmp_path / 'nope.yaml'} names no config file" in r.output
    monkeypatch.delenv("KITUNE_CONFIG")
    r = CliRunner().invoke(app, ["config", "show", "--config", str(tmp_path / "nope.yaml")])
    assert r.exit_code == 2 and "KITUNE_CONFIG" not in r.output and "does not exist" in r.output


def test_prompts_list_on_a_fresh_workdir_creates_no_files(tmp_path, monkeypatch) -> None:
    _register()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    work = tmp_path / "w"
    monkeypatch.setenv("KITUNE_WORKDIR", str(work))
    r = CliRunner().invoke(app, ["prompts", "list"], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert "No prompts registered yet" in r.output
    assert not work.exists()


def test_prompts_show_and_diff_on_a_fresh_workdir_exit_2_and_create_no_files(tmp_path, monkeypatch) -> None:
    _register()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    work = tmp_path / "w"
    monkeypatch.setenv("KITUNE_WORKDIR", str(work))
    name = "kitune-x-extractor"
    for args in (["prompts", "show", name], ["prompts", "diff", name, "1", "2"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2, r.output
        assert "no prompt named 'kitune-x-extractor': nothing is registered yet" in r.output
    assert not work.exists()


def test_every_command_that_takes_a_prompt_takes_the_same_selectors(root: Any) -> None:
    """Issue 37: --prompt-version, --prompt-alias and --packaged on every command taking a prompt."""
    selectors = {"--prompt-version", "--prompt-alias", "--packaged"}
    takers = {
        name: {o for p in cmd.params for o in getattr(p, "opts", []) if o in selectors}
        for name, cmd in _commands(root)
    }
    takers = {name: opts for name, opts in takers.items() if opts}
    assert {"extract", "eval", "context", "serve", "mcp"} <= set(takers)
    assert all(opts == selectors for opts in takers.values()), takers
    helps = {
        name: next(p.help for p in cmd.params if "--prompt-alias" in getattr(p, "opts", []))
        for name, cmd in _commands(root)
        if name in takers
    }
    assert len(set(helps.values())) == 1, helps  # the same words: the same meaning


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--prompt-alias", "3"], "--prompt-alias '3': takes an alias for every program"),
        (["--prompt-alias", "3"], "use --prompt-version PROGRAM=VERSION, e.g. --prompt-version extractor=3"),
        (["--prompt-version", "3"], "--prompt-version '3': a bare value must be an alias"),
        (
            ["--prompt-version", "rewriter=2"],
            "kitune extract runs the extractor only: use --prompt-version extractor",
        ),
        (["--packaged", "--prompt-alias", "candidate"], "give one of them"),
    ],
)
def test_a_bad_prompt_choice_names_the_option_and_the_fix(
    tmp_path: Any, monkeypatch: Any, args: list[str], expected: str
) -> None:
    _register()
    monkeypatch.setenv("KITUNE_WORKDIR", str(tmp_path / "w"))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"docid": "d1", "title": "t", "text": "curl is released under the MIT license."}\n')
    r = CliRunner().invoke(app, ["extract", "--data", str(corpus), *args])
    assert r.exit_code == 2, r.output
    assert expected in " ".join(r.output.split())
    if "--prompt-alias" in args and "--packaged" not in args:  # the same words from eval and context
        for cmd in (["eval", "--skill", "in-context", "--data", str(corpus)], ["context", "a question"]):
            r = CliRunner().invoke(app, [*cmd, *args])
            assert r.exit_code == 2 and expected in " ".join(r.output.split()), r.output


def test_prompts_list_hints_use_the_commands_own_forms(tmp_path: Any, monkeypatch: Any) -> None:
    from kitune.tracking.prompts import PromptRegistry

    _register()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("KITUNE_WORKDIR", str(tmp_path / "w"))
    (tmp_path / "w").mkdir()
    reg = PromptRegistry(f"sqlite:///{tmp_path / 'w' / 'mlflow.db'}")
    reg.register("kitune-x-extractor", "Extract every fact.")
    v2 = reg.register("kitune-x-extractor", "Extract every fact, with its date.")
    reg.set_alias("kitune-x-extractor", "candidate", v2.version)
    r = CliRunner().invoke(app, ["prompts", "list"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    hints = [
        line.split("#")[0].split() for line in r.output.splitlines() if line.startswith("kitune prompts")
    ]
    assert [h[2] for h in hints] == ["show", "diff", "promote", "rollback"]
    for hint in hints:  # every hint runs as printed (show and diff here; promote/rollback parse the same)
        if hint[2] in ("show", "diff"):
            shown = CliRunner().invoke(app, hint[1:])
            assert shown.exit_code == 0, (hint, shown.output)
    shown = CliRunner().invoke(app, ["prompts", "show", "kitune-x-extractor", "candidate"])
    assert "version 2 [candidate]" in shown.output and "with its date" in shown.output
