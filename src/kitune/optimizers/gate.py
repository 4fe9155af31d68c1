"""The gate for feedback KIs: a KI written from a failure is kept only if it breaks no other question.

A feedback (disambiguation) KI is written to fix one failing question, but it is indexed under
entities other look-ups also hit, so it can change what the agent reads for its neighbours
(issue 21: two validation questions the agent had right flipped to wrong). :func:`run_gate`:

1. asks ``changed`` which tuning and validation questions' ``get_context`` results the
   candidates changed, and which candidates each shows (in the loop: the evaluation cache's
   look-up replay; :func:`attribute_changes` turns before/after KI-id lists into that map);
2. re-runs exactly those questions (``rerun``) and compares each with its previous trace;
3. rejects every candidate blamed for a question that was right and is now wrong (``broke``),
   or that was right and whose re-run has no verdict (failed, ungraded or missing:
   ``unverified`` — the gate keeps only KIs shown not to hurt); the rejected ids go to
   ``reject`` once (remove, or retire through the KI status) and are counted by reason.

**Attribution** (several candidates change one question): conservative — a broken (or
unverified) question blames *every* candidate shown in its changed look-ups; a question that
changed with no candidate named blames *all* candidates. No subset re-runs are tried (each would
cost a full agent episode), so a candidate may be rejected with a guilty neighbour; the report
lists, per rejected KI, the questions it was blamed for. Wrong → right questions are reported as
``fixed`` and never save a candidate that also broke something.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kitune.evaluation.failures import is_correct

if TYPE_CHECKING:
    from kitune.evaluation.metrics import Trace

__all__ = ["GateRejection", "GateReport", "attribute_changes", "run_gate"]


@dataclass(frozen=True)
class GateRejection:
    """One rejected candidate KI."""

    ki_id: str
    reason: str
    """``broke`` (a right question became wrong) or ``unverified`` (its re-run gave no verdict)."""
    query_ids: tuple[str, ...]
    """The questions it was blamed for (broken ones for ``broke``), sorted."""


@dataclass(frozen=True)
class GateReport:
    """What :func:`run_gate` decided."""

    candidates: tuple[str, ...]
    """Candidate KI ids, as given."""
    kept: tuple[str, ...]
    """Candidates kept, in the given order."""
    rejected: tuple[GateRejection, ...]
    """Rejected candidates, in the given order."""
    rerun: tuple[str, ...]
    """Questions re-run (their look-ups changed), in the order ``changed`` returned them."""
    broken: tuple[str, ...]
    """Re-run questions that were right and are now wrong, sorted."""
    fixed: tuple[str, ...]
    """Re-run questions that were wrong and are now right, sorted."""
    unverified: tuple[str, ...]
    """Re-run questions that were right and got no verdict now, sorted."""
    removed: int = 0
    """What ``reject`` returned (KIs it removed or retired)."""

    def to_metrics(self) -> dict[str, float]:
        """Flat ``gate_*`` counts for tracking."""
        reasons = [r.reason for r in self.rejected]
        return {
            "gate_candidates": float(len(self.candidates)),
            "gate_kept": float(len(self.kept)),
            "gate_rejected": float(len(self.rejected)),
            "gate_rejected_broke": float(reasons.count("broke")),
            "gate_rejected_unverified": float(reasons.count("unverified")),
            "gate_rerun": float(len(self.rerun)),
            "gate_broken": float(len(self.broken)),
            "gate_fixed": float(len(self.fixed)),
            "gate_unverified": float(len(self.unverified)),
            "gate_removed": float(self.removed),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (for the iteration's ``improve.json``)."""
        return {
            "candidates": list(self.candidates),
            "kept": list(self.kept),
            "rejected": [
                {"ki_id": r.ki_id, "reason": r.reason, "query_ids": list(r.query_ids)} for r in self.rejected
            ],
            "rerun": list(self.rerun),
            "broken": list(self.broken),
            "fixed": list(self.fixed),
            "unverified": list(self.unverified),
            "removed": self.removed,
        }


def attribute_changes(
    before: Mapping[str, Sequence[str]], after: Mapping[str, Sequence[str]], candidates: Collection[str]
) -> dict[str, frozenset[str]]:
    """Which questions the candidates changed, from the KI ids their look-ups showed before and after.

    Args:
        before: query id → KI ids shown before the candidates were written (best first, all of
            the question's look-ups concatenated).
        after: the same after writing them (replayed on the store as it is now).
        candidates: the candidate KI ids.

    Returns:
        Query id → candidates shown now, for every question whose ids changed or that now shows
        a candidate; an empty set means changed with no candidate named (blames all of them).
        Order: ``after``'s, then questions only in ``before``.
    """
    wanted = set(candidates)
    out: dict[str, frozenset[str]] = {}
    for qid in dict.fromkeys([*after, *before]):
        now, then = list(after.get(qid, ())), list(before.get(qid, ()))
        shown = frozenset(wanted.intersection(now))
        if now != then or shown:
            out[qid] = shown
    return out


def _verdict(trace: Trace | None) -> bool | None:
    if trace is None or trace.status == "failed" or trace.judge_status == "grader_error":
        return None
    return is_correct(trace)


def run_gate(
    candidates: Sequence[str],
    *,
    changed: Callable[[Sequence[str]], Mapping[str, Collection[str]]],
    rerun: Callable[[Sequence[str]], Sequence[Trace]],
    previous: Sequence[Trace] | Mapping[str, Trace],
    reject: Callable[[Sequence[str]], int],
) -> GateReport:
    """Keep the candidate feedback KIs that break no re-run question (see the module docstring).

    Args:
        candidates: ids of the feedback KIs just written (already in the store).
        changed: candidate ids → {query id: candidate ids its look-ups now show} over the tuning
            and validation questions whose ``get_context`` results changed (ids not among the
            candidates are ignored; an empty collection blames every candidate).
        rerun: query ids → their traces on the store with the candidates (one per id; a missing
            one counts as no verdict).
        previous: the questions' traces before the candidates were written (a sequence or a
            query id → trace mapping); a question without one cannot be broken.
        reject: called once with the rejected ids (remove them, or retire them through the KI
            status); returns how many it changed. Not called when nothing is rejected.

    Returns:
        The :class:`GateReport`. With no candidates nothing is called.
    """
    ids = tuple(dict.fromkeys(candidates))
    if not ids:
        return GateReport((), (), (), (), (), (), ())
    wanted = set(ids)
    blame = {q: (wanted.intersection(shown) or wanted) for q, shown in changed(ids).items()}
    to_run = tuple(blame)
    now = {t.query_id: t for t in (rerun(list(to_run)) if to_run else ())}
    before = previous if isinstance(previous, Mapping) else {t.query_id: t for t in previous}
    broken: list[str] = []
    fixed: list[str] = []
    unverified: list[str] = []
    for qid in to_run:
        was, got = _verdict(before.get(qid)), _verdict(now.get(qid))
        if was is True and got is False:
            broken.append(qid)
        elif was is True and got is None:
            unverified.append(qid)
        elif was is False and got is True:
            fixed.append(qid)
    blamed: dict[str, dict[str, list[str]]] = {}
    for reason, qids in (("broke", broken), ("unverified", unverified)):
        for qid in qids:
            for ki_id in blame[qid]:
                blamed.setdefault(ki_id, {}).setdefault(reason, []).append(qid)
    rejected: list[GateRejection] = []
    for ki_id in ids:
        if ki_id in blamed:
            reason = "broke" if "broke" in blamed[ki_id] else "unverified"
            rejected.append(GateRejection(ki_id, reason, tuple(sorted(blamed[ki_id][reason]))))
    removed = reject([r.ki_id for r in rejected]) if rejected else 0
    return GateReport(
        candidates=ids,
        kept=tuple(k for k in ids if k not in blamed),
        rejected=tuple(rejected),
        rerun=to_run,
        broken=tuple(sorted(broken)),
        fixed=tuple(sorted(fixed)),
        unverified=tuple(sorted(unverified)),
        removed=removed,
    )
