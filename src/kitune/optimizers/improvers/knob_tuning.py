"""The ``knobs`` improver: Optuna over the retrieval knobs with an LLM-free objective.

Objective (:func:`knob_objective`): the share of tuning questions for which a KI that
``get_context`` returns (plain plan, the setting's default size) states the gold answer — no
re-extraction and no agent run, so a trial costs look-ups only. The study lives on disk at
``<state>/knobs.journal`` (named ``<run name>-<setting key>``), so a rerun resumes it; the
current values are enqueued as the first trial. The best values are proposed only when they
beat the current ones. Runs when ``--knob-trials`` is above 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kitune.optimizers.improve_env import ImproveEnv, ImproveInput, Improvement
from kitune.optimizers.knobs import DEFAULT_KNOBS, KnobSpace, KnobStudy
from kitune.optimizers.objective import text_contains_answer
from kitune.optimizers.setting import Setting

if TYPE_CHECKING:
    from kitune.data.loaders import Question

__all__ = ["RETRIEVAL_KNOBS", "KnobTuning", "knob_objective"]

RETRIEVAL_KNOBS = (
    "retrieval.branch_size",
    "retrieval.rrf_k",
    "retrieval.tag_weight",
    "retrieval.lexical_weight",
    "retrieval.semantic_weight",
    "retrieval.confidence_floor",
)
"""Knobs the LLM-free objective can measure (no re-extraction or agent run needed)."""


def knob_objective(
    env: ImproveEnv, setting: Setting, questions: Sequence[Question]
) -> Callable[[dict[str, int | float]], float]:
    """LLM-free knob objective: share of tuning questions whose top KIs (plain plan) state the answer.

    Returns:
        ``knob values → 0.0–1.0`` (0.0 with no tuning questions).
    """

    def objective(params: dict[str, int | float]) -> float:
        hits = 0
        for q in questions:
            texts = env.lookup_texts(setting, q.query, params)
            hits += any(text_contains_answer(t, q.golds) for t in texts)
        return hits / len(questions) if questions else 0.0

    return objective


class KnobTuning:
    """The ``knobs`` improver (see the module docstring)."""

    name = "knobs"

    def improve(self, env: ImproveEnv, inp: ImproveInput) -> Improvement:
        """Run the study (resuming it) and propose the best knob values if they beat the current ones."""
        out = Improvement()
        if inp.options.knob_trials <= 0:
            return out
        setting = inp.setting
        space = KnobSpace(tuple(k for k in DEFAULT_KNOBS if k.key in RETRIEVAL_KNOBS))
        objective = knob_objective(env, setting, inp.questions)
        current = dict(space.current(inp.cfg))
        baseline = objective(dict(current))
        study = KnobStudy(
            inp.state_dir / "knobs.journal",
            f"{inp.options.run_name}-{setting.key}",
            space=space,
            seed=inp.cfg.optimize.seed,
        )
        if not study.trials():
            study.enqueue(current)
        done = study.optimize(objective, inp.options.knob_trials)
        best = study.best()
        out.metrics.update(
            {
                "knob_trials": float(len(done)),
                "knob_baseline": baseline,
                "knob_best": float(best.value or 0.0),
            }
        )
        out.notes["knob_best_params"] = dict(best.params)
        if best.value is not None and best.value > baseline:
            out.knobs.update(best.params)
        return out


KNOBS = KnobTuning()

PLUGINS = {KNOBS.name: KNOBS}
"""This module's improver, registered by :data:`kitune.optimizers.improver.IMPROVERS`."""
