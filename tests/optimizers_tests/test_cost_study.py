"""The cost study (issue 39.3): seeded two-objective TPE in SQLite, resumed; Pareto front; the pick."""

from __future__ import annotations

from pathlib import Path

import pytest

from kitune.errors import OptimizationError
from kitune.optimizers.cost_study import COST_KNOBS, CostStudy
from kitune.optimizers.knobs import FloatKnob, IntKnob, KnobSpace

SPACE = KnobSpace(
    (IntKnob("retrieval.default_size", 3, 15), FloatKnob("retrieval.semantic_weight", 0.0, 2.0))
)


def scripted(params: dict[str, int | float]) -> tuple[float, float]:
    """More KIs find more answers and cost more tokens; the semantic weight helps up to 1.2."""
    k, w = int(params["retrieval.default_size"]), float(params["retrieval.semantic_weight"])
    rate = min(1.0, 0.3 + 0.04 * k - 0.1 * abs(w - 1.2))
    return round(rate, 6), 60.0 * k + 5.0 * w


def _interrupted(path: Path) -> CostStudy:
    """6 trials, the process ends, a new one reopens the storage and runs 6 more."""
    CostStudy(path, "cost", space=SPACE, seed=7).optimize(scripted, 6)
    resumed = CostStudy(path, "cost", space=SPACE, seed=7)
    assert [t.number for t in resumed.trials()] == list(range(6))  # the earlier trials are there
    resumed.optimize(scripted, 6)
    return resumed


def test_resumes_from_storage_and_gives_the_same_best_trial_for_a_fixed_seed(tmp_path: Path) -> None:
    a, b = _interrupted(tmp_path / "a.db"), _interrupted(tmp_path / "b.db")
    assert len(a.trials()) == 12
    assert [t.params for t in a.trials()] == [t.params for t in b.trials()]  # seeded: the same trials
    best = a.choose(0.7)
    assert best == b.choose(0.7) and best.rate >= 0.7
    assert best == CostStudy(tmp_path / "a.db", "cost", space=SPACE, seed=7).choose(0.7)  # read back
    assert all(not (t.rate >= best.rate and t.tokens < best.tokens) for t in a.trials())


def test_pareto_front_and_constrained_choice(tmp_path: Path) -> None:
    study = CostStudy(tmp_path / "s.sqlite", "cost", space=SPACE, seed=0)
    study.enqueue({"retrieval.default_size": 10, "retrieval.semantic_weight": 1.2})
    study.optimize(scripted, 10)
    first = study.trials()[0]
    assert first.params == {"retrieval.default_size": 10, "retrieval.semantic_weight": 1.2}
    assert (first.rate, first.tokens) == (0.7, 606.0)
    front = study.pareto()
    for t in study.trials():
        if t not in front:
            assert any(p.rate >= t.rate and p.tokens <= t.tokens for p in front)
    chosen = study.choose(first.rate)
    assert chosen in front and chosen.rate >= 0.7 and chosen.tokens <= first.tokens
    png = study.plot(tmp_path / "pareto.png", reference=first, chosen=chosen)
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(OptimizationError, match=r"no trial of 'cost' reaches rate 1\.5"):
        study.choose(1.5)


def test_bad_storage_and_failing_objective(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="SQLite"):
        CostStudy(tmp_path / "x.journal", "cost")
    study = CostStudy(tmp_path / "f.db", "cost", space=SPACE)
    with pytest.raises(OptimizationError, match="not two finite numbers"):
        study.optimize(lambda p: (float("nan"), 1.0), 2)
    assert "retrieval.rrf_k" in COST_KNOBS.keys and "agent.max_steps" not in COST_KNOBS.keys
