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
   ``unverified`` — the gate keeps only KIs shown not to hurt);
4. **retrieval** (with ``ranks``): for every question measured before and after — in the loop
   every tuning and validation question, one rewrite + one look-up each, the rewriter's stage
   metric — compares the reciprocal rank of its first gold KI in the top ``k``
   (:class:`RankChange`). A question whose gold recall@k was lost (a gold KI in the top ``k``
   before, none now) or whose reciprocal rank fell by more than ``rank_tolerance``
   (``optimize.gate_rank_tolerance``, default 0.5: rank 1 → 2 passes, 1 → 3 does not) blames the
   candidates now in its top ``k`` — all candidates when none is (adding KIs also moves the
   others' lexical statistics) — except a candidate written for that very question (``own``):
   a feedback KI may outrank its own question's documents, it is written to be read there.
   Rejected as ``retrieval``;

the rejected ids go to ``reject`` once (remove, or retire through the KI status) and are counted
by reason (``broke`` first, then ``retrieval``, then ``unverified``), each with its questions and a
one-line ``detail``.

**Attribution** (several candidates change one question): conservative — a broken (or
unverified) question blames *every* candidate shown in its changed look-ups; a question that
changed with no candidate named blames *all* candidates. No subset re-runs are tried (each would
cost a full agent episode), so a candidate may be rejected with a guilty neighbour; the report
lists, per rejected KI, the questions it was blamed for. Wrong → right questions are reported as
``fixed`` and never save a candidate that also broke something.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kitune.evaluation.failures import is_correct

if TYPE_CHECKING:
    from kitune.evaluation.metrics import Trace

__all__ = ["GateRejection", "GateReport", "RankChange", "attribute_changes", "rank_changes", "run_gate"]

REASONS = ("broke", "retrieval", "unverified")
"""Rejection reasons, in the order one is chosen when a candidate is blamed for several."""


@dataclass(frozen=True)
class RankChange:
    """One question's gold reciprocal rank in the top ``k`` before and after the candidates were written."""

    query_id: str
    before: float
    """``1 / rank`` of the first KI citing a gold document within ``k`` before (0.0: none)."""
    after: float
    """The same now."""
    shown: frozenset[str] = frozenset()
    """Candidates among the question's top ``k`` KIs now."""

    def dropped(self, tolerance: float) -> bool:
        """Gold recall@k lost (``before > 0``, ``after == 0``) or ``before − after > tolerance``."""
        return self.before > 0 and (self.after == 0 or self.before - self.after > tolerance + 1e-12)

    def describe(self) -> str:
        """``q7 gold reciprocal rank 1.00 → 0.00 (recall lost)``."""
        lost = " (recall lost)" if self.before > 0 and self.after == 0 else ""
        return f"{self.query_id} gold reciprocal rank {self.before:.2f} → {self.after:.2f}{lost}"


def rank_changes(
    before: Mapping[str, float],
    after: Mapping[str, float],
    after_ids: Mapping[str, Sequence[str]],
    candidates: Collection[str],
) -> list[RankChange]:
    """Pair each question's reciprocal rank before and after (questions measured both times).

    Args:
        before: query id → gold reciprocal rank in the top ``k`` before the candidates (the
            rewriter's per-question MRR, ``StageReport.values("rewriter", "mrr")``).
        after: the same now.
        after_ids: query id → KI ids of its top ``k`` now (``StageReport.retrieved``).
        candidates: the candidate KI ids.
    """
    wanted = set(candidates)
    return [
        RankChange(q, before[q], rr, frozenset(wanted.intersection(after_ids.get(q, ()))))
        for q, rr in after.items()
        if q in before
    ]


@dataclass(frozen=True)
class GateRejection:
    """One rejected candidate KI."""

    ki_id: str
    reason: str
    """``broke`` (a right question became wrong), ``retrieval`` (a question's gold recall@k was lost
    or its reciprocal rank fell beyond the tolerance) or ``unverified`` (its re-run gave no verdict)."""
    query_ids: tuple[str, ...]
    """The questions it was blamed for under ``reason``, sorted."""
    detail: str = field(default="", compare=False)
    """One line saying why (for ``retrieval``: each question's reciprocal rank before → after);
    derived from the rest, so left out of equality."""


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
    rank_drops: tuple[RankChange, ...] = ()
    """Questions whose gold retrieval fell beyond the tolerance (empty without ``ranks``)."""
    rank_checked: int = 0
    """Questions whose retrieval was compared before and after."""

    def to_metrics(self) -> dict[str, float]:
        """Flat ``gate_*`` counts for tracking."""
        reasons = [r.reason for r in self.rejected]
        return {
            "gate_candidates": float(len(self.candidates)),
            "gate_kept": float(len(self.kept)),
            "gate_rejected": float(len(self.rejected)),
            "gate_rejected_broke": float(reasons.count("broke")),
            "gate_rejected_retrieval": float(reasons.count("retrieval")),
            "gate_rejected_unverified": float(reasons.count("unverified")),
            "gate_rank_checked": float(self.rank_checked),
            "gate_rank_drops": float(len(self.rank_drops)),
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
                {"ki_id": r.ki_id, "reason": r.reason, "query_ids": list(r.query_ids), "detail": r.detail}
                for r in self.rejected
            ],
            "rank_checked": self.rank_checked,
            "rank_drops": [
                {"query_id": c.query_id, "before": c.before, "after": c.after, "shown": sorted(c.shown)}
                for c in self.rank_drops
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
    ranks: Callable[[Sequence[str]], Sequence[RankChange]] | None = None,
    rank_tolerance: float = 0.5,
    own: Mapping[str, Collection[str]] | None = None,
) -> GateReport:
    """Keep the candidate feedback KIs that break no question's answer or retrieval (module docstring).

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
        ranks: candidate ids → each question's :class:`RankChange` (:func:`rank_changes`); None:
            no retrieval check.
        rank_tolerance: the largest reciprocal-rank fall that passes, 0–1.
        own: candidate id → the questions it was written for (never blamed for their retrieval).

    Returns:
        The :class:`GateReport`. With no candidates nothing is called.

    Raises:
        ValueError: ``rank_tolerance`` outside 0–1.
    """
    if not 0.0 <= rank_tolerance <= 1.0:
        raise ValueError(f"rank_tolerance={rank_tolerance}: use a reciprocal-rank fall between 0 and 1")
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
    changes = list(ranks(ids)) if ranks is not None else []
    drops = [c for c in changes if c.dropped(rank_tolerance)]
    written_for = own or {}
    for c in drops:
        for ki_id in wanted.intersection(c.shown) or wanted:
            if c.query_id not in written_for.get(ki_id, ()):
                blamed.setdefault(ki_id, {}).setdefault("retrieval", []).append(c.query_id)
    by_query = {c.query_id: c for c in drops}
    rejected: list[GateRejection] = []
    for ki_id in ids:
        if ki_id in blamed:
            reason = next(r for r in REASONS if r in blamed[ki_id])
            blamed_for = tuple(sorted(blamed[ki_id][reason]))
            detail = (
                "; ".join(by_query[q].describe() for q in blamed_for)
                if reason == "retrieval"
                else f"{reason}: {', '.join(blamed_for)}"
            )
            rejected.append(GateRejection(ki_id, reason, blamed_for, detail))
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
        rank_drops=tuple(drops),
        rank_checked=len(changes),
    )
