"""``kitune signals``: failure signals mined from traces, labelled or not (thin over the service)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from kitune.cli.common import ConfigOption, TraceSourceNameOption, TraceSourcesArgument, fail_with, get_config
from kitune.errors import KituneError

__all__ = ["register", "signals_cmd"]

_out = Console()


def signals_cmd(
    sources: TraceSourcesArgument = None,
    name: TraceSourceNameOption = None,
    use_store: Annotated[
        bool,
        typer.Option(
            "--store/--no-store", help="Read the production KI table (coverage gap, confidence floor)."
        ),
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole report as JSON.")] = False,
    top: Annotated[int, typer.Option("--top", min=1, help="Rows of the KI / document / entity tables.")] = 10,
    track: Annotated[bool, typer.Option("--track/--no-track", help="Log the report to MLflow.")] = True,
    config: ConfigOption = None,
) -> None:
    """Mine failure signals from agent traces that need no gold answer.

    Signals per trace: empty retrieval, fell back to raw search, looped (same look-up repeated),
    budget exhausted / force-committed, answer not supported by anything shown, coverage gap
    (question entities with no KI; needs the KI store) and query error; summed per signal, per KI,
    per document and per entity. Exit 2 when no source is given or a source does not exist.

    Example: kitune signals kitune-work/runs/in-context-fixture-all --json
    """
    from kitune.service.serving.setting import open_serving_store
    from kitune.service.workflows.signals import (
        load_signal_traces,
        log_signals,
        signal_report,
        store_facts,
        trace_sources,
    )
    from kitune.tracking.trackers import create_tracker

    cfg = get_config(config)
    paths: list[Path] = []
    try:
        paths = trace_sources(cfg, sources, name)
        loaded = load_signal_traces(paths)
        facts = None
        if use_store:
            store = open_serving_store(cfg, read_only=True)
            if store is not None:
                try:
                    facts = store_facts(store)
                finally:
                    store.close()
        report = signal_report(cfg, loaded.traces, facts=facts)
    except (KituneError, ValueError) as e:
        fail_with(e)
    if track:
        label = name or (paths[0].name if len(paths) == 1 else "batch")
        log_signals(
            create_tracker(cfg),
            report,
            name=label,
            params={"signals.sources": [str(p) for p in paths], "signals.traces": report.n_traces},
        )
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
        return
    n = report.n_traces
    table = Table(title=f"failure signals over {n} trace(s)")
    for col in ("signal", "traces", "share"):
        table.add_column(col, justify="left" if col == "signal" else "right")
    for kind, count in report.by_kind.items():
        if kind == "coverage_gap" and not report.coverage_computed:
            table.add_row("coverage gap", "–", "no KI store")
            continue
        table.add_row(kind.replace("_", " "), str(count), f"{100 * count / n:.1f}%" if n else "–")
    _out.print(table)
    if report.unassessed:
        _out.print(
            f"{report.unassessed} answered trace(s) recorded no tool output: answer support not assessed"
        )
    for title, rows in (("KIs", report.by_ki), ("documents", report.by_doc), ("entities", report.by_entity)):
        bad = sorted(
            (
                (k, v)
                for k, v in rows.items()
                if any(c for x, c in v.items() if x not in ("shown", "questions"))
            ),
            key=lambda kv: (-sum(c for x, c in kv[1].items() if x not in ("shown", "questions")), kv[0]),
        )[:top]
        if not bad:
            continue
        t = Table(title=f"{title} with the most signals")
        t.add_column(title[:-1] if title != "entities" else "entity")
        t.add_column("counts (traces)")
        for key, counts in bad:
            t.add_row(key, ", ".join(f"{x} {c}" for x, c in counts.items()))
        _out.print(t)
    flagged = [t for t in report.traces if t.hits]
    if flagged:
        t = Table(title=f"{len(flagged)} trace(s) with signals")
        t.add_column("trace")
        t.add_column("signals (steps)")
        for ts in flagged[:top]:
            t.add_row(ts.trace_id, "; ".join(f"{h.kind} {list(h.steps) or ''}".strip() for h in ts.hits))
        _out.print(t)
    if loaded.skipped:
        _out.print(f"{len(loaded.skipped)} record(s) skipped (not a trace)")


def register(app: typer.Typer) -> None:
    """Add ``kitune signals`` to ``app``."""
    app.command("signals")(signals_cmd)
