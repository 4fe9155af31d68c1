"""``kitune loop``: the resumable self-improvement loop over imported production traces.

Thin over :mod:`kitune.service.workflows.watch`; the cron / systemd recipe is in docs/guide.md.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from kitune.cli.common import (
    PROGRESS_HELP,
    ConfigOption,
    fail,
    fail_with,
    get_config,
    positive,
    quiet_progress,
)
from kitune.errors import KituneError

__all__ = ["loop_cmd", "register"]

_out = Console()


def _log(message: str) -> None:
    _out.print(f"[dim]{datetime.now(UTC).strftime('%H:%M:%S')}[/] {message}", soft_wrap=True, highlight=False)


def loop_cmd(
    corpus: Annotated[
        Path,
        typer.Option(
            "--corpus",
            help="Corpus file, or a dataset folder with corpus.jsonl / documents.jsonl.",
            show_default=False,
        ),
    ],
    traces: Annotated[
        Path | None, typer.Option("--traces", help="Folder of trace files to import once before the round.")
    ] = None,
    watch_dir: Annotated[
        Path | None,
        typer.Option("--watch", help="Poll this folder for new trace files (bounded; Ctrl-C safe)."),
    ] = None,
    name: Annotated[
        str, typer.Option("--name", help="Trace source: folder <workdir>/traces/<name>.")
    ] = "default",
    min_new: Annotated[int, typer.Option("--min-new", min=1, help="New traces needed to start a round.")] = 1,
    max_questions: Annotated[
        int | None, typer.Option("--max-questions", min=2, help="Tune on the newest N questions.")
    ] = None,
    iterations: Annotated[int, typer.Option(min=1, help="Optimisation iterations per round.")] = 1,
    optimizer: Annotated[
        str, typer.Option(help="A registered optimiser: gepa or mipro, or a plug-in.")
    ] = "gepa",
    programs: Annotated[
        str | None, typer.Option(help="Programs to tune, comma-separated (default: optimize's).")
    ] = None,
    max_metric_calls: Annotated[
        int | None,
        typer.Option(
            min=1, help="GEPA metric calls per program (default: optimize.max_metric_calls, else sized)."
        ),
    ] = None,
    knob_trials: Annotated[int, typer.Option(min=0, help="Optuna trials per iteration.")] = 0,
    distractors: Annotated[int, typer.Option(min=0, help="Extra non-evidence documents indexed.")] = 4,
    budget_minutes: Annotated[
        float | None,
        typer.Option(callback=positive, help="Wall-clock cap per program optimisation, in minutes (> 0)."),
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", min=0, help="--watch: seconds between polls.")
    ] = 60.0,
    max_polls: Annotated[
        int, typer.Option("--max-polls", min=0, help="--watch: stop after N polls (0: until Ctrl-C).")
    ] = 1440,
    max_rounds: Annotated[
        int | None, typer.Option("--max-rounds", min=1, help="--watch: stop after N finished rounds.")
    ] = None,
    label_name: Annotated[
        str | None, typer.Option("--label-name", help="MLflow feedback name of the label.")
    ] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help=PROGRESS_HELP)] = True,
    config: ConfigOption = None,
) -> None:
    """Tune on what is new since the last run: resume a pending round, or run one when enough traces arrived.

    Without --watch it runs once (cron-friendly): import --traces (new or changed files only),
    then one round of `kitune optimize` on all accumulated questions. With --watch DIR it polls
    DIR every --interval seconds. Rerun after an interruption to resume; exits 1 on failure.

    Examples:
    kitune loop --corpus "$(kitune demo --print-fixture)" --traces exported-traces/
    kitune loop --corpus "$(kitune demo --print-fixture)" --watch inbox/ --max-rounds 3
    """
    quiet_progress(progress)
    from kitune.optimizers.program_task import program_names
    from kitune.service.workflows.watch import LoopOptions, WatchOptions, corpus_file, loop_once, watch

    cfg = get_config(config)
    from kitune.optimizers.registry import check_optimizer

    try:
        check_optimizer(optimizer)
    except KituneError as e:
        fail(str(e))
    if traces is not None and watch_dir is not None:
        fail("use --traces DIR (once) or --watch DIR (polling), not both")
    try:
        corpus_file(corpus)
    except KituneError as e:
        fail_with(e)
    progs: tuple[str, ...] | None = None
    if programs is not None:
        known = program_names()
        progs = tuple(p.strip() for p in programs.split(",") if p.strip())
        if not progs or any(p not in known for p in progs):
            fail(f"--programs {programs!r}: choose a comma-separated subset of {', '.join(known)}")
    opts = LoopOptions(
        corpus=corpus,
        name=name,
        min_new=min_new,
        max_questions=max_questions,
        iterations=iterations,
        optimizer=optimizer,
        programs=progs,
        max_metric_calls=max_metric_calls,
        knob_trials=knob_trials,
        distractors=distractors,
        budget_minutes=budget_minutes,
        progress=progress,
    )
    folder = watch_dir or traces
    skip: str | None = None
    stop = ""
    try:
        if folder is None:
            res = loop_once(cfg, opts, log=_log)
            rounds, skip = [res], res.skipped_reason
        else:
            wopts = WatchOptions(
                directory=folder,
                interval_s=interval if watch_dir is not None else 0.0,
                max_polls=(max_polls or None) if watch_dir is not None else 1,
                max_rounds=max_rounds,
                label_name=label_name,
            )
            summary = watch(cfg, opts, wopts, log=_log)
            rounds, skip = summary.rounds, summary.last_skip
            stop = summary.stop_reason if watch_dir is not None or summary.interrupted else ""
    except KituneError as e:
        fail_with(e, suffix=" (rerun to resume)")
    except KeyboardInterrupt:
        fail("interrupted; rerun the same command to resume", code=130)
    if skip:
        _out.print(f"no round: {skip}", highlight=False)
    ran = [r for r in rounds if r.round is not None]
    if ran:
        table = Table(title=f"kitune loop ({name})")
        for col in ("round", "optimize run", "questions", "new traces", "resumed", "accepted iterations"):
            table.add_column(col)
        for r in ran:
            history = getattr(getattr(r.result, "loop", None), "history", [])
            table.add_row(
                str(r.round),
                str(r.run_name),
                str(r.n_questions),
                str(r.n_new_traces),
                "yes" if r.resumed else "no",
                f"{sum(1 for h in history if getattr(h, 'accepted', False))}/{len(history)}",
            )
        _out.print(table)
    if stop:
        _out.print(f"stopped: {stop}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``kitune loop`` to ``app``."""
    app.command("loop")(loop_cmd)
