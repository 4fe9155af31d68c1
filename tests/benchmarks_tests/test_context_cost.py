"""Pure helpers of the context-cost benchmark: answer containment, item split, tokens to answer."""

from __future__ import annotations

from context_cost import contains_answer, split_items, tokens_to_answer


def test_contains_answer_is_normalised_and_whole_word() -> None:
    assert contains_answer("It opened on 1,200 seats — The Globe", ["the globe"]) is True
    assert contains_answer("O’Neill’s team won.", ["O'Neill's"]) is True
    assert contains_answer("Parisian cafés", ["Paris"]) is False
    assert contains_answer("nothing here", ["", "x"]) is False


def test_split_items_keeps_text_and_rank_order() -> None:
    text = "1. [a] first\n  … snippet\n2. [b] second\nfacets: tags: x 1"
    items = split_items(text)
    assert items == ["1. [a] first\n  … snippet\n", "2. [b] second\nfacets: tags: x 1"]
    assert "".join(items) == text
    assert split_items("No documents matched 'q'.") == ["No documents matched 'q'."]
    assert split_items("") == []


def test_tokens_to_answer_counts_the_prefix() -> None:
    items = ["1. alpha beta\n", "2. gamma Paris\n", "3. Paris again\n"]
    assert tokens_to_answer(items, ["Paris"], lambda s: len(s.split())) == 3 + 3
    assert tokens_to_answer(items, ["London"], lambda s: len(s.split())) is None


def test_entity_query_takes_the_name_runs_after_the_first_word() -> None:
    from context_cost import entity_query

    assert entity_query("What district is LaHave of the place of birth of David Morse located?") == (
        "LaHave David Morse"
    )
    assert entity_query("When was the Boston Beer Company founded?") == "Boston Beer Company"
    assert entity_query("who wrote it?") is None


def test_bootstrap_ci_is_seeded_and_brackets_the_statistic() -> None:
    from context_cost import bootstrap_ci

    values = [float(v) for v in range(1, 101)]
    ci = bootstrap_ci(values, lambda v: sum(v) / len(v), resamples=500)
    assert ci is not None and ci == bootstrap_ci(values, lambda v: sum(v) / len(v), resamples=500)
    assert ci[0] < 50.5 < ci[1] and 40 < ci[0] and ci[1] < 61
    assert bootstrap_ci([], lambda v: 0.0) is None
    assert bootstrap_ci([7.0, 7.0, 7.0], lambda v: sum(v) / len(v), resamples=50) == (7.0, 7.0)


def test_paired_ratio_ci_resamples_questions_together() -> None:
    import pytest
    from context_cost import paired_ratio_ci

    den = [float(v) for v in range(10, 60)]
    assert paired_ratio_ci([d / 2 for d in den], den, resamples=200) == (0.5, 0.5)  # exact pairs: no spread
    lo, hi = paired_ratio_ci([d * (1 + (i % 2) * 0.5) for i, d in enumerate(den)], den, resamples=300) or (
        0,
        0,
    )
    assert 1.0 < lo < 1.25 < hi < 1.5
    assert paired_ratio_ci([], []) is None
    with pytest.raises(ValueError, match="numerators"):
        paired_ratio_ci([1.0], [1.0, 2.0])
