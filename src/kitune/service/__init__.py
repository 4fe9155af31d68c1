"""Functions the CLI, the HTTP API and the MCP server all call.

Public names are imported lazily on first use (PEP 562), so importing the package is cheap and
has no side effects; ``__all__`` lists them and ``tests/test_public_api.py`` checks it.
"""

from __future__ import annotations

from kitune.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "run_optimize": "kitune.service.tuning.optimize",
    "OptimizeOptions": "kitune.service.tuning.options",
    "ServiceLoopEnv": "kitune.service.tuning.loop_env",
    "LoopDeps": "kitune.service.tuning.loop_env",
    "store_fingerprint": "kitune.service.pipelines.eval_cache",
    "run_eval": "kitune.service.pipelines.evaluation",
    "make_judge": "kitune.service.pipelines.evaluation",
    "get_context": "kitune.service.serving.context",
    "render_context": "kitune.service.serving.context",
    "production_setting": "kitune.service.serving.prompts",
    "ProductionSetting": "kitune.service.serving.prompts",
    "versioned_store_cfg": "kitune.service.serving.prompts",
    "extract_corpus": "kitune.service.pipelines.extraction",
    "drift_check": "kitune.service.workflows.drift",
    "drift_run": "kitune.service.workflows.drift",
    "import_traces": "kitune.service.workflows.traces",
}
"""Public name → the module that defines it."""

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
