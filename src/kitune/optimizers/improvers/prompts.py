"""The ``prompts`` improver: the configured optimiser on each tuned program's task.

For every program in ``--programs`` that the setting holds, its
:class:`~kitune.optimizers.program_task.ProgramTask` builds the module, the examples and the stage
metric; the optimiser named by ``--optimizer`` (:mod:`kitune.optimizers.registry`) runs with the
loop's :class:`~kitune.optimizers.budget.OptimizerBudget` on the task's LM role. An improved
instruction (best score above the baseline) is proposed. One program's
:class:`~kitune.errors.OptimizationError` is recorded (``<program>_failed``, ``<program>_error``)
and the others go on; a :class:`~kitune.errors.ConfigError` (a budget too small to propose) stops
the run.

Metrics per program: ``<program>_metric_calls``, ``_best_score``, ``_baseline_score``,
``_proposals`` (GEPA); notes: ``<program>_stop_reason`` (why no proposal was made, when none was)
and ``reflection_model`` when no reflection model is configured.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from kitune.errors import OptimizationError
from kitune.optimizers.base import OptimizationResult, Optimizer
from kitune.optimizers.improve_env import ImproveEnv, ImproveInput
from kitune.optimizers.improver import Improvement, register_improver
from kitune.optimizers.program_task import get_program_task
from kitune.optimizers.registry import make_optimizer

__all__ = ["PromptOptimization", "make_program_optimizer", "optimize_program"]


def make_program_optimizer(env: ImproveEnv, metric: Callable[..., Any]) -> Optimizer:
    """The optimiser ``--optimizer`` names, with the loop's budget, seeded from ``env.rng``.

    Token caps (``optimize.max_input_tokens``) count the environment's token ledger.
    """
    return make_optimizer(
        env.opts.optimizer,
        metric,
        reflection_lm=env.deps.lms["reflection"],
        budget=env.optimizer_budget(),
        rng=random.Random(env.rng.randrange(2**31)),
        input_tokens=env.input_tokens_used,
    )


def optimize_program(env: ImproveEnv, program: str, inp: ImproveInput) -> OptimizationResult | None:
    """Run the optimiser on one program's task; None when the task has no examples this iteration.

    With 4 or more examples the first half proposes and the second half scores, else all of them
    do both (the loop's own validation split guards over-fitting). The module runs on the task's
    LM role.

    Raises:
        ConfigError: unknown program, or the optimiser refused its metric, LM or budget.
        OptimizationError: the optimiser failed.
    """
    import dspy

    task = get_program_task(program)
    env.log(f"optimise {program} with {env.opts.optimizer} (iteration {inp.iteration})")
    setup = task.setup(env, inp)
    if setup is None or not setup.examples:
        env.log(f"{program}: no examples this iteration, skipped")
        return None
    examples = list(setup.examples)
    half = len(examples) // 2
    train, val = (examples[:half], examples[half:]) if len(examples) >= 4 else (examples, examples)
    with dspy.context(lm=env.deps.lms[task.lm_role]):
        return make_program_optimizer(env, setup.metric).compile(setup.module, trainset=train, valset=val)


class PromptOptimization:
    """The ``prompts`` improver (see the module docstring)."""

    name = "prompts"

    def improve(self, env: ImproveEnv, inp: ImproveInput) -> Improvement:
        """Optimise each tuned program's instruction; propose the improved ones."""
        out = Improvement()
        for program in env.opts.programs:
            current = inp.setting.prompts.get(program)
            if current is None:
                continue
            try:
                result = optimize_program(env, program, inp)
            except OptimizationError as e:  # one program's failure never sinks the iteration
                out.notes[f"{program}_error"] = str(e)[:1000]
                out.metrics[f"{program}_failed"] = 1.0
                env.log(f"[yellow]{program}: optimisation skipped: {e}[/]")
                continue
            if result is None:
                continue
            new_text = result.best_candidate.get(get_program_task(program).predictor, current)
            out.metrics[f"{program}_metric_calls"] = float(result.metric_calls)
            out.metrics[f"{program}_best_score"] = result.best_score
            if result.baseline_score is not None:
                out.metrics[f"{program}_baseline_score"] = result.baseline_score
            out.notes[f"{program}_stop_reason"] = result.stop_reason
            if env.reflection_note:
                out.notes["reflection_model"] = env.reflection_note
            if "proposals" in result.details:
                out.metrics[f"{program}_proposals"] = float(result.details["proposals"])
            if result.stop_reason:
                env.log(f"{program}: {result.stop_reason}")
            if result.improved and new_text.strip():
                out.prompts[program] = new_text
                out.programs[program] = result.program
        return out


PROMPTS = register_improver(PromptOptimization())
