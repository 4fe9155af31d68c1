"""Tests for kitune.optimizers.loop with a fake environment, real MLflow (SQLite) and prompt registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from kitune.evaluation.report import summarize
from kitune.evaluation.trace import Trace
from kitune.optimizers.loop import Evaluation, Proposal, Setting, initial_prompts, run_loop
from kitune.programs.instructions import load_instruction
from kitune.testing.tracking import RecordingTracker
from kitune.tracking.prompts import PromptRegistry, prompt_name
from kitune.tracking.trackers import MlflowTracker


def _traces(n_right: int, n: int, split: str) -> tuple[Trace, ...]:
    return tuple(
        Trace(
            query_id=f"{split}{i}",
            skill="in-context",
            question="q",
            gold_answer="g",
            status="answered",
            exact_answer="g" if i < n_right else "w",
            judge_correct=i < n_right,
            judge_status="graded",
            input_tokens=1000,
        )
        for i in range(n)
    )


def _p(text: str) -> str:
    """A proposal long enough to pass the sanity checks; the score digit stays last."""
    return f"Plan the look-ups for every question, naming its entities. {text}"


class FakeEnv:
    """Accuracy on 4 questions = the digit at the end of the rewriter prompt (out of 4)."""

    def __init__(self, proposals: list[str]) -> None:
        self.proposals = proposals
        self.evaluated: list[tuple[str, str]] = []

    def evaluate(self, setting: Setting, split: str) -> Evaluation:
        self.evaluated.append((setting.key, split))
        last = setting.prompts["rewriter"][-1]
        right = int(last) if last.isdigit() else 1  # the packaged prompt scores 1/4
        traces = _traces(right, 4, split)
        return Evaluation(summarize(traces, split), traces, {"extract_answer_coverage": 0.5})

    def improve(
        self, setting: Setting, tune: Evaluation, iteration: int, *, ledger: object = None
    ) -> Proposal:
        new = Setting({**setting.prompts, "rewriter": self.proposals[iteration]}, setting.knobs)
        return Proposal(new, metrics={"metric_calls": 3.0}, notes={"why": f"iteration {iteration}"})


def test_two_iterations_reject_then_accept_registers_production(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker(uri, experiment="loop-test")
    registry = PromptRegistry(uri)
    start = Setting({"rewriter": _p("Plan the look-ups. 2"), "extractor": "Extract. 0"})
    env = FakeEnv([_p("Plan worse. 1"), _p("Plan better. 3")])
    result = run_loop(
        env,
        start,
        iterations=2,
        state_dir=tmp_path / "loop",
        tracker=tracker,
        registry=registry,
        corpus="fx",
        decision_rule="permissive",  # 4 fake questions: the stage rule cannot accept (test_decision_rule.py)
    )
    assert [r.accepted for r in result.history] == [False, True]
    assert result.setting.prompts["rewriter"] == _p("Plan better. 3")
    r0, r1 = result.history
    # scores are relative to iteration 0's own measurement of the split (same tokens: no token term)
    assert r0.val_score == pytest.approx(0.0) and r0.tune_score == pytest.approx(0.0)
    assert r0.candidate_val_score == pytest.approx(0.25 - 0.5)
    assert r0.decision == "rejected" and r0.paired["broken"] == ["validation1"]
    assert r1.decision == "accepted" and r1.paired["fixed"] == ["validation2"]
    assert r1.candidate_val_score == pytest.approx(0.25)
    assert r1.changed == ("rewriter",) and r1.registered == {"rewriter": 1}

    name = prompt_name("fx", "rewriter")
    prod = registry.get(name, "production")
    assert prod.text == _p("Plan better. 3") and prod.version == 1
    assert set(prod.aliases) == {"candidate", "production"}
    assert prod.tags["kitune.val_score"] == "0.2500"
    assert [v.version for v in registry.versions(name)] == [1]  # the rejected one was never registered

    client = tracker.client
    runs = {r.info.run_name: r for r in client.search_runs([tracker.experiment_id])}
    assert set(runs) == {"iteration-0", "iteration-1"}
    m0, m1 = runs["iteration-0"].data.metrics, runs["iteration-1"].data.metrics
    assert m0["accepted"] == 0.0 and m1["accepted"] == 1.0
    assert m1["candidate_val_accuracy"] == 0.75 and m1["val_accuracy"] == 0.5
    assert m1["tune_input_tokens"] == 4000.0 and m1["improve_metric_calls"] == 3.0
    assert m1["tune_extract_answer_coverage"] == 0.5
    arts = {a.path for a in client.list_artifacts(runs["iteration-1"].info.run_id, "prompts/candidate")}
    assert "prompts/candidate/rewriter.txt" in arts
    assert (tmp_path / "loop" / "curves.md").read_text().count("| accepted |") == 1
    assert (tmp_path / "loop" / "failure_ledger.json").is_file()
    assert (tmp_path / "loop" / "curves.png").is_file()

    # the next start reads production from the registry; unregistered programs stay packaged
    prompts = initial_prompts(["rewriter", "disambiguator"], corpus="fx", registry=registry)
    assert prompts == {
        "rewriter": _p("Plan better. 3"),
        "disambiguator": load_instruction("disambiguator").text,
    }


def test_rejected_candidate_leaves_production_unchanged_and_rerun_resumes(tmp_path: Path) -> None:
    registry = PromptRegistry(f"sqlite:///{tmp_path / 'mlflow.db'}")
    name = prompt_name("fx", "rewriter")
    pv = registry.register(name, _p("Plan. 3"))
    registry.promote(name, pv.version)
    start = Setting(initial_prompts(["rewriter"], corpus="fx", registry=registry))
    assert start.prompts["rewriter"] == _p("Plan. 3")
    tracker = RecordingTracker()
    env = FakeEnv([_p("Plan same score. 3"), _p("Plan worse. 1")])
    result = run_loop(
        env, start, iterations=1, state_dir=tmp_path / "s", tracker=tracker, registry=registry, corpus="fx"
    )
    assert [r.accepted for r in result.history] == [False]  # equal score is not an improvement
    assert registry.get(name, "production").version == 1

    # rerun asking for 2 iterations: the first is not redone
    env2 = FakeEnv([_p("unused. 0"), _p("Plan worse. 1")])
    result2 = run_loop(
        env2, start, iterations=2, state_dir=tmp_path / "s", tracker=tracker, registry=registry, corpus="fx"
    )
    assert len(result2.history) == 2 and not result2.history[1].accepted
    assert result2.history[0] == result.history[0]
    assert registry.get(name, "production").text == _p("Plan. 3")
    assert [r.name for r in tracker.runs] == ["iteration-0", "iteration-1"]


def test_accept_margin(tmp_path: Path) -> None:
    env = FakeEnv([_p("Plan. 3")])
    start = Setting({"rewriter": _p("Plan. 2")})
    res = run_loop(
        env, start, iterations=1, state_dir=tmp_path, tracker=RecordingTracker(), accept_margin=0.3
    )
    assert not res.history[0].accepted  # gain 0.25 < margin 0.3
    with pytest.raises(ValueError, match="iterations"):
        run_loop(env, start, iterations=0, state_dir=tmp_path, tracker=RecordingTracker())
