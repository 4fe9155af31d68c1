"""``kitune report``: re-runnable on ``runs/*`` and no Markdown image link on the console."""

from __future__ import annotations

from pathlib import Path

import typer
from typer.testing import CliRunner

from kitune.cli import eval_cmds
from kitune.evaluation.harness import TraceWriter
from kitune.evaluation.metrics import Trace


def _app() -> typer.Typer:
    a = typer.Typer()
    eval_cmds.register(a)
    return a


def _run(root: Path, name: str, correct: list[bool]) -> Path:
    run = root / name
    run.mkdir(parents=True)
    w = TraceWriter(run / "traces.jsonl")
    for i, ok in enumerate(correct):
        w.write(
            Trace(
                query_id=str(i),
                skill="baseline",
                question="?",
                gold_answer="g",
                judge_correct=ok,
                judge_status="graded",
                input_tokens=1000 * (i + 1),
                status="answered",
            )
        )
    return run


def test_report_twice_over_a_glob_skips_its_own_report_folder(tmp_path: Path) -> None:
    # Issue 16: the second `kitune report runs/*` picked up runs/report and exited 2.
    runs = tmp_path / "runs"
    a = _run(runs, "a", [True, False])
    b = _run(runs, "b", [True, True])
    first = CliRunner().invoke(_app(), ["report", str(a), str(b)])
    assert first.exit_code == 0, first.output
    assert (runs / "report" / "report.md").is_file()
    again = sorted(runs.iterdir())  # what the shell's runs/* expands to now: a, b, report
    assert [p.name for p in again] == ["a", "b", "report"]
    second = CliRunner().invoke(_app(), ["report", *map(str, again)])
    assert second.exit_code == 0, second.output
    assert f"skipped {runs / 'report'}: no traces.jsonl" in second.output
    assert "| a" in second.output or " a " in second.output
    assert "![" not in second.output and "report.png)" not in second.output


def test_report_on_folders_without_runs_exits_2_naming_them(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(_app(), ["report", str(tmp_path / "empty")])
    assert r.exit_code == 2
    assert "holds a traces.jsonl" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(_app(), ["report", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "nope does not exist" in r.output
