"""The optimisation loop: evaluate → improve → validate → accept or reject → log (optuna's ask/tell).

One iteration:

1. evaluate the current :class:`Setting` (prompts + numeric knobs) on the tuning and on the
   held-out validation split. The environment's evaluation cache is keyed by the setting *and
   the KI store's state*, so KIs written from failures in the previous iteration are measured
   here (questions whose retrieval did not change are reused, the others re-run);
2. record every question's outcome and failure kind in the :class:`~kitune.optimizers.ledger.FailureLedger`,
   which also resolves the previous iteration's feedback (was its KI retrieved? did it fix the
   question?), and — when the environment keeps KI credit (``record_credit``) — credit every KI
   each episode was shown (:mod:`kitune.optimizers.credit`: harmful ones are demoted or retired).
   Each evaluation carries its stage metrics (``Evaluation.stages``: every program on its own
   signal, :mod:`kitune.evaluation.stage_metrics`); they are logged and recorded for both
   splits but never decide;
3. ``env.improve`` proposes a new setting from the tuning traces (prompt optimisation on each
   program's stage metric, Optuna knobs) and writes feedback KIs, routed by failure kind
   through the ledger and kept only if the gate finds they break no question; under the stage
   rule the batch the gate kept is then decided (non-inferior on validation's gold reciprocal
   ranks, :func:`~kitune.optimizers.acceptance.decide_noninferior`, one more test of the round)
   and retired unless accepted, before step 5;
4. a proposal whose changed instructions fail the sanity checks
   (:func:`~kitune.optimizers.acceptance.check_instruction`) is rejected before any evaluation;
5. the current setting is re-measured on validation *on the store as it now is* and the
   proposal evaluated on the same questions, so the comparison is paired on one store state;
6. the decision rule (``decision_rule``): :func:`~kitune.optimizers.acceptance.decide_stage`
   (``stage``, the default: a one-sided paired test per change on its per-question validation
   stage metric at ``alpha`` over the round's tests, with end-to-end non-inferiority; "kept the
   incumbent: not enough evidence" is an outcome) or :func:`~kitune.optimizers.acceptance.decide`
   (``permissive``, the old rule) accepts, rejects, or — when too many questions
   failed (an outage, not a worse prompt) — decides nothing; a proposal that changes only
   write-only programs is judged by their own task metric (the validation runs cannot see it);
   an accepted prompt is registered as a new version, aliased ``candidate`` (and promoted to
   ``production`` only with ``promote=True``; ``kitune optimize`` stages and promotes through
   the checked :func:`kitune.service.serving.prompts.promote_prompt`);
7. the iteration is one tracking run, nested under the invocation's parent run (params,
   metrics — ``tune_*``, ``val_*``, ``val_after_*``, ``candidate_val_*`` including the stage
   metrics, ``improve_*``, ``credit_*`` —, prompt texts, program state, traces, the ledger), and
   ``<state>/proposals/iteration-<i>.md``/``.json`` hold the proposal's diffs, GEPA's candidates,
   the gate's rejections and the decision with its numbers
   (:func:`~kitune.optimizers.curves.write_proposal`).

Scores are :func:`~kitune.optimizers.objective.loop_score` values relative to the start
setting's first measurement of the same split (the reference scores 0.0).

The environment (:class:`LoopEnv`) owns every LLM and store; the loop is pure bookkeeping, so
it is tested with a fake environment. Resume: after each iteration the loop writes
``<state_dir>/loop_state.json`` and ``failure_ledger.json``; a rerun skips finished iterations
and continues from the setting they left (:mod:`kitune.optimizers.loop_state`). Curves:
``<state_dir>/curves.md`` and ``curves.png`` (:mod:`kitune.optimizers.curves`) show tuning and
validation accuracy (with 95% intervals) and scores per iteration, flips and failure kinds, so
over-fitting to the tuning questions shows.

:func:`run_loop` is the iteration loop; each iteration is four steps in their own functions:
``_measure`` (steps 1–2), ``_propose`` (3–5), ``_decide`` (6: the whole accept rule is
:func:`~kitune.optimizers.acceptance.decide`) and ``_log_outcome`` (7), then registration.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kitune.errors import PromptNotFoundError, TrackingError
from kitune.evaluation.report import wilson_interval
from kitune.optimizers.acceptance import (
    KI_BATCHES_NOTE,
    ChangeDecision,
    Decision,
    DecisionRuleName,
    KIBatch,
    PairedComparison,
    batch_tests,
    check_instruction,
    compare_paired,
    decide,
    decide_noninferior,
    decide_stage,
    round_tests,
    trace_values,
)
from kitune.optimizers.artifacts import log_candidate, log_program_state
from kitune.optimizers.curves import write_curves, write_proposal
from kitune.optimizers.ledger import FailureLedger
from kitune.optimizers.loop_state import IterationRecord, read_state, write_state
from kitune.optimizers.objective import LoopWeights, RunStats, loop_score, run_stats
from kitune.optimizers.program_task import eval_key, get_program_task, program_names
from kitune.optimizers.setting import Evaluation, LoopSplit, Proposal, Setting
from kitune.programs.instructions import prompt_name

if TYPE_CHECKING:
    from kitune.evaluation.report import RunSummary
    from kitune.optimizers.protocols import PromptRegistryProtocol, Tracker

# Setting, Evaluation, Proposal and IterationRecord are the loop's vocabulary (its API takes and
# returns them), so they stay importable from here; they are defined in setting.py / loop_state.py.
__all__ = [
    "Evaluation",
    "IterationRecord",
    "LoopEnv",
    "LoopResult",
    "Proposal",
    "Setting",
    "initial_prompts",
    "run_loop",
    "start_prompts",
]

logger = logging.getLogger(__name__)


class LoopEnv(Protocol):
    """The loop's environment: evaluates settings and proposes new ones.

    Contract: never raises for one question's or one document's failure (those are recorded in
    the traces/metrics); ``evaluate`` of the same setting and split twice on an unchanged KI
    store may return the cached first result, but after the store changed (KIs written, expired
    or deleted) it must re-run at least every question whose retrieval could change.
    Optional: ``tokens_used() -> int`` (LLM tokens spent so far), logged per iteration;
    ``record_credit(setting, iteration, split, evaluation) -> Mapping[str, float]`` (credit
    assignment: called after each start-of-iteration measurement is recorded in the failure
    ledger; its ``credit_*`` counts are logged).
    """

    def evaluate(self, setting: Setting, split: LoopSplit) -> Evaluation:
        """Extract what the setting needs, index it, and run the agent on ``split``."""
        ...

    def improve(
        self, setting: Setting, tune: Evaluation, iteration: int, *, ledger: FailureLedger | None = None
    ) -> Proposal:
        """Propose a setting from the tuning run's traces (``ledger`` routes the feedback)."""
        ...


@dataclass(frozen=True)
class LoopResult:
    """What :func:`run_loop` returns."""

    setting: Setting
    """The setting in use after the last iteration (the last accepted one)."""
    history: tuple[IterationRecord, ...]
    """Every iteration, resumed ones included, oldest first."""
    curves_md: Path | None = None
    curves_png: Path | None = None

    @property
    def accepted(self) -> int:
        """How many iterations were accepted."""
        return sum(r.accepted for r in self.history)


def initial_prompts(
    programs: Sequence[str], *, corpus: str, registry: PromptRegistryProtocol | None
) -> dict[str, str]:
    """The starting instruction of each program: the registry's ``production`` version, else packaged.

    Args:
        programs: program names (``extractor``, ``rewriter``, ``disambiguator``).
        corpus: corpus name (the registry names prompts per corpus).
        registry: the prompt registry, or None to use the packaged instructions.

    Raises:
        ConfigError: a program has no packaged instruction.
    """
    out: dict[str, str] = {}
    for program in programs:
        text: str | None = None
        if registry is not None:
            try:
                text = registry.get(prompt_name(corpus, program), "production").text
            except (PromptNotFoundError, TrackingError):
                text = None
        out[program] = text if text is not None else get_program_task(program).start_instruction()
    return out


def start_prompts(
    programs: Sequence[str], *, corpus: str, registry: PromptRegistryProtocol | None
) -> dict[str, str]:
    """The loop's start setting: the tuned programs' prompts plus every fixed program's production one.

    :func:`initial_prompts` for ``programs``; then each other registered program
    (:func:`~kitune.optimizers.program_task.program_names`)
    whose registry ``production`` version differs from its packaged instruction (for example the
    extractor ``kitune bootstrap`` drafted for a new domain) is added, so a loop that tunes only
    the disambiguator still extracts with the domain's extractor. Programs left out run their
    packaged instruction, as before.

    Args:
        programs: the tuned program names.
        corpus: corpus name (the registry names prompts per corpus).
        registry: the prompt registry, or None (then the same as :func:`initial_prompts`).

    Raises:
        ConfigError: a program has no packaged instruction.
    """
    out = initial_prompts(programs, corpus=corpus, registry=registry)
    if registry is None:
        return out
    for program in program_names():
        if program not in out:
            text = initial_prompts((program,), corpus=corpus, registry=registry)[program]
            if text != get_program_task(program).start_instruction():
                out[program] = text
    return out


def _summary_metrics(prefix: str, summary: RunSummary, score: float) -> dict[str, float]:
    n = max(summary.n_total, 1)
    return {
        f"{prefix}_score": score,
        f"{prefix}_accuracy": float(summary.accuracy or 0.0),
        f"{prefix}_em": summary.em,
        f"{prefix}_f1": summary.f1,
        f"{prefix}_input_tokens": float(summary.input_tokens + summary.tool_input_tokens),
        f"{prefix}_input_tokens_per_question": (summary.input_tokens + summary.tool_input_tokens) / n,
        f"{prefix}_output_tokens": float(summary.output_tokens),
        f"{prefix}_timeouts": float(summary.timeouts),
        f"{prefix}_force_committed": float(summary.force_committed),
        f"{prefix}_questions": float(summary.n_total),
        # the agent's input tokens per question by component (issue 39.1); ':' is not a metric character
        **{
            f"{prefix}_input_tokens_{k.replace(':', '.')}": v
            for k, v in summary.input_split_per_question.items()
        },
    }


def _register(
    registry: PromptRegistryProtocol,
    corpus: str,
    setting: Setting,
    programs: Sequence[str],
    tags: Mapping[str, str],
    promote: bool = True,
) -> dict[str, int]:
    versions: dict[str, int] = {}
    for program in programs:
        name = prompt_name(corpus, program)
        pv = registry.register(
            name,
            setting.prompts[program],
            tags=tags,
            commit_message=f"accepted by kitune optimize ({program})",
        )
        registry.set_alias(name, "candidate", pv.version)
        if promote:
            registry.promote(name, pv.version)
        versions[program] = pv.version
    return versions


def run_loop(
    env: LoopEnv,
    start: Setting,
    *,
    iterations: int,
    state_dir: Path,
    tracker: Tracker,
    registry: PromptRegistryProtocol | None = None,
    corpus: str = "corpus",
    weights: LoopWeights | None = None,
    accept_margin: float = 0.0,
    params: Mapping[str, Any] | None = None,
    on_iteration: Callable[[IterationRecord], None] | None = None,
    max_failed_share: float = 0.2,
    require_significance: bool = False,
    seed: int = 0,
    promote: bool = True,
    decision_rule: DecisionRuleName = "stage",
    alpha: float = 0.05,
    min_effect: float = 0.02,
    noninferiority_margin: float = 0.10,
) -> LoopResult:
    """Run (or resume) ``iterations`` iterations of the loop (see the module docstring).

    Args:
        env: evaluates and improves settings.
        start: the setting to start from (ignored when a saved state resumes).
        iterations: total iterations wanted (finished ones from a saved state count), ≥ 1.
        state_dir: where ``loop_state.json``, ``failure_ledger.json`` and the curves live.
        tracker: one run per iteration (``iteration-<i>``), nested under the caller's open run.
        registry: the prompt registry; None skips registration.
        corpus: corpus name for prompt names.
        weights: loop-score weights (None: defaults).
        accept_margin: the paired score difference must exceed this (0.0: any strict gain).
        params: extra params logged on every iteration run.
        on_iteration: called after each new iteration.
        max_failed_share: above this share of failed questions in a run the loop decides nothing.
        require_significance: also require the paired bootstrap interval above 0 to accept.
        seed: seeds the paired bootstrap.
        promote: point ``production`` at an accepted version (False: ``candidate`` only, staged).
        require_significance: also require the paired bootstrap interval above 0 to accept
            (permissive rule only).
        seed: seeds the paired bootstrap and the stage rule's tests.
        decision_rule: ``stage`` (:func:`~kitune.optimizers.acceptance.decide_stage`: a paired
            test per change on its stage metric, the default) or ``permissive``
            (:func:`~kitune.optimizers.acceptance.decide`, the old rule: ``accept_margin`` and
            ``require_significance`` apply to it only).
        alpha: the stage rule's round-level one-sided level.
        min_effect: the stage rule's smallest stage-metric gain worth a change.
        noninferiority_margin: the stage rule's end-to-end accuracy margin.

    Returns:
        The :class:`LoopResult`.

    Raises:
        ValueError: ``iterations`` < 1, ``accept_margin`` < 0 or ``max_failed_share`` outside 0–1.
        TrackingError: registering an accepted prompt failed (the iteration is not recorded, so
            a rerun retries it).
    """
    if iterations < 1:
        raise ValueError(f"iterations={iterations}: run at least 1")
    if accept_margin < 0:
        raise ValueError(f"accept_margin={accept_margin}: use 0 or more")
    if not 0.0 <= max_failed_share <= 1.0:
        raise ValueError(f"max_failed_share={max_failed_share}: use a share between 0 and 1")
    state_path = state_dir / "loop_state.json"
    history, saved, reference = read_state(state_path)
    ledger = FailureLedger(state_dir / "failure_ledger.json")
    current = saved or start
    tokens_used = getattr(env, "tokens_used", None)
    rule = _Rule(
        accept_margin,
        max_failed_share,
        require_significance,
        seed,
        weights,
        decision_rule,
        alpha,
        min_effect,
        noninferiority_margin,
    )
    for i in range(len(history), iterations):
        spent_before = tokens_used() if callable(tokens_used) else None
        started = time.monotonic()
        measured = _measure(env, current, i, ledger, reference, weights)
        measure_s = time.monotonic() - started
        run_params = {
            **dict(params or {}),
            "iteration": i,
            "setting": current.key,
            "accept_margin": accept_margin,
            "max_failed_share": max_failed_share,
            "decision_rule": decision_rule,
            **(
                {"alpha": alpha, "min_effect": min_effect, "noninferiority_margin": noninferiority_margin}
                if decision_rule == "stage"
                else {}
            ),
            **{f"knob.{k}": v for k, v in current.knobs.items()},
        }
        with tracker.run(f"iteration-{i}", run_params, tags={"kitune.kind": "iteration"}) as handle:
            rid = handle.run_id
            _log_measured(tracker, rid, i, current, measured)
            proposed = _propose(env, current, measured.tune, i, ledger, rule)
            paired, decision = _decide(measured, proposed, rule)
            spent = (
                (tokens_used() - spent_before) if callable(tokens_used) and spent_before is not None else None
            )
            timings = {"measure_s": measure_s, **proposed.timings, "total_s": time.monotonic() - started}
            record = _log_outcome(
                tracker, rid, i, current, measured, proposed, paired, decision, reference, rule, ledger, spent
            )
            record = replace(record, timings={k: round(v, 1) for k, v in timings.items()})
            tracker.log_metrics({f"time_{k}": v for k, v in timings.items()}, step=i, run_id=rid)
            if decision.accepted and registry is not None and proposed.changed:
                tags = {
                    "kitune.run_id": rid or "",
                    "kitune.val_score": f"{record.candidate_val_score:.4f}",
                    "kitune.iteration": str(i),
                }
                registered = _register(
                    registry, corpus, proposed.proposal.setting, proposed.changed, tags, promote
                )
                record = replace(record, registered=registered)
        write_proposal(state_dir, record, current, proposed.proposal)
        if decision.accepted:
            current = proposed.proposal.setting
        history.append(record)
        write_state(state_path, history, current, reference)
        ledger.save()
        if on_iteration is not None:
            on_iteration(record)
    md, png = write_curves(history, state_dir)
    (state_dir / "failure_ledger.md").write_text(ledger.to_markdown(), encoding="utf-8")
    return LoopResult(setting=current, history=tuple(history), curves_md=md, curves_png=png)


@dataclass(frozen=True)
class _Rule:
    """The accept rule's settings for one run of the loop."""

    margin: float
    max_failed_share: float
    require_significance: bool
    seed: int
    weights: LoopWeights | None
    decision_rule: DecisionRuleName = "stage"
    alpha: float = 0.05
    min_effect: float = 0.02
    noninferiority_margin: float = 0.10


@dataclass(frozen=True)
class _Measured:
    """Step 1–2: the current setting on both splits, scored and recorded in the ledger."""

    tune: Evaluation
    validation: Evaluation
    tune_score: float
    val_score: float
    flips: dict[str, Any]
    kinds: dict[str, Any]
    credit: dict[str, float]
    """``credit_*`` counts after both splits were credited (empty: the environment keeps no credit)."""


@dataclass(frozen=True)
class _Proposed:
    """Steps 3–5: the proposal, its sanity problems, and both settings on validation now."""

    proposal: Proposal
    changed: list[str]
    """Programs whose instruction the proposal changes."""
    knobs_changed: bool
    reads_changed: bool
    """A knob or a read (not write-only) instruction changed: the candidate was evaluated."""
    problems: list[str]
    after: Evaluation
    """The current setting on validation, re-measured on the store as it is after improving."""
    candidate: Evaluation
    """The proposal on validation (``after`` itself when it reads nothing new or failed sanity)."""
    timings: dict[str, float]
    """Wall seconds of the improve step, the re-measurement and the candidate's evaluation."""
    batches: tuple[ChangeDecision, ...] = ()
    """The stage rule's verdict on each KI batch the improve step wrote (feedback KIs); a batch
    not accepted was retired before ``after`` and ``candidate`` were measured."""


def _measure(
    env: LoopEnv,
    current: Setting,
    i: int,
    ledger: FailureLedger,
    reference: dict[str, RunStats],
    weights: LoopWeights | None,
) -> _Measured:
    """Evaluate ``current`` on both splits, score them against the reference, record the ledger."""
    tune = env.evaluate(current, "tune")
    val = env.evaluate(current, "validation")
    reference.setdefault("tune", run_stats(tune.summary))
    reference.setdefault("validation", run_stats(val.summary))
    ledger.record(i, "tune", tune.traces, gold_docids=tune.gold_docids, retrieved=tune.retrieved)
    ledger.record(i, "validation", val.traces, gold_docids=val.gold_docids, retrieved=val.retrieved)
    credit: dict[str, float] = {}
    record_credit = getattr(env, "record_credit", None)
    if callable(record_credit):
        for split, evaluation in (("tune", tune), ("validation", val)):
            credit = dict(record_credit(current, i, split, evaluation))
    return _Measured(
        tune=tune,
        validation=val,
        tune_score=loop_score(tune.summary, reference["tune"], weights),
        val_score=loop_score(val.summary, reference["validation"], weights),
        flips={split: ledger.flips(i, split) for split in ("tune", "validation")},
        kinds={split: ledger.kind_counts(i, split) for split in ("tune", "validation")},
        credit=credit,
    )


def _propose(
    env: LoopEnv, current: Setting, tune: Evaluation, i: int, ledger: FailureLedger, rule: _Rule
) -> _Proposed:
    """Improve, check the changed instructions, re-measure the current setting, evaluate the proposal.

    Under the stage rule the KI batches the improve step kept (feedback KIs) are decided right
    after the re-measurement (:func:`_decide_batches`); a batch that is not accepted is retired and
    the current setting re-measured, so the proposal is compared on the store the round keeps.
    """
    t0 = time.monotonic()
    proposal = env.improve(current, tune, i, ledger=ledger)
    ledger.save()
    t1 = time.monotonic()
    changed = proposal.setting.changed_programs(current)
    knobs_changed = dict(proposal.setting.knobs) != dict(current.knobs)
    problems = [
        f"{program}: {problem}"
        for program in changed
        for problem in check_instruction(
            program, current.prompts.get(program, ""), proposal.setting.prompts.get(program, "")
        )
    ]
    # the improve step may have written KIs: re-measure the current setting on the store as it is
    # now, so current and candidate are compared on one store state
    after = env.evaluate(current, "validation")
    batches: tuple[ChangeDecision, ...] = ()
    if rule.decision_rule == "stage":
        batches = _decide_batches(env, current, proposal, after, i, ledger, rule, changed, knobs_changed)
        if any(b.outcome != "accepted" for b in batches):
            after = env.evaluate(current, "validation")  # on the store without the undone batch
    t2 = time.monotonic()
    reads_changed = knobs_changed or eval_key(proposal.setting) != eval_key(current)
    candidate = env.evaluate(proposal.setting, "validation") if reads_changed and not problems else after
    timings = {"improve_s": t1 - t0, "revalidate_s": t2 - t1, "candidate_s": time.monotonic() - t2}
    return _Proposed(
        proposal, changed, knobs_changed, reads_changed, problems, after, candidate, timings, batches
    )


def _decide_batches(
    env: LoopEnv,
    current: Setting,
    proposal: Proposal,
    after: Evaluation,
    i: int,
    ledger: FailureLedger,
    rule: _Rule,
    changed: Sequence[str],
    knobs_changed: bool,
) -> tuple[ChangeDecision, ...]:
    """Decide each KI batch of ``proposal.notes`` on validation and retire the ones not accepted.

    Each batch (:class:`~kitune.optimizers.acceptance.KIBatch`) is tested for non-inferiority on
    its stage metric (the validation questions' gold reciprocal ranks before it vs ``after``) and
    end to end (the validation questions the agent ran both times; on the answers alone when no
    validation question has a gold document: :func:`~kitune.optimizers.acceptance.batch_tests`),
    at ``alpha`` over every test
    of the round (:func:`~kitune.optimizers.acceptance.round_tests`: the proposal's changes and
    the batches). Not accepted ⇒ its KIs are retired through ``env.retire(setting, ids,
    reason="decision")`` and the ledger's attempts marked ``decision``.
    """
    raw = proposal.notes.get(KI_BATCHES_NOTE) or []
    batches = [KIBatch.from_dict(b) for b in raw]
    if not batches:
        return ()
    m = round_tests(changed, knobs_changed, len(batches))
    now = after.stages.per_question if after.stages is not None else {}
    out: list[ChangeDecision] = []
    for batch in batches:
        test, e2e = batch_tests(
            batch.before,
            now.get(batch.metric, {}),
            batch.before_e2e,
            trace_values(after.traces),
            metric=batch.metric,
            margin=rule.noninferiority_margin,
            alpha=rule.alpha,
            seed=rule.seed,
        )
        verdict = decide_noninferior(
            batch.change,
            test,
            alpha=rule.alpha,
            tests_in_round=m,
            end_to_end=e2e,
            noninferiority_margin=rule.noninferiority_margin,
        )
        logger.info("iteration decision on %s (%d KIs): %s", batch.change, len(batch.ki_ids), verdict.reason)
        if verdict.outcome != "accepted":
            retire = getattr(env, "retire", None)
            if callable(retire):
                retire(current, list(batch.ki_ids), reason="decision")
                ledger.note_gate(i, {k: ("decision", ()) for k in batch.ki_ids})
            else:
                verdict = replace(
                    verdict, reason=verdict.reason + " (the environment cannot retire KIs: kept)"
                )
        out.append(verdict)
    return tuple(out)


def _decide(m: _Measured, p: _Proposed, rule: _Rule) -> tuple[PairedComparison, Decision]:
    """Pair current and candidate on validation and apply the configured decision rule.

    ``stage``: :func:`~kitune.optimizers.acceptance.decide_stage` on the per-question stage values
    of both validation runs (``Evaluation.stages.per_question``) and their traces; ``permissive``:
    :func:`~kitune.optimizers.acceptance.decide`.
    """
    paired = compare_paired(p.after.traces, p.candidate.traces, rule.weights, seed=rule.seed)
    n_tune = m.tune.summary.n_total
    tune_failed = m.tune.summary.n_failed / n_tune if n_tune else 0.0
    if rule.decision_rule == "stage":
        decision = decide_stage(
            paired,
            p.after.stages.per_question if p.after.stages is not None else {},
            p.candidate.stages.per_question if p.candidate.stages is not None else {},
            p.after.traces,
            p.candidate.traces,
            changed_programs=p.changed,
            knobs_changed=p.knobs_changed,
            reads_changed=p.reads_changed,
            task_metrics=p.proposal.metrics,
            sanity_problems=p.problems,
            alpha=rule.alpha,
            min_effect=rule.min_effect,
            noninferiority_margin=rule.noninferiority_margin,
            max_failed_share=rule.max_failed_share,
            tune_failed_share=tune_failed,
            seed=rule.seed,
            other_tests=len(p.batches),
        )
        for change in decision.changes:
            logger.info("iteration decision on %s: %s", change.change, change.reason)
        if p.batches:  # recorded with the proposal's changes; the proposal's outcome is its own
            reason = "; ".join([decision.reason, *(f"{b.change}: {b.reason}" for b in p.batches)])
            decision = replace(decision, reason=reason, changes=decision.changes + p.batches)
        return paired, decision
    decision = decide(
        paired,
        changed_programs=p.changed,
        knobs_changed=p.knobs_changed,
        reads_changed=p.reads_changed,
        task_metrics=p.proposal.metrics,
        sanity_problems=p.problems,
        margin=rule.margin,
        max_failed_share=rule.max_failed_share,
        require_significance=rule.require_significance,
        tune_failed_share=tune_failed,
    )
    return paired, decision


def _log_measured(tracker: Tracker, rid: str | None, i: int, current: Setting, m: _Measured) -> None:
    """Log the measurement before improving (so a failed improve step still leaves it)."""
    metrics = {
        **_summary_metrics("tune", m.tune.summary, m.tune_score),
        **_summary_metrics("val", m.validation.summary, m.val_score),
        **{f"tune_{k}": v for k, v in m.tune.metrics.items()},
        **{f"val_{k}": v for k, v in m.validation.metrics.items()},
        **m.credit,
        **{f"tune_kind_{k}": float(v) for k, v in m.kinds["tune"].items()},
        **{f"val_kind_{k}": float(v) for k, v in m.kinds["validation"].items()},
        "tune_flips_fixed": float(len(m.flips["tune"]["fixed"])),
        "tune_flips_broken": float(len(m.flips["tune"]["broken"])),
        "val_flips_fixed": float(len(m.flips["validation"]["fixed"])),
        "val_flips_broken": float(len(m.flips["validation"]["broken"])),
    }
    tracker.log_metrics(metrics, step=i, run_id=rid)
    log_candidate(tracker, current.prompts, "prompts/current", run_id=rid)


def _log_outcome(
    tracker: Tracker,
    rid: str | None,
    i: int,
    current: Setting,
    m: _Measured,
    p: _Proposed,
    paired: PairedComparison,
    decision: Decision,
    reference: Mapping[str, RunStats],
    rule: _Rule,
    ledger: FailureLedger,
    spent: int | None,
) -> IterationRecord:
    """Log the proposal, the comparison and the decision; return the iteration's record."""
    after_score = loop_score(p.after.summary, reference["validation"], rule.weights)
    cand_score = loop_score(p.candidate.summary, reference["validation"], rule.weights)
    tracker.log_metrics(
        {
            **_summary_metrics("candidate_val", p.candidate.summary, cand_score),
            **{f"improve_{k}": v for k, v in p.proposal.metrics.items()},
            **paired.to_metrics(),
            **{f"candidate_val_{k}": v for k, v in p.candidate.metrics.items()},
            **{f"val_after_{k}": v for k, v in p.after.metrics.items()},
            "val_after_score": after_score,
            "accepted": float(decision.accepted),
            "undecided": float(decision.outcome == "undecided"),
            "not_enough_evidence": float(decision.outcome == "not_enough_evidence"),
            **{k: v for change in decision.changes for k, v in change.to_metrics().items()},
            "score_gain": cand_score - after_score,
            **({"iteration_tokens": float(spent)} if spent is not None else {}),
            **{f"ledger_{k}": float(v) for k, v in ledger.feedback_summary().items()},
        },
        step=i,
        run_id=rid,
    )
    log_candidate(tracker, p.proposal.setting.prompts, "prompts/candidate", run_id=rid)
    for program, module in p.proposal.programs.items():
        log_program_state(tracker, module, f"programs/{program}.json", run_id=rid)
    notes = {**dict(p.proposal.notes), "decision": decision.outcome, "reason": decision.reason}
    if decision.changes:
        notes["decisions"] = [c.to_dict() for c in decision.changes]
    if p.problems:
        notes["sanity_problems"] = p.problems
    tracker.log_dict(notes, "improve.json", run_id=rid)
    tracker.log_dict(ledger.to_dict(), "failure_ledger.json", run_id=rid)
    tracker.log_dict(
        {
            "tune": [t.to_dict() for t in m.tune.traces],
            "validation": [t.to_dict() for t in m.validation.traces],
            "validation_after_improve": [t.to_dict() for t in p.after.traces],
            "candidate_validation": [t.to_dict() for t in p.candidate.traces],
        },
        "traces.json",
        run_id=rid,
    )
    log_episodes = getattr(tracker, "log_episodes", None)
    if callable(log_episodes):
        log_episodes(list(m.tune.traces), run_id=rid, name=f"iteration-{i}-tune")
        log_episodes(list(m.validation.traces), run_id=rid, name=f"iteration-{i}-validation")
    tune, val = m.tune.summary, m.validation.summary
    return IterationRecord(
        iteration=i,
        current_key=current.key,
        candidate_key=p.proposal.setting.key,
        tune_score=m.tune_score,
        val_score=m.val_score,
        candidate_val_score=cand_score,
        accepted=decision.accepted,
        tune_accuracy=tune.accuracy,
        val_accuracy=val.accuracy,
        candidate_val_accuracy=p.candidate.summary.accuracy,
        run_id=rid,
        changed=tuple(p.changed),
        decision=decision.outcome,
        reason=decision.reason,
        val_after_score=after_score,
        val_after_accuracy=p.after.summary.accuracy,
        tune_ci=wilson_interval(tune.n_correct, tune.n_graded),
        val_ci=wilson_interval(val.n_correct, val.n_graded),
        n_tune=tune.n_total,
        n_val=val.n_total,
        paired=paired.to_dict(),
        flips=m.flips,
        failure_kinds=m.kinds,
        failed={"tune": tune.n_failed, "validation": val.n_failed},
        tokens_used=spent,
        stages={
            name: [asdict(x) for x in e.stages.metrics]
            for name, e in (
                ("tune", m.tune),
                ("validation", m.validation),
                ("validation_after", p.after),
                ("candidate_validation", p.candidate),
            )
            if e.stages is not None
        },
        improve={k: float(v) for k, v in p.proposal.metrics.items()},
        gate=dict(p.proposal.notes.get("gate") or {}),
        credit={k.removeprefix("credit_"): int(v) for k, v in m.credit.items()},
        decisions=[c.to_dict() for c in decision.changes],
    )
