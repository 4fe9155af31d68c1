"""The review queue under the configured decision rule (issue 36): three outcomes with their numbers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from kitune.config import KituneConfig
from kitune.data.loaders import Question
from kitune.evaluation.metrics import Trace
from kitune.retrieval.base import Store
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryStore
from kitune.service.workflows.proposals import Proposal
from kitune.service.workflows.review import measure_effect
from kitune.testing.store_contract import make_ki

CITIES = tuple(
    f"{a}{b}ville" for a in ("Lo", "Na", "Li", "Re", "Di", "Br") for b in ("ra", "mo", "ku", "te", "si")
)
"""30 made-up names: a KI batch needs n ≥ 29 labelled questions to show anything at α 0.05 (0.9^n ≤ 0.05)."""


def _world(n: int) -> tuple[MemoryStore, list[Question]]:
    store = MemoryStore(HashEmbedder())
    store.upsert(
        [
            make_ki(f"Painter {c}", f"born in {c}", docid=f"d{i}", predicate="born_in")
            for i, c in enumerate(CITIES[:n])
        ]
    )
    questions = [
        Question(f"q{i}", f"Where was Painter {c} born?", f"born in {c}", gold_docids=(f"d{i}",))
        for i, c in enumerate(CITIES[:n])
    ]
    return store, questions


def _add_unrelated() -> Proposal:
    ki = make_ki("Bridge Zeta", "steel", docid="dz", predicate="made_of")
    return Proposal(
        id="p-add",
        kind="add_ki",
        title="add a fact no labelled question asks about",
        evidence=[],
        change={"docid": "dz", "kis": [ki.model_dump(mode="json")], "answers": []},
        diff="",
        change_keys=[f"add_ki:{ki.id}"],
    )


def _evaluator(right: dict[str, set[str]]):  # type: ignore[no-untyped-def]
    """Each arm (``-current`` / ``-proposal``) answers right exactly the questions listed for it."""

    def evaluate(questions: Sequence[Question], kis: Store, rewriter: str | None, label: str) -> list[Trace]:
        ok = right["proposal" if label.endswith("-proposal") else "current"]
        return [
            Trace(
                query_id=q.query_id,
                skill="in-context",
                question=q.query,
                gold_answer=q.answer,
                status="answered",
                exact_answer=q.answer if q.query_id in ok else "no",
                em=q.query_id in ok,
            )
            for q in questions
        ]

    return evaluate


def test_a_ki_change_that_moves_no_gold_rank_on_30_questions_is_accepted_with_its_numbers(
    tmp_path: Path,
) -> None:
    store, questions = _world(30)
    same = {f"q{i}" for i in range(4)}
    cfg = KituneConfig(workdir=tmp_path / "w")  # decision_rule: stage (the default)
    effect = measure_effect(
        cfg,
        _add_unrelated(),
        questions,
        store=store,
        evaluate=_evaluator({"current": same, "proposal": same}),
    )
    assert effect["rule"] == "stage"
    assert effect["decision"]["outcome"] == "accepted"
    (change,) = effect["decision"]["changes"]
    assert change["change"] == "add_ki" and change["tests_in_round"] == 1
    assert change["test"]["metric"] == "rewriter_mrr" and change["test"]["n"] == 30
    assert change["test"]["effect"] == 0.0 and change["test"]["p_noninferior"] == pytest.approx(0.9**30)
    assert change["end_to_end"]["n"] == 30 and change["end_to_end"]["effect"] == 0.0
    assert effect["decision"]["reason"].startswith(
        "accepted (lowers fewer than 10% of the questions): rewriter_mrr +0/30"
    )


def test_two_labelled_questions_cannot_show_anything_so_the_incumbent_is_kept(tmp_path: Path) -> None:
    store, questions = _world(2)
    cfg = KituneConfig(workdir=tmp_path / "w")
    effect = measure_effect(
        cfg,
        _add_unrelated(),
        questions,
        store=store,
        evaluate=_evaluator({"current": set(), "proposal": {"q0"}}),
    )
    assert effect["decision"]["outcome"] == "not_enough_evidence"
    assert effect["decision"]["reason"].startswith(
        "kept the incumbent: not enough evidence that it is not worse (+0/2, p = 0.81;"
    )
    # the old rule, by name: the same measurement is accepted (+1 fixed, nothing broken)
    old = KituneConfig(workdir=tmp_path / "w", optimize={"decision_rule": "permissive"})
    effect = measure_effect(
        old,
        _add_unrelated(),
        questions,
        store=store,
        evaluate=_evaluator({"current": set(), "proposal": {"q0"}}),
    )
    assert effect["rule"] == "permissive" and effect["decision"]["outcome"] == "accepted"
    assert "changes" not in effect["decision"]


def _rewriter_feedback() -> Proposal:
    return Proposal(
        id="p-rw",
        kind="rewriter_feedback",
        title="rewriter feedback",
        evidence=[],
        change={
            "prompt": "kitune-corpus-rewriter",
            "base_version": None,
            "base_text": "Turn the question into a search query plan naming its entities.",
            "new_text": "Turn the question into a search query plan naming every entity and date.",
            "queries": [],
        },
        diff="",
        change_keys=["rewriter_feedback:x"],
    )


def test_rewriter_feedback_is_decided_by_a_one_sided_sign_test_and_shares_alpha(tmp_path: Path) -> None:
    store, questions = _world(8)
    cfg = KituneConfig(workdir=tmp_path / "w")
    better = _evaluator({"current": set(), "proposal": {f"q{i}" for i in range(6)}})
    effect = measure_effect(cfg, _rewriter_feedback(), questions, store=store, evaluate=better)
    (change,) = effect["decision"]["changes"]
    assert effect["decision"]["outcome"] == "accepted"  # 6 of 6 discordant: p = 1/64 ≤ 0.05
    assert change["test"]["metric"] == "end_to_end_accuracy" and change["test"]["p_better"] == pytest.approx(
        1 / 64
    )
    # four proposals measured in one filing share alpha: 1/64 > 0.05 / 4
    shared = measure_effect(
        cfg, _rewriter_feedback(), questions, store=store, evaluate=better, tests_in_round=4
    )
    assert shared["decision"]["outcome"] == "not_enough_evidence"
    assert shared["decision"]["changes"][0]["alpha"] == pytest.approx(0.05 / 4)
    worse = _evaluator({"current": {f"q{i}" for i in range(6)}, "proposal": set()})
    rejected = measure_effect(cfg, _rewriter_feedback(), questions, store=store, evaluate=worse)
    assert rejected["decision"]["outcome"] == "rejected"
    assert rejected["decision"]["reason"].startswith("rewriter: rejected (worse): end_to_end_accuracy -6/8")
