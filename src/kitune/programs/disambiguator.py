"""The disambiguator: one failed question → one disambiguation KI that tells two answers apart.

Input: the question, the gold answer, the agent's wrong prediction, the gold document's text and
id. Output: a KI (``payload.subtype="disambiguation"``, tagged ``disambiguation``) whose title
literally contains **both** the gold answer and the wrong prediction.

Guardrails, applied after generation (each rejection carries a reason):

* ``empty_prediction`` — the wrong prediction is blank (nothing to disambiguate against): a
  rejected candidate like any other (callers count it; they should not filter it out first);
* ``same_answer`` — the prediction folds to the gold answer (nothing to tell apart);
* title containment — the title must contain both answers, compared after
  :func:`kitune.text.fold_text` + ``casefold`` on both sides (so curly vs straight quotes and
  case never cause a failure, but a paraphrase does). A title that fails
  (``title_missing_gold`` / ``title_missing_prediction``) gets **one regeneration** that is told
  why (the ``previous_problem`` input); when that title fails too, the KI gets a template title
  that names both, ``"<gold> (not <wrong>) — <the model's title>"`` cut to 140 characters.
  Either way it is counted on the result (``regenerations``, ``title_source``,
  ``title_failures``), so a weak writer shows up in the numbers instead of as silent losses;
* evidence: the model's span is looked up verbatim in the gold document (after the same folding,
  surrounding quotes and ellipses removed) and the stored span is cut from the original text.
  When it is not found, the first sentence of the document that contains the gold answer is used
  instead (``DisambiguationResult.evidence_source == "gold_sentence"``);
  ``evidence_not_in_document`` is the rejection when neither exists;
* ``invalid_ki: …`` — length or tag rules of :class:`kitune.ki.KI` are broken;
* ``lm_error: …`` — the LM call failed, or its reply could not be read into the three fields
  (read leniently by kitune's chat adapter, :func:`kitune.lm.parse_leniently`, with DSPy's usual
  second, JSON-formatted call when the first reply is unreadable).

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
from kitune.ki import KI, TITLE_MAX_CHARS
from kitune.lm import KituneChatAdapter
from kitune.programs.guardrails import fit_description
from kitune.programs.instructions import resolve_instruction
from kitune.programs.predict import predict_typed
from kitune.retrieval.base import Store
from kitune.text import find_span, fold_text

__all__ = [
    "Disambiguate",
    "DisambiguationResult",
    "Disambiguator",
    "accept_if_retrieved",
    "contains_folded",
    "template_title",
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


def _fields(pred: Any) -> tuple[str, str, str]:
    title = " ".join(str(getattr(pred, "title", "") or "").split())
    description = " ".join(str(getattr(pred, "description", "") or "").split())
    return title, description, str(getattr(pred, "evidence", "") or "").strip()


def _title_problem(title: str, gold: str, wrong: str) -> str | None:
    """The title guardrail: None when ``title`` holds both answers, else the rejection reason."""
    if not contains_folded(title, gold):
        return f"title_missing_gold: {gold!r} not in title {title!r}"
    if not contains_folded(title, wrong):
        return f"title_missing_prediction: {wrong!r} not in title {title!r}"
    return None


def _problem_text(problem: str) -> str:
    code, _, detail = problem.partition(": ")
    which = "the correct answer" if code == "title_missing_gold" else "the wrong answer"
    return (
        f"The title was rejected because it does not contain {which} spelled exactly as given "
        f"({detail}). Write a title that contains both answers exactly as given."
    )


TEMPLATE_DASH = " — "


def template_title(gold: str, wrong: str, rest: str, *, max_chars: int = 140) -> str:
    """``"<gold> (not <wrong>) — <rest>"`` cut at a word boundary to ``max_chars`` (``…`` marks a cut).

    ``rest`` (the model's last title or description) is left out when empty or when nothing of
    it fits; the head naming both answers is never cut (an over-long head fails KI validation).
    """
    head = f"{gold.strip()} (not {wrong.strip()})"
    rest = " ".join(rest.split())
    if not rest:
        return head
    full = f"{head}{TEMPLATE_DASH}{rest}"
    if len(full) <= max_chars:
        return full
    room = max_chars - len(head) - len(TEMPLATE_DASH) - 1
    cut = rest[: max(room, 0) + 1].rsplit(" ", 1)[0].rstrip(" ,;:") if room > 0 else ""
    return f"{head}{TEMPLATE_DASH}{cut}…" if cut else head


def _chat_adapter(_lm: Any) -> dspy.Adapter:
    """DSPy's default adapter for this program (ChatAdapter, JSON fallback on), read leniently."""
    return KituneChatAdapter()


class Disambiguate(dspy.Signature):  # type: ignore[misc]
    """Write one fact that tells the correct answer from the wrong one (instructions replaced)."""

    question: str = dspy.InputField(desc="The question that was answered wrongly.")
    correct_answer: str = dspy.InputField(desc="The correct answer.")
    wrong_answer: str = dspy.InputField(desc="The wrong answer that was given.")
    document: str = dspy.InputField(desc="The source text that holds the correct answer.")
    previous_problem: str = dspy.InputField(
        desc="Empty on the first attempt; otherwise why the previous title was rejected (fix exactly that)."
    )
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
    regenerations: int = 0
    """LM calls made again because the title failed the guardrail (0 or 1)."""
    title_source: str | None = None
    """``"model"`` (first title passed), ``"regenerated"`` (the retry's title passed),
    ``"template"`` (both failed: ``"<gold> (not <wrong>) — …"``); None when no title was judged."""
    title_failures: tuple[str, ...] = ()
    """Why each rejected title failed (``"title_missing_gold: …"`` …), in call order."""
    description_trimmed: bool = False
    """The writer's description was cut to whole sentences that fit 350 characters."""

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
        self,
        question: str,
        correct_answer: str,
        wrong_answer: str,
        document: str,
        previous_problem: str = "",
    ) -> dspy.Prediction:
        """Run the LM once; returns ``title``, ``description`` and ``evidence`` (unchecked).

        ``previous_problem`` is empty on a first attempt; on a regeneration it says why the last
        title was rejected (and ``cache=False`` makes the call fresh). The adapter is the DSPy
        context's, else kitune's chat adapter (the request DSPy's default adapter sends).

        Raises:
            kitune.lm.ReplyParseError: the reply could not be read into the three fields.
            Whatever the LM raises.
        """
        config: dict[str, Any] = {"cache": False, "rollout_id": 1} if previous_problem else {}
        reply = predict_typed(
            self.writer,
            adapter=_chat_adapter,
            config=config,
            question=question,
            correct_answer=correct_answer,
            wrong_answer=wrong_answer,
            document=document[: self.max_document_chars],
            previous_problem=previous_problem,
        )
        if reply.prediction is None:
            assert reply.error is not None
            raise reply.error
        return reply.prediction

    def _call(self, lm: Any, *args: str) -> dspy.Prediction:
        if lm is not None:
            with dspy.context(lm=lm):
                return self(*args)
        return self(*args)

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
            pred = self._call(lm, question, gold_answer, wrong_prediction, gold_document)
        except Exception as e:  # a failed call is a rejection, recorded with its cause
            return DisambiguationResult(None, f"lm_error: {type(e).__name__}: {e}"[:500])
        title, description, evidence = _fields(pred)
        failures: list[str] = []
        regenerations = 0
        title_source = "model"
        problem = _title_problem(title, gold_answer, wrong_prediction)
        if problem is not None:
            failures.append(problem)
            regenerations = 1
            try:
                retry = self._call(
                    lm, question, gold_answer, wrong_prediction, gold_document, _problem_text(problem)
                )
            except Exception:  # the retry failing falls through to the template title
                retry = None
            if retry is not None:
                r_title, r_description, r_evidence = _fields(retry)
                retry_problem = _title_problem(r_title, gold_answer, wrong_prediction)
                if retry_problem is None:
                    title, description, evidence = r_title, r_description, r_evidence
                    title_source = "regenerated"
                else:
                    failures.append(retry_problem)
                    title = r_title or title
                    description = r_description or description
                    evidence = r_evidence or evidence
            if title_source == "model":
                title = template_title(gold_answer, wrong_prediction, title or description)
                title_source = "template"
        if len(title.strip()) > TITLE_MAX_CHARS:  # names both answers but is too long for a KI title
            failures.append(f"title_too_long: {len(title.strip())} > {TITLE_MAX_CHARS} characters")
            title = template_title(gold_answer, wrong_prediction, title)
            title_source = "template"
        counts: dict[str, Any] = {
            "regenerations": regenerations,
            "title_source": title_source,
            "title_failures": tuple(failures),
        }
        span = find_span(gold_document, _strip_quote_marks(evidence))
        source = "model"
        if span is None:
            span, source = _gold_sentence(gold_document, gold_answer), "gold_sentence"
        if span is None:
            return DisambiguationResult(
                None,
                "evidence_not_in_document: the evidence span is not verbatim and no sentence "
                "of the document contains the gold answer",
                **counts,
            )
        # the writer's description is cut to whole sentences that fit (350 chars), or replaced by
        # the title when it gave none: small models write long or empty descriptions
        description, trimmed = fit_description(description or "")
        counts["description_trimmed"] = trimmed
        if not description:
            description = title
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
            return DisambiguationResult(None, f"invalid_ki: {problems}", **counts)
        return DisambiguationResult(ki, None, evidence_source=source, **counts)


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
            them (see ``kitune.service.serving.context.context_ids``).
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
