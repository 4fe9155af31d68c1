"""Programs read half an emoji pair (the JSON escape ``"\\ud83d"``) as U+FFFD and count it (issue 25)."""

from __future__ import annotations

import dspy
from dspy.utils import DummyLM

from kitune.programs.judge import parse_grading
from kitune.programs.predict import predict_typed
from kitune.programs.records import PlanDraft

HALF = "\\ud83d"  # the JSON escape of the high half of U+1F600, as the model wrote it


class MakePlan(dspy.Signature):  # type: ignore[misc]
    """Plan."""

    question: str = dspy.InputField()
    plan: PlanDraft = dspy.OutputField()


def test_predict_typed_counts_the_repairs_of_a_rewriter_reply() -> None:
    reply = f'{{"lexical": "{HALF}", "semantic": "Who smiled?"}}'  # DummyLM adds the field marker
    with dspy.context(lm=DummyLM([{"plan": reply}])):
        got = predict_typed(dspy.Predict(MakePlan), question="Who smiled?")
    assert got.error is None and got.prediction is not None
    assert got.prediction.plan.lexical == "\ufffd"
    assert got.counters == {"surrogates_replaced": 1}
    assert HALF in got.raw  # the model's own text, as written (an ASCII escape)


def test_a_grader_report_in_json_reads_its_answer_with_fffd() -> None:
    verdict = parse_grading(
        f'{{"extracted_final_answer": "Paris {HALF}", "correct": "yes", "confidence": 90}}'
    )
    assert (verdict.status, verdict.correct, verdict.extracted_answer) == ("graded", True, "Paris \ufffd")
