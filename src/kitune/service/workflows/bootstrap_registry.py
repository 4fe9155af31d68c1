"""Registry policy of the bootstrap: how a drafted extractor instruction enters the prompt registry.

:func:`register_draft` adds the draft as a version of ``kitune-<corpus>-extractor`` (or reuses the
version that already has exactly this text), points ``candidate`` at it, and makes it
``production`` only when no production version is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kitune.errors import PromptNotFoundError

if TYPE_CHECKING:
    from kitune.tracking.prompts import PromptRegistry

__all__ = ["draft_tags", "register_draft"]


def draft_tags(*, seed: int, instruction_version: str, run_id: str | None) -> dict[str, str]:
    """Registry tags of a bootstrap draft: source, sample seed, instruction version, run id if any."""
    tags = {
        "kitune.source": "bootstrap",
        "kitune.seed": str(seed),
        "kitune.instruction_version": instruction_version,
    }
    if run_id:
        tags["kitune.run_id"] = run_id
    return tags


def register_draft(
    registry: PromptRegistry, name: str, text: str, *, tags: dict[str, str]
) -> tuple[int, tuple[str, ...], bool]:
    """Register ``text`` as a version of ``name``; alias ``candidate``, and ``production`` if unset.

    A version with exactly this text already present is reused (no duplicate version).

    Returns:
        ``(version, kitune aliases now pointing at it, reused)``.

    Raises:
        TrackingError: the registry could not be read or written.
    """
    existing = None
    try:
        existing = next((v for v in registry.versions(name) if v.text.strip() == text.strip()), None)
    except PromptNotFoundError:
        existing = None
    if existing is not None:
        version, reused = existing.version, True
    else:
        version = registry.register(
            name, text, tags=tags, commit_message="kitune bootstrap: domain draft"
        ).version
        reused = False
    aliases = ["candidate"]
    registry.set_alias(name, "candidate", version)
    try:
        if registry.get(name, "production").version == version:
            aliases.append("production")
    except PromptNotFoundError:
        registry.promote(name, version)
        aliases.append("production")
    return version, tuple(aliases), reused
