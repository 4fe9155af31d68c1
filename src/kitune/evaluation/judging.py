"""Judge stored traces after the answers: the second pass of a run answered with the judge off.

Why: the full-context arm relies on the local server's prompt cache (the conversation stays
evaluated between questions); a judge call on the same server in between would replace it. So
such a run answers every question first and is judged here afterwards. The verdict rules are
those of :func:`kitune.evaluation.metrics.build_trace`: no answer is graded wrong, a judge that
raises or returns no verdict is a grader error (never "incorrect"), and a ``failed`` trace (its
LLM calls failed: an outage is not a wrong answer) is left ungraded.

Resumable: each judged trace is appended to the traces file; readers keep the last line per
(skill, query id), so a crash loses at most the verdicts being written.

Concurrency: verdicts are independent, so ``judge_pending`` runs up to ``concurrency`` of them at
once (``cfg.concurrency_for("judge")`` in :func:`kitune.service.pipelines.evaluation.run_eval`); each
worker runs in a copy of the caller's ``contextvars`` context (ledger stage, ``dspy.context``).
The result does not depend on ``concurrency``: the same verdicts, in the input order.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

from kitune.data.loaders import Question
from kitune.evaluation.agent import Episode
from kitune.evaluation.harness import TraceWriter
from kitune.evaluation.metrics import JudgeFn, Trace, format_response
from kitune.recording import RecordingMissError

__all__ = ["judge_pending", "judge_trace"]


def judge_trace(trace: Trace, question: Question, judge: JudgeFn) -> Trace:
    """Return ``trace`` with the judge's verdict (``judge_correct``, ``judge_status``, ``judge_error``).

    An empty answer is graded wrong without calling the judge; a raising judge or one without
    a verdict gives ``judge_status="grader_error"`` and ``judge_correct=None``.
    """
    if not trace.exact_answer.strip():
        return replace(trace, judge_correct=False, judge_status="graded", judge_error=None)
    episode = Episode(
        question=trace.question,
        status="answered",
        explanation=trace.explanation,
        exact_answer=trace.exact_answer,
        confidence=trace.confidence,
    )
    try:
        verdict = judge(
            question=question.query,
            response=format_response(episode),
            gold=question.answer,
            aliases=list(question.aliases),
        )
    except RecordingMissError:
        raise  # a replay miss is no grader error: the run stops
    except Exception as e:  # recorded, never "incorrect" (case J3)
        return replace(
            trace, judge_correct=None, judge_status="grader_error", judge_error=f"{type(e).__name__}: {e}"
        )
    status = str(getattr(verdict, "status", "graded"))
    correct = getattr(verdict, "correct", None)
    if status != "graded" or correct is None:
        err = str(getattr(verdict, "error", None) or "judge returned no verdict")
        return replace(trace, judge_correct=None, judge_status="grader_error", judge_error=err)
    return replace(trace, judge_correct=bool(correct), judge_status="graded", judge_error=None)


def judge_pending(
    questions: Sequence[Question],
    traces: Sequence[Trace],
    judge: JudgeFn,
    *,
    traces_path: Path | str | None = None,
    retry_grader_errors: bool = True,
    concurrency: int = 1,
) -> list[Trace]:
    """Judge every trace not judged yet (``judge_status == "not_run"``, or a grader error).

    Traces with ``status == "failed"`` are never judged (returned as they are).

    Args:
        questions: the run's questions (gold answers); matched to traces by query id.
        traces: the run's traces, e.g. from :func:`kitune.evaluation.harness.evaluate`.
        judge: the grader; called from ``concurrency`` worker threads at once, so it must be
            thread-safe (the LLM judge and the ``match`` grader are).
        traces_path: append each newly judged trace here (the run's ``traces.jsonl``), in the
            order the verdicts finish.
        retry_grader_errors: judge ``grader_error`` traces again.
        concurrency: verdicts computed at once (>= 1); the result is the same for any value.

    Returns:
        The traces in input order, judged ones replaced; ``len(result) == len(traces)``.
        Traces without an answer (other than failed ones) are graded wrong without a judge call.
        A judge that raises gives that trace ``grader_error`` (see :func:`judge_trace`); the
        others are judged as usual.

    Raises:
        KeyError: a trace's query id is not among ``questions`` (checked before any judge call).
        ValueError: ``concurrency < 1``.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    by_id = {q.query_id: q for q in questions}
    pending = [
        i
        for i, t in enumerate(traces)
        if t.status != "failed"
        and (t.judge_status == "not_run" or (retry_grader_errors and t.judge_status == "grader_error"))
    ]
    for i in pending:
        if traces[i].query_id not in by_id:
            raise KeyError(f"trace {traces[i].query_id!r} has no question among the {len(by_id)} given")
    out = list(traces)
    if not pending:
        return out
    writer = TraceWriter(traces_path) if traces_path is not None else None
    with ThreadPoolExecutor(
        max_workers=min(concurrency, len(pending)), thread_name_prefix="kitune-judge"
    ) as pool:
        futures = {
            pool.submit(
                contextvars.copy_context().run, judge_trace, traces[i], by_id[traces[i].query_id], judge
            ): i
            for i in pending
        }
        for fut in as_completed(futures):
            judged = fut.result()  # judge_trace records a raising judge as a grader error
            out[futures[fut]] = judged
            if writer is not None:
                writer.write(judged)
    return out
