"""Question-by-question comparison of two runs: flips and per-question input-token deltas.

Used by the report (:func:`kitune.evaluation.report.write_report`) for baseline → in-context
and iteration → iteration columns. Pure, deterministic, no I/O.

**Outcome** of a question in one run: ``correct`` / ``wrong`` from the judge when graded; from
exact match when no judge ran (``judge_status == "not_run"``); ``ungraded`` for a grader error
or a failed run (status ``failed``). **Flips** compare questions present in both runs by
``query_id``: *fixed* (wrong → correct), *broken* (correct → wrong), *still correct*,
*still wrong*; a question ungraded in either run, or present in one run only, is *not compared*.
A fixed question carries its failure kind before, a broken one its failure kind after
(:func:`kitune.evaluation.failures.classify_failure`).

**Token cost** of a question is its input tokens: the agent's plus those its tools spent
(query rewrites), the same quantity the report's plot uses. For every question in both runs,
:func:`token_deltas` gives before, after, Δ and ratio, and for a question that got more
expensive the reasons :func:`cost_reasons` reads off the two traces (rules in its docstring).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from kitune.errors import DataError
from kitune.evaluation.failures import classify_failure
from kitune.evaluation.metrics import Trace

__all__ = [
    "Outcome",
    "RunComparison",
    "RunFlips",
    "TokenDelta",
    "compare_flips",
    "compare_runs",
    "cost_reasons",
    "outcome",
    "question_tokens",
    "token_deltas",
]

Outcome = Literal["correct", "wrong", "ungraded"]


def outcome(trace: Trace) -> Outcome:
    """``correct`` / ``wrong`` / ``ungraded`` for one trace (see the module docstring)."""
    if trace.status == "failed":
        return "ungraded"
    if trace.is_graded:
        return "correct" if trace.judge_correct else "wrong"
    if trace.judge_status == "not_run":
        return "correct" if trace.em else "wrong"
    return "ungraded"


@dataclass(frozen=True)
class RunFlips:
    """Question-level changes from run ``before`` to run ``after`` (query ids in ``after``'s order)."""

    before: str
    after: str
    fixed: tuple[str, ...]
    """Wrong before, correct after."""
    broken: tuple[str, ...]
    """Correct before, wrong after (regressions)."""
    still_correct: tuple[str, ...]
    still_wrong: tuple[str, ...]
    not_compared: tuple[str, ...]
    """Ungraded in either run (grader error, failed run) or present in one run only."""
    fixed_kinds: dict[str, str] = field(default_factory=dict)
    """Fixed question id → its failure kind *before* (what got fixed)."""
    broken_kinds: dict[str, str] = field(default_factory=dict)
    """Broken question id → its failure kind *after* (how it now fails)."""

    @property
    def counts(self) -> dict[str, int]:
        """``{"fixed", "broken", "still_correct", "still_wrong", "not_compared"}`` → count."""
        return {
            "fixed": len(self.fixed),
            "broken": len(self.broken),
            "still_correct": len(self.still_correct),
            "still_wrong": len(self.still_wrong),
            "not_compared": len(self.not_compared),
        }

    @property
    def net(self) -> int:
        """``fixed − broken``: the change in correct answers among compared questions."""
        return len(self.fixed) - len(self.broken)


def compare_flips(
    before: Sequence[Trace], after: Sequence[Trace], *, before_name: str = "before", after_name: str = "after"
) -> RunFlips:
    """Flips from ``before`` to ``after`` by ``query_id`` (see the module docstring).

    Raises:
        DataError: a run holds the same ``query_id`` twice.
    """
    prior = _by_id(before, before_name)
    now = _by_id(after, after_name)
    buckets: dict[str, list[str]] = {k: [] for k in ("fixed", "broken", "still_correct", "still_wrong", "nc")}
    for qid, t in now.items():
        b = prior.get(qid)
        was, is_ = (outcome(b) if b is not None else "ungraded"), outcome(t)
        if "ungraded" in (was, is_):
            key = "nc"
        elif was == "wrong":
            key = "fixed" if is_ == "correct" else "still_wrong"
        else:
            key = "still_correct" if is_ == "correct" else "broken"
        buckets[key].append(qid)
    buckets["nc"].extend(qid for qid in prior if qid not in now)
    return RunFlips(
        fixed_kinds={q: str(classify_failure(prior[q])) for q in buckets["fixed"]},
        broken_kinds={q: str(classify_failure(now[q])) for q in buckets["broken"]},
        before=before_name,
        after=after_name,
        fixed=tuple(buckets["fixed"]),
        broken=tuple(buckets["broken"]),
        still_correct=tuple(buckets["still_correct"]),
        still_wrong=tuple(buckets["still_wrong"]),
        not_compared=tuple(buckets["nc"]),
    )


def _by_id(traces: Sequence[Trace], name: str) -> dict[str, Trace]:
    out: dict[str, Trace] = {}
    for t in traces:
        if t.query_id in out:
            raise DataError(
                f"run {name!r} holds question {t.query_id!r} twice (two skills in one traces file?): "
                "compare runs with one trace per question"
            )
        out[t.query_id] = t
    return out


def question_tokens(trace: Trace) -> int:
    """Input tokens one question cost: the agent's plus its tools' (query rewrites)."""
    return trace.input_tokens + trace.tool_input_tokens


def _ok_steps(trace: Trace, tool: str) -> list[dict[str, Any]]:
    return [
        s for s in trace.steps if s.get("tool") == tool and s.get("kind") == "tool" and not s.get("error")
    ]


def _obs_chars(trace: Trace) -> int:
    return sum(int(s.get("observation_chars") or 0) for s in trace.steps)


def cost_reasons(before: Trace, after: Trace) -> list[str]:
    """Why ``after`` cost more input tokens than ``before`` (same question), read off the traces.

    Rules, each adding one reason when it holds (in this order):

    1. ``run failed: <error>`` — ``after`` failed.
    2. ``budget ran out (<what>)`` — ``after`` timed out and ``before`` did not.
    3. ``context overflow`` — ``after`` overflowed the context window and ``before`` did not.
    4. ``no KI covered it → fell back to raw search (n searches)`` — ``after`` used
       ``get_context``, no look-up returned a KI (no cited doc ids), and it ran successful raw
       ``search`` calls — more than ``before`` when both runs are the same skill (any, when
       ``before`` is e.g. the baseline, which always searches); ``KIs did not answer → fell
       back to raw search`` when look-ups did return KIs.
    5. ``more steps (a → b)`` — more model calls.
    6. ``repeated tool calls (a → b)`` — more calls identical to an earlier one.
    7. ``longer observations (+n chars)`` — the tool results fed back grew by more than 10%.
    8. ``query rewrites +n tokens`` — the tools' own LLM input tokens grew.
    9. ``longer prompts per step`` — none of the above: same steps, more tokens each.

    Returns:
        At least one reason when ``after`` costs more, else ``[]``.
    """
    if question_tokens(after) <= question_tokens(before):
        return []
    reasons: list[str] = []
    if after.status == "failed":
        why = after.failure or (after.errors[0] if after.errors else "no error recorded")
        reasons.append(f"run failed: {why}"[:200])
    if after.timed_out and not before.timed_out:
        reasons.append(f"budget ran out ({after.exhausted_by or 'budget'})")
    if after.status == "context_overflow" and before.status != "context_overflow":
        reasons.append("context overflow")
    lookups = _ok_steps(after, "get_context")
    searches = len(_ok_steps(after, "search"))
    searched_before = len(_ok_steps(before, "search")) if before.skill == after.skill else 0
    if lookups and searches > searched_before:
        covered = any(s.get("doc_ids") for s in lookups)
        what = "KIs did not answer" if covered else "no KI covered it"
        reasons.append(f"{what} → fell back to raw search ({searches} search{'es' if searches > 1 else ''})")
    if after.n_steps > before.n_steps:
        reasons.append(f"more steps ({before.n_steps} → {after.n_steps})")
    if after.repeated_calls > before.repeated_calls:
        reasons.append(f"repeated tool calls ({before.repeated_calls} → {after.repeated_calls})")
    ob, oa = _obs_chars(before), _obs_chars(after)
    if oa > ob * 1.1 and oa > ob:
        reasons.append(f"longer observations (+{oa - ob} chars)")
    if after.tool_input_tokens > before.tool_input_tokens:
        reasons.append(f"query rewrites +{after.tool_input_tokens - before.tool_input_tokens} tokens")
    return reasons or ["longer prompts per step"]


@dataclass(frozen=True)
class TokenDelta:
    """One question's input-token change between two runs."""

    query_id: str
    before: int
    after: int
    delta: int
    """``after − before`` (tokens)."""
    ratio: float | None
    """``after / before``; None when ``before`` is 0."""
    reasons: tuple[str, ...]
    """Why it got more expensive (:func:`cost_reasons`); empty when it did not."""


def token_deltas(before: Sequence[Trace], after: Sequence[Trace]) -> list[TokenDelta]:
    """Per-question input-token deltas for questions in both runs, largest increase first.

    Ties keep ``after``'s question order. Raises :class:`~kitune.errors.DataError` on a
    duplicate ``query_id``.
    """
    prior = _by_id(before, "before")
    out: list[TokenDelta] = []
    for qid, t in _by_id(after, "after").items():
        b = prior.get(qid)
        if b is None:
            continue
        tb, ta = question_tokens(b), question_tokens(t)
        out.append(TokenDelta(qid, tb, ta, ta - tb, ta / tb if tb else None, tuple(cost_reasons(b, t))))
    return sorted(out, key=lambda d: -d.delta)


@dataclass(frozen=True)
class RunComparison:
    """Flips and token deltas from one run to another."""

    flips: RunFlips
    deltas: list[TokenDelta]
    """Every question in both runs, largest increase first."""

    @property
    def more_expensive(self) -> list[TokenDelta]:
        """Questions whose input tokens grew, largest increase first."""
        return [d for d in self.deltas if d.delta > 0]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: ``before``, ``after``, flip id lists and counts, every token delta."""
        f = self.flips
        return {
            "before": f.before,
            "after": f.after,
            "flips": {**asdict(f), "counts": f.counts, "net": f.net},
            "token_deltas": [asdict(d) for d in self.deltas],
        }


def compare_runs(
    before_name: str, before: Sequence[Trace], after_name: str, after: Sequence[Trace]
) -> RunComparison:
    """Flips and token deltas from run ``before`` to run ``after``.

    Raises:
        DataError: a run holds the same ``query_id`` twice.
    """
    return RunComparison(
        compare_flips(before, after, before_name=before_name, after_name=after_name),
        token_deltas(before, after),
    )
