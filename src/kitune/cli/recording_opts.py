"""``--record DIR`` / ``--replay DIR`` for the commands that call LLMs (extract, eval, optimize, demo…).

Usage in a command::

    @with_recording
    def command(..., record: RecordOption = None, replay: ReplayOption = None) -> None:
        cfg = get_config(config, {**overrides, **record_overrides(record, replay)})
        ...

:func:`record_overrides` turns the options into ``lm.record_dir`` / ``lm.replay_dir`` (see
:mod:`kitune.recording`); :func:`with_recording` prints how many calls were recorded or
replayed and, when a replay met a call it has no recording for, exits 1 naming that call — even
when the command itself carried on (a failed question or grader error is data, a replay miss
is not).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from kitune.cli.common import already_reported, console, fail

__all__ = ["RecordOption", "ReplayOption", "record_overrides", "with_recording"]

RecordOption = Annotated[
    Path | None,
    typer.Option(
        "--record",
        help="Store every LLM call (request hash, response, usage, finish reason) in DIR/calls.jsonl.",
        metavar="DIR",
        show_default=False,
    ),
]
ReplayOption = Annotated[
    Path | None,
    typer.Option(
        "--replay",
        help="Answer every LLM call from a --record DIR: no provider or local model is used; an "
        "unrecorded call fails naming it.",
        metavar="DIR",
        show_default=False,
    ),
]


def record_overrides(record: Path | None, replay: Path | None) -> dict[str, object]:
    """Config overrides for ``--record`` / ``--replay`` (exit 2 when both are given or DIR is unusable)."""
    if record is not None and replay is not None:
        fail("give either --record DIR or --replay DIR, not both")
    if replay is not None:
        from kitune.recording import CALLS_FILE

        if not (replay / CALLS_FILE).is_file():
            fail(f"--replay {replay}: no {CALLS_FILE} there; pass the folder a `--record DIR` run wrote")
        return {"lm.replay_dir": str(replay)}
    if record is not None:
        if record.exists() and not record.is_dir():
            fail(f"--record {record} is a file: pass a folder (it is created if missing)")
        return {"lm.record_dir": str(record)}
    return {}


def with_recording(command: Callable[..., None]) -> Callable[..., None]:
    """Decorate a command that takes ``record``/``replay`` options: report the recording at its end.

    Prints how many calls were recorded or replayed; when a replay met an unrecorded call, exits 1
    naming it (also when the command failed for that reason or carried on past it). Typer reads
    the wrapped command's signature, so the options stay as declared.
    """

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        record, replay = kwargs.get("record"), kwargs.get("replay")
        try:
            command(*args, **kwargs)
        finally:
            _report(record, replay)

    return run


def _report(record: Path | None, replay: Path | None) -> None:
    from kitune.recording import find_recorder

    if replay is not None:
        rec = find_recorder(replay, "replay")
        if rec is not None and rec.misses:
            if already_reported(rec.misses[0]):  # the command stopped on this miss and said so
                raise typer.Exit(1)
            more = f" (and {len(rec.misses) - 1} more)" if len(rec.misses) > 1 else ""
            fail(f"{rec.misses[0]}{more}", code=1)
        if rec is not None:
            console.print(
                f"replayed {rec.replayed} LLM call(s) from {rec.path}; no provider was called",
                soft_wrap=True,  # one line on a narrow terminal: Rich would break it mid-sentence
                highlight=False,
            )
    elif record is not None:
        rec = find_recorder(record, "record")
        if rec is not None:
            console.print(f"recorded {rec.recorded} LLM call(s) to {rec.path}")
