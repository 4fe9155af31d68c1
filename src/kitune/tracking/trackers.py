r"""Experiment tracking: :class:`NullTracker` and :class:`MlflowTracker`, the loop's trackers.

Both implement :class:`kitune.optimizers.protocols.Tracker`, which is declared at the loop's
layer (its user) so the optimizers never import this one; import the protocol from there.

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

import logging
from typing import Any

from kitune.evaluation.comparison import RunComparison
from kitune.optimizers.protocols import Tracker
from kitune.tracking.episodes import EpisodeRecord, StepSpan, episode_record
from kitune.tracking.mlflow_tracker import (
    MlflowTracker,
    artifact_dir_for_uri,
    disable_mlflow_telemetry,
    prepare_mlflow_env,
)
from kitune.tracking.tracker_base import (
    MAX_PARAM_CHARS,
    BaseTracker,
    NullTracker,
    PreparedParams,
    prepare_params,
    sanitize_name,
)

__all__ = [
    "MAX_PARAM_CHARS",
    "BaseTracker",
    "EpisodeRecord",
    "MlflowTracker",
    "NullTracker",
    "PreparedParams",
    "StepSpan",
    "artifact_dir_for_uri",
    "create_tracker",
    "disable_mlflow_telemetry",
    "episode_record",
    "log_comparison",
    "prepare_mlflow_env",
    "prepare_params",
    "sanitize_name",
]

logger = logging.getLogger(__name__)


def log_comparison(
    tracker: Tracker,
    comparison: RunComparison,
    prefix: str,
    *,
    step: int | None = None,
    run_id: str | None = None,
) -> dict[str, float]:
    """Log a run-to-run comparison: flip counts and token-delta totals as metrics, details as JSON.

    Metrics (``<prefix>_…``): ``flips_fixed``, ``flips_broken``, ``flips_net``,
    ``flips_still_correct``, ``flips_still_wrong``, ``flips_not_compared``,
    ``more_expensive`` (questions whose input tokens grew) and ``token_delta`` (sum of the
    per-question deltas). Artefact ``<prefix>/comparison.json``: the fixed/broken ids and every
    question's token delta with its reasons (see :mod:`kitune.evaluation.comparison`).

    Args:
        tracker: where to log.
        comparison: from :func:`kitune.evaluation.comparison.compare_runs`.
        prefix: metric prefix and artefact folder, e.g. ``tune`` or ``baseline_vs_in_context``.
        step: metric step (e.g. the iteration).
        run_id: explicit run (else the current one).

    Returns:
        The metrics logged (unprefixed names → values).
    """
    counts = comparison.flips.counts
    metrics = {
        **{f"flips_{k}": float(v) for k, v in counts.items()},
        "flips_net": float(comparison.flips.net),
        "more_expensive": float(len(comparison.more_expensive)),
        "token_delta": float(sum(d.delta for d in comparison.deltas)),
    }
    tracker.log_metrics({f"{prefix}_{k}": v for k, v in metrics.items()}, step=step, run_id=run_id)
    tracker.log_dict(comparison.to_dict(), f"{prefix}/comparison.json", run_id=run_id)
    return metrics


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
