"""Stop conditions for GEPA: gepa's own, plus the one it lacks — a cap on input tokens from the token ledger.

gepa ships the stop conditions (``gepa.utils.stop_condition``): ``TimeoutStopCondition``,
``MaxMetricCallsStopper`` (gepa adds it itself from ``max_metric_calls``),
``NoImprovementStopper``, ``ScoreThresholdStopper``, ``FileStopper`` … kitune uses them as they
are. It adds :class:`MaxInputTokens`, which reads the input tokens the run has spent from a
callable — the loop passes the token ledger's total (task and reflection calls go through
``KituneLM``, which records every call). :func:`combine` joins the stoppers with gepa's own
``CompositeStopper`` for ``dspy.GEPA(gepa_kwargs={"stop_callbacks": [...]})``, each one noting in
a :class:`StopReason` when it fires, so the result's ``stop_reason`` names it (:func:`describe`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gepa.utils.stop_condition import (
    CompositeStopper,
    MaxMetricCallsStopper,
    NoImprovementStopper,
    ScoreThresholdStopper,
    StopperProtocol,
    TimeoutStopCondition,
)

__all__ = [
    "CompositeStopper",
    "MaxInputTokens",
    "MaxMetricCallsStopper",
    "NoImprovementStopper",
    "StopReason",
    "StopperProtocol",
    "TimeoutStopCondition",
    "combine",
    "describe",
    "restart",
]


class MaxInputTokens:
    """Stop once the run has spent ``limit`` input tokens (counted from :meth:`restart`).

    Args:
        limit: input tokens, ≥ 1.
        input_tokens: the running total of input tokens (e.g. ``lambda:
            ledger.totals()["input_tokens"]`` on the loop's :class:`~kitune.usage.TokenLedger`).

    Raises:
        ValueError: ``limit`` below 1.
    """

    def __init__(self, limit: int, input_tokens: Callable[[], int]) -> None:
        if limit < 1:
            raise ValueError(f"MaxInputTokens limit must be >= 1, got {limit}")
        self.limit = limit
        self._input_tokens = input_tokens
        self._start = int(input_tokens())

    def restart(self) -> None:
        """Count from now (a compile starts)."""
        self._start = int(self._input_tokens())

    @property
    def spent(self) -> int:
        """Input tokens spent since :meth:`restart`."""
        return int(self._input_tokens()) - self._start

    def __call__(self, gepa_state: Any) -> bool:
        """True once :attr:`spent` reaches :attr:`limit`."""
        return self.spent >= self.limit


def restart(stopper: Any) -> None:
    """Start a stopper's clock or counter again (timeouts and token caps; others are stateless here)."""
    if isinstance(stopper, TimeoutStopCondition):
        stopper.start_time = time.time()
    elif isinstance(stopper, MaxInputTokens):
        stopper.restart()


def describe(stopper: Any) -> str:
    """A short reason for a stop condition, e.g. ``"timeout after 120 s"``, ``"input tokens >= 5000"``."""
    if isinstance(stopper, TimeoutStopCondition):
        return f"timeout after {stopper.timeout_seconds:g} s"
    if isinstance(stopper, MaxMetricCallsStopper):
        return f"metric calls >= {stopper.max_metric_calls}"
    if isinstance(stopper, MaxInputTokens):
        return f"input tokens >= {stopper.limit}"
    if isinstance(stopper, NoImprovementStopper):
        return f"no improvement for {stopper.max_iterations_without_improvement} iterations"
    if isinstance(stopper, ScoreThresholdStopper):
        return f"validation score >= {stopper.threshold:g}"
    return type(stopper).__name__


class StopReason:
    """Which stop condition of :func:`combine` fired (:func:`describe` of it; None while none has)."""

    def __init__(self) -> None:
        self.text: str | None = None


def combine(*stoppers: StopperProtocol) -> tuple[CompositeStopper, StopReason]:
    """Gepa's ``CompositeStopper`` over ``stoppers`` (any fires → stop), and what fired.

    Each stopper is checked in order (``any`` stops at the first that fires) and, when it fires,
    writes :func:`describe` of itself into the returned :class:`StopReason`.
    """
    reason = StopReason()
    return CompositeStopper(*(_Noting(s, reason) for s in stoppers), mode="any"), reason


class _Noting:
    """One stopper that writes :func:`describe` of itself into ``reason`` when it fires."""

    def __init__(self, stopper: StopperProtocol, reason: StopReason) -> None:
        self.stopper = stopper
        self.reason = reason

    def __call__(self, gepa_state: Any) -> bool:
        if self.stopper(gepa_state):
            self.reason.text = describe(self.stopper)
            return True
        return False
