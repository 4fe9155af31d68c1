"""kitune: pre-computed, self-tuning context (Knowledge Indicators) for LLM agents.

The top level exports the light, dependency-free records and the config loader; the heavier
parts live in their areas (``kitune.programs``, ``kitune.retrieval``, ``kitune.evaluation``,
``kitune.optimizers``, ``kitune.service``). Importing ``kitune`` has no side effects.
"""

from __future__ import annotations

from kitune.config import KituneConfig, load_config
from kitune.errors import KituneError
from kitune.ki import KI
from kitune.schema import Document, Filter, QueryPlan

__version__ = "0.1.0"

__all__ = [
    "KI",
    "Document",
    "Filter",
    "KituneConfig",
    "KituneError",
    "QueryPlan",
    "__version__",
    "load_config",
]
