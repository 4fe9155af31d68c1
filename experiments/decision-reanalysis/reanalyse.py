"""The issue-36 decision rule applied to two committed decisions, from their records (no LLM call).

1. ``experiments/loop-dev-48`` iteration 1: the rewriter instruction the old rule accepted
   (fixed 2, broken 1 of 24, McNemar p = 1.0).
2. ``experiments/loop-dev-48-pareto``: GEPA's one-sentence extractor candidate, never decided
   (the run stopped after 15 of its 24 validation episodes).

Each decision is what :func:`kitune.optimizers.acceptance.decide_change` says on the stage metric
the program is decided on (``STAGE_METRICS``: extractor answer coverage, rewriter reciprocal
rank), with the end-to-end non-inferiority check on the validation traces both runs have. Where
the records hold only a stage metric's aggregate (the rewriter's per-question reciprocal ranks were
not kept before issue 36), the script says so and gives the bound the aggregate allows.

Usage (repository root): python experiments/decision-reanalysis/reanalyse.py
Writes experiments/decision-reanalysis/results.md and results.json next to itself.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from kitune.evaluation.trace import Trace
from kitune.optimizers.acceptance import ChangeDecision, decide_change, paired_test, sign_test_p, trace_values

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DEV48 = ROOT / "experiments" / "loop-dev-48"
PARETO = ROOT / "experiments" / "loop-dev-48-pareto"
ALPHA = 0.05


def _traces(path: Path, ids: set[str]) -> list[Trace]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [Trace.from_dict(r) for r in rows if str(r["query_id"]) in ids]


def _stage(record: dict[str, Any], run: str, name: str) -> dict[str, Any]:
    return next(m for m in record["stages"][run] if m["name"] == name)


def _sd_from_interval(m: dict[str, Any]) -> float:
    """A mean's per-question standard deviation from its normal 95% interval (mean ± 1.96 s/√n)."""
    half = m["value"] - m["ci_low"] if m["ci_low"] > 0 else m["ci_high"] - m["value"]
    return half * math.sqrt(m["n"]) / 1.959963984540054


def dev48_iteration_1() -> dict[str, Any]:
    """The rewriter the old rule accepted: the stage test from aggregates, end to end from traces."""
    state = json.loads((DEV48 / "loop_state.json").read_text(encoding="utf-8"))
    rec = state["history"][1]
    ids = set(json.loads((DEV48 / "questions.json").read_text(encoding="utf-8"))["validation"])
    after = _traces(DEV48 / "evals" / "a1de4f28-6d72b837257662c9.jsonl", ids)
    cand = _traces(DEV48 / "evals" / "47358034-6d72b837257662c9.jsonl", ids)
    e2e = paired_test(trace_values(after), trace_values(cand), metric="end_to_end_accuracy", alpha=ALPHA)
    mrr0, mrr1 = _stage(rec, "validation_after", "mrr"), _stage(rec, "candidate_validation", "mrr")
    r0, r1 = (
        _stage(rec, "validation_after", "recall_at_k"),
        _stage(rec, "candidate_validation", "recall_at_k"),
    )
    net = r1["successes"] - r0["successes"]
    # best case for the candidate: every recall change in its favour (net better, none worse)
    recall_best_p = sign_test_p(max(net, 0), 0)
    # the new rule on end-to-end accuracy alone (the only per-question record of this decision)
    e2e_alone = decide_change("rewriter (end to end as the stage)", e2e, alpha=ALPHA)
    return {
        "decision": "loop-dev-48 iteration 1: rewriter candidate (ddf1993e vs bd23841b)",
        "old_rule": {"outcome": rec["decision"], "reason": rec["reason"]},
        "stage_metric": "rewriter_mrr",
        "stage_aggregates": {
            "mrr": [mrr0["value"], mrr1["value"]],
            "recall_at_5": [f"{r0['successes']}/{r0['n']}", f"{r1['successes']}/{r1['n']}"],
            "n": mrr0["n"],
        },
        "stage_bound": (
            f"MRR {mrr0['value']:.3f} → {mrr1['value']:.3f} ({mrr1['value'] - mrr0['value']:+.3f}): a mean "
            "difference ≤ 0 has one-sided p ≥ 0.5 under the sign-flip permutation test whatever the "
            f"per-question values (its null distribution is symmetric about 0); recall@5 {net:+d}/{r0['n']}: "
            f"p ≥ {recall_best_p:.2f} even if that one question is the only change"
        ),
        "new_rule": "not_enough_evidence",
        "new_reason": (
            f"kept the incumbent: not enough evidence (rewriter_mrr {mrr1['value'] - mrr0['value']:+.3f}, "
            f"p ≥ 0.5 > α {ALPHA})"
        ),
        "end_to_end": e2e.to_dict(),
        "end_to_end_alone": e2e_alone.to_dict(),
    }


def _coverage_rows(path: Path) -> tuple[dict[str, float], dict[str, float]]:
    """Per-question answer coverage (seed, candidate) from coverage.md's table (✓ / ✗)."""
    seed: dict[str, float] = {}
    cand: dict[str, float] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].isdigit():
            seed[cells[0]] = float(cells[2].startswith("✓"))
            cand[cells[0]] = float(cells[3].startswith("✓"))
    return seed, cand


def pareto_extractor() -> dict[str, Any]:
    """The extractor candidate: answer coverage per question (coverage.md), end to end on 15 questions."""
    seed, cand = _coverage_rows(PARETO / "coverage.md")
    stage = paired_test(seed, cand, metric="extractor_answer_coverage", alpha=ALPHA)
    ids = {
        str(json.loads(line)["query_id"])
        for line in (PARETO / "evals" / "b3c103e6-7cc5b911c314681c.jsonl").read_text().splitlines()
    }
    before = _traces(PARETO / "evals" / "a1de4f28-331ae61ecb850812.jsonl", ids)
    after = _traces(PARETO / "evals" / "b3c103e6-7cc5b911c314681c.jsonl", ids)
    e2e = paired_test(trace_values(before), trace_values(after), metric="end_to_end_accuracy", alpha=ALPHA)
    decision: ChangeDecision = decide_change("extractor", stage, alpha=ALPHA, end_to_end=e2e)
    stages = {
        run: {
            m["name"]: m for m in json.loads((PARETO / "evals" / f"stages-{key}-validation.json").read_text())
        }
        for run, key in (("seed", "a1de4f28-331ae61ecb850812"), ("candidate", "b3c103e6-7cc5b911c314681c"))
    }
    m0, m1 = stages["seed"]["mrr"], stages["candidate"]["mrr"]
    s0, s1 = _sd_from_interval(m0), _sd_from_interval(m1)
    diff, n = m1["value"] - m0["value"], m0["n"]
    # normal approximation: significant at ALPHA when diff / (sd_d / sqrt(n)) > z(1 - ALPHA),
    # sd_d² = s0² + s1² − 2ρ s0 s1: the smallest correlation ρ for which it would be
    z = 1.6448536269514722
    rho_needed = (s0 * s0 + s1 * s1 - (diff * math.sqrt(n) / z) ** 2) / (2 * s0 * s1)
    e2e_sign = sign_test_p(e2e.better, e2e.worse)
    return {
        "decision": "loop-dev-48-pareto: extractor candidate extractor@96d34fce vs seed extractor@d6e68232",
        "old_rule": {"outcome": "none (the run stopped before the end-to-end step finished)"},
        "stage_metric": "extractor_answer_coverage",
        "stage": stage.to_dict(),
        "end_to_end": e2e.to_dict(),
        "new_rule": decision.outcome,
        "new_reason": decision.reason,
        "mrr_secondary": {
            "seed": [m0["value"], m0["ci_low"], m0["ci_high"]],
            "candidate": [m1["value"], m1["ci_low"], m1["ci_high"]],
            "n": n,
            "sd": [s0, s1],
            "rho_needed_for_p_below_alpha": rho_needed,
            "note": "The rewriter's per-question reciprocal ranks were not recorded by this run; the paired "
            "test needs them. Normal approximation from the two intervals: significant at one-sided 0.05 "
            f"when the per-question correlation of the two runs exceeds {rho_needed:.2f}.",
        },
        "end_to_end_as_a_decision": {
            "p_better": e2e_sign,
            "outcome": decide_change("extractor (end to end)", e2e, alpha=ALPHA).outcome,
        },
    }


def main() -> None:
    """Write results.json and results.md."""
    a, b = dev48_iteration_1(), pareto_extractor()
    (HERE / "results.json").write_text(json.dumps([a, b], indent=1, ensure_ascii=False), encoding="utf-8")
    ea, eb, sb = a["end_to_end"], b["end_to_end"], b["stage"]
    mrr = b["mrr_secondary"]
    agg = a["stage_aggregates"]
    verdict = {"not_enough_evidence": "kept the incumbent: not enough evidence"}.get(
        b["new_rule"], b["new_rule"]
    )
    md = [
        "# The issue-36 decision rule on two committed decisions (no LLM call)",
        "",
        "`python experiments/decision-reanalysis/reanalyse.py` (repository root) writes this file and "
        "`results.json`. Rule: `optimize.decision_rule: stage`, one-sided α 0.05, one test per round "
        "(each run changed one program), minimum effect 0.02, end-to-end non-inferiority margin 0.10.",
        "",
        "| decision | stage metric (validation) | stage test | end to end (validation pairs) | old rule "
        "| new rule |",
        "|---|---|---|---|---|---|",
        f"| loop-dev-48 it. 1, rewriter | MRR {agg['mrr'][0]:.3f} → {agg['mrr'][1]:.3f}, recall@5 "
        f"{agg['recall_at_5'][0]} → {agg['recall_at_5'][1]} (n {agg['n']}) | per-question values not "
        f"recorded; p ≥ 0.5 from the aggregates | {ea['better']} fixed / {ea['worse']} broken of {ea['n']}, "
        f"sign p {ea['p_better']:.2f} | accepted | **kept the incumbent: not enough evidence** |",
        f"| loop-dev-48-pareto, extractor | answer coverage {sb['current']:.3f} → {sb['candidate']:.3f} "
        f"(n {sb['n']}: {sb['better']} better, {sb['worse']} worse) | sign p {sb['p_better']:.2f} | "
        f"{eb['better']} fixed / {eb['worse']} broken of {eb['n']} (partial run), "
        f"sign p {eb['p_better']:.3f} | "
        f"no decision | **{verdict}** |",
        "",
        "## loop-dev-48 iteration 1: the rewriter the old rule accepted",
        "",
        f"- Old rule: {a['old_rule']['outcome']} — {a['old_rule']['reason']}",
        f"- Stage test (rewriter reciprocal rank): {a['stage_bound']}.",
        f"- End to end: {a['end_to_end_alone']['test']['metric']} "
        f"{ea['better'] - ea['worse']:+d}/{ea['n']}, one-sided sign p {ea['p_better']:.2f}, 90% interval "
        f"[{ea['ci_low']:+.3f}, {ea['ci_high']:+.3f}]. Even taken as the decision's own metric it is "
        f"'{a['end_to_end_alone']['outcome'].replace('_', ' ')}'.",
        f"- New rule: {a['new_reason']}.",
        "",
        "## loop-dev-48-pareto: the extractor candidate",
        "",
        f"- New rule on answer coverage: {b['new_reason']}",
        f"- End to end on the 15 validation questions the candidate reached: sign p {eb['p_better']:.3f} "
        f"({eb['better']} fixed, {eb['worse']} broken); taken as a decision of its own: "
        f"{b['end_to_end_as_a_decision']['outcome'].replace('_', ' ')}. Its non-inferiority bound "
        f"{eb['ci_low']:+.3f} passes the −0.10 margin.",
        f"- MRR (the rewriter's metric, same rewriter, secondary here): {mrr['seed'][0]:.3f} "
        f"[{mrr['seed'][1]:.3f}–{mrr['seed'][2]:.3f}] → {mrr['candidate'][0]:.3f} "
        f"[{mrr['candidate'][1]:.3f}–{mrr['candidate'][2]:.3f}], n {mrr['n']}: {mrr['note']}",
        "",
        "What it shows: the decision the old rule took (loop-dev-48's rewriter) is not one the records can "
        "support; the extractor candidate's own metric did not move (one question won, one lost), so the "
        "rule keeps the seed; its largest movement is in retrieval ranking (MRR), which the extractor is "
        "not decided on and whose per-question values this run did not keep.",
    ]
    (HERE / "results.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))


if __name__ == "__main__":
    main()
