"""Feedback KIs: turn each failed question into a disambiguation KI, and count the flips they cause.

Steps (:func:`write_disambiguation_kis`):

1. :func:`collect_failures` picks the wrong answers from evaluated traces (judge-incorrect, or
   not exact-match when ungraded) that have a gold document, with the look-ups the agent issued;
2. each failure goes through :meth:`kitune.programs.disambiguator.Disambiguator.disambiguate`
   (title must contain both answers, evidence verbatim);
3. :func:`with_lookup_tags` indexes the KI under the entities of the question and of the
   agent's look-ups (so the agent's own retrieval can reach it), then
   :func:`kitune.programs.disambiguator.accept_if_retrieved` writes it to the same store
   (subtype and tag ``disambiguation``) and keeps it only if retrieval for the failing question
   returns it.

Per-failure problems (LM errors, rejections, a missing gold document) are counted by reason in
:class:`FeedbackReport`, never raised. After re-evaluating with disambiguation KIs visible,
:func:`count_flips` compares the two runs question by question.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kitune.evaluation.failures import is_correct
from kitune.programs.disambiguator import accept_if_retrieved, contains_folded
from kitune.schema import QueryPlan

if TYPE_CHECKING:
    from kitune.data.loaders import Question
    from kitune.evaluation.trace import Trace
    from kitune.ki import KI
    from kitune.programs.disambiguator import Disambiguator
    from kitune.retrieval.base import Store
    from kitune.schema import Document

__all__ = [
    "Failure",
    "FeedbackReport",
    "Flips",
    "collect_failures",
    "count_flips",
    "with_lookup_tags",
    "write_disambiguation_kis",
]


@dataclass(frozen=True)
class Failure:
    """One wrong answer the disambiguator can learn from."""

    query_id: str
    question: str
    gold_answer: str
    prediction: str
    """The agent's wrong exact answer (``""`` when it gave none)."""
    gold_docids: tuple[str, ...]
    """Candidate gold documents, best first (ones known to hold the answer first)."""
    queries: tuple[str, ...] = ()
    """The ``get_context`` look-ups the agent issued for this question (from its trace)."""


MAX_LOOKUP_TAGS = 12
"""Most entity tags a feedback KI gains from the question and the agent's look-ups."""

_NOT_ENTITIES = frozenset(
    "which what who whom whose when where why how is are was were did does do in on at of for the a an "
    "and or if this that these those there name list find give tell".split()
)
"""Capitalised only because they open a question: never a feedback KI's entity tag (they would put
the KI into every look-up that starts the same way)."""


def _lookups(trace: Trace) -> tuple[str, ...]:
    out = [
        str((s.get("args") or {}).get("query") or "")
        for s in trace.steps
        if s.get("kind") == "tool" and s.get("tool") == "get_context"
    ]
    return tuple(dict.fromkeys(q for q in out if q.strip()))


def with_lookup_tags(ki: KI, texts: Sequence[str], *, limit: int = MAX_LOOKUP_TAGS) -> KI:
    """``ki`` also tagged with the entities the question and the agent's look-ups name.

    A feedback KI helps only if the agent's own retrieval reaches it; the tag branch matches the
    ``entity:`` tags its plain plans guess from capitalised word runs
    (:meth:`kitune.schema.QueryPlan.plain`), so the KI is indexed under exactly the entities of
    the look-ups that missed the answer. The id is unchanged (it depends on doc and triple only).

    Args:
        ki: the disambiguation KI.
        texts: the failing question, then the agent's look-ups.
        limit: at most this many tags are added, first texts first.
    """
    extra: list[str] = []
    for text in texts:
        for tag in QueryPlan.plain(text).entity_tags:
            if tag.split(":", 1)[1] in _NOT_ENTITIES:
                continue
            if tag not in ki.tags and tag not in extra:
                extra.append(tag)
    if not extra:
        return ki
    return ki.model_copy(update={"tags": [*ki.tags, *extra[:limit]]})


def collect_failures(traces: Sequence[Trace], questions: Sequence[Question]) -> list[Failure]:
    """The wrong answers among ``traces`` with at least one gold document.

    Failed questions (their LLM calls did not go through) and grader errors are not failures of
    the model and are skipped. A blank answer is kept (its ``prediction`` is ``""``): the
    disambiguator cannot use it, and :func:`write_disambiguation_kis` counts it as a rejected
    candidate (``empty_prediction``) instead of skipping it silently.

    Args:
        traces: evaluated questions.
        questions: the questions (for gold documents); traces without a question are skipped.

    Returns:
        Failures in trace order.
    """
    by_id = {q.query_id: q for q in questions}
    out: list[Failure] = []
    for t in traces:
        q = by_id.get(t.query_id)
        if q is None or t.status == "failed" or t.judge_status == "grader_error" or is_correct(t):
            continue
        docs = tuple(dict.fromkeys((*q.gold_docids, *q.evidence_docids)))
        if not docs:
            continue
        out.append(Failure(t.query_id, q.query, q.answer, t.exact_answer.strip(), docs, _lookups(t)))
    return out


@dataclass(frozen=True)
class FeedbackReport:
    """What :func:`write_disambiguation_kis` did."""

    attempted: int
    """Failures processed."""
    written: int
    """KIs kept in the store (retrieved for their question)."""
    ki_ids: tuple[str, ...] = ()
    """Ids of the kept KIs."""
    rejected: dict[str, int] = field(default_factory=dict)
    """Reason code → count (``title_missing_gold``, ``not_retrieved``, ``no_gold_document``,
    ``empty_prediction`` …)."""
    outcomes: tuple[tuple[str, str, str | None, str | None], ...] = ()
    """Per failure, in order: ``(query id, prediction, kept KI id or None, rejection reason or None)``."""
    messages: dict[str, str] = field(default_factory=dict)
    """Reason code → the first full rejection message (what exactly broke, for diagnosis)."""

    def to_metrics(self) -> dict[str, float]:
        """Flat metrics for tracking (``feedback_*``)."""
        out = {"feedback_attempted": float(self.attempted), "feedback_written": float(self.written)}
        out.update({f"feedback_rejected_{k}": float(v) for k, v in self.rejected.items()})
        return out


def _gold_document(failure: Failure, get_document: Callable[[str], Document]) -> Document | None:
    found: list[Document] = []
    for docid in failure.gold_docids:
        try:
            found.append(get_document(docid))
        except Exception:  # a missing document is a counted rejection, not an error
            continue
    for doc in found:
        if contains_folded(doc.text, failure.gold_answer):
            return doc
    return found[0] if found else None


def write_disambiguation_kis(
    failures: Sequence[Failure],
    *,
    store: Store,
    disambiguator: Disambiguator,
    get_document: Callable[[str], Document],
    context_fn: Callable[[str], Sequence[str]],
    lm: Any = None,
    top_k: int = 10,
    on_progress: Callable[[int, int], None] | None = None,
) -> FeedbackReport:
    """Write one disambiguation KI per failure where the guardrails and retrieval accept it.

    Args:
        failures: from :func:`collect_failures`.
        store: the KI store (the same one the agent reads).
        disambiguator: the program (its instruction is the one being tuned).
        get_document: docid → document (raises for an unknown id).
        context_fn: question → KI ids best first (``kitune.service.serving.context.context_ids``).
        lm: the disambiguator's LM (None: the DSPy context's).
        top_k: the KI must be among the first ``top_k`` ids for its question.
        on_progress: called with ``(done, total)`` after each failure.

    Returns:
        The :class:`FeedbackReport`; never raises for one failure's problem.
    """
    rejected: Counter[str] = Counter()
    kept: list[str] = []
    outcomes: list[tuple[str, str, str | None, str | None]] = []
    messages: dict[str, str] = {}
    for i, f in enumerate(failures, 1):
        n_kept, before = len(kept), rejected.copy()
        doc = _gold_document(f, get_document) if f.prediction.strip() else None
        if not f.prediction.strip():
            rejected["empty_prediction"] += 1
        elif doc is None:
            rejected["no_gold_document"] += 1
        else:
            res = disambiguator.disambiguate(
                f.question, f.gold_answer, f.prediction, doc.text, doc.docid, lm=lm
            )
            if res.ki is None:
                code = (res.rejected_reason or "unknown").split(":", 1)[0]
                rejected[code] += 1
                messages.setdefault(code, (res.rejected_reason or "")[:500])
            else:
                try:
                    ki = with_lookup_tags(res.ki, [f.question, *f.queries])
                    ok = accept_if_retrieved(ki, f.question, store, context_fn, top_k=top_k)
                except Exception as e:  # a retrieval error for one failure is counted
                    rejected[f"retrieval_error_{type(e).__name__}"] += 1
                else:
                    if ok:
                        kept.append(ki.id)
                    else:
                        rejected["not_retrieved"] += 1
        reason = next(iter(rejected - before), None)
        outcomes.append((f.query_id, f.prediction, kept[-1] if len(kept) > n_kept else None, reason))
        if on_progress is not None:
            on_progress(i, len(failures))
    return FeedbackReport(
        attempted=len(failures),
        written=len(kept),
        ki_ids=tuple(kept),
        rejected=dict(rejected),
        outcomes=tuple(outcomes),
        messages=messages,
    )


@dataclass(frozen=True)
class Flips:
    """Question-level changes between two runs over the same questions."""

    fixed: tuple[str, ...]
    """Wrong before, right after."""
    still_wrong: tuple[str, ...]
    """Wrong both times."""
    newly_wrong: tuple[str, ...]
    """Right before, wrong after (regressions)."""
    still_right: tuple[str, ...]
    """Right both times."""

    def to_metrics(self) -> dict[str, float]:
        """Counts as ``flips_*`` metrics."""
        return {
            "flips_fixed": float(len(self.fixed)),
            "flips_still_wrong": float(len(self.still_wrong)),
            "flips_newly_wrong": float(len(self.newly_wrong)),
            "flips_still_right": float(len(self.still_right)),
        }


def count_flips(before: Sequence[Trace], after: Sequence[Trace]) -> Flips:
    """Compare two runs by ``query_id`` (questions in only one run are ignored).

    Correct means judge-correct when graded, else exact match.
    """
    prior = {t.query_id: is_correct(t) for t in before}
    fixed: list[str] = []
    still_wrong: list[str] = []
    newly_wrong: list[str] = []
    still_right: list[str] = []
    for t in after:
        if t.query_id not in prior:
            continue
        was, now = prior[t.query_id], is_correct(t)
        bucket = (still_right if now else newly_wrong) if was else (fixed if now else still_wrong)
        bucket.append(t.query_id)
    return Flips(tuple(fixed), tuple(still_wrong), tuple(newly_wrong), tuple(still_right))
