"""The loop under the stage decision rule (issue 36): per-question stage values decide; recorded."""

from __future__ import annotations

import json
from pathlib import Path

from kitune.evaluation.report import summarize
from kitune.evaluation.stage_metrics import StageReport
from kitune.evaluation.trace import Trace
from kitune.optimizers.loop import Evaluation, Proposal, Setting, run_loop
from kitune.testing.tracking import RecordingTracker

N = 50


def _traces(right: set[int], split: str) -> tuple[Trace, ...]:
    return tuple(
        Trace(
            query_id=f"{split}{i}",
            skill="in-context",
            question="q",
            gold_answer="g",
            status="answered",
            judge_correct=i in right,
            judge_status="graded",
        )
        for i in range(N)
    )


class StageEnv:
    """50 questions per split. The rewriter prompt's last word picks its per-question reciprocal ranks.

    ``seed``: 0.5 on even questions, 0 on odd ones. ``better``: 1.0 on the first 40, seed values
    after. ``noise``: the seed's values shifted one question along (same mean, nothing better).
    End-to-end: the same 10 questions right for every prompt.
    """

    def __init__(self, proposal: str) -> None:
        self.proposal = proposal

    def _rr(self, word: str, split: str) -> dict[str, float]:
        seed = {f"{split}{i}": 0.5 if i % 2 == 0 else 0.0 for i in range(N)}
        if word == "better":
            return {q: 1.0 if i < 40 else v for i, (q, v) in enumerate(seed.items())}
        if word == "noise":
            return {f"{split}{i}": 0.5 if i % 2 == 1 else 0.0 for i in range(N)}
        return seed

    def evaluate(self, setting: Setting, split: str) -> Evaluation:
        word = setting.prompts["rewriter"].split()[-1]
        traces = _traces(set(range(10)), split)
        stages = StageReport(split, (), {"rewriter_mrr": self._rr(word, split)})
        return Evaluation(summarize(traces, split), traces, {}, stages=stages)

    def improve(
        self, setting: Setting, tune: Evaluation, iteration: int, *, ledger: object = None
    ) -> Proposal:
        text = f"Plan the look-ups for every question, naming its entities: {self.proposal}"
        return Proposal(Setting({**setting.prompts, "rewriter": text}, setting.knobs))


START = Setting({"rewriter": "Plan the look-ups for every question, naming its entities: seed"})


def test_a_rewriter_better_on_40_of_50_questions_is_accepted_with_its_numbers(tmp_path: Path) -> None:
    tracker = RecordingTracker()
    res = run_loop(StageEnv("better"), START, iterations=1, state_dir=tmp_path, tracker=tracker)
    (rec,) = res.history
    assert rec.decision == "accepted" and rec.accepted
    (d,) = rec.decisions
    assert d["change"] == "rewriter" and d["outcome"] == "accepted"
    assert d["test"]["n"] == N and d["test"]["better"] == 40 and d["test"]["worse"] == 0
    assert d["end_to_end"]["n"] == N and d["end_to_end"]["effect"] == 0.0
    m = tracker.by_name("iteration-0").metrics
    assert m["decision_rewriter_accepted"] == 1.0 and m["decision_rewriter_n"] == float(N)
    assert (
        m["decision_rewriter_p"] == 1 / 4001
    )  # 40 non-zero differences: 4,000 seeded sign flips, none as high
    state = json.loads((tmp_path / "loop_state.json").read_text())
    assert state["history"][0]["decisions"][0]["outcome"] == "accepted"


def test_a_noise_rewriter_keeps_the_incumbent_and_says_why(tmp_path: Path) -> None:
    tracker = RecordingTracker()
    res = run_loop(StageEnv("noise"), START, iterations=1, state_dir=tmp_path, tracker=tracker)
    (rec,) = res.history
    assert rec.decision == "not_enough_evidence" and not rec.accepted
    assert rec.reason.startswith("rewriter: kept the incumbent: not enough evidence (+0.000, p = ")
    assert res.setting == START
    assert tracker.by_name("iteration-0").metrics["not_enough_evidence"] == 1.0


def test_the_permissive_rule_is_still_there_by_name(tmp_path: Path) -> None:
    res = run_loop(
        StageEnv("noise"),
        START,
        iterations=1,
        state_dir=tmp_path,
        tracker=RecordingTracker(),
        decision_rule="permissive",
    )
    (rec,) = res.history
    assert rec.decision == "rejected" and not rec.decisions  # same end-to-end: not better
