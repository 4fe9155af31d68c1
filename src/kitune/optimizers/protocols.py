"""What the loop needs from a tracker and a prompt registry, declared at the loop's own layer.

The loop (:mod:`kitune.optimizers`) logs runs, metrics and artefacts and registers accepted
prompt versions, but the implementations live a layer above it, in :mod:`kitune.tracking`
(:class:`~kitune.tracking.trackers.MlflowTracker`, :class:`~kitune.tracking.prompts.PromptRegistry`).
The protocols sit here so the loop's imports only point down (AGENTS.md layer order, checked by
``tests/test_layering.py``, ``TYPE_CHECKING`` imports included); the tracking layer imports
them from here and implements them.

* :class:`Tracker` — where runs, params, metrics and artefacts go, with :class:`RunHandle` (an
  open run) and :class:`TrackingFailure` (a swallowed logging error). The rules every tracker
  follows are written in :mod:`kitune.tracking.trackers`.
* :class:`PromptRegistryProtocol` — the four prompt-registry calls the loop makes, returning
  :class:`StoredPrompt` records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from kitune.evaluation.metrics import Trace

__all__ = ["PromptRegistryProtocol", "RunHandle", "StoredPrompt", "Tracker", "TrackingFailure"]


@dataclass(frozen=True)
class RunHandle:
    """An open tracking run."""

    run_id: str | None
    """Backend run id; None when the run could not be created (logging is then skipped)."""
    name: str
    """Run name as given to :meth:`Tracker.run`."""
    parent_run_id: str | None = None
    """Enclosing run in the same context, if any (nested runs)."""


@dataclass(frozen=True)
class TrackingFailure:
    """One logging call that failed and was swallowed."""

    operation: str
    """``create_run``, ``log_params``, ``log_metrics``, ``log_artifact``, ``log_text``, ``log_dict``…"""
    target: str
    """The name, file or run the call was about."""
    error: str
    """``ExceptionType: message``."""
    run_id: str | None = None
    """The run it was meant for, when known."""


@runtime_checkable
class Tracker(Protocol):
    """Where runs, params, metrics and artifacts go.

    Contract for every implementation: log calls never raise (failures are recorded in
    :attr:`failures`); names are sanitised and long params moved to artifacts; the target run is
    resolved as described in :mod:`kitune.tracking.trackers` (explicit ``run_id`` → the
    current context's run → the only open run), so it is safe from threads and asyncio tasks.
    Runs are never created implicitly.
    """

    @property
    def failures(self) -> tuple[TrackingFailure, ...]:
        """Every swallowed logging failure so far, oldest first."""
        ...

    def run(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        *,
        tags: Mapping[str, str] | None = None,
        parent_run_id: str | None = None,
        nested: bool = True,
    ) -> AbstractContextManager[RunHandle]:
        """Open a run and make it current in this context.

        It is nested under ``parent_run_id`` if given, else (``nested=True``) under the current
        context's run, if any (pass ``parent_run_id`` when opening a child run from a worker
        thread). ``nested=False`` without ``parent_run_id`` opens a top-level run even inside
        another. MLflow shows a nested run under its parent (tag ``mlflow.parentRunId``).

        On exit the run is closed as FINISHED, or FAILED if the block raised (the exception
        propagates). Params are logged with the M1 rules.
        """
        ...

    def log_metrics(
        self, metrics: Mapping[str, float], *, step: int | None = None, run_id: str | None = None
    ) -> None:
        """Log numeric metrics (non-finite or non-numeric values are recorded as failures)."""
        ...

    def log_params(self, params: Mapping[str, Any], *, run_id: str | None = None) -> None:
        """Log params (long values → artifacts, see ``kitune.tracking.names.prepare_params``)."""
        ...

    def log_artifact(
        self, path: Path | str, artifact_path: str | None = None, *, run_id: str | None = None
    ) -> None:
        """Copy a local file into the run's artifacts under folder ``artifact_path``."""
        ...

    def log_text(self, text: str, artifact_file: str, *, run_id: str | None = None) -> None:
        """Store ``text`` (UTF-8) as the artifact ``artifact_file`` (e.g. ``prompts/extractor.txt``)."""
        ...

    def log_dict(self, data: Mapping[str, Any], artifact_file: str, *, run_id: str | None = None) -> None:
        """Store ``data`` as JSON (or YAML for ``.yaml``/``.yml``) under ``artifact_file``."""
        ...

    def log_episodes(
        self,
        traces: Sequence[Trace],
        *,
        run_id: str | None = None,
        name: str = "episode",
        failure_kinds: Mapping[str, str | None] | None = None,
    ) -> list[str]:
        """Log each question's agent episode as one trace linked to the run (one span per step).

        Returns the backend trace ids of the episodes that were logged, in input order;
        an episode that fails to log is recorded in :attr:`failures` and skipped.
        """
        ...


class StoredPrompt(Protocol):
    """One stored prompt version as the loop reads it (``kitune.tracking.prompts.PromptVersion``)."""

    @property
    def name(self) -> str:
        """Prompt name (``<corpus>.<program>``, see :func:`kitune.programs.instructions.prompt_name`)."""
        ...

    @property
    def version(self) -> int:
        """1-based version number, increasing."""
        ...

    @property
    def text(self) -> str:
        """The instruction text, verbatim."""
        ...


class PromptRegistryProtocol(Protocol):
    """The prompt-registry calls the loop makes (``kitune.tracking.prompts.PromptRegistry``).

    Versions are immutable; aliases (``candidate``, ``production``) move. Unknown names or
    versions raise :class:`~kitune.errors.PromptNotFoundError`; a registry that cannot be written
    raises :class:`~kitune.errors.TrackingError`.
    """

    def get(self, name: str, version_or_alias: int | str | None = None) -> StoredPrompt:
        """One version by number, alias or ``"latest"`` (None: production if set, else latest)."""
        ...

    def register(
        self,
        name: str,
        text: str,
        *,
        tags: Mapping[str, str] | None = None,
        commit_message: str | None = None,
    ) -> StoredPrompt:
        """Store ``text`` as a new version of ``name`` (previous latest + 1)."""
        ...

    def set_alias(self, name: str, alias: str, version: int | str) -> StoredPrompt:
        """Point ``alias`` of ``name`` at ``version``."""
        ...

    def promote(self, name: str, version: int | str) -> StoredPrompt:
        """Make ``version`` the ``production`` version and record the promotion."""
        ...
