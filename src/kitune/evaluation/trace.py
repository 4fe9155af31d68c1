"""The per-question record of an evaluation: :class:`Trace` (JSON round-trip, one traces.jsonl line).

Built by :func:`kitune.evaluation.metrics.build_trace` from an agent episode (or
:func:`~kitune.evaluation.metrics.failed_trace`); read by the harness, the reports, the loop's
ledger and cache, and the tracker. (``from kitune.evaluation.metrics import Trace`` keeps working:
three dozen modules import it from there.)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["Trace"]


@dataclass(frozen=True)
class Trace:
    """One evaluated question. JSON round-trips through :meth:`to_dict` / :meth:`from_dict`."""

    query_id: str
    skill: str
    question: str
    gold_answer: str
    aliases: list[str] = field(default_factory=list)
    status: str = "failed"
    """answered | budget_exhausted | context_overflow | malformed_calls | invalid_tool_arguments | failed."""
    exact_answer: str = ""
    explanation: str = ""
    confidence: int | None = None
    judge_correct: bool | None = None
    """None when not graded (grader error or no judge)."""
    judge_status: str = "not_run"
    """graded | grader_error | not_run (no judge given)."""
    judge_error: str | None = None
    em: bool = False
    f1: float = 0.0
    """Token F1 in 0.0–1.0."""
    input_tokens: int = 0
    """Sum of ``steps[*].input_tokens`` (provider usage)."""
    output_tokens: int = 0
    tool_input_tokens: int = 0
    """LLM input tokens spent inside tools (query rewrites in get_context); not in ``input_tokens``."""
    tool_output_tokens: int = 0
    steps: list[dict[str, Any]] = field(default_factory=list)
    """Per model call: kind, tool, args, observation_chars, error, input/output tokens, …"""
    n_steps: int = 0
    tool_calls: dict[str, int] = field(default_factory=dict)
    timed_out: bool = False
    exhausted_by: str | None = None
    force_committed: bool = False
    repeated_calls: int = 0
    repeated_call_blocked: int = 0
    wall_time_s: float = 0.0
    doc_ids_seen: list[str] = field(default_factory=list)
    evidence_docids: list[str] = field(default_factory=list)
    evidence_recall: float | None = None
    """|seen ∩ evidence| / |evidence| in 0.0–1.0; None when the question has no evidence docs."""
    errors: list[str] = field(default_factory=list)
    failure: str | None = None
    """Why the question failed (``"<LMError type>: <message>"``, or the exception a run raised);
    set exactly when ``status == "failed"``; such a trace is never graded."""
    category: str = ""
    """The question's category (e.g. ``"temporal"``), empty when the dataset has none."""
    tool_mode: str = "json"
    """How the agent called tools: ``native`` (the provider's tool calling) or ``json`` (JSON in text)."""
    input_split: dict[str, int] = field(default_factory=dict)
    """``input_tokens`` by component (``system``, ``question``, ``observation:<tool>``,
    ``feedback``, ``history``, ``force_commit``; see :data:`kitune.evaluation.agent.COMPONENTS`);
    sums to ``input_tokens`` when set; empty for traces written before it existed."""
    refused_calls: int = 0
    """Calls refused (blocked identical repeats, calls a tool declined)."""
    duplicate_calls: int = 0
    """Exact duplicate calls dropped from the model's replies (never run nor charged)."""

    @property
    def is_graded(self) -> bool:
        """True when the judge produced a verdict."""
        return self.judge_status == "graded" and self.judge_correct is not None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (one traces.jsonl line)."""
        return asdict(self)

    def to_json(self) -> str:
        """One line of JSON, no newline."""
        return json.dumps(self.to_dict(), ensure_ascii=False, sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trace:
        """Rebuild from :meth:`to_dict` output; unknown keys are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
