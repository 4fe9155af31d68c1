"""Run an agent over questions concurrently, scoring each, appending traces to a resumable JSONL.

Contract (the gepa adapter contract): ``evaluate`` never raises for one question's failure;
that question gets a trace with ``status="failed"``, the reason in ``Trace.failure``, and no
grade (an outage is not a wrong answer, see :mod:`kitune.evaluation.metrics`). ``len(result) ==
len(questions)``, in question order.

One exception: an **authentication failure** (the agent's or the judge's LLM call refused with
401/403, :func:`kitune.evaluation.metrics.is_auth_failure`) cannot succeed for any other
question, so the run stops at once — questions not yet started are not run — and ``evaluate``
raises :class:`kitune.errors.LMAuthError` naming the question and the key variable (from the
LM layer's message). The traces finished so far, the refused one included (``failed``), are
in ``traces_path``; rerunning after fixing the key resumes.

Likewise a **recording miss** (``--replay``: a call the recording does not hold,
:class:`kitune.recording.RecordingMissError`, from the agent or the judge) fails the same way on
every rerun, so it is not a ``failed`` question: the run stops (questions not yet started are not
run, running ones finish and are kept) and ``evaluate`` re-raises the first miss.

Resume: with ``traces_path``, questions whose ``query_id`` (for the same skill) is already in
the file are skipped and their stored traces returned, except ``status="failed"`` ones (a
provider outage, a harness error): those are run again (``retry_failed``) and the new trace is
appended; readers keep the last trace per (skill, query id), so nothing is counted twice. Each
trace is one ``write`` of a full line followed by flush + fsync, so a crash leaves at most one
truncated last line; it is ignored on read and cut off before the next append.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kitune.data.loaders import Question
from kitune.errors import DataError, LMAuthError
from kitune.evaluation.agent import Episode
from kitune.evaluation.metrics import JudgeFn, Trace, build_trace, failed_trace, is_auth_failure
from kitune.recording import RecordingMissError

__all__ = ["AgentFactory", "Runner", "TraceWriter", "evaluate", "read_traces"]

logger = logging.getLogger(__name__)


class Runner(Protocol):
    """Anything that answers one question text with an :class:`Episode` (e.g. ``Agent``)."""

    def run(self, question: str) -> Episode:
        """Answer ``question``."""
        ...


AgentFactory = Callable[[Question], Runner]
"""Builds a fresh runner (agent + toolbox) for one question; called in a worker thread."""


def read_traces(path: Path | str, *, latest_only: bool = True) -> list[Trace]:
    """Read a traces JSONL file, tolerating a truncated last line.

    Args:
        path: the JSONL file.
        latest_only: keep only the last trace per (skill, query id), at the position of the
            first one (a failed question retried on resume has two lines); False: every line.

    Returns:
        Traces in file order; ``[]`` when the file does not exist.

    Raises:
        DataError: a complete line (one ending in a newline) is not a trace record (names file
            and line); only an unterminated last line is taken for a crash and skipped.
    """
    p = Path(path)
    if not p.is_file():
        return []
    lines = p.read_text(encoding="utf-8").split("\n")
    out: list[Trace] = []
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(Trace.from_dict(json.loads(line)))
        except (json.JSONDecodeError, TypeError) as e:
            if i == last == len(lines) - 1:  # no newline after it: a write cut short by a crash
                logger.warning("ignoring truncated last line %d of %s", i + 1, p)
                continue
            raise DataError(
                f"{p}:{i + 1}: not a trace record ({e}); delete the line to resume", path=str(p), line=i + 1
            ) from e
    if not latest_only:
        return out
    latest: dict[tuple[str, str], Trace] = {}
    for t in out:
        latest[(t.skill, t.query_id)] = t  # dict keeps the first position, the value is the last
    return list(latest.values())


class TraceWriter:
    """Appends traces to a JSONL file, one complete line per write, thread-safe."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._repair()

    def _repair(self) -> None:
        if not self.path.is_file():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data[: data.rfind(b"\n") + 1]  # drop the partial last line
            tmp = self.path.with_suffix(self.path.suffix + ".tmp")
            tmp.write_bytes(keep)
            os.replace(tmp, self.path)

    def write(self, trace: Trace) -> None:
        """Append one trace as a full line, flushed to disk."""
        line = trace.to_json() + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())


def _run_one(
    question: Question, factory: AgentFactory, skill: str, judge: JudgeFn | None, stop: threading.Event
) -> Trace | None:
    if stop.is_set():  # an authentication failure elsewhere stopped the run: do not start
        return None
    t0 = time.monotonic()
    try:
        episode = factory(question).run(question.query)
        trace = build_trace(question, skill, episode, judge=judge)
    except RecordingMissError:
        stop.set()  # a replay miss repeats on every question and every rerun: stop, re-raised by evaluate
        raise
    except Exception as e:  # one question must never sink the run
        logger.exception("question %s failed", question.query_id)
        trace = failed_trace(question, skill, f"{type(e).__name__}: {e}", wall_time_s=time.monotonic() - t0)
    if is_auth_failure(trace):
        stop.set()  # set here, in the worker, so no other question starts after this one
    return trace


def evaluate(
    questions: Sequence[Question],
    agent_factory: AgentFactory,
    *,
    skill: str,
    concurrency: int = 2,
    traces_path: Path | str | None = None,
    judge: JudgeFn | None = None,
    progress: bool = True,
    on_trace: Callable[[Trace], None] | None = None,
    retry_failed: bool = True,
    label: str | None = None,
) -> list[Trace]:
    """Evaluate ``questions`` with fresh agents, ``concurrency`` at a time.

    Args:
        questions: unique query ids.
        agent_factory: builds a runner for one question (called in a worker thread).
        skill: label stored on each trace (``baseline``, ``in-context``, ``closed-book``).
        concurrency: worker threads, >= 1.
        traces_path: JSONL to append to and resume from (None: keep in memory only).
        judge: grader (None: traces are not judged).
        progress: show a Rich progress bar on stderr.
        on_trace: called (in the main thread) with each new trace as it finishes.
        retry_failed: on resume, run again the questions whose stored trace is ``failed``.
        label: what the progress lines call the run (``eval <label>``); None: the skill.

    Returns:
        One trace per question, in question order (resumed ones read from the file). Questions
        whose LLM calls failed have ``status="failed"`` and are not graded.

    Raises:
        ValueError: ``concurrency < 1`` or duplicate query ids.
        DataError: the traces file has a corrupt line other than the last.
        LMAuthError: an LLM call was refused for authentication; the run stopped (see the
            module docstring); finished traces are written.
        RecordingMissError: a replayed run made a call its recording does not hold; the run
            stopped; finished traces are written.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    ids = [q.query_id for q in questions]
    if len(set(ids)) != len(ids):
        raise ValueError("evaluate needs unique query ids")
    done: dict[str, Trace] = {}
    writer: TraceWriter | None = None
    if traces_path is not None:
        wanted = set(ids)
        done = {
            t.query_id: t
            for t in read_traces(traces_path)
            if t.skill == skill and t.query_id in wanted and not (retry_failed and t.status == "failed")
        }
        writer = TraceWriter(traces_path)
    todo = [q for q in questions if q.query_id not in done]
    results: dict[str, Trace] = dict(done)
    stop = threading.Event()
    refused: Trace | None = None
    miss: RecordingMissError | None = None

    bar = None
    task = None
    # redirected to a file or pipe: one plain line per question instead of a bar drawn at the end
    plain = progress and not sys.stderr.isatty()
    started = time.monotonic()
    if progress and not plain:
        bar = Progress(
            TextColumn(f"eval {label or skill}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[acc]}"),
            console=Console(stderr=True),
            transient=False,
        )
        task = bar.add_task("eval", total=len(questions), completed=len(done), acc="")
        bar.start()
    try:
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="kitune-eval") as pool:
            futures = {
                pool.submit(contextvars.copy_context().run, _run_one, q, agent_factory, skill, judge, stop): q
                for q in todo
            }
            for fut in as_completed(futures):
                if fut.cancelled():
                    continue
                try:
                    trace = fut.result()
                except RecordingMissError as e:
                    miss = miss or e
                    for other in futures:
                        other.cancel()  # queued ones never start; running ones finish
                    continue
                if trace is None:  # not started: the run was stopped
                    continue
                results[trace.query_id] = trace
                if writer is not None:
                    writer.write(trace)
                if on_trace is not None:
                    on_trace(trace)
                if refused is None and is_auth_failure(trace):
                    refused = trace
                    stop.set()
                    for other in futures:
                        other.cancel()  # queued ones never start; running ones finish
                if bar is not None and task is not None:
                    bar.update(task, advance=1, acc=_progress_text(results.values()))
                elif plain:
                    print(
                        f"eval {label or skill} {len(results)}/{len(questions)} · "
                        f"{_progress_text(results.values())} · {time.monotonic() - started:.0f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        if bar is not None:
            bar.stop()
    if miss is not None:
        raise miss
    if refused is not None:
        raise _auth_stop(refused, questions, results)
    return [results[q.query_id] for q in questions]


def _progress_text(traces: Iterable[Trace]) -> str:
    """``"correct 3/5 · failed 1"`` for the progress bar (correct of graded, whatever the grader)."""
    traces = list(traces)
    graded = [t for t in traces if t.is_graded]
    failed = sum(t.status == "failed" for t in traces)
    parts = [f"correct {sum(bool(t.judge_correct) for t in graded)}/{len(graded)}"] if graded else []
    if failed:
        parts.append(f"failed {failed}")
    return " · ".join(parts)


def _auth_stop(refused: Trace, questions: Sequence[Question], results: dict[str, Trace]) -> LMAuthError:
    """The error that ends a run stopped by an authentication failure."""
    who = "the judge" if refused.failure is None else "the agent"
    reason = refused.judge_error if refused.failure is None else refused.failure
    not_run = sum(q.query_id not in results for q in questions)
    return LMAuthError(
        f"authentication failed for {who} on question {refused.query_id}: {reason} — the run stopped: "
        f"{not_run} of {len(questions)} question(s) not run. Fix the key, then rerun the same command "
        "to resume (finished questions are kept, failed ones are retried)."
    )
