"""Experiment tracking (MLflow), the prompt registry and the runner wiring the loop to them.

Public names are imported lazily on first use (PEP 562), so importing the package is cheap and
has no side effects; ``__all__`` lists them and ``tests/test_public_api.py`` checks it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "run_experiment": "kitune.experiments.runner",
    "make_optimizer": "kitune.experiments.runner",
    "Tracker": "kitune.experiments.tracking",
    "MlflowTracker": "kitune.experiments.tracking",
    "NullTracker": "kitune.experiments.tracking",
    "create_tracker": "kitune.experiments.tracking",
    "log_candidate": "kitune.experiments.tracking",
    "log_program_state": "kitune.experiments.tracking",
    "PromptRegistry": "kitune.experiments.prompts",
    "PromptVersion": "kitune.experiments.prompts",
    "prompt_name": "kitune.experiments.prompts",
    "register_packaged": "kitune.experiments.prompts",
}
"""Public name → the module that defines it."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
