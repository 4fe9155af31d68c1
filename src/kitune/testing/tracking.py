"""``RecordingTracker``: an in-memory :class:`~kitune.optimizers.protocols.Tracker` for tests.

It applies exactly the same rules as the real tracker (run resolution, name sanitising, long
params to artifacts, failures swallowed) and records what would have reached the backend, so a
test can assert on ``tracker.runs[i].metrics`` etc.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kitune.tracking.trackers import BaseTracker, EpisodeRecord

__all__ = ["RecordedMetric", "RecordedRun", "RecordingTracker"]


@dataclass(frozen=True)
class RecordedMetric:
    """One logged metric value."""

    key: str
    value: float
    step: int | None


@dataclass
class RecordedRun:
    """Everything logged to one run (mutable while the run is open)."""

    run_id: str
    name: str
    parent_run_id: str | None
    tags: dict[str, str]
    params: dict[str, str] = field(default_factory=dict)
    metric_log: list[RecordedMetric] = field(default_factory=list)
    artifacts: dict[str, str | bytes] = field(default_factory=dict)
    """Artifact path → content (text for log_text/log_dict, bytes for log_artifact)."""
    episodes: list[EpisodeRecord] = field(default_factory=list)
    """Agent episodes logged with ``log_episodes`` (one per question), in logging order."""
    status: str = "RUNNING"

    @property
    def metrics(self) -> dict[str, float]:
        """Last value of each metric."""
        return {m.key: m.value for m in self.metric_log}

    def history(self, key: str) -> list[tuple[int | None, float]]:
        """``[(step, value), ...]`` of ``key`` in logging order."""
        return [(m.step, m.value) for m in self.metric_log if m.key == key]


class RecordingTracker(BaseTracker):
    """Records runs in memory. ``fail_on`` names operations that should raise (to test M1)."""

    def __init__(self, *, fail_on: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.runs: list[RecordedRun] = []
        self.fail_on = set(fail_on)
        self._rec_lock = threading.Lock()

    def by_name(self, name: str) -> RecordedRun:
        """The last run called ``name``.

        Raises:
            KeyError: no such run.
        """
        for run in reversed(self.runs):
            if run.name == name:
                return run
        raise KeyError(f"no recorded run named {name!r}; have {[r.name for r in self.runs]}")

    def _get(self, run_id: str) -> RecordedRun:
        for run in self.runs:
            if run.run_id == run_id:
                return run
        raise KeyError(f"unknown run id {run_id!r}")

    def _maybe_fail(self, op: str) -> None:
        if op in self.fail_on:
            raise RuntimeError(f"RecordingTracker told to fail on {op}")

    def _backend_create_run(self, name: str, parent_run_id: str | None, tags: dict[str, str]) -> str:
        self._maybe_fail("create_run")
        with self._rec_lock:
            run_id = f"run-{len(self.runs) + 1}"
            self.runs.append(RecordedRun(run_id, name, parent_run_id, dict(tags)))
        return run_id

    def _backend_end_run(self, run_id: str, status: str) -> None:
        self._get(run_id).status = status

    def _backend_log_params(self, run_id: str, params: dict[str, str]) -> None:
        self._maybe_fail("log_params")
        run = self._get(run_id)
        for k, v in params.items():
            if k in run.params and run.params[k] != v:
                raise ValueError(f"param {k!r} already logged with a different value (params are immutable)")
        run.params.update(params)

    def _backend_log_metrics(self, run_id: str, metrics: dict[str, float], step: int | None) -> None:
        self._maybe_fail("log_metrics")
        run = self._get(run_id)
        with self._rec_lock:
            run.metric_log.extend(RecordedMetric(k, v, step) for k, v in metrics.items())

    def _backend_log_artifact(self, run_id: str, path: Path, artifact_path: str | None) -> None:
        self._maybe_fail("log_artifact")
        key = f"{artifact_path.rstrip('/')}/{path.name}" if artifact_path else path.name
        self._get(run_id).artifacts[key] = path.read_bytes()

    def _backend_log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self._maybe_fail("log_text")
        self._get(run_id).artifacts[artifact_file] = text

    def _backend_log_dict(self, run_id: str, data: dict[str, Any], artifact_file: str) -> None:
        self._maybe_fail("log_dict")
        self._get(run_id).artifacts[artifact_file] = json.dumps(data, sort_keys=True, default=str)

    def _backend_log_episode(self, run_id: str, record: EpisodeRecord) -> str:
        self._maybe_fail("log_episode")
        run = self._get(run_id)
        with self._rec_lock:
            run.episodes.append(record)
            return f"{run_id}-trace-{len(run.episodes)}"
