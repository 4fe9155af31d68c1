"""What every optimiser shares: :data:`Candidate`, the :class:`Optimizer` protocol, the result record.

A *candidate* is the set of instructions an optimiser proposes: predictor name (as
``program.named_predictors()`` names it, e.g. ``"extract.predict"``) → instruction text, the
same shape gepa uses. :func:`get_candidate` reads it from a DSPy program and
:func:`apply_candidate` writes one into a copy.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from kitune.errors import ConfigError, OptimizationError

__all__ = [
    "Candidate",
    "CandidateScore",
    "OptimizationResult",
    "Optimizer",
    "apply_candidate",
    "check_metric",
    "check_metric_returns",
    "compile_copy",
    "get_candidate",
    "require_reflection_lm",
    "require_sets",
]

Candidate = dict[str, str]
"""Predictor name → instruction text."""


@dataclass(frozen=True)
class CandidateScore:
    """One evaluated candidate during an optimisation run."""

    candidate: Mapping[str, str]
    """The instructions evaluated."""
    score: float
    """Aggregate validation score, 0.0–1.0 unless the metric says otherwise; higher is better."""
    metric_calls: int = 0
    """Metric calls spent to obtain ``score``."""


@dataclass(frozen=True)
class OptimizationResult:
    """What :meth:`Optimizer.compile` returns.

    ``best_candidate`` is the candidate of ``program``; ``best_score >= baseline_score`` is *not*
    guaranteed (the optimiser may find nothing better; the loop decides whether to accept).
    """

    program: Any
    """The optimised ``dspy.Module`` (a copy; the input program is left unchanged)."""
    best_candidate: Mapping[str, str]
    """Instructions of ``program``."""
    best_score: float
    """Validation score of ``program``."""
    baseline_candidate: Mapping[str, str]
    """Instructions of the input program."""
    baseline_score: float | None = None
    """Validation score of the input program, when the optimiser measured it."""
    metric_calls: int = 0
    """Total metric calls spent (each call = one example evaluated)."""
    cost_usd: float | None = None
    """Provider cost of the run in USD, when known."""
    input_tokens: int = 0
    """Input tokens spent by the run (task + reflection LMs)."""
    history: tuple[CandidateScore, ...] = ()
    """Every candidate evaluated on the validation set, in evaluation order."""
    stop_reason: str | None = None
    """Why the run stopped (a stopper's description), or None when it ran to completion."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """Optimiser-specific extras (e.g. GEPA's Pareto front), JSON-serialisable."""

    @property
    def improved(self) -> bool:
        """True when ``best_score`` beats a known ``baseline_score``."""
        return self.baseline_score is not None and self.best_score > self.baseline_score


@runtime_checkable
class Optimizer(Protocol):
    """Improves a DSPy program's instructions (dspy ``Teleprompter.compile`` shape).

    Contract: ``compile`` never mutates ``program``; it returns a copy. Per-example failures
    score 0.0 and never raise; only misconfiguration raises
    :class:`~kitune.errors.OptimizationError`. Randomness comes from a seeded
    ``random.Random`` the optimiser owns, so the same seed and the same LM replies give the
    same result.
    """

    def compile(self, program: Any, *, trainset: Sequence[Any], valset: Sequence[Any]) -> OptimizationResult:
        """Optimise ``program`` on ``trainset``, select on ``valset``.

        Args:
            program: a ``dspy.Module``.
            trainset: ``dspy.Example`` items used to propose changes (non-empty).
            valset: held-out ``dspy.Example`` items used to score candidates (non-empty).

        Returns:
            An :class:`OptimizationResult`.

        Raises:
            OptimizationError: empty sets, or the optimiser could not run at all.
        """
        ...


def get_candidate(program: Any) -> Candidate:
    """Read the instructions of every predictor of a DSPy program.

    Args:
        program: a ``dspy.Module``.

    Returns:
        ``{predictor name: instructions}`` in ``named_predictors()`` order.
    """
    return {name: str(pred.signature.instructions) for name, pred in program.named_predictors()}


def apply_candidate(program: Any, candidate: Mapping[str, str]) -> Any:
    """Return a deep copy of ``program`` with ``candidate``'s instructions set.

    Predictors not named in ``candidate`` keep their instructions.

    Raises:
        ValueError: ``candidate`` names a predictor the program does not have (the message
            lists the valid names).
    """
    new = copy.deepcopy(program)
    predictors = dict(new.named_predictors())
    unknown = sorted(set(candidate) - set(predictors))
    if unknown:
        raise ValueError(
            f"candidate names unknown predictors {unknown}; the program has {sorted(predictors)}"
        )
    for name, text in candidate.items():
        pred = predictors[name]
        pred.signature = pred.signature.with_instructions(text)
    return new


def require_sets(label: str, trainset: Sequence[Any], valset: Sequence[Any]) -> None:
    """Refuse an empty ``trainset`` or ``valset`` before an optimiser starts.

    Args:
        label: the optimiser as the message names it (``"GEPA"``, ``"MIPROv2"``).
        trainset: examples the optimiser proposes from.
        valset: examples the optimiser scores candidates on.

    Raises:
        OptimizationError: either set is empty (the message gives both sizes and the fix).
    """
    if not trainset or not valset:
        raise OptimizationError(
            f"{label} needs non-empty trainset and valset, got {len(trainset)} and {len(valset)} examples: "
            "use more questions (--questions) or a smaller validation fraction"
        )


def compile_copy(label: str, program: Any, compile_fn: Callable[[Any], Any]) -> Any:
    """Run ``compile_fn`` on a deep copy of ``program``; any failure becomes an OptimizationError.

    Args:
        label: the optimiser as the message names it (``"GEPA"``, ``"MIPROv2"``).
        program: a ``dspy.Module``; left unchanged.
        compile_fn: the wrapped optimiser's ``compile``, given the copy.

    Returns:
        What ``compile_fn`` returned (the optimised program).

    Raises:
        OptimizationError: ``"<label> failed on <Program>: <Error>: <message>"``, chained to the cause.
    """
    try:
        return compile_fn(program.deepcopy())
    except Exception as e:
        raise OptimizationError(f"{label} failed on {type(program).__name__}: {type(e).__name__}: {e}") from e


def check_metric(label: str, metric: Callable[..., Any], signature: str) -> None:
    """Refuse a metric that cannot be called the way the optimiser will call it.

    Args:
        label: the optimiser as the message names it (``"GEPA"``, ``"MIPROv2"``).
        metric: the metric callable.
        signature: the expected parameters, e.g. ``"(gold, pred, trace, pred_name, pred_trace)"``;
            the metric must accept that many positional arguments.

    Raises:
        ConfigError: the metric does not accept them (the message gives its own signature and
            the expected one), instead of a ``TypeError`` from inside the optimiser's first call.
    """
    n = signature.count(",") + 1
    try:
        sig = inspect.signature(metric)
    except (TypeError, ValueError):  # a builtin or C callable without a signature: trust it
        return
    try:
        sig.bind(*([None] * n))
    except TypeError as e:
        name = getattr(metric, "__name__", type(metric).__name__)
        bare = sig.replace(
            parameters=[p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()],
            return_annotation=inspect.Signature.empty,
        )
        raise ConfigError(
            f"{label} metric {name}{bare} cannot be called as metric{signature} ({e}): a {label} metric "
            f"takes {signature} and returns a float or dspy.Prediction(score=..., feedback=...); give "
            "the extra parameters defaults (e.g. trace=None) if it does not need them"
        ) from e


def _score_of(value: Any) -> Any:
    """The score a metric's return value carries, or None when it carries none a number can be."""
    if isinstance(value, bool | int | float):
        return value
    if isinstance(value, Mapping) and not hasattr(value, "score"):
        return None  # a dict is not a score object: DSPy reads ``.score`` / ``["score"]`` of a Prediction
    score = getattr(value, "score", None)
    return score if isinstance(score, bool | int | float) else None


def check_metric_returns(
    label: str, metric: Callable[..., Any], program: Any, example: Any, *, arguments: int
) -> bool:
    """Call ``metric`` once on ``program``'s prediction for ``example`` and check what it returns.

    Run when an optimiser starts, before it spends any budget: a metric that returns the wrong
    type (a dict, a string, a Prediction without a numeric ``score``) would otherwise fail deep
    inside the optimiser with a bare ``TypeError``, or be counted as a failed example.

    Args:
        label: the optimiser as the message names it (``"GEPA"``).
        metric: the metric, called as ``metric(example, prediction, None, …)`` with ``arguments``
            positional arguments (the trailing ones None: a module-level call).
        program: the DSPy program (run once on ``example``'s inputs, on a deep copy).
        example: one ``dspy.Example`` with inputs set (the optimiser's first validation example).
        arguments: how many positional arguments the optimiser passes (GEPA 5, MIPROv2 3).

    Returns:
        True when the return was checked; False when the program itself raised on ``example``
        (no prediction to score: the optimiser's own per-example failure handling applies).

    Raises:
        ConfigError: the metric returned something other than a number or an object with a numeric
            ``score`` (``dspy.Prediction(score=..., feedback=...)``); the message names the type
            and the value.
    """
    try:
        prediction = copy.deepcopy(program)(**example.inputs())
    except Exception:  # the program's failure is the optimiser's to count, not the metric's
        return False
    value = metric(example, prediction, *([None] * (arguments - 2)))
    if _score_of(value) is None:
        name = getattr(metric, "__name__", type(metric).__name__)
        shown = repr(value)
        shown = shown if len(shown) <= 120 else shown[:117] + "..."
        raise ConfigError(
            f"{label} metric {name} returned {type(value).__name__} ({shown}) on the first validation "
            "example: a metric returns a float (or int/bool) or dspy.Prediction(score=<float>, "
            "feedback=<str>); return the score, or wrap it as dspy.Prediction(score=..., feedback=...)"
        )
    return True


def require_reflection_lm(label: str, lm: Any) -> Any:
    """Refuse to run without a proposer LM (DSPy would silently reflect with the task LM).

    Raises:
        ConfigError: ``lm`` is None (the message names ``lm.reflection``).
    """
    if lm is None:
        raise ConfigError(
            f"{label} needs a reflection LM to propose instructions, got None (without one DSPy would "
            "reflect with the task model): pass build_lm(cfg, 'reflection'), or set lm.reflection.model"
        )
    return lm
