"""What a newcomer following the README on a clean clone tripped over (newcomer check, issue 25)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kitune.cli import _register, app


def _invoke(args: list[str]) -> tuple[int, str]:
    _register()
    r = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    return r.exit_code, " ".join(r.output.split())


# -- numbers that make no sense are refused at start (exit 2), not after the work ----------------
@pytest.mark.parametrize(
    ("args", "option", "value"),
    [
        (["demo", "--budget-minutes", "-5"], "--budget-minutes", "must be greater than 0, got -5"),
        (["demo", "--budget-minutes", "0"], "--budget-minutes", "must be greater than 0, got 0"),
        (
            ["optimize", "--data", "nowhere", "--budget-minutes", "-0.5"],
            "--budget-minutes",
            "must be greater than 0, got -0.5",
        ),
        (["loop", "--budget-minutes", "-5"], "--budget-minutes", "must be greater than 0, got -5"),
        (["lm", "bench", "--min-chars", "0"], "--min-chars", "Input should be greater than or equal to 1"),
        (["lm", "bench", "--n-threads", "-2"], "--n-threads", "Input should be greater than or equal to 1"),
        (["lm", "bench", "--max-tokens", "0"], "--max-tokens", "Input should be greater than or equal to 1"),
        (
            ["bootstrap", "--corpus", "nowhere", "--seed", "-1"],
            "--seed",
            "Input should be greater than or equal to 0",
        ),
        (
            ["optimize", "--data", "nowhere", "--questions", "4", "--sample-seed", "-3"],
            "--sample-seed",
            "Input should be greater than or equal to 0",
        ),
    ],
)
def test_a_nonsense_number_is_refused_at_start(args: list[str], option: str, value: str) -> None:
    code, out = _invoke(args)
    assert code == 2, out
    assert f"Invalid value for '{option}': {value}" in out


def test_a_sample_seed_without_a_sample_size_is_refused(tmp_path: Path) -> None:
    # a newcomer's `optimize --sample-seed 3` without --questions started a full run on every question
    code, out = _invoke(["optimize", "--data", str(tmp_path), "--sample-seed", "3"])
    assert code == 2, out
    assert "Invalid value for '--sample-seed': needs --questions N, the size of the sample" in out


# -- item 5: stats with no harmful KI, lm smoke help, drift --data checked first -----------------
def test_lm_smoke_help_has_no_stray_line_break() -> None:
    _register()
    r = CliRunner().invoke(app, ["lm", "smoke", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    assert "the embedded local model starts first; its start-up time is shown apart." in r.output


@pytest.mark.parametrize("sub", ["check", "run"])
def test_drift_names_a_missing_data_path_before_any_fingerprint(tmp_path: Path, sub: str) -> None:
    missing = tmp_path / "nowhere"
    code, out = _invoke(["drift", sub, "--data", str(missing)])
    assert code == 2
    assert f"--data {missing} does not exist" in out and "fingerprint" not in out
    assert "kitune demo --print-fixture" in out and "shared/data" not in out


# -- item 6: --progress has help; the main commands show true examples ----------------------------
MAIN = ("extract", "eval", "optimize", "demo", "context", "serve", "report", "loop", "mcp")


@pytest.mark.parametrize("name", MAIN)
def test_main_commands_show_examples_with_real_options(name: str) -> None:
    import typer

    _register()
    cmd = typer.main.get_command(app).commands[name]
    help_text = cmd.help or ""
    assert "\nExamples:\n" in help_text
    examples = [line.strip() for line in help_text.split("\nExamples:\n", 1)[1].splitlines() if line.strip()]
    assert len(examples) == 2 and all(e.startswith(f"kitune {name}") for e in examples)
    known = {opt for p in cmd.params for opt in p.opts}
    # the packaged fixture is named the way a clone can reach it (no ../shared beside a clone)
    assert not any("shared/data/fixture" in e for e in examples), examples
    own = [e.replace('"$(kitune demo --print-fixture)"', "FIXTURE") for e in examples]
    used = {tok for e in own for tok in e.split() if tok.startswith("--")}
    assert used <= known, used - known


@pytest.mark.parametrize("args", [["optimize"], ["demo"], ["loop"], ["drift", "check"], ["drift", "run"]])
def test_progress_flag_has_help(args: list[str]) -> None:
    code, out = _invoke([*args, "--help"])
    assert code == 0 and "Show progress on stderr (bars on a terminal); --no-progress: none" in out


def test_optimisation_table_shows_every_value_whole_in_80_columns() -> None:
    """Long headers were cut to "valid…" / "accur…" on an 80-column terminal (newcomer check)."""
    from types import SimpleNamespace

    from rich.console import Console

    from kitune.cli.loop_cmds import _history_table

    row = {"tune_score": 0.05, "val_score": 0.0, "candidate_val_score": -0.042, "accepted": False}
    history = [
        SimpleNamespace(
            iteration=0,
            tune_accuracy=0.21,
            val_accuracy=0.21,
            flips={},
            decision="rejected",
            changed=[],
            **row,
        ),
        SimpleNamespace(
            iteration=1,
            tune_accuracy=0.29,
            val_accuracy=1.0,
            decision="undecided",
            flips={"tune": {"fixed": ["a", "b"], "broken": ["c"]}},
            changed=["extractor", "rewriter", "disambiguator"],
            **row,
        ),
    ]
    console = Console(width=80, record=True)
    console.print(_history_table(history, "kitune optimize (run)"))
    text = console.export_text()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    for value in ("21%", "100%", "+0.050", "-0.042", "+2/-1", "undecided", "disambiguator", "rewriter"):
        assert value in text, value


def test_extract_names_where_a_missing_data_folder_comes_from(tmp_path: Path) -> None:
    # a clone has no ../shared beside it: `kitune extract --data ../shared/data/dev` said only
    # "corpus file … does not exist: check the --data path"
    missing = tmp_path / "shared" / "data" / "dev"
    code, out = _invoke(["extract", "--data", str(missing), "--no-progress"])
    assert code == 2, out
    assert f"data path {missing} does not exist" in out and "kitune demo --print-fixture" in out


def test_eval_in_context_names_a_missing_data_path_before_the_empty_ki_table(tmp_path: Path) -> None:
    # a newcomer's `kitune eval --skill in-context --data debian/` (no such folder, no KIs yet) was
    # told to run `kitune extract --data DIR`, which then failed on the same missing path
    missing = tmp_path / "debian"
    code, out = _invoke(["eval", "--skill", "in-context", "--data", str(missing), "--no-progress"])
    assert code == 2, out
    assert f"data path {missing} does not exist" in out and "holds no KIs" not in out


def test_status_on_an_empty_workdir_suggests_only_what_can_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it said "or `kitune prompts rollback kitune-<corpus>-extractor`": a placeholder, and with
    # nothing registered there is nothing to roll back to
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KITUNE_CONFIG", raising=False)
    monkeypatch.delenv("KITUNE_WORKDIR", raising=False)
    code, out = _invoke(["status"])
    assert code == 1, out
    assert "holds no active KI: run `kitune extract --data DIR` (same --config)" in out
    assert "rollback" not in out and "<corpus>" not in out


# -- issue 37's newcomer findings: nothing created when there is nothing; the fixture named ----
@pytest.mark.parametrize("args", [["expire"], ["expire", "--all"], ["expire", "--at", "2026-12-31"]])
def test_expire_on_a_fresh_workdir_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KITUNE_CONFIG", raising=False)
    monkeypatch.setenv("KITUNE_WORKDIR", str(tmp_path / "w"))
    code, out = _invoke(args)
    assert code == 0, out
    assert (
        "no KI table yet (kis-" in out and "nothing to expire; run `kitune extract --data DIR` first" in out
    )
    assert not (tmp_path / "w").exists()  # no empty lance table, no work dir


def test_eval_in_context_on_a_fresh_workdir_creates_no_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixture_dir: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KITUNE_CONFIG", raising=False)
    monkeypatch.setenv("KITUNE_WORKDIR", str(tmp_path / "w"))
    code, out = _invoke(["eval", "--skill", "in-context", "--data", str(fixture_dir), "--no-progress"])
    assert code == 2, out
    assert "--skill in-context: no KI table yet (" in out and "run `kitune extract --data DIR` first" in out
    assert not (tmp_path / "w" / "lancedb").exists() and not (tmp_path / "w" / "runs").exists()


@pytest.mark.parametrize("where", ["nowhere", "a-folder"])
def test_loop_on_a_missing_corpus_names_the_shipped_fixture(tmp_path: Path, where: str) -> None:
    corpus = tmp_path / where
    if where == "a-folder":
        corpus.mkdir()
    code, out = _invoke(["loop", "--corpus", str(corpus), "--traces", str(tmp_path)])
    assert code == 2, out
    assert 'a corpus ships with kitune: --corpus "$(kitune demo --print-fixture)"' in out
