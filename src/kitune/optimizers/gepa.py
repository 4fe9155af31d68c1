"""GEPA (the default optimiser): reflective instruction evolution with per-predictor feedback.

:class:`GepaOptimizer` implements :class:`kitune.optimizers.base.Optimizer` over ``dspy.GEPA``
(dspy 3.4). The metric has GEPA's feedback signature (see :mod:`kitune.optimizers.tasks`); the
reflection LM is the ``reflection`` role (``kitune.lm.build_lm(cfg, "reflection")``). Budgets:
``max_metric_calls`` (GEPA's own) plus any kitune :class:`~kitune.optimizers.stopping.Stopper`,
adapted with :func:`~kitune.optimizers.stopping.as_gepa_stopper`. The seed comes from the
``random.Random`` passed in, so the same RNG state and LM replies give the same result.

**Failing loudly.** The instruction proposer is :class:`SizedInstructionProposer`, DSPy's own
``InstructionProposer`` with two additions: before each reflection call it sizes the examples
with feedback to the reflection model's context window (``context_tokens`` minus the reply's
``max_tokens``, tokens estimated at 4 characters each — long values are cut first, then whole
examples dropped, the current instruction always kept), and it counts reflection calls and
failures. A run in which every reflection call failed reports that as its ``stop_reason``
(``"every reflection call failed (3/3): …"``) instead of returning the baseline as if nothing
better had been found.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kitune.optimizers.base import (
    CandidateScore,
    OptimizationResult,
    compile_copy,
    get_candidate,
    require_sets,
)
from kitune.optimizers.budget import OptimizerBudget
from kitune.optimizers.registry import register_optimizer
from kitune.optimizers.stopping import Stopper, Timeout, as_gepa_stopper

__all__ = ["GepaOptimizer", "SizedInstructionProposer", "fit_examples", "make_gepa"]

CHARS_PER_TOKEN = 4
"""Token estimate for sizing reflection prompts (conservative for English text)."""

PROMPT_OVERHEAD_TOKENS = 400
"""Tokens the proposer's own instructions and field markers take, reserved before the examples."""


def _cut(value: Any, max_chars: int) -> Any:
    if isinstance(value, str) and len(value) > max_chars:
        return value[: max_chars - 14] + " … [trimmed]"
    if isinstance(value, Mapping):
        return {k: _cut(v, max_chars) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_cut(v, max_chars) for v in value]
    return value


def fit_examples(examples: Sequence[Mapping[str, Any]], budget_chars: int) -> list[dict[str, Any]]:
    """Trim reflection examples to ``budget_chars`` characters (their ``repr`` length).

    Long values are cut first (down to 200 characters each), then whole examples are dropped from
    the end; at least one (trimmed) example is always kept.

    Args:
        examples: GEPA's examples with feedback for one component.
        budget_chars: characters available, ≥ 0.

    Returns:
        A new list, ``len ≤ len(examples)``.
    """
    out = [dict(e) for e in examples]
    for limit in (2000, 800, 400, 200):
        if sum(len(repr(e)) for e in out) <= budget_chars:
            return out
        out = [_cut(e, limit) for e in out]
    while len(out) > 1 and sum(len(repr(e)) for e in out) > budget_chars:
        out.pop()
    return out


def _proposer_base() -> type:
    from dspy.teleprompt.gepa.instruction_proposal import InstructionProposer

    return InstructionProposer  # type: ignore[no-any-return]


class SizedInstructionProposer(_proposer_base()):  # type: ignore[misc]
    """DSPy's ``InstructionProposer`` sized to the reflection model's window, counting failures.

    Args:
        context_tokens: the reflection model's context window in tokens (None: no sizing).
        reply_tokens: tokens reserved for the reply (the reflection role's ``max_tokens``).
    """

    def __init__(self, *, context_tokens: int | None = None, reply_tokens: int = 1024) -> None:
        super().__init__()
        self.context_tokens = context_tokens
        self.reply_tokens = reply_tokens
        self.calls = 0
        self.failures = 0
        self.trimmed = 0
        self.errors: list[str] = []

    def __call__(
        self,
        candidate: dict[str, str],
        reflective_dataset: Mapping[str, Sequence[Mapping[str, Any]]],
        components_to_update: list[str],
    ) -> dict[str, str]:
        """Size the examples, then propose (see the base class); a failure is counted and re-raised."""
        data = dict(reflective_dataset)
        if self.context_tokens:
            for name in components_to_update:
                if name not in data or name not in candidate:
                    continue
                free = self.context_tokens - self.reply_tokens - PROMPT_OVERHEAD_TOKENS
                budget = max(0, free * CHARS_PER_TOKEN - len(candidate[name]))
                fitted = fit_examples(data[name], budget)
                if fitted != [dict(e) for e in data[name]]:
                    self.trimmed += 1
                data[name] = fitted
        self.calls += 1
        try:
            return dict(super().__call__(candidate, data, components_to_update))
        except Exception as e:
            self.failures += 1
            self.errors.append(f"{type(e).__name__}: {e}"[:300])
            raise

    @property
    def all_failed(self) -> bool:
        """True when at least one reflection call was made and every one failed."""
        return self.calls > 0 and self.failures == self.calls


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
        reflection_context_tokens: the reflection model's context window (None: no sizing).
        reflection_max_tokens: the reflection reply's token cap (reserved when sizing).
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
        reflection_context_tokens: int | None = None,
        reflection_max_tokens: int = 1024,
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
        self.reflection_context_tokens = reflection_context_tokens
        self.reflection_max_tokens = reflection_max_tokens

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
        proposer = SizedInstructionProposer(
            context_tokens=self.reflection_context_tokens, reply_tokens=self.reflection_max_tokens
        )
        optimizer = dspy.GEPA(
            metric=self.metric,
            instruction_proposer=proposer,
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
            stop_reason=_stop_reason(proposer, gepa_stopper),
            details={
                "optimizer": "gepa",
                "max_metric_calls": self.max_metric_calls,
                "reflection_calls": proposer.calls,
                "reflection_failures": proposer.failures,
                "reflection_trimmed": proposer.trimmed,
            },
        )


def _stop_reason(proposer: SizedInstructionProposer, stopper: Any) -> str | None:
    if proposer.all_failed:
        return f"every reflection call failed ({proposer.failures}/{proposer.calls}): {proposer.errors[0]}"
    return stopper.reason if stopper else None


@register_optimizer("gepa")
def make_gepa(
    metric: Callable[..., Any],
    *,
    reflection_lm: Any,
    budget: OptimizerBudget,
    rng: random.Random,
    input_tokens: Callable[[], int] | None = None,
) -> GepaOptimizer:
    """The ``gepa`` entry of the optimiser registry: :class:`GepaOptimizer` from one budget.

    Reads ``max_metric_calls``, a timeout stopper from ``minutes``, ``threads``, the reflection
    window and reply cap.
    """
    stopper = Timeout(budget.minutes * 60) if budget.minutes else None
    return GepaOptimizer(
        metric,
        reflection_lm=reflection_lm,
        max_metric_calls=budget.max_metric_calls or 8,
        rng=rng,
        stopper=stopper,
        reflection_minibatch_size=budget.reflection_minibatch_size,
        num_threads=budget.threads,
        input_tokens=input_tokens or (lambda: 0),
        reflection_context_tokens=budget.reflection_context_tokens,
        reflection_max_tokens=budget.reflection_max_tokens,
    )
