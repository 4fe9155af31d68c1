"""``kitune eval`` and ``kitune report``: thin wrappers over :mod:`kitune.service.evaluation`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer
from rich.console import Console
from rich.table import Table

from kitune.cli.common import ConfigOption, fail, get_config
from kitune.cli.recording_opts import RecordOption, ReplayOption, record_overrides, with_recording
from kitune.errors import KituneError

if TYPE_CHECKING:
    from kitune.data.examples import Split
    from kitune.evaluation.tools import Skill

__all__ = ["register"]

_out = Console()


def _summary_table(title: str, rows: list[list[str]], header: list[str]) -> Table:
    table = Table(title=title)
    for h in header:
        table.add_column(h)
    for r in rows:
        table.add_row(*r)
    return table


@with_recording
def eval_command(
    skill: Annotated[str, typer.Option("--skill", help="baseline | in-context | closed-book")],
    data: Annotated[
        Path, typer.Option("--data", help="Dataset directory (BrowseComp-Plus layout or JSONL).")
    ],
    split: Annotated[
        str, typer.Option("--split", help="all | tune | validation (seeded by optimize.seed).")
    ] = "all",
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Only the first N questions.")] = None,
    run_name: Annotated[
        str | None, typer.Option("--run-name", help="Run folder under <workdir>/runs.")
    ] = None,
    disambiguation: Annotated[
        bool, typer.Option("--disambiguation", help="in-context: keep disambiguation KIs in results.")
    ] = False,
    questions: Annotated[
        Path | None, typer.Option("--questions", help="Questions JSONL overriding --data's.")
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", min=1, help="Questions in parallel.")
    ] = None,
    rewrite: Annotated[
        bool,
        typer.Option(
            "--rewrite", help="in-context: rewrite look-ups with the query rewriter (costs tokens)."
        ),
    ] = False,
    no_judge: Annotated[bool, typer.Option("--no-judge", help="Skip the LLM judge (EM/F1 only).")] = False,
    config: ConfigOption = None,
    record: RecordOption = None,
    replay: ReplayOption = None,
) -> None:
    """Run the budgeted agent on a dataset slice; traces go to <workdir>/runs/<run-name>/ (resumable)."""
    from kitune.evaluation.report import ROWS, format_cell
    from kitune.service.evaluation import run_eval

    cfg = get_config(config, record_overrides(record, replay) or None)
    if split not in ("all", "tune", "validation"):
        fail(f"--split {split!r}: use all, tune or validation")
    try:
        result = run_eval(
            cfg,
            skill=cast("Skill", skill),
            data_dir=data,
            split=cast("Split", split),
            limit=limit,
            run_name=run_name,
            disambiguation=disambiguation,
            questions_path=questions,
            concurrency=concurrency,
            use_judge=not no_judge,
            rewrite=rewrite,
        )
    except KituneError as e:
        fail(str(e))
    s = result.summary
    rows = [[label, format_cell(s, key)] for label, key in ROWS]
    _out.print(_summary_table(f"eval {skill}: {s.name}", rows, ["metric", s.name]))
    _out.print(f"traces: {result.traces_path}")


def report_command(
    runs: Annotated[list[Path], typer.Argument(help="Run directories (or traces.jsonl files) to compare.")],
    out: Annotated[
        Path | None, typer.Option("--out", help="Output folder (default: <first run>/../report).")
    ] = None,
) -> None:
    """Compare runs side by side: Markdown table + PNG plot + HTML + summary.json."""
    from kitune.service.evaluation import report_runs

    out_dir = out or (runs[0].resolve().parent / "report")
    try:
        files = report_runs(runs, out_dir)
    except KituneError as e:
        fail(str(e))
    _out.print(files.markdown.read_text(encoding="utf-8"))
    _out.print(f"written: {files.markdown}, {files.html}" + (f", {files.plot}" if files.plot else ""))


def register(app: typer.Typer) -> None:
    """Add ``eval`` and ``report`` to ``app``."""
    app.command("eval")(eval_command)
    app.command("report")(report_command)
