"""Credit assignment for retrieved facts: per KI, how the episodes it was shown in ended.

In the spirit of ACE's helpful/harmful counters, but for retrieved facts rather than playbook
bullets. Every evaluated episode records which KI ids the agent was shown (the look-up log:
``Evaluation.retrieved``). Per KI, :class:`CreditLedger` accumulates:

* ``shown_right`` / ``shown_wrong`` — episodes it was shown in that were answered right / wrong
  (failed and ungraded episodes are not counted; a KI shown twice in one episode counts once);
* ``harmful`` — questions that flipped right → wrong in the first run in which the KI was shown
  to them: the question was right in its previous counted run, is wrong now, and the KI is
  among the ids it is shown now but was not shown then (it *appeared* in the question's
  retrieval). Every newly appeared KI of such an episode is blamed — the ledger cannot tell
  which one misled the agent; the gate (:mod:`kitune.optimizers.gate`) re-runs to find out;
* ``helpful`` — the mirror image: questions that flipped wrong → right in the first run in
  which the KI appeared in their retrieval (every newly appeared KI of such an episode is
  credited).

**Rule** (:func:`credit_verdict`, applied in this order); a KI is held against only while it
broke more questions than it fixed (``harmful > helpful``):

1. ``harmful ≥ 2`` and ``harmful > helpful`` ⇒ ``retire``: set the KI's status to ``expired``
   (:func:`retire_kis`, the store's status field — never a delete; an expired KI is not served)
   and drop it from rankings;
2. ``harmful ≥ 1``, ``harmful > helpful`` and ``shown_wrong > shown_right`` ⇒ ``demote``: its
   ranking score is multiplied by :data:`DEMOTE_FACTOR` (0.5) in :func:`demote_ranked`;
3. otherwise ``keep`` (score unchanged).

With no helpful record this is the earlier rule on ``harmful`` alone; a helpful record can only
spare a KI (``harmful = helpful = 2``: kept or demoted, not retired; ``harmful = helpful = 1``:
kept). The review queue's
``retire_ki`` proposals read the same verdicts (:func:`load_run_credit`,
:func:`kitune.service.workflows.proposals.propose`).

Runs are keyed by an id (e.g. ``<loop run>:it3:validation``): recording a run id a second time
changes nothing, so a resumed loop never double-counts. The ledger is one JSON file written
atomically (temporary file + ``os.replace``) after every recorded run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from kitune.errors import DocumentNotFoundError
from kitune.evaluation.failures import is_correct

if TYPE_CHECKING:
    from kitune.evaluation.metrics import Trace
    from kitune.retrieval.base import Store

__all__ = [
    "DEMOTE_FACTOR",
    "RETIRE_AT_HARMFUL",
    "CreditLedger",
    "CreditVerdict",
    "KICredit",
    "ShownEpisode",
    "credit_verdict",
    "demote_ranked",
    "episodes_from_traces",
    "load_run_credit",
    "rank_factor",
    "retire_kis",
]

CreditVerdict = Literal["keep", "demote", "retire"]
DEMOTE_FACTOR = 0.5
"""A demoted KI's ranking score is multiplied by this."""
RETIRE_AT_HARMFUL = 2
"""A KI blamed for this many right → wrong flips is retired."""
_ORDER: dict[str, int] = {"retire": 0, "demote": 1, "keep": 2}

T = TypeVar("T")


@dataclass(frozen=True)
class ShownEpisode:
    """One evaluated question and the KIs the agent was shown."""

    query_id: str
    correct: bool | None
    """Right / wrong; None when the episode failed or was not graded (not counted)."""
    ki_ids: tuple[str, ...]
    """KI ids its look-ups returned (any order; duplicates count once)."""


def episodes_from_traces(traces: Sequence[Trace], shown: Mapping[str, Sequence[str]]) -> list[ShownEpisode]:
    """Pair traces with the KI ids shown (``Evaluation.retrieved``; a missing id: none shown).

    Correctness is :func:`kitune.evaluation.failures.is_correct`; failed traces and grader errors
    get ``correct=None``.
    """
    out: list[ShownEpisode] = []
    for t in traces:
        counted = t.status != "failed" and t.judge_status != "grader_error"
        out.append(
            ShownEpisode(t.query_id, is_correct(t) if counted else None, tuple(shown.get(t.query_id, ())))
        )
    return out


@dataclass(frozen=True)
class KICredit:
    """The counters of one KI (see the module docstring)."""

    ki_id: str
    shown_right: int = 0
    shown_wrong: int = 0
    harmful: int = 0
    harmful_in: tuple[str, ...] = ()
    """``<run id>:<query id>`` of each flip it was blamed for, oldest first."""
    helpful: int = 0
    helpful_in: tuple[str, ...] = ()
    """``<run id>:<query id>`` of each wrong → right flip it was credited with, oldest first."""

    def __add__(self, other: KICredit) -> KICredit:
        """The counters of one KI summed over two ledgers (ids must match)."""
        if other.ki_id != self.ki_id:
            raise ValueError(f"cannot add the credit of {other.ki_id!r} to {self.ki_id!r}")
        return KICredit(
            self.ki_id,
            self.shown_right + other.shown_right,
            self.shown_wrong + other.shown_wrong,
            self.harmful + other.harmful,
            self.harmful_in + other.harmful_in,
            self.helpful + other.helpful,
            self.helpful_in + other.helpful_in,
        )


def credit_verdict(credit: KICredit) -> CreditVerdict:
    """The documented rule: only while harmful > helpful; retire at harmful ≥ 2, else demote if more wrong."""
    if credit.harmful <= credit.helpful:
        return "keep"
    if credit.harmful >= RETIRE_AT_HARMFUL:
        return "retire"
    if credit.shown_wrong > credit.shown_right:
        return "demote"
    return "keep"


def rank_factor(verdict: CreditVerdict) -> float:
    """Score multiplier of a verdict: keep 1.0, demote :data:`DEMOTE_FACTOR`, retire 0.0 (dropped)."""
    return {"keep": 1.0, "demote": DEMOTE_FACTOR, "retire": 0.0}[verdict]


def demote_ranked(
    items: Sequence[T],
    penalties: Mapping[str, float],
    *,
    id_of: Callable[[T], str],
    score_of: Callable[[T], float] | None = None,
) -> list[T]:
    """Re-rank a best-first list with the credit penalties (for ``get_context``'s KIs).

    Args:
        items: best first (e.g. ``ContextResponse.kis``).
        penalties: KI id → factor (:meth:`CreditLedger.penalties`); ids not in it keep 1.0.
        id_of: item → KI id.
        score_of: item → score, ≥ 0, higher is better; None: ``1 / position`` (1-based).

    Returns:
        The items sorted by ``score × factor``, best first; ties keep their input order; items
        with factor 0 (retired) are left out. The items themselves are not changed.

    Raises:
        ValueError: a negative score (a factor < 1 would raise it instead of lowering it).
    """
    scored: list[tuple[float, int, T]] = []
    for i, item in enumerate(items):
        score = score_of(item) if score_of is not None else 1.0 / (i + 1)
        if score < 0:
            raise ValueError(f"score {score} of {id_of(item)!r} is negative: demotion needs scores ≥ 0")
        factor = penalties.get(id_of(item), 1.0)
        if factor > 0:
            scored.append((score * factor, i, item))
    scored.sort(key=lambda s: (-s[0], s[1]))
    return [item for _, _, item in scored]


def retire_kis(store: Store, ki_ids: Sequence[str]) -> int:
    """Set status ``expired`` on each KI (read, copy with the new status, upsert; never deleted).

    Unknown ids and KIs already expired are skipped. Returns how many KIs changed status. Note:
    re-extracting a KI's unchanged document re-sights it (``mark_seen`` → ``active``); call this
    again after extraction (it is idempotent), and rank with :func:`demote_ranked`, which drops
    retired KIs whatever their stored status.
    """
    changed = []
    for ki_id in dict.fromkeys(ki_ids):
        try:
            ki = store.get(ki_id)
        except DocumentNotFoundError:
            continue
        if ki.payload.status != "expired":
            changed.append(
                ki.model_copy(update={"payload": ki.payload.model_copy(update={"status": "expired"})})
            )
    if changed:
        store.upsert(changed)
    return len(changed)


class CreditLedger:
    """Per-KI credit across runs, persisted as JSON (see the module docstring).

    Args:
        path: the JSON file, read when it exists and written after each recorded run
            (None: in memory only).

    Raises:
        ValueError: the file exists but is not a credit ledger (names the file).
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.runs: list[dict[str, Any]] = []
        self.questions: dict[str, dict[str, Any]] = {}
        self.kis: dict[str, dict[str, Any]] = {}
        self.retired: list[str] = []
        if path is not None and path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                self.runs, self.questions = list(data["runs"]), dict(data["questions"])
                self.kis, self.retired = dict(data["kis"]), list(data.get("retired", []))
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(
                    f"{path} is not a KI credit ledger ({e}): move it away to start afresh"
                ) from e

    @property
    def run_ids(self) -> list[str]:
        """Recorded run ids, oldest first."""
        return [r["id"] for r in self.runs]

    def record_run(self, run_id: str, episodes: Sequence[ShownEpisode]) -> bool:
        """Add one run's episodes (a no-op returning False when ``run_id`` was recorded before).

        Raises:
            ValueError: ``run_id`` is blank, or a query id occurs twice in ``episodes``.
        """
        if not run_id.strip():
            raise ValueError("run_id is blank: key each run by a stable id (e.g. '<run>:it0:tune')")
        if run_id in self.run_ids:
            return False
        seen = [e.query_id for e in episodes]
        if len(set(seen)) != len(seen):
            raise ValueError(f"run {run_id!r} holds a query id twice: one episode per question and run")
        counted = 0
        for ep in episodes:
            if ep.correct is None:
                continue
            counted += 1
            ids = list(dict.fromkeys(ep.ki_ids))
            for ki_id in ids:
                c = self.kis.setdefault(
                    ki_id,
                    {
                        "shown_right": 0,
                        "shown_wrong": 0,
                        "harmful": 0,
                        "harmful_in": [],
                        "helpful": 0,
                        "helpful_in": [],
                    },
                )
                c["shown_right" if ep.correct else "shown_wrong"] += 1
            prev = self.questions.get(ep.query_id)
            if prev is not None and bool(prev["correct"]) != ep.correct:
                flip = "harmful" if prev["correct"] else "helpful"  # right → wrong / wrong → right
                for ki_id in (k for k in ids if k not in set(prev["shown"])):
                    c = self.kis[ki_id]
                    c[flip] = c.get(flip, 0) + 1
                    c.setdefault(f"{flip}_in", []).append(f"{run_id}:{ep.query_id}")
            self.questions[ep.query_id] = {"run": run_id, "correct": ep.correct, "shown": ids}
        self.runs.append({"id": run_id, "episodes": len(episodes), "counted": counted})
        self.save()
        return True

    def credit(self, ki_id: str) -> KICredit:
        """The counters of one KI (all zero when never shown)."""
        c = self.kis.get(ki_id)
        if c is None:
            return KICredit(ki_id)
        return KICredit(
            ki_id,
            c["shown_right"],
            c["shown_wrong"],
            c["harmful"],
            tuple(c["harmful_in"]),
            int(c.get("helpful", 0)),  # ledgers written before the helpful counter have none
            tuple(c.get("helpful_in", ())),
        )

    def verdicts(self) -> dict[str, CreditVerdict]:
        """KI id → verdict, for every KI shown at least once."""
        return {k: credit_verdict(self.credit(k)) for k in self.kis}

    def penalties(self) -> dict[str, float]:
        """KI id → rank factor of demoted (0.5) and retired (0.0) KIs only (for :func:`demote_ranked`)."""
        return {k: rank_factor(v) for k, v in self.verdicts().items() if v != "keep"}

    def to_retire(self) -> list[str]:
        """KIs whose verdict is ``retire`` and that :meth:`mark_retired` has not recorded, sorted."""
        return sorted(k for k, v in self.verdicts().items() if v == "retire" and k not in self.retired)

    def mark_retired(self, ki_ids: Sequence[str]) -> None:
        """Record that ``ki_ids`` were retired in the store (saved)."""
        self.retired.extend(k for k in dict.fromkeys(ki_ids) if k not in self.retired)
        self.save()

    def summary(self) -> dict[str, int]:
        """Counts: runs, KIs tracked, with a harmful / helpful record, demoted, retire verdicts, retired."""
        v = list(self.verdicts().values())
        return {
            "runs": len(self.runs),
            "kis": len(self.kis),
            "harmful": sum(c["harmful"] > 0 for c in self.kis.values()),
            "helpful": sum(c.get("helpful", 0) > 0 for c in self.kis.values()),
            "demoted": v.count("demote"),
            "retire": v.count("retire"),
            "retired": len(self.retired),
        }

    def to_metrics(self) -> dict[str, float]:
        """:meth:`summary` as ``credit_*`` floats for tracking."""
        return {f"credit_{k}": float(n) for k, n in self.summary().items()}

    def to_markdown(self, limit: int = 20) -> str:
        """The KIs with a harmful record (retire, then demote, then keep; most harmful first).

        A summary line, then a Markdown table; with no harmful KI, the line "no KI has a harmful
        record" instead of the table.
        """
        rows = sorted(
            (self.credit(k) for k, c in self.kis.items() if c["harmful"] > 0),
            key=lambda c: (_ORDER[credit_verdict(c)], -c.harmful, c.ki_id),
        )
        s = self.summary()
        lines = [
            f"{s['kis']} KIs credited over {s['runs']} runs: {s['harmful']} with a harmful record, "
            f"{s['demoted']} demoted, {s['retire']} to retire ({s['retired']} retired).",
        ]
        if not rows:  # no empty table header
            return "\n".join([*lines, "no KI has a harmful record"]) + "\n"
        lines += [
            "",
            "| KI | shown right | shown wrong | harmful | helpful | verdict | flipped (run:question) |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in rows[:limit]:
            cells = (
                c.ki_id,
                c.shown_right,
                c.shown_wrong,
                c.harmful,
                c.helpful,
                credit_verdict(c),
                ", ".join(c.harmful_in),
            )
            lines.append("| " + " | ".join(map(str, cells)) + " |")
        if len(rows) > limit:
            lines.append(f"| … {len(rows) - limit} more | | | | | | |")
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict: ``runs``, ``questions`` (last counted state), ``kis`` (counters), ``retired``."""
        return {
            "version": 1,
            "runs": self.runs,
            "questions": self.questions,
            "kis": self.kis,
            "retired": self.retired,
        }

    def save(self) -> None:
        """Write the ledger atomically (no-op without a path)."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump(self.to_dict(), fh, indent=1, ensure_ascii=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)


def load_run_credit(paths: Sequence[Path]) -> dict[str, KICredit]:
    """Every KI's credit summed over several loop runs' ledgers (``<workdir>/optimize/*/ki_credit.json``).

    KI ids are content-derived, so one KI can be credited by several runs; its counters add up
    (:meth:`KICredit.__add__`). A file that is not a credit ledger is skipped (logged by the caller
    when it cares), never fatal: the review queue must work without any loop run.

    Returns:
        KI id → summed :class:`KICredit`, sorted by id.
    """
    out: dict[str, KICredit] = {}
    for path in paths:
        try:
            ledger = CreditLedger(path)
        except ValueError:
            continue
        for ki_id in ledger.kis:
            c = ledger.credit(ki_id)
            out[ki_id] = out[ki_id] + c if ki_id in out else c
    return dict(sorted(out.items()))
