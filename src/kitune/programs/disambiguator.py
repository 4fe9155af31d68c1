"""The disambiguator: one failed question → one disambiguation KI that tells two answers apart.

Input: the question, the gold answer, the agent's wrong prediction, the gold document's text and
id. Output: a KI (``payload.subtype="disambiguation"``, tagged ``disambiguation``) whose title
literally contains **both** the gold answer and the wrong prediction.

Guardrails, applied after generation (each rejection carries a reason):

* ``empty_prediction`` — the wrong prediction is blank (nothing to disambiguate against);
* ``same_answer`` — the prediction folds to the gold answer (nothing to tell apart);
* ``title_missing_gold`` / ``title_missing_prediction`` — the containment check, compared after
  :func:`kitune.text.fold_text` + ``casefold`` on both sides (so curly vs straight quotes and
  case never cause a rejection, but a paraphrase does);
* evidence: the model's span is looked up verbatim in the gold document (after the same folding,
  surrounding quotes and ellipses removed) and the stored span is cut from the original text.
  When it is not found, the first sentence of the document that contains the gold answer is used
  instead (``DisambiguationResult.evidence_source == "gold_sentence"``);
  ``evidence_not_in_document`` is the rejection when neither exists;
* ``invalid_ki: …`` — length or tag rules of :class:`kitune.ki.KI` are broken;
* ``lm_error: …`` — the LM call failed.

:func:`accept_if_retrieved` is the last gate: the KI is kept only if retrieval for the failing
question returns it in the top results.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dspy
from pydantic import ValidationError

from kitune.errors import DocumentNotFoundError
from kitune.ki import KI
from kitune.programs.instructions import resolve_instruction
from kitune.retrieval.base import Store
from kitune.text import find_span, fold_text

__all__ = [
    "Disambiguate",
    "DisambiguationResult",
    "Disambiguator",
    "accept_if_retrieved",
    "contains_folded",
]

PREDICATE = "distinguished_from"
"""Predicate of every disambiguation KI: subject = gold answer, object = wrong prediction."""


def contains_folded(haystack: str, needle: str) -> bool:
    """True when ``needle`` occurs in ``haystack`` after fold_text + casefold on both sides.

    A blank ``needle`` is never contained.
    """
    n = fold_text(needle).casefold()
    return bool(n) and n in fold_text(haystack).casefold()


def _strip_quote_marks(span: str) -> str:
    """Drop quotes and ellipses a model puts around a quoted span."""
    s = fold_text(span).strip()
    for _ in range(3):
        s = s.strip().strip('"').strip("'").strip()
        s = s.removeprefix("...").removesuffix("...")
    return s.strip()


_SENTENCE_RE = re.compile(r"[^.!?\n]+(?:[.!?]+|$)")


def _gold_sentence(document: str, gold_answer: str) -> tuple[int, int] | None:
    """``(start, end)`` of the first sentence of ``document`` containing ``gold_answer`` (folded)."""
    for m in _SENTENCE_RE.finditer(document):
        sentence = m.group(0).strip()
        if sentence and contains_folded(sentence, gold_answer):
            start = m.start() + (len(m.group(0)) - len(m.group(0).lstrip()))
            return start, start + len(sentence)
    return None


class Disambiguate(dspy.Signature):  # type: ignore[misc]
    """Write one fact that tells the correct answer from the wrong one (instructions replaced)."""

    question: str = dspy.InputField(desc="The question that was answered wrongly.")
    correct_answer: str = dspy.InputField(desc="The correct answer.")
    wrong_answer: str = dspy.InputField(desc="The wrong answer that was given.")
    document: str = dspy.InputField(desc="The source text that holds the correct answer.")
    title: str = dspy.OutputField(desc="One sentence (≤140 chars) containing both answers exactly as given.")
    description: str = dspy.OutputField(desc="2–3 sentences (≤350 chars) with the distinguishing evidence.")
    evidence: str = dspy.OutputField(desc="A span copied word for word from the source text.")


@dataclass(frozen=True)
class DisambiguationResult:
    """What :meth:`Disambiguator.disambiguate` returns: a KI or the reason there is none."""

    ki: KI | None
    """The disambiguation KI, or None when rejected."""
    rejected_reason: str | None
    """Why it was rejected (see the module docstring for the codes), None when accepted."""
    evidence_source: str | None = None
    """``"model"`` (the model's span was verbatim) or ``"gold_sentence"`` (fallback); None if rejected."""

    @property
    def accepted(self) -> bool:
        """True when a KI was produced."""
        return self.ki is not None


class Disambiguator(dspy.Module):  # type: ignore[misc]
    """Failure → disambiguation KI program. Its optimisable predictor is ``writer``.

    Args:
        instructions: starting instruction text; None loads the packaged ``disambiguator`` prompt.
        max_document_chars: the gold document is cut to this many characters in the prompt (the
            evidence check still uses the full text).
        confidence: the confidence (0–100) recorded on produced KIs.
        corpus: corpus name for the KI reference ``index://<corpus>``.
    """

    def __init__(
        self,
        instructions: str | None = None,
        *,
        max_document_chars: int = 12_000,
        confidence: int = 90,
        corpus: str = "corpus",
    ) -> None:
        super().__init__()
        instructions, self.prompt_version = resolve_instruction("disambiguator", instructions)
        self.writer = dspy.Predict(Disambiguate.with_instructions(instructions))
        self.max_document_chars = max_document_chars
        self.confidence = confidence
        self.corpus = corpus

    def forward(
        self, question: str, correct_answer: str, wrong_answer: str, document: str
    ) -> dspy.Prediction:
        """Run the LM once; returns ``title``, ``description`` and ``evidence`` (unchecked)."""
        return self.writer(
            question=question,
            correct_answer=correct_answer,
            wrong_answer=wrong_answer,
            document=document[: self.max_document_chars],
        )

    def disambiguate(
        self,
        question: str,
        gold_answer: str,
        wrong_prediction: str,
        gold_document: str,
        gold_docid: str,
        *,
        lm: Any = None,
    ) -> DisambiguationResult:
        """Write and check one disambiguation KI; never raises for model or LM failures.

        Args:
            question: the failing question.
            gold_answer: the correct answer.
            wrong_prediction: what the agent answered.
            gold_document: full text of the document holding the gold answer.
            gold_docid: its id (becomes the KI's ``doc:`` tag and evidence doc id).
            lm: a ``dspy.LM`` for this call (None: the predictor's or the context's LM).

        Returns:
            The KI, or ``ki=None`` with the rejection reason.
        """
        if not wrong_prediction or not fold_text(wrong_prediction):
            return DisambiguationResult(None, "empty_prediction: the wrong prediction is blank")
        if not gold_answer or not fold_text(gold_answer):
            return DisambiguationResult(None, "empty_gold: the gold answer is blank")
        if fold_text(gold_answer).casefold() == fold_text(wrong_prediction).casefold():
            return DisambiguationResult(None, "same_answer: the prediction equals the gold answer")
        try:
            if lm is not None:
                with dspy.context(lm=lm):
                    pred = self(question, gold_answer, wrong_prediction, gold_document)
            else:
                pred = self(question, gold_answer, wrong_prediction, gold_document)
        except Exception as e:  # a failed call is a rejection, recorded with its cause
            return DisambiguationResult(None, f"lm_error: {type(e).__name__}: {e}"[:500])
        title = " ".join(str(pred.title or "").split())
        description = " ".join(str(pred.description or "").split())
        evidence = str(pred.evidence or "").strip()
        if not contains_folded(title, gold_answer):
            return DisambiguationResult(None, f"title_missing_gold: {gold_answer!r} not in title {title!r}")
        if not contains_folded(title, wrong_prediction):
            return DisambiguationResult(
                None, f"title_missing_prediction: {wrong_prediction!r} not in title {title!r}"
            )
        span = find_span(gold_document, _strip_quote_marks(evidence))
        source = "model"
        if span is None:
            span, source = _gold_sentence(gold_document, gold_answer), "gold_sentence"
        if span is None:
            return DisambiguationResult(
                None, "evidence_not_in_document: the evidence span is not verbatim and no sentence "
                "of the document contains the gold answer"
            )
        try:
            ki = KI.from_fact(
                docid=gold_docid,
                title=title,
                description=description,
                subject=gold_answer.strip(),
                predicate=PREDICATE,
                obj=wrong_prediction.strip(),
                evidence=[gold_document[span[0] : span[1]]],
                confidence=self.confidence,
                tags=["disambiguation"],
                corpus=self.corpus,
                subtype="disambiguation",
                prompt_version=self.prompt_version,
            )
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()
            )
            return DisambiguationResult(None, f"invalid_ki: {problems}")
        return DisambiguationResult(ki, None, evidence_source=source)


def accept_if_retrieved(
    ki: KI,
    question: str,
    store: Store,
    context_fn: Callable[[str], Sequence[str]],
    top_k: int = 10,
) -> bool:
    """Upsert ``ki`` and keep it only if retrieval for ``question`` returns it in the top ``top_k``.

    Args:
        ki: the disambiguation KI.
        question: the failing question.
        store: the KI store to write to.
        context_fn: question → KI ids best first, as the agent's ``get_context`` would return
            them (see ``kitune.service.context.context_ids``).
        top_k: how many of the first ids count, ≥ 1.

    Returns:
        True when the KI stays in the store; False when it was removed again (not retrieved,
        or the write failed). A KI with the same id that was stored before is restored.

    Raises:
        ValueError: ``top_k`` < 1.
    """
    if top_k < 1:
        raise ValueError(f"top_k={top_k}: use 1 or more")
    try:
        previous: KI | None = store.get(ki.id)
    except DocumentNotFoundError:
        previous = None

    def undo() -> None:
        if previous is None:
            store.delete([ki.id])
        else:
            store.upsert([previous])

    result = store.upsert([ki])
    if not result.ok:
        return False
    try:
        ids = list(context_fn(question))[:top_k]
    except Exception:
        undo()
        raise
    if ki.id in ids:
        return True
    undo()
    return False
