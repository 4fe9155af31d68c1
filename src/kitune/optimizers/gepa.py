"""GEPA (the default optimiser): reflective instruction evolution with per-predictor feedback.

:class:`GepaOptimizer` implements :class:`kitune.optimizers.base.Optimizer` over ``dspy.GEPA``
(dspy 3.4). The metric has GEPA's feedback signature (see :mod:`kitune.optimizers.tasks`); the
reflection LM is the ``reflection`` role (``kitune.lm.build_lm(cfg, "reflection")``). Budgets:
``max_metric_calls`` (GEPA's own) plus any kitune :class:`~kitune.optimizers.stopping.Stopper`,
adapted with :func:`~kitune.optimizers.stopping.as_gepa_stopper`. The seed comes from the
``random.Random`` passed in, so the same RNG state and LM replies give the same result.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kitune.optimizers.base import (
    CandidateScore,
    OptimizationResult,
    compile_copy,
    get_candidate,
    require_sets,
)
from kitune.optimizers.stopping import Stopper, as_gepa_stopper

__all__ = ["GepaOptimizer"]


class GepaOptimizer:
    """``dspy.GEPA`` behind the :class:`~kitune.optimizers.base.Optimizer` protocol.

    Args:
        metric: GEPA feedback metric ``(gold, pred, trace, pred_name, pred_trace) ->
            dspy.Prediction(score, feedback)`` or a float, 0.0–1.0.
        reflection_lm: the ``dspy.LM`` that proposes new instructions.
        max_metric_calls: GEPA's budget in metric calls (one call = one example run), ≥ 1.
        rng: seeds GEPA (``rng.randrange(2**31)``); default ``random.Random(0)``.
        stopper: an extra kitune stopper (time, cost, no improvement …).
        reflection_minibatch_size: examples shown to the reflection LM per proposal.
        num_threads: parallel example evaluations.
        use_merge: let GEPA merge candidates.
        log_dir: GEPA's run directory (its own resume state); None: none.
        input_tokens: callable giving input tokens spent so far (for token stoppers).
    """

    name = "gepa"

    def __init__(
        self,
        metric: Callable[..., Any],
        *,
        reflection_lm: Any,
        max_metric_calls: int,
        rng: random.Random | None = None,
        stopper: Stopper | None = None,
        reflection_minibatch_size: int = 2,
        num_threads: int = 1,
        use_merge: bool = False,
        log_dir: Path | None = None,
        input_tokens: Callable[[], int] = lambda: 0,
    ) -> None:
        if max_metric_calls < 1:
            raise ValueError(f"max_metric_calls={max_metric_calls}: allow at least 1")
        self.metric = metric
        self.reflection_lm = reflection_lm
        self.max_metric_calls = max_metric_calls
        self.rng = rng or random.Random(0)
        self.stopper = stopper
        self.reflection_minibatch_size = reflection_minibatch_size
        self.num_threads = num_threads
        self.use_merge = use_merge
        self.log_dir = log_dir
        self.input_tokens = input_tokens

    def compile(self, program: Any, *, trainset: Sequence[Any], valset: Sequence[Any]) -> OptimizationResult:
        """Run GEPA on ``program`` (a copy is returned; the input is unchanged).

        Raises:
            OptimizationError: empty ``trainset``/``valset`` or GEPA failed to run.
        """
        import dspy

        require_sets("GEPA", trainset, valset)
        baseline = get_candidate(program)
        gepa_stopper = as_gepa_stopper(self.stopper, input_tokens=self.input_tokens) if self.stopper else None
        kwargs: dict[str, Any] = {"stop_callbacks": [gepa_stopper]} if gepa_stopper else {}
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        optimizer = dspy.GEPA(
            metric=self.metric,
            max_metric_calls=self.max_metric_calls,
            reflection_lm=self.reflection_lm,
            reflection_minibatch_size=self.reflection_minibatch_size,
            num_threads=self.num_threads,
            use_merge=self.use_merge,
            track_stats=True,
            log_dir=str(self.log_dir) if self.log_dir is not None else None,
            seed=self.rng.randrange(2**31),
            warn_on_score_mismatch=False,
            gepa_kwargs=kwargs,
        )
        best = compile_copy(
            "GEPA",
            program,
            lambda copied: optimizer.compile(copied, trainset=list(trainset), valset=list(valset)),
        )
        details = getattr(best, "detailed_results", None)
        history: tuple[CandidateScore, ...] = ()
        baseline_score: float | None = None
        best_score = 0.0
        calls = 0
        if details is not None:
            scores = [float(s) for s in details.val_aggregate_scores]
            counts = list(details.discovery_eval_counts)
            history = tuple(
                CandidateScore(get_candidate(c), s, int(n))
                for c, s, n in zip(details.candidates, scores, counts, strict=False)
            )
            baseline_score = scores[0] if scores else None
            best_score = scores[details.best_idx] if scores else 0.0
            calls = int(details.total_metric_calls or 0)
            best.detailed_results = None  # not JSON; keep program.save() clean
        return OptimizationResult(
            program=best,
            best_candidate=get_candidate(best),
            best_score=best_score,
            baseline_candidate=baseline,
            baseline_score=baseline_score,
            metric_calls=calls,
            input_tokens=int(self.input_tokens()),
            history=history,
            stop_reason=gepa_stopper.reason if gepa_stopper else None,
            details={"optimizer": "gepa", "max_metric_calls": self.max_metric_calls},
        )
