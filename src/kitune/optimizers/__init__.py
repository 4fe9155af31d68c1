"""The optimisers and the self-improvement loop.

GEPA/MIPROv2 wrappers (named in the optimiser registry, built from one budget), Optuna knobs,
stoppers, the loop, its score, ledger and accept rule; the tracker and prompt-registry protocols
the loop logs through, and the artefact helpers that log a program's state and a candidate.

Public names are imported lazily on first use (PEP 562), so importing the package is cheap and
has no side effects; ``__all__`` lists them and ``tests/test_public_api.py`` checks it.
"""

from __future__ import annotations

from kitune.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "run_loop": "kitune.optimizers.loop",
    "Setting": "kitune.optimizers.setting",
    "Evaluation": "kitune.optimizers.setting",
    "Proposal": "kitune.optimizers.setting",
    "IterationRecord": "kitune.optimizers.loop_state",
    "LoopEnv": "kitune.optimizers.loop",
    "LoopResult": "kitune.optimizers.loop",
    "initial_prompts": "kitune.optimizers.loop",
    "start_prompts": "kitune.optimizers.loop",
    "ProgramTask": "kitune.optimizers.program_spec",
    "program_names": "kitune.optimizers.program_task",
    "register_program_task": "kitune.optimizers.program_task",
    "write_curves": "kitune.optimizers.curves",
    "LoopWeights": "kitune.optimizers.objective",
    "RunStats": "kitune.optimizers.objective",
    "loop_score": "kitune.optimizers.objective",
    "question_score": "kitune.optimizers.objective",
    "run_stats": "kitune.optimizers.objective",
    "PairedComparison": "kitune.optimizers.acceptance",
    "Decision": "kitune.optimizers.acceptance",
    "compare_paired": "kitune.optimizers.acceptance",
    "decide": "kitune.optimizers.acceptance",
    "check_instruction": "kitune.optimizers.acceptance",
    "FailureLedger": "kitune.optimizers.ledger",
    "GepaOptimizer": "kitune.optimizers.gepa",
    "MiproOptimizer": "kitune.optimizers.mipro",
    "OptimizationResult": "kitune.optimizers.base",
    "OptimizerBudget": "kitune.optimizers.budget",
    "register_optimizer": "kitune.optimizers.registry",
    "optimizer_names": "kitune.optimizers.registry",
    "make_optimizer": "kitune.optimizers.registry",
    "Tracker": "kitune.optimizers.protocols",
    "PromptRegistryProtocol": "kitune.optimizers.protocols",
    "log_candidate": "kitune.optimizers.artifacts",
    "log_program_state": "kitune.optimizers.artifacts",
}
"""Public name → the module that defines it."""

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
