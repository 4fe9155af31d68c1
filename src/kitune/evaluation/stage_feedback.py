"""The extractor's reflection feedback: per document, the answer-bearing sentence its KIs missed.

GEPA's extractor metric scores one document at a time: :func:`document_coverage` checks the KIs
extracted from a document against every question whose gold documents
(:func:`~kitune.evaluation.stage_metrics.gold_documents`) include it, with the same rule as the
extractor's answer coverage (:func:`~kitune.evaluation.stage_metrics.ki_states_answer`: folded,
whole-word, in a KI's title, description or object; yes/no questions ignored). For each answer
the document states but no KI does, :func:`answer_sentences` names the sentence(s) holding it —
the feedback text tells the reflection model exactly which fact the instruction let slip. The
``out_of_budget`` route (:mod:`kitune.optimizers.routes`) reuses it for gold documents the agent
never surfaced.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kitune.evaluation.stage_metrics import gold_documents, is_yes_no, ki_states_answer
from kitune.text import contains_answer, fold_text

if TYPE_CHECKING:
    from kitune.data.loaders import Question
    from kitune.ki import KI
    from kitune.schema import Document

__all__ = ["AnswerMiss", "DocumentCoverage", "answer_sentences", "document_coverage"]

_BOUNDARY = re.compile(r"[.!?][\"')\]]*\s+|\n\s*")
_ABBREVIATIONS = frozenset("mr mrs ms dr st jr sr vs etc no inc ltd co mt ft gen col lt sgt prof".split())


def _sentences(text: str) -> list[str]:
    out: list[str] = []
    start = 0
    for m in _BOUNDARY.finditer(text):
        last = re.search(r"(\w+)\W*$", text[start : m.start() + 1])
        word = last.group(1) if last else ""
        if m.group(0)[0] == "." and (len(word) == 1 or word.lower() in _ABBREVIATIONS):
            continue  # an initial (J. K.), U.S. or an abbreviation, not a sentence end
        out.append(text[start : m.end()].strip())
        start = m.end()
    out.append(text[start:].strip())
    return [s for s in out if s]


def answer_sentences(text: str, golds: Iterable[str], *, max_sentences: int = 2) -> list[str]:
    """The sentences of ``text`` that contain a gold answer (folded, whole-word), in text order.

    Sentences end at ``.``/``!``/``?`` before whitespace or at a line break; an initial or a
    listed abbreviation (``Dr.``, ``St.``, ``U.S.``) does not end one. Returns at most
    ``max_sentences``, each folded (:func:`kitune.text.fold_text`) to one line.
    """
    wanted = list(golds)
    return [fold_text(s) for s in _sentences(text) if contains_answer(s, wanted)][:max_sentences]


@dataclass(frozen=True)
class AnswerMiss:
    """A gold document whose KIs do not state a question's answer although its text does."""

    docid: str
    query_id: str
    answer: str
    """The gold answer (aliases were checked too)."""
    sentences: tuple[str, ...]
    """The answer-bearing sentence(s) of the document."""

    def text(self, max_chars: int = 300) -> str:
        """One feedback line naming the missed sentence(s), each cut to ``max_chars``."""
        quoted = " ".join(f'"{s[:max_chars]}"' for s in self.sentences)
        return f"Document {self.docid}: no fact states {self.answer!r}; it is in {quoted}"


@dataclass(frozen=True)
class DocumentCoverage:
    """How one document's KIs cover the answers of the questions it is gold for."""

    docid: str
    covered: tuple[str, ...]
    """Query ids whose answer a KI of the document states."""
    missed: tuple[AnswerMiss, ...]
    """Answers the document states but no KI does (with their sentences)."""
    absent: tuple[str, ...]
    """Query ids whose answer the document's text does not state literally either."""

    @property
    def score(self) -> float:
        """Covered / (covered + missed), 0.0–1.0; 1.0 when nothing could be covered."""
        n = len(self.covered) + len(self.missed)
        return len(self.covered) / n if n else 1.0

    def feedback(self) -> str:
        """Reflection text: the missed sentences, or that every stated answer is covered."""
        if not self.missed:
            return f"Document {self.docid}: every answer it states is in a fact ({len(self.covered)})."
        return "\n".join(m.text() for m in self.missed)


def document_coverage(doc: Document, questions: Sequence[Question], kis: Sequence[KI]) -> DocumentCoverage:
    """Score one document's KIs against the questions whose gold documents include it.

    Args:
        doc: the document (``docid``, ``text``).
        questions: candidate questions; those not naming ``doc`` as a gold document, and yes/no
            questions, are ignored.
        kis: the KIs extracted from ``doc`` (e.g. with a candidate prompt).

    Returns:
        The :class:`DocumentCoverage`; deterministic, no LLM.
    """
    covered: list[str] = []
    missed: list[AnswerMiss] = []
    absent: list[str] = []
    for q in questions:
        if doc.docid not in gold_documents(q) or is_yes_no(q):
            continue
        if any(ki_states_answer(k, q.golds) for k in kis):
            covered.append(q.query_id)
            continue
        sentences = answer_sentences(doc.text, q.golds)
        if sentences:
            missed.append(AnswerMiss(doc.docid, q.query_id, q.answer, tuple(sentences)))
        else:
            absent.append(q.query_id)
    return DocumentCoverage(doc.docid, tuple(covered), tuple(missed), tuple(absent))
