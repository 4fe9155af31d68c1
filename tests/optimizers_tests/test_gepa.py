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


def test_every_failed_reflection_call_is_the_stop_reason() -> None:
    # issue 12 item 10: an oversized or broken reflection call must not read as "no improvement"
    docs = _docs()
    qs = [Question(str(i), "When was Acme founded?", "1999", gold_docids=(f"d{i}",)) for i in range(4)]
    examples = extractor_examples(qs, docs.__getitem__)

    def broken(system: str, user: str) -> dict[str, object]:
        raise RuntimeError("context window exceeded: 9000 > 4096 tokens")

    opt = GepaOptimizer(extractor_metric, reflection_lm=RuleLM(broken, json=True), max_metric_calls=8)
    with dspy.context(lm=RuleLM(extractor_rule)):
        result = opt.compile(FactExtractor("Extract facts."), trainset=examples[:2], valset=examples[2:])
    assert result.best_candidate == {"extract": "Extract facts."}
    assert result.stop_reason is not None and result.stop_reason.startswith("every reflection call failed (")
    assert "context window exceeded" in result.stop_reason
    assert result.details["reflection_calls"] >= 1
    assert result.details["reflection_failures"] == result.details["reflection_calls"]


def test_reflection_examples_are_sized_to_the_window() -> None:
    from kitune.optimizers.gepa import fit_examples

    big = [{"Inputs": {"text": "x" * 5000}, "Feedback": "f" * 3000} for _ in range(6)]
    fitted = fit_examples(big, 2000)
    assert 1 <= len(fitted) < 6
    assert sum(len(repr(e)) for e in fitted) <= 2000
    assert fitted[0]["Inputs"]["text"].endswith("… [trimmed]")
    small = [{"Inputs": {"text": "short"}, "Feedback": "ok"}]
    assert fit_examples(small, 2000) == small  # nothing to trim
    # never empty, even when one trimmed example is still over budget
    assert len(fit_examples(big, 10)) == 1
