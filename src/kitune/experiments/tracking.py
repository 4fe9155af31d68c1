r"""Experiment tracking: the :class:`Tracker` protocol, :class:`NullTracker` and :class:`MlflowTracker`.

Rules every tracker follows (failure cases M1 and M2):

* **Never abort the caller.** A logging call that fails is caught, recorded as a
  :class:`TrackingFailure` (see ``Tracker.failures``), logged as a warning, and counted in the
  run's ``kitune.tracking_failures`` metric when the run ends. Only a misconfigured tracker
  (:meth:`MlflowTracker.check`) raises :class:`~kitune.errors.TrackingError`.
* **Safe names.** Param and metric names are sanitised to ``[A-Za-z0-9_\\-. /]``
  (``recall@10`` → ``recall_at_10``, ``judge:model`` → ``judge_model``, ``acc[k=5]`` →
  ``acc_k_5``); the original → sanitised mapping is logged once per run as
  ``tracking/name_map.json``.
* **Long params.** Values longer than :data:`MAX_PARAM_CHARS` (500, the smallest limit any MLflow
  backend enforces) are truncated with a hash suffix; the full text goes to the artifact
  ``params/<name>.txt`` and a param ``<name>.artifact`` points to it.
* **Explicit run ids.** Log calls go to, in order: the ``run_id`` argument; the run opened by the
  innermost :meth:`Tracker.run` in the *current context* (a :class:`contextvars.ContextVar`, so
  concurrent asyncio tasks each see their own run); else, when the open runs of the tracker form
  one chain (one run, or a parent with its nested child …), the innermost of them (so a worker
  thread with no context logs into the run that started it). Otherwise (sibling runs open at
  once) the call is recorded as a failure: no run is ever created implicitly. :class:`MlflowTracker` uses
  ``MlflowClient`` with the run id and never the fluent active-run API.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
import math
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from kitune.errors import TrackingError

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

__all__ = [
    "MAX_PARAM_CHARS",
    "MlflowTracker",
    "NullTracker",
    "RunHandle",
    "Tracker",
    "TrackingFailure",
    "artifact_dir_for_uri",
    "create_tracker",
    "disable_mlflow_telemetry",
    "log_candidate",
    "log_program_state",
    "prepare_params",
    "sanitize_name",
]

logger = logging.getLogger(__name__)

MAX_PARAM_CHARS = 500
"""Longest param value logged inline; longer values go to an artifact (some backends store 500)."""

MAX_NAME_CHARS = 250
"""MLflow's limit on param/metric key length."""

_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]+")


def disable_mlflow_telemetry() -> None:
    """Turn MLflow's usage telemetry off for this process (it would try the network).

    mlflow 3.17 checks ``MLFLOW_DISABLE_TELEMETRY`` and ``DO_NOT_TRACK``
    (``mlflow/telemetry/utils.py``) when ``import mlflow`` creates its telemetry client; if
    mlflow was imported already, the client is re-initialised so the setting takes effect.
    Values already set by the user are kept.
    """
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DO_NOT_TRACK", "true")
    # Database creation/migration chatter ("Creating initial MLflow database tables...") is
    # noise on a CLI; keep warnings. Only loggers nobody configured are touched.
    for name in ("mlflow.store.db.utils", "alembic.runtime.migration"):
        db_logger = logging.getLogger(name)
        if db_logger.level == logging.NOTSET:
            db_logger.setLevel(logging.WARNING)
    telemetry = sys.modules.get("mlflow.telemetry")
    if telemetry is not None:
        try:
            telemetry.set_telemetry_client()
        except Exception as e:
            logger.debug("could not re-initialise MLflow telemetry: %s", e)


def sanitize_name(name: str) -> str:
    r"""Map a param/metric name onto MLflow's safe charset ``[A-Za-z0-9_\\-. /]``.

    ``@`` becomes ``_at_``; every other run of disallowed characters becomes one ``_``;
    leading/trailing ``_`` from replacements are trimmed. Names over 250 chars are cut and given
    an 8-hex hash suffix. Deterministic: the same input always gives the same output.

    Args:
        name: any string.

    Returns:
        A non-empty safe name, e.g. ``recall@10`` → ``recall_at_10``, ``acc[k=5]`` → ``acc_k_5``.
    """
    out = _BAD_CHARS.sub("_", name.replace("@", "_at_"))
    out = re.sub(r"_{2,}", "_", out)
    if out != name:
        out = out.strip("_") or "_"
    if not out.strip():
        out = "_"
    if len(out) > MAX_NAME_CHARS:
        digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
        out = f"{out[: MAX_NAME_CHARS - 9]}_{digest}"
    return out


@dataclass(frozen=True)
class PreparedParams:
    """Params made safe to log (result of :func:`prepare_params`)."""

    params: dict[str, str]
    """Sanitised name → value of at most :data:`MAX_PARAM_CHARS` chars."""
    long_values: dict[str, str]
    """Artifact file (``params/<name>.txt``) → full text, for each truncated value."""
    renamed: dict[str, str]
    """Original name → sanitised name, only for names that changed."""


def prepare_params(params: Mapping[str, Any], *, max_chars: int = MAX_PARAM_CHARS) -> PreparedParams:
    """Sanitise names and truncate long values (case M1); pure, no I/O.

    Non-string values are ``str()``-ed (dicts/lists as sorted JSON). A value longer than
    ``max_chars`` is cut to ``<head>…[sha256:<12 hex>]`` (total ≤ ``max_chars``), its full text
    is returned under ``params/<name>.txt`` and a param ``<name>.artifact`` names that file.

    Args:
        params: name → value.
        max_chars: inline value limit, ≥ 40.

    Returns:
        A :class:`PreparedParams`.

    Raises:
        ValueError: ``max_chars`` < 40.
    """
    if max_chars < 40:
        raise ValueError(f"max_chars must be >= 40, got {max_chars}")
    out: dict[str, str] = {}
    long_values: dict[str, str] = {}
    renamed: dict[str, str] = {}
    for raw_name, raw_value in params.items():
        name = sanitize_name(str(raw_name))
        if name != raw_name:
            renamed[str(raw_name)] = name
        value = _param_text(raw_value)
        if len(value) > max_chars:
            digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:12]
            suffix = f"…[sha256:{digest}]"
            file = f"params/{name.replace('/', '_')}.txt"
            long_values[file] = value
            out[name] = value[: max_chars - len(suffix)] + suffix
            out[sanitize_name(f"{name}.artifact")] = file
        else:
            out[name] = value
    return PreparedParams(params=out, long_values=long_values, renamed=renamed)


def _param_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, tuple)):
        try:
            return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


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
    resolved as described in :mod:`kitune.experiments.tracking` (explicit ``run_id`` → the
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
    ) -> AbstractContextManager[RunHandle]:
        """Open a run and make it current in this context.

        It is nested under ``parent_run_id`` if given, else under the current context's run, if
        any (pass ``parent_run_id`` when opening a child run from a worker thread).

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
        """Log params (long values → artifacts, see :func:`prepare_params`)."""
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


_current_run: contextvars.ContextVar[Mapping[int, RunHandle] | None] = contextvars.ContextVar(
    "kitune_tracking_current_run", default=None
)
"""Per-context current run of each tracker (keyed by ``id(tracker)``); values are never mutated."""


class BaseTracker:
    """Shared machinery: run resolution, name mapping, failure recording.

    Subclasses implement the ``_backend_*`` methods, which may raise; this class catches.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: list[TrackingFailure] = []
        self._open: dict[str, RunHandle] = {}
        self._name_maps: dict[str, dict[str, str]] = {}
        self._run_failures: dict[str, int] = {}

    # -- public API -------------------------------------------------------------------------
    @property
    def failures(self) -> tuple[TrackingFailure, ...]:
        """Every swallowed logging failure so far, oldest first."""
        with self._lock:
            return tuple(self._failures)

    @property
    def current_run(self) -> RunHandle | None:
        """The run this context logs to by default, or None."""
        return self._context_run()

    @contextlib.contextmanager
    def run(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        *,
        tags: Mapping[str, str] | None = None,
        parent_run_id: str | None = None,
    ) -> Iterator[RunHandle]:
        """Open a run, make it current in this context, close it on exit. See :class:`Tracker`."""
        parent = self._context_run()
        parent_id = parent_run_id or (parent.run_id if parent else None)
        run_id: str | None = None
        try:
            run_id = self._backend_create_run(name, parent_id, dict(tags or {}))
        except Exception as e:
            self._record("create_run", name, e, None)
        handle = RunHandle(run_id=run_id, name=name, parent_run_id=parent_id)
        if run_id is not None:
            with self._lock:
                self._open[run_id] = handle
        token = _current_run.set({**(_current_run.get() or {}), id(self): handle})
        status = "FAILED"
        try:
            if params:
                self.log_params(params, run_id=run_id)
            yield handle
            status = "FINISHED"
        finally:
            _current_run.reset(token)
            if run_id is not None:
                self._finish(run_id, status)

    def log_params(self, params: Mapping[str, Any], *, run_id: str | None = None) -> None:
        """Log params with the M1 rules; never raises."""
        rid = self._resolve("log_params", run_id, ",".join(map(str, params)))
        if rid is None:
            return
        try:
            prepared = prepare_params(params)
        except Exception as e:
            self._record("log_params", ",".join(map(str, params)), e, rid)
            return
        self._note_names(rid, prepared.renamed)
        for file, text in prepared.long_values.items():
            self._call("log_text", file, rid, self._backend_log_text, rid, text, file)
        if prepared.params:
            self._call(
                "log_params", ",".join(prepared.params), rid, self._backend_log_params, rid, prepared.params
            )

    def log_metrics(
        self, metrics: Mapping[str, float], *, step: int | None = None, run_id: str | None = None
    ) -> None:
        """Log metrics; bad names are sanitised, bad values recorded as failures; never raises."""
        rid = self._resolve("log_metrics", run_id, ",".join(map(str, metrics)))
        if rid is None:
            return
        clean: dict[str, float] = {}
        renamed: dict[str, str] = {}
        for raw_name, raw_value in metrics.items():
            name = sanitize_name(str(raw_name))
            if name != raw_name:
                renamed[str(raw_name)] = name
            try:
                value = float(raw_value)
                if math.isnan(value) or math.isinf(value):
                    raise ValueError(f"metric {raw_name!r} is not finite: {value}")
            except (TypeError, ValueError) as e:
                self._record("log_metrics", str(raw_name), e, rid)
                continue
            clean[name] = value
        self._note_names(rid, renamed)
        if clean:
            self._call("log_metrics", ",".join(clean), rid, self._backend_log_metrics, rid, clean, step)

    def log_artifact(
        self, path: Path | str, artifact_path: str | None = None, *, run_id: str | None = None
    ) -> None:
        """Copy a local file into the run's artifacts; never raises."""
        rid = self._resolve("log_artifact", run_id, str(path))
        if rid is None:
            return
        p = Path(path)
        if not p.exists():
            self._record("log_artifact", str(path), FileNotFoundError(f"no such file: {path}"), rid)
            return
        self._call("log_artifact", str(path), rid, self._backend_log_artifact, rid, p, artifact_path)

    def log_text(self, text: str, artifact_file: str, *, run_id: str | None = None) -> None:
        """Store text as an artifact; never raises."""
        rid = self._resolve("log_text", run_id, artifact_file)
        if rid is not None:
            self._call("log_text", artifact_file, rid, self._backend_log_text, rid, str(text), artifact_file)

    def log_dict(self, data: Mapping[str, Any], artifact_file: str, *, run_id: str | None = None) -> None:
        """Store a mapping as JSON/YAML; never raises."""
        rid = self._resolve("log_dict", run_id, artifact_file)
        if rid is not None:
            self._call("log_dict", artifact_file, rid, self._backend_log_dict, rid, dict(data), artifact_file)

    # -- backend hooks (may raise) ----------------------------------------------------------
    def _backend_create_run(self, name: str, parent_run_id: str | None, tags: dict[str, str]) -> str:
        raise NotImplementedError

    def _backend_end_run(self, run_id: str, status: str) -> None:
        raise NotImplementedError

    def _backend_log_params(self, run_id: str, params: dict[str, str]) -> None:
        raise NotImplementedError

    def _backend_log_metrics(self, run_id: str, metrics: dict[str, float], step: int | None) -> None:
        raise NotImplementedError

    def _backend_log_artifact(self, run_id: str, path: Path, artifact_path: str | None) -> None:
        raise NotImplementedError

    def _backend_log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        raise NotImplementedError

    def _backend_log_dict(self, run_id: str, data: dict[str, Any], artifact_file: str) -> None:
        raise NotImplementedError

    # -- internals --------------------------------------------------------------------------
    def _context_run(self) -> RunHandle | None:
        return (_current_run.get() or {}).get(id(self))

    def _resolve(self, operation: str, run_id: str | None, target: str) -> str | None:
        if run_id is not None:
            return run_id
        handle = self._context_run()
        if handle is not None:
            if handle.run_id is None:
                self._record(operation, target, TrackingError("the run could not be created"), None)
            return handle.run_id
        with self._lock:
            open_runs = list(self._open.values())
        parents = {h.parent_run_id for h in open_runs}
        leaves = [h.run_id for h in open_runs if h.run_id not in parents]
        if len(leaves) == 1 and leaves[0] is not None:
            return leaves[0]
        why = "no run is open" if not open_runs else f"{len(leaves)} sibling runs are open"
        self._record(
            operation,
            target,
            TrackingError(f"{why}; log inside `with tracker.run(...)` or pass run_id=handle.run_id"),
            None,
        )
        return None

    def _note_names(self, run_id: str, renamed: Mapping[str, str]) -> None:
        if renamed:
            with self._lock:
                self._name_maps.setdefault(run_id, {}).update(renamed)

    def _call(self, operation: str, target: str, run_id: str, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as e:
            self._record(operation, target, e, run_id)

    def _record(self, operation: str, target: str, error: BaseException, run_id: str | None) -> None:
        failure = TrackingFailure(operation, target, f"{type(error).__name__}: {error}"[:2000], run_id)
        with self._lock:
            self._failures.append(failure)
            if run_id is not None:
                self._run_failures[run_id] = self._run_failures.get(run_id, 0) + 1
        logger.warning("tracking %s(%s) failed and was skipped: %s", operation, target, failure.error)

    def _finish(self, run_id: str, status: str) -> None:
        with self._lock:
            name_map = self._name_maps.pop(run_id, None)
        if name_map:
            self._call(
                "log_dict",
                "tracking/name_map.json",
                run_id,
                self._backend_log_dict,
                run_id,
                dict(sorted(name_map.items())),
                "tracking/name_map.json",
            )
        with self._lock:
            n_failed = self._run_failures.pop(run_id, 0)
        if n_failed:
            self._call(
                "log_metrics",
                "kitune.tracking_failures",
                run_id,
                self._backend_log_metrics,
                run_id,
                {"kitune.tracking_failures": float(n_failed)},
                None,
            )
        self._call("end_run", run_id, run_id, self._backend_end_run, run_id, status)
        with self._lock:
            self._open.pop(run_id, None)


class NullTracker(BaseTracker):
    """Tracks nothing (the default). Runs get synthetic ids so nesting still resolves."""

    def __init__(self) -> None:
        super().__init__()
        self._counter = 0

    def _backend_create_run(self, name: str, parent_run_id: str | None, tags: dict[str, str]) -> str:
        with self._lock:
            self._counter += 1
            return f"null-{self._counter}"

    def _backend_end_run(self, run_id: str, status: str) -> None:
        return None

    def _backend_log_params(self, run_id: str, params: dict[str, str]) -> None:
        return None

    def _backend_log_metrics(self, run_id: str, metrics: dict[str, float], step: int | None) -> None:
        return None

    def _backend_log_artifact(self, run_id: str, path: Path, artifact_path: str | None) -> None:
        return None

    def _backend_log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        return None

    def _backend_log_dict(self, run_id: str, data: dict[str, Any], artifact_file: str) -> None:
        return None


def artifact_dir_for_uri(tracking_uri: str) -> Path | None:
    """Where artefacts live for a local SQLite tracking URI: ``<db folder>/mlartifacts``.

    Args:
        tracking_uri: e.g. ``sqlite:////abs/work/mlflow.db``.

    Returns:
        The folder for ``sqlite:///`` URIs, else None (the server/backend decides).
    """
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///") :])
        return db.parent / "mlartifacts"
    return None


@dataclass
class _MlflowState:
    client: Any = None
    experiment_id: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class MlflowTracker(BaseTracker):
    """Tracks to MLflow through ``MlflowClient`` with explicit run ids (thread/async safe).

    ``mlflow`` is imported lazily on first use; telemetry is disabled first. For a local
    ``sqlite:///<dir>/mlflow.db`` URI the experiment's artefacts are stored in
    ``<dir>/mlartifacts`` (never a ``./mlruns`` relative to the working directory).

    Args:
        tracking_uri: any MLflow tracking URI; use ``KituneConfig.mlflow_uri`` for the default.
        experiment: experiment name, created on first use if missing.
    """

    def __init__(self, tracking_uri: str, experiment: str = "kitune") -> None:
        super().__init__()
        if not tracking_uri:
            raise TrackingError("MlflowTracker needs a tracking_uri, e.g. sqlite:///kitune-work/mlflow.db")
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self._state = _MlflowState()

    @property
    def client(self) -> Any:
        """The ``mlflow.MlflowClient`` (created on first use)."""
        with self._state.lock:
            if self._state.client is None:
                disable_mlflow_telemetry()
                try:
                    from mlflow import MlflowClient
                except ImportError as e:
                    raise TrackingError("mlflow is not installed: pip install 'mlflow==3.17.2'") from e
                if self.tracking_uri.startswith("sqlite:///"):
                    Path(self.tracking_uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
                self._state.client = MlflowClient(
                    tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri
                )
            return self._state.client

    @property
    def experiment_id(self) -> str:
        """Id of :attr:`experiment`, created if missing.

        Raises:
            TrackingError: the tracking store cannot be opened or the experiment created.
        """
        if self._state.experiment_id is not None:
            return self._state.experiment_id
        try:
            client = self.client
            exp = client.get_experiment_by_name(self.experiment)
            if exp is None:
                art = artifact_dir_for_uri(self.tracking_uri)
                location = art.resolve().as_uri() if art is not None else None
                exp_id = client.create_experiment(self.experiment, artifact_location=location)
            else:
                exp_id = exp.experiment_id
        except TrackingError:
            raise
        except Exception as e:
            raise TrackingError(
                f"cannot open MLflow experiment {self.experiment!r} at {self.tracking_uri!r}: {e}. "
                "Check tracking.tracking_uri (a sqlite:///<path>/mlflow.db URI works offline)."
            ) from e
        self._state.experiment_id = str(exp_id)
        return self._state.experiment_id

    def check(self) -> None:
        """Open the store and the experiment now, so misconfiguration fails fast.

        Raises:
            TrackingError: the tracking URI is unusable.
        """
        _ = self.experiment_id

    def run_url(self, run_id: str) -> str:
        """A human pointer to a run: ``<tracking_uri>#/experiments/<id>/runs/<run_id>``."""
        return f"{self.tracking_uri}#/experiments/{self._state.experiment_id}/runs/{run_id}"

    def _backend_create_run(self, name: str, parent_run_id: str | None, tags: dict[str, str]) -> str:
        all_tags = {sanitize_name(k): str(v)[:5000] for k, v in tags.items()}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        return str(run.info.run_id)

    def _backend_end_run(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status=status)

    def _backend_log_params(self, run_id: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100], synchronous=True)

    def _backend_log_metrics(self, run_id: str, metrics: dict[str, float], step: int | None) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(k, v, ts, step or 0) for k, v in metrics.items()]
        self.client.log_batch(run_id, metrics=items, synchronous=True)

    def _backend_log_artifact(self, run_id: str, path: Path, artifact_path: str | None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def _backend_log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self.client.log_text(run_id, text, artifact_file)

    def _backend_log_dict(self, run_id: str, data: dict[str, Any], artifact_file: str) -> None:
        self.client.log_dict(run_id, data, artifact_file)


def log_program_state(
    tracker: Tracker, program: Any, artifact_file: str = "program/program.json", *, run_id: str | None = None
) -> None:
    """Log a DSPy program's saved state as JSON (``program.save(path, save_program=False)``; never pickle).

    Args:
        tracker: where to log.
        program: a ``dspy.Module``.
        artifact_file: artifact path; must end in ``.json``.
        run_id: explicit run (else the current one).

    Raises:
        ValueError: ``artifact_file`` does not end in ``.json``.
    """
    if not artifact_file.endswith(".json"):
        raise ValueError(f"artifact_file must end in .json (state only, never pickle), got {artifact_file!r}")
    folder, _, filename = artifact_file.rpartition("/")
    with tempfile.TemporaryDirectory(prefix="kitune-program-") as tmp:
        path = Path(tmp) / filename
        try:
            program.save(str(path), save_program=False)
        except Exception as e:
            if isinstance(tracker, BaseTracker):
                tracker._record("log_program_state", artifact_file, e, run_id)
            else:
                logger.warning("saving program state for %s failed: %s", artifact_file, e)
            return
        tracker.log_artifact(path, folder or None, run_id=run_id)


def log_candidate(
    tracker: Tracker, candidate: Mapping[str, str], prefix: str = "prompts", *, run_id: str | None = None
) -> dict[str, str]:
    """Log each instruction of a candidate as ``<prefix>/<predictor>.txt`` plus ``<prefix>/candidate.json``.

    Args:
        tracker: where to log.
        candidate: predictor name → instruction text (see ``kitune.optimizers.base.Candidate``).
        prefix: artifact folder.
        run_id: explicit run (else the current one).

    Returns:
        Predictor name → artifact file it was written to (names made file-safe).
    """
    files: dict[str, str] = {}
    for predictor, text in candidate.items():
        safe = re.sub(r"[^A-Za-z0-9_.\-]+", "_", predictor).strip("_.") or "predictor"
        files[predictor] = f"{prefix}/{safe}.txt"
        tracker.log_text(text, files[predictor], run_id=run_id)
    tracker.log_dict(dict(candidate), f"{prefix}/candidate.json", run_id=run_id)
    return files


def create_tracker(cfg: Any, *, enabled: bool = True) -> Tracker:
    """The tracker a ``KituneConfig`` asks for: MLflow at ``cfg.mlflow_uri`` (or none when disabled).

    Args:
        cfg: a :class:`~kitune.config.KituneConfig`.
        enabled: False gives a :class:`NullTracker` (e.g. ``--no-track``).

    Returns:
        An :class:`MlflowTracker` (not yet connected; call ``check()`` to fail fast) or a
        :class:`NullTracker`.
    """
    if not enabled:
        return NullTracker()
    return MlflowTracker(cfg.mlflow_uri, experiment=cfg.tracking.experiment)
