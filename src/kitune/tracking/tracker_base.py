"""Tracker core: :class:`BaseTracker` rules and :class:`NullTracker`.

Both implement :class:`kitune.optimizers.protocols.Tracker` (declared at the loop's layer, its
user). Import them from :mod:`kitune.tracking.trackers`; the rules are described there.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kitune.errors import TrackingError
from kitune.evaluation.failures import classify_failure
from kitune.optimizers.protocols import RunHandle, TrackingFailure
from kitune.tracking.episodes import EpisodeRecord, episode_record
from kitune.tracking.names import (
    MAX_PARAM_CHARS,
    PreparedParams,
    prepare_params,
    sanitize_name,
)

if TYPE_CHECKING:
    from kitune.evaluation.metrics import Trace

__all__ = [
    "MAX_PARAM_CHARS",
    "BaseTracker",
    "NullTracker",
    "PreparedParams",
    "prepare_params",
    "sanitize_name",
]

logger = logging.getLogger("kitune.tracking")


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
        nested: bool = True,
    ) -> Iterator[RunHandle]:
        """Open a run, make it current in this context, close it on exit. See :class:`Tracker`."""
        parent = self._context_run() if nested else None
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

    def log_episodes(
        self,
        traces: Sequence[Trace],
        *,
        run_id: str | None = None,
        name: str = "episode",
        failure_kinds: Mapping[str, str | None] | None = None,
    ) -> list[str]:
        """Log one trace per question (root span + one span per agent step) linked to the run.

        Args:
            traces: evaluated questions (``Trace.steps`` as the harness writes them).
            run_id: the run to link them to (else the current run, resolved as for metrics).
            name: trace-name prefix; each trace is named ``<name>/<query_id>``, e.g.
                ``iteration-1/validation/q17``.
            failure_kinds: query id → failure kind (tag ``kitune.failure_kind``); questions not
                in it get :func:`kitune.evaluation.failures.classify_failure` of their trace.

        Returns:
            Backend trace ids of the logged episodes in input order (failed ones left out and
            recorded in :attr:`failures`); ``[]`` when no run resolves. Never raises.
        """
        rid = self._resolve("log_episodes", run_id, name)
        if rid is None:
            return []
        kinds = dict(failure_kinds or {})
        ids: list[str] = []
        now = time.time_ns()
        # Lay the episodes out back to back, ending now, so MLflow's trace list keeps their order.
        start = now - sum(int(max(0.0, t.wall_time_s) * 1e9) + 1000 for t in traces)
        for trace in traces:
            target = f"{name}/{trace.query_id}"
            try:
                qid = trace.query_id
                kind = kinds[qid] if qid in kinds else classify_failure(trace)
                record = episode_record(trace, name=name, start_ns=start, failure_kind=kind)
                start = record.end_ns + 1000
                ids.append(self._backend_log_episode(rid, record))
            except Exception as e:
                self._record("log_episodes", target, e, rid)
        return ids

    def log_records(self, records: Sequence[EpisodeRecord], *, run_id: str | None = None) -> list[str]:
        """Log ready-made trace records (e.g. served requests) linked to the run; never raises.

        Args:
            records: one :class:`~kitune.tracking.episodes.EpisodeRecord` per trace.
            run_id: the run to link them to (else the current run).

        Returns:
            Backend trace ids of the records logged, in input order (failed ones recorded in
            :attr:`failures` and left out); ``[]`` when no run resolves.
        """
        rid = self._resolve("log_records", run_id, records[0].name if records else "records")
        if rid is None:
            return []
        ids: list[str] = []
        for record in records:
            try:
                ids.append(self._backend_log_episode(rid, record))
            except Exception as e:
                self._record("log_records", record.name, e, rid)
        return ids

    # -- backend hooks (may raise) ----------------------------------------------------------
    def _backend_log_episode(self, run_id: str, record: EpisodeRecord) -> str:
        raise NotImplementedError

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
        self._traces = 0

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

    def _backend_log_episode(self, run_id: str, record: EpisodeRecord) -> str:
        with self._lock:
            self._traces += 1
            return f"null-trace-{self._traces}"
