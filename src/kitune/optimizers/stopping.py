"""Stop conditions for GEPA: gepa's own, plus the one it lacks — a cap on input tokens from the token ledger.

gepa ships the stop conditions (``gepa.utils.stop_condition``): ``TimeoutStopCondition``,
``MaxMetricCallsStopper`` (gepa adds it itself from ``max_metric_calls``),
``NoImprovementStopper``, ``ScoreThresholdStopper``, ``FileStopper`` … kitune uses them as they
are. It adds :class:`MaxInputTokens`, which reads the input tokens the run has spent from a
callable — the loop passes the token ledger's total (task and reflection calls go through
``KituneLM``, which records every call) — and :class:`StopLog`, which runs the stoppers for
``dspy.GEPA(gepa_kwargs={"stop_callbacks": [...]})`` and remembers which one fired, so the
result's ``stop_reason`` names it (:func:`describe`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gepa.utils.stop_condition import (
    MaxMetricCallsStopper,
    NoImprovementStopper,
    ScoreThresholdStopper,
    StopperProtocol,
    TimeoutStopCondition,
)

__all__ = [
    "MaxInputTokens",
    "MaxMetricCallsStopper",
    "NoImprovementStopper",
    "StopLog",
    "StopperProtocol",
    "TimeoutStopCondition",
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


class StopLog:
    """Runs stop conditions in order for gepa and remembers the first that fired.

    Args:
        stoppers: gepa ``StopperProtocol`` objects (``(state) -> bool``).

    Attributes:
        reason: :func:`describe` of the stopper that fired, None while none has.
    """

    def __init__(self, *stoppers: StopperProtocol) -> None:
        self.stoppers = stoppers
        self.reason: str | None = None

    def __call__(self, gepa_state: Any) -> bool:
        """True when any stopper fires (gepa checks this before every iteration)."""
        for stopper in self.stoppers:
            if stopper(gepa_state):
                self.reason = describe(stopper)
                return True
        return False
