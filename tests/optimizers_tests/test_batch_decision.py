"""Feedback-KI batches under the stage rule (issue 36): non-inferior on validation, α shared by the round."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from kitune.evaluation.report import summarize
from kitune.evaluation.stage_metrics import StageReport
from kitune.evaluation.trace import Trace
from kitune.optimizers.acceptance import (
    FEEDBACK_BATCH,
    KI_BATCHES_NOTE,
    KIBatch,
    binomial_cdf,
    decide_noninferior,
    noninferiority_test,
    round_tests,
)
from kitune.optimizers.loop import Evaluation, Proposal, Setting, run_loop
from kitune.testing.tracking import RecordingTracker

N = 50
KIS = ("ki-fb1", "ki-fb2")


def _ids(n: int = N) -> list[str]:
    return [f"v{i}" for i in range(n)]


def test_no_change_on_the_split_is_shown_non_inferior_with_an_exact_p() -> None:
    ids = _ids(50)
    same = {q: 0.5 for q in ids}
    test = noninferiority_test(same, same, metric="rewriter_mrr", margin=0.1)
    assert test.p_noninferior == pytest.approx(0.9**50)  # P(Binomial(50, 0.1) ≤ 0 lowered)
    assert (test.effect, test.better, test.worse) == (0.0, 0, 0)
    d = decide_noninferior(FEEDBACK_BATCH, test, tests_in_round=2)
    assert d.outcome == "accepted" and d.alpha == pytest.approx(0.025)
    assert d.reason.startswith("accepted (lowers fewer than 10% of the questions): rewriter_mrr +0.000")
    assert d.to_metrics()["decision_feedback_kis_p"] == pytest.approx(0.9**50)
    # 24 questions can show nothing at α 0.025: even with none lowered p = 0.9^24 = 0.080
    small = noninferiority_test(
        {q: 0.5 for q in _ids(24)}, {q: 0.5 for q in _ids(24)}, metric="m", margin=0.1
    )
    assert decide_noninferior(FEEDBACK_BATCH, small, tests_in_round=2).outcome == "not_enough_evidence"
    # with no margin nothing is shown by an unchanged split
    flat = noninferiority_test(same, same, metric="rewriter_mrr", margin=0.0)
    assert flat.p_noninferior == 1.0
    assert decide_noninferior(FEEDBACK_BATCH, flat).outcome == "not_enough_evidence"


def test_a_batch_that_lowers_ranks_is_rejected_or_not_shown_non_inferior() -> None:
    before = {q: 1.0 for q in _ids()}
    # 6 of 50 questions lose their gold KI: sign test on 6 discordant, p worse = 1/64
    lost = before | {f"v{i}": 0.0 for i in range(6)}
    rej = decide_noninferior(
        FEEDBACK_BATCH, noninferiority_test(before, lost, metric="rewriter_mrr", margin=0.1)
    )
    assert rej.outcome == "rejected"
    assert rej.test is not None and rej.test.p_worse == pytest.approx(1 / 64)
    # 4 of 50 fall from rank 1 to rank 2: p worse = 1/16 > 0.05, but 4 of 50 lowered is no evidence
    # that fewer than 10% are: P(Binomial(50, 0.1) ≤ 4) = 0.43
    halved = before | {f"v{i}": 0.5 for i in range(4)}
    kept = decide_noninferior(
        FEEDBACK_BATCH, noninferiority_test(before, halved, metric="rewriter_mrr", margin=0.1)
    )
    assert kept.outcome == "not_enough_evidence"
    assert kept.reason.startswith(
        "kept the incumbent: not enough evidence that it is not worse (-0.040, p = 0.43;"
    )
    assert kept.test is not None and kept.test.p_noninferior == pytest.approx(binomial_cdf(4, 50, 0.1))


def test_round_tests_counts_batches() -> None:
    assert round_tests(["rewriter", "extractor"], True, 1) == 4
    assert round_tests([], False, 0) == 1


def _traces(split: str) -> tuple[Trace, ...]:
    return tuple(
        Trace(
            query_id=f"{split[0]}{i}",
            skill="in-context",
            question="q",
            gold_answer="g",
            status="answered",
            judge_correct=i < 6,
            judge_status="graded",
        )
        for i in range(N)
    )


class BatchEnv:
    """24 questions per split. Improving writes two feedback KIs (one batch) and proposes a rewriter.

    Validation gold reciprocal ranks: 1.0 on every question, except — while the batch is in the
    store — ``lowered`` questions at ``lowered_to``. The rewriter proposal changes nothing measured.
    End to end: the same 6 questions right whatever happens.
    """

    def __init__(self, lowered: int, lowered_to: float) -> None:
        self.lowered, self.lowered_to = lowered, lowered_to
        self.written = False
        self.retired: list[tuple[list[str], str]] = []

    def _ranks(self, split: str) -> dict[str, float]:
        out = {f"{split[0]}{i}": 1.0 for i in range(N)}
        if self.written and not self.retired:
            out |= {f"{split[0]}{i}": self.lowered_to for i in range(self.lowered)}
        return out

    def evaluate(self, setting: Setting, split: str) -> Evaluation:
        traces = _traces(split)
        stages = StageReport(split, (), {"rewriter_mrr": self._ranks(split)})
        return Evaluation(summarize(traces, split), traces, {}, stages=stages)

    def improve(
        self, setting: Setting, tune: Evaluation, iteration: int, *, ledger: object = None
    ) -> Proposal:
        before = self.evaluate(setting, "validation")
        self.written = True
        batch = KIBatch(
            FEEDBACK_BATCH,
            KIS,
            "rewriter_mrr",
            dict(before.stages.per_question["rewriter_mrr"]) if before.stages else {},
            {t.query_id: float(t.judge_correct or False) for t in before.traces},
        )
        text = "Plan the look-ups for every question, naming its entities: other"
        return Proposal(
            Setting({**setting.prompts, "rewriter": text}, setting.knobs),
            notes={KI_BATCHES_NOTE: [batch.to_dict()]},
        )

    def retire(self, setting: Setting, ki_ids: Sequence[str], *, reason: str = "gate") -> int:
        self.retired.append((list(ki_ids), reason))
        return len(ki_ids)


START = Setting({"rewriter": "Plan the look-ups for every question, naming its entities: seed"})


def test_a_batch_that_changes_no_validation_rank_is_accepted_and_shares_alpha(tmp_path: Path) -> None:
    env = BatchEnv(lowered=0, lowered_to=1.0)
    tracker = RecordingTracker()
    (rec,) = run_loop(env, START, iterations=1, state_dir=tmp_path, tracker=tracker).history
    assert env.retired == []
    rewriter, batch = rec.decisions
    assert rewriter["change"] == "rewriter" and rewriter["outcome"] == "not_enough_evidence"
    assert rewriter["tests_in_round"] == 2 and rewriter["alpha"] == pytest.approx(
        0.025
    )  # Bonferroni with the batch
    assert batch["change"] == FEEDBACK_BATCH and batch["outcome"] == "accepted"
    assert batch["tests_in_round"] == 2 and batch["alpha"] == pytest.approx(0.025)
    assert batch["test"]["n"] == N and batch["test"]["effect"] == 0.0
    assert batch["test"]["p_noninferior"] == pytest.approx(0.9**N)  # none of 50 lowered
    assert batch["end_to_end"]["n"] == N
    assert "feedback KIs: accepted (lowers fewer than 10% of the questions)" in rec.reason
    m = tracker.by_name("iteration-0").metrics
    assert m["decision_feedback_kis_accepted"] == 1.0 and m["decision_feedback_kis_n"] == float(N)
    assert m["decision_feedback_kis_p"] == pytest.approx(0.9**N)
    state = json.loads((tmp_path / "loop_state.json").read_text())
    assert state["history"][0]["decisions"][1]["outcome"] == "accepted"
    assert "feedback KIs: accepted" in (tmp_path / "proposals" / "iteration-0.md").read_text()


def test_a_batch_that_costs_validation_questions_their_gold_kis_is_rejected_and_retired(
    tmp_path: Path,
) -> None:
    env = BatchEnv(lowered=6, lowered_to=0.0)
    tracker = RecordingTracker()
    (rec,) = run_loop(env, START, iterations=1, state_dir=tmp_path, tracker=tracker).history
    assert env.retired == [(list(KIS), "decision")]
    batch = rec.decisions[-1]
    assert batch["outcome"] == "rejected"
    assert batch["reason"].startswith(
        "rejected (worse): rewriter_mrr -6/50 (1.000 → 0.880), n=50, better 0 / worse 6"
    )
    assert batch["test"]["p_worse"] == pytest.approx(1 / 64)
    assert tracker.by_name("iteration-0").metrics["decision_feedback_kis_accepted"] == 0.0
    # the rewriter is compared on the store without the batch (current re-measured after the
    # retirement): no difference, so not the 6 "gains" a stale re-measurement would show
    rewriter = rec.decisions[0]
    assert rewriter["outcome"] == "not_enough_evidence" and rewriter["test"]["better"] == 0
    assert rec.decision == "not_enough_evidence"


def test_a_batch_too_close_to_the_margin_keeps_the_incumbent_store(tmp_path: Path) -> None:
    env = BatchEnv(lowered=4, lowered_to=0.5)
    (rec,) = run_loop(env, START, iterations=1, state_dir=tmp_path, tracker=RecordingTracker()).history
    batch = rec.decisions[-1]
    assert batch["outcome"] == "not_enough_evidence"
    assert batch["reason"].startswith(
        "kept the incumbent: not enough evidence that it is not worse (-0.040, p = 0.43;"
    )
    assert env.retired == [(list(KIS), "decision")]


def test_the_permissive_rule_leaves_batches_to_the_gate(tmp_path: Path) -> None:
    env = BatchEnv(lowered=6, lowered_to=0.0)
    (rec,) = run_loop(
        env, START, iterations=1, state_dir=tmp_path, tracker=RecordingTracker(), decision_rule="permissive"
    ).history
    assert env.retired == [] and rec.decisions == []
