"""Improvers receive data and return proposals (issue 38, item 4).

An improver is handed a frozen :class:`ImproveInput` and a read-only view; it returns an
:class:`Improvement` with its scores and never reaches back into the loop: no agent run, no KI
write, no gate, no ledger note. These tests give each built-in improver an input object, a
scripted evaluator for the one capability it needs, and an environment double that fails on any
other call.
"""

from __future__ import annotations

import dataclasses
import importlib
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

import pytest
from opt_fakes import RuleLM

from kitune.config import KituneConfig
from kitune.data.loaders import Question
from kitune.errors import DocumentNotFoundError
from kitune.evaluation.report import summarize
from kitune.optimizers.budget import OptimizerBudget
from kitune.optimizers.feedback import Failure
from kitune.optimizers.improve_env import ImproveInput, Improvement
from kitune.optimizers.improver import get_improver, register_improver, run_improvers, unregister_improver
from kitune.optimizers.ledger import FailureLedger
from kitune.optimizers.program_task import PROGRAM_TASKS, register_program_task, unregister_program_task
from kitune.optimizers.setting import Evaluation, Setting
from kitune.schema import Document


@dataclass(frozen=True)
class _Options:
    optimizer: str = "gepa"
    programs: tuple[str, ...] = ()
    knob_trials: int = 0
    feedback: bool = False
    run_name: str = "t"


class _LoopDouble:
    """An environment that fails on any member except the ones a test scripts (``allowed``)."""

    def __init__(self, **allowed: Any) -> None:
        self._allowed = allowed
        self.used: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._allowed:
            raise AssertionError(f"the improver reached into the loop: env.{name}")
        self.used.append(name)
        return self._allowed[name]


def _input(tmp_path: Path, questions: tuple[Question, ...] = (), **kw: Any) -> ImproveInput:
    cfg = KituneConfig(workdir=tmp_path / "w", corpus_name="t")
    tune = Evaluation(summarize([], "tune"))
    return ImproveInput(
        Setting({"extractor": "E"}),
        tune,
        3,
        questions=questions,
        cfg=cfg,
        budget=OptimizerBudget(max_metric_calls=12, min_proposals=1),
        state_dir=tmp_path / "state",
        **kw,
    )


def test_the_input_is_frozen_and_its_documents_read_only(tmp_path: Path) -> None:
    doc = Document("d1", "Tom opened the bakery in 1932.")
    inp = _input(tmp_path, options=_Options(), documents=MappingProxyType({"d1": doc}))
    assert inp.get_document("d1") is doc
    with pytest.raises(DocumentNotFoundError):
        inp.get_document("d2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        inp.iteration = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        inp.documents["d2"] = doc  # type: ignore[index]


def test_disambiguation_proposes_the_routed_failures_and_touches_neither_loop_nor_ledger(
    tmp_path: Path,
) -> None:
    ledger = FailureLedger()
    ledger.note_feedback(0, "q2", "Ann", ["k1"], None)  # q2 had one attempt at the same answer
    failures = tuple(
        Failure(qid, f"{qid}?", "Tom", prediction, ("d1",))
        for qid, prediction in (("q1", "Bob"), ("q2", "Ann"), ("q3", ""), ("q4", "Sue"))
    )
    kinds = {"q1": "wrong_entity", "q2": "wrong_entity", "q3": "wrong_entity", "q4": "no_candidate"}
    inp = _input(
        tmp_path,
        options=_Options(feedback=True),
        failures=failures,
        kinds=MappingProxyType(kinds),
        ledger=ledger,
    )
    before = ledger.to_dict()
    env = _LoopDouble()  # any call fails
    out = get_improver("disambiguation").improve(env, inp)  # type: ignore[arg-type]
    assert [f.query_id for f in out.feedback] == ["q1"]
    assert out.metrics == {
        "feedback_skipped_same_wrong_answer": 1.0,
        "feedback_skipped_blank_answer": 1.0,
        "feedback_skipped_no_candidate": 1.0,
    }
    assert not out.prompts and not out.knobs and not out.notes
    assert env.used == [] and ledger.to_dict() == before


def test_knob_tuning_scores_its_proposal_with_the_scripted_look_up_only(tmp_path: Path) -> None:
    questions = (Question("q1", "Who opened the bakery?", "Tom"), Question("q2", "When?", "1932"))
    asked: list[dict[str, float]] = []

    def lookup_texts(setting: Setting, query: str, knobs: Mapping[str, float]) -> list[str]:
        asked.append(dict(knobs))
        # the scripted retrieval finds the answers only with a heavy tag weight
        if knobs["retrieval.tag_weight"] > 1.0:
            return ["Tom opened the bakery in 1932."]
        return ["A bakery."]

    env = _LoopDouble(lookup_texts=lookup_texts)
    inp = _input(tmp_path, questions, options=_Options(knob_trials=12))
    out = get_improver("knobs").improve(env, inp)  # type: ignore[arg-type]
    assert set(env.used) == {"lookup_texts"}
    assert out.metrics["knob_trials"] == 12.0
    assert out.metrics["knob_baseline"] == 0.0  # the configured tag weight (1.0) finds nothing
    assert out.metrics["knob_best"] == 1.0
    assert out.knobs["retrieval.tag_weight"] > 1.0
    assert out.notes["knob_best_params"] == out.knobs
    assert asked[0]["retrieval.tag_weight"] == 1.0  # the incumbent is the first trial
    assert (tmp_path / "state" / "knobs.journal").is_file()


@pytest.fixture
def toy_program() -> Iterator[ModuleType]:
    module = importlib.import_module("toy_program")  # registers ``toy`` on first import
    if "toy" not in PROGRAM_TASKS:
        register_program_task(module.TOY)
    yield module
    unregister_program_task("toy")


def test_prompt_optimisation_returns_a_proposal_with_its_stage_scores(
    tmp_path: Path, toy_program: ModuleType
) -> None:
    task_lm = RuleLM(lambda system, user: toy_program.toy_rule(system, user) or {})
    reflection = RuleLM(
        lambda system, user: {"new_instruction": "List the facts and DATES of the toy text."}, json=True
    )
    logged: list[str] = []
    env = _LoopDouble(
        rng=random.Random(0), log=logged.append, input_tokens_used=lambda: 0
    )  # the seed source, the progress line, the token count; nothing else
    questions = tuple(Question(f"q{i}", f"toy text {i}", "x") for i in range(4))
    inp = _input(
        tmp_path,
        questions,
        options=_Options(programs=("toy",)),
        lms=MappingProxyType({"extract": task_lm, "reflection": reflection}),
    )
    inp = dataclasses.replace(inp, setting=Setting({"toy": toy_program.START}))
    out = get_improver("prompts").improve(env, inp)  # type: ignore[arg-type]
    assert out.prompts == {"toy": "List the facts and DATES of the toy text."}
    assert out.metrics["toy_baseline_score"] == 0.0 and out.metrics["toy_best_score"] == 1.0
    assert out.metrics["toy_proposals"] >= 1.0 and "toy" in out.programs
    assert set(env.used) <= {"rng", "log", "input_tokens_used"}
    assert inp.setting.prompts == {"toy": toy_program.START}  # the input is left as it was
    assert any("optimise toy with gepa" in line for line in logged)


class _AsksForFeedback:
    name = "asks-for-feedback"

    def improve(self, env: Any, inp: ImproveInput) -> Improvement:
        return Improvement(metrics={"asked": 1.0}, feedback=inp.failures)


class _Records:
    name = "records"

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def improve(self, env: Any, inp: ImproveInput) -> Improvement:
        self.seen.append("records ran")
        return Improvement(knobs={"retrieval.rrf_k": 7})


def test_the_loop_applies_feedback_as_each_improver_returns(tmp_path: Path) -> None:
    seen: list[str] = []

    def apply(imp: Improvement) -> Improvement:  # the loop's side: write, gate, note (scripted)
        seen.append(f"applied {[f.query_id for f in imp.feedback]}")
        return dataclasses.replace(imp, metrics={**imp.metrics, "feedback_written": 1.0})

    register_improver(_AsksForFeedback())
    register_improver(_Records(seen))
    try:
        failures = (Failure("q1", "q1?", "Tom", "Bob", ("d1",)),)
        inp = _input(tmp_path, options=_Options(), failures=failures)
        proposal = run_improvers(_LoopDouble(), inp, ["asks-for-feedback", "records"], apply=apply)  # type: ignore[arg-type]
        # applied before the next improver ran; its metrics are the improvement's
        assert seen == ["applied ['q1']", "records ran"]
        assert proposal.metrics == {"asked": 1.0, "feedback_written": 1.0}
        assert dict(proposal.setting.knobs) == {"retrieval.rrf_k": 7}
        seen.clear()
        run_improvers(_LoopDouble(), inp, ["records"], apply=apply)  # type: ignore[arg-type]
        assert seen == ["records ran"]  # nothing asked: apply is not called
    finally:
        unregister_improver("asks-for-feedback")
        unregister_improver("records")
