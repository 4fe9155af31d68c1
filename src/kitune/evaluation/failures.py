"""Failure kinds: why one evaluated question was not answered correctly, decided from its trace.

The published analysis of the KI experiment sorts the agent's failures into kinds (19/29 "wrong
twin" — a near-identical entity committed —, 3/29 a wrong number, 7/29 no candidate found);
the loop routes each kind to a different fix (wrong entity / wrong number → a disambiguation
KI; no candidate → extractor and rewriter feedback). :func:`classify_failure` decides the kind
deterministically, in this order (first rule that applies wins):

1. ``failed`` — the question's LLM calls failed (trace status ``failed``: auth, outage,
   timeouts after retries). Not a model mistake; never graded.
2. ``grader_error`` — the judge could not grade the answer.
3. *(correct → no failure, ``None``)* — judge-correct when graded, else exact match.
4. ``malformed_calls`` — the agent ended the episode because the model's replies or tool calls
   could not be run several times in a row (trace status ``malformed_calls``: unparseable or
   cut replies, invalid arguments, unknown tools; or ``invalid_tool_arguments``: every one of
   them a call with invalid or cut arguments); a model/protocol failure, graded wrong.
5. ``out_of_budget`` — the step budget ran out and no answer was committed (blank answer).
6. ``no_candidate`` — the question names gold documents (``gold_docids``, else its evidence
   documents) and none of them surfaced in anything the agent saw (``doc_ids_seen``); or the
   answer is blank although the budget did not run out.
7. ``wrong_number`` — the gold answer (or the prediction) is a number, a quantity or a date
   (digits, a spelled-out number word or a month name).
8. ``wrong_entity`` — everything else: a wrong name was committed although the gold
   documents were seen (the "wrong twin").

An LLM may refine a kind later (for instance tell a wrong twin from a wrong attribute); it
never replaces these rules, so the counts are reproducible from the traces alone.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from kitune.evaluation.metrics import Trace

__all__ = [
    "FAILURE_KINDS",
    "FailureKind",
    "classify_failure",
    "count_failure_kinds",
    "is_correct",
    "is_numeric_answer",
]

FailureKind = Literal[
    "wrong_entity",
    "wrong_number",
    "no_candidate",
    "out_of_budget",
    "malformed_calls",
    "grader_error",
    "failed",
]
"""Why a question failed (see the module docstring for the rules)."""

FAILURE_KINDS: tuple[FailureKind, ...] = get_args(FailureKind)
"""Every kind, in report order (the order :data:`FailureKind` lists them)."""

_MONTHS = (
    "january|february|march|april|may|june|july|august|september|october|november|december|"
    "jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec"
)
_NUMBER_WORDS = (
    "zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|"
    "fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|"
    "eighty|ninety|hundred|thousand|million|billion|first|second|third|fourth|fifth|dozen"
)
_NUMERIC = re.compile(rf"\d|\b(?:{_MONTHS}|{_NUMBER_WORDS})\b", re.IGNORECASE)


def is_correct(trace: Trace) -> bool:
    """The judge's verdict when graded, else exact match (the one correctness rule everywhere)."""
    return bool(trace.judge_correct) if trace.is_graded else bool(trace.em)


def is_numeric_answer(text: str) -> bool:
    """True when ``text`` states a number, quantity or date (a digit, a number word, a month)."""
    return bool(_NUMERIC.search(text or ""))


def classify_failure(trace: Trace, gold_docids: Sequence[str] | None = None) -> FailureKind | None:
    """The failure kind of one evaluated question, or None when it was answered correctly.

    Args:
        trace: the question's trace (any skill).
        gold_docids: documents that contain the answer (None or empty: the trace's
            ``evidence_docids`` stand in).

    Returns:
        One of :data:`FAILURE_KINDS`, or None for a correct answer. Deterministic: the same
        trace always gets the same kind.
    """
    if trace.status == "failed":
        return "failed"
    if trace.judge_status == "grader_error":
        return "grader_error"
    if is_correct(trace):
        return None
    if trace.status in ("malformed_calls", "invalid_tool_arguments"):
        return "malformed_calls"
    answer = (trace.exact_answer or "").strip()
    if not answer and trace.timed_out:
        return "out_of_budget"
    golds = list(gold_docids or ()) or list(trace.evidence_docids)
    if not answer or (golds and not set(golds) & set(trace.doc_ids_seen)):
        return "no_candidate"
    if is_numeric_answer(trace.gold_answer) or (is_numeric_answer(answer) and not trace.gold_answer):
        return "wrong_number"
    return "wrong_entity"


def count_failure_kinds(
    traces: Iterable[Trace], gold_docids: dict[str, Sequence[str]] | None = None
) -> dict[str, int]:
    """Failure kind → count over ``traces`` (correct answers are not counted; every kind present).

    Args:
        traces: evaluated questions.
        gold_docids: query id → gold documents (optional, see :func:`classify_failure`).

    Returns:
        A dict with every kind of :data:`FAILURE_KINDS` as a key (0 when absent), in that order.
    """
    counts: Counter[str] = Counter()
    for t in traces:
        kind = classify_failure(t, (gold_docids or {}).get(t.query_id))
        if kind is not None:
            counts[kind] += 1
    return {k: counts.get(k, 0) for k in FAILURE_KINDS}
