"""MIPROv2 wrapper (instructions only) on the extractor task with rule-based stand-in LMs."""

from __future__ import annotations

import random

import dspy
import pytest
from opt_fakes import RuleLM, extractor_rule

from kitune.data.loaders import Question
from kitune.errors import OptimizationError
from kitune.optimizers.base import Optimizer
from kitune.optimizers.mipro import MiproOptimizer
from kitune.optimizers.tasks import extractor_examples, extractor_metric
from kitune.programs.fact_extractor import FactExtractor
from kitune.schema import Document

TEXT = "Acme Corp was founded in 1999 by Jane Roe. Acme Corp is headquartered in Springfield."


def proposer_rule(system: str, user: str) -> dict[str, str]:
    return {"proposed_instruction": "Extract every fact, with DATES of every event."}


def test_mipro_picks_the_better_proposed_instruction() -> None:
    docs = {f"d{i}": Document(docid=f"d{i}", text=TEXT, title="Acme") for i in range(4)}
    qs = [Question(str(i), "When was Acme founded?", "1999", gold_docids=(f"d{i}",)) for i in range(4)]
    examples = extractor_examples(qs, docs.__getitem__)
    opt = MiproOptimizer(
        extractor_metric,
        prompt_lm=RuleLM(proposer_rule),
        num_candidates=3,
        num_trials=6,
        rng=random.Random(0),
    )
    assert isinstance(opt, Optimizer)
    program = FactExtractor("Extract facts.")
    with dspy.context(lm=RuleLM(extractor_rule)):
        result = opt.compile(program, trainset=examples[:2], valset=examples[2:])
    assert program.extract.signature.instructions == "Extract facts."
    assert result.best_candidate == {"extract": "Extract every fact, with DATES of every event."}
    assert result.best_score == pytest.approx(1.0)
    assert result.baseline_score == pytest.approx(0.4)
    assert not hasattr(result.program, "trial_logs")


def test_mipro_rejects_empty_sets() -> None:
    opt = MiproOptimizer(extractor_metric, prompt_lm=RuleLM(proposer_rule))
    with pytest.raises(OptimizationError, match="non-empty"):
        opt.compile(FactExtractor("x"), trainset=[], valset=[])
    with pytest.raises(ValueError, match="num_candidates"):
        MiproOptimizer(extractor_metric, prompt_lm=None, num_candidates=0)


def test_mipro_refuses_a_two_argument_metric_and_no_proposer_lm() -> None:
    from kitune.errors import ConfigError

    def two(gold: object, pred: object) -> float:
        return 1.0

    with pytest.raises(
        ConfigError, match=r"MIPROv2 metric two\(gold, pred\) cannot be called as metric\(gold, pred, trace\)"
    ):
        MiproOptimizer(two, prompt_lm=RuleLM(proposer_rule))
    with pytest.raises(ConfigError, match="MIPROv2 needs a reflection LM"):
        MiproOptimizer(extractor_metric, prompt_lm=None)
