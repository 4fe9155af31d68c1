from __future__ import annotations

import pytest

from kitune.data.examples import select_split, slice_questions, split_questions, to_dspy_examples
from kitune.data.loaders import Question


def _qs(n: int) -> list[Question]:
    return [
        Question(query_id=f"q{i:02d}", query=f"Q{i}?", answer=f"A{i}", aliases=(f"a{i}",)) for i in range(n)
    ]


def test_split_is_seeded_and_order_independent() -> None:
    qs = _qs(10)
    tune, val = split_questions(qs, validation_fraction=0.3, seed=7)
    tune2, val2 = split_questions(list(reversed(qs)), validation_fraction=0.3, seed=7)
    assert [q.query_id for q in val] == [q.query_id for q in val2]
    assert [q.query_id for q in tune] == [q.query_id for q in tune2]
    assert len(val) == 3 and len(tune) == 7
    assert {q.query_id for q in tune} | {q.query_id for q in val} == {q.query_id for q in qs}
    assert not {q.query_id for q in tune} & {q.query_id for q in val}
    _, val3 = split_questions(qs, validation_fraction=0.3, seed=8)
    assert [q.query_id for q in val3] != [q.query_id for q in val]


def test_split_edges_and_errors() -> None:
    assert split_questions(_qs(1), validation_fraction=0.5, seed=0) == (_qs(1), [])
    tune, val = split_questions(_qs(2), validation_fraction=0.01, seed=0)
    assert (len(tune), len(val)) == (1, 1)
    with pytest.raises(ValueError, match="validation_fraction"):
        split_questions(_qs(3), validation_fraction=1.0, seed=0)
    with pytest.raises(ValueError, match="unique"):
        split_questions(_qs(2) + _qs(1), validation_fraction=0.5, seed=0)


def test_select_and_slice() -> None:
    qs = _qs(6)
    assert select_split(qs, "all", validation_fraction=0.5, seed=0) == qs
    val = select_split(qs, "validation", validation_fraction=0.5, seed=0)
    tune = select_split(qs, "tune", validation_fraction=0.5, seed=0)
    assert len(val) == 3 and len(tune) == 3
    assert [q.query_id for q in slice_questions(qs, 2)] == ["q00", "q01"]
    assert [q.query_id for q in slice_questions(qs, 2, offset=5)] == ["q05"]
    assert slice_questions(qs, None) == qs
    with pytest.raises(ValueError):
        slice_questions(qs, -1)


def test_to_dspy_examples() -> None:
    ex = to_dspy_examples(_qs(2))
    assert len(ex) == 2
    assert ex[1].question == "Q1?" and ex[1].answer == "A1" and ex[1].aliases == ["a1"]
    assert set(ex[0].inputs().keys()) == {"question"}
