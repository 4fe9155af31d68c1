"""One budget object for every optimiser: :class:`OptimizerBudget`.

Each registered optimiser factory (:mod:`kitune.optimizers.registry`) reads what it needs from
it: GEPA the metric calls, minutes, threads, the reflection window and the minimum number of
proposals; MIPROv2 the trials and threads. The service layer builds it once per loop from the
config and the command's options (``optimize.max_metric_calls`` / ``--max-metric-calls``,
``--budget-minutes``, ``KituneConfig.concurrency_for("optimizer")``, ``lm.reflection.max_tokens``,
``optimize.min_proposals``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kitune.errors import ConfigError

__all__ = ["OptimizerBudget"]


@dataclass(frozen=True)
class OptimizerBudget:
    """What one optimiser run may spend, and how.

    Raises:
        ConfigError: a value out of range (the message names the field and the fix).
    """

    max_metric_calls: int | None = None
    """GEPA: metric calls (one call = one example run by the program and scored); MIPROv2:
    trials. None: sized automatically — GEPA the smallest budget that makes
    ``min_proposals`` proposals on the run's split sizes, MIPROv2 its default trials."""
    minutes: float | None = None
    """Wall-clock cap of one run (a timeout stopper); None: none."""
    threads: int = 1
    """Metric calls run in parallel (``num_threads``), ≥ 1."""
    reflection_context_tokens: int | None = None
    """The reflection model's context window in tokens (reflection prompts are sized to it);
    None: unknown, bounded by GEPA's ``DEFAULT_REFLECTION_CONTEXT_TOKENS`` (8192)."""
    reflection_max_tokens: int = 1024
    """The reflection reply's token cap (reserved when sizing), ≥ 1."""
    min_proposals: int = 1
    """GEPA refuses a budget that cannot pay for this many proposals, ≥ 1."""
    reflection_minibatch_size: int = 2
    """GEPA: training examples shown per proposal (each proposal evaluates the parent and the
    child on them), ≥ 1."""
    max_input_tokens: int | None = None
    """Stop once the run's input tokens (task + reflection, from the token ledger) reach this;
    None: no token cap."""

    def __post_init__(self) -> None:
        checks = (
            (
                "max_metric_calls",
                self.max_metric_calls is None or self.max_metric_calls >= 1,
                ">= 1 or unset",
            ),
            (
                "minutes",
                self.minutes is None or (self.minutes > 0 and math.isfinite(self.minutes)),
                "a finite number > 0 or unset",
            ),
            ("threads", self.threads >= 1, ">= 1"),
            (
                "reflection_context_tokens",
                self.reflection_context_tokens is None or self.reflection_context_tokens >= 1,
                ">= 1 or unset",
            ),
            ("reflection_max_tokens", self.reflection_max_tokens >= 1, ">= 1"),
            ("min_proposals", self.min_proposals >= 1, ">= 1"),
            ("reflection_minibatch_size", self.reflection_minibatch_size >= 1, ">= 1"),
            (
                "max_input_tokens",
                self.max_input_tokens is None or self.max_input_tokens >= 1,
                ">= 1 or unset",
            ),
        )
        for name, ok, want in checks:
            if not ok:
                raise ConfigError(f"optimizer budget {name}={getattr(self, name)!r}: use {want}")

    def with_(self, **changes: object) -> OptimizerBudget:
        """A copy with ``changes`` applied (validated again)."""
        return replace(self, **changes)  # type: ignore[arg-type]
