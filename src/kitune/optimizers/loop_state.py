"""The loop's state on disk: :class:`IterationRecord` (one finished iteration) and ``loop_state.json``.

:func:`write_state` writes the history, the current setting and the reference run statistics
atomically (a temporary file, then a rename) after every iteration; :func:`read_state` reads
them back so a rerun resumes where the last one stopped (an unreadable file is ignored with a
warning: the loop starts afresh rather than crash).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kitune.optimizers.objective import RunStats
from kitune.optimizers.setting import Setting

__all__ = ["IterationRecord", "read_state", "record_from_dict", "write_state"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class IterationRecord:
    """One finished iteration (a row of the curves table)."""

    iteration: int
    """0-based."""
    current_key: str
    candidate_key: str
    tune_score: float
    """Loop score of the current setting on the tuning split."""
    val_score: float
    """Loop score of the current setting on the validation split."""
    candidate_val_score: float
    """Loop score of the proposal on the validation split."""
    accepted: bool
    tune_accuracy: float | None = None
    val_accuracy: float | None = None
    candidate_val_accuracy: float | None = None
    run_id: str | None = None
    """Tracking run of the iteration (None when tracking is off or failed)."""
    registered: Mapping[str, int] = field(default_factory=dict)
    """Program → prompt version registered (accepted iterations only)."""
    changed: tuple[str, ...] = ()
    """Programs whose instruction the proposal changed."""
    decision: str = ""
    """``accepted`` | ``rejected`` | ``not_enough_evidence`` (the stage rule kept the incumbent) |
    ``undecided`` (too many failed questions to decide)."""
    reason: str = ""
    """Why, with the numbers of the paired comparison."""
    val_after_score: float | None = None
    """Loop score of the current setting on validation re-measured after the improve step."""
    val_after_accuracy: float | None = None
    tune_ci: tuple[float, float] | None = None
    val_ci: tuple[float, float] | None = None
    """95% Wilson intervals of the tuning / validation accuracy."""
    n_tune: int = 0
    n_val: int = 0
    paired: Mapping[str, Any] = field(default_factory=dict)
    """The :class:`~kitune.optimizers.acceptance.PairedComparison` as a dict."""
    flips: Mapping[str, Any] = field(default_factory=dict)
    """``{"tune": {"fixed": [...], "broken": [...]}, "validation": {...}}`` vs the previous iteration."""
    failure_kinds: Mapping[str, Any] = field(default_factory=dict)
    """``{"tune": {kind: n}, "validation": {kind: n}}`` at the start of the iteration."""
    failed: Mapping[str, int] = field(default_factory=dict)
    """Failed (not graded) questions per split."""
    tokens_used: int | None = None
    """LLM tokens the iteration spent (all roles), when the environment reports them."""
    stages: Mapping[str, Any] = field(default_factory=dict)
    """Stage metrics per run (``tune``, ``validation``, ``validation_after``,
    ``candidate_validation``): a list of :class:`~kitune.evaluation.stage_metrics.StageMetric` as
    dicts (value, n, 95% interval, successes, excluded)."""
    improve: Mapping[str, float] = field(default_factory=dict)
    """The improve step's metrics (``<program>_proposals``, ``_best_score``, ``feedback_*``,
    ``gate_*`` …), as logged with the ``improve_`` prefix."""
    gate: Mapping[str, Any] = field(default_factory=dict)
    """The feedback gate's report (:meth:`kitune.optimizers.gate.GateReport.to_dict`: candidates,
    kept, rejected with reason and broken question ids, re-run questions); empty: no gate ran."""
    timings: Mapping[str, float] = field(default_factory=dict)
    """Wall seconds per step: ``measure_s`` (both splits), ``improve_s``, ``revalidate_s`` (the
    current setting on validation after improving), ``candidate_s``, ``total_s``."""
    credit: Mapping[str, int] = field(default_factory=dict)
    """KI credit counts after the iteration's measurement (runs, kis, harmful, demoted, retire,
    retired; :meth:`kitune.optimizers.credit.CreditLedger.summary`)."""
    decisions: Sequence[Mapping[str, Any]] = ()
    """The stage rule's verdict on each change (:meth:`kitune.optimizers.acceptance.ChangeDecision.to_dict`:
    outcome, reason, the level it had to reach, the stage test and the end-to-end check with n,
    effect, interval and p); empty under the permissive rule."""


def record_from_dict(r: Mapping[str, Any]) -> IterationRecord:
    """An :class:`IterationRecord` from its JSON form (lists back to tuples)."""
    data = dict(r)
    data["changed"] = tuple(data.get("changed", ()))
    for k in ("tune_ci", "val_ci"):
        if data.get(k) is not None:
            data[k] = tuple(data[k])
    return IterationRecord(**data)


def read_state(path: Path) -> tuple[list[IterationRecord], Setting | None, dict[str, RunStats]]:
    """``(history, current setting, reference stats per split)``; empty when absent or unreadable."""
    if not path.is_file():
        return [], None, {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        history = [record_from_dict(r) for r in data.get("history", [])]
        reference = {k: RunStats(**v) for k, v in data.get("reference", {}).items()}
        return history, Setting.from_dict(data["current"]), reference
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        logger.warning("ignoring unreadable loop state %s (%s); starting afresh", path, e)
        return [], None, {}


def write_state(
    path: Path, history: Sequence[IterationRecord], current: Setting, reference: Mapping[str, RunStats]
) -> None:
    """Write ``loop_state.json`` atomically (see the module docstring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    data = {
        "history": [asdict(r) for r in history],
        "current": current.to_dict(),
        "reference": {k: asdict(v) for k, v in reference.items()},
    }
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)
