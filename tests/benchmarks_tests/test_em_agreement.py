"""benchmarks/em_agreement.py: the official EM re-implementation, the pair builders, the classifier."""

from __future__ import annotations

import json
from pathlib import Path

import em_agreement as em
import pytest

from kitune.text import exact_match


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("The Cat's  hat!", "cats hat"),
        ("U.S.", "us"),
        ("an apple a day", "apple day"),
        ("Spider-Man", "spiderman"),
        ("3:30 p.m.", "330 pm"),
        ("Théâtre", "théâtre"),
        ("O’Neill", "o’neill"),  # U+2019 is not in string.punctuation: the scripts keep it
    ],
)
def test_official_normalize_follows_the_squad_script(text: str, normalized: str) -> None:
    assert em.official_normalize(text) == normalized


def test_official_em_is_max_over_golds() -> None:
    assert em.official_em("the United States", ["U.S.", "United States"])
    assert not em.official_em("4th", ["4"])


def test_issue_cases_agree_with_the_official_script_now() -> None:
    m = em.measure(em.issue_pairs(), exact_match)
    assert (m["n"], m["agree"], m["disagreements"]) == (12, 12, [])


def test_measure_classifies_every_disagreement() -> None:
    def old_rule(pred: str, golds: list[str]) -> bool:  # numbers read out of words, as before issue 25
        return pred.lower() in [g.lower() for g in golds] or em._digits(pred) in [
            em._digits(g) for g in golds
        ]

    pairs = [
        em.Pair("issue_25", "", "a", "4th", ("4",), "t"),
        em.Pair("issue_25", "", "b", "Paris", ("Paris",), "t"),
        em.Pair("issue_25", "", "c", "3:30", ("330",), "t"),
    ]
    m = em.measure(pairs, old_rule)
    assert (m["n"], m["agree"]) == (3, 1)
    assert [(d["query_id"], d["kitune"], d["official"], d["cause"]) for d in m["disagreements"]] == [
        ("a", True, False, "number_in_text"),
        ("c", False, True, "number_in_text"),
    ]
    assert m["causes"] == {"number_in_text": 2}


def test_classify_names_the_kitune_rule() -> None:
    assert em.classify(em.Pair("x", "", "q", "1.50", ("1.5",), ""), True) == "number_value"
    assert em.classify(em.Pair("x", "", "q", "O’Neill", ("O'Neill",), ""), True) == "unicode_folding"
    assert (
        em.classify(em.Pair("x", "", "q", "J. K. Rowling", ("JK Rowling",), ""), True)
        == "dotted_abbreviation"
    )
    assert em.classify(em.Pair("x", "", "q", "chili cook off", ("chili cook-off",), ""), True) == (
        "punctuation_as_space"
    )


def test_doc_spans_are_raw_text_with_the_golds_words() -> None:
    text = "Born in the U.S. in 1999; the u.s army. Not US-based."
    assert em._spans(text, "U.S.") == ["U.S", "u.s"]
    assert em._spans(text, "1999") == ["1999"]
    assert em._spans(text, "Canada") == []


def test_stored_pairs_are_measured_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stored = {"results": {"pairs": [em.Pair("alias", "musique", "1", "US", ("U.S.",), "t").__dict__]}}
    src = tmp_path / "prev.json"
    src.write_text(json.dumps(stored), encoding="utf-8")
    written: dict[str, object] = {}

    def fake_write(name: str, **kw: object) -> tuple[Path, Path]:
        written.update(kw, name=name)
        return tmp_path / "a.json", tmp_path / "a.md"

    monkeypatch.setattr(em, "write_results", fake_write)
    assert em.main(["--pairs", str(src), "--name", "t"]) == 0
    results = written["results"]
    assert isinstance(results, dict)
    assert results["kitune"]["n"] == 1 and results["kitune"]["agreement"] == 1.0
    assert results["pairs"] == stored["results"]["pairs"]


def test_official_f1_follows_each_script() -> None:
    assert em.official_f1("3 m", ["3 metres"]) == 0.5
    assert em.official_f1("yes it is", ["yes"], "hotpotqa") == 0.0  # HotpotQA's yes/no rule
    assert em.official_f1("yes it is", ["yes"]) == 0.5
    assert em.official_f1("", [""], "musique") == 1.0 and em.official_f1("", [""]) == 0.0


def test_f1_agreement_counts_differences_beyond_the_tolerance() -> None:
    pairs = [em.Pair("t", "", "a", "3 m", ("3 metres",), "t"), em.Pair("t", "", "b", "x", ("x",), "t")]
    m = em.measure_f1(pairs, lambda pred, golds: 0.0 if pred == "3 m" else 1.0)
    assert (m["n"], m["agree"], m["official_higher"], m["kitune_higher"]) == (2, 1, 1, 0)
    assert [(d["query_id"], d["kitune"], d["official"]) for d in m["disagreements"]] == [("a", 0.0, 0.5)]
