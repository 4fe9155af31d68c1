"""Tests for kitune.optimizers.stopping."""

from __future__ import annotations

import pytest

from kitune.optimizers.stopping import (
    AnyOf,
    MaxCostUsd,
    MaxInputTokens,
    MaxMetricCalls,
    NoImprovement,
    OptimizationProgress,
    Stopper,
    Timeout,
    stop_reason,
)


def test_budget_stoppers() -> None:
    p = OptimizationProgress(metric_calls=200, cost_usd=0.5, input_tokens=10_000)
    assert MaxMetricCalls(200)(p) and not MaxMetricCalls(201)(p)
    assert MaxCostUsd(0.5)(p) and not MaxCostUsd(0.51)(p)
    assert MaxInputTokens(10_000)(p) and not MaxInputTokens(10_001)(p)
    for bad in (
        lambda: MaxMetricCalls(0),
        lambda: MaxCostUsd(0),
        lambda: MaxInputTokens(-1),
        lambda: NoImprovement(0),
        lambda: Timeout(0),
        lambda: AnyOf(),
    ):
        with pytest.raises(ValueError):
            bad()


@pytest.mark.parametrize(
    ("scores", "patience", "min_delta", "stop"),
    [
        ((), 1, 0.0, False),
        ((0.5,), 1, 0.0, False),
        ((0.5, 0.5), 1, 0.0, True),
        ((0.5, 0.6), 1, 0.0, False),
        ((0.5, 0.6, 0.6, 0.55), 2, 0.0, True),
        ((0.5, 0.6, 0.6, 0.61), 2, 0.0, False),
        ((0.5, 0.6, 0.6, 0.61), 2, 0.05, True),
    ],
)
def test_no_improvement(scores: tuple[float, ...], patience: int, min_delta: float, stop: bool) -> None:
    assert NoImprovement(patience, min_delta)(OptimizationProgress(scores=scores)) is stop


def test_timeout_with_fake_clock() -> None:
    now = [100.0]
    t = Timeout(30, clock=lambda: now[0])
    assert not t(OptimizationProgress())
    now[0] = 129.9
    assert not t(OptimizationProgress())
    now[0] = 130.0
    assert t(OptimizationProgress()) and t.elapsed_s == 30.0
    t.reset()
    assert not t(OptimizationProgress())


def test_any_of_flattens_and_names_the_stopper_that_fired() -> None:
    combo = MaxMetricCalls(100) | MaxCostUsd(2.0) | NoImprovement(2)
    assert isinstance(combo, AnyOf) and len(combo.stoppers) == 3
    assert isinstance(combo, Stopper)
    p = OptimizationProgress(metric_calls=10, cost_usd=2.5)
    assert combo(p)
    assert stop_reason(combo, p) == "cost >= $2"
    assert stop_reason(combo, OptimizationProgress(metric_calls=10)) is None
    assert combo.describe() == "metric calls >= 100 or cost >= $2 or no improvement for 2 iterations"
    prog = OptimizationProgress(scores=(0.2, 0.4, 0.3))
    assert prog.iteration == 3 and prog.best_score == 0.4


def test_gepa_adapter_reads_gepa_state() -> None:
    from types import SimpleNamespace

    from gepa.utils.stop_condition import StopperProtocol

    from kitune.optimizers.stopping import as_gepa_stopper

    spent = [0.0]
    stopper = as_gepa_stopper(
        MaxMetricCalls(50) | MaxCostUsd(1.0) | NoImprovement(2), cost_usd=lambda: spent[0]
    )
    assert isinstance(stopper, StopperProtocol)
    state = SimpleNamespace(total_num_evals=10, program_full_scores_val_set=[0.3, 0.5])
    assert not stopper(state) and stopper.reason is None
    state.program_full_scores_val_set = [0.3, 0.5, 0.4, 0.5]
    assert stopper(state) and stopper.reason == "no improvement for 2 iterations"
    spent[0] = 1.5
    assert stopper(SimpleNamespace(total_num_evals=1)) and stopper.reason == "cost >= $1"
    assert stopper(SimpleNamespace(total_num_evals=50, program_full_scores_val_set=[]))
