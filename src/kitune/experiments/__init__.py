"""Experiment tracking (MLflow), the prompt registry and the runner wiring the loop to them.

Public names are imported lazily on first use (PEP 562), so importing the package is cheap and
has no side effects; ``__all__`` lists them and ``tests/test_public_api.py`` checks it.
"""

from __future__ import annotations

from kitune.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "run_experiment": "kitune.experiments.runner",
    "MlflowTracker": "kitune.experiments.tracking",
    "NullTracker": "kitune.experiments.tracking",
    "create_tracker": "kitune.experiments.tracking",
    "PromptRegistry": "kitune.experiments.prompts",
    "PromptVersion": "kitune.experiments.prompts",
    "prompt_name": "kitune.experiments.prompts",
    "register_packaged": "kitune.experiments.prompts",
}
"""Public name → the module that defines it."""

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
