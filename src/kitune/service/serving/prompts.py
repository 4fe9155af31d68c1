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

**Staged versions.** A version registered with the tag ``kitune.table`` (:data:`TABLE_TAG`;
``kitune drift run`` stages one) names its own KI table; while it is only ``candidate`` nothing
serves it. :func:`promote_prompt` and :func:`rollback_prompt` check the table the switch would
serve first (:func:`check_promotable`): an empty table, or one whose extraction failed on more
than ``max_failed_share`` of its documents, is refused with the counts and the override
(``--force``), and nothing moves. The switch itself is one alias move; a running server
swaps its whole setting at once (:class:`kitune.service.serving.setting.LiveSetting`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import kitune.retrieval
from kitune.config import KituneConfig, with_overrides
from kitune.errors import ConfigError, PromotionRefusedError, PromptNotFoundError, TrackingError
from kitune.optimizers.program_task import get_program_task, served_programs, store_program
from kitune.programs.instructions import instruction_version
from kitune.schema import Filter
from kitune.tracking.prompts import PromptRegistry, PromptSummary, PromptVersion, prompt_name

__all__ = [
    "DEFAULT_MAX_FAILED_SHARE",
    "TABLE_TAG",
    "ProductionSetting",
    "Promotable",
    "describe_setting",
    "diff_prompt_versions",
    "list_prompts",
    "open_registry",
    "parse_prompt_selection",
    "production_setting",
    "promote_prompt",
    "prompt_versions",
    "rollback_prompt",
    "served_table",
    "setting_summary",
    "show_prompt",
    "state_path_for",
    "table_store_cfg",
    "versioned_store_cfg",
]

DEFAULT_ALIAS = "production"

TABLE_TAG = "kitune.table"
"""Version tag naming the KI table (LanceDB) or index (Elasticsearch) a staged extractor version serves."""

DEFAULT_MAX_FAILED_SHARE = 0.2
"""Promotion refuses a version whose extraction failed on more than this share of its documents."""


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


def table_store_cfg(cfg: KituneConfig, table: str) -> KituneConfig:
    """``cfg`` whose KI table (LanceDB) or index (Elasticsearch) is exactly ``table``."""
    return with_overrides(cfg, {f"store.{cfg.store.collection_field}": table})


def served_table(store_cfg: KituneConfig) -> str:
    """The table (LanceDB) or index (Elasticsearch) name ``store_cfg`` points at."""
    return store_cfg.store.collection


def state_path_for(store_cfg: KituneConfig, prompt_version: str) -> Path:
    """The extraction resume file of ``prompt_version`` writing into ``store_cfg``'s table.

    The default table of a version (``<table>-<sha8>``) keeps the historical name
    ``<workdir>/extraction/<corpus>.<version>.state.jsonl``; a staged table (``kitune drift run``)
    gets ``…state.<table>.jsonl`` beside it, so the two never share resume lines.
    """
    safe = prompt_version.replace("@", "-").replace("/", "-")
    folder = Path(store_cfg.workdir) / "extraction"
    table = served_table(store_cfg)
    suffix = prompt_version.split("@", 1)[-1]
    if table.endswith(f"-{suffix}"):
        return folder / f"{store_cfg.corpus_name}.{safe}.state.jsonl"
    return folder / f"{store_cfg.corpus_name}.{safe}.state.{table}.jsonl"


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
        raise ConfigError(
            "--packaged and --prompt-version/--prompt-alias each choose the prompts: give one of them"
        )
    unknown = sorted(set(chosen) - set(programs))
    if unknown:
        raise ConfigError(f"no such program {unknown}: choose from {', '.join(programs)}")
    reg = None if packaged else (registry if registry is not None else _registry_or_none(cfg))
    prompts: dict[str, str] = {}
    versions: dict[str, str] = {}
    pinned: str | None = None
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
            if program == store_program() and found.tags.get(TABLE_TAG):
                pinned = found.tags[TABLE_TAG]
            continue
        text = get_program_task(program).start_instruction()
        prompts[program] = text
        why = "--packaged" if packaged else f"no {key} version of {name}"
        versions[program] = f"packaged {instruction_version(program, text)} ({why})"
    writer = store_program()
    writer_text = prompts.get(writer) or get_program_task(writer).start_instruction()
    store_cfg = (
        table_store_cfg(cfg, pinned)
        if pinned
        else versioned_store_cfg(cfg, instruction_version(writer, writer_text))
    )
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


class Promotable(NamedTuple):
    """What :func:`check_promotable` found in the KI table a switch would serve."""

    table: str
    """Table (LanceDB) or index (Elasticsearch) name."""
    kis: int
    """Active KIs in it (what would be served)."""
    failed: int
    """Documents whose last extraction into it failed (its resume file)."""
    documents: int
    """Documents its resume file names."""


def _version_store_cfg(cfg: KituneConfig, pv: PromptVersion) -> KituneConfig:
    """The KI table an extractor version serves: its :data:`TABLE_TAG`, else ``<table>-<sha8>``."""
    pinned = pv.tags.get(TABLE_TAG)
    if pinned:
        return table_store_cfg(cfg, pinned)
    return versioned_store_cfg(cfg, instruction_version(store_program(), pv.text))


def _count_active(store_cfg: KituneConfig) -> int:
    """Active KIs in ``store_cfg``'s table; 0 when it does not exist (none is created)."""
    if not kitune.retrieval.store_exists(store_cfg):
        return 0
    store = kitune.retrieval.create_store(store_cfg)
    try:
        return store.count(Filter(statuses=("active",)))
    finally:
        store.close()


def _extraction_failures(store_cfg: KituneConfig, prompt_version: str) -> tuple[int, int]:
    """``(failed, documents)`` from the table's extraction resume file (last line per document wins)."""
    path = state_path_for(store_cfg, prompt_version)
    if not path.is_file():
        return 0, 0
    last: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash: the extraction's own reader skips it too
        if isinstance(rec, dict) and isinstance(rec.get("docid"), str):
            last[rec["docid"]] = str(rec.get("status", ""))
    return sum(1 for v in last.values() if v == "failed"), len(last)


def check_promotable(
    cfg: KituneConfig,
    name: str,
    pv: PromptVersion,
    *,
    max_failed_share: float = DEFAULT_MAX_FAILED_SHARE,
    force: bool = False,
    action: str = "promote",
) -> Promotable | None:
    """Refuse a switch to ``pv`` when the KI table it would serve is empty or badly extracted.

    Only the corpus's extractor prompt names a KI table; any other prompt passes (None). With
    ``force`` the counts are returned and nothing is refused.

    Args:
        cfg: configuration (corpus name, store, workdir).
        name: the prompt name.
        pv: the version that would be served.
        max_failed_share: refuse when failed documents / documents exceeds this (0.0–1.0).
        force: report, never refuse.
        action: ``"promote"`` or ``"rollback"`` (the message's wording).

    Returns:
        The counts, or None for a prompt that names no KI table.

    Raises:
        ValueError: ``max_failed_share`` outside 0–1.
        PromotionRefusedError: an empty table, or too many failed documents (nothing switched).
    """
    if not 0.0 <= max_failed_share <= 1.0:
        raise ValueError(f"--max-failed-share {max_failed_share}: use a share between 0 and 1")
    if name != prompt_name(cfg.corpus_name, store_program()):
        return None
    store_cfg = _version_store_cfg(cfg, pv)
    table = served_table(store_cfg)
    kis = _count_active(store_cfg)
    failed, docs = _extraction_failures(store_cfg, instruction_version(store_program(), pv.text))
    found = Promotable(table, kis, failed, docs)
    if force:
        return found
    verb = "promote" if action == "promote" else "roll back to"
    if kis == 0:
        raise PromotionRefusedError(
            f"refusing to {verb} {name} v{pv.version}: its KI table {table} holds 0 active KIs, so every "
            "look-up would come back empty (production is unchanged). Extract into it first "
            f"(`kitune extract --data DIR --prompt-version extractor={pv.version}`), or pass --force to "
            f"{action} anyway",
            table=table,
            kis=kis,
            failed=failed,
            total=docs,
        )
    if docs and failed / docs > max_failed_share:
        raise PromotionRefusedError(
            f"refusing to {verb} {name} v{pv.version}: extraction into {table} failed on {failed} of "
            f"{docs} documents ({failed / docs:.0%} > --max-failed-share {max_failed_share:.0%}; production "
            "is unchanged). Rerun the extraction to retry them, raise --max-failed-share, or pass --force",
            table=table,
            kis=kis,
            failed=failed,
            total=docs,
        )
    return found


def promote_prompt(
    cfg: KituneConfig,
    name: str,
    version: int | str,
    *,
    force: bool = False,
    max_failed_share: float = DEFAULT_MAX_FAILED_SHARE,
) -> PromptVersion:
    """Point ``production`` at ``version`` and record the promotion, after :func:`check_promotable`.

    Raises:
        PromptNotFoundError: unknown name or version.
        PromotionRefusedError: the version's KI table is empty or badly extracted (nothing moved).
    """
    registry = open_registry(cfg)
    pv = registry.get(name, version)
    check_promotable(cfg, name, pv, max_failed_share=max_failed_share, force=force)
    return registry.promote(name, pv.version)


def rollback_prompt(
    cfg: KituneConfig,
    name: str,
    *,
    force: bool = False,
    max_failed_share: float = DEFAULT_MAX_FAILED_SHARE,
) -> PromptVersion:
    """Move ``production`` back to the previous production version; returns it.

    The version rolled back to is checked as a promotion is (:func:`check_promotable`).

    Raises:
        PromptNotFoundError: unknown name, no production version, or no earlier one.
        PromotionRefusedError: the earlier version's KI table is empty or badly extracted.
    """
    registry = open_registry(cfg)
    _current, target = registry.rollback_target(name)
    check_promotable(cfg, name, target, max_failed_share=max_failed_share, force=force, action="rollback")
    return registry.rollback(name)
