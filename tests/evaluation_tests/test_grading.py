"""The deterministic grader decides by documented rules (the 1.5B judge got 5 of 12 verdicts wrong)."""

from __future__ import annotations

import pytest

from core_tests.test_text import NOT_NUMBER_PAIRS
from kitune.config import KituneConfig
from kitune.evaluation.grading import match_answer, match_judge, parse_exact_answer
from kitune.service.pipelines.evaluation import make_judge


@pytest.mark.parametrize(
    ("prediction", "gold", "aliases", "expected"),
    [
        # the real fixture answers the 1.5B judge graded wrongly
        ("February 1, 2006", "April 1793", [], (False, "no_match")),
        ("Victoria Falls", "Victoria Falls", [], (True, "exact")),
        ("Audrey Mae Sheppard Williams", "Hank Williams, Jr.", [], (False, "no_match")),
        ("Berlin", "Wittendörp", [], (False, "no_match")),
        ("Carl Philipp Emanuel Bach", "Georg Philipp Telemann", [], (False, "no_match")),
        # containment as whole words, aliases, yes/no
        ("The answer is 72, in total.", "72", [], (True, "contains")),  # one stated value (issue 25)
        ("between 70 and 72", "72", [], (False, "no_match")),  # two stated values
        ("Apollo 11 landed in 1969", "1969", [], (True, "contains")),
        ("2,000", "2000", [], (True, "exact")),
        ("1.5 million", "1,500,000", [], (True, "exact")),
        ("$2,000", "2,000 dollars", [], (True, "exact")),
        ("Hebron Academy in Maine", "Hebron Academy", [], (True, "contains")),
        ("Hank Williams", "Hank Williams, Jr.", [], (False, "no_match")),
        ("JFK", "John F. Kennedy", ["JFK"], (True, "exact")),
        ("Yes", "no", [], (False, "yes_no")),
        ("no", "no", [], (True, "yes_no")),
        ("no, it was not", "no", [], (False, "yes_no")),
        ("", "Paris", [], (False, "no_match")),
        ("1721", "172", [], (False, "no_match")),  # whole words only
    ],
)
def test_match_rules(prediction: str, gold: str, aliases: list[str], expected: tuple[bool, str]) -> None:
    assert match_answer(prediction, gold, aliases) == expected


def test_match_judge_reads_the_exact_answer_line_and_is_selected_by_config() -> None:
    response = "Explanation: the KI says so [d1].\nExact Answer: Victoria Falls\nConfidence: 80%"
    assert parse_exact_answer(response) == "Victoria Falls"
    v = match_judge(question="Where?", response=response, gold="Victoria Falls", aliases=[])
    assert (v.correct, v.status, v.rule) == (True, "graded", "exact")
    judge = make_judge(KituneConfig(grading={"grader": "match"}), None)
    assert judge(question="q", response="Exact Answer: Paris", gold="Lyon", aliases=[]).correct is False


@pytest.mark.parametrize(("prediction", "gold"), NOT_NUMBER_PAIRS)
def test_numbers_inside_words_ordinals_and_other_currencies_are_wrong(prediction: str, gold: str) -> None:
    assert match_answer(prediction, gold) == (False, "no_match")
    assert match_answer(gold, prediction) == (False, "no_match")


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("May 7, 2022", "7 May 2022", (True, "date")),
        ("7 May 2022", "2022-05-07", (True, "date")),
        ("7th May 2022", "May 7, 2022", (True, "date")),
        ("2022-05-07", "7th May 2022", (True, "date")),
        ("May 7, 2022", "7 May 2023", (False, "date")),
        ("May 7, 2022", "2022-07-05", (False, "date")),
        ("8 May 2022", "7th May 2022", (False, "date")),
        ("30 February 2022", "2 March 2022", (False, "no_match")),  # not a real day: no date rule
    ],
)
def test_dates_compared_as_dates(prediction: str, gold: str, expected: tuple[bool, str]) -> None:
    assert match_answer(prediction, gold) == expected
