"""Shared CLI helpers: the --config option, config loading with clean errors, failure exit."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from kitune.config import KituneConfig, load_config
from kitune.errors import KituneError

__all__ = [
    "PROGRESS_HELP",
    "ConfigOption",
    "TraceSourceNameOption",
    "TraceSourcesArgument",
    "already_reported",
    "configure_logging",
    "console",
    "exit_code_for",
    "fail",
    "fail_with",
    "get_config",
    "positive",
    "preload_litellm",
    "quiet_progress",
]

console = Console(stderr=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="YAML/TOML config file (default: $KITUNE_CONFIG, else built-in defaults).",
        show_default=False,
    ),
]

PROGRESS_HELP = "Show progress on stderr (bars on a terminal); --no-progress: none, e.g. in log files."
"""Help of the ``--progress/--no-progress`` flag of the long-running commands."""

TraceSourcesArgument = Annotated[
    list[Path] | None,
    typer.Argument(
        help="Run folders, traces JSONL, chat/MLflow trace files, or folders of them.", show_default=False
    ),
]
"""Trace sources of ``kitune signals`` and ``kitune review propose``."""

TraceSourceNameOption = Annotated[
    str | None,
    typer.Option("--name", help="Also read the imported trace source <workdir>/traces/<name>."),
]


_LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")


def configure_logging(level: int = logging.WARNING) -> None:
    """Configure logging once for a command (idempotent): LiteLLM's loggers at ``level``, not propagated.

    LiteLLM gives its loggers their own stderr handler; with a root handler installed as well
    (the MCP SDK's, or a library's ``basicConfig``) every INFO line was printed twice on the MCP
    server's stderr. kitune reports LLM failures itself (classified, with the fix), so LiteLLM's
    own lines are kept to warnings and printed once, by LiteLLM's handler.
    """
    for name in _LITELLM_LOGGERS:
        lg = logging.getLogger(name)
        lg.setLevel(level)
        lg.propagate = False


_QUIET_LOGGERS = ("dspy", "gepa", "optuna")


def quiet_progress(progress: bool) -> None:
    """Honour ``--no-progress`` in the libraries too: no tqdm bars, no INFO progress lines.

    kitune's own progress is switched off by the command's ``progress`` argument; GEPA (through
    DSPy, which passes ``display_progress_bar=True`` itself) and DSPy's evaluators draw tqdm bars and
    log INFO lines of their own. With ``progress`` False this sets ``TQDM_DISABLE=1`` for the
    process (tqdm ≥ 4.66 reads ``TQDM_*`` variables as its defaults) and raises the ``dspy``,
    ``gepa`` and ``optuna`` loggers to WARNING. With ``progress`` True it changes nothing. tqdm
    reads the variable when it is imported, so a command calls this first, before the heavy
    imports (a CLI process has not imported tqdm by then); DSPy sets its logger's level when it is
    imported, so it is imported here before the levels are set.
    """
    if progress:
        return
    os.environ["TQDM_DISABLE"] = "1"
    _force_tqdm_off()
    import dspy  # noqa: F401  (it sets its logger to INFO when imported: import it first, then quiet it)

    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def _force_tqdm_off() -> None:
    """Make every tqdm bar of this process disabled, also one created with ``disable=False``.

    ``TQDM_DISABLE`` only sets tqdm's default: an explicit ``disable=False`` wins over it, and
    DSPy passes one where it hard-codes ``display_progress=True`` (``dspy.teleprompt
    .bootstrap_trace``, which GEPA's trace capture calls; measured in the loop-dev-100 run's log,
    where its "Average Metric" bars filled the log under ``--no-progress``). Only a command run
    with ``--no-progress`` calls this (its own process); idempotent.
    """
    import tqdm.std

    init = tqdm.std.tqdm.__init__
    if getattr(init, "_kitune_forced_off", False):
        return

    @functools.wraps(init)
    def _init(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["disable"] = True
        init(self, *args, **kwargs)

    _init._kitune_forced_off = True  # type: ignore[attr-defined]
    tqdm.std.tqdm.__init__ = _init


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``message`` in red on stderr and exit with ``code``."""
    # soft_wrap: a path or a command in the message is never broken at the 80th column.
    # escape: a message quoting "[...]" (a JSON list, a choice) is shown as written, not as markup.
    global _last_failure
    _last_failure = message
    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


_last_failure: str | None = None
"""The message :func:`fail` printed last (``--replay`` reports a miss once, not twice)."""


def already_reported(text: str) -> bool:
    """True when :func:`fail` already printed a message containing ``text``."""
    return _last_failure is not None and text in _last_failure


def positive(value: float | None) -> float | None:
    """Typer callback for an option that must be > 0 (a budget in minutes): refused at start, exit 2.

    ``min=`` cannot say "strictly greater" in Typer; this names the option and the value instead
    (``Invalid value for '--budget-minutes': must be greater than 0, got -5``). None passes.
    """
    if value is not None and not value > 0:  # `not >` also refuses nan
        raise typer.BadParameter(f"must be greater than 0, got {value:g}")
    return value


def exit_code_for(error: Exception) -> int:
    """The exit code for ``error``: 2 for bad input the user can fix, 1 for a failure at run time.

    Bad input: a config or data error, an unknown prompt version, a refused API key, a ValueError
    from argument checks. Everything else (an LLM call that failed after retries, a store that is
    down, a tracking failure, a ``--replay`` call the recording does not hold) is 1.
    """
    from kitune.errors import ConfigError, DataError, LMAuthError, PromptNotFoundError
    from kitune.recording import RecordingMissError

    if isinstance(error, RecordingMissError):
        return 1  # docs/guide.md (replay): a missed call stops the command with exit 1

    bad_input = (ConfigError, DataError, LMAuthError, PromptNotFoundError, ValueError)
    return 2 if isinstance(error, bad_input) else 1


def _what_failed(error: Exception) -> str:
    """A plain-words prefix for ``error`` (never the bare exception class name)."""
    from kitune.errors import LMAuthError, LMError, StoreError, TrackingError

    if isinstance(error, LMAuthError):
        return ""
    if isinstance(error, LMError):
        return "LLM call failed: "
    if isinstance(error, StoreError):
        return "KI store: "
    if isinstance(error, TrackingError):
        return "tracking/prompt registry: "
    return ""


def fail_with(error: Exception, *, code: int | None = None, suffix: str = "") -> NoReturn:
    """Exit with ``error``'s message (plain-words prefix, no class name) and :func:`exit_code_for` its code.

    Args:
        error: the caught error; its message names the input and the fix.
        code: force this exit code instead.
        suffix: appended to the message, e.g. ``" (rerun to resume)"``.
    """
    fail(f"{_what_failed(error)}{error}{suffix}", code=exit_code_for(error) if code is None else code)


def get_config(path: Path | None, overrides: dict[str, object] | None = None) -> KituneConfig:
    """Load the config or exit 2 with the ConfigError message (no traceback)."""
    env_path = os.environ.get("KITUNE_CONFIG")
    if path is None and env_path and not Path(env_path).is_file():
        fail(
            f"KITUNE_CONFIG={env_path} names no config file: point KITUNE_CONFIG at an existing "
            "YAML/TOML file, pass --config FILE, or unset KITUNE_CONFIG for the built-in defaults"
        )
    try:
        return load_config(path, overrides)
    except KituneError as e:
        fail(str(e))


def preload_litellm() -> None:
    """Import LiteLLM now (~3 s on first import), before any call is timed.

    Otherwise the first LLM call of a command carries the import in its latency ("rewrite …
    5615 ms", a few tokens/s from an instant server). No network access.
    """
    import litellm  # noqa: F401
