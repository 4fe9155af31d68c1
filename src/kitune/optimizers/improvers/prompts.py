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
``_proposals`` (GEPA), plus the task's own setup measures (``_examples``, ``_pareto`` …); notes:
``<program>_stop_reason`` (why no proposal was made, when none was), ``<program>_candidates``
(every candidate GEPA scored on its Pareto set: score, metric calls, instruction) and
``reflection_model`` when no reflection model is configured. GEPA's trainset and Pareto set:
:func:`split_examples`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import dspy

from kitune.errors import OptimizationError
from kitune.optimizers.base import OptimizationResult, Optimizer
from kitune.optimizers.budget import OptimizerBudget
from kitune.optimizers.gepa import pareto_size
from kitune.optimizers.improve_env import ImproveEnv, ImproveInput, Improvement
from kitune.optimizers.program_spec import TaskSetup
from kitune.optimizers.program_task import get_program_task
from kitune.optimizers.registry import make_optimizer

__all__ = ["PromptOptimization", "make_program_optimizer", "optimize_program", "split_examples"]


def make_program_optimizer(env: ImproveEnv, inp: ImproveInput, metric: Callable[..., Any]) -> Optimizer:
    """The optimiser ``--optimizer`` names, with the iteration's budget, seeded from ``env.rng``.

    Token caps (``optimize.max_input_tokens``) count the environment's token ledger.
    """
    return make_optimizer(
        inp.options.optimizer,
        metric,
        reflection_lm=inp.lms["reflection"],
        budget=inp.budget,
        rng=random.Random(env.rng.randrange(2**31)),
        input_tokens=env.input_tokens_used,
    )


def optimize_program(
    env: ImproveEnv, program: str, inp: ImproveInput, *, setup_metrics: dict[str, float] | None = None
) -> OptimizationResult | None:
    """Run the optimiser on one program's task; None when the task has no examples this iteration.

    The examples are split by :func:`split_examples` (the loop's own validation split guards
    over-fitting). The module runs on the task's LM role. The task's own measures
    (:attr:`~kitune.optimizers.program_task.TaskSetup.metrics`) are copied into ``setup_metrics``.

    Raises:
        ConfigError: unknown program, or the optimiser refused its metric, LM or budget.
        OptimizationError: the optimiser failed.
    """
    task = get_program_task(program)
    env.log(f"optimise {program} with {inp.options.optimizer} (iteration {inp.iteration})")
    setup = task.setup(env, inp)
    if setup is not None and setup_metrics is not None:
        setup_metrics.update(setup.metrics)
    if setup is None or not setup.examples:
        env.log(f"{program}: no examples this iteration, skipped")
        return None
    train, val = split_examples(setup, inp.budget, max_pareto=inp.cfg.optimize.max_pareto_examples)
    env.log(f"{program}: {len(train)} training and {len(val)} Pareto examples")
    with dspy.context(lm=inp.lms[task.lm_role]):
        return make_program_optimizer(env, inp, setup.metric).compile(
            setup.module, trainset=train, valset=val
        )


def split_examples(
    setup: TaskSetup, budget: OptimizerBudget, *, max_pareto: int
) -> tuple[list[Any], list[Any]]:
    """GEPA's trainset and Pareto (validation) set for one task, from the iteration's budget.

    With ``setup.valset`` given: the trainset is ``setup.examples`` and the Pareto set
    :func:`~kitune.optimizers.gepa.pareto_size` examples of ``setup.valset`` (at most
    ``optimize.max_pareto_examples``, fewer when a set ``max_metric_calls`` cannot pay for
    ``optimize.min_proposals`` proposals with more). When the trainset is a strict subset of the
    valset (the stage tasks train on the examples the current instruction gets wrong,
    :func:`~kitune.optimizers.stage_tasks.imperfect`), the Pareto set takes up to half of its
    places from the trainset, in trainset order, and fills the rest in valset order: GEPA keeps a
    proposal only when it beats its parent on the Pareto set, so a Pareto set of examples the
    current instruction already gets right lets a proposal at best tie it (``loop-dev-48``,
    iteration 0: the extractor's 4 imperfect documents were none of the first 6 of 24, the seed
    scored 1.000 and no proposal could win). Without a valset: with 4 or more examples the first
    half proposes and the second half scores, else all of them do both; the second half is capped
    the same way.
    """
    examples = list(setup.examples)
    if setup.valset is not None:
        train, candidates = examples, list(setup.valset)
    else:
        half = len(examples) // 2
        train, candidates = (examples[:half], examples[half:]) if len(examples) >= 4 else (examples, examples)
    n = max(
        pareto_size(
            len(candidates),
            cap=max_pareto,
            max_metric_calls=budget.max_metric_calls,
            minibatch=budget.reflection_minibatch_size,
            proposals=budget.min_proposals,
        ),
        1,
    )
    if setup.valset is None or len(train) >= len(candidates):
        return train, candidates[:n]
    in_valset = {id(ex) for ex in candidates}
    first = [ex for ex in train if id(ex) in in_valset][: (n + 1) // 2]
    chosen = {id(ex) for ex in first}
    return train, first + [ex for ex in candidates if id(ex) not in chosen][: n - len(first)]


class PromptOptimization:
    """The ``prompts`` improver (see the module docstring)."""

    name = "prompts"

    def improve(self, env: ImproveEnv, inp: ImproveInput) -> Improvement:
        """Optimise each tuned program's instruction; propose the improved ones."""
        out = Improvement()
        for program in inp.options.programs:
            current = inp.setting.prompts.get(program)
            if current is None:
                continue
            setup_metrics: dict[str, float] = {}
            try:
                result = optimize_program(env, program, inp, setup_metrics=setup_metrics)
            except OptimizationError as e:  # one program's failure never sinks the iteration
                out.notes[f"{program}_error"] = str(e)[:1000]
                out.metrics[f"{program}_failed"] = 1.0
                env.log(f"[yellow]{program}: optimisation skipped: {e}[/]")
                continue
            finally:
                out.metrics.update({f"{program}_{k}": v for k, v in setup_metrics.items()})
            if result is None:
                continue
            new_text = result.best_candidate.get(get_program_task(program).predictor, current)
            out.metrics[f"{program}_metric_calls"] = float(result.metric_calls)
            out.metrics[f"{program}_best_score"] = result.best_score
            if result.baseline_score is not None:
                out.metrics[f"{program}_baseline_score"] = result.baseline_score
            out.notes[f"{program}_stop_reason"] = result.stop_reason
            predictor = get_program_task(program).predictor
            out.notes[f"{program}_candidates"] = [
                {
                    "score": c.score,
                    "metric_calls": c.metric_calls,
                    "instruction": c.candidate.get(predictor, ""),
                }
                for c in result.history
            ]
            if inp.reflection_note:
                out.notes["reflection_model"] = inp.reflection_note
            if "proposals" in result.details:
                out.metrics[f"{program}_proposals"] = float(result.details["proposals"])
            if result.stop_reason:
                env.log(f"{program}: {result.stop_reason}")
            if result.improved and new_text.strip():
                out.prompts[program] = new_text
                out.programs[program] = result.program
        return out


PROMPTS = PromptOptimization()

PLUGINS = {PROMPTS.name: PROMPTS}
"""This module's improver, registered by :data:`kitune.optimizers.improver.IMPROVERS`."""
