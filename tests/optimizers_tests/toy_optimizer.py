"""A toy optimiser added by this one file: importing it registers ``toy`` in the optimiser registry.

It proposes one fixed instruction for the first predictor of whatever program it is given (the
extractor's ``extract``), scores it 1.0 against a baseline of 0.0, and records what it was built
with, so tests can see the loop and the CLI pick it by name.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from kitune.optimizers.base import OptimizationResult, apply_candidate, get_candidate
from kitune.optimizers.budget import OptimizerBudget
from kitune.optimizers.registry import register_optimizer

TOY_INSTRUCTION = "Extract every fact of the document, with the DATES of every event."
BUILT: list[OptimizerBudget] = []
"""The budget of every toy optimiser built, in order."""
COUNTERS: list[Callable[[], int] | None] = []
"""The ``input_tokens`` counter each toy optimiser was given, in order."""


class ToyOptimizer:
    name = "toy"

    def __init__(self, budget: OptimizerBudget) -> None:
        self.budget = budget

    def compile(self, program: Any, *, trainset: Sequence[Any], valset: Sequence[Any]) -> OptimizationResult:
        baseline = get_candidate(program)
        first = next(iter(baseline))
        best = apply_candidate(program, {first: TOY_INSTRUCTION})
        return OptimizationResult(
            program=best,
            best_candidate=get_candidate(best),
            best_score=1.0,
            baseline_candidate=baseline,
            baseline_score=0.0,
            metric_calls=len(valset),
            stop_reason="toy: one fixed proposal",
        )


@register_optimizer("toy")
def make_toy(
    metric: Callable[..., Any],
    *,
    reflection_lm: Any,
    budget: OptimizerBudget,
    rng: random.Random,
    input_tokens: Callable[[], int] | None = None,
) -> ToyOptimizer:
    BUILT.append(budget)
    COUNTERS.append(input_tokens)
    return ToyOptimizer(budget)
