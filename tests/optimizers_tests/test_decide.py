"""acceptance.decide owns the whole accept rule: outages, no change, sanity, write-only, paired."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kitune.optimizers.acceptance import PairedComparison, decide

BASE = PairedComparison(
    n_pairs=10,
    fixed=("q1", "q2"),
    broken=("q3",),
    current_accuracy=0.5,
    candidate_accuracy=0.6,
    accuracy_diff=0.1,
    ci_low=-0.1,
    ci_high=0.3,
    mcnemar_p=1.0,
    token_ratio=1.0,
    timeout_rate_diff=0.0,
    score_diff=0.1,
    current_failed_share=0.0,
    candidate_failed_share=0.0,
)
NUMBERS = (
    "score +0.100 (margin 0.0), accuracy +0.10 [95% CI -0.10, +0.30], fixed 2 / broken 1, McNemar p=1.00, "
    "tokens ×1.00, n=10"
)


@pytest.mark.parametrize(
    ("kwargs", "comparison", "expected"),
    [
        ({"changed_programs": ["rewriter"]}, BASE, ("accepted", NUMBERS)),
        (
            {"changed_programs": ["rewriter"]},
            replace(BASE, candidate_failed_share=0.3),
            (
                "undecided",
                "30% of the validation questions failed (LLM calls did not go through; limit 20%): "
                "no decision on this run",
            ),
        ),
        (  # the tuning run's outage wins over everything but a validation outage
            {"changed_programs": [], "tune_failed_share": 0.5},
            BASE,
            ("undecided", "50% of the tuning questions failed (limit 20%): no decision on this run"),
        ),
        ({}, BASE, ("rejected", "the proposal changes nothing")),
        ({"knobs_changed": True}, BASE, ("accepted", NUMBERS)),
        (
            {
                "changed_programs": ["rewriter"],
                "sanity_problems": ["rewriter: too short: 2 characters (minimum 40)"],
            },
            BASE,
            ("rejected", "failed sanity checks: rewriter: too short: 2 characters (minimum 40)"),
        ),
        (
            {"changed_programs": ["rewriter"], "margin": 0.2},
            BASE,
            ("rejected", "not better: " + NUMBERS.replace("margin 0.0", "margin 0.2")),
        ),
        (
            {"changed_programs": ["rewriter"]},
            replace(BASE, fixed=("q1",), broken=("q2", "q3")),
            (
                "rejected",
                "breaks more questions than it fixes: "
                + NUMBERS.replace("fixed 2 / broken 1", "fixed 1 / broken 2"),
            ),
        ),
        (
            {"changed_programs": ["rewriter"], "require_significance": True},
            BASE,
            ("rejected", "not significant: " + NUMBERS),
        ),
        (  # write-only: the validation runs are one run; the program's own metric decides
            {
                "changed_programs": ["disambiguator"],
                "reads_changed": False,
                "task_metrics": {"disambiguator_best_score": 1.0, "disambiguator_baseline_score": 0.5},
            },
            replace(BASE, score_diff=0.0, fixed=(), broken=()),
            ("accepted", "task metric improved (disambiguator 0.5 → 1.0); validation reads no change"),
        ),
        (
            {
                "changed_programs": ["disambiguator"],
                "reads_changed": False,
                "task_metrics": {"disambiguator_best_score": 0.5},
            },
            replace(BASE, score_diff=0.0),
            ("rejected", "task metric not improved (disambiguator None → 0.5); validation reads no change"),
        ),
    ],
)
def test_the_accept_rule(
    kwargs: dict[str, object], comparison: PairedComparison, expected: tuple[str, str]
) -> None:
    d = decide(comparison, **kwargs)  # type: ignore[arg-type]
    assert (d.outcome, d.reason) == expected
    assert d.accepted == (expected[0] == "accepted")
