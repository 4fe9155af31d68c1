"""The ``disambiguation`` improver: feedback KIs from the tuning failures, routed by failure kind.

Routing (:func:`route_feedback`): wrong-entity and wrong-number failures (and blank answers, to
be counted as rejected ``empty_prediction`` candidates) go to the disambiguator, unless the
failure ledger says the question already had ``optimize.max_feedback_attempts`` attempts or one
for the same wrong answer. The setting's disambiguator instruction writes the KIs into the
setting's store (:func:`write_setting_kis`); each outcome is noted in the ledger; when KIs were
written, the tuning split is evaluated again (only questions whose look-ups changed re-run) and
the flips are counted. Runs when ``--feedback`` is on and the tuning run has failures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kitune.optimizers.feedback import FeedbackReport, count_flips, write_disambiguation_kis
from kitune.optimizers.improve_env import ImproveEnv, ImproveInput
from kitune.optimizers.improver import Improvement, register_improver
from kitune.optimizers.ledger import FailureLedger
from kitune.optimizers.setting import Setting

__all__ = [
    "DISAMBIGUATION_KINDS",
    "DisambiguationFeedback",
    "route_feedback",
    "write_feedback",
    "write_setting_kis",
]

DISAMBIGUATION_KINDS = ("wrong_entity", "wrong_number")
"""Failure kinds the feedback step turns into disambiguation KIs."""


def route_feedback(
    failures: Sequence[Any],
    kinds: Mapping[str, str | None],
    ledger: FailureLedger | None,
    *,
    max_attempts: int,
) -> tuple[list[Any], dict[str, int]]:
    """Which failures go to the disambiguator this iteration, and why the others do not.

    A failure goes when its kind is in :data:`DISAMBIGUATION_KINDS` (a blank answer goes too, to
    be counted as a rejected ``empty_prediction`` candidate) and the ledger allows another
    attempt (fewer than ``max_attempts`` so far, and not for the same wrong answer as before).

    Returns:
        ``(failures to send, reason → count of the ones held back)``; reasons are the failure
        kind (``no_candidate`` …, those go to extractor and rewriter feedback instead),
        ``max_attempts`` and ``same_wrong_answer``.
    """
    routed: list[Any] = []
    skipped: dict[str, int] = {}
    for f in failures:
        kind = kinds.get(f.query_id)
        if f.prediction.strip() and kind not in DISAMBIGUATION_KINDS:
            skipped[str(kind)] = skipped.get(str(kind), 0) + 1
            continue
        if ledger is not None and f.prediction.strip():
            ok, why = ledger.should_attempt(f.query_id, f.prediction, max_attempts)
            if not ok:
                skipped[why] = skipped.get(why, 0) + 1
                continue
        routed.append(f)
    return routed, skipped


def write_setting_kis(
    env: ImproveEnv, setting: Setting, failures: Sequence[Any], *, what: str = "failure(s)"
) -> FeedbackReport:
    """Write disambiguation KIs from ``failures`` into the setting's store.

    The setting's disambiguator prompt writes them; the extract LM answers; candidates come from
    the setting's ``get_context`` at its default size.

    Args:
        env: the loop's environment (store, documents, LMs, log).
        setting: whose store, knobs and disambiguator prompt are used.
        failures: the wrong answers to write KIs for.
        what: how the progress line names the failures.

    Returns:
        What :func:`~kitune.optimizers.feedback.write_disambiguation_kis` did.
    """
    from kitune.programs.disambiguator import Disambiguator

    store = env.store_for(setting)
    cfg = env.setting_cfg(setting)
    env.log(f"feedback: {len(failures)} {what} → disambiguation KIs")
    return write_disambiguation_kis(
        failures,
        store=store,
        disambiguator=Disambiguator(setting.prompts.get("disambiguator"), corpus=cfg.corpus_name),
        get_document=env.get_document,
        context_fn=env.context_ids(setting, size=cfg.retrieval.default_size),
        lm=env.deps.lms["extract"],
        top_k=cfg.retrieval.default_size,
    )


def write_feedback(
    env: ImproveEnv,
    inp: ImproveInput,
    failures: Sequence[Any],
    notes: dict[str, Any],
) -> dict[str, float]:
    """Write disambiguation KIs from ``failures``, note them in the ledger, count tuning flips.

    The flips are measured by evaluating the setting on the tuning split again: the store has
    changed, so only the questions whose look-ups now return something different re-run, and
    the next iteration reuses these traces.
    """
    report = write_setting_kis(env, inp.setting, failures)
    if inp.ledger is not None:
        for qid, prediction, ki_id, reason in report.outcomes:
            inp.ledger.note_feedback(inp.iteration, qid, prediction, [ki_id] if ki_id else [], reason)
    metrics = report.to_metrics()
    if report.messages:
        notes["feedback_rejections"] = dict(report.messages)  # the first full message per reason
    if report.written:
        after = env.evaluate(inp.setting, "tune")
        metrics.update(count_flips(inp.tune.traces, after.traces).to_metrics())
    return metrics


class DisambiguationFeedback:
    """The ``disambiguation`` improver (see the module docstring)."""

    name = "disambiguation"

    def improve(self, env: ImproveEnv, inp: ImproveInput) -> Improvement:
        """Route the failures, write KIs for the routed ones, count what they fixed on the tuning split."""
        out = Improvement()
        if not env.opts.feedback or not inp.failures:
            return out
        routed, skipped = route_feedback(
            inp.failures, inp.kinds, inp.ledger, max_attempts=env.cfg.optimize.max_feedback_attempts
        )
        out.metrics.update({f"feedback_skipped_{k}": float(v) for k, v in skipped.items()})
        if routed:
            out.metrics.update(write_feedback(env, inp, routed, out.notes))
        return out


DISAMBIGUATION = register_improver(DisambiguationFeedback())
