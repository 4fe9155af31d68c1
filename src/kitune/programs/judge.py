"""The judge: a BrowseComp-style grader of an agent's response against the gold answer.

The grader's outputs are typed fields (``extracted_final_answer``, ``reasoning``,
``correct: bool``, ``confidence: int``), so the format the model is asked for comes from the
signature through the adapter, not from the instruction text. The verdict is read from the
model's reply by :func:`parse_grading`: either the whole reply is a JSON object with those keys,
or it is a report (or DSPy's field sections) of this shape::

    extracted_final_answer: <the final answer found in the response, or None>
    reasoning: <why it matches the gold answer or not>
    correct: yes|no
    confidence: <0–100>

The verdict is read **only** from the designated field — the whole-reply JSON object's
``correct`` key, or the anchored ``correct:`` text field (cue word + connector + value; the last
anchored verdict wins) — never from words or a quoted JSON object anywhere in the prose (case
J2), and both accept the same values. A grader failure — the LM raising after the allowed
attempts, or a report with no parsable verdict — is a :class:`JudgeVerdict` with
``status="grader_error"``: it is excluded from accuracy and counted, never scored as incorrect
(case J3). Exact match and token F1 live in :mod:`kitune.text` (case J4).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import dspy

from kitune.errors import LMError
from kitune.lm import repair_surrogates, strip_reasoning, unwrap_typed
from kitune.programs.instructions import resolve_instruction
from kitune.programs.predict import predict_typed
from kitune.programs.records import coerce_confidence
from kitune.recording import RecordingMissError

__all__ = [
    "GradeResponse",
    "Judge",
    "JudgeSummary",
    "JudgeVerdict",
    "judge_answer",
    "parse_anchored_verdict",
    "parse_grading",
    "summarize_verdicts",
    "verdict_from_fields",
]

JudgeStatus = Literal["graded", "grader_error"]


def parse_anchored_verdict(
    text: str,
    *,
    cues: Sequence[str] = ("correct",),
    values: Sequence[str] = ("yes", "no"),
    connectors: Sequence[str] = (":", "=", "is"),
) -> str | None:
    """Extract a verdict anchored on a cue word, a connector and an allowed value.

    A match is ``<cue> <connector> <value>`` (markdown ``**``, quotes or brackets around the
    value are tolerated, case-insensitive, whole words only). The **last** match wins, so a
    verdict the judge revises later in its text overrides an earlier one; a value that merely
    appears in the prose never counts, and neither does an echoed choice list (``yes|no``,
    ``yes/no``).

    Args:
        text: the judge's reply.
        cues: cue words, e.g. ``("grade", "verdict", "status")``.
        values: allowed verdict values, e.g. ``("A", "B")`` or ``("yes", "no")``.
        connectors: ``":"``, ``"="`` and/or words such as ``"is"``.

    Returns:
        The matched value spelled as in ``values``, or None when there is no anchored verdict.

    Examples:
        ``"The final grade is B."`` with cues ``("grade",)`` and values ``("A", "B")`` → ``"B"``;
        ``"I am unable to grade this."`` → None.
    """
    if not text:
        return None
    conn = "|".join(re.escape(c) if not c.isalpha() else rf"\b{re.escape(c)}\b" for c in connectors)
    cue = "|".join(re.escape(c) for c in cues)
    val = "|".join(re.escape(v) for v in sorted(values, key=len, reverse=True))
    pattern = re.compile(
        rf"\b(?:{cue})\b[*_]*\s*(?:{conn})\s*[*_\"'“‘\[(]*\s*({val})(?![\w-]|\s*[|/])",
        re.IGNORECASE,
    )
    matches = list(pattern.finditer(text))
    if not matches:
        return None
    found = matches[-1].group(1).casefold()
    return next(v for v in values if v.casefold() == found)


_FIELD_RE = {
    "extracted": re.compile(
        r"^[\s*_#-]*extracted[_ ]final[_ ]answer[*_]*\s*:\s*(.*)$", re.IGNORECASE | re.MULTILINE
    ),
    "confidence": re.compile(r"\bconfidence[*_]*\s*[:=]\s*[*_]*\s*(\d{1,3}(?:\.\d+)?)", re.IGNORECASE),
}


@dataclass(frozen=True)
class JudgeVerdict:
    """One graded (or failed-to-grade) response."""

    correct: bool | None
    """True/False when graded; None on a grader error."""
    confidence: int | None
    """The grader's confidence 0–100 (the one policy, see :mod:`kitune.programs.records`), or None
    when it gave none or an invalid one (``140``, ``"high"``: never clamped)."""
    extracted_answer: str | None
    """The final answer the grader extracted from the response (None if absent or ``None``)."""
    status: JudgeStatus
    """``graded`` or ``grader_error`` (excluded from accuracy, counted separately)."""
    error: str | None = None
    """Why grading failed (exception or ``no parsable verdict``), None when graded."""
    raw: str = ""
    """The grader's raw report, kept for debugging."""

    @property
    def is_graded(self) -> bool:
        """True when a verdict was obtained."""
        return self.status == "graded"


_JSON_BOOL = {"yes": "yes", "true": "yes", "no": "no", "false": "no"}
_VERDICT_VALUES = ("yes", "no", "true", "false")
_SECTION_RE = re.compile(r"\[\[ ## (extracted_final_answer|reasoning|correct|confidence) ## \]\][ \t]*\n?")


def _confidence(value: Any) -> int | None:
    """The one confidence policy (:func:`kitune.programs.records.coerce_confidence`).

    None when absent or invalid (``140``, ``"high"``): never clamped, never defaulted.
    """
    if value is None:
        return None
    try:
        return coerce_confidence(value)
    except ValueError:
        return None


_FENCE_RE = re.compile(r"\A```[\w-]*[ \t]*\n?")


def _whole_json(raw: str) -> dict[str, Any] | None:
    """The JSON object the whole reply is, or None when the reply is not one.

    The reply (after a ``<think>`` block and an opening code fence, if any) must *start* with
    ``{``; the object is decoded with :meth:`json.JSONDecoder.raw_decode`, so whatever follows it
    (a closing fence, prose, even prose with braces) is ignored, and an object quoted inside prose
    is never read.
    """
    text = strip_reasoning(raw)[0].strip()
    text = _FENCE_RE.sub("", text, count=1).lstrip()
    if not text.startswith("{"):
        return None
    try:
        obj, _end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        return None
    return repair_surrogates(obj) if isinstance(obj, dict) else None


def _verdict_value(value: Any) -> str | None:
    """``"yes"``/``"no"`` for a ``correct`` value, with the text path's vocabulary, else None.

    Booleans map directly; any other value is read exactly as the text field ``correct: <value>``
    is read (:func:`parse_anchored_verdict` with the same values and connectors), so ``"Yes."``,
    ``"**no**"``, ``"true"`` and ``"bool[False]"`` mean the same in a JSON reply as in a text one.
    """
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None or isinstance(value, (dict, list)):
        return None
    text = f"correct: {unwrap_typed(str(value))}"
    found = parse_anchored_verdict(text, cues=("correct",), values=_VERDICT_VALUES, connectors=(":", "="))
    return _JSON_BOOL[found] if found is not None else None


def _json_report(raw: str) -> tuple[str | None, str | None, int | None] | None:
    """Read a grading whose whole reply is a JSON object (``{"correct": "yes", ...}``).

    Returns:
        ``(verdict, extracted_answer, confidence)`` when the reply is a JSON object
        (:func:`_whole_json`); ``verdict`` is ``"yes"``/``"no"`` when its ``correct`` key (any
        case) holds a value of the text path's vocabulary (:func:`_verdict_value`), None when the
        key is absent or holds another value. None when the reply is not a JSON object.
    """
    obj = _whole_json(raw)
    if obj is None:
        return None
    fields = {str(k).strip().casefold(): v for k, v in obj.items()}
    verdict = _verdict_value(fields.get("correct"))
    answer = fields.get("extracted_final_answer", fields.get("extracted_answer"))
    return verdict, _answer(answer), _confidence(fields.get("confidence"))


def _answer(value: Any) -> str | None:
    """The extracted answer, or None when absent or written as none (``None``, ``n/a``, blank)."""
    if value is None or str(value).strip().casefold() in ("", "none", "n/a"):
        return None
    return str(value)


def _verdict(correct: bool | None, confidence: int | None, extracted: str | None, raw: str) -> JudgeVerdict:
    """``graded`` with ``correct``, or ``grader_error`` ("no parsable verdict") when it is None."""
    if correct is None:
        return JudgeVerdict(
            correct=None,
            confidence=confidence,
            extracted_answer=extracted,
            status="grader_error",
            error="no parsable verdict in the grader output",
            raw=raw,
        )
    return JudgeVerdict(
        correct=correct, confidence=confidence, extracted_answer=extracted, status="graded", raw=raw
    )


def parse_grading(raw: str) -> JudgeVerdict:
    """Parse a grader report into a verdict (never raises).

    Args:
        raw: the grader's report (see the module docstring for the format).

    Returns:
        ``status="graded"`` with ``correct`` read from the one designated field:

        * when the whole reply is a JSON object (optionally after a ``<think>`` block and inside
          a code fence; decoded with :meth:`json.JSONDecoder.raw_decode`, so prose after it is
          ignored), from its ``correct`` key;
        * otherwise from the anchored ``correct: <value>`` text field (the last one wins; a
          ``[[ ## correct ## ]]`` section reads the same). A JSON object quoted inside a text
          report is never read.

        Both paths accept the same values (``yes``/``no``/``true``/``false``, any case, with
        markdown, quotes or a full stop around them: ``"Yes."``; JSON booleans too).
        Type-annotated values are read bare: ``bool[False]`` is ``false``, ``int[90]`` is ``90``
        (:func:`kitune.lm.unwrap_typed`). Otherwise ``status="grader_error"`` with
        ``error="no parsable verdict in the grader output"`` and ``correct=None`` when that field
        is absent or holds another value.
    """
    as_json = _json_report(raw or "")
    if as_json is not None:
        verdict, extracted, confidence = as_json
    else:
        # A field-per-section reply ("[[ ## correct ## ]]" then the value on the next line) reads
        # as "correct: <value>"; type-annotated values ("bool[False]", "int[90]") as bare values.
        text = _SECTION_RE.sub(r"\1: ", unwrap_typed(raw or ""))
        found = parse_anchored_verdict(text, cues=("correct",), values=_VERDICT_VALUES, connectors=(":", "="))
        verdict = _JSON_BOOL[found] if found is not None else None
        extracted = None
        m = list(_FIELD_RE["extracted"].finditer(text))
        if m:
            value = m[-1].group(1).strip().strip("*_ ").strip()
            extracted = None if value.casefold() in ("", "none", "n/a") else value
        c = list(_FIELD_RE["confidence"].finditer(text))
        confidence = _confidence(c[-1].group(1)) if c else None
    return _verdict(None if verdict is None else verdict == "yes", confidence, extracted, raw or "")


class GradeResponse(dspy.Signature):  # type: ignore[misc]
    """Grade a response against the correct answer (instructions are replaced at construction)."""

    question: str = dspy.InputField(desc="The question that was asked.")
    response: str = dspy.InputField(desc="The response to grade.")
    correct_answer: str = dspy.InputField(desc="The correct answer, then any accepted aliases after ' | '.")
    extracted_final_answer: str = dspy.OutputField(
        desc="The final exact answer extracted from the response; 'None' if it gives no final answer."
    )
    reasoning: str = dspy.OutputField(
        desc="Why the extracted answer is or is not the correct answer (differences only; do not solve "
        "the question)."
    )
    correct: bool = dspy.OutputField(desc="True when the extracted answer matches the correct answer.")
    confidence: int = dspy.OutputField(desc="Your confidence in this grading, an integer 0-100.")


def verdict_from_fields(pred: Any, *, raw: str = "") -> JudgeVerdict:
    """The verdict from the grader's typed fields (the adapter has already read them).

    Args:
        pred: a prediction with ``correct`` (bool), ``confidence`` (int), ``extracted_final_answer``.
        raw: the grader's own reply, kept on the verdict.

    Returns:
        ``status="graded"`` with ``correct`` as typed, the confidence under the one policy (None
        when outside 0–100: never clamped) and the extracted answer (None when written as none);
        ``status="grader_error"`` when ``correct`` came back empty.
    """
    correct = getattr(pred, "correct", None)
    confidence = _confidence(getattr(pred, "confidence", None))
    extracted = _answer(getattr(pred, "extracted_final_answer", None))
    return _verdict(correct if isinstance(correct, bool) else None, confidence, extracted, raw)


def _is_retryable(e: Exception) -> bool:
    if isinstance(e, LMError):
        return e.retryable
    return True


class Judge(dspy.Module):  # type: ignore[misc]
    """BrowseComp-style grader program. Its predictor is ``grader``.

    Args:
        instructions: grader instructions; None loads the packaged ``judge`` prompt.
        attempts: LM attempts per response, ≥ 1. Transport retries (429, timeouts) already
            happen inside the LM layer; extra attempts here retry only retryable failures.

    Raises:
        ValueError: ``attempts`` < 1.
    """

    def __init__(self, instructions: str | None = None, *, attempts: int = 1) -> None:
        super().__init__()
        if attempts < 1:
            raise ValueError(f"attempts={attempts}: use 1 or more")
        instructions, self.prompt_version = resolve_instruction("judge", instructions)
        self.grader = dspy.Predict(GradeResponse.with_instructions(instructions))
        self.attempts = attempts

    def forward(self, question: str, response: str, correct_answer: str) -> dspy.Prediction:
        """Run the grader once; returns a prediction with the ``verdict`` and the ``grading`` reply.

        The verdict fields are typed (``correct: bool`` …) so the adapter (the context's, else
        :func:`kitune.lm.default_adapter`) asks for them in its own format, but the verdict is
        read from the model's reply by :func:`parse_grading`, which reads only the designated
        field (the whole-reply JSON object, or the ``correct:`` field / section): the adapter's
        lenient reading also takes a JSON object found anywhere in prose, which would let a
        quoted verdict override the report's own field (issue 40). Only when the LM's reply text
        is not tracked are the adapter's typed fields used (:func:`verdict_from_fields`). No
        second, JSON-formatted call is made. Raises whatever the LM raises.
        """
        reply = predict_typed(
            self.grader, question=question, response=response, correct_answer=correct_answer
        )
        if reply.raw or reply.prediction is None:
            verdict = parse_grading(reply.raw)
        else:  # an LM whose reply text is not tracked: the adapter's typed fields are all there is
            verdict = verdict_from_fields(reply.prediction, raw=reply.raw)
        return dspy.Prediction(verdict=verdict, grading=reply.raw)

    def grade(
        self, question: str, response: str, gold: str, *, aliases: Sequence[str] = (), lm: Any = None
    ) -> JudgeVerdict:
        """Grade ``response`` against ``gold`` (and ``aliases``); never raises for LM failures.

        Returns:
            A graded verdict, or ``status="grader_error"`` with the last exception (as
            ``"<Type>: <message>"``) or the unparsable raw report.
        """
        correct_answer = " | ".join([gold, *[a for a in aliases if a and a != gold]])
        error = "no attempt made"
        for _ in range(self.attempts):
            try:
                if lm is not None:
                    with dspy.context(lm=lm):
                        pred = self(question=question, response=response, correct_answer=correct_answer)
                else:
                    pred = self(question=question, response=response, correct_answer=correct_answer)
            except RecordingMissError:
                raise  # a replay miss is not a grader failure: the caller stops the run
            except Exception as e:  # classified below; a grader failure is data, not "incorrect"
                error = f"{type(e).__name__}: {e}"[:1000]
                if not _is_retryable(e):
                    break
                continue
            verdict: JudgeVerdict = pred.verdict
            return verdict
        return JudgeVerdict(
            correct=None, confidence=None, extracted_answer=None, status="grader_error", error=error
        )


def judge_answer(
    question: str,
    response: str,
    gold: str,
    *,
    aliases: Sequence[str] = (),
    judge: Judge | None = None,
    lm: Any = None,
) -> JudgeVerdict:
    """Grade one response (convenience wrapper over :meth:`Judge.grade`).

    Args:
        question: the question asked.
        response: the agent's full response (the final answer is extracted by the grader).
        gold: the gold answer.
        aliases: accepted alternative spellings of the gold answer.
        judge: a configured :class:`Judge` (None: a fresh one with the packaged prompt).
        lm: the judge LM (None: the judge's or the DSPy context's LM).

    Returns:
        The verdict; never raises for LM or parse failures (``status="grader_error"``).
    """
    return (judge or Judge()).grade(question, response, gold, aliases=aliases, lm=lm)


@dataclass(frozen=True)
class JudgeSummary:
    """Counts over a set of verdicts; accuracy excludes grader errors."""

    n_total: int
    n_graded: int
    n_grader_errors: int
    n_correct: int
    accuracy: float | None
    """``n_correct / n_graded`` (0.0–1.0), None when nothing was graded."""
    grader_error_rate: float
    """``n_grader_errors / n_total`` (0.0 when empty)."""
    is_complete: bool
    """False when the grader-error rate exceeds the allowed maximum: the run is incomplete."""


def summarize_verdicts(verdicts: Sequence[JudgeVerdict], *, max_error_rate: float = 0.05) -> JudgeSummary:
    """Summarise verdicts: grader errors are counted, never folded into accuracy (case J3).

    Args:
        verdicts: one verdict per question.
        max_error_rate: the largest grader-error share (0.0–1.0) for a complete run.
    """
    graded = [v for v in verdicts if v.is_graded]
    errors = len(verdicts) - len(graded)
    correct = sum(1 for v in graded if v.correct)
    rate = errors / len(verdicts) if verdicts else 0.0
    return JudgeSummary(
        n_total=len(verdicts),
        n_graded=len(graded),
        n_grader_errors=errors,
        n_correct=correct,
        accuracy=correct / len(graded) if graded else None,
        grader_error_rate=rate,
        is_complete=rate <= max_error_rate,
    )
