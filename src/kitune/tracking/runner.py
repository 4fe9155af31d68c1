"""``run_experiment``: wire a loop environment to the tracker, the prompt registry and the optimiser choice.

The optimiser a name selects is built by :func:`kitune.optimizers.registry.make_optimizer`
(``gepa`` by default, ``mipro``, plug-ins); :func:`run_experiment` resolves the tracker
(``create_tracker(cfg)``: MLflow at ``cfg.mlflow_uri``), the prompt registry
(``PromptRegistry(cfg.mlflow_uri)``), the starting setting (the registry's ``production``
prompts, else the packaged instructions; a saved loop state wins over both) and runs
:func:`kitune.optimizers.loop.run_loop` (one tracking run per iteration).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kitune.errors import TrackingError
from kitune.optimizers.loop import LoopEnv, LoopResult, Setting, run_loop, start_prompts
from kitune.optimizers.objective import LoopWeights
from kitune.programs.instructions import available_instructions, instruction_version
from kitune.tracking.prompts import PromptRegistry, register_packaged
from kitune.tracking.trackers import create_tracker

if TYPE_CHECKING:
    from kitune.config import KituneConfig
    from kitune.optimizers.protocols import Tracker

__all__ = ["run_experiment"]


def run_experiment(
    cfg: KituneConfig,
    env: LoopEnv,
    *,
    programs: Sequence[str],
    iterations: int,
    state_dir: Path,
    tracker: Tracker | None = None,
    registry: PromptRegistry | None = None,
    params: Mapping[str, Any] | None = None,
    log: Callable[[str], None] = lambda _m: None,
    promote: bool = True,
) -> LoopResult:
    """Run (or resume) the loop with tracking and the prompt registry.

    Args:
        cfg: configuration (``optimize`` weights/margin, ``corpus_name``, MLflow URI).
        env: the loop environment.
        programs: programs whose prompts start from the registry (or packaged) and are tuned.
        iterations: total iterations (finished ones count).
        state_dir: loop state and curves.
        tracker: None: ``create_tracker(cfg)``.
        registry: None: ``PromptRegistry(cfg.mlflow_uri)`` (skipped for a non-database URI).
        params: logged on every iteration run.
        log: progress lines.
        promote: accepted versions become ``production`` (False: only ``candidate``, staged).

    Raises:
        TrackingError: an accepted prompt could not be registered.
    """
    if tracker is None:
        tracker = create_tracker(cfg)
    if registry is None:
        try:
            registry = PromptRegistry(cfg.mlflow_uri)
        except TrackingError as e:
            log(f"[yellow]prompt registry unavailable ({e}); accepted prompts are not registered[/]")
    if registry is not None:
        packaged = set(available_instructions())
        try:  # the packaged prompts are version 1, so a rollback always has a version to go back to
            # (a plug-in program without a packaged prompt starts from its task's own instruction)
            register_packaged(registry, cfg.corpus_name, [p for p in programs if p in packaged])
        except TrackingError as e:
            log(f"[yellow]could not register the packaged prompts as version 1 ({e})[/]")
    start = Setting(start_prompts(programs, corpus=cfg.corpus_name, registry=registry))
    log(f"starting from {start.key}: " + ", ".join(f"{p} ({len(t)} chars)" for p, t in start.prompts.items()))

    def report(rec: Any) -> None:
        verdict = {
            "accepted": "[green]accepted[/]",
            "undecided": "[yellow]undecided[/]",
            "not_enough_evidence": "[yellow]kept the incumbent (not enough evidence)[/]",
        }.get(rec.decision, "rejected")
        acc = (
            ""
            if rec.tune_accuracy is None
            else f" (accuracy tune {rec.tune_accuracy:.0%}, validation "
            + ("-" if rec.val_accuracy is None else f"{rec.val_accuracy:.0%}")
            + ")"
        )
        log(
            f"iteration {rec.iteration}: tune {rec.tune_score:+.3f}, validation {rec.val_score:+.3f}{acc} → "
            f"candidate {rec.candidate_val_score:+.3f} {verdict}: {rec.reason}"
        )

    o = cfg.optimize
    weights = LoopWeights.from_config(cfg)
    parent_params = {
        **dict(params or {}),
        "weights.accuracy": weights.accuracy,
        "weights.tokens_per_doubling": weights.tokens,
        "weights.timeouts": weights.timeouts,
        "accept_margin": o.accept_margin,
        "max_failed_share": o.max_failed_share,
        "require_significance": o.require_significance,
        "decision_rule": o.decision_rule,
        "alpha": o.alpha,
        "min_effect": o.min_effect,
        "noninferiority_margin": o.noninferiority_margin,
        "max_feedback_attempts": o.max_feedback_attempts,
        "iterations": iterations,
        **{
            f"model.{role}": cfg.lm.model_label(role)
            for role in ("extract", "rewrite", "agent", "judge", "reflection")
        },
        **{f"prompt_version.{p}": instruction_version(p, t) for p, t in start.prompts.items()},
    }
    outer = getattr(tracker, "current_run", None)
    if outer is not None and outer.run_id is not None:
        # a caller's run is open (``kitune loop`` opens one per round): it is the parent
        tracker.log_params(parent_params, run_id=outer.run_id)
        parent: Any = contextlib.nullcontext()
    else:
        parent = tracker.run(state_dir.name or "optimize", parent_params, tags={"kitune.kind": "optimize"})
    with parent:
        return run_loop(
            env,
            start,
            iterations=iterations,
            state_dir=state_dir,
            tracker=tracker,
            registry=registry,
            corpus=cfg.corpus_name,
            weights=weights,
            accept_margin=o.accept_margin,
            params=params,
            on_iteration=report,
            max_failed_share=o.max_failed_share,
            require_significance=o.require_significance,
            seed=o.seed,
            promote=promote,
            decision_rule=o.decision_rule,
            alpha=o.alpha,
            min_effect=o.min_effect,
            noninferiority_margin=o.noninferiority_margin,
        )
