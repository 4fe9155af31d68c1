"""Evaluation questions: the :class:`Question` record and how one JSON record becomes one.

A question record (a ``ground_truth.jsonl`` or ``questions.jsonl`` line, or one LoCoMo QA item
mapped by :mod:`kitune.data.locomo`) names its id (``query_id``/``qid``/``id``), its text
(``query``/``question``), its gold ``answer`` (a string, a number, or a list whose first entry is
the answer and the rest aliases) and optionally ``answer_aliases``/``aliases``,
``evidence_docids``, ``gold_docids``, ``dataset``, ``hops``, ``category``,
``evidence_turns``/``evidence_dia_ids`` and ``abstention``.

**Abstention questions.** A record with no answer is an error — except an *adversarial* one
(``"abstention": true``, ``category`` 5 or ``"adversarial"`` as in LoCoMo, or an
``adversarial_answer`` field): the data does not say, and the right response is to say so. It is
kept with ``abstention=True``, the gold answer :data:`~kitune.data.locomo.ABSTENTION_ANSWER` and
the aliases :data:`~kitune.data.locomo.ABSTENTION_ALIASES` (an answerless record may give its own
aliases). An adversarial record that does carry an ``answer`` (the tempting wrong one, as some
LoCoMo exports write it) is an abstention question all the same, exactly as
:mod:`kitune.data.locomo` reads the published file (issue 40: both layouts treat category 5 alike).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kitune.data.locomo import ABSTENTION_ALIASES, ABSTENTION_ANSWER
from kitune.errors import DataError

__all__ = ["Question", "first_field", "question_from_record"]


@dataclass(frozen=True)
class Question:
    """One evaluation question with its gold answer and gold documents."""

    query_id: str
    """Unique id within the dataset (a string, e.g. ``"43"``)."""
    query: str
    """The question text."""
    answer: str
    """The gold answer (non-empty)."""
    aliases: tuple[str, ...] = ()
    """Other accepted spellings of the answer."""
    evidence_docids: tuple[str, ...] = ()
    """Documents needed to answer (qrel_evidence), in file order."""
    gold_docids: tuple[str, ...] = ()
    """Documents that contain the answer (qrel_golds), in file order."""
    dataset: str = ""
    """Origin dataset, e.g. ``"musique"``."""
    hops: str = ""
    """Hop label as given, e.g. ``"2hop"``."""
    category: str = ""
    """Question category as given, e.g. ``"temporal"`` (LoCoMo: single-hop, multi-hop, temporal,
    open-domain, adversarial); empty when the dataset has none. Reports break accuracy down by it."""
    evidence_turns: tuple[str, ...] = ()
    """Ids of the dialogue turns holding the evidence (LoCoMo ``evidence_dia_ids``, e.g.
    ``("D1:3",)``: session 1, turn 3), in file order; empty for non-dialogue data."""
    abstention: bool = False
    """True when the data holds no answer and the correct response says so (LoCoMo category 5):
    ``answer`` is then an abstention (:data:`~kitune.data.locomo.ABSTENTION_ANSWER`)."""

    @property
    def golds(self) -> tuple[str, ...]:
        """The answer followed by its aliases (for EM/F1)."""
        return (self.answer, *self.aliases)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict with list-valued tuples (read back by :func:`question_from_record`)."""
        return {
            "query_id": self.query_id,
            "query": self.query,
            "answer": self.answer,
            "aliases": list(self.aliases),
            "evidence_docids": list(self.evidence_docids),
            "gold_docids": list(self.gold_docids),
            "dataset": self.dataset,
            "hops": self.hops,
            "category": self.category,
            "evidence_turns": list(self.evidence_turns),
            "abstention": self.abstention,
        }


def first_field(record: dict[str, Any], keys: tuple[str, ...]) -> Any:
    """The value of the first of ``keys`` present in ``record`` and not None (None when none is)."""
    for key in keys:
        if key in record and record[key] is not None:
            return record[key]
    return None


def _str_list(value: Any, path: Path, lineno: int, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(str(v) for v in value if v is not None and str(v) != "")
    raise DataError(f"{path}:{lineno}: {key} must be a list of strings", path=str(path), line=lineno)


def _is_adversarial(record: dict[str, Any]) -> bool:
    category = str(first_field(record, ("category", "question_category")) or "").strip().lower()
    return category in ("5", "adversarial") or "adversarial_answer" in record


def question_from_record(record: dict[str, Any], path: Path, lineno: int) -> Question:
    """Build a :class:`Question` from one record (shape in the module docstring).

    Args:
        record: the decoded JSON object.
        path: the file it came from (for error messages).
        lineno: its 1-based line (or item) number (for error messages).

    Returns:
        The question; an answerless adversarial record is an abstention question.

    Raises:
        DataError: no id, no answer (and not adversarial), or a list field that is not a list of
            strings; the message names the file and line.
    """
    qid = first_field(record, ("query_id", "qid", "id"))
    if qid is None or str(qid).strip() == "":
        raise DataError(f"{path}:{lineno}: question has no query_id/id", path=str(path), line=lineno)
    query = first_field(record, ("query", "question"))
    answer = record.get("answer")
    if isinstance(answer, list):  # some exports give a list of accepted answers
        answer, *rest = answer or [None]
        record = {**record, "answer_aliases": [*rest, *(record.get("answer_aliases") or [])]}
    aliases = _str_list(first_field(record, ("answer_aliases", "aliases")), path, lineno, "aliases")
    # An adversarial record is an abstention question whatever 'answer' it carries (some LoCoMo
    # exports put the tempting wrong answer there): the same rule as LoCoMo as published.
    abstention = bool(record.get("abstention")) or _is_adversarial(record)
    if abstention:
        given = answer is not None and str(answer).strip() != ""  # its aliases would be the wrong answer's
        answer, aliases = ABSTENTION_ANSWER, ABSTENTION_ALIASES if given else aliases or ABSTENTION_ALIASES
    elif answer is None or str(answer).strip() == "":
        if not abstention:
            raise DataError(
                f"{path}:{lineno}: question {qid!r} has no answer: every evaluation question needs a gold "
                "'answer' field (an adversarial question with no answer: give it \"abstention\": true or "
                "category 5)",
                path=str(path),
                line=lineno,
            )
    return Question(
        query_id=str(qid).strip(),
        query=str(query or ""),
        answer=str(answer),
        aliases=aliases,
        evidence_docids=_str_list(
            first_field(record, ("evidence_docids", "evidence_doc_ids")), path, lineno, "evidence"
        ),
        gold_docids=_str_list(
            first_field(record, ("gold_docids", "gold_doc_ids")), path, lineno, "gold_docids"
        ),
        dataset=str(record.get("dataset") or ""),
        hops=str(record.get("hops") or ""),
        category=str(first_field(record, ("category", "question_category")) or "").strip(),
        evidence_turns=_str_list(
            first_field(record, ("evidence_turns", "evidence_dia_ids", "evidence_turn_ids")),
            path,
            lineno,
            "evidence_turns",
        ),
        abstention=abstention,
    )
