"""kitune.optimizers.stopping: gepa's stop conditions, named; the token cap on the ledger fires."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from gepa.utils.stop_condition import ScoreThresholdStopper, StopperProtocol

from kitune.optimizers.stopping import (
    CompositeStopper,
    MaxInputTokens,
    MaxMetricCallsStopper,
    NoImprovementStopper,
    TimeoutStopCondition,
    combine,
    describe,
    restart,
)
from kitune.usage import CallRecord, TokenLedger


def _spend(ledger: TokenLedger, tokens: int) -> None:
    ledger.record(
        CallRecord(role="extract", stage="optimize", model="m", input_tokens=tokens, output_tokens=1)
    )


def test_the_token_cap_counts_the_ledger_from_its_restart() -> None:
    ledger = TokenLedger()
    _spend(ledger, 700)  # before the run: not counted
    cap = MaxInputTokens(1000, lambda: ledger.totals()["input_tokens"])
    assert isinstance(cap, StopperProtocol)
    assert not cap(None) and cap.spent == 0
    _spend(ledger, 999)
    assert not cap(None) and cap.spent == 999
    _spend(ledger, 1)
    assert cap(None) and cap.spent == 1000
    cap.restart()
    assert not cap(None) and cap.spent == 0
    with pytest.raises(ValueError, match="limit must be >= 1"):
        MaxInputTokens(0, lambda: 0)


def test_combine_is_gepas_composite_stopper_naming_the_first_that_fired() -> None:
    tokens = [0]
    stop, reason = combine(
        MaxMetricCallsStopper(50), MaxInputTokens(100, lambda: tokens[0]), NoImprovementStopper(5)
    )
    assert isinstance(stop, CompositeStopper) and stop.mode == "any"
    state = SimpleNamespace(total_num_evals=10, program_full_scores_val_set=[0.3])
    assert not stop(state) and reason.text is None
    tokens[0] = 150
    assert stop(state) and reason.text == "input tokens >= 100"
    assert stop(SimpleNamespace(total_num_evals=50, program_full_scores_val_set=[0.3]))
    assert reason.text == "metric calls >= 50"


def test_describe_and_restart() -> None:
    timeout = TimeoutStopCondition(120)
    assert describe(timeout) == "timeout after 120 s"
    assert describe(NoImprovementStopper(3)) == "no improvement for 3 iterations"
    assert describe(ScoreThresholdStopper(0.9)) == "validation score >= 0.9"
    assert describe(object()) == "object"
    timeout.start_time -= 1000  # as if constructed long ago
    assert timeout(None)
    restart(timeout)
    assert not timeout(None) and time.time() - timeout.start_time < 5
