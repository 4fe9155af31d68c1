"""Prompt-registry operations shared by the CLI (``kitune prompts …``), the HTTP API and MCP.

Every function takes the effective :class:`~kitune.config.KituneConfig` and works on the
registry at ``cfg.mlflow_uri`` (``sqlite:///<workdir>/mlflow.db`` by default).

**What runs** is decided here, once, by :func:`production_setting`: ``kitune serve``,
``context``, ``extract``, ``eval`` (and the MCP server) use each program's prompt under the
``production`` alias of ``kitune-<corpus>-<program>`` and the KI table built with the
extractor in use (``<store.table>-<sha8>``, :func:`versioned_store_cfg`, the table the loop
writes). A program with no production version runs its packaged prompt, labelled as such.
So ``kitune prompts promote`` / ``rollback`` change what the next command (or a running
server, see :mod:`kitune.server`) uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from kitune.config import KituneConfig, with_overrides
from kitune.errors import ConfigError, PromptNotFoundError, TrackingError
from kitune.optimizers.program_task import get_program_task, served_programs, store_program
from kitune.programs.instructions import instruction_version
from kitune.tracking.prompts import PromptRegistry, PromptSummary, PromptVersion, prompt_name

__all__ = [
    "ProductionSetting",
    "describe_setting",
    "diff_prompt_versions",
    "list_prompts",
    "open_registry",
    "parse_prompt_selection",
    "production_setting",
    "promote_prompt",
    "prompt_versions",
    "rollback_prompt",
    "setting_summary",
    "show_prompt",
    "versioned_store_cfg",
]

DEFAULT_ALIAS = "production"


class ProductionSetting(NamedTuple):
    """What the serving commands run: unpacks as ``prompts, versions, store_cfg``."""

    prompts: dict[str, str]
    """Program → instruction text."""
    versions: dict[str, str]
    """Program → human label, e.g. ``"kitune-fixture-rewriter v3 (production)"`` or
    ``"packaged rewriter@1a2b3c4d (no production version of kitune-fixture-rewriter)"``."""
    store_cfg: KituneConfig
    """``cfg`` with the KI table (LanceDB) or index (Elasticsearch) of the extractor in use."""


def versioned_store_cfg(cfg: KituneConfig, extractor_version: str) -> KituneConfig:
    """``cfg`` whose KI table/index is named after ``extractor_version`` (``<table>-<sha8>``).

    The loop keeps one table per extractor prompt version; every command that reads or writes
    KIs of a given extractor goes through this function, so they agree on the table.

    Args:
        cfg: configuration; its store section's collection (``store.table`` for LanceDB,
            ``store.index`` for Elasticsearch: ``StoreSection.collection``) is the base name.
        extractor_version: ``extractor@<sha8>`` (:func:`kitune.programs.instructions.instruction_version`).

    Returns:
        A re-validated copy through :func:`kitune.config.with_overrides`, so the environment is
        not read again: a setting given explicitly (``--workdir`` over ``KITUNE_WORKDIR``, a
        ``store.path``) stays as ``cfg`` has it. ``cfg`` itself is not changed.
    """
    suffix = extractor_version.split("@", 1)[-1]
    store = cfg.store
    return with_overrides(cfg, {f"store.{store.collection_field}": f"{store.collection}-{suffix}"})


def parse_prompt_selection(specs: Sequence[str]) -> dict[str, str]:
    """Parse ``--prompt-version`` values into program → version-or-alias.

    Each spec is ``PROGRAM=VERSION`` (``extractor=3``, ``rewriter=candidate``) or a bare alias
    (``candidate``, ``latest``) applying to every program; a later spec wins.

    Raises:
        ConfigError: an unknown program, an empty value, or a bare number (a version number
            only makes sense for one program).
    """
    out: dict[str, str] = {}
    for raw in specs:
        spec = raw.strip()
        program, sep, value = spec.partition("=")
        if not sep:
            if not spec or spec.lstrip("v").isdigit():
                raise ConfigError(
                    f"--prompt-version {raw!r}: a bare value must be an alias (production, candidate, "
                    "latest); give a version number per program, e.g. extractor=3"
                )
            out.update(dict.fromkeys(served_programs(), spec))
            continue
        program, value = program.strip(), value.strip()
        if program not in served_programs() or not value:
            raise ConfigError(
                f"--prompt-version {raw!r}: use PROGRAM=VERSION with PROGRAM one of "
                f"{', '.join(served_programs())} (e.g. rewriter=3 or rewriter=candidate)"
            )
        out[program] = value
    return out


def _registry_or_none(cfg: KituneConfig) -> PromptRegistry | None:
    """The registry at ``cfg.mlflow_uri``; None when it cannot hold prompts or does not exist yet.

    A ``sqlite:///`` database file that does not exist means nothing was ever registered; it
    is not created (reading must not write, and MLflow's schema set-up takes seconds).
    """
    uri = cfg.mlflow_uri
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        return None
    try:
        return PromptRegistry(uri)
    except TrackingError:
        return None


def production_setting(
    cfg: KituneConfig,
    registry: PromptRegistry | None = None,
    *,
    select: Mapping[str, str] | None = None,
    packaged: bool = False,
    programs: Sequence[str] | None = None,
) -> ProductionSetting:
    """The prompts and KI table the serving commands run (see the module docstring).

    Args:
        cfg: configuration (``corpus_name`` names the prompts, ``store`` the base table).
        registry: the prompt registry; None opens the one at ``cfg.mlflow_uri`` (a missing
            SQLite file or a file-store URI means "nothing registered").
        select: program → version or alias to use instead of ``production`` (see
            :func:`parse_prompt_selection`). A selected version must exist.
        packaged: use the packaged prompts for every program (``select`` must be empty).
        programs: which programs to resolve; None: every served program
            (:func:`~kitune.optimizers.program_task.served_programs`).

    Returns:
        ``ProductionSetting(prompts, versions, store_cfg)``; ``store_cfg`` names the table of
        the resolved extractor (:func:`~kitune.optimizers.program_task.store_program`; its
        packaged prompt when it is not in ``programs``).

    Raises:
        ConfigError: ``packaged`` with ``select``, or a program without a packaged prompt.
        PromptNotFoundError: a version or alias named in ``select`` does not exist.
        TrackingError: the registry exists but could not be read.
    """
    programs = served_programs() if programs is None else tuple(programs)
    chosen = dict(select or {})
    if packaged and chosen:
        raise ConfigError("give either --packaged or --prompt-version, not both")
    unknown = sorted(set(chosen) - set(programs))
    if unknown:
        raise ConfigError(f"no such program {unknown}: choose from {', '.join(programs)}")
    reg = None if packaged else (registry if registry is not None else _registry_or_none(cfg))
    prompts: dict[str, str] = {}
    versions: dict[str, str] = {}
    for program in programs:
        name = prompt_name(cfg.corpus_name, program)
        explicit = program in chosen
        key = chosen.get(program, DEFAULT_ALIAS)
        found: PromptVersion | None = None
        if reg is not None:
            try:
                found = reg.get(name, key)
            except PromptNotFoundError:
                if explicit:
                    raise
        elif explicit:
            raise PromptNotFoundError(
                f"no prompt named {name!r}: nothing is registered at {cfg.mlflow_uri} yet "
                "(run `kitune optimize` or `kitune bootstrap` first, or drop the version choice)",
                name=name,
                version=key,
            )
        if found is not None:
            prompts[program] = found.text
            shown = key if not key.lstrip("v").isdigit() else ", ".join(found.aliases) or "no alias"
            versions[program] = f"{name} v{found.version} ({shown})"
            continue
        text = get_program_task(program).start_instruction()
        prompts[program] = text
        why = "--packaged" if packaged else f"no {key} version of {name}"
        versions[program] = f"packaged {instruction_version(program, text)} ({why})"
    writer = store_program()
    writer_text = prompts.get(writer) or get_program_task(writer).start_instruction()
    store_cfg = versioned_store_cfg(cfg, instruction_version(writer, writer_text))
    return ProductionSetting(prompts, versions, store_cfg)


def describe_setting(setting: ProductionSetting, programs: Sequence[str] | None = None) -> list[str]:
    """One line per program (``"<program> prompt: <label>"``) plus the KI table line.

    Args:
        setting: from :func:`production_setting`.
        programs: which programs to show (None: all resolved).
    """
    shown = [p for p in (programs or setting.versions) if p in setting.versions]
    lines = [f"{p} prompt: {setting.versions[p]}" for p in shown]
    store = setting.store_cfg.store
    lines.append(f"KI store: {store.type} {store.collection_kind} {store.collection}")
    return lines


def setting_summary(setting: ProductionSetting) -> dict[str, Any]:
    """JSON-able ``{"prompts": program → label, "store": table or index}`` (run records, /healthz)."""
    store = setting.store_cfg.store
    return {
        "prompts": dict(setting.versions),
        "store": store.collection,
    }


def open_registry(cfg: KituneConfig) -> PromptRegistry:
    """The prompt registry at ``cfg.mlflow_uri``.

    Raises:
        TrackingError: the URI cannot hold a prompt registry (a plain file store).
    """
    return PromptRegistry(cfg.mlflow_uri)


def list_prompts(cfg: KituneConfig) -> list[PromptSummary]:
    """Every registered prompt, sorted by name (empty when nothing was registered yet; creates nothing)."""
    registry = _registry_or_none(cfg)
    return registry.list() if registry is not None else []


def prompt_versions(cfg: KituneConfig, name: str) -> list[PromptVersion]:
    """Every version of ``name``, oldest first.

    Raises:
        PromptNotFoundError: unknown name (also when nothing was registered yet; creates nothing).
    """
    registry = _registry_or_none(cfg)
    if registry is None:
        raise PromptNotFoundError(
            f"no prompt {name!r}: nothing is registered yet (run kitune optimize)", name=name
        )
    return registry.versions(name)


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
