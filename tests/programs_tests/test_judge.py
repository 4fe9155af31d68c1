from __future__ import annotations

import dspy
import pytest
from dspy.utils import DummyLM

from kitune.errors import LMAuthError, LMRateLimitError
from kitune.programs.judge import (
    Judge,
    JudgeVerdict,
    judge_answer,
    parse_anchored_verdict,
    parse_grading,
    summarize_verdicts,
    verdict_from_fields,
)
from kitune.text import exact_match, token_f1


class RawLM(DummyLM):
    """DummyLM that returns a raw string answer verbatim (no DSPy field markers)."""

    def _format_answer_fields(self, v):  # type: ignore[override]
        return v if isinstance(v, str) else super()._format_answer_fields(v)


class FailingLM(DummyLM):
    """Raises ``exc`` on every call and counts the calls."""

    def __init__(self, exc: Exception) -> None:
        super().__init__([])
        self.exc = exc
        self.calls = 0

    def forward(self, prompt=None, messages=None, **kwargs):
        self.calls += 1
        raise self.exc


# --- J2: anchored verdict extraction ---------------------------------------------------------

J2_CUES = ("grade", "verdict", "status")
J2_VALUES = ("A", "B", "success", "failure")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("As a judge, I weighed all evidence carefully. The final grade is B.", "B"),
        ("The task was not completed successfully.\nStatus: failure", "failure"),
        ("At first I thought the answer is A. Final verdict: B", "B"),
        ("I am unable to grade this.", None),
    ],
    ids=["t1", "t2", "t3", "t4"],
)
def test_j2_anchored_verdict(text: str, expected: str | None) -> None:
    assert parse_anchored_verdict(text, cues=J2_CUES, values=J2_VALUES) == expected


def test_last_anchored_verdict_wins_and_prose_is_ignored() -> None:
    raw = "correct: no\nOn reflection the answer matches; it is correct.\ncorrect: **Yes**"
    assert parse_anchored_verdict(raw) == "yes"
    # "incorrect" and bare prose words never count as the verdict field
    assert parse_anchored_verdict("The response is incorrect: yes it says Paris, which is no answer") is None


def test_echoed_template_is_not_a_verdict() -> None:
    assert parse_anchored_verdict("correct: yes|no\nconfidence: 0-100") is None
    assert parse_anchored_verdict("correct: yes / no") is None
    assert parse_grading("extracted_final_answer: X\ncorrect: yes|no").status == "grader_error"
    assert parse_anchored_verdict("correct: yes|no\n...\ncorrect: no") == "no"


def test_parse_grading_full_report() -> None:
    raw = (
        "extracted_final_answer: O’Neill’s Bakery\n"
        "reasoning: The answer says no more than the gold; nothing incorrect here.\n"
        "correct: yes\nconfidence: 95%"
    )
    v = parse_grading(raw)
    assert v == JudgeVerdict(
        correct=True, confidence=95, extracted_answer="O’Neill’s Bakery", status="graded", raw=raw
    )


def test_parse_grading_none_answer_and_no() -> None:
    v = parse_grading(
        "extracted_final_answer: None\nreasoning: no answer given, yes really\ncorrect: no\nconfidence: 100"
    )
    assert (v.status, v.correct, v.extracted_answer, v.confidence) == ("graded", False, None, 100)


def test_j3b_unparsable_report_is_grader_error_not_incorrect() -> None:
    v = parse_grading("I cannot evaluate this response.")
    assert v.status == "grader_error"
    assert v.correct is None
    assert v.error == "no parsable verdict in the grader output"
    assert v.raw == "I cannot evaluate this response."


# --- Judge program with stand-in LMs ---------------------------------------------------------


def test_judge_grades_through_dspy_fields() -> None:
    report = "extracted_final_answer: 1,000\nreasoning: same number\ncorrect: yes\nconfidence: 90"
    lm = DummyLM([{"grading": report}])
    v = judge_answer("How many?", "I think it is 1,000.", "1000", lm=lm)
    assert (v.status, v.correct, v.confidence, v.extracted_answer) == ("graded", True, 90, "1,000")
    prompt = lm.history[-1]["messages"][-1]["content"]
    assert "1000" in prompt


def test_judge_passes_aliases_to_the_grader() -> None:
    lm = DummyLM([{"grading": "extracted_final_answer: NYC\nreasoning: alias\ncorrect: yes\nconfidence: 80"}])
    judge_answer("Which city?", "NYC", "New York City", aliases=["NYC", "New York City"], lm=lm)
    prompt = lm.history[-1]["messages"][-1]["content"]
    assert "New York City | NYC" in prompt


def test_judge_reads_raw_report_without_markers_in_one_call() -> None:
    lm = RawLM(["extracted_final_answer: Paris\nreasoning: matches\ncorrect: no\nconfidence: 70"])
    v = Judge().grade("Capital?", "Paris", "Lyon", lm=lm)
    assert (v.status, v.correct, v.confidence) == ("graded", False, 70)
    assert len(lm.history) == 1  # no JSON-adapter second call


def test_j3b_refusal_through_the_program() -> None:
    lm = RawLM(["I cannot evaluate this response."])
    v = Judge().grade("Q?", "A", "B", lm=lm)
    assert v.status == "grader_error" and v.correct is None
    assert "I cannot evaluate" in v.raw


def test_j3a_rate_limit_on_every_attempt_is_grader_error() -> None:
    lm = FailingLM(LMRateLimitError("429 Too Many Requests", retry_after_s=1.0, model="m"))
    v = Judge(attempts=3).grade("Q?", "A", "B", lm=lm)
    assert lm.calls == 3
    assert v.status == "grader_error"
    assert v.correct is None
    assert v.error is not None and v.error.startswith("LMRateLimitError: 429")


def test_auth_error_is_not_retried() -> None:
    lm = FailingLM(LMAuthError("401 bad key", model="m"))
    v = Judge(attempts=3).grade("Q?", "A", "B", lm=lm)
    assert lm.calls == 1 and v.status == "grader_error"


def test_summary_excludes_grader_errors_from_accuracy() -> None:
    ok = JudgeVerdict(True, 90, "x", "graded")
    wrong = JudgeVerdict(False, 90, "y", "graded")
    err = JudgeVerdict(None, None, None, "grader_error", error="boom")
    s = summarize_verdicts([ok, ok, wrong, err])
    assert (s.n_total, s.n_graded, s.n_grader_errors, s.n_correct) == (4, 3, 1, 2)
    assert s.accuracy == pytest.approx(2 / 3)
    assert s.grader_error_rate == 0.25 and s.is_complete is False
    assert summarize_verdicts([ok] * 20 + [err]).is_complete is True
    assert summarize_verdicts([]).accuracy is None


def test_j4_em_and_f1_reused_from_text() -> None:
    gold = "O'Neill's Bakery"
    assert exact_match("O\u2019Neill\u2019s Bakery", gold)
    assert exact_match("O\u2032Neill\u2032s Bakery", gold)
    assert token_f1("O\u2019Neill\u2019s Bakery", gold) == 1.0


def test_prompt_is_the_packaged_instruction() -> None:
    j = Judge()
    assert j.prompt_version.startswith("judge@") and len(j.prompt_version) == len("judge@") + 8
    # the instruction describes the task only; the verdict format comes from the typed fields
    assert "correct:" not in j.grader.signature.instructions
    assert j.grader.signature.output_fields["correct"].annotation is bool
    assert [name for name, _ in j.named_predictors()] == ["grader"]
    with pytest.raises(ValueError, match="attempts=0"):
        Judge(attempts=0)
    assert dspy.settings.lm is None


def test_json_verdict_is_parsed_not_a_grader_error() -> None:
    v = parse_grading(
        '{"extracted_final_answer": "Paris", "reasoning": "same city", "correct": "yes", "confidence": 90}'
    )
    assert (v.status, v.correct, v.extracted_answer, v.confidence) == ("graded", True, "Paris", 90)
    v = parse_grading('```json\n{"Correct": false, "extracted_final_answer": "None"}\n```')
    assert (v.status, v.correct, v.extracted_answer) == ("graded", False, None)
    v = parse_grading('{"correct": "maybe"}')
    assert v.status == "grader_error" and v.correct is None


def test_typed_verdict_fields_are_read_directly() -> None:
    fields = {"extracted_final_answer": "1932", "reasoning": "same year"}
    fields |= {"correct": "True", "confidence": "85"}
    lm = DummyLM([fields])
    v = Judge().grade("When?", "It opened in 1932.", "1932", lm=lm)
    assert (v.status, v.correct, v.extracted_answer, v.confidence) == ("graded", True, "1932", 85)
    # issue 24: the verdict comes from the typed fields; the raw report is the model's own reply,
    # no longer the fields rendered back into "correct: yes" text for parse_grading
    assert "[[ ## correct ## ]]\nTrue" in v.raw and "correct: yes" not in v.raw


def test_judge_confidence_follows_the_one_policy() -> None:
    # never clamped (140 is invalid, not 100) and never mapped from a word
    assert parse_grading("correct: yes\nconfidence: 140").confidence is None
    assert parse_grading('{"correct": "yes", "confidence": "high"}').confidence is None
    assert parse_grading('{"correct": "yes", "confidence": 0.85}').confidence == 85
    assert parse_grading('{"correct": "no", "confidence": "85%"}').confidence == 85
    assert parse_grading("correct: no\nconfidence: 72").confidence == 72


# --- typed outputs: a model writing int[90] / bool[False] as it saw the types (issue 25) -----

TYPED_FIELDS = {
    "extracted_final_answer": "Paris",
    "reasoning": "Paris is not Lyon.",
    "correct": "bool[False]",
    "confidence": "int[90]",
}


def test_typed_bracket_outputs_are_coerced_through_the_adapter() -> None:
    lm = DummyLM([TYPED_FIELDS])  # field-per-section reply: "[[ ## correct ## ]]\nbool[False]"
    v = judge_answer("Capital?", "Paris", "Lyon", lm=lm)
    assert (v.status, v.correct, v.confidence, v.extracted_answer) == ("graded", False, 90, "Paris")
    assert len(lm.history) == 1


def test_typed_bracket_outputs_in_a_json_reply_under_a_plain_dspy_adapter() -> None:
    # dspy's own JSONAdapter fails on "bool[False]"; the raw report is read with the same coercion
    raw = (
        '{"extracted_final_answer": "Paris", "reasoning": "r", "correct": "bool[True]", '
        '"confidence": "int[85]"}'
    )
    with dspy.context(adapter=dspy.JSONAdapter()):
        v = Judge().grade("Capital?", "Paris", "Paris", lm=RawLM([raw]))
    assert (v.status, v.correct, v.confidence, v.extracted_answer) == ("graded", True, 85, "Paris")


@pytest.mark.parametrize(
    ("raw", "correct", "confidence"),
    [
        (
            "[[ ## extracted_final_answer ## ]]\nParis\n[[ ## correct ## ]]\nbool[False]\n"
            "[[ ## confidence ## ]]\nint[90]\n[[ ## completed ## ]]",
            False,
            90,
        ),
        ("extracted_final_answer: Paris\ncorrect: bool[True]\nconfidence: int[70]", True, 70),
        ("extracted_final_answer: Paris\ncorrect: true\nconfidence: 60", True, 60),
        ('{"correct": "bool[no]", "confidence": "float[75]"}', False, 75),
    ],
)
def test_parse_grading_reads_typed_values(raw: str, correct: bool, confidence: int) -> None:
    v = parse_grading(raw)
    assert (v.status, v.correct, v.confidence) == ("graded", correct, confidence)


def test_typed_value_that_does_not_fit_its_type_is_still_a_grader_error() -> None:
    v = parse_grading("extracted_final_answer: Paris\ncorrect: bool[maybe]\nconfidence: int[high]")
    assert (v.status, v.correct, v.confidence) == ("grader_error", None, None)


def test_verdict_from_typed_fields_keeps_the_policies() -> None:
    # issue 24: the typed fields make the verdict, with the same rules as a report: confidence
    # outside 0-100 is None (never clamped), "None" is no extracted answer, no verdict is an error
    typed = dspy.Prediction(correct=False, confidence=140, extracted_final_answer="None", reasoning="r")
    v = verdict_from_fields(typed, raw="the reply")
    assert v == JudgeVerdict(False, None, None, "graded", raw="the reply")
    empty = verdict_from_fields(dspy.Prediction(correct=None, confidence=90, extracted_final_answer="Paris"))
    assert (empty.status, empty.correct, empty.confidence, empty.extracted_answer) == (
        "grader_error",
        None,
        90,
        "Paris",
    )


# --- issue 40: the verdict only from the designated field, one value vocabulary -------------

QUOTING_REPORT = (
    "extracted_final_answer: Lyon\n"
    'reasoning: An earlier grader wrote {"correct": "yes", "extracted_final_answer": "Lyon", '
    '"reasoning": "r", "confidence": 99} but Lyon is not Paris.\n'
    "correct: no\n"
    "confidence: 80"
)


def test_a_json_verdict_quoted_in_a_text_report_never_overrides_its_field() -> None:
    v = parse_grading(QUOTING_REPORT)
    assert (v.status, v.correct, v.extracted_answer, v.confidence) == ("graded", False, "Lyon", 80)


def test_the_program_grades_a_quoting_report_by_its_field_not_the_adapters_json() -> None:
    # kitune's lenient adapter reads the quoted object (it has every output field); the verdict
    # must still come from the report's own correct: field
    lm = RawLM([QUOTING_REPORT])
    v = Judge().grade("Capital of France?", "Lyon", "Paris", lm=lm)
    assert (v.status, v.correct, v.extracted_answer, v.confidence) == ("graded", False, "Lyon", 80)
    assert len(lm.history) == 1


def test_json_verdict_followed_by_prose_with_a_brace_is_graded_by_the_json() -> None:
    raw = (
        '{"extracted_final_answer": "Paris", "reasoning": "same city", "correct": true, '
        '"confidence": 90}\nNote: the set {Paris} has one element; correct: no was considered.'
    )
    v = parse_grading(raw)
    assert (v.status, v.correct, v.extracted_answer, v.confidence) == ("graded", True, "Paris", 90)


@pytest.mark.parametrize(
    ("value", "correct"),
    [('"Yes."', True), ('"**No**"', False), ('"TRUE"', True), ('"no."', False), ("false", False)],
)
def test_json_and_text_accept_the_same_verdict_values(value: str, correct: bool) -> None:
    as_json = parse_grading(f'{{"correct": {value}, "confidence": 70}}')
    as_text = parse_grading(f"correct: {value.strip(chr(34))}\nconfidence: 70")
    assert (as_json.status, as_json.correct) == ("graded", correct)
    assert (as_text.status, as_text.correct) == ("graded", correct)


def test_a_json_object_after_prose_is_not_the_designated_field() -> None:
    v = parse_grading('Here is my grading: {"correct": "yes", "confidence": 90}')
    assert (v.status, v.correct) == ("grader_error", None)
    assert v.error == "no parsable verdict in the grader output"
