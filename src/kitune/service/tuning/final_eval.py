"""The final end-to-end step of a loop run: start vs final setting on every validation question.

With ``kitune optimize --measure stage`` the iterations decide on the stage metrics and run the
agent only where a decision needs it; ``--final-eval`` then runs the agent once on *every*
validation question for two settings and pairs them (:func:`final_evaluation`):

* **seed** — the setting the run started from (``proposals/iteration-0.json``'s ``current``),
  with the feedback (disambiguation) KIs hidden from its look-ups: the configuration before the
  loop changed anything;
* **final** — the setting the run ended with, on the KI store as it is (feedback KIs that passed
  the gate visible, retired ones not).

Both resume: the seed's traces go to ``<state>/final/seed-<eval key>-<store state>.jsonl``, the
final's through the evaluation cache (a rerun of an unchanged run reads them back). The paired
comparison is :func:`kitune.optimizers.acceptance.compare_paired` (accuracy with a paired
bootstrap interval, fixed / broken, exact McNemar p, token ratio, timeout-rate difference);
written to ``<state>/final_eval.json`` and ``final_eval.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kitune.evaluation.report import summarize, wilson_interval
from kitune.optimizers.acceptance import PairedComparison, compare_paired
from kitune.optimizers.setting import Setting

if TYPE_CHECKING:
    from kitune.evaluation.report import RunSummary
    from kitune.optimizers.objective import LoopWeights
    from kitune.service.tuning.loop_env import ServiceLoopEnv

__all__ = ["FinalEvaluation", "final_evaluation", "start_setting"]


def start_setting(state_dir: Path) -> Setting | None:
    """The setting a loop run started from: ``proposals/iteration-0.json``'s ``current``.

    None when the run has no finished iteration.
    """
    path = state_dir / "proposals" / "iteration-0.json"
    if not path.is_file():
        return None
    return Setting.from_dict(json.loads(path.read_text(encoding="utf-8"))["current"])


@dataclass(frozen=True)
class FinalEvaluation:
    """What :func:`final_evaluation` measured."""

    seed_key: str
    final_key: str
    seed: RunSummary
    final: RunSummary
    paired: PairedComparison
    json_path: Path
    md_path: Path

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: both settings' keys and summaries (accuracy with its Wilson interval), the pairing."""
        return {
            "seed_key": self.seed_key,
            "final_key": self.final_key,
            "seed": _summary(self.seed),
            "final": _summary(self.final),
            "paired": self.paired.to_dict(),
        }


def _summary(s: RunSummary) -> dict[str, Any]:
    low, high = wilson_interval(s.n_correct, s.n_graded)
    return {
        "questions": s.n_total,
        "graded": s.n_graded,
        "correct": s.n_correct,
        "accuracy": s.accuracy,
        "accuracy_ci": [low, high],
        "failed": s.n_failed,
        "timeouts": s.timeouts,
        "input_tokens": s.input_tokens + s.tool_input_tokens,
        "output_tokens": s.output_tokens,
    }


def final_evaluation(
    env: ServiceLoopEnv, start: Setting, final: Setting, *, weights: LoopWeights | None = None, seed: int = 0
) -> FinalEvaluation:
    """Run ``start`` (feedback KIs hidden) and ``final`` end to end on every validation question; pair them.

    Args:
        env: the run's environment (its state folder, stores and caches).
        start: the setting the run started from (:func:`start_setting`).
        final: the setting it ended with.
        weights: loop-score weights for the paired score difference.
        seed: seeds the paired bootstrap.

    Returns:
        The :class:`FinalEvaluation`; ``<state>/final_eval.json`` and ``.md`` written.
    """
    questions = env.questions_for("validation")
    env.ensure_extracted(start, questions)
    state = env.store_state(start)
    folder = env.state_dir / "final"
    folder.mkdir(parents=True, exist_ok=True)
    seed_traces = env.run_agent(
        start,
        questions,
        traces_path=folder / f"seed-{env.eval_key(start)}-{state}.jsonl",
        disambiguation=False,
        store_state=f"{state}-nofeedback",
        label="final: seed",
    )
    final_eval = env.evaluate(final, "validation", label="final: final", every_question=True)
    paired = compare_paired(seed_traces, final_eval.traces, weights, seed=seed)
    result = FinalEvaluation(
        seed_key=start.key,
        final_key=final.key,
        seed=summarize(seed_traces, f"final-seed-{start.key}"),
        final=final_eval.summary,
        paired=paired,
        json_path=env.state_dir / "final_eval.json",
        md_path=env.state_dir / "final_eval.md",
    )
    data = result.to_dict()
    if final_eval.stages is not None:
        data["final_stages"] = [m.__dict__ for m in final_eval.stages.metrics]
    result.json_path.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    result.md_path.write_text(_markdown(result), encoding="utf-8")
    return result


def _markdown(r: FinalEvaluation) -> str:
    p = r.paired
    rows = []
    for name, key, s in (("seed (feedback KIs hidden)", r.seed_key, r.seed), ("final", r.final_key, r.final)):
        low, high = wilson_interval(s.n_correct, s.n_graded)
        acc = f"{s.n_correct}/{s.n_graded} = {(s.accuracy or 0.0):.1%} [{low:.1%}–{high:.1%}]"
        tokens = s.input_tokens + s.tool_input_tokens
        rows.append(f"| {name} | {key} | {acc} | {tokens} | {s.timeouts} | {s.n_failed} |")
    return "\n".join(
        [
            "# Final evaluation: seed vs final setting, every validation question, end to end",
            "",
            "| setting | key | accuracy [95% Wilson] | input tokens | timeouts | failed |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            f"Paired on {p.n_pairs} questions: accuracy difference {p.accuracy_diff:+.3f} "
            f"[{p.ci_low:+.3f}, {p.ci_high:+.3f}] (paired bootstrap), fixed {len(p.fixed)}, broken "
            f"{len(p.broken)}, McNemar p = {p.mcnemar_p:.3g}, tokens ×{p.token_ratio:.2f}, timeout rate "
            f"{p.timeout_rate_diff:+.3f}.",
            "",
        ]
    )
