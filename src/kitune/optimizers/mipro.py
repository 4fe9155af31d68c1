"""MIPROv2 (selectable with ``--optimizer mipro``): proposed instructions searched with Bayesian optimisation.

:class:`MiproOptimizer` implements :class:`kitune.optimizers.base.Optimizer` over
``dspy.MIPROv2`` (dspy 3.4) for instructions only (no few-shot demos, so the saved program
state stays a prompt). The feedback metric is reduced to its score
(:func:`kitune.optimizers.tasks.as_float_metric`). The proposer LM is the ``reflection`` role.
Budget: ``num_candidates`` instructions proposed per predictor and ``num_trials`` evaluations
of a candidate on a minibatch of the validation set; the seed comes from the ``random.Random``
passed in.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import dspy

from kitune.optimizers.base import (
    CandidateScore,
    OptimizationResult,
    check_metric,
    check_metric_returns,
    compile_copy,
    get_candidate,
    require_reflection_lm,
    require_sets,
)
from kitune.optimizers.budget import OptimizerBudget
from kitune.optimizers.tasks import as_float_metric

__all__ = ["DEFAULT_TRIALS", "MiproOptimizer", "make_mipro"]

DEFAULT_TRIALS = 8
"""Trials when the budget leaves ``max_metric_calls`` unset."""


class MiproOptimizer:
    """``dspy.MIPROv2`` (instructions only) behind the :class:`~kitune.optimizers.base.Optimizer` protocol.

    Args:
        metric: a feedback metric (``.score`` is used) or a float metric, 0.0–1.0.
        prompt_lm: the ``dspy.LM`` that proposes instructions (the ``reflection`` role).
        num_candidates: instructions proposed per predictor, ≥ 1.
        num_trials: candidate evaluations (Bayesian optimisation trials), ≥ 1.
        rng: seeds MIPROv2 (``rng.randrange(2**31)``); default ``random.Random(0)``.
        minibatch_size: validation examples per trial when the valset is larger.
        num_threads: parallel example evaluations.

    Raises:
        ConfigError: ``metric`` cannot take ``(gold, pred, trace)``, or ``prompt_lm`` is None
            (DSPy would propose with the task LM).
        ValueError: ``num_candidates`` or ``num_trials`` below 1.
    """

    name = "mipro"

    def __init__(
        self,
        metric: Callable[..., Any],
        *,
        prompt_lm: Any,
        num_candidates: int = 3,
        num_trials: int = 4,
        rng: random.Random | None = None,
        minibatch_size: int = 8,
        num_threads: int = 1,
    ) -> None:
        if num_candidates < 1 or num_trials < 1:
            raise ValueError(
                f"num_candidates and num_trials must be >= 1, got {num_candidates}, {num_trials}"
            )
        check_metric("MIPROv2", metric, "(gold, pred, trace)")
        self.raw_metric = metric
        self.metric = as_float_metric(metric)
        self.prompt_lm = require_reflection_lm("MIPROv2", prompt_lm)
        self.num_candidates = num_candidates
        self.num_trials = num_trials
        self.rng = rng or random.Random(0)
        self.minibatch_size = minibatch_size
        self.num_threads = num_threads

    def compile(self, program: Any, *, trainset: Sequence[Any], valset: Sequence[Any]) -> OptimizationResult:
        """Run MIPROv2 on ``program`` (a copy is returned; the input is unchanged).

        Raises:
            OptimizationError: empty ``trainset``/``valset`` or MIPROv2 failed to run.
            ConfigError: the metric returns neither a number nor an object with a numeric ``score``
                (checked once on the first validation example before MIPROv2 starts).
        """
        require_sets("MIPROv2", trainset, valset)
        check_metric_returns("MIPROv2", self.raw_metric, program, valset[0], arguments=3)
        baseline = get_candidate(program)
        seed = self.rng.randrange(2**31)
        optimizer = dspy.MIPROv2(
            metric=self.metric,
            prompt_model=self.prompt_lm,
            auto=None,
            num_candidates=self.num_candidates,
            max_bootstrapped_demos=0,
            max_labeled_demos=0,
            num_threads=self.num_threads,
            seed=seed,
            verbose=False,
            track_stats=True,
        )
        best = compile_copy(
            "MIPROv2",
            program,
            lambda copied: optimizer.compile(
                copied,
                trainset=list(trainset),
                valset=list(valset),
                num_trials=self.num_trials,
                minibatch=len(valset) > self.minibatch_size,
                minibatch_size=self.minibatch_size,
                program_aware_proposer=False,
                data_aware_proposer=False,
                fewshot_aware_proposer=False,
                requires_permission_to_run=False,
                seed=seed,
            ),
        )
        trials = list(getattr(best, "trial_logs", {}).values()) if hasattr(best, "trial_logs") else []
        history: list[CandidateScore] = []
        for t in trials:
            prog = t.get("full_eval_program") or t.get("program")
            score = t.get("full_eval_score")
            if prog is not None and score is not None:
                history.append(CandidateScore(get_candidate(prog), float(score) / 100.0))
        best_score = float(getattr(best, "score", 0.0) or 0.0) / 100.0  # dspy reports percent
        baseline_score = history[0].score if history else None
        for attr in (
            "trial_logs",
            "candidate_programs",
            "mb_candidate_programs",
            "prompt_model_total_calls",
            "total_calls",
            "score",
        ):
            if hasattr(best, attr):
                delattr(best, attr)  # not JSON state; keep program.save() clean
        return OptimizationResult(
            program=best,
            best_candidate=get_candidate(best),
            best_score=best_score,
            baseline_candidate=baseline,
            baseline_score=baseline_score,
            metric_calls=len(trials),
            history=tuple(history),
            details={
                "optimizer": "mipro",
                "num_candidates": self.num_candidates,
                "num_trials": self.num_trials,
            },
        )


def make_mipro(
    metric: Callable[..., Any],
    *,
    reflection_lm: Any,
    budget: OptimizerBudget,
    rng: random.Random,
    input_tokens: Callable[[], int] | None = None,
) -> MiproOptimizer:
    """The ``mipro`` entry of the optimiser registry: :class:`MiproOptimizer` from one budget.

    ``max_metric_calls`` trials (unset: :data:`DEFAULT_TRIALS`), 3 candidates, ``threads``; no
    time or token cap.
    """
    return MiproOptimizer(
        metric,
        prompt_lm=reflection_lm,
        num_trials=budget.max_metric_calls or DEFAULT_TRIALS,
        rng=rng,
        num_threads=budget.threads,
    )


PLUGINS = {"mipro": make_mipro}
"""This module's optimiser, registered by :data:`kitune.optimizers.registry.OPTIMIZERS` on first use."""
