"""The numbers docs/loop-stages.md quotes for the decision rule: the power table and the noise simulation.

1. Minimum detectable effects (:func:`kitune.optimizers.power.minimum_detectable_effect`) for n = 24,
   50, 100 validation questions at the per-question standard deviations loop-dev-48 measured on
   its validation split (iteration 1, the current setting re-measured: answer coverage 15/22,
   MRR 0.427 with its 95% interval, end-to-end accuracy 5/24), one-sided α 0.05, power 80%,
   a round that tests the extractor and the rewriter (α' = 0.025), ρ = 0.5.
2. The false-accept rate of the stage rule and of the permissive (old) rule on rounds of 8 and of 1
   pure-noise proposals (:func:`kitune.optimizers.power.noise_false_accept_rate`; accuracies 0.2,
   0.5, sizes 24, 50, 100, overlaps 0.5, 0.8; seeded).

Usage (repository root):
    python experiments/decision-reanalysis/power_and_noise.py > experiments/decision-reanalysis/power.md
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from kitune.optimizers.power import (
    minimum_detectable_effect,
    noise_false_accept_rate,
    permissive_round,
    stage_round,
)

ROOT = Path(__file__).resolve().parents[2]


def measured() -> dict[str, tuple[float, str]]:
    """Per-question SDs from loop-dev-48's iteration-1 validation re-measurement (its loop_state.json)."""
    rec = json.loads((ROOT / "experiments" / "loop-dev-48" / "loop_state.json").read_text())["history"][1]
    rows = {m["name"]: m for m in rec["stages"]["validation_after"]}
    cov = rows["answer_coverage"]
    p = cov["value"]
    mrr = rows["mrr"]
    half = mrr["value"] - mrr["ci_low"]
    acc = rec["val_after_accuracy"]
    return {
        "extractor answer coverage": (math.sqrt(p * (1 - p)), f"p = {cov['successes']}/{cov['n']}"),
        "rewriter MRR": (
            half * math.sqrt(mrr["n"]) / 1.959963984540054,
            f"{mrr['value']:.3f} [{mrr['ci_low']:.3f}–{mrr['ci_high']:.3f}], n {mrr['n']}",
        ),
        "end-to-end accuracy (non-inferiority)": (math.sqrt(acc * (1 - acc)), f"p = {acc:.3f}"),
    }


def main() -> None:
    """Print the Markdown."""
    print("# Power and noise: the numbers behind the decision rule\n")
    print("`python experiments/decision-reanalysis/power_and_noise.py` (no LLM call).\n")
    print("## Minimum detectable effect (one-sided α 0.05, power 80%, ρ 0.5)\n")
    print("| decision | s (measured on loop-dev-48 validation) | α' | n = 24 | n = 50 | n = 100 |")
    print("|---|---|---|---|---|---|")
    for name, (sd, source) in measured().items():
        tests = 1 if name.startswith("end-to-end") else 2
        cells = [f"{minimum_detectable_effect(n, sd, alpha=0.05, tests=tests):.3f}" for n in (24, 50, 100)]
        print(f"| {name} | {sd:.3f} ({source}) | {0.05 / tests:.3f} | " + " | ".join(cells) + " |")
    print("\n## False-accept rate on pure noise\n")
    print("| rule | proposals per round | rounds | rate | worst cell | seconds |")
    print("|---|---|---|---|---|---|")
    for label, rule, proposals, rounds in (
        ("stage (Bonferroni over the round)", stage_round(), 8, 200),
        ("stage", stage_round(), 1, 200),
        ("permissive (old)", permissive_round, 8, 50),
        ("permissive (old)", permissive_round, 1, 200),
    ):
        t0 = time.monotonic()
        rate, per = noise_false_accept_rate(rule, rounds=rounds, proposals=proposals, seed=36)
        worst = max(per, key=per.__getitem__)
        print(
            f"| {label} | {proposals} | {rounds * len(per)} | {rate:.3f} | {per[worst]:.3f} at accuracy "
            f"{worst[0]}, n {worst[1]}, overlap {worst[2]} | {time.monotonic() - t0:.0f} |"
        )


if __name__ == "__main__":
    main()
