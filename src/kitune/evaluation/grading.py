"""A deterministic grader: answer matching with no LLM, for runs whose judge model is too weak.

The default judge is an LLM (:class:`kitune.programs.judge.Judge`). With the embedded 1.5B
model its verdicts are not usable: on the first 12 answers of the fixture loop run it called
"February 1, 2006" correct for the gold "April 1793" and "Victoria Falls" wrong for the gold
"Victoria Falls" (5 of 12 verdicts wrong; ``experiments/loop-fixture-24``). ``grading.grader:
match`` replaces it with :func:`match_judge`, which reads the response's ``Exact Answer:`` line
and decides by rules, in order:

1. *yes/no gold* (HotpotQA's comparison questions): correct only when the normalised
   prediction is exactly ``yes``/``no`` and equal to the gold;
2. *date*: when the gold and the prediction are each one full date
   (:func:`kitune.text.parse_date`: ``May 7, 2022``, ``7 May 2022``, ``7th May 2022``,
   ``2022-05-07`` …), correct only for the same calendar day;
3. *exact*: :func:`kitune.text.exact_match` against the gold answer and its aliases (SQuAD-style
   normalisation: case, punctuation, articles, number formats);
4. *contains*: the normalised prediction contains a normalised gold or alias as whole words
   ("Hebron Academy in Maine" for "Hebron Academy"); a gold that is a whole number is contained
   only when the prediction states exactly that one value as a stand-alone number
   (:func:`kitune.text.contains_number`: "The answer is 72, in total." for "72", but not
   "Apollo 11" for "11", "B-52" for "52" or "4th" for "4").

A prediction that only partly names the gold ("Hank Williams" for "Hank Williams, Jr.") is
wrong. The verdict is always ``graded`` (rules cannot fail), with ``confidence`` 100 and the
rule that decided in ``rule``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from kitune.text import (
    contains_answer,
    contains_number,
    exact_match,
    normalize_answer,
    parse_date,
    whole_number,
)

__all__ = ["MatchVerdict", "match_answer", "match_judge", "parse_exact_answer"]

_EXACT = re.compile(r"^\s*exact answer\s*:\s*(.*)$", re.IGNORECASE | re.MULTILINE)
_YES_NO = {"yes", "no"}


@dataclass(frozen=True)
class MatchVerdict:
    """What :func:`match_judge` returns (the harness reads ``correct`` and ``status``)."""

    correct: bool | None
    status: str = "graded"
    confidence: int = 100
    rule: str = ""
    """Which rule decided: ``yes_no``, ``date``, ``exact``, ``contains`` or ``no_match``."""
    error: str | None = None


def parse_exact_answer(response: str) -> str:
    """The text after ``Exact Answer:`` in a BrowseComp-style response (the whole response if absent)."""
    m = _EXACT.search(response or "")
    return (m.group(1) if m else response or "").strip()


def match_answer(prediction: str, gold: str, aliases: Sequence[str] = ()) -> tuple[bool, str]:
    """Decide one answer by the module's rules.

    Returns:
        ``(correct, rule)``; deterministic.
    """
    golds = [g for g in (gold, *aliases) if g and g.strip()]
    pred = normalize_answer(prediction)
    if not pred or not golds:
        return False, "no_match"
    if normalize_answer(gold) in _YES_NO:
        return pred == normalize_answer(gold), "yes_no"
    gold_date = parse_date(gold)
    pred_date = parse_date(prediction)
    if gold_date is not None and pred_date is not None:
        return pred_date == gold_date or any(parse_date(a) == pred_date for a in aliases), "date"
    if exact_match(prediction, golds):
        return True, "exact"
    if any(contains_number(prediction, g) for g in golds):
        return True, "contains"
    texts = [g for g in golds if normalize_answer(g) not in _YES_NO and whole_number(g) is None]
    if contains_answer(prediction, texts):
        return True, "contains"
    return False, "no_match"


def match_judge(*, question: str, response: str, gold: str, aliases: Sequence[str]) -> MatchVerdict:
    """A judge with the harness's judge signature that grades by :func:`match_answer`."""
    correct, rule = match_answer(parse_exact_answer(response), gold, aliases)
    return MatchVerdict(correct=correct, rule=rule)
