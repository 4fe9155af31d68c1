"""The agent's budget: a frozen :class:`Budget` value and a mutable :class:`BudgetMeter`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from kitune.config import AgentConfig

__all__ = ["DEFAULT_MAX_TOKENS", "Budget", "BudgetMeter", "CallRules", "ExhaustedBy"]

DEFAULT_MAX_TOKENS = 64_000
"""The default input-token budget per question (``agent.max_tokens``; how it was sized is in
:class:`kitune.config.AgentConfig`)."""

CallRules = Literal["bounded", "legacy"]
"""How the agent bounds repeated and refused calls (``agent.call_rules``): ``bounded`` (issue 39:
repeats answered by a pointer and booked by their tool, identical calls counted across the
episode, repeated refusals end it, the token budget checked before each call, failed calls
answered with a JSON error object); ``legacy`` — the rules before it, only to replay recordings
made with them (every request of such a run must be sent again exactly as recorded)."""

ExhaustedBy = Literal["steps", "tokens", "timeout"]
"""Which budget limit ran out (the agent adds ``"refused"`` when repeated refusals end an episode)."""


@dataclass(frozen=True)
class Budget:
    """Limits on one agent episode (one question).

    Raises:
        ValueError: ``max_steps < 1``, ``max_tokens < 1`` or ``timeout_s <= 0``.
    """

    max_steps: int = 43
    """Model calls that may choose a tool or answer (the force-commit call is extra)."""
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    """Input (prompt) tokens summed over the episode's calls; None: unlimited. The agent also
    stops before a call whose projected prompt would cross it."""
    timeout_s: float | None = None
    """Wall-clock seconds per question; None: unlimited. Checked before each model call."""
    call_rules: CallRules = "bounded"
    """How repeated and refused calls are bounded (see :data:`CallRules`)."""

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"Budget.max_steps must be >= 1, got {self.max_steps}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"Budget.max_tokens must be >= 1 or None, got {self.max_tokens}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"Budget.timeout_s must be > 0 or None, got {self.timeout_s}")
        if self.call_rules not in ("bounded", "legacy"):
            raise ValueError(f"Budget.call_rules must be 'bounded' or 'legacy', got {self.call_rules!r}")

    @classmethod
    def from_config(cls, agent: AgentConfig) -> Budget:
        """Build from ``cfg.agent`` (``max_steps``, ``max_tokens``, ``timeout_s``, ``call_rules``)."""
        return cls(
            max_steps=agent.max_steps,
            max_tokens=agent.max_tokens,
            timeout_s=agent.timeout_s,
            call_rules=agent.call_rules,
        )


class BudgetMeter:
    """Charges steps and tokens against a :class:`Budget`. Not thread-safe (one per episode).

    Args:
        budget: the limits.
        clock: monotonic clock in seconds (injectable for tests).
    """

    def __init__(self, budget: Budget, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self._clock = clock
        self._start = clock()
        self.steps = 0
        self.input_tokens = 0
        self.output_tokens = 0

    def charge(self, *, input_tokens: int, output_tokens: int, step: bool = True) -> None:
        """Record one model call: its tokens and, when ``step``, one step."""
        self.input_tokens += max(0, int(input_tokens))
        self.output_tokens += max(0, int(output_tokens))
        if step:
            self.steps += 1

    @property
    def elapsed_s(self) -> float:
        """Seconds since the meter was created."""
        return self._clock() - self._start

    @property
    def steps_left(self) -> int:
        """Steps remaining (never negative)."""
        return max(0, self.budget.max_steps - self.steps)

    def exhausted_by(self) -> ExhaustedBy | None:
        """Which limit is spent (``"steps"``, ``"tokens"``, ``"timeout"``), or None while any is left."""
        if self.steps >= self.budget.max_steps:
            return "steps"
        if self.budget.max_tokens is not None and self.input_tokens >= self.budget.max_tokens:
            return "tokens"
        if self.budget.timeout_s is not None and self.elapsed_s >= self.budget.timeout_s:
            return "timeout"
        return None
