"""Composable stop conditions for the optimisation loop (after gepa's ``utils/stop_condition.py``).

A stopper looks at an :class:`OptimizationProgress` snapshot and answers "stop now?". Combine
them with :class:`AnyOf` (or ``a | b``); :func:`stop_reason` says which one fired. Stoppers are
pure functions of the snapshot except :class:`Timeout`, which reads a clock (injectable for
tests).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "AnyOf",
    "GepaStopper",
    "MaxCostUsd",
    "MaxInputTokens",
    "MaxMetricCalls",
    "NoImprovement",
    "OptimizationProgress",
    "Stopper",
    "Timeout",
    "as_gepa_stopper",
    "stop_reason",
]


@dataclass(frozen=True)
class OptimizationProgress:
    """What the loop has spent and achieved so far (a snapshot; the loop builds a new one each time)."""

    metric_calls: int = 0
    """Metric calls so far (one per example evaluated), ≥ 0."""
    cost_usd: float = 0.0
    """Provider cost so far in USD, ≥ 0 (0.0 when unknown)."""
    input_tokens: int = 0
    """Input tokens so far, all roles."""
    scores: tuple[float, ...] = ()
    """Validation score after each iteration, oldest first; higher is better."""

    @property
    def iteration(self) -> int:
        """Number of completed iterations (``len(scores)``)."""
        return len(self.scores)

    @property
    def best_score(self) -> float | None:
        """Best validation score so far, or None before the first iteration."""
        return max(self.scores) if self.scores else None


@runtime_checkable
class Stopper(Protocol):
    """Answers whether the optimisation should stop."""

    def __call__(self, progress: OptimizationProgress) -> bool:
        """True when the run should stop now."""
        ...

    def describe(self) -> str:
        """A short human reason, e.g. ``"metric calls >= 200"``."""
        ...


class _Composable:
    def __or__(self, other: Stopper) -> AnyOf:
        return AnyOf(self, other)  # type: ignore[arg-type]


@dataclass(frozen=True)
class MaxMetricCalls(_Composable):
    """Stop once ``progress.metric_calls >= limit``."""

    limit: int

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"MaxMetricCalls limit must be >= 1, got {self.limit}")

    def __call__(self, progress: OptimizationProgress) -> bool:
        """See :class:`Stopper`."""
        return progress.metric_calls >= self.limit

    def describe(self) -> str:
        """See :class:`Stopper`."""
        return f"metric calls >= {self.limit}"


@dataclass(frozen=True)
class MaxCostUsd(_Composable):
    """Stop once ``progress.cost_usd >= limit_usd``."""

    limit_usd: float

    def __post_init__(self) -> None:
        if not self.limit_usd > 0:
            raise ValueError(f"MaxCostUsd limit_usd must be > 0, got {self.limit_usd}")

    def __call__(self, progress: OptimizationProgress) -> bool:
        """See :class:`Stopper`."""
        return progress.cost_usd >= self.limit_usd

    def describe(self) -> str:
        """See :class:`Stopper`."""
        return f"cost >= ${self.limit_usd:g}"


@dataclass(frozen=True)
class MaxInputTokens(_Composable):
    """Stop once ``progress.input_tokens >= limit``."""

    limit: int

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"MaxInputTokens limit must be >= 1, got {self.limit}")

    def __call__(self, progress: OptimizationProgress) -> bool:
        """See :class:`Stopper`."""
        return progress.input_tokens >= self.limit

    def describe(self) -> str:
        """See :class:`Stopper`."""
        return f"input tokens >= {self.limit}"


@dataclass(frozen=True)
class NoImprovement(_Composable):
    """Stop after ``patience`` iterations in a row that did not beat the earlier best by ``min_delta``.

    Pure: computed from ``progress.scores``. With scores ``[0.5, 0.6, 0.6, 0.55]`` and
    ``patience=2`` it stops (the last two did not exceed 0.6).
    """

    patience: int
    min_delta: float = 0.0

    def __post_init__(self) -> None:
        if self.patience < 1:
            raise ValueError(f"NoImprovement patience must be >= 1, got {self.patience}")
        if self.min_delta < 0:
            raise ValueError(f"NoImprovement min_delta must be >= 0, got {self.min_delta}")

    def __call__(self, progress: OptimizationProgress) -> bool:
        """See :class:`Stopper`."""
        scores = progress.scores
        if len(scores) <= self.patience:
            return False
        best_before = max(scores[: -self.patience])
        return all(not (s > best_before + self.min_delta) for s in scores[-self.patience :])

    def describe(self) -> str:
        """See :class:`Stopper`."""
        return f"no improvement for {self.patience} iterations"


class Timeout(_Composable):
    """Stop once ``seconds`` of wall time have passed since construction (or :meth:`reset`).

    Args:
        seconds: the budget, > 0.
        clock: a monotonic clock returning seconds (injectable for tests).
    """

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        if not seconds > 0 or math.isinf(seconds):
            raise ValueError(f"Timeout seconds must be a finite number > 0, got {seconds}")
        self.seconds = seconds
        self._clock = clock
        self._start = clock()

    def reset(self) -> None:
        """Restart the clock (e.g. when a resumed run starts)."""
        self._start = self._clock()

    @property
    def elapsed_s(self) -> float:
        """Seconds since the start."""
        return self._clock() - self._start

    def __call__(self, progress: OptimizationProgress) -> bool:
        """See :class:`Stopper`."""
        return self.elapsed_s >= self.seconds

    def describe(self) -> str:
        """See :class:`Stopper`."""
        return f"timeout after {self.seconds:g} s"


class AnyOf(_Composable):
    """Stop when any of ``stoppers`` says stop (all of them are evaluated, in order)."""

    def __init__(self, *stoppers: Stopper) -> None:
        if not stoppers:
            raise ValueError("AnyOf needs at least one stopper")
        flat: list[Stopper] = []
        for s in stoppers:
            flat.extend(s.stoppers if isinstance(s, AnyOf) else (s,))
        self.stoppers: tuple[Stopper, ...] = tuple(flat)

    def __call__(self, progress: OptimizationProgress) -> bool:
        """See :class:`Stopper`."""
        return stop_reason(self, progress) is not None

    def describe(self) -> str:
        """See :class:`Stopper`."""
        return " or ".join(s.describe() for s in self.stoppers)


def stop_reason(stopper: Stopper, progress: OptimizationProgress) -> str | None:
    """The description of the first stopper that fires, or None to keep going.

    For an :class:`AnyOf` this names the member that fired, not the whole disjunction.
    """
    if isinstance(stopper, AnyOf):
        for s in stopper.stoppers:
            if (reason := stop_reason(s, progress)) is not None:
                return reason
        return None
    return stopper.describe() if stopper(progress) else None


class GepaStopper:
    """Adapts a kitune :class:`Stopper` to gepa's ``StopperProtocol`` (``stop_callbacks=``).

    gepa calls it with its ``GEPAState``; the progress snapshot is built from
    ``state.total_num_evals`` (metric calls) and ``state.program_full_scores_val_set`` (the
    validation score of each candidate so far, used as ``scores``). Cost and tokens come from
    the callables given (e.g. a usage ledger), 0 by default. :attr:`reason` holds the
    description of the stopper that fired.
    """

    def __init__(
        self,
        stopper: Stopper,
        *,
        cost_usd: Callable[[], float] = lambda: 0.0,
        input_tokens: Callable[[], int] = lambda: 0,
    ) -> None:
        self.stopper = stopper
        self._cost_usd = cost_usd
        self._input_tokens = input_tokens
        self.reason: str | None = None

    def progress(self, gepa_state: object) -> OptimizationProgress:
        """The snapshot for ``gepa_state`` (missing attributes read as 0 / no scores)."""
        scores = getattr(gepa_state, "program_full_scores_val_set", None) or []
        return OptimizationProgress(
            metric_calls=int(getattr(gepa_state, "total_num_evals", 0) or 0),
            cost_usd=float(self._cost_usd()),
            input_tokens=int(self._input_tokens()),
            scores=tuple(float(x) for x in scores),
        )

    def __call__(self, gepa_state: object) -> bool:
        """True when the wrapped stopper fires; sets :attr:`reason`."""
        self.reason = stop_reason(self.stopper, self.progress(gepa_state))
        return self.reason is not None


def as_gepa_stopper(
    stopper: Stopper,
    *,
    cost_usd: Callable[[], float] = lambda: 0.0,
    input_tokens: Callable[[], int] = lambda: 0,
) -> GepaStopper:
    """Wrap ``stopper`` for ``dspy.GEPA(gepa_kwargs={"stop_callbacks": [...]})``; see :class:`GepaStopper`."""
    return GepaStopper(stopper, cost_usd=cost_usd, input_tokens=input_tokens)
