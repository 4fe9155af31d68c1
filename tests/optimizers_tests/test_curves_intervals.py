"""Issue 37 (3): Wilson intervals never cross their point; curves draw runs of any size."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kitune.evaluation.summary import wilson_interval
from kitune.optimizers.curves import _error_bars, write_curves
from kitune.optimizers.loop_state import IterationRecord

Z = 1.959963984540054


def _wilson_by_bisection(k: int, n: int) -> tuple[float, float]:
    """The Wilson bounds as the roots of |p̂ − x| = z·sqrt(x(1 − x)/n), found by bisection."""
    p = k / n

    def f(x: float) -> float:
        return (p - x) ** 2 - Z * Z * x * (1 - x) / n

    def root(a: float, b: float) -> float:
        for _ in range(200):
            m = (a + b) / 2
            if (f(a) > 0) == (f(m) > 0):
                a = m
            else:
                b = m
        return (a + b) / 2

    low = 0.0 if k == 0 else root(0.0, p)
    high = 1.0 if k == n else root(p, 1.0)
    return low, high


@pytest.mark.parametrize("n", range(1, 51))
def test_wilson_matches_its_definition_and_contains_its_point(n: int) -> None:
    for k in range(n + 1):
        low, high = wilson_interval(k, n)
        ref_low, ref_high = _wilson_by_bisection(k, n)
        assert low == pytest.approx(ref_low, abs=1e-9) and high == pytest.approx(ref_high, abs=1e-9)
        assert 0.0 <= low <= k / n <= high <= 1.0, (k, n, low, high)


def test_wilson_endpoints_are_exact() -> None:
    for n in (1, 2, 3, 5, 7, 49):
        assert wilson_interval(0, n)[0] == 0.0
        assert wilson_interval(n, n)[1] == 1.0
    # the float noise of the closed form in the issue (5.55e-17 above 0, 0.9999999999999999 below 1)
    assert wilson_interval(0, 5)[0] == 0.0 and wilson_interval(5, 5)[1] == 1.0
    assert wilson_interval(1, 1) == (pytest.approx(0.2065493143772375), 1.0)
    assert math.isclose(wilson_interval(0, 1)[1], 1 - 0.2065493143772375)


def test_wilson_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="k=3"):
        wilson_interval(3, 2)


def test_error_bars_clamp_stored_noise() -> None:
    # intervals as an older loop_state.json may hold them: a float's breadth across the point
    lo, hi = _error_bars([0.0, 1.0, 0.5], [(5.55e-17, 0.43), (0.57, 0.9999999999999999), None])
    assert lo == [0.0, pytest.approx(0.43), 0.0]
    assert hi == [pytest.approx(0.43), 0.0, 0.0]
    assert min(lo + hi) >= 0.0


def _record(i: int, acc: float, ci: tuple[float, float], n: int) -> IterationRecord:
    return IterationRecord(
        iteration=i,
        current_key="s0",
        candidate_key="s0",
        tune_score=0.0,
        val_score=0.0,
        candidate_val_score=0.0,
        accepted=False,
        reason="kept",
        changed=(),
        tune_accuracy=acc,
        val_accuracy=acc,
        tune_ci=ci,
        val_ci=ci,
        n_tune=n,
        n_val=n,
    )


def test_curves_plot_a_one_question_run_with_noisy_intervals(tmp_path: Path) -> None:
    history = [_record(0, 0.0, (5.55e-17, 0.79), 1), _record(1, 1.0, (0.21, 0.9999999999999999), 1)]
    md, png = write_curves(history, tmp_path)
    assert png is not None and png.stat().st_size > 0
    assert "of 1" in md.read_text(encoding="utf-8")
