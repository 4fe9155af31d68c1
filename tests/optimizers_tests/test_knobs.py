"""Tests for kitune.optimizers.knobs (case M3 and the all-trials-failed reserve case)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from kitune.config import KituneConfig, load_config
from kitune.errors import OptimizationError
from kitune.optimizers.knobs import DEFAULT_KNOBS, FloatKnob, IntKnob, KnobSpace, KnobStudy

SMALL = KnobSpace(
    (IntKnob("retrieval.rrf_k", 10, 120, step=10), FloatKnob("retrieval.semantic_weight", 0.0, 2.0))
)


def quadratic(params: dict[str, int | float]) -> float:
    """Deterministic objective, best at rrf_k=60, semantic_weight=2 (module-level: picklable)."""
    return -((float(params["retrieval.rrf_k"]) - 60.0) ** 2) / 1000.0 + float(
        params["retrieval.semantic_weight"]
    )


def always_fails(params: dict[str, int | float]) -> float:
    raise RuntimeError("LLM gateway down")


def returns_nan(params: dict[str, int | float]) -> float:
    return float("nan")


def test_default_space_fits_the_config_and_loads_as_overrides() -> None:
    space = KnobSpace()
    assert space.keys == tuple(k.key for k in DEFAULT_KNOBS)
    assert set(space.keys) == {
        "extraction.max_facts_per_doc",
        "retrieval.branch_size",
        "retrieval.rrf_k",
        "retrieval.tag_weight",
        "retrieval.lexical_weight",
        "retrieval.semantic_weight",
        "retrieval.confidence_floor",
        "agent.max_steps",
    }
    cfg = KituneConfig()
    space.check_against(cfg)
    trial = optuna.trial.FixedTrial(
        {
            "extraction.max_facts_per_doc": 7,
            "retrieval.branch_size": 30,
            "retrieval.rrf_k": 40,
            "retrieval.tag_weight": 0.5,
            "retrieval.lexical_weight": 1.5,
            "retrieval.semantic_weight": 1.0,
            "retrieval.confidence_floor": 20,
            "agent.max_steps": 12,
        }
    )
    params = space.suggest(trial)
    loaded = load_config(None, params)
    assert (loaded.retrieval.rrf_k, loaded.extraction.max_facts_per_doc, loaded.agent.max_steps) == (
        40,
        7,
        12,
    )
    assert loaded.retrieval.lexical_weight == 1.5


def test_enqueue_current_config_scores_the_baseline_first(tmp_path: Path) -> None:
    cfg = load_config(None, {"retrieval.rrf_k": 60, "retrieval.semantic_weight": 1.25})
    study = KnobStudy(tmp_path / "base.journal", "knobs", space=SMALL)
    assert SMALL.current(cfg) == {"retrieval.rrf_k": 60, "retrieval.semantic_weight": 1.25}
    study.enqueue(SMALL.current(cfg))
    first = study.optimize(quadratic, n_trials=1)[0]
    assert dict(first.params) == {"retrieval.rrf_k": 60, "retrieval.semantic_weight": 1.25}
    assert first.value == pytest.approx(1.25)
    study.enqueue(SMALL.current(cfg))  # already tried: skipped on resume
    assert dict(study.optimize(quadratic, n_trials=1)[0].params) != dict(first.params)


def test_space_validation_errors() -> None:
    cfg = KituneConfig()
    with pytest.raises(ValueError, match="not a config field"):
        KnobSpace((IntKnob("retrieval.nope", 1, 2),)).check_against(cfg)
    with pytest.raises(ValueError, match="bound 5000"):
        KnobSpace((IntKnob("retrieval.rrf_k", 1, 5000),)).check_against(cfg)
    with pytest.raises(ValueError, match="duplicate"):
        KnobSpace((IntKnob("a.b", 1, 2), IntKnob("a.b", 1, 3)))
    with pytest.raises(ValueError, match="invalid IntKnob"):
        IntKnob("a.b", 5, 1)


@pytest.mark.parametrize("filename", ["knobs.journal", "knobs.db"])
def test_optimize_and_resume_after_reopening(tmp_path: Path, filename: str) -> None:
    path = tmp_path / filename
    first = KnobStudy(path, "knobs", space=SMALL, seed=1)
    ran = first.optimize(quadratic, n_trials=4, n_jobs=2 if filename.endswith(".db") else 1)
    assert [t.state for t in ran] == ["COMPLETE"] * 4
    again = KnobStudy(path, "knobs", space=SMALL, seed=1)
    assert [t.number for t in again.trials()] == [0, 1, 2, 3]
    more = again.optimize(quadratic, n_trials=2)
    assert [t.number for t in more] == [4, 5]
    best = again.best()
    assert best.value == max(t.value for t in again.trials() if t.value is not None)
    assert best.value == pytest.approx(quadratic(dict(best.params)))


def test_all_trials_failing_gives_a_clear_error(tmp_path: Path) -> None:
    study = KnobStudy(tmp_path / "fail.journal", "knobs", space=SMALL)
    with pytest.raises(
        OptimizationError, match=r"all 3 knob trials .* failed: RuntimeError: LLM gateway down"
    ):
        study.optimize(always_fails, n_trials=3)
    with pytest.raises(OptimizationError, match=r"no completed trial .*3 failed"):
        study.best()
    with pytest.raises(OptimizationError, match="not a number"):
        study.optimize(returns_nan, n_trials=1)
    assert [t.state for t in study.trials()] == ["FAIL"] * 4


def test_parallel_processes_on_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "par.journal"
    study = KnobStudy(path, "knobs", space=SMALL)
    study.create()  # the parent creates the study before any worker starts
    ran = study.optimize_parallel(quadratic, n_workers=4, trials_per_worker=5)
    states = [t.state for t in ran]
    assert len(states) == 20 and states.count("COMPLETE") == 20 and states.count("FAIL") == 0
    assert sorted(t.number for t in ran) == list(range(20))
    resumed = KnobStudy(path, "knobs", space=SMALL)
    assert len(resumed.trials()) == 20
    assert resumed.best().value == pytest.approx(max(t.value for t in ran if t.value is not None))


def test_parallel_refuses_sqlite(tmp_path: Path) -> None:
    with pytest.raises(OptimizationError, match="single-process"):
        KnobStudy(tmp_path / "k.db", "knobs", space=SMALL).optimize_parallel(
            quadratic, n_workers=2, trials_per_worker=1
        )
