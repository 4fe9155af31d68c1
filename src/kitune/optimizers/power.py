"""Power before a run: the smallest effect each decision of the loop can detect, and a noise simulation.

**Minimum detectable effect** (one-sided test at level ``α' = α / m`` — ``m`` the changes a
round tests, Bonferroni —, power ``1 − β``, ``n`` paired validation questions)::

    MDE = (z(1 − α') + z(1 − β)) · σ_d / √n,      σ_d² = 2 · s² · (1 − ρ)

``s²`` is the incumbent's per-question variance of the metric (``p(1 − p)`` for a 0/1 metric
such as answer coverage or accuracy; the sample variance for the reciprocal rank), ``ρ`` the
correlation between incumbent and candidate per question (prior 0.5, so ``σ_d = s``), ``z`` the
standard normal quantile. It is the normal approximation of the tests in
:mod:`kitune.optimizers.acceptance` (sign test, sign-flip permutation). ``s`` comes from the
incumbent's stage metrics in the run's evaluation cache when it has them (``<state>/evals/
stages-*-validation.json``, ``loop_state.json``), else from :data:`PRIOR_SD`. The end-to-end
non-inferiority check gets the same formula with ``α`` (not divided): the smallest margin a
candidate exactly as good as the incumbent passes with the stated power.

**No decision possible**: a 0/1 metric's exact sign test cannot reach ``α'`` with fewer than
``log2(1/α')`` questions (its smallest p-value is ``2^−n``), and an MDE at or above the metric's
range (1.0) cannot be shown either; :func:`power_table` flags both.

:func:`noise_false_accept_rate` measures a rule's chance of accepting anything in rounds of
pure-noise proposals (same accuracy as the incumbent, answers partly shared with it); the tests
and ``docs/loop-stages.md`` quote it for the stage rule and the permissive one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np

from kitune.evaluation.trace import Trace
from kitune.optimizers.acceptance import (
    STAGE_METRICS,
    compare_paired,
    decide,
    decide_change,
    decide_noninferior,
    decide_round,
    noninferiority_test,
    paired_test,
)

__all__ = [
    "PRIOR_SD",
    "DecisionPower",
    "batch_round_false_accept_rate",
    "measured_sd",
    "minimum_detectable_effect",
    "noise_false_accept_rate",
    "permissive_round",
    "power_lines",
    "power_table",
    "stage_round",
]

PRIOR_SD: dict[str, float] = {
    "extractor_answer_coverage": 0.5,
    "rewriter_mrr": 0.37,
    "end_to_end_accuracy": 0.5,
}
"""Per-question standard deviation assumed when no cache has the incumbent's: 0.5 for 0/1
metrics (the largest, p = 0.5), 0.37 for the reciprocal rank (the seed's validation MRR in
experiments/loop-dev-48-pareto, 0.428 [0.282–0.575] over 24 questions ⇒ s = 0.146·√24/1.96;
loop-dev-48's own re-measurement gives 0.44, see experiments/decision-reanalysis/power.md)."""

PRIOR_RHO = 0.5
"""Prior correlation of incumbent and candidate per question (σ_d² = 2s²(1 − ρ) = s²)."""

_Z = NormalDist()


def minimum_detectable_effect(
    n: int, sd: float, *, alpha: float = 0.05, tests: int = 1, power: float = 0.8, rho: float = PRIOR_RHO
) -> float:
    """``(z(1 − α/tests) + z(power)) · sqrt(2·sd²·(1 − rho)) / sqrt(n)`` (module docstring).

    Args:
        n: paired questions, ≥ 1.
        sd: the incumbent's per-question standard deviation, ≥ 0.
        alpha: one-sided round-level α, 0–0.5.
        tests: changes tested in the round (Bonferroni divisor), ≥ 1.
        power: 1 − β, 0.5–1.
        rho: incumbent–candidate correlation per question, −1–1.

    Returns:
        The effect in the metric's unit (may exceed the metric's range: nothing detectable).

    Raises:
        ValueError: an argument out of range.
    """
    if n < 1 or sd < 0 or not 0 < alpha < 0.5 or tests < 1 or not 0.5 <= power < 1 or not -1 <= rho <= 1:
        raise ValueError(
            f"n={n}, sd={sd}, alpha={alpha}, tests={tests}, power={power}, rho={rho}: need n ≥ 1, sd ≥ 0, "
            "0 < alpha < 0.5, tests ≥ 1, 0.5 ≤ power < 1, −1 ≤ rho ≤ 1"
        )
    sd_diff = math.sqrt(2.0 * sd * sd * (1.0 - rho))
    return (_Z.inv_cdf(1.0 - alpha / tests) + _Z.inv_cdf(power)) * sd_diff / math.sqrt(n)


@dataclass(frozen=True)
class DecisionPower:
    """One row of the power table."""

    decision: str
    """``rewriter prompt``, ``extractor prompt``, ``end-to-end non-inferiority`` …"""
    metric: str
    n: int
    sd: float
    source: str
    """Where ``sd`` came from: ``measured (<file>)`` or ``prior``."""
    alpha: float
    """The level this decision's test must reach (α / tests, or α for non-inferiority)."""
    mde: float
    possible: bool
    """False when no outcome on ``n`` questions could reach ``alpha`` or the MDE is ≥ 1."""
    note: str = ""

    def row(self) -> str:
        """A Markdown table row."""
        mde = f"{self.mde:.3f}" if self.possible else f"{self.mde:.3f} (no decision possible)"
        return (
            f"| {self.decision} | {self.metric} | {self.n} | {self.sd:.3f} ({self.source}) | "
            f"{self.alpha:.4f} | {mde} |"
        )


def measured_sd(state_dir: Path | None) -> dict[str, tuple[float, str]]:
    """The incumbent's per-question standard deviations found in a run's cache.

    Reads the newest ``<state_dir>/evals/stages-*-validation.json`` (answer coverage ``p`` ⇒
    ``sqrt(p(1−p))``; MRR from its normal interval: ``half·sqrt(n)/1.96``) and the last
    iteration's validation accuracy in ``<state_dir>/loop_state.json``. Unreadable files are skipped.

    Returns:
        metric → (sd, source); empty when nothing is cached.
    """
    out: dict[str, tuple[float, str]] = {}
    if state_dir is None or not state_dir.is_dir():
        return out
    files = sorted((state_dir / "evals").glob("stages-*-validation.json"), key=lambda p: p.stat().st_mtime)
    for path in reversed(files):
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
            rows = rows["metrics"] if isinstance(rows, dict) else rows
            by = {(r["stage"], r["name"]): r for r in rows}
        except (OSError, ValueError, KeyError, TypeError):
            continue
        cov = by.get(("extractor", "answer_coverage"))
        if cov and cov.get("value") is not None:
            p = float(cov["value"])
            out["extractor_answer_coverage"] = (math.sqrt(p * (1 - p)), f"measured, {path.name}")
        mrr = by.get(("rewriter", "mrr"))
        if mrr and mrr.get("value") is not None and int(mrr.get("n") or 0) > 1:
            m, lo, hi = float(mrr["value"]), float(mrr["ci_low"] or 0.0), float(mrr["ci_high"] or 0.0)
            half = m - lo if lo > 0 else hi - m
            out["rewriter_mrr"] = (
                half * math.sqrt(int(mrr["n"])) / 1.959963984540054,
                f"measured, {path.name}",
            )
        break
    state = state_dir / "loop_state.json"
    try:
        history = json.loads(state.read_text(encoding="utf-8")).get("history") or []
        acc = history[-1].get("candidate_val_accuracy" if history[-1].get("accepted") else "val_accuracy")
        if acc is not None:
            out["end_to_end_accuracy"] = (math.sqrt(acc * (1 - acc)), "measured, loop_state.json")
    except (OSError, ValueError, AttributeError, IndexError, TypeError):
        pass
    return out


def power_table(
    *,
    n_validation: int,
    programs: Sequence[str],
    alpha: float = 0.05,
    power: float = 0.8,
    noninferiority_margin: float = 0.10,
    knobs: bool = False,
    measured: dict[str, tuple[float, str]] | None = None,
    n_end_to_end: int | None = None,
) -> list[DecisionPower]:
    """The MDE of each decision the loop will make in a round (see the module docstring).

    Args:
        n_validation: validation questions (each stage decision is paired on them).
        programs: the tuned programs; those with a stage metric (extractor, rewriter) are decisions.
        alpha: round-level one-sided α.
        power: 1 − β.
        noninferiority_margin: the end-to-end margin (a note says when it is below what ``n`` shows).
        knobs: knobs are tuned too (one more decision, on end-to-end accuracy).
        measured: :func:`measured_sd` (None or missing metrics: :data:`PRIOR_SD`).
        n_end_to_end: questions the end-to-end check runs on (None: ``n_validation``).

    Returns:
        One :class:`DecisionPower` per decision, then the end-to-end non-inferiority row.
    """
    measured = measured or {}
    decisions = [(f"{p} prompt", STAGE_METRICS[p]) for p in programs if p in STAGE_METRICS]
    if knobs:
        decisions.append(("knobs", "end_to_end_accuracy"))
    tests = max(1, len(decisions))
    level = alpha / tests
    rows: list[DecisionPower] = []
    for decision, metric in decisions:
        sd, source = measured.get(metric) or (PRIOR_SD[metric], "prior")
        n = max(1, n_validation)
        mde = minimum_detectable_effect(n, sd, alpha=alpha, tests=tests, power=power)
        binary = metric != "rewriter_mrr"
        reachable = 0.5**n_validation <= level
        possible = n_validation > 0 and reachable and mde < 1.0
        note = (
            ""
            if reachable
            else f"even {n_validation}/{n_validation} better gives p = {0.5**n_validation:.3g}"
        )
        if not binary and not reachable:
            note = f"even {n_validation} questions all better gives p = {0.5**n_validation:.3g}"
        rows.append(DecisionPower(decision, metric, n_validation, sd, source, level, mde, possible, note))
    n_e2e = n_validation if n_end_to_end is None else n_end_to_end
    if n_e2e <= 0:
        skipped = "no end-to-end questions: the non-inferiority check is skipped (stage decisions alone)"
        rows.append(
            DecisionPower(
                "end-to-end non-inferiority", "end_to_end_accuracy", 0, 0.0, "-", alpha, 0.0, True, skipped
            )
        )
        return rows
    sd, source = measured.get("end_to_end_accuracy") or (PRIOR_SD["end_to_end_accuracy"], "prior")
    shown = minimum_detectable_effect(max(1, n_e2e), sd, alpha=alpha, power=power)
    note = (
        f"an equally good candidate fails the {noninferiority_margin} margin more often than {1 - power:.0%}"
        if shown > noninferiority_margin
        else ""
    )
    rows.append(
        DecisionPower(
            "end-to-end non-inferiority",
            "end_to_end_accuracy",
            n_e2e,
            sd,
            source,
            alpha,
            shown,
            n_e2e > 0,
            note,
        )
    )
    return rows


# -- the noise simulation ------------------------------------------------------------------------

RoundRule = Callable[[Sequence[float], Sequence[Sequence[float]]], bool]
"""(incumbent's 0/1 values, each proposal's 0/1 values on the same questions) → accepted any."""


def stage_round(alpha: float = 0.05, min_effect: float = 0.02) -> RoundRule:
    """The stage rule on a round: :func:`~kitune.optimizers.acceptance.decide_round` (Bonferroni)."""

    def rule(current: Sequence[float], proposals: Sequence[Sequence[float]]) -> bool:
        ids = [str(i) for i in range(len(current))]
        cur = dict(zip(ids, current, strict=True))
        tests = [
            (
                f"p{j}",
                paired_test(
                    cur, dict(zip(ids, y, strict=True)), metric="accuracy", alpha=alpha, resamples=100
                ),
            )
            for j, y in enumerate(proposals)
        ]
        return any(d.outcome == "accepted" for d in decide_round(tests, alpha=alpha, min_effect=min_effect))

    return rule


def _traces(values: Sequence[float]) -> list[Trace]:
    return [
        Trace(str(i), "in-context", "q", "a", status="answered", judge_correct=bool(v), judge_status="graded")
        for i, v in enumerate(values)
    ]


def permissive_round(current: Sequence[float], proposals: Sequence[Sequence[float]]) -> bool:
    """The permissive rule (the loop's rule before issue 36) on a round: accepted when ``decide`` accepts any.

    Each proposal is compared with :func:`~kitune.optimizers.acceptance.compare_paired` and decided
    with :func:`~kitune.optimizers.acceptance.decide` (margin 0, no significance); the round
    accepts when any proposal is accepted (the best one is kept).
    """
    cur = _traces(current)
    for y in proposals:
        c = compare_paired(cur, _traces(y), resamples=1)
        if decide(c, changed_programs=("rewriter",)).accepted:
            return True
    return False


def noise_false_accept_rate(
    rule: RoundRule,
    *,
    rounds: int,
    proposals: int = 8,
    accuracies: Iterable[float] = (0.2, 0.5),
    sizes: Iterable[int] = (24, 50, 100),
    overlaps: Iterable[float] = (0.5, 0.8),
    seed: int = 0,
) -> tuple[float, dict[tuple[float, int, float], float]]:
    """Share of pure-noise rounds in which ``rule`` accepts a proposal.

    Each round draws the incumbent's answers ``x_i ~ Bernoulli(accuracy)`` on ``size`` questions and
    ``proposals`` candidates that each keep the incumbent's answer with probability ``overlap`` and
    otherwise answer ``Bernoulli(accuracy)`` afresh: same accuracy in truth, so any acceptance is
    a false one. ``numpy.random.default_rng(seed)``: same arguments ⇒ same rates.

    Args:
        rule: e.g. :func:`stage_round` or :func:`permissive_round`.
        rounds: rounds per (accuracy, size, overlap) combination, ≥ 1.
        proposals: proposals per round, ≥ 1.
        accuracies: incumbent (and candidate) accuracies, 0–1.
        sizes: validation sizes.
        overlaps: probability a candidate keeps the incumbent's answer, 0–1.
        seed: the generator's seed.

    Returns:
        ``(overall rate, {(accuracy, size, overlap): rate})``.
    """
    rng = np.random.default_rng(seed)
    per: dict[tuple[float, int, float], float] = {}
    for acc in accuracies:
        for n in sizes:
            for ov in overlaps:
                hits = 0
                for _ in range(rounds):
                    x = (rng.random(n) < acc).astype(float)
                    ys = []
                    for _ in range(proposals):
                        keep = rng.random(n) < ov
                        fresh = (rng.random(n) < acc).astype(float)
                        ys.append(np.where(keep, x, fresh).tolist())
                    hits += rule(x.tolist(), ys)
                per[(acc, n, ov)] = hits / rounds
    return sum(per.values()) / len(per), per


def batch_round_false_accept_rate(
    *,
    rounds: int,
    margin: float = 0.10,
    alpha: float = 0.05,
    accuracies: Iterable[float] = (0.2, 0.5, 0.8),
    sizes: Iterable[int] = (24, 50, 100),
    overlap: float = 0.5,
    seed: int = 0,
) -> tuple[float, float, dict[tuple[float, int], float]]:
    """Share of rounds that accept anything when a round tests a noise prompt and a KI batch at the null.

    Each round draws the incumbent's 0/1 values ``x_i ~ Bernoulli(accuracy)`` on ``size``
    questions (a 0/1 stage metric: gold recall, answer coverage) and tests two changes at
    ``alpha / 2`` (:func:`~kitune.optimizers.acceptance.round_tests`: one program + one batch):

    * a prompt candidate that keeps each incumbent value with probability ``overlap`` and is
      redrawn otherwise (same mean in truth), decided by
      :func:`~kitune.optimizers.acceptance.decide_change`;
    * a KI batch exactly at the non-inferiority boundary: each value 1 becomes 0 with probability
      ``margin / accuracy`` (true share of questions lowered ``margin``, mean difference
      ``−margin``), decided by :func:`~kitune.optimizers.acceptance.decide_noninferior` — the
      hardest case a non-inferiority test must refuse (measured rather than assumed: a sign-flip
      test of ``d_i + margin``, the first version, accepted 7.1% at a nominal 2.5%).

    Any acceptance is false. ``numpy.random.default_rng(seed)``: same arguments ⇒ same rates.

    Args:
        rounds: rounds per (accuracy, size), ≥ 1.
        margin: the non-inferiority margin, 0 < margin ≤ min(accuracies).
        alpha: the round's one-sided level.
        accuracies: incumbent means, 0–1.
        sizes: validation sizes.
        overlap: the prompt candidate's probability of keeping an incumbent value.
        seed: the generator's seed.

    Returns:
        ``(round rate, batch-alone rate, {(accuracy, size): round rate})``.
    """
    rng = np.random.default_rng(seed)
    per: dict[tuple[float, int], float] = {}
    batch_hits_total = 0
    cells = 0
    for acc in accuracies:
        for n in sizes:
            hits = 0
            ids = [str(i) for i in range(n)]
            for _ in range(rounds):
                x = (rng.random(n) < acc).astype(float)
                prompt = np.where(rng.random(n) < overlap, x, (rng.random(n) < acc).astype(float))
                batch = np.where(rng.random(n) < margin / acc, 0.0, x)
                cur = dict(zip(ids, x.tolist(), strict=True))
                p_test = paired_test(
                    cur, dict(zip(ids, prompt.tolist(), strict=True)), metric="m", resamples=100
                )
                b_test = noninferiority_test(
                    cur,
                    dict(zip(ids, batch.tolist(), strict=True)),
                    metric="m",
                    margin=margin,
                    resamples=2000,
                )
                prompt_ok = decide_change("p", p_test, alpha=alpha, tests_in_round=2).outcome == "accepted"
                batch_ok = (
                    decide_noninferior("b", b_test, alpha=alpha, tests_in_round=2).outcome == "accepted"
                )
                hits += prompt_ok or batch_ok
                batch_hits_total += batch_ok
            per[(acc, n)] = hits / rounds
            cells += 1
    return sum(per.values()) / len(per), batch_hits_total / (rounds * cells), per


def power_lines(rows: Sequence[DecisionPower], *, alpha: float, power: float, margin: float) -> list[str]:
    """What ``kitune optimize`` prints before a run: the power table and its warnings.

    Args:
        rows: :func:`power_table`.
        alpha: the round-level α.
        power: 1 − β.
        margin: the end-to-end non-inferiority margin.

    Returns:
        Lines: a heading, a Markdown table (decision, metric, n, s and its source, the level, MDE),
        then one ``warning:`` line per decision that cannot be made or per note.
    """
    out = [
        f"power before the run (one-sided α {alpha} per round, Bonferroni over its tests; power {power:.0%}; "
        "MDE = (z(1−α') + z(power))·s/√n, docs/loop-stages.md):",
        "| decision | metric | n | s (source) | α' | MDE |",
        "|---|---|---|---|---|---|",
        *(r.row() for r in rows),
    ]
    for r in rows:
        if not r.possible:
            out.append(
                f"warning: {r.decision}: the split is too small for any decision to be possible "
                f"({r.note or f'MDE {r.mde:.2f} ≥ the whole range'}); every change will be kept out "
                "as 'not enough evidence'"
            )
        elif r.note:
            out.append(f"warning: {r.decision}: {r.note} (margin {margin}, smallest shown {r.mde:.2f})")
    return out
