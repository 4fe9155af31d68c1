"""The deterministic grader decides by documented rules (the 1.5B judge got 5 of 12 verdicts wrong)."""

from __future__ import annotations

import pytest

from kitune.config import KituneConfig
from kitune.evaluation.grading import match_answer, match_judge, parse_exact_answer
from kitune.service.evaluation import make_judge


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
        ("The answer is 72, in total.", "72", [], (True, "exact")),  # numbers compared as values (issue 13)
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
