"""Prompt-registry operations shared by the CLI (``kitune prompts …``) and the HTTP API.

Every function takes the effective :class:`~kitune.config.KituneConfig` and works on the
registry at ``cfg.mlflow_uri`` (``sqlite:///<workdir>/mlflow.db`` by default).
"""

from __future__ import annotations

from kitune.config import KituneConfig
from kitune.experiments.prompts import PromptRegistry, PromptSummary, PromptVersion

__all__ = [
    "diff_prompt_versions",
    "list_prompts",
    "open_registry",
    "promote_prompt",
    "prompt_versions",
    "rollback_prompt",
    "show_prompt",
]


def open_registry(cfg: KituneConfig) -> PromptRegistry:
    """The prompt registry at ``cfg.mlflow_uri``.

    Raises:
        TrackingError: the URI cannot hold a prompt registry (a plain file store).
    """
    return PromptRegistry(cfg.mlflow_uri)


def list_prompts(cfg: KituneConfig) -> list[PromptSummary]:
    """Every registered prompt, sorted by name (empty when nothing was registered yet)."""
    return open_registry(cfg).list()


def prompt_versions(cfg: KituneConfig, name: str) -> list[PromptVersion]:
    """Every version of ``name``, oldest first.

    Raises:
        PromptNotFoundError: unknown name.
    """
    return open_registry(cfg).versions(name)


def show_prompt(
    cfg: KituneConfig, name: str, *, version: int | str | None = None, alias: str | None = None
) -> PromptVersion:
    """One version of ``name``: by ``version``, by ``alias``, or production-else-latest.

    Raises:
        ValueError: both ``version`` and ``alias`` given.
        PromptNotFoundError: unknown name, version or alias.
    """
    if version is not None and alias is not None:
        raise ValueError("give either a version or an alias, not both")
    return open_registry(cfg).get(name, version if version is not None else alias)


def diff_prompt_versions(cfg: KituneConfig, name: str, v1: int | str, v2: int | str) -> str:
    """Unified diff of ``name`` from ``v1`` to ``v2`` (versions or aliases); "" when identical.

    Raises:
        PromptNotFoundError: unknown name, version or alias.
    """
    return open_registry(cfg).diff(name, v1, v2)


def promote_prompt(cfg: KituneConfig, name: str, version: int | str) -> PromptVersion:
    """Point ``production`` at ``version`` and record the promotion.

    Raises:
        PromptNotFoundError: unknown name or version.
    """
    return open_registry(cfg).promote(name, version)


def rollback_prompt(cfg: KituneConfig, name: str) -> PromptVersion:
    """Move ``production`` back to the previous production version; returns it.

    Raises:
        PromptNotFoundError: unknown name, no production version, or no earlier one.
    """
    return open_registry(cfg).rollback(name)
