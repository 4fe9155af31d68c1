"""The ``disambiguation`` improver: which tuning failures get a feedback KI, routed by kind.

Routing (:func:`route_feedback`): only wrong-entity and wrong-number failures go to the
disambiguator (a feedback KI names the right and the wrong answer, so a blank answer cannot make
one: ``out_of_budget`` and blank ``no_candidate`` failures go to the rewriter's and the
extractor's feedback instead, :mod:`kitune.optimizers.routes`), unless the failure ledger says the
question already had ``optimize.max_feedback_attempts`` attempts or one for the same wrong
answer. Runs when ``--feedback`` is on and the tuning run has failures.

The improver only proposes: it returns the routed failures as ``Improvement.feedback`` (and the
held-back ones counted as ``feedback_skipped_<reason>``) and touches neither the store nor the
ledger. The loop writes the KIs with the setting's disambiguator instruction, gates them, notes
each outcome in the ledger and counts the tuning flips
(:func:`kitune.optimizers.feedback_step.apply_feedback`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kitune.optimizers.improve_env import ImproveEnv, ImproveInput, Improvement
from kitune.optimizers.ledger import FailureLedger
from kitune.optimizers.routes import kinds_routed_to

__all__ = ["DisambiguationFeedback", "route_feedback"]


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


class DisambiguationFeedback:
    """The ``disambiguation`` improver (see the module docstring)."""

    name = "disambiguation"

    def improve(self, env: ImproveEnv, inp: ImproveInput) -> Improvement:
        """Route the failures; propose feedback KIs for the routed ones (the loop writes and gates them)."""
        out = Improvement()
        if not inp.options.feedback or not inp.failures:
            return out
        routed, skipped = route_feedback(
            inp.failures, inp.kinds, inp.ledger, max_attempts=inp.cfg.optimize.max_feedback_attempts
        )
        out.metrics.update({f"feedback_skipped_{k}": float(v) for k, v in skipped.items()})
        out.feedback = tuple(routed)
        return out


DISAMBIGUATION = DisambiguationFeedback()

PLUGINS = {DISAMBIGUATION.name: DISAMBIGUATION}
"""This module's improver, registered by :data:`kitune.optimizers.improver.IMPROVERS`."""
