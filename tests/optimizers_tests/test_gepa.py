"""GEPA wrapper on the extractor task with rule-based stand-in LMs (no network)."""

from __future__ import annotations

import random

import dspy
import pytest
from opt_fakes import RuleLM, extractor_rule, reflection_lm

from kitune.data.loaders import Question
from kitune.errors import ConfigError, OptimizationError
from kitune.optimizers.base import Optimizer
from kitune.optimizers.gepa import GepaOptimizer
from kitune.optimizers.stopping import MaxMetricCallsStopper
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
        stoppers=[MaxMetricCallsStopper(2)],
    )
    with dspy.context(lm=RuleLM(extractor_rule)):
        result = opt.compile(FactExtractor("Extract facts."), trainset=examples[:2], valset=examples[2:])
    assert result.stop_reason == "no proposal: stopped before the first iteration (metric calls >= 2)"
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
    assert result.stop_reason is not None
    assert result.stop_reason.startswith("no proposal: every reflection reply was unusable (")
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


def _examples() -> list[dspy.Example]:
    docs = _docs()
    qs = [Question(str(i), "When was Acme founded?", "1999", gold_docids=(f"d{i}",)) for i in range(4)]
    return extractor_examples(qs, docs.__getitem__)


def test_proposal_cost_and_minimum_budget_arithmetic() -> None:
    from kitune.optimizers.gepa import min_metric_calls, proposal_cost

    assert proposal_cost(2, 2) == 6  # parent + child on the minibatch, then the valset
    assert min_metric_calls(2, 2, 1) == 3  # the seed evaluation, then one iteration must start
    assert min_metric_calls(12, 2, 3) == 12 + 2 * 16 + 1 == 45
    assert min_metric_calls(1, 3, 2) == 1 + 7 + 1


def test_a_budget_too_small_to_propose_is_refused_with_the_minimum() -> None:
    examples = _examples()
    lm = RuleLM(extractor_rule)
    opt = GepaOptimizer(extractor_metric, reflection_lm=reflection_lm(), max_metric_calls=2)
    with dspy.context(lm=lm), pytest.raises(ConfigError) as err:
        opt.compile(FactExtractor("Extract facts."), trainset=examples[:2], valset=examples[2:])
    msg = str(err.value)
    assert (
        "max_metric_calls=2 cannot make 1 proposal(s) with a 2-example validation set and minibatch 2" in msg
    )
    assert "the minimum budget is 3" in msg and "--max-metric-calls" in msg
    assert lm.calls == 0  # refused before any metric call
    three = GepaOptimizer(
        extractor_metric, reflection_lm=reflection_lm(), max_metric_calls=14, min_proposals=3
    )
    with pytest.raises(ConfigError, match="the minimum budget is 15"):
        three.compile(FactExtractor("Extract facts."), trainset=examples[:2], valset=examples[2:])


def test_an_unset_budget_is_sized_to_the_minimum_and_proposes() -> None:
    examples = _examples()
    opt = GepaOptimizer(
        extractor_metric, reflection_lm=reflection_lm(), max_metric_calls=None, min_proposals=1
    )
    with dspy.context(lm=RuleLM(extractor_rule)):
        result = opt.compile(FactExtractor("Extract facts."), trainset=examples[:2], valset=examples[2:])
    assert result.details["max_metric_calls"] == 3 and result.details["max_metric_calls_set"] is None
    assert result.details["proposals"] == 1 and result.details["proposals_accepted"] == 1
    assert result.metric_calls == 2 + 2 + 2 + 2  # seed, parent, child, child on the valset
    assert result.improved and result.stop_reason is None


def test_a_compile_without_a_proposal_says_every_minibatch_was_perfect() -> None:
    examples = _examples()
    opt = GepaOptimizer(extractor_metric, reflection_lm=reflection_lm(), max_metric_calls=6)
    with dspy.context(lm=RuleLM(extractor_rule)):
        result = opt.compile(
            FactExtractor("Extract facts with DATES."), trainset=examples[:2], valset=examples[2:]
        )
    assert result.stop_reason == "no proposal: every minibatch already scored perfectly (2 of 2 iterations)"
    assert result.details["proposals"] == 0 and result.details["skipped"] == {"all_scores_perfect": 2}
    assert result.metric_calls == 6


def test_a_cut_off_reflection_reply_is_unusable_and_costs_no_metric_call() -> None:
    examples = _examples()
    cut = RuleLM(lambda system, user: {"new_instruction": "Extract every fact (with DATES of"}, json=True)
    opt = GepaOptimizer(extractor_metric, reflection_lm=cut, max_metric_calls=6)
    with dspy.context(lm=RuleLM(extractor_rule)):
        result = opt.compile(FactExtractor("Extract facts."), trainset=examples[:2], valset=examples[2:])
    assert result.details["proposals"] == 0 and not result.improved
    assert result.best_candidate == {"extract": "Extract facts."}
    assert result.stop_reason is not None and result.stop_reason.startswith(
        "no proposal: every reflection reply was unusable"
    )
    assert result.stop_reason.endswith(
        "(4/4): ValueError: unusable reflection reply for extract: cut off: 1 '(' but 0 ')' outside quotes"
    )
    # the seed evaluation (2) and one parent minibatch per iteration (2 each), never a child;
    # gepa asks twice per iteration (its batched call, then the per-task retry)
    assert result.metric_calls == 6 and cut.calls == 4
    assert (result.details["reflection_calls"], result.details["reflection_failures"]) == (4, 4)


def test_no_proposal_reasons_for_the_seed_evaluation_and_mixed_iterations() -> None:
    from kitune.optimizers.gepa import ProposalLog, SizedInstructionProposer, _stop_reason

    proposer = SizedInstructionProposer()
    log = ProposalLog()
    assert _stop_reason(proposer, None, log, 12, 12, 12) == (
        "no proposal: budget spent on the seed evaluation (12 of 12 metric calls; the validation set has 12 "
        "examples)"
    )
    log.iterations, log.skipped = 3, {"all_scores_perfect": 1}
    proposer.calls, proposer.failures, proposer.errors = 2, 1, ["ValueError: bad"]
    assert _stop_reason(proposer, None, log, 20, 20, 4) == (
        "no proposal in 3 iterations: 1 minibatch(es) already perfect, 0 without trajectories, 1 reflection "
        "failure(s), 1 reflection(s) without a new instruction"
    )
    log.proposals = 1
    assert _stop_reason(proposer, None, log, 20, 20, 4) is None


def test_a_metric_of_the_wrong_arity_and_a_missing_reflection_lm_are_config_errors() -> None:
    def three(gold: object, pred: object, trace: object) -> float:
        return 1.0

    with pytest.raises(ConfigError) as err:
        GepaOptimizer(three, reflection_lm=reflection_lm(), max_metric_calls=8)
    msg = str(err.value)
    assert msg.startswith(
        "GEPA metric three(gold, pred, trace) cannot be called as "
        "metric(gold, pred, trace, pred_name, pred_trace)"
    )
    assert "give the extra parameters defaults" in msg
    with pytest.raises(ConfigError, match=r"GEPA needs a reflection LM .* set lm\.reflection\.model"):
        GepaOptimizer(extractor_metric, reflection_lm=None, max_metric_calls=8)


def test_threads_give_the_same_result_as_one_thread() -> None:
    # issue 22 item 2: metric calls on several threads, results identical to the sequential run
    examples = _examples()
    runs = []
    for threads in (1, 4):
        opt = GepaOptimizer(
            extractor_metric,
            reflection_lm=reflection_lm(),
            max_metric_calls=12,
            rng=random.Random(1),
            num_threads=threads,
        )
        with dspy.context(lm=RuleLM(extractor_rule)):
            runs.append(
                opt.compile(FactExtractor("Extract facts."), trainset=examples[:2], valset=examples[2:])
            )
    one, four = runs
    assert (
        four.best_candidate
        == one.best_candidate
        == {"extract": "Extract every fact, with DATES of every event."}
    )
    assert [(h.candidate, h.score, h.metric_calls) for h in four.history] == [
        (h.candidate, h.score, h.metric_calls) for h in one.history
    ]
    assert four.metric_calls == one.metric_calls and four.stop_reason == one.stop_reason


def test_the_token_cap_on_the_ledger_stops_gepa() -> None:
    # issue 24 item 5: the one stopper kitune adds to gepa's, wired to the token ledger, fires
    from kitune.optimizers.budget import OptimizerBudget
    from kitune.optimizers.gepa import make_gepa
    from kitune.usage import CallRecord, TokenLedger

    examples = _examples()
    ledger = TokenLedger()

    def metric(
        gold: object, pred: object, trace: object = None, name: object = None, pt: object = None
    ) -> object:
        ledger.record(
            CallRecord(role="extract", stage="optimize", model="m", input_tokens=1000, output_tokens=5)
        )
        return extractor_metric(gold, pred, trace, name, pt)

    budget = OptimizerBudget(max_metric_calls=50, max_input_tokens=2500)
    opt = make_gepa(
        metric,
        reflection_lm=reflection_lm(),
        budget=budget,
        rng=random.Random(1),
        input_tokens=lambda: ledger.totals()["input_tokens"],
    )
    with dspy.context(lm=RuleLM(extractor_rule)):
        result = opt.compile(FactExtractor("Extract facts."), trainset=examples[:2], valset=examples[2:])
    # seed 2 calls (2,000 tokens < 2,500), then one iteration of 6 calls; the cap stops the next one
    assert result.stop_reason == "input tokens >= 2500"
    assert result.metric_calls == 8 and result.improved
    with pytest.raises(ConfigError, match="needs the token ledger"):
        make_gepa(metric, reflection_lm=reflection_lm(), budget=budget, rng=random.Random(1))


# --- issue 40: the metric's return type, an unknown reflection window, a context overflow -------


def test_a_dict_returning_metric_is_refused_when_gepa_starts_naming_the_type() -> None:
    examples = _examples()

    def as_dict(gold, pred, trace=None, pred_name=None, pred_trace=None):  # type: ignore[no-untyped-def]
        return {"score": 1.0, "feedback": "fine"}

    task_lm, refl = RuleLM(extractor_rule), reflection_lm()
    opt = GepaOptimizer(as_dict, reflection_lm=refl, max_metric_calls=12)
    with dspy.context(lm=task_lm), pytest.raises(ConfigError) as err:
        opt.compile(FactExtractor("Extract facts."), trainset=examples[:2], valset=examples[2:])
    assert str(err.value).startswith(
        "GEPA metric as_dict returned dict ({'score': 1.0, 'feedback': 'fine'}) on the first validation "
        "example: a metric returns a float (or int/bool) or dspy.Prediction(score=<float>, feedback=<str>)"
    )
    assert task_lm.calls == 1 and refl.calls == 0  # one scripted program call, no budget spent


def test_a_prediction_with_a_numeric_score_passes_the_start_check() -> None:
    from kitune.optimizers.base import check_metric_returns

    example = _examples()[0]
    with dspy.context(lm=RuleLM(extractor_rule)):
        assert check_metric_returns(
            "GEPA", extractor_metric, FactExtractor("Extract facts."), example, arguments=5
        )
        with pytest.raises(ConfigError, match=r"returned Prediction \(Prediction\(\s*score='high'"):
            check_metric_returns(
                "GEPA",
                lambda g, p, t, n, pt: dspy.Prediction(score="high", feedback="f"),
                FactExtractor("Extract facts."),
                example,
                arguments=5,
            )


def test_an_unknown_window_is_bounded_and_an_overflow_shrinks_the_next_prompt() -> None:
    from kitune.errors import LMContextWindowError
    from kitune.optimizers.gepa import DEFAULT_REFLECTION_CONTEXT_TOKENS, SizedInstructionProposer

    seen: list[int] = []

    def small_window(system: str, user: str) -> dict[str, object]:
        seen.append(len(user))
        if len(user) > 5_000:  # the provider's real limit, unknown to kitune
            raise LMContextWindowError("the prompt does not fit m's context window", model="m")
        return {"new_instruction": "Extract every fact, with DATES of every event."}

    examples = [{"Inputs": {"text": "x" * 5000}, "Generated Outputs": "y", "Feedback": "z"}] * 10
    proposer = SizedInstructionProposer(context_tokens=None, reply_tokens=1024)
    assert (proposer.window_known, proposer.context_tokens) == (False, DEFAULT_REFLECTION_CONTEXT_TOKENS)
    assert proposer.prompt_tokens == 8192 - 1024 - 400
    with dspy.context(lm=RuleLM(small_window, json=True)):
        with pytest.raises(Exception) as err:  # step 1: overflow, retried at half, overflow: skipped
            proposer({"extract": "Extract facts."}, {"extract": examples}, ["extract"])
        assert isinstance(err.value.__cause__, LMContextWindowError)  # DSPy wraps the LM's error
        assert proposer.prompt_tokens == (8192 - 1024 - 400) // 4
        proposed = proposer({"extract": "Extract facts."}, {"extract": examples}, ["extract"])  # step 2
    assert proposed == {"extract": "Extract every fact, with DATES of every event."}
    assert (proposer.calls, proposer.overflows, proposer.failures) == (3, 2, 1)
    assert len(seen) == 3 and seen[0] > seen[1] > 5_000 > seen[2]
    assert seen[0] < (8192 - 1024) * 4  # bounded although the examples hold over 50,000 characters
    assert proposer.errors == ["LMUnexpectedError: [dummy] the prompt does not fit m's context window"]
