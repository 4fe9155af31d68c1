"""``OptimizeOptions``: what ``kitune optimize`` (and the demo, drift and watch rounds) asks the loop to do.

A leaf of the service layer: the loop's wiring (:mod:`kitune.service.tuning.optimize`), its environment,
the slice reader and the fingerprint all read the options, so the type lives apart from every
one of them and none imports another for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kitune.optimizers.program_task import program_names

__all__ = ["E2E_AUTO", "OptimizeOptions"]

E2E_AUTO = -1
"""``OptimizeOptions.e2e_sample`` value for ``--e2e-sample auto``."""


@dataclass(frozen=True)
class OptimizeOptions:
    """What ``kitune optimize`` was asked to do."""

    data_dir: Path
    """Dataset folder (BrowseComp-Plus layout or documents/questions JSONL)."""
    questions: int | None = None
    """N questions of the dataset (None: all): the first N, or a seeded sample with
    :attr:`sample_seed`; split into tune/validation by ``optimize.seed``."""
    sample_seed: int | None = None
    """Seed of a random sample of :attr:`questions` questions (None: the first N)."""
    iterations: int = 2
    optimizer: str = "gepa"
    """A name registered in :mod:`kitune.optimizers.registry` (checked when the loop starts)."""
    programs: tuple[str, ...] = field(default_factory=program_names)
    """Programs to tune, by registered name (default: every registered program)."""
    knob_trials: int = 0
    """Optuna trials per iteration (0: no knob tuning)."""
    max_metric_calls: int | None = None
    """GEPA budget per program per iteration (MIPROv2: trials); None: ``optimize.max_metric_calls``
    (unset there too: sized to ``optimize.min_proposals`` proposals, see
    :func:`kitune.optimizers.gepa.min_metric_calls`)."""
    budget_minutes: float | None = None
    """Wall-clock cap per program optimisation (a Timeout stopper); None: none."""
    distractors: int = 4
    """Extra corpus documents (not evidence of any selected question) extracted and indexed."""
    feedback: bool = True
    """Write disambiguation KIs from the tuning failures."""
    run_name: str = "optimize"
    """Folder under ``<workdir>/optimize`` holding the loop state (rerun the same name to resume)."""
    progress: bool = True
    split: str = "random"
    """How the questions are split into tuning and validation: ``random`` (a seeded shuffle) or
    ``stratified`` (per source dataset, disjoint evidence documents;
    :mod:`kitune.service.tuning.slicing`)."""
    measure: str = "full"
    """``full``: every measurement runs the agent on every question of the split (and computes
    the stage metrics); ``stage``: the stage metrics on every tuning and validation question, the
    agent only on :attr:`e2e_sample` validation questions (and the tuning ones with
    :attr:`tune_agent`) — see :meth:`kitune.service.tuning.loop_env.ServiceLoopEnv.agent_questions`."""
    tune_agent: bool = False
    """With ``measure="stage"``: also run the agent on every tuning question (its failures feed
    the feedback KIs and GEPA's failure-first ordering; without it the disambiguation improver
    has no failures to write from)."""
    e2e_sample: int = 0
    """With ``measure="stage"``: validation questions (a seeded subset, the same every iteration so
    runs pair) the agent runs on in each measurement; 0: none; more than the split: all;
    :data:`E2E_AUTO` (-1, ``--e2e-sample auto``): sized by the power estimate of the end-to-end
    non-inferiority check (:func:`kitune.service.tuning.loop_env.e2e_sample_size`)."""
    final_eval: bool = False
    """After the last iteration, run the start and the final setting end to end on every
    validation question and compare them paired (``<state>/final_eval.json|md``)."""
    promote: bool = False
    """Promote the versions the run accepts to ``production`` when it ends (through the checked
    :func:`~kitune.service.serving.prompts.promote_prompt`); False: they are only staged
    (alias ``candidate``) until ``kitune prompts promote``."""
