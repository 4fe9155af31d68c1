"""The MLflow tracker: runs, params, metrics, artefacts and agent episodes (as MLflow traces).

Import from :mod:`kitune.tracking.trackers` (re-exported there).

An unreachable tracking server costs seconds, not minutes. MLflow's own HTTP client retries a
failed request 7 times with exponential backoff (~250 s per call, and kitune makes a call per
run, metric batch and artefact, the last ones at exit). :func:`prepare_mlflow_env` sets
:data:`MLFLOW_HTTP_BOUNDS` as defaults (values the user set win): a request to a closed port
gives up after about 3 s, one that gets no answer after about 50 s. And once a call fails
because the server cannot be reached (connection refused, timeout), the tracker sends nothing
more to it: every later call is recorded as a tracking failure at once, without a request.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from kitune.errors import TrackingError
from kitune.tracking.episodes import EpisodeRecord
from kitune.tracking.tracker_base import BaseTracker, sanitize_name

__all__ = [
    "MLFLOW_HTTP_BOUNDS",
    "MlflowTracker",
    "artifact_dir_for_uri",
    "disable_mlflow_telemetry",
    "is_unreachable",
    "prepare_mlflow_env",
    "unreachable_cause",
]

logger = logging.getLogger("kitune.tracking")


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


MLFLOW_HTTP_BOUNDS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
}
"""kitune's defaults for MLflow's HTTP client (MLflow's: 7 retries, backoff factor 2, 120 s timeout).

Two retries sleep about 0 + 2 s (+ up to 1 s jitter each); the timeout, in seconds, bounds each
attempt's connect and read. Set the variables yourself to change them (e.g. a rate-limited server
that needs minutes of retries)."""


def prepare_mlflow_env() -> None:
    """Set up MLflow for this process before a client is built: telemetry off, bounded HTTP retries.

    Calls :func:`disable_mlflow_telemetry`, then sets every :data:`MLFLOW_HTTP_BOUNDS` variable
    that is not already set (MLflow reads them on each request). Idempotent.
    """
    disable_mlflow_telemetry()
    for name, value in MLFLOW_HTTP_BOUNDS.items():
        os.environ.setdefault(name, value)


def unreachable_cause(error: BaseException) -> BaseException | None:
    """The connection failure or timeout behind ``error``, or None when the server answered.

    MLflow wraps the ``requests`` error it got: a connection failure (refused, DNS, reset) or a
    timeout is in the exception's ``__cause__``/``__context__`` chain. HTTP error answers (4xx,
    5xx, rate limits) are not "unreachable": the server answered.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
            return current
        current = current.__cause__ or current.__context__
    return None


def is_unreachable(error: BaseException) -> bool:
    """True when ``error`` (or what caused it) says the tracking server could not be reached."""
    return unreachable_cause(error) is not None


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
    unreachable: str | None = None
    """Why the server was found unreachable (the first such error); None while it answers."""


class MlflowTracker(BaseTracker):
    """Tracks to MLflow through ``MlflowClient`` with explicit run ids (thread/async safe).

    ``mlflow`` is imported lazily on first use; telemetry is disabled first. For a local
    ``sqlite:///<dir>/mlflow.db`` URI the experiment's artefacts are stored in
    ``<dir>/mlartifacts`` (never a ``./mlruns`` relative to the working directory).

    After a call fails because the server cannot be reached (:func:`is_unreachable`), no further
    request is sent: later calls fail at once with :class:`~kitune.errors.TrackingError` (and are
    recorded as tracking failures, like every logging failure), so a run against a dead server
    loses its tracking but not minutes per call.

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
                prepare_mlflow_env()
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
        self._ensure_reachable()
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
            self._note_unreachable(e)
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

    def _ensure_reachable(self) -> None:
        """Raise at once when an earlier call found the server unreachable (no request is sent)."""
        down = self._state.unreachable
        if down is not None:
            raise TrackingError(
                f"not sent: the MLflow tracking server at {self.tracking_uri} could not be reached earlier "
                f"in this run ({down})"
            )

    def _note_unreachable(self, error: BaseException) -> None:
        cause = unreachable_cause(error) if self._state.unreachable is None else None
        if cause is not None:
            text = f"{type(cause).__name__}: {cause}"
            self._state.unreachable = text if len(text) <= 300 else text[:299] + "…"
            logger.warning(
                "the MLflow tracking server at %s cannot be reached; nothing more is sent to it in this run",
                self.tracking_uri,
            )

    def _record(self, operation: str, target: str, error: BaseException, run_id: str | None) -> None:
        self._note_unreachable(error)
        super()._record(operation, target, error, run_id)

    def run_url(self, run_id: str) -> str:
        """A human pointer to a run: ``<tracking_uri>#/experiments/<id>/runs/<run_id>``."""
        return f"{self.tracking_uri}#/experiments/{self._state.experiment_id}/runs/{run_id}"

    def _backend_create_run(self, name: str, parent_run_id: str | None, tags: dict[str, str]) -> str:
        self._ensure_reachable()
        all_tags = {sanitize_name(k): str(v)[:5000] for k, v in tags.items()}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        return str(run.info.run_id)

    def _backend_end_run(self, run_id: str, status: str) -> None:
        self._ensure_reachable()
        self.client.set_terminated(run_id, status=status)

    def _backend_log_params(self, run_id: str, params: dict[str, str]) -> None:
        self._ensure_reachable()
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100], synchronous=True)

    def _backend_log_metrics(self, run_id: str, metrics: dict[str, float], step: int | None) -> None:
        self._ensure_reachable()
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(k, v, ts, step or 0) for k, v in metrics.items()]
        self.client.log_batch(run_id, metrics=items, synchronous=True)

    def _backend_log_artifact(self, run_id: str, path: Path, artifact_path: str | None) -> None:
        self._ensure_reachable()
        self.client.log_artifact(run_id, str(path), artifact_path)

    def _backend_log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self._ensure_reachable()
        self.client.log_text(run_id, text, artifact_file)

    def _backend_log_dict(self, run_id: str, data: dict[str, Any], artifact_file: str) -> None:
        self._ensure_reachable()
        self.client.log_dict(run_id, data, artifact_file)

    def _backend_log_episode(self, run_id: str, record: EpisodeRecord) -> str:
        """Write one episode as an MLflow trace straight to the tracking store.

        Spans are built as finished OpenTelemetry spans and written with the store's
        ``log_spans`` + ``start_trace`` (what MLflow's own exporter does), through a
        ``TracingClient`` bound to :attr:`tracking_uri`: no global tracer, no fluent API, no
        background export queue, so the trace exists when this returns and never lands in
        another tracking URI. Stores without span logging get the spans as the trace's data
        artefact instead.
        """
        self._ensure_reachable()
        from mlflow.entities import TraceInfo, TraceLocation, TraceState
        from mlflow.entities.trace_data import TraceData
        from mlflow.tracing.client import TracingClient
        from mlflow.tracing.constant import TraceMetadataKey, TraceTagKey

        experiment_id = self.experiment_id
        otel_trace_id = uuid.uuid4().int
        trace_id = "tr-" + format(otel_trace_id, "032x")
        spans = _episode_spans(record, otel_trace_id, trace_id)
        info = TraceInfo(
            trace_id=trace_id,
            trace_location=TraceLocation.from_experiment_id(experiment_id),
            request_time=record.start_ns // 1_000_000,
            execution_duration=max(0, (record.end_ns - record.start_ns) // 1_000_000),
            state=TraceState.OK if record.ok else TraceState.ERROR,
            request_preview=str(record.inputs.get("question", ""))[:1000],
            response_preview=str(record.outputs.get("exact_answer", ""))[:1000],
            client_request_id=record.query_id,
            trace_metadata={TraceMetadataKey.SOURCE_RUN: run_id},
            tags={TraceTagKey.TRACE_NAME: record.name, **record.tags},
        )
        tracing = TracingClient(self.tracking_uri)
        try:
            tracing.log_spans(experiment_id, spans)
            in_store = True
        except NotImplementedError:
            in_store = False
        returned = tracing.start_trace(info)
        if not in_store or returned.tags.get(TraceTagKey.SPANS_LOCATION) != "TRACKING_STORE":
            tracing._upload_trace_data(returned, TraceData(spans=spans))
        return str(returned.trace_id)


def _episode_spans(record: EpisodeRecord, otel_trace_id: int, trace_id: str) -> list[Any]:
    """The root span (``AGENT``) and one child per step, as finished ``mlflow.entities.Span``."""
    from mlflow.entities import Span, SpanStatusCode
    from mlflow.entities.span_status import SpanStatus
    from mlflow.tracing.constant import SpanAttributeKey
    from mlflow.tracing.utils import build_otel_context
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan

    def span(
        name: str,
        span_id: int,
        parent: int | None,
        span_type: str,
        start_ns: int,
        end_ns: int,
        inputs: Any,
        outputs: Any,
        attributes: dict[str, Any],
        error: str | None,
    ) -> Any:
        # MLflow stores every span attribute JSON-encoded (it decodes them on read).
        attrs = {
            SpanAttributeKey.REQUEST_ID: json.dumps(trace_id),
            SpanAttributeKey.SPAN_TYPE: json.dumps(span_type),
            SpanAttributeKey.INPUTS: json.dumps(inputs, default=str, ensure_ascii=False),
            SpanAttributeKey.OUTPUTS: json.dumps(outputs, default=str, ensure_ascii=False),
            **{k: json.dumps(v, default=str, ensure_ascii=False) for k, v in attributes.items()},
        }
        status = SpanStatus(SpanStatusCode.ERROR if error else SpanStatusCode.OK, error or "")
        return Span(
            ReadableSpan(
                name=name,
                context=build_otel_context(otel_trace_id, span_id),
                parent=build_otel_context(otel_trace_id, parent) if parent else None,
                start_time=start_ns,
                end_time=end_ns,
                attributes=attrs,
                status=status.to_otel_status(),
                resource=Resource.get_empty(),
            )
        )

    a = record.attributes
    failure = a.get("kitune.failure") or "; ".join(map(str, a.get("kitune.errors") or []))
    root_error = (failure or "the question's run failed")[:1000] if not record.ok else None
    out = [
        span(
            record.name,
            1,
            None,
            "AGENT",
            record.start_ns,
            record.end_ns,
            record.inputs,
            record.outputs,
            record.attributes,
            root_error or None,
        )
    ]
    for i, step in enumerate(record.steps, start=2):
        out.append(
            span(
                step.name,
                i,
                1,
                step.span_type,
                step.start_ns,
                step.end_ns,
                step.inputs,
                step.outputs,
                step.attributes,
                step.error,
            )
        )
    return out
