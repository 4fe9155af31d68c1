"""The loop's side of feedback KIs: write them, gate them, note them in the ledger, count the flips.

The ``disambiguation`` improver (:mod:`kitune.optimizers.improvers.disambiguation`) only decides
*which* tuning failures get a feedback KI (``Improvement.feedback``); writing to the KI store,
re-running the agent and retiring are the loop's, so they are here, called by the loop's improve
step (:meth:`kitune.service.tuning.loop_env.ServiceLoopEnv.improve` hands :func:`apply_feedback`
to :func:`kitune.optimizers.improver.run_improvers`, which calls it on each improvement as it
returns, before the next improver runs).

:func:`write_setting_kis`: the setting's disambiguator instruction writes one KI per failure
into the setting's store (the extract LM answers; kept only when retrieved for its question).

**The gate** (``optimize.gate``, :func:`gate_feedback`): right after the KIs are written, every
tuning and validation question whose logged look-ups now return different KI ids (the
evaluation cache's look-up replay, :meth:`FeedbackServices.lookup_changes`) is re-run
(``evaluate`` of both splits re-runs exactly the changed ones) and compared with its trace before
the KIs; a KI blamed for a question that was right and is now wrong (or has no verdict) is
rejected and retired through its status (:func:`kitune.optimizers.gate.run_gate`). The gate also
compares every tuning and validation question's gold reciprocal rank in the top ``k`` before and
after (the rewriter's per-question stage values and top-``k`` ids of both measurements,
``StageReport.per_question`` / ``retrieved``): a KI that loses a neighbour's gold recall@k or
lowers its reciprocal rank by more than ``optimize.gate_rank_tolerance`` is rejected as
``retrieval``. Metrics ``gate_*``, the report in ``improve.json`` (``gate``), the ledger's
attempts marked (``FailureLedger.note_gate``). Then the tuning flips are counted on the store as
it is after the gate.

**The decision** (``optimize.decision_rule: stage``): the gate is the first filter; the KIs it
keeps are one batch, handed to the loop under ``Proposal.notes[KI_BATCHES_NOTE]``
(:class:`~kitune.optimizers.acceptance.KIBatch`: the ids and validation's gold reciprocal ranks
and answers before the batch), which decides it with the round's other changes
(:func:`~kitune.optimizers.acceptance.decide_noninferior`) and retires it unless accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from kitune.optimizers.acceptance import BATCH_METRIC, FEEDBACK_BATCH, KI_BATCHES_NOTE, KIBatch, trace_values
from kitune.optimizers.feedback import FeedbackReport, count_flips, write_disambiguation_kis
from kitune.optimizers.gate import GateReport, RankChange, attribute_changes, rank_changes, run_gate
from kitune.optimizers.improve_env import ImproveInput, Improvement
from kitune.optimizers.setting import Evaluation, Setting
from kitune.programs.disambiguator import Disambiguator

if TYPE_CHECKING:
    from kitune.config import KituneConfig
    from kitune.evaluation.stage_metrics import StageReport
    from kitune.evaluation.trace import Trace
    from kitune.retrieval.base import Store
    from kitune.schema import Document

__all__ = ["FeedbackServices", "apply_feedback", "gate_feedback", "write_setting_kis"]


class FeedbackServices(Protocol):
    """The loop's services the feedback step uses (``ServiceLoopEnv`` has them): store, runs, retirement.

    Contract as :class:`~kitune.optimizers.improve_env.ImproveEnv`'s; these are the members that
    change the KI store or run the agent, so no improver sees them.
    """

    def log(self, message: str) -> None:
        """A progress line."""
        ...

    def store_for(self, setting: Setting) -> Store:
        """The KI store of the setting's extractor version."""
        ...

    def context_ids(self, setting: Setting, size: int | None = None) -> Callable[[str], list[str]]:
        """Query → the KI ids ``get_context`` returns on the setting's store (plain plan)."""
        ...

    def store_state(self, setting: Setting) -> str:
        """Fingerprint of what the setting's look-ups read now (KI store content + credit penalties)."""
        ...

    def lookup_changes(
        self, setting: Setting, before_state: str
    ) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """KI ids each question's logged look-ups showed at ``before_state``, and what they show now.

        Over the tuning and validation questions evaluated for ``setting`` at ``before_state``:
        ``(before, after)``, query id → KI ids (all of its look-ups, in order), ``after`` from
        replaying the same look-ups on the store as it is now.
        """
        ...

    def retire(self, setting: Setting, ki_ids: Sequence[str]) -> int:
        """Set status ``expired`` on ``ki_ids`` in the setting's store; returns how many changed."""
        ...

    def evaluate(self, setting: Setting, split: str) -> Evaluation:
        """Run the agent on ``split`` (``tune``, ``validation``) on the store as it is now."""
        ...


def write_setting_kis(
    env: FeedbackServices,
    setting: Setting,
    failures: Sequence[Any],
    *,
    cfg: KituneConfig,
    lm: Any,
    get_document: Callable[[str], Document],
    what: str = "failure(s)",
) -> FeedbackReport:
    """Write disambiguation KIs from ``failures`` into the setting's store.

    The setting's disambiguator prompt writes them; ``lm`` answers; candidates come from the
    setting's ``get_context`` at its default size.

    Args:
        env: the loop's services (store, look-ups, log).
        setting: whose store and disambiguator prompt are used.
        failures: the wrong answers to write KIs for.
        cfg: the configuration with the setting's knobs applied (``ImproveInput.cfg``).
        lm: the disambiguator's LM (the ``extract`` role).
        get_document: docid → document (``ImproveInput.get_document``).
        what: how the progress line names the failures.

    Returns:
        What :func:`~kitune.optimizers.feedback.write_disambiguation_kis` did.
    """
    store = env.store_for(setting)
    env.log(f"feedback: {len(failures)} {what} → disambiguation KIs")
    return write_disambiguation_kis(
        failures,
        store=store,
        disambiguator=Disambiguator(setting.prompts.get("disambiguator"), corpus=cfg.corpus_name),
        get_document=get_document,
        context_fn=env.context_ids(setting, size=cfg.retrieval.default_size),
        lm=lm,
        top_k=cfg.retrieval.default_size,
    )


def gate_feedback(
    env: FeedbackServices,
    setting: Setting,
    ki_ids: Sequence[str],
    *,
    before_state: str,
    previous: Sequence[Trace],
    before_stages: Sequence[StageReport] = (),
    own: Mapping[str, Sequence[str]] | None = None,
    rank_tolerance: float,
) -> GateReport:
    """Run the gate on the feedback KIs just written (see the module docstring).

    Args:
        env: the loop's services.
        setting: whose store the KIs were written to.
        ki_ids: the KIs written.
        before_state: :meth:`FeedbackServices.store_state` before writing.
        previous: the tuning and validation traces on ``before_state``.
        before_stages: both splits' stage reports on ``before_state`` (empty: no retrieval check).
        own: KI id → the questions it was written for.
        rank_tolerance: ``optimize.gate_rank_tolerance``.

    Returns:
        The :class:`~kitune.optimizers.gate.GateReport`; rejected KIs are retired.
    """
    after: list[Evaluation] = []

    def measured() -> list[Evaluation]:  # both splits on the store with the candidates, once
        if not after:
            after.extend(env.evaluate(setting, split) for split in ("tune", "validation"))
        return after

    def changed(ids: Sequence[str]) -> dict[str, frozenset[str]]:
        before, now = env.lookup_changes(setting, before_state)
        return attribute_changes(before, now, ids)

    def rerun(qids: Sequence[str]) -> list[Trace]:
        wanted = set(qids)
        return [t for e in measured() for t in e.traces if t.query_id in wanted]

    def ranks(ids: Sequence[str]) -> list[RankChange]:
        now = [e.stages for e in measured() if e.stages is not None]
        return rank_changes(
            {q: v for s in before_stages for q, v in s.values("rewriter", "mrr").items()},
            {q: v for s in now for q, v in s.values("rewriter", "mrr").items()},
            {q: ids_ for s in now for q, ids_ in s.retrieved.items()},
            ids,
        )

    report = run_gate(
        ki_ids,
        changed=changed,
        rerun=rerun,
        previous=previous,
        reject=lambda ids: env.retire(setting, ids),
        ranks=ranks if before_stages else None,
        rank_tolerance=rank_tolerance,
        own=own,
    )
    if report.rejected:
        env.log("gate: rejected " + "; ".join(f"{r.ki_id} ({r.reason}: {r.detail})" for r in report.rejected))
    env.log(
        f"gate: {len(report.kept)} of {len(report.candidates)} feedback KI(s) kept; "
        f"{len(report.rerun)} question(s) re-run, {len(report.broken)} broken, {len(report.fixed)} fixed; "
        f"retrieval compared on {report.rank_checked}, {len(report.rank_drops)} fell beyond the tolerance"
    )
    return report


def apply_feedback(env: FeedbackServices, inp: ImproveInput, improvement: Improvement) -> Improvement:
    """Write the KIs ``improvement.feedback`` asks for, note them in the ledger, gate them, count flips.

    Nothing to write (no ``feedback``): ``improvement`` itself. Otherwise a copy with the
    ``feedback_*``, ``gate_*`` and ``flips_*`` metrics and the ``feedback_rejections`` and
    ``gate`` notes added. With ``optimize.gate`` the KIs go through :func:`gate_feedback` first.
    The flips are measured by evaluating the setting on the tuning split again: the store has
    changed, so only the questions whose look-ups now return something different re-run, and the
    next iteration reuses these traces.

    Args:
        env: the loop's services.
        inp: the iteration's improve input (the setting, its tuning run, the config, the LMs,
            the documents, the ledger the outcomes are noted in).
        improvement: what an improver returned.
    """
    failures = improvement.feedback
    if not failures:
        return improvement
    metrics = dict(improvement.metrics)
    notes = dict(improvement.notes)
    gate = inp.cfg.optimize.gate
    decided = inp.cfg.optimize.decision_rule == "stage"  # the loop decides the kept batch
    before_state = env.store_state(inp.setting) if gate else ""
    # both splits on the store as it is before writing: the measured runs, read back from the
    # cache (unless credit demoted a KI since, then the questions whose look-ups it changed re-run)
    measured = (
        [env.evaluate(inp.setting, split) for split in ("tune", "validation")] if gate or decided else []
    )
    previous = [t for e in measured for t in e.traces]
    before_stages = [e.stages for e in measured if e.stages is not None]
    report = write_setting_kis(
        env, inp.setting, failures, cfg=inp.cfg, lm=inp.lms["extract"], get_document=inp.get_document
    )
    if inp.ledger is not None:
        for qid, prediction, ki_id, reason in report.outcomes:
            inp.ledger.note_feedback(inp.iteration, qid, prediction, [ki_id] if ki_id else [], reason)
    metrics.update(report.to_metrics())
    if report.messages:
        notes["feedback_rejections"] = dict(report.messages)  # the first full message per reason
    kept = tuple(report.ki_ids)
    if report.written and gate:
        own: dict[str, list[str]] = {}
        for qid, _prediction, ki_id, _reason in report.outcomes:
            if ki_id:
                own.setdefault(ki_id, []).append(qid)
        g = gate_feedback(
            env,
            inp.setting,
            report.ki_ids,
            before_state=before_state,
            previous=previous,
            before_stages=before_stages,
            own=own,
            rank_tolerance=inp.cfg.optimize.gate_rank_tolerance,
        )
        metrics.update(g.to_metrics())
        notes["gate"] = g.to_dict()
        kept = g.kept
        if inp.ledger is not None:
            inp.ledger.note_gate(inp.iteration, {r.ki_id: (r.reason, r.query_ids) for r in g.rejected})
    if kept and decided:
        notes[KI_BATCHES_NOTE] = [_batch(kept, measured[1]).to_dict()]
    if report.written:
        after = env.evaluate(inp.setting, "tune")
        metrics.update(count_flips(inp.tune.traces, after.traces).to_metrics())
    return replace(improvement, metrics=metrics, notes=notes)


def _batch(kept: Sequence[str], before: Evaluation) -> KIBatch:
    """The kept feedback KIs with validation's gold reciprocal ranks and answers before them."""
    ranks = before.stages.per_question.get(BATCH_METRIC, {}) if before.stages is not None else {}
    return KIBatch(FEEDBACK_BATCH, tuple(kept), BATCH_METRIC, dict(ranks), trace_values(before.traces))
