"""Experiment tracking (MLflow), the prompt registry and the runner wiring the loop to them.

Public names are imported lazily on first use (PEP 562), so importing the package is cheap and
has no side effects; ``__all__`` lists them and ``tests/test_public_api.py`` checks it.
"""

from __future__ import annotations

from kitune.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "run_experiment": "kitune.tracking.runner",
    "MlflowTracker": "kitune.tracking.trackers",
    "NullTracker": "kitune.tracking.trackers",
    "create_tracker": "kitune.tracking.trackers",
    "PromptRegistry": "kitune.tracking.prompts",
    "PromptVersion": "kitune.tracking.prompts",
    "prompt_name": "kitune.tracking.prompts",
    "register_packaged": "kitune.tracking.prompts",
}
"""Public name → the module that defines it."""

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
