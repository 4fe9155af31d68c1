"""GEPA wrapper on the extractor task with rule-based stand-in LMs (no network)."""

from __future__ import annotations

import random

import dspy
import pytest
from opt_fakes import RuleLM, extractor_rule, reflection_lm

from kitune.data.loaders import Question
from kitune.errors import OptimizationError
from kitune.optimizers.base import Optimizer
from kitune.optimizers.gepa import GepaOptimizer
from kitune.optimizers.stopping import MaxMetricCalls
from kitune.optimizers.tasks import extractor_examples, extractor_metric
from kitune.programs.fact_extractor import FactExtractor
from kitune.schema import Document

TEXT = "Acme Corp was founded in 1999 by Jane Roe. Acme Corp is headquartered in Springfield."


def _docs() -> dict[str, Document]:
    return {f"d{i}": Document(docid=f"d{i}", text=TEXT, title="Acme") for i in range(4)}


def test_gepa_finds_the_instruction_that_covers_the_answer() -> None:
    docs = _docs()
    qs = [Question(str(i), "When was Acme founded?", "1999", gold_docids=(f"d{i}",)) for i in range(4)]
    examples = extractor_examples(qs, docs.__getitem__)
    assert [e.docid for e in examples] == ["d0", "d1", "d2", "d3"] and examples[0].answers == ["1999"]
    task_lm, refl = RuleLM(extractor_rule), reflection_lm()
    program = FactExtractor("Extract facts.")
    opt = GepaOptimizer(extractor_metric, reflection_lm=refl, max_metric_calls=12, rng=random.Random(1))
    assert isinstance(opt, Optimizer)
    with dspy.context(lm=task_lm):
        result = opt.compile(program, trainset=examples[:2], valset=examples[2:])
    assert program.extract.signature.instructions == "Extract facts."  # input unchanged
    assert result.baseline_candidate == {"extract": "Extract facts."}
    assert result.best_candidate == {"extract": "Extract every fact, with DATES of every event."}
    assert result.baseline_score == pytest.approx(0.4)  # no answer, every offered fact kept
    assert result.best_score == pytest.approx(1.0)
    assert result.improved and result.metric_calls > 0
    assert [h.score for h in result.history] == [pytest.approx(0.4), pytest.approx(1.0)]
    assert refl.calls >= 1


def test_gepa_with_kitune_stopper_and_empty_sets() -> None:
    docs = _docs()
    qs = [Question(str(i), "When?", "1999", gold_docids=(f"d{i}",)) for i in range(4)]
    examples = extractor_examples(qs, docs.__getitem__)
    opt = GepaOptimizer(
        extractor_metric,
        reflection_lm=reflection_lm(),
        max_metric_calls=50,
        stopper=MaxMetricCalls(2),
    )
    with dspy.context(lm=RuleLM(extractor_rule)):
        result = opt.compile(FactExtractor("Extract facts."), trainset=examples[:2], valset=examples[2:])
    assert result.stop_reason is not None and "metric calls" in result.stop_reason
    assert result.best_candidate == {"extract": "Extract facts."}
    with pytest.raises(OptimizationError, match="non-empty"):
        opt.compile(FactExtractor("x"), trainset=[], valset=examples)
