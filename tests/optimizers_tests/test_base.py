"""Tests for kitune.optimizers.base: candidates read from and written into DSPy programs."""

from __future__ import annotations

import dspy
import pytest

from kitune.optimizers.base import (
    CandidateScore,
    OptimizationResult,
    Optimizer,
    apply_candidate,
    get_candidate,
)


class TwoStep(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.plan = dspy.Predict(dspy.Signature("question -> plan", "Plan the search."))
        self.answer = dspy.Predict(dspy.Signature("question, plan -> answer", "Answer briefly."))


def test_get_and_apply_candidate_copy_not_mutate() -> None:
    program = TwoStep()
    assert get_candidate(program) == {"plan": "Plan the search.", "answer": "Answer briefly."}
    new = apply_candidate(program, {"answer": "Answer with one entity name."})
    assert get_candidate(new) == {"plan": "Plan the search.", "answer": "Answer with one entity name."}
    assert get_candidate(program)["answer"] == "Answer briefly."
    with pytest.raises(ValueError, match=r"unknown predictors \['nope'\].*\['answer', 'plan'\]"):
        apply_candidate(program, {"nope": "x"})


def test_result_record_and_protocol() -> None:
    class Identity:
        def compile(self, program, *, trainset, valset):  # type: ignore[no-untyped-def]
            cand = get_candidate(program)
            return OptimizationResult(
                program=program,
                best_candidate=cand,
                best_score=0.5,
                baseline_candidate=cand,
                baseline_score=0.5,
                metric_calls=len(valset),
                history=(CandidateScore(cand, 0.5, len(valset)),),
            )

    opt = Identity()
    assert isinstance(opt, Optimizer)
    result = opt.compile(TwoStep(), trainset=[1], valset=[1, 2])
    assert result.metric_calls == 2 and not result.improved
    assert OptimizationResult(None, {}, 0.7, {}, baseline_score=0.5).improved
    assert not OptimizationResult(None, {}, 0.7, {}).improved  # unknown baseline: not claimed
