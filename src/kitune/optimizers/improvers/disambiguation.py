"""The ``disambiguation`` improver: feedback KIs from tuning failures, routed by kind, through the gate.

Routing (:func:`route_feedback`): only wrong-entity and wrong-number failures go to the
disambiguator (a feedback KI names the right and the wrong answer, so a blank answer cannot make
one: ``out_of_budget`` and blank ``no_candidate`` failures go to the rewriter's and the
extractor's feedback instead, :mod:`kitune.optimizers.routes`), unless the failure ledger says the
question already had ``optimize.max_feedback_attempts`` attempts or one for the same wrong
answer. The setting's disambiguator instruction writes the KIs into the setting's store
(:func:`write_setting_kis`); each outcome is noted in the ledger.

**The gate** (``optimize.gate``, :func:`gate_feedback`): right after the KIs are written, every
tuning and validation question whose logged look-ups now return different KI ids (the
evaluation cache's look-up replay, :meth:`~kitune.optimizers.improve_env.ImproveEnv.lookup_changes`)
is re-run (``env.evaluate`` of both splits re-runs exactly the changed ones) and compared with its
trace before the KIs; a KI blamed for a question that was right and is now wrong (or has no
verdict) is rejected and retired through its status (:func:`kitune.optimizers.gate.run_gate`).
The gate also compares every tuning and validation question's gold reciprocal rank in the top
``k`` before and after (the rewriter's per-question stage values and top-``k`` ids of both
measurements, ``StageReport.per_question`` / ``retrieved``): a KI that loses a neighbour's gold
recall@k or lowers its reciprocal rank by more than ``optimize.gate_rank_tolerance`` is rejected
as ``retrieval``.
Metrics ``gate_*``, the report in ``improve.json`` (``gate``), the ledger's attempts marked
(``FailureLedger.note_gate``). Then the tuning flips are counted on the store as it is after the
gate. Runs when ``--feedback`` is on and the tuning run has failures.

**The decision** (``optimize.decision_rule: stage``): the gate is the first filter; the KIs it
keeps are one batch, handed to the loop under ``Proposal.notes[KI_BATCHES_NOTE]``
(:class:`~kitune.optimizers.acceptance.KIBatch`: the ids and validation's gold reciprocal ranks
and answers before the batch), which decides it with the round's other changes
(:func:`~kitune.optimizers.acceptance.decide_noninferior`) and retires it unless accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kitune.optimizers.acceptance import BATCH_METRIC, FEEDBACK_BATCH, KI_BATCHES_NOTE, KIBatch, trace_values
from kitune.optimizers.feedback import FeedbackReport, count_flips, write_disambiguation_kis
from kitune.optimizers.gate import GateReport, RankChange, attribute_changes, rank_changes, run_gate
from kitune.optimizers.improve_env import ImproveEnv, ImproveInput, Improvement
from kitune.optimizers.ledger import FailureLedger
from kitune.optimizers.routes import kinds_routed_to
from kitune.optimizers.setting import Setting
from kitune.programs.disambiguator import Disambiguator

if TYPE_CHECKING:
    from kitune.config import KituneConfig
    from kitune.evaluation.stage_metrics import StageReport
    from kitune.evaluation.trace import Trace
    from kitune.optimizers.setting import Evaluation
    from kitune.schema import Document

__all__ = [
    "DisambiguationFeedback",
    "gate_feedback",
    "route_feedback",
    "write_feedback",
    "write_setting_kis",
]


def route_feedback(
    failures: Sequence[Any],
    kinds: Mapping[str, str | None],
    ledger: FailureLedger | None,
    *,
    max_attempts: int,
) -> tuple[list[Any], dict[str, int]]:
    """Which failures go to the disambiguator this iteration, and why the others do not.

    A failure goes when the feedback route table sends its kind to ``disambiguation``
    (:func:`kitune.optimizers.routes.kinds_routed_to`: ``wrong_entity``, ``wrong_number``) and
    it has a non-blank answer, and the ledger allows another attempt (fewer than
    ``max_attempts`` so far, and not for the same wrong answer as before). Blank answers
    (``out_of_budget``, blank ``no_candidate``) never go: a feedback KI names the wrong answer,
    and those failures have their own route to the rewriter and the extractor.

    Returns:
        ``(failures to send, reason → count of the ones held back)``; reasons are the failure
        kind (``no_candidate``, ``out_of_budget`` …, those go to extractor and rewriter feedback
        instead), ``blank_answer`` (a disambiguation kind without an answer), ``max_attempts``
        and ``same_wrong_answer``.
    """
    routed: list[Any] = []
    skipped: dict[str, int] = {}
    mine = kinds_routed_to("disambiguation")
    for f in failures:
        kind = kinds.get(f.query_id)
        if kind not in mine or not f.prediction.strip():
            why = str(kind) if kind not in mine else "blank_answer"
            skipped[why] = skipped.get(why, 0) + 1
            continue
        if ledger is not None:
            ok, why = ledger.should_attempt(f.query_id, f.prediction, max_attempts)
            if not ok:
                skipped[why] = skipped.get(why, 0) + 1
                continue
        routed.append(f)
    return routed, skipped


def write_setting_kis(
    env: ImproveEnv,
    setting: Setting,
    failures: Sequence[Any],
    *,
    cfg: KituneConfig,
    lm: Any,
    get_document: Callable[[str], Document],
    what: str = "failure(s)",
) -> FeedbackReport:
    """Write disambiguation KIs from ``failures`` into the setting's store.

    The setting's disambiguator prompt writes them; the extract LM answers; candidates come from
    the setting's ``get_context`` at its default size.

    Args:
        env: the loop's environment (store, look-ups, log).
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
    env: ImproveEnv,
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
        env: the loop's environment.
        setting: whose store the KIs were written to.
        ki_ids: the KIs written.
        before_state: :meth:`~kitune.optimizers.improve_env.ImproveEnv.store_state` before writing.
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


def write_feedback(
    env: ImproveEnv,
    inp: ImproveInput,
    failures: Sequence[Any],
    notes: dict[str, Any],
) -> dict[str, float]:
    """Write disambiguation KIs from ``failures``, note them in the ledger, gate them, count tuning flips.

    With ``optimize.gate`` the KIs go through :func:`gate_feedback` first. The flips are measured
    by evaluating the setting on the tuning split again: the store has changed, so only the
    questions whose look-ups now return something different re-run, and the next iteration
    reuses these traces.
    """
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
    metrics = report.to_metrics()
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
    return metrics


def _batch(kept: Sequence[str], before: Evaluation) -> KIBatch:
    """The kept feedback KIs with validation's gold reciprocal ranks and answers before them."""
    ranks = before.stages.per_question.get(BATCH_METRIC, {}) if before.stages is not None else {}
    return KIBatch(FEEDBACK_BATCH, tuple(kept), BATCH_METRIC, dict(ranks), trace_values(before.traces))


class DisambiguationFeedback:
    """The ``disambiguation`` improver (see the module docstring)."""

    name = "disambiguation"

    def improve(self, env: ImproveEnv, inp: ImproveInput) -> Improvement:
        """Route the failures, write KIs for the routed ones, count what they fixed on the tuning split."""
        out = Improvement()
        if not inp.options.feedback or not inp.failures:
            return out
        routed, skipped = route_feedback(
            inp.failures, inp.kinds, inp.ledger, max_attempts=inp.cfg.optimize.max_feedback_attempts
        )
        out.metrics.update({f"feedback_skipped_{k}": float(v) for k, v in skipped.items()})
        if routed:
            out.metrics.update(write_feedback(env, inp, routed, out.notes))
        return out


DISAMBIGUATION = DisambiguationFeedback()

PLUGINS = {DISAMBIGUATION.name: DISAMBIGUATION}
"""This module's improver, registered by :data:`kitune.optimizers.improver.IMPROVERS`."""
