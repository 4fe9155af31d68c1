"""The failure ledger: one entry per question that follows it across the loop's iterations.

Per question it keeps the outcome of every measurement (iteration, split, correct, failure kind
from :func:`kitune.evaluation.failures.classify_failure`, answer, input tokens) and every
feedback attempt (iteration, the wrong answer it targeted, the disambiguation KI ids written
or why none was), and resolves each attempt at the next measurement: was one of its KIs
retrieved for the question (``retrieved_next``), and did the question flip to correct
(``fixed_next``)?

The loop uses it to route work: a question that is correct now is never sent to the
disambiguator; a question whose feedback did not fix it gets another attempt only for a *new*
wrong answer (the published remedy for a second wrong twin), up to ``max_attempts``. An attempt
whose KI the feedback gate rejected is marked (:meth:`FailureLedger.note_gate`: the reason and
the questions it broke) and counted (``gate_rejected``).

Stored as one JSON file (``<state>/failure_ledger.json``, written atomically) and logged as an
artifact of every iteration run.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kitune.evaluation.failures import FAILURE_KINDS, classify_failure, is_correct
from kitune.text import normalize_answer

if TYPE_CHECKING:
    from kitune.evaluation.trace import Trace

__all__ = ["FailureLedger"]


class FailureLedger:
    """Per-question outcomes and feedback attempts across iterations (see the module docstring).

    Args:
        path: the JSON file it is read from and saved to (None: in memory only).
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        if path is not None and path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            self.entries = dict(data.get("questions", {}))

    # -- recording ------------------------------------------------------------------------------
    def record(
        self,
        iteration: int,
        split: str,
        traces: Sequence[Trace],
        *,
        gold_docids: Mapping[str, Sequence[str]] | None = None,
        retrieved: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """Record one measurement of ``traces`` (the start-of-iteration run of ``split``).

        Pending feedback attempts of earlier iterations are resolved against it.

        Args:
            iteration: 0-based loop iteration.
            split: ``tune`` or ``validation``.
            traces: the run's traces.
            gold_docids: query id → answer-bearing documents (for the failure kind).
            retrieved: query id → KI ids the agent's look-ups returned in this run.
        """
        for t in traces:
            e = self.entries.setdefault(
                t.query_id,
                {
                    "question": t.question,
                    "gold_answer": t.gold_answer,
                    "split": split,
                    "outcomes": {},
                    "feedback": [],
                },
            )
            kind = classify_failure(t, (gold_docids or {}).get(t.query_id))
            outcome = {
                "split": split,
                "correct": None if t.status == "failed" else is_correct(t),
                "kind": kind,
                "answer": t.exact_answer,
                "input_tokens": t.input_tokens + t.tool_input_tokens,
                "status": t.status,
            }
            e["outcomes"][str(iteration)] = outcome
            seen = set((retrieved or {}).get(t.query_id, ()))
            for fb in e["feedback"]:
                if fb["iteration"] < iteration and fb.get("fixed_next") is None and fb["ki_ids"]:
                    fb["retrieved_next"] = bool(seen & set(fb["ki_ids"])) if retrieved is not None else None
                    fb["fixed_next"] = outcome["correct"]

    def note_feedback(
        self, iteration: int, query_id: str, prediction: str, ki_ids: Sequence[str], reason: str | None = None
    ) -> None:
        """Record one feedback attempt: the KIs written for ``prediction`` (none: ``reason``)."""
        e = self.entries.setdefault(query_id, {"outcomes": {}, "feedback": []})
        e["feedback"].append(
            {
                "iteration": iteration,
                "prediction": prediction,
                "ki_ids": list(ki_ids),
                "rejected": reason,
                "retrieved_next": None,
                "fixed_next": None,
            }
        )

    def note_gate(self, iteration: int, rejected: Mapping[str, tuple[str, Sequence[str]]]) -> int:
        """Mark this iteration's feedback attempts whose KI the gate rejected.

        Args:
            iteration: the iteration the KIs were written in.
            rejected: KI id → ``(reason, query ids it broke or left unverified)``
                (:class:`~kitune.optimizers.gate.GateReport` ``.rejected``).

        Returns:
            How many attempts were marked (``gate`` = reason, ``gate_broke`` = the query ids).
        """
        marked = 0
        for e in self.entries.values():
            for fb in e["feedback"]:
                if fb["iteration"] != iteration:
                    continue
                hit = next((k for k in fb["ki_ids"] if k in rejected), None)
                if hit is not None:
                    fb["gate"], broke = rejected[hit]
                    fb["gate_broke"] = list(broke)
                    marked += 1
        return marked

    # -- routing --------------------------------------------------------------------------------
    def attempts(self, query_id: str) -> int:
        """Feedback attempts made for the question so far."""
        return len(self.entries.get(query_id, {}).get("feedback", []))

    def should_attempt(self, query_id: str, prediction: str, max_attempts: int) -> tuple[bool, str]:
        """Whether to send this failure to the disambiguator, and why not.

        No when ``max_attempts`` attempts were made, or when an earlier attempt already targeted
        the same wrong answer (after answer normalisation): writing the same KI again cannot
        change anything.
        """
        fbs = self.entries.get(query_id, {}).get("feedback", [])
        if len(fbs) >= max_attempts:
            return False, "max_attempts"
        target = normalize_answer(prediction)
        if any(normalize_answer(fb["prediction"]) == target for fb in fbs):
            return False, "same_wrong_answer"
        return True, ""

    # -- reading --------------------------------------------------------------------------------
    def outcome(self, query_id: str, iteration: int) -> dict[str, Any] | None:
        """The question's recorded outcome at ``iteration`` (None if not measured then)."""
        out = self.entries.get(query_id, {}).get("outcomes", {}).get(str(iteration))
        return dict(out) if out is not None else None

    def flips(self, iteration: int, split: str) -> dict[str, list[str]]:
        """Questions of ``split`` that flipped between ``iteration − 1`` and ``iteration``.

        Returns:
            ``{"fixed": [...], "broken": [...]}`` (query ids, sorted); empty at iteration 0.
        """
        fixed: list[str] = []
        broken: list[str] = []
        for qid, e in self.entries.items():
            now = e["outcomes"].get(str(iteration))
            before = e["outcomes"].get(str(iteration - 1))
            if not now or not before or now["split"] != split:
                continue
            if now["correct"] is None or before["correct"] is None:
                continue
            if now["correct"] and not before["correct"]:
                fixed.append(qid)
            elif before["correct"] and not now["correct"]:
                broken.append(qid)
        return {"fixed": sorted(fixed), "broken": sorted(broken)}

    def kind_counts(self, iteration: int, split: str) -> dict[str, int]:
        """Failure kind → count among ``split``'s questions at ``iteration`` (every kind present)."""
        counts: Counter[str] = Counter()
        for e in self.entries.values():
            o = e["outcomes"].get(str(iteration))
            if o and o["split"] == split and o["kind"]:
                counts[o["kind"]] += 1
        return {k: counts.get(k, 0) for k in FAILURE_KINDS}

    def feedback_summary(self) -> dict[str, int]:
        """Counts over feedback attempts: attempts, with KIs, retrieved next, fixed next, gate rejected."""
        fbs = [fb for e in self.entries.values() for fb in e["feedback"]]
        return {
            "attempts": len(fbs),
            "with_kis": sum(bool(fb["ki_ids"]) for fb in fbs),
            "retrieved_next": sum(fb.get("retrieved_next") is True for fb in fbs),
            "fixed_next": sum(fb.get("fixed_next") is True for fb in fbs),
            "gate_rejected": sum(bool(fb.get("gate")) for fb in fbs),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (``{"questions": {query id: entry}}``)."""
        return {"questions": self.entries}

    def save(self) -> None:
        """Write the ledger atomically to ``path`` (no-op without a path)."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, self.path)

    def to_markdown(self) -> str:
        """One row per question: outcome per iteration (✓ / kind), feedback attempts and their fate."""
        iters = sorted({int(i) for e in self.entries.values() for i in e["outcomes"]})
        head = "| question | split | " + " | ".join(f"it {i}" for i in iters) + " | feedback |"
        lines = [head, "|" + "---|" * (len(iters) + 3)]
        for qid, e in sorted(self.entries.items()):
            cells = []
            for i in iters:
                o = e["outcomes"].get(str(i))
                cells.append("-" if o is None else ("✓" if o["correct"] else (o["kind"] or "?")))
            fb = "; ".join(
                f"it{f['iteration']}: {len(f['ki_ids'])} KI"
                + (f" ({f['rejected']})" if f.get("rejected") else "")
                + (
                    f", gate {f['gate']}: {', '.join(f.get('gate_broke', [])) or '-'}"
                    if f.get("gate")
                    else ""
                )
                + ("" if f.get("retrieved_next") is None else f", retrieved={f['retrieved_next']}")
                + ("" if f.get("fixed_next") is None else f", fixed={f['fixed_next']}")
                for f in e["feedback"]
            )
            lines.append(f"| {qid} | {e.get('split', '')} | " + " | ".join(cells) + f" | {fb or '-'} |")
        return "\n".join(lines) + "\n"
