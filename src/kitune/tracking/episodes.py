"""Agent episodes as trace records: one :class:`EpisodeRecord` per question, one :class:`StepSpan` per step.

Pure (no I/O): :func:`episode_record` turns a kitune :class:`~kitune.evaluation.metrics.Trace`
into the backend-neutral shape a tracker logs (``Tracker.log_episodes``). The MLflow tracker
writes each record as one MLflow trace (root span ``AGENT`` + one span per step), the
``RecordingTracker`` keeps it in memory.

Timeline: a kitune trace stores each model call's latency (``steps[*].latency_s``) and the
question's wall time, not absolute times. Spans are laid out back to back from ``start_ns``
(step *i* starts when step *i−1* ended); the root span lasts ``max(wall_time_s, Σ latency)``.
Tool execution time is not recorded per step, so it shows as the gap at the end of the root.

Span attributes (all prefixed ``kitune.``): ``kind``, ``tool``, ``args``, ``input_tokens``,
``output_tokens``, ``tool_input_tokens``, ``tool_output_tokens``, ``error``,
``observation_chars``, ``doc_ids``, ``repeated``, ``blocked``, ``truncated``; plus MLflow's
``mlflow.chat.tokenUsage`` (agent model tokens only, as in ``Trace.input_tokens``) so MLflow
sums a trace's tokens itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kitune.evaluation.metrics import Trace

__all__ = ["MAX_ATTR_CHARS", "EpisodeRecord", "StepSpan", "episode_record"]

MAX_ATTR_CHARS = 2000
"""Longest string kept in a span attribute or input (tool args, replies); longer ones are cut."""


@dataclass(frozen=True)
class StepSpan:
    """One agent step (one model call and the tool call it asked for)."""

    name: str
    """``step <i>: <tool or kind>``, e.g. ``step 2: search``."""
    span_type: str
    """``TOOL`` for a tool step, ``LLM`` for answer / invalid / force_commit / lm_error."""
    start_ns: int
    end_ns: int
    inputs: dict[str, Any]
    """The tool's arguments (strings cut to :data:`MAX_ATTR_CHARS`)."""
    outputs: dict[str, Any]
    """``observation_chars``, ``doc_ids`` and the model's reply (first 500 chars)."""
    attributes: dict[str, Any]
    """``kitune.*`` attributes (see the module docstring) and ``mlflow.chat.tokenUsage``."""
    error: str | None = None
    """The step's error; the span's status is ERROR when set."""


@dataclass(frozen=True)
class EpisodeRecord:
    """One question's episode, ready to log as one trace."""

    name: str
    """Trace name: ``<name>/<query_id>``."""
    query_id: str
    start_ns: int
    end_ns: int
    inputs: dict[str, Any]
    """``{"question": ...}``."""
    outputs: dict[str, Any]
    """``exact_answer``, ``explanation``, ``confidence``, ``status``."""
    attributes: dict[str, Any]
    """Root-span attributes: ``kitune.query_id``, ``skill``, ``status``, ``gold_answer``,
    ``judge_correct``, ``judge_status``, token totals, ``timed_out``, ``force_committed``,
    ``failure_kind``, ``n_steps``, ``errors``, ``failure`` (why a failed run failed)."""
    tags: dict[str, str]
    """Trace tags: ``kitune.query_id``, ``kitune.skill``, ``kitune.status``, ``kitune.correct``
    (``true`` / ``false`` / ``ungraded``) and ``kitune.failure_kind`` when known."""
    ok: bool
    """False for a question whose run failed (trace status ERROR)."""
    steps: list[StepSpan] = field(default_factory=list)

    @property
    def input_tokens(self) -> int:
        """Sum of the steps' agent input tokens (equals ``Trace.input_tokens``)."""
        return sum(int(s.attributes["kitune.input_tokens"]) for s in self.steps)


def _cut(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= MAX_ATTR_CHARS else value[: MAX_ATTR_CHARS - 1] + "…"
    if isinstance(value, Mapping):
        return {str(k): _cut(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_cut(v) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return _cut(json.dumps(value, default=str))


def _step_span(step: Mapping[str, Any], start_ns: int) -> StepSpan:
    kind = str(step.get("kind") or "tool")
    tool = step.get("tool")
    index = int(step.get("index") or 0)
    latency_ns = max(0, int(float(step.get("latency_s") or 0.0) * 1e9))
    in_tok, out_tok = int(step.get("input_tokens") or 0), int(step.get("output_tokens") or 0)
    error = step.get("error")
    attrs: dict[str, Any] = {
        "kitune.kind": kind,
        "kitune.tool": tool or "",
        "kitune.args": _cut(dict(step.get("args") or {})),
        "kitune.input_tokens": in_tok,
        "kitune.output_tokens": out_tok,
        "kitune.tool_input_tokens": int(step.get("tool_input_tokens") or 0),
        "kitune.tool_output_tokens": int(step.get("tool_output_tokens") or 0),
        "kitune.error": error or "",
        "kitune.observation_chars": int(step.get("observation_chars") or 0),
        "kitune.doc_ids": [str(d) for d in step.get("doc_ids") or ()],
        "kitune.repeated": bool(step.get("repeated")),
        "kitune.blocked": bool(step.get("blocked")),
        "kitune.truncated": bool(step.get("truncated")),
        "kitune.refused": bool(step.get("refused")),
        "kitune.source": str(step.get("source") or ""),
        "kitune.input_split": {str(k): int(v) for k, v in dict(step.get("input_split") or {}).items()},
        "mlflow.chat.tokenUsage": {
            "input_tokens": in_tok,
            "output_tokens": out_tok,
            "total_tokens": in_tok + out_tok,
        },
    }
    return StepSpan(
        name=f"step {index}: {tool or kind}",
        span_type="TOOL" if kind == "tool" and tool else "LLM",
        start_ns=start_ns,
        end_ns=start_ns + latency_ns,
        inputs=_cut(dict(step.get("args") or {})),
        outputs={
            "observation_chars": attrs["kitune.observation_chars"],
            "doc_ids": attrs["kitune.doc_ids"],
            "reply": _cut(str(step.get("reply") or "")),
        },
        attributes=attrs,
        error=str(error) if error else None,
    )


def episode_record(
    trace: Trace, *, name: str, start_ns: int, failure_kind: str | None = None
) -> EpisodeRecord:
    """Turn one evaluated question into an :class:`EpisodeRecord`.

    Args:
        trace: the question's trace (``steps`` as written by the harness).
        name: prefix of the trace name, e.g. ``iteration-2/tune``.
        start_ns: when the episode starts on the laid-out timeline (ns since the epoch).
        failure_kind: the trace's failure kind, when the caller classified it.

    Returns:
        The record; its ``input_tokens`` equals ``trace.input_tokens`` when the steps carry
        the tokens (as the harness writes them).
    """
    steps: list[StepSpan] = []
    t = start_ns
    for raw in trace.steps:
        span = _step_span(raw, t)
        steps.append(span)
        t = span.end_ns
    end_ns = max(t, start_ns + int(max(0.0, trace.wall_time_s) * 1e9))
    correct = "ungraded" if trace.judge_correct is None else str(bool(trace.judge_correct)).lower()
    tags = {
        "kitune.query_id": trace.query_id,
        "kitune.skill": trace.skill,
        "kitune.status": trace.status,
        "kitune.correct": correct,
    }
    if failure_kind:
        tags["kitune.failure_kind"] = failure_kind
    attributes: dict[str, Any] = {
        "kitune.query_id": trace.query_id,
        "kitune.skill": trace.skill,
        "kitune.status": trace.status,
        "kitune.gold_answer": _cut(trace.gold_answer),
        "kitune.judge_correct": trace.judge_correct,
        "kitune.judge_status": trace.judge_status,
        "kitune.input_tokens": trace.input_tokens,
        "kitune.output_tokens": trace.output_tokens,
        "kitune.tool_input_tokens": trace.tool_input_tokens,
        "kitune.input_split": dict(trace.input_split),
        "kitune.n_steps": len(trace.steps),
        "kitune.timed_out": trace.timed_out,
        "kitune.force_committed": trace.force_committed,
        "kitune.failure_kind": failure_kind or "",
        "kitune.errors": _cut(list(trace.errors)),
        "kitune.failure": _cut(trace.failure or ""),
    }
    return EpisodeRecord(
        name=f"{name}/{trace.query_id}",
        query_id=trace.query_id,
        start_ns=start_ns,
        end_ns=end_ns,
        inputs={"question": _cut(trace.question)},
        outputs={
            "exact_answer": _cut(trace.exact_answer),
            "explanation": _cut(trace.explanation),
            "confidence": trace.confidence,
            "status": trace.status,
        },
        attributes=attributes,
        tags=tags,
        ok=trace.status != "failed",
        steps=steps,
    )
