"""Per-question scoring: the :class:`~kitune.evaluation.trace.Trace` record built from an :class:`Episode`.

EM and token F1 reuse :func:`kitune.text.exact_match` / :func:`kitune.text.token_f1` against the
gold answer and its aliases. The judge is any callable accepting keyword arguments
``question``, ``response``, ``gold``, ``aliases`` and returning an object with ``correct``
(bool | None) and ``status`` (``"graded"`` | ``"grader_error"``), e.g.
``kitune.programs.judge.judge_answer``. A judge that raises is recorded as a grader error,
never as "incorrect" (case J3).

Failures are failures: a question whose LLM calls failed (a classified
:class:`kitune.errors.LMError` after the LM layer's retries — auth, outage, timeout, empty
completion; a context-window overflow is *not* one, it is handled by the agent) gets
``status="failed"`` and the reason in :attr:`Trace.failure`, and is never graded: an empty
answer caused by an outage is not a wrong answer. :func:`is_auth_failure` tells the harness to
stop the run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from kitune.data.loaders import Question
from kitune.errors import LMAuthError, LMContextWindowError, LMError
from kitune.evaluation.agent import Episode
from kitune.evaluation.trace import Trace
from kitune.recording import RecordingMissError
from kitune.text import exact_match, token_f1

__all__ = [
    "JudgeFn",
    "JudgeVerdictLike",
    "Trace",
    "build_trace",
    "evidence_recall",
    "failed_trace",
    "format_response",
    "is_auth_failure",
    "lm_failure",
]

_LM_ERRORS: tuple[type[LMError], ...] = (LMError, *LMError.__subclasses__())
_LM_ERROR_NAMES = frozenset(c.__name__ for c in _LM_ERRORS if not issubclass(c, LMContextWindowError))
"""Names of the LM error types that make a question failed (all but the context-window one)."""

_ERROR_TEXT = re.compile(r"^(?:force-commit )?([A-Za-z_]\w*): ", re.ASCII)
"""How the agent and the harness write an exception: ``[force-commit ]<Type>: <message>``."""


class JudgeVerdictLike(Protocol):
    """What the harness reads from a judge's verdict (read-only, so frozen dataclasses qualify)."""

    @property
    def correct(self) -> bool | None:
        """True/False, or None when no verdict was reached."""
        ...

    @property
    def status(self) -> str:
        """``graded`` or ``grader_error``."""
        ...


class JudgeFn(Protocol):
    """Grades one response; should not raise (a raise is recorded as a grader error)."""

    def __call__(
        self, *, question: str, response: str, gold: str, aliases: Sequence[str]
    ) -> JudgeVerdictLike:
        """Return the verdict for ``response`` against ``gold``/``aliases``."""
        ...


def evidence_recall(seen: Sequence[str], evidence: Sequence[str]) -> float | None:
    """``|set(seen) ∩ set(evidence)| / |set(evidence)|``; None when ``evidence`` is empty."""
    ev = set(evidence)
    if not ev:
        return None
    return len(ev & set(seen)) / len(ev)


def lm_failure(episode: Episode) -> str | None:
    """The LM failure that left ``episode`` without an answer, or None.

    An episode failed when one of its model calls (a step of kind ``lm_error``) raised an
    :class:`kitune.errors.LMError` other than :class:`kitune.errors.LMContextWindowError` and no
    answer came out (the agent stops on such an error; a failed force-commit leaves the answer
    empty).

    Returns:
        ``"<Type>: <message>"`` of the last such error (without the ``force-commit`` prefix).
    """
    if episode.exact_answer.strip():
        return None
    for step in reversed(episode.steps):
        if step.kind != "lm_error" or not step.error:
            continue
        m = _ERROR_TEXT.match(step.error)
        if m and m.group(1) in _LM_ERROR_NAMES:
            return step.error[m.start(1) :]
    return None


def is_auth_failure(trace: Trace) -> bool:
    """True when the agent's or the judge's LLM call was refused for authentication (401/403).

    Such a run cannot succeed for any question: the harness stops at once.
    """
    name = LMAuthError.__name__
    if trace.failure and trace.failure.startswith(f"{name}:"):
        return True
    return trace.judge_status == "grader_error" and (trace.judge_error or "").startswith(f"{name}:")


def format_response(episode: Episode) -> str:
    """The BrowseComp-style response text the judge grades."""
    conf = "" if episode.confidence is None else f"{episode.confidence}%"
    return f"Explanation: {episode.explanation}\nExact Answer: {episode.exact_answer}\nConfidence: {conf}"


def _judge(
    question: Question, episode: Episode, judge: JudgeFn | None
) -> tuple[bool | None, str, str | None]:
    if judge is None:
        return None, "not_run", None
    if not episode.exact_answer.strip():
        return False, "graded", None  # no answer given is a wrong answer, not a grader failure
    try:
        verdict = judge(
            question=question.query,
            response=format_response(episode),
            gold=question.answer,
            aliases=list(question.aliases),
        )
    except RecordingMissError:
        raise  # a replay miss is no grader error: it stops the run (see kitune.evaluation.harness)
    except Exception as e:  # the judge must not sink the trace (J3: record, never "incorrect")
        return None, "grader_error", f"{type(e).__name__}: {e}"
    status = str(getattr(verdict, "status", "graded"))
    correct = getattr(verdict, "correct", None)
    if status != "graded" or correct is None:
        err = getattr(verdict, "error", None) or "judge returned no verdict"
        return None, "grader_error", str(err)
    return bool(correct), "graded", None


def build_trace(question: Question, skill: str, episode: Episode, *, judge: JudgeFn | None = None) -> Trace:
    """Score one episode.

    Args:
        question: the question with gold answer, aliases and evidence doc ids.
        skill: ``baseline``, ``in-context``, ``closed-book`` (or a custom label).
        episode: the agent's episode.
        judge: grader (None: ``judge_status="not_run"``).

    Returns:
        The trace; ``input_tokens == sum(step input tokens)``; EM/F1 against answer + aliases.
        An episode whose LLM calls failed (:func:`lm_failure`, or status ``failed``) gets
        ``status="failed"``, ``failure`` set and is not graded (``judge_status="not_run"``).
    """
    failure = lm_failure(episode)
    if failure is None and episode.status == "failed":
        failure = episode.errors[-1] if episode.errors else "the episode failed without an error message"
    if failure is not None:
        correct, jstatus, jerror = None, "not_run", None
    else:
        correct, jstatus, jerror = _judge(question, episode, judge)
    golds = list(question.golds)
    return Trace(
        query_id=question.query_id,
        skill=skill,
        question=question.query,
        gold_answer=question.answer,
        aliases=list(question.aliases),
        status="failed" if failure is not None else episode.status,
        failure=failure,
        exact_answer=episode.exact_answer,
        explanation=episode.explanation,
        confidence=episode.confidence,
        judge_correct=correct,
        judge_status=jstatus,
        judge_error=jerror,
        em=exact_match(episode.exact_answer, golds) if episode.exact_answer else False,
        f1=token_f1(episode.exact_answer, golds) if episode.exact_answer else 0.0,
        input_tokens=episode.input_tokens,
        output_tokens=episode.output_tokens,
        tool_input_tokens=episode.tool_input_tokens,
        tool_output_tokens=episode.tool_output_tokens,
        steps=[s.to_dict() for s in episode.steps],
        n_steps=len(episode.steps),
        tool_calls=dict(episode.tool_calls),
        timed_out=episode.timed_out,
        exhausted_by=episode.exhausted_by,
        force_committed=episode.force_committed,
        repeated_calls=episode.repeated_calls,
        repeated_call_blocked=episode.repeated_call_blocked,
        wall_time_s=round(episode.wall_time_s, 4),
        doc_ids_seen=list(episode.doc_ids_seen),
        evidence_docids=list(question.evidence_docids),
        evidence_recall=evidence_recall(episode.doc_ids_seen, question.evidence_docids),
        errors=list(episode.errors),
        category=question.category,
        tool_mode=getattr(episode, "tool_mode", "json"),
        input_split=dict(getattr(episode, "input_split", {}) or {}),
        refused_calls=int(getattr(episode, "refused_calls", 0) or 0),
        duplicate_calls=int(getattr(episode, "duplicate_calls", 0) or 0),
    )


def failed_trace(question: Question, skill: str, error: str, *, wall_time_s: float = 0.0) -> Trace:
    """A trace for a question whose run raised (status ``failed``, not graded)."""
    return Trace(
        query_id=question.query_id,
        skill=skill,
        question=question.query,
        gold_answer=question.answer,
        aliases=list(question.aliases),
        status="failed",
        evidence_docids=list(question.evidence_docids),
        evidence_recall=evidence_recall((), question.evidence_docids),
        wall_time_s=round(wall_time_s, 4),
        errors=[error],
        failure=error,
        category=question.category,
    )
