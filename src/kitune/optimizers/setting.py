"""What the loop passes around: a :class:`Setting`, its :class:`Evaluation` on a split, a :class:`Proposal`.

Plain data, no behaviour beyond hashing: the loop (:mod:`kitune.optimizers.loop`), the program
tasks, the improvers and the service environment all read these.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from kitune.evaluation.report import RunSummary
    from kitune.evaluation.stage_metrics import StageReport
    from kitune.evaluation.trace import Trace

__all__ = ["Evaluation", "LoopSplit", "Proposal", "Setting"]

LoopSplit = Literal["tune", "validation"]


@dataclass(frozen=True)
class Setting:
    """What the loop tunes: instruction texts per program and numeric config overrides."""

    prompts: Mapping[str, str]
    """Program name (``extractor``, ``rewriter``, ``disambiguator``) → instruction text."""
    knobs: Mapping[str, int | float] = field(default_factory=dict)
    """Dotted config key → value (``retrieval.rrf_k`` …), applied as config overrides."""

    @property
    def key(self) -> str:
        """8 hex characters identifying the setting (same texts and knobs ⇒ same key)."""
        blob = json.dumps({"p": dict(self.prompts), "k": dict(self.knobs)}, sort_keys=True)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:8]

    def key_without(self, programs: Iterable[str]) -> str:
        """8 hex characters identifying the setting with ``programs``' instructions left out.

        :func:`kitune.optimizers.program_task.eval_key` passes the write-only programs, so two
        settings that differ only in what is written share their evaluations.
        """
        skip = set(programs)
        prompts = {k: v for k, v in self.prompts.items() if k not in skip}
        blob = json.dumps({"p": prompts, "k": dict(self.knobs)}, sort_keys=True)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:8]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {"prompts": dict(self.prompts), "knobs": dict(self.knobs)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Setting:
        """Inverse of :meth:`to_dict`."""
        return cls(prompts=dict(data.get("prompts", {})), knobs=dict(data.get("knobs", {})))

    def changed_programs(self, other: Setting) -> list[str]:
        """Programs whose instruction differs from ``other``'s, sorted."""
        names = set(self.prompts) | set(other.prompts)
        return sorted(n for n in names if self.prompts.get(n) != other.prompts.get(n))


@dataclass(frozen=True)
class Evaluation:
    """One setting evaluated on one split."""

    summary: RunSummary
    """Aggregates of the run."""
    traces: tuple[Trace, ...] = ()
    """Per-question traces."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Extra measures (extraction feedback, flips …) to log."""
    gold_docids: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Query id → answer-bearing documents (for failure kinds); empty: evidence documents."""
    retrieved: Mapping[str, tuple[str, ...]] | None = None
    """Query id → KI ids the agent's look-ups returned (None: not recorded)."""
    store_state: str = ""
    """Fingerprint of the KI store the run read (changes whenever KIs are written or expire)."""
    stages: StageReport | None = None
    """The split's stage metrics (extractor coverage, rewriter recall@k …, with intervals;
    :mod:`kitune.evaluation.stage_metrics`), also flattened into :attr:`metrics` as
    ``stage_<program>_<metric>``; None: not measured."""


@dataclass(frozen=True)
class Proposal:
    """What ``env.improve`` proposes."""

    setting: Setting
    """The candidate setting (may equal the current one: nothing found)."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Measures of the improvement step (metric calls, feedback KIs written, flips …)."""
    programs: Mapping[str, Any] = field(default_factory=dict)
    """Program name → optimised ``dspy.Module`` (its state is logged as JSON)."""
    notes: Mapping[str, Any] = field(default_factory=dict)
    """JSON-able details (stop reasons, knob trials …), logged as ``improve.json``."""
