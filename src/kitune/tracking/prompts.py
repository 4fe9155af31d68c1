"""Versioned prompts on MLflow's prompt registry, with ``candidate``/``production`` aliases.

MLflow's prompt registry needs a database-backed store (a ``sqlite:///…/mlflow.db`` URI works
offline). Every accepted instruction becomes a new immutable version of the prompt
``kitune-<corpus>-<program>``. MLflow keeps no alias history, so each promotion is stamped on
the version itself (tag ``kitune.production_seq``, a counter increasing with every promotion,
plus ``kitune.production_at``); :meth:`PromptRegistry.rollback` walks that history back and
marks the version it leaves with ``kitune.rolled_back=true``.
"""

from __future__ import annotations

import builtins
import difflib
import os
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kitune.errors import PromptNotFoundError, TrackingError
from kitune.programs.instructions import load_instruction, prompt_name
from kitune.tracking.trackers import prepare_mlflow_env

__all__ = [
    "ALIASES",
    "PACKAGED_TAG",
    "PromptRegistry",
    "PromptSummary",
    "PromptVersion",
    "production_stamp_path",
    "prompt_name",
    "read_production_stamp",
    "register_packaged",
]

ALIASES: tuple[str, ...] = ("candidate", "production")
"""The aliases kitune manages: the latest accepted candidate and the version in use."""

_SEQ_TAG = "kitune.production_seq"
_AT_TAG = "kitune.production_at"
_ROLLED_BACK_TAG = "kitune.rolled_back"
_NAME_BAD = re.compile(r"[^A-Za-z0-9_.\-]+")

PACKAGED_TAG = "kitune.packaged"
"""Tag set to the instruction version (``<program>@<sha8>``) on a version holding the packaged text."""


def production_stamp_path(tracking_uri: str) -> Path | None:
    """The production stamp file of a SQLite registry: ``<db file>.production``; None for other URIs.

    Every :meth:`PromptRegistry.promote` and :meth:`PromptRegistry.rollback` rewrites it, so a
    running server learns of a promotion by reading one small file per request (no registry query,
    no LLM call; :class:`kitune.service.serving.setting.LiveSetting`). A remote registry has no
    such file: servers then notice a promotion on their periodic refresh.
    """
    if not tracking_uri.startswith("sqlite:///"):
        return None
    db = tracking_uri[len("sqlite:///") :]
    return Path(db + ".production") if db and db != ":memory:" else None


def read_production_stamp(tracking_uri: str) -> str | None:
    """The production stamp's content (changes with every promotion), or None when there is none."""
    path = production_stamp_path(tracking_uri)
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def _write_production_stamp(tracking_uri: str, name: str, version: int) -> None:
    """Rewrite the production stamp (atomically: a reader sees the old or the new one, never half)."""
    path = production_stamp_path(tracking_uri)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(f"{time.time_ns()} {name} {version}\n", encoding="utf-8")
    os.replace(tmp, path)


@dataclass(frozen=True)
class PromptVersion:
    """One immutable version of a prompt."""

    name: str
    version: int
    """1-based, increasing."""
    text: str
    tags: Mapping[str, str] = field(default_factory=dict)
    """User tags plus kitune's alias-history tags (``kitune.*``)."""
    aliases: tuple[str, ...] = ()
    """Aliases pointing at this version now (e.g. ``("production",)``)."""
    commit_message: str | None = None
    created_ms: int | None = None
    """Creation time, milliseconds since the epoch (UTC)."""


@dataclass(frozen=True)
class PromptSummary:
    """One row of :meth:`PromptRegistry.list`."""

    name: str
    latest_version: int
    aliases: Mapping[str, int]
    """Alias → version, for the aliases in :data:`ALIASES` that are set."""


class PromptRegistry:
    """Prompt versions and aliases on an MLflow prompt registry.

    Thread safety: each call is independent; MLflow's SQLite store serialises writes. Versions
    are immutable; only aliases and kitune's tags change.

    Args:
        tracking_uri: an MLflow URI with a database-backed registry, e.g.
            ``KituneConfig.mlflow_uri`` (``sqlite:///<workdir>/mlflow.db``).

    Raises:
        TrackingError: ``tracking_uri`` is empty or a plain file store (no registry there).
    """

    def __init__(self, tracking_uri: str) -> None:
        if not tracking_uri:
            raise TrackingError("PromptRegistry needs a tracking URI, e.g. sqlite:///kitune-work/mlflow.db")
        if tracking_uri.startswith("file:") or "://" not in tracking_uri:
            raise TrackingError(
                f"tracking URI {tracking_uri!r} is a file store, which cannot hold MLflow's prompt "
                "registry; use a database URI such as sqlite:///kitune-work/mlflow.db"
            )
        self.tracking_uri = tracking_uri
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The ``mlflow.MlflowClient`` (created on first use, telemetry off)."""
        with self._lock:
            if self._client is None:
                prepare_mlflow_env()  # telemetry off, bounded HTTP retries
                from mlflow import MlflowClient

                if self.tracking_uri.startswith("sqlite:///"):
                    Path(self.tracking_uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
                self._client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)
            return self._client

    # -- writes -----------------------------------------------------------------------------
    def register(
        self,
        name: str,
        text: str,
        *,
        tags: Mapping[str, str] | None = None,
        commit_message: str | None = None,
    ) -> PromptVersion:
        """Store ``text`` as a new version of ``name`` (creating the prompt if needed).

        Args:
            name: prompt name (see :func:`prompt_name`); ``[A-Za-z0-9_.-]`` only.
            text: the instruction text, stored verbatim (``{{…}}`` is not interpreted here).
            tags: string tags for this version (e.g. run id, metrics).
            commit_message: why this version exists.

        Returns:
            The new :class:`PromptVersion` (``version`` = previous latest + 1).

        Raises:
            ValueError: empty ``text`` or an invalid name.
            TrackingError: the registry could not be written.
        """
        if not text.strip():
            raise ValueError(f"prompt {name!r}: refusing to register an empty text")
        if _NAME_BAD.search(name) or not name:
            raise ValueError(
                f"prompt name {name!r} may only contain [A-Za-z0-9_.-]; build it with prompt_name()"
            )
        str_tags = {str(k): str(v) for k, v in (tags or {}).items()}
        try:
            pv = self.client.register_prompt(name, text, commit_message=commit_message, tags=str_tags or None)
        except Exception as e:
            raise TrackingError(
                f"could not register a version of prompt {name!r} at {self.tracking_uri}: {e}"
            ) from e
        return self._convert(pv)

    def set_alias(self, name: str, alias: str, version: int | str) -> PromptVersion:
        """Point ``alias`` of ``name`` at ``version``.

        Setting ``production`` this way also stamps the promotion history (as :meth:`promote`).

        Raises:
            ValueError: ``alias`` is not one of :data:`ALIASES`.
            PromptNotFoundError: unknown name or version.
        """
        if alias not in ALIASES:
            raise ValueError(f"alias must be one of {ALIASES}, got {alias!r}")
        if alias == "production":
            return self.promote(name, version)
        pv = self._get_version(name, version)
        self.client.set_prompt_alias(name, alias, pv.version)
        return self._get_version(name, pv.version)

    def promote(self, name: str, version: int | str) -> PromptVersion:
        """Make ``version`` the ``production`` version and record the promotion in its tags.

        The production stamp (:func:`production_stamp_path`) is rewritten, so running servers
        serve the new version from their next request.

        Returns:
            The promoted version (with its new tags and aliases).

        Raises:
            PromptNotFoundError: unknown name or version.
        """
        pv = self._get_version(name, version)
        seq = max((self._seq(v) or 0 for v in self.versions(name)), default=0) + 1
        client = self.client
        client.set_prompt_version_tag(name, pv.version, _SEQ_TAG, str(seq))
        client.set_prompt_version_tag(
            name, pv.version, _AT_TAG, datetime.now(UTC).isoformat(timespec="seconds")
        )
        client.set_prompt_version_tag(name, pv.version, _ROLLED_BACK_TAG, "false")
        client.set_prompt_alias(name, "production", pv.version)
        _write_production_stamp(self.tracking_uri, name, pv.version)
        return self._get_version(name, pv.version)

    def rollback(self, name: str) -> PromptVersion:
        """Move ``production`` back to the version that was in production before the current one.

        The version left behind is tagged ``kitune.rolled_back=true`` and skipped by later
        rollbacks, so repeated rollbacks walk further back (v3 → v2 → v1).

        Returns:
            The version now in production.

        Raises:
            PromptNotFoundError: unknown name, no production version, or nothing earlier to
                roll back to.
        """
        current, target = self.rollback_target(name)
        client = self.client
        client.set_prompt_version_tag(name, current.version, _ROLLED_BACK_TAG, "true")
        client.set_prompt_alias(name, "production", target.version)
        _write_production_stamp(self.tracking_uri, name, target.version)
        return self._get_version(name, target.version)

    # -- reads ------------------------------------------------------------------------------
    def rollback_target(self, name: str) -> tuple[PromptVersion, PromptVersion]:
        """``(current production, the version rollback would put back)``, without changing anything.

        Raises:
            PromptNotFoundError: unknown name, no production version, or nothing earlier.
        """
        current = self.get(name, "production")
        cur_seq = self._seq(current) or 0
        earlier = [
            v
            for v in self.versions(name)
            if (s := self._seq(v)) is not None and s < cur_seq and v.tags.get(_ROLLED_BACK_TAG) != "true"
        ]
        if not earlier:
            raise PromptNotFoundError(
                f"prompt {name!r}: version {current.version} is the first production version; "
                "there is nothing to roll back to (promote a version instead)",
                name=name,
                version="production",
            )
        return current, max(earlier, key=lambda v: self._seq(v) or 0)

    def get(self, name: str, version_or_alias: int | str | None = None) -> PromptVersion:
        """Fetch one version.

        Args:
            name: prompt name.
            version_or_alias: a version number (``3``, ``"3"``, ``"v3"``), an alias
                (``"production"``, ``"candidate"``), ``"latest"``, or None (production if set,
                else latest).

        Raises:
            PromptNotFoundError: unknown name, version or alias (the message lists what exists).
        """
        if version_or_alias is None:
            try:
                return self.get(name, "production")
            except PromptNotFoundError:
                return self.get(name, "latest")
        key = str(version_or_alias).strip()
        if key.lower() == "latest":
            versions = self.versions(name)
            return versions[-1]
        if re.fullmatch(r"v?\d+", key):
            return self._get_version(name, int(key.lstrip("v")))
        self._require_prompt(name)
        try:
            pv = self.client.get_prompt_version_by_alias(name, key)
        except Exception as e:
            raise PromptNotFoundError(
                f"prompt {name!r} has no alias {key!r}; set one with "
                f"`kitune prompts promote {name} VERSION` (aliases: {', '.join(ALIASES)})",
                name=name,
                version=key,
            ) from e
        return self._convert(pv)

    def versions(self, name: str) -> builtins.list[PromptVersion]:
        """Every version of ``name``, oldest first.

        Raises:
            PromptNotFoundError: unknown name.
        """
        self._require_prompt(name)
        client = self.client
        out: list[PromptVersion] = []
        token: str | None = None
        while True:
            page = client.search_prompt_versions(name, max_results=1000, page_token=token)
            out.extend(self._convert(v) for v in page)
            token = getattr(page, "token", None)
            if not token:
                break
        aliases = self._aliases(name)
        by_version: dict[int, list[str]] = {}
        for alias, v in aliases.items():
            by_version.setdefault(v, []).append(alias)
        out = [
            PromptVersion(
                v.name,
                v.version,
                v.text,
                v.tags,
                tuple(sorted(by_version.get(v.version, []))),
                v.commit_message,
                v.created_ms,
            )
            for v in out
        ]
        return sorted(out, key=lambda v: v.version)

    def list(self) -> builtins.list[PromptSummary]:
        """Every prompt in the registry, sorted by name, with latest version and aliases."""
        client = self.client
        names: list[str] = []
        token: str | None = None
        while True:
            page = client.search_prompts(max_results=1000, page_token=token)
            names.extend(p.name for p in page)
            token = getattr(page, "token", None)
            if not token:
                break
        out = []
        for n in sorted(set(names)):
            versions = self.versions(n)
            if versions:
                out.append(PromptSummary(n, versions[-1].version, self._aliases(n)))
        return out

    def diff(self, name: str, v1: int | str, v2: int | str, *, context_lines: int = 3) -> str:
        """Unified diff from version/alias ``v1`` to ``v2`` (empty string when identical).

        Raises:
            PromptNotFoundError: unknown name, version or alias.
        """
        a, b = self.get(name, v1), self.get(name, v2)
        lines = difflib.unified_diff(
            a.text.splitlines(keepends=True),
            b.text.splitlines(keepends=True),
            fromfile=f"{name}@v{a.version}",
            tofile=f"{name}@v{b.version}",
            n=context_lines,
        )
        return "".join(line if line.endswith("\n") else line + "\n" for line in lines)

    def history(self, name: str) -> builtins.list[PromptVersion]:
        """Versions that have been in production, in promotion order (oldest first)."""
        return sorted(
            (v for v in self.versions(name) if self._seq(v) is not None), key=lambda v: self._seq(v) or 0
        )

    # -- internals --------------------------------------------------------------------------
    def _require_prompt(self, name: str) -> None:
        try:
            found = self.client.get_prompt(name)
        except Exception:
            found = None
        if found is None:
            known = [p.name for p in self.client.search_prompts(max_results=50)]
            hint = f"known prompts: {', '.join(sorted(known))}" if known else "the registry is empty"
            raise PromptNotFoundError(f"no prompt named {name!r} at {self.tracking_uri} ({hint})", name=name)

    def _get_version(self, name: str, version: int | str) -> PromptVersion:
        self._require_prompt(name)
        try:
            number = int(str(version).lstrip("v"))
        except ValueError:
            return self.get(name, version)
        try:
            pv = self.client.get_prompt_version(name, number)
        except Exception:
            pv = None
        if pv is None:
            have = [v.version for v in self.versions(name)]
            raise PromptNotFoundError(
                f"prompt {name!r} has no version {number}; versions: {have}", name=name, version=str(number)
            )
        return self._convert(pv)

    def _aliases(self, name: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for alias in ALIASES:
            try:
                out[alias] = int(self.client.get_prompt_version_by_alias(name, alias).version)
            except Exception:
                continue
        return out

    @staticmethod
    def _seq(v: PromptVersion) -> int | None:
        raw = v.tags.get(_SEQ_TAG)
        return int(raw) if raw and raw.isdigit() else None

    @staticmethod
    def _convert(pv: Any) -> PromptVersion:
        template = pv.template
        text = template if isinstance(template, str) else str(template)
        return PromptVersion(
            name=pv.name,
            version=int(pv.version),
            text=text,
            tags=dict(pv.tags or {}),
            aliases=tuple(sorted(pv.aliases or ())),
            commit_message=pv.commit_message,
            created_ms=getattr(pv, "creation_timestamp", None),
        )


def register_packaged(
    registry: PromptRegistry, corpus: str, programs: Sequence[str]
) -> dict[str, PromptVersion]:
    """Register each program's packaged instruction as version 1 when its prompt has no version yet.

    So the first accepted proposal becomes version 2 and ``kitune prompts rollback`` always has
    the packaged prompt to go back to. A prompt that already has versions (an earlier loop, a
    ``kitune bootstrap`` draft) is left untouched. A new version 1 is promoted to
    ``production`` (with the promotion-history tags) and tagged :data:`PACKAGED_TAG` =
    ``<program>@<sha8>``.

    Args:
        registry: the prompt registry.
        corpus: corpus name (see :func:`prompt_name`).
        programs: program names with a packaged prompt (``kitune/prompts/<program>.txt``).

    Returns:
        Program → the version registered now; programs already registered are absent.

    Raises:
        ConfigError: a program has no packaged prompt.
        TrackingError: the registry could not be read or written.
    """
    out: dict[str, PromptVersion] = {}
    for program in programs:
        packaged = load_instruction(program)
        name = prompt_name(corpus, program)
        try:
            registry.versions(name)
            continue  # has versions already
        except PromptNotFoundError:
            pass
        pv = registry.register(
            name,
            packaged.text,
            tags={PACKAGED_TAG: packaged.version},
            commit_message=f"packaged {program} prompt ({packaged.version}), registered as the baseline",
        )
        out[program] = registry.promote(name, pv.version)
    return out
