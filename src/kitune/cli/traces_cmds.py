"""``kitune traces import|status``: a production agent's traces as tuning material.

Thin over :mod:`kitune.service.workflows.traces`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from kitune.cli.common import ConfigOption, fail, get_config
from kitune.errors import KituneError

__all__ = ["register", "traces_app"]

traces_app = typer.Typer(
    help="Import a production agent's traces (OpenAI chat JSONL, MLflow traces) as tuning questions.",
    no_args_is_help=True,
)

_out = Console()

NameOption = Annotated[str, typer.Option("--name", help="Trace source: folder <workdir>/traces/<name>.")]


@traces_app.command("import")
def import_cmd(
    files: Annotated[list[Path], typer.Argument(help="Trace files (.jsonl or .json).", show_default=False)],
    name: NameOption = "default",
    label_name: Annotated[
        str | None,
        typer.Option(
            "--label-name", help="MLflow feedback name holding correct/incorrect (default: correctness, …)."
        ),
    ] = None,
    seen_as_evidence: Annotated[
        bool,
        typer.Option(
            "--seen-as-evidence/--no-seen-as-evidence",
            help="With no evidence doc ids in a trace, use the documents the agent retrieved.",
        ),
    ] = True,
    config: ConfigOption = None,
) -> None:
    """Import traces: each with a question, the final answer and a gold answer or a correct/incorrect label.

    Writes <workdir>/traces/<name>/questions.jsonl (tuning questions), traces.jsonl (kitune
    trace records, for `kitune report`) and state.json. Importing the same trace twice is a
    no-op. Then run `kitune loop --corpus …` to tune on them.
    """
    from kitune.service.workflows.traces import TraceFolder, import_traces

    cfg = get_config(config)
    try:
        rep = import_traces(cfg, files, name=name, label_name=label_name, seen_as_evidence=seen_as_evidence)
    except KituneError as e:
        fail(str(e))
    table = Table(title=f"kitune traces import ({name})")
    table.add_column("")
    table.add_column("count", justify="right")
    for label, value in (
        ("records read", rep.read),
        ("new traces", rep.new),
        ("already imported", rep.duplicates),
        ("new questions", rep.questions_added),
        ("without gold (not a question)", rep.without_gold),
        ("gold conflicts (first kept)", len(rep.conflicts)),
        ("skipped records", len(rep.skipped)),
    ):
        table.add_row(label, str(value))
    _out.print(table)
    for s in rep.skipped[:10]:
        _out.print(f"skipped {s.path}:{s.line}: {s.reason}", highlight=False, soft_wrap=True)
    if len(rep.skipped) > 10:
        _out.print(f"… and {len(rep.skipped) - 10} more skipped records")
    folder = TraceFolder.of(cfg, name)
    _out.print(f"questions: {folder.questions}\ntraces: {folder.traces}", highlight=False, soft_wrap=True)


@traces_app.command("status")
def status_cmd(name: NameOption = "default", config: ConfigOption = None) -> None:
    """Show what was imported and what the loop consumed."""
    from kitune.data.loaders import load_questions
    from kitune.service.workflows.traces import TraceFolder

    cfg = get_config(config)
    try:
        folder = TraceFolder.of(cfg, name)
        state = folder.read_state()
        n_q = len(load_questions(folder.questions)) if folder.questions.is_file() else 0
    except KituneError as e:
        fail(str(e))
    traces = state.get("traces", {})
    consumed = set(state.get("consumed", []))
    pending = state.get("pending")
    _out.print(
        f"{folder.root}: {len(traces)} traces imported, {n_q} questions, "
        f"{sum(1 for t in traces if t not in consumed)} not yet consumed, "
        f"{len(state.get('rounds', []))} round(s) finished"
        + (f", round {pending['round']} pending ({pending['run_name']})" if pending else ""),
        highlight=False,
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    """Add ``kitune traces`` to ``app``."""
    app.add_typer(traces_app, name="traces")
