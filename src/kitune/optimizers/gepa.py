"""GEPA (the default optimiser): reflective instruction evolution with per-predictor feedback.

:class:`GepaOptimizer` implements :class:`kitune.optimizers.base.Optimizer` over ``dspy.GEPA``
(dspy 3.4). The metric has GEPA's feedback signature (see :mod:`kitune.optimizers.tasks`); the
reflection LM is the ``reflection`` role (``kitune.lm.build_lm(cfg, "reflection")``). Budgets:
``max_metric_calls`` (GEPA's own) plus gepa stop conditions (a timeout from the budget's minutes,
kitune's :class:`~kitune.optimizers.stopping.MaxInputTokens` on the token ledger), run through a
:func:`~kitune.optimizers.stopping.combine` (gepa's ``CompositeStopper``, noting the one that
fired). The seed comes from the ``random.Random`` passed in, so the same RNG state and LM replies
give the same result.

**Budgets that can propose.** What GEPA (``gepa`` 0.1.4 under ``dspy.GEPA`` 3.4) spends, in
metric calls (one call = one example run by the program and scored):

* the seed evaluation: every validation example once (``len(valset)``);
* each iteration (a *proposal*): the parent on a minibatch of ``reflection_minibatch_size``
  training examples (padded to that size), then — when reflection gives a new instruction — the
  child on the same minibatch, then — only when the child beats the parent there — the child on
  the whole validation set: at most ``2 × minibatch + len(valset)``.

GEPA checks its budget only *before* an iteration (``total >= max_metric_calls`` stops), so
``k`` proposal iterations start whatever the outcomes when ``max_metric_calls`` exceeds the seed
evaluation plus ``k − 1`` worst-case iterations: :func:`min_metric_calls`
``= len(valset) + (k − 1)(2·minibatch + len(valset)) + 1``. :meth:`GepaOptimizer.compile`
refuses a smaller budget with a :class:`~kitune.errors.ConfigError` naming that minimum (for
``k = min_proposals``), and sizes an unset budget to it. A run that made no proposal says why in
its ``stop_reason`` (``"no proposal: budget spent on the seed evaluation …"``, ``"no proposal:
every reflection reply was unusable …"``, ``"no proposal: every minibatch already scored
perfectly …"``), read from gepa's own callbacks (:class:`ProposalLog`).

**Failing loudly.** The instruction proposer is :class:`SizedInstructionProposer`, DSPy's own
``InstructionProposer`` with two additions: before each reflection call it sizes the examples
with feedback to the reflection model's context window (``context_tokens`` minus the reply's
``max_tokens``, tokens estimated at 4 characters each — long values are cut first, then whole
examples dropped, the current instruction always kept; an unknown window is bounded by
:data:`DEFAULT_REFLECTION_CONTEXT_TOKENS`, and a context-overflow error halves the prompt for the
retry and every later call instead of failing the same way each step), and it counts reflection
calls, failures and overflows. The metric's return type is checked once before GEPA starts (a
dict or a string is a :class:`~kitune.errors.ConfigError` naming the type, not a ``TypeError``
from inside GEPA). A run in which every reflection call failed reports that as its ``stop_reason``
(``"every reflection call failed (3/3): …"``) instead of returning the baseline as if nothing
better had been found.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import dspy
from dspy.teleprompt.gepa.instruction_proposal import InstructionProposer

from kitune.errors import ConfigError
from kitune.optimizers.acceptance import cut_off
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
from kitune.optimizers.stopping import (
    MaxInputTokens,
    StopperProtocol,
    StopReason,
    TimeoutStopCondition,
    combine,
    restart,
)

__all__ = [
    "DEFAULT_REFLECTION_CONTEXT_TOKENS",
    "GEPA_METRIC_SIGNATURE",
    "GepaOptimizer",
    "ProposalLog",
    "SizedInstructionProposer",
    "fit_examples",
    "make_gepa",
    "min_metric_calls",
    "pareto_size",
    "proposal_cost",
]

GEPA_METRIC_SIGNATURE = "(gold, pred, trace, pred_name, pred_trace)"
"""How ``dspy.GEPA`` calls its metric (five positional arguments)."""

CHARS_PER_TOKEN = 4
"""Token estimate for sizing reflection prompts (conservative for English text)."""

PROMPT_OVERHEAD_TOKENS = 400
"""Tokens the proposer's own instructions and field markers take, reserved before the examples."""

DEFAULT_REFLECTION_CONTEXT_TOKENS = 8192
"""The reflection window assumed when nothing reports it (no ``optimize.reflection_context_tokens``,
not the embedded model, not in LiteLLM's table, no server report): 8,192 tokens, the smallest
window of the models kitune is run with (the embedded model's default ``n_ctx`` is 4,096 but is
always known), so an unknown model still gets a bounded reflection prompt. A provider's
context-overflow error then shrinks the prompt further (:class:`SizedInstructionProposer`)."""


def proposal_cost(n_val: int, minibatch: int) -> int:
    """Most metric calls one GEPA iteration can spend: parent and child on a minibatch, then the valset.

    Args:
        n_val: validation examples (GEPA's Pareto set), ≥ 1.
        minibatch: ``reflection_minibatch_size``, ≥ 1.

    Returns:
        ``2 * minibatch + n_val``.
    """
    return 2 * minibatch + n_val


def min_metric_calls(n_val: int, minibatch: int, proposals: int = 1) -> int:
    """The smallest ``max_metric_calls`` with which GEPA starts ``proposals`` iterations, whatever happens.

    The seed evaluation costs ``n_val``; GEPA starts another iteration while the calls spent are
    below the budget, and an iteration costs at most :func:`proposal_cost`.

    Args:
        n_val: validation examples, ≥ 1.
        minibatch: ``reflection_minibatch_size``, ≥ 1.
        proposals: iterations that must start, ≥ 1.

    Returns:
        ``n_val + (proposals - 1) * proposal_cost(n_val, minibatch) + 1``; e.g. 3 for a 2-example
        valset and one proposal, 45 for 12 validation examples, minibatch 2 and 3 proposals.
    """
    return n_val + (proposals - 1) * proposal_cost(n_val, minibatch) + 1


def pareto_size(
    available: int,
    *,
    cap: int,
    max_metric_calls: int | None,
    minibatch: int,
    proposals: int,
) -> int:
    """How many examples GEPA's Pareto (validation) set gets: at most ``cap``, fewer when the budget is set.

    The largest ``n ≤ min(available, cap)`` with :func:`min_metric_calls` ``(n, minibatch,
    proposals) ≤ max_metric_calls``; with no budget set (``None``: GEPA sizes it to the minimum)
    simply ``min(available, cap)``. When even one example does not fit, 1 is returned and
    :meth:`GepaOptimizer.budget_for` refuses the budget with the minimum named.

    Args:
        available: examples the task has, ≥ 0.
        cap: ``optimize.max_pareto_examples``, ≥ 1.
        max_metric_calls: the run's budget, or None.
        minibatch: ``reflection_minibatch_size``, ≥ 1.
        proposals: ``optimize.min_proposals``, ≥ 1.

    Returns:
        0 when ``available`` is 0, else 1 – ``min(available, cap)``; e.g. 6 of 20 examples with
        no budget, 4 with ``max_metric_calls=22`` (minibatch 2, 3 proposals: 3·4 + 9 = 21 ≤ 22).
    """
    n = min(max(available, 0), max(cap, 1))
    if max_metric_calls is None:
        return n
    while n > 1 and min_metric_calls(n, minibatch, proposals) > max_metric_calls:
        n -= 1
    return n


class ProposalLog:
    """A gepa callback (``gepa_kwargs={"callbacks": [...]}``) that counts what each iteration did.

    Attributes:
        iterations: iterations started.
        proposals: new instructions reflection produced (each evaluated on its minibatch).
        accepted: proposals that beat their parent on the minibatch (then run on the valset).
        skipped: reason → iterations skipped before reflecting (``all_scores_perfect``,
            ``no_trajectories``).
        seed_metric_calls: validation examples the seed evaluation scored.
    """

    def __init__(self) -> None:
        self.iterations = 0
        self.proposals = 0
        self.accepted = 0
        self.skipped: dict[str, int] = {}
        self.seed_metric_calls = 0

    def on_iteration_start(self, event: Mapping[str, Any]) -> None:
        """An iteration began."""
        self.iterations += 1

    def on_evaluation_skipped(self, event: Mapping[str, Any]) -> None:
        """An iteration stopped before reflecting (perfect minibatch, no trajectories)."""
        reason = str(event.get("reason", "unknown"))
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def on_proposal_end(self, event: Mapping[str, Any]) -> None:
        """Reflection produced a new instruction."""
        self.proposals += 1

    def on_candidate_accepted(self, event: Mapping[str, Any]) -> None:
        """A proposal beat its parent on the minibatch."""
        self.accepted += 1

    def on_valset_evaluated(self, event: Mapping[str, Any]) -> None:
        """The seed's (iteration 0) or an accepted candidate's valset evaluation."""
        if event.get("iteration") == 0:
            self.seed_metric_calls = int(event.get("num_examples_evaluated", 0) or 0)


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


_OVERFLOW_ERRORS = frozenset({"LMContextWindowError", "ContextWindowExceededError"})
"""kitune's classified error (:class:`kitune.errors.LMContextWindowError`), and DSPy's and LiteLLM's
``ContextWindowExceededError``, matched by class name so neither library is imported here."""


def _is_context_overflow(error: BaseException) -> bool:
    """True when ``error`` or an error it was raised from is a context-window error.

    DSPy wraps an LM's own exception (``LMUnexpectedError`` raised *from* it), so the cause chain
    is read too.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if {c.__name__ for c in type(current).__mro__} & _OVERFLOW_ERRORS:
            return True
        current = current.__cause__ or current.__context__
    return False


class SizedInstructionProposer(InstructionProposer):  # type: ignore[misc]
    """DSPy's ``InstructionProposer`` sized to the reflection model's window, counting failures.

    Every reflection prompt is bounded: the examples get at most ``context_tokens`` minus
    ``reply_tokens`` minus :data:`PROMPT_OVERHEAD_TOKENS` (the current instruction always kept),
    with :data:`DEFAULT_REFLECTION_CONTEXT_TOKENS` when the window is unknown. When the reflection
    call still fails with a context-overflow error (the estimate of 4 characters per token was
    too generous, or the assumed window too large), the examples' budget is halved for this and
    every later call and the call is made once more at the smaller size; overflowing again, the
    budget is halved once more and the proposal is skipped (the error re-raised, counted as a
    failure: GEPA goes on with its next iteration, which starts at the smaller size). At a budget
    of 0 the prompt is the instruction and one example cut to 200 characters.

    Args:
        context_tokens: the reflection model's context window in tokens; None: unknown, bounded
            by :data:`DEFAULT_REFLECTION_CONTEXT_TOKENS`.
        reply_tokens: tokens reserved for the reply (the reflection role's ``max_tokens``).

    Attributes:
        calls: reflection calls made (a retry after an overflow counts).
        failures: proposals that failed (skipped by GEPA).
        overflows: context-overflow errors seen; each halved :attr:`prompt_tokens`.
        trimmed: calls whose examples were cut to fit.
        prompt_tokens: the tokens the examples may take now.
        window_known: False when the default bound is in use.
    """

    def __init__(self, *, context_tokens: int | None = None, reply_tokens: int = 1024) -> None:
        super().__init__()
        self.window_known = context_tokens is not None
        self.context_tokens = context_tokens or DEFAULT_REFLECTION_CONTEXT_TOKENS
        self.reply_tokens = reply_tokens
        self.prompt_tokens = max(0, self.context_tokens - reply_tokens - PROMPT_OVERHEAD_TOKENS)
        self.calls = 0
        self.failures = 0
        self.overflows = 0
        self.trimmed = 0
        self.errors: list[str] = []

    def __call__(
        self,
        candidate: dict[str, str],
        reflective_dataset: Mapping[str, Sequence[Mapping[str, Any]]],
        components_to_update: list[str],
    ) -> dict[str, str]:
        """Size the examples, then propose (see the base class); a failure is counted and re-raised.

        A proposed text that looks cut off (:func:`~kitune.optimizers.acceptance.cut_off`, e.g. a
        reply that stopped inside a parenthesis) is a failure too (``ValueError``): GEPA skips it
        instead of spending metric calls on it, and it counts toward "every reflection reply was
        unusable".
        """
        for attempt in range(2):
            data = self._sized(candidate, reflective_dataset, components_to_update)
            self.calls += 1
            try:
                proposed = dict(super().__call__(candidate, data, components_to_update))
                for name, text in proposed.items():
                    problem = cut_off(text)
                    if problem:
                        raise ValueError(f"unusable reflection reply for {name}: {problem}")
                return proposed
            except Exception as e:
                overflow = _is_context_overflow(e)
                if overflow:
                    self.overflows += 1
                    floor = self.prompt_tokens == 0
                    self.prompt_tokens //= 2  # this call's retry and every later prompt
                    if attempt == 0 and not floor:
                        continue
                self.failures += 1
                self.errors.append(f"{type(e).__name__}: {e}"[:300])
                raise
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _sized(
        self,
        candidate: dict[str, str],
        reflective_dataset: Mapping[str, Sequence[Mapping[str, Any]]],
        components_to_update: list[str],
    ) -> dict[str, Sequence[Mapping[str, Any]]]:
        """The examples cut to :attr:`prompt_tokens` (less the current instruction), per component."""
        data = dict(reflective_dataset)
        for name in components_to_update:
            if name not in data or name not in candidate:
                continue
            budget = max(0, self.prompt_tokens * CHARS_PER_TOKEN - len(candidate[name]))
            fitted = fit_examples(data[name], budget)
            if fitted != [dict(e) for e in data[name]]:
                self.trimmed += 1
            data[name] = fitted
        return data

    @property
    def all_failed(self) -> bool:
        """True when at least one reflection call was made and every one failed."""
        return self.calls > 0 and self.failures == self.calls


class GepaOptimizer:
    """``dspy.GEPA`` behind the :class:`~kitune.optimizers.base.Optimizer` protocol.

    Args:
        metric: GEPA feedback metric ``(gold, pred, trace, pred_name, pred_trace) ->
            dspy.Prediction(score, feedback)`` or a float, 0.0–1.0.
        reflection_lm: the ``dspy.LM`` that proposes new instructions (None is refused: DSPy would
            reflect with the task LM).
        max_metric_calls: GEPA's budget in metric calls (one call = one example run), ≥ 1; None:
            :func:`min_metric_calls` for ``min_proposals`` on the sets ``compile`` is given.
        rng: seeds GEPA (``rng.randrange(2**31)``); default ``random.Random(0)``.
        stoppers: gepa stop conditions (``gepa.utils.stop_condition``, kitune's
            :class:`~kitune.optimizers.stopping.MaxInputTokens`), checked before each iteration;
            timeouts and token caps restart when ``compile`` starts.
        reflection_minibatch_size: examples shown to the reflection LM per proposal.
        num_threads: parallel example evaluations.
        use_merge: let GEPA merge candidates.
        log_dir: GEPA's run directory (its own resume state); None: none.
        input_tokens: callable giving input tokens spent so far (reported in the result).
        reflection_context_tokens: the reflection model's context window (None: unknown, bounded by
            :data:`DEFAULT_REFLECTION_CONTEXT_TOKENS`; see :class:`SizedInstructionProposer`).
        reflection_max_tokens: the reflection reply's token cap (reserved when sizing).
        min_proposals: ``compile`` refuses a budget that cannot start this many proposals, ≥ 1.

    Raises:
        ConfigError: ``metric`` cannot take :data:`GEPA_METRIC_SIGNATURE`, or ``reflection_lm`` is
            None.
        ValueError: ``max_metric_calls`` or ``min_proposals`` below 1.
    """

    name = "gepa"

    def __init__(
        self,
        metric: Callable[..., Any],
        *,
        reflection_lm: Any,
        max_metric_calls: int | None,
        rng: random.Random | None = None,
        stoppers: Sequence[StopperProtocol] = (),
        reflection_minibatch_size: int = 2,
        num_threads: int = 1,
        use_merge: bool = False,
        log_dir: Path | None = None,
        input_tokens: Callable[[], int] = lambda: 0,
        reflection_context_tokens: int | None = None,
        reflection_max_tokens: int = 1024,
        min_proposals: int = 1,
    ) -> None:
        if max_metric_calls is not None and max_metric_calls < 1:
            raise ValueError(f"max_metric_calls={max_metric_calls}: allow at least 1")
        if min_proposals < 1:
            raise ValueError(f"min_proposals={min_proposals}: ask for at least 1")
        check_metric("GEPA", metric, GEPA_METRIC_SIGNATURE)
        require_reflection_lm("GEPA", reflection_lm)
        self.metric = metric
        self.reflection_lm = reflection_lm
        self.max_metric_calls = max_metric_calls
        self.rng = rng or random.Random(0)
        self.stoppers = tuple(stoppers)
        self.reflection_minibatch_size = reflection_minibatch_size
        self.num_threads = num_threads
        self.use_merge = use_merge
        self.log_dir = log_dir
        self.input_tokens = input_tokens
        self.reflection_context_tokens = reflection_context_tokens
        self.reflection_max_tokens = reflection_max_tokens
        self.min_proposals = min_proposals

    def budget_for(self, n_val: int) -> int:
        """The metric-call budget for a ``n_val``-example valset (checked against the minimum).

        Raises:
            ConfigError: ``max_metric_calls`` is below :func:`min_metric_calls` for these sizes
                (the message names the minimum and the settings to change).
        """
        mb = self.reflection_minibatch_size
        need = min_metric_calls(n_val, mb, self.min_proposals)
        if self.max_metric_calls is None:
            return need
        if self.max_metric_calls < need:
            raise ConfigError(
                f"GEPA budget max_metric_calls={self.max_metric_calls} cannot make {self.min_proposals} "
                f"proposal(s) with a {n_val}-example validation set and minibatch {mb}: the seed evaluation "
                f"costs {n_val} metric calls and each proposal up to {proposal_cost(n_val, mb)} (parent and "
                f"child on {mb} examples, then the validation set), so the minimum budget is {need}. Raise "
                f"--max-metric-calls / optimize.max_metric_calls to at least {need}, leave it unset to size "
                "it automatically, or lower optimize.min_proposals"
            )
        return self.max_metric_calls

    def compile(self, program: Any, *, trainset: Sequence[Any], valset: Sequence[Any]) -> OptimizationResult:
        """Run GEPA on ``program`` (a copy is returned; the input is unchanged).

        Before GEPA starts, the program runs once on the first validation example and the metric
        is called on it (:func:`~kitune.optimizers.base.check_metric_returns`; with a caching LM
        the seed evaluation then reuses that call).

        Raises:
            OptimizationError: empty ``trainset``/``valset`` or GEPA failed to run.
            ConfigError: the budget cannot start ``min_proposals`` proposals on these sets, or the
                metric returns neither a number nor an object with a numeric ``score`` (the message
                names the type it returned).
        """
        require_sets("GEPA", trainset, valset)
        budget = self.budget_for(len(valset))
        check_metric_returns("GEPA", self.metric, program, valset[0], arguments=5)
        baseline = get_candidate(program)
        for stopper in self.stoppers:
            restart(stopper)
        gepa_stopper, fired = combine(*self.stoppers) if self.stoppers else (None, None)
        log = ProposalLog()
        kwargs: dict[str, Any] = {"callbacks": [log]}
        if gepa_stopper:
            kwargs["stop_callbacks"] = [gepa_stopper]
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        proposer = SizedInstructionProposer(
            context_tokens=self.reflection_context_tokens, reply_tokens=self.reflection_max_tokens
        )
        optimizer = dspy.GEPA(
            metric=self.metric,
            instruction_proposer=proposer,
            max_metric_calls=budget,
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
            stop_reason=_stop_reason(proposer, fired, log, calls, budget, len(valset)),
            details={
                "optimizer": "gepa",
                "max_metric_calls": budget,
                "max_metric_calls_set": self.max_metric_calls,
                "min_proposals": self.min_proposals,
                "iterations": log.iterations,
                "proposals": log.proposals,
                "proposals_accepted": log.accepted,
                "skipped": dict(log.skipped),
                "reflection_calls": proposer.calls,
                "reflection_failures": proposer.failures,
                "reflection_trimmed": proposer.trimmed,
                "reflection_overflows": proposer.overflows,
                "reflection_window": proposer.context_tokens,
                "reflection_window_known": proposer.window_known,
            },
        )


def _stop_reason(
    proposer: SizedInstructionProposer,
    stopped: StopReason | None,
    log: ProposalLog,
    calls: int,
    budget: int,
    n_val: int,
) -> str | None:
    """Why the run stopped; for a run without a proposal, why none was made."""
    fired = stopped.text if stopped else None
    if log.proposals:
        return fired
    if log.iterations == 0:
        if fired:
            return f"no proposal: stopped before the first iteration ({fired})"
        return (
            f"no proposal: budget spent on the seed evaluation ({calls} of {budget} metric calls; the "
            f"validation set has {n_val} examples)"
        )
    if proposer.all_failed:
        return (
            f"no proposal: every reflection reply was unusable ({proposer.failures}/{proposer.calls}): "
            f"{proposer.errors[0]}"
        )
    perfect = log.skipped.get("all_scores_perfect", 0)
    no_traces = log.skipped.get("no_trajectories", 0)
    if perfect == log.iterations:
        return (
            f"no proposal: every minibatch already scored perfectly ({perfect} of {log.iterations} "
            "iterations)"
        )
    if no_traces == log.iterations:
        return f"no proposal: no trajectories were captured in any of {log.iterations} iterations"
    failed = proposer.failures
    other = max(0, log.iterations - perfect - no_traces - (1 if failed else 0))
    return (
        f"no proposal in {log.iterations} iterations: {perfect} minibatch(es) already perfect, "
        f"{no_traces} without trajectories, {failed} reflection failure(s), {other} reflection(s) without a "
        "new instruction" + (f"; then {fired}" if fired else "")
    )


def make_gepa(
    metric: Callable[..., Any],
    *,
    reflection_lm: Any,
    budget: OptimizerBudget,
    rng: random.Random,
    input_tokens: Callable[[], int] | None = None,
) -> GepaOptimizer:
    """The ``gepa`` entry of the optimiser registry: :class:`GepaOptimizer` from one budget.

    Reads ``max_metric_calls`` (unset: the minimum for ``min_proposals``), a timeout from
    ``minutes``, a token cap from ``max_input_tokens`` (counted with ``input_tokens``),
    ``threads``, the reflection window and reply cap.

    Raises:
        ConfigError: ``max_input_tokens`` is set but no ``input_tokens`` counter was given.
    """
    stoppers: list[StopperProtocol] = []
    if budget.minutes:
        stoppers.append(TimeoutStopCondition(budget.minutes * 60))
    if budget.max_input_tokens is not None:
        if input_tokens is None:
            raise ConfigError(
                f"optimize.max_input_tokens={budget.max_input_tokens} needs the token ledger's count "
                "(input_tokens=...); without it the cap could never fire"
            )
        stoppers.append(MaxInputTokens(budget.max_input_tokens, input_tokens))
    return GepaOptimizer(
        metric,
        reflection_lm=reflection_lm,
        max_metric_calls=budget.max_metric_calls,
        rng=rng,
        stoppers=stoppers,
        reflection_minibatch_size=budget.reflection_minibatch_size,
        num_threads=budget.threads,
        input_tokens=input_tokens or (lambda: 0),
        reflection_context_tokens=budget.reflection_context_tokens,
        reflection_max_tokens=budget.reflection_max_tokens,
        min_proposals=budget.min_proposals,
    )


PLUGINS = {"gepa": make_gepa}
"""This module's optimiser, registered by :data:`kitune.optimizers.registry.OPTIMIZERS` on first use."""
