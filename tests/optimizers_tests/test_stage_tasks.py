"""The extractor's and rewriter's stage tasks: examples, Pareto sizing, coverage and recall@k metrics."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import dspy
import pytest

from kitune.data.loaders import Question
from kitune.ki import KI
from kitune.optimizers.gepa import min_metric_calls, pareto_size
from kitune.optimizers.stage_tasks import (
    RewriterRecall,
    coverable_documents,
    coverage_examples,
    coverage_metric,
    imperfect,
    order_ids,
    recall_examples,
    recall_metric,
)
from kitune.schema import Document

DOCS = {
    "d1": Document(
        docid="d1", title="Curie", text="Marie Curie was born in Warsaw. She moved to Paris in 1891."
    ),
    "d2": Document(docid="d2", title="Tower", text="The tower opened in 1889. It stands in Paris."),
    "d3": Document(docid="d3", title="Lake", text="The lake is deep."),  # states no answer
}
QS = [
    Question("q1", "Where was Marie Curie born?", "Warsaw", gold_docids=("d1",), evidence_docids=("d1",)),
    Question("q2", "When did the tower open?", "1889", gold_docids=("d2",), evidence_docids=("d2",)),
    Question("q3", "Is the lake deep?", "yes", gold_docids=("d3",), evidence_docids=("d3",)),
    Question("q4", "How deep is the lake?", "40 m", gold_docids=("d3",), evidence_docids=("d3",)),
]


def _ki(docid: str, title: str) -> KI:
    return KI.from_fact(
        title=title,
        description=title,
        subject=title.split()[0],
        predicate="states",
        obj=title.split()[-1].rstrip("."),
        evidence=[title],
        confidence=80,
        docid=docid,
    )


def test_pareto_size_fits_the_budget_to_min_proposals() -> None:
    assert pareto_size(20, cap=6, max_metric_calls=None, minibatch=2, proposals=3) == 6
    assert min_metric_calls(4, 2, 3) == 21 and min_metric_calls(5, 2, 3) == 24
    assert pareto_size(20, cap=6, max_metric_calls=22, minibatch=2, proposals=3) == 4
    assert pareto_size(3, cap=6, max_metric_calls=None, minibatch=2, proposals=3) == 3
    assert pareto_size(20, cap=6, max_metric_calls=5, minibatch=2, proposals=3) == 1  # GEPA then refuses it
    assert pareto_size(0, cap=6, max_metric_calls=None, minibatch=2, proposals=3) == 0


def test_order_ids_puts_priority_first_then_a_seeded_shuffle() -> None:
    ids = [f"d{i}" for i in range(8)]
    a = order_ids(ids, ["d5", "x", "d2"], "0:extractor:1")
    assert a[:2] == ["d5", "d2"] and sorted(a) == sorted(ids)
    assert a == order_ids(ids, ["d5", "d2"], "0:extractor:1")
    assert a != order_ids(ids, ["d5", "d2"], "0:extractor:2")  # another iteration, another order


def test_coverage_examples_are_the_coverable_gold_documents() -> None:
    # d3 is gold for a yes/no question and for one whose answer it does not state: not coverable
    assert coverable_documents(QS, DOCS.__getitem__) == ["d1", "d2"]
    exs = coverage_examples(QS, DOCS.__getitem__, first=["d2"], outcomes={"d2": "never surfaced"}, seed=0)
    assert [e.docid for e in exs] == ["d2", "d1"]
    assert exs[0].outcome == "never surfaced" and exs[1].outcome == ""
    assert set(exs[0].inputs().keys()) == {"docid", "text", "url", "title"}


def test_coverage_metric_scores_one_document_and_names_the_missed_sentence() -> None:
    metric = coverage_metric(QS)
    gold = coverage_examples(QS, DOCS.__getitem__, seed=0, outcomes={"d1": "the agent answered 'Paris'"})
    d1 = next(e for e in gold if e.docid == "d1")
    missed = metric(d1, dspy.Prediction(kis=[_ki("d1", "Marie Curie moved to Paris.")], status="ok"))
    assert missed.score == 0.0
    assert missed.feedback == (
        "Document d1: no fact states 'Warsaw'; it is in \"Marie Curie was born in Warsaw.\"\n"
        "With the current instruction's KIs: the agent answered 'Paris'"
    )
    hit = metric(d1, dspy.Prediction(kis=[_ki("d1", "Marie Curie was born in Warsaw.")], status="partial"))
    assert hit.score == 1.0
    assert (
        "every answer it states is in a fact (1)" in hit.feedback and "cut at its token limit" in hit.feedback
    )
    failed = metric(d1, dspy.Prediction(kis=[], status="failed", result=SimpleNamespace(error="bad JSON")))
    assert failed.score == 0.0 and failed.feedback.startswith("Extraction failed: bad JSON.")


def test_imperfect_is_the_trainset_unless_everything_is_perfect() -> None:
    assert imperfect([1, 2, 3], lambda x: 1.0 if x != 2 else 0.5) == [2]
    assert imperfect([1, 2], lambda x: 1.0) == [1, 2]


class _Lookup:
    def __init__(self, docs: list[list[str]]) -> None:
        self.docs = docs
        self.calls: list[tuple[Any, str]] = []

    def __call__(self, rewriter: Any, question: str) -> Any:
        self.calls.append((rewriter, question))
        kis = [
            SimpleNamespace(id=f"k{i}", title=f"fact {i}", evidence_doc_ids=d)
            for i, d in enumerate(self.docs)
        ]
        plan = SimpleNamespace(entity_tags=("entity:marie-curie",), lexical="Curie born", semantic="born")
        return SimpleNamespace(kis=kis, plan=plan, rewrite_fell_back=False, rewrite_reason=None)


def test_rewriter_recall_is_one_lookup_scored_by_reciprocal_rank() -> None:
    from kitune.programs.query_rewriter import QueryRewriter

    exs = recall_examples(
        QS[:2],
        first=["q2"],
        seed=0,
        describe=lambda d: f'"{DOCS[d].title}" (document {d})',
        notes={"q2": "oob"},
    )
    assert [e.query_id for e in exs] == ["q2", "q1"] and exs[0].note == "oob"
    lookup = _Lookup([["d9"], ["d1", "d5"], ["d1"]])
    module = RewriterRecall(QueryRewriter("Plan the look-up."), lookup=lookup)
    assert [n for n, _ in module.named_predictors()] == ["rewriter.planner"]
    pred = module(**exs[1].inputs())
    assert len(lookup.calls) == 1 and lookup.calls[0][1] == QS[0].query
    metric = recall_metric(3)
    got = metric(exs[1], pred)
    assert got.score == 0.5
    assert got.feedback.startswith(
        'A KI of the gold document "Curie" (document d1) came back at rank 2 of 3.'
    )
    assert "entity tags [entity:marie-curie]" in got.feedback
    miss = metric(exs[0], pred)  # q2's gold d2 is nowhere
    assert miss.score == 0.0
    assert miss.feedback.splitlines()[0] == (
        "None of the top 3 KIs cites the gold document \"Tower\" (document d2). Got: 'fact 0' (document d9); "
        "'fact 1' (document d1, d5); 'fact 2' (document d1)."
    )
    assert miss.feedback.splitlines()[-1] == "oob"
    assert recall_metric(1)(exs[1], pred).score == 0.0  # rank 2 is outside k = 1
    with pytest.raises(ValueError, match="k=0"):
        recall_metric(0)


def test_split_examples_gives_gepa_a_pareto_set_the_budget_can_pay_for() -> None:
    from kitune.optimizers.budget import OptimizerBudget
    from kitune.optimizers.improvers.prompts import split_examples
    from kitune.optimizers.program_spec import TaskSetup

    def split(budget: OptimizerBudget, setup: TaskSetup) -> tuple[list[Any], list[Any]]:
        return split_examples(setup, budget, max_pareto=6)  # optimize.max_pareto_examples

    examples = list(range(10))
    setup = TaskSetup(module=None, examples=examples[:3], metric=lambda *a: 0.0, valset=examples)
    train, val = split(OptimizerBudget(min_proposals=3), setup)
    assert train == [0, 1, 2] and val == [0, 1, 2, 3, 4, 5]  # unset budget: the cap; GEPA sizes the budget
    train, val = split(OptimizerBudget(max_metric_calls=22, min_proposals=3), setup)
    assert val == [0, 1, 2, 3]  # 4 examples: 3·4 + 9 = 21 ≤ 22 calls
    # the trainset (the examples the current instruction gets wrong) at the end of the valset
    # order: up to half of the Pareto set is theirs, so a proposal that fixes them can beat the seed
    late = TaskSetup(module=None, examples=[9, 7, 8], metric=lambda *a: 0.0, valset=examples)
    assert split(OptimizerBudget(min_proposals=3), late)[1] == [9, 7, 8, 0, 1, 2]
    paid = OptimizerBudget(max_metric_calls=22, min_proposals=3)
    assert split(paid, late)[1] == [9, 7, 0, 1]
    one = TaskSetup(module=None, examples=[5], metric=lambda *a: 0.0, valset=examples)
    assert split(OptimizerBudget(), one)[1] == [5, 0, 1, 2, 3, 4]
    everything = TaskSetup(module=None, examples=examples, metric=lambda *a: 0.0, valset=examples)
    assert split(OptimizerBudget(), everything)[1] == [0, 1, 2, 3, 4, 5]
    old_style = TaskSetup(module=None, examples=examples, metric=lambda *a: 0.0)
    train, val = split(OptimizerBudget(), old_style)
    assert train == [0, 1, 2, 3, 4] and val == [5, 6, 7, 8, 9]
