"""The serving setting: the KI store and the query rewriter (with its LM) that prompt versions run.

One place wires them, for every path that serves or measures a prompt version:

* :func:`rewriter_for` — a :class:`~kitune.programs.query_rewriter.QueryRewriter` with an
  instruction and its LM (kitune's adapter for a :class:`~kitune.lm.KituneLM`, else the DSPy
  context's); the loop (:mod:`kitune.service.tuning.loop_env`), ``kitune eval`` and the review
  queue's effect runs build their rewriter with it;
* :func:`open_store` / :func:`open_serving_store` — the KI table a setting names (the production
  extractor's for the latter), optionally without creating a missing embedded table;
* :func:`build_served` — store + rewriter + version labels of a resolved
  :class:`~kitune.service.serving.prompts.ProductionSetting`, as a :class:`ServedSetting`, for
  ``kitune context``, ``kitune serve`` (:mod:`kitune.server`) and ``kitune mcp``
  (:mod:`kitune.mcp_server`); :func:`follow_production` rebuilds it when a promote or rollback
  changed production, which is how a running server or MCP server follows the registry.

``kitune.lm.build_lm``, ``kitune.lm.adapter_for`` and ``kitune.retrieval.create_store`` are
looked up on their packages at call time (``kitune.lm.build_lm(...)``), so a replacement patched
there (tests, AGENTS.md) is the one used.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kitune.lm
import kitune.retrieval
from kitune.config import KituneConfig
from kitune.errors import KituneError
from kitune.optimizers.program_task import store_program
from kitune.programs.query_rewriter import QueryRewriter
from kitune.retrieval.base import Store
from kitune.schema import Filter
from kitune.service.serving.prompts import ProductionSetting, production_setting, setting_summary
from kitune.usage import TokenLedger

logger = logging.getLogger(__name__)

__all__ = [
    "LiveSetting",
    "ServedSetting",
    "active_kis",
    "build_served",
    "empty_store_message",
    "follow_production",
    "open_serving_store",
    "open_store",
    "rewriter_for",
    "served_versions",
]


@dataclass(frozen=True)
class ServedSetting:
    """The store, rewriter and prompt versions a server answers with."""

    store: Store
    rewriter: QueryRewriter | None
    versions: Mapping[str, str] = field(default_factory=dict)
    """Program → prompt version label, plus ``"store"`` → KI table/index (shown in /healthz)."""


class LiveSetting:
    """The store and rewriter a running server answers with, following a setting source (thread-safe).

    :meth:`current` asks ``source`` (with the served versions) at most every ``refresh_s``
    seconds, on a request or tool call, and swaps in what it returns; None means unchanged, and
    a failing source keeps the current setting (logged, so a registry hiccup never takes the
    server down). Without a store, one is created from ``cfg`` on first use
    (``kitune.retrieval.create_store``). Shared by the HTTP API (:mod:`kitune.server`) and the
    MCP server (:mod:`kitune.mcp_server`).

    Args:
        cfg: configuration (the store created when none is given).
        store: the KI store served first (None: created on first use).
        rewriter: the query rewriter with its LM, or None (plain plans).
        versions: what ``store``/``rewriter`` are (program → label, ``"store"`` → table).
        source: e.g. :func:`follow_production`; None serves what was given until exit.
        refresh_s: seconds between ``source`` calls.
        clock: monotonic clock in seconds.
    """

    def __init__(
        self,
        cfg: KituneConfig,
        *,
        store: Store | None,
        rewriter: QueryRewriter | None,
        versions: Mapping[str, str] | None,
        source: Callable[[Mapping[str, str]], ServedSetting | None] | None,
        refresh_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.rewriter = rewriter
        self._versions = dict(versions or {})
        self.source = source
        self.refresh_s = refresh_s
        self.clock = clock
        self.checked = clock()
        self.lock = threading.Lock()

    def _refresh(self) -> None:
        if self.source is None or self.clock() - self.checked < self.refresh_s:
            return
        self.checked = self.clock()
        try:
            new = self.source(dict(self._versions))
        except Exception:  # a registry hiccup must not take the server down: keep serving
            logger.exception("could not re-resolve the production setting; serving %s", self._versions)
            return
        if new is not None:
            logger.info("now serving %s (was %s)", dict(new.versions), self._versions)
            self.store, self.rewriter, self._versions = new.store, new.rewriter, dict(new.versions)

    def current(self) -> tuple[Store, QueryRewriter | None]:
        """The store (created from the config on first use when none was given) and the rewriter."""
        with self.lock:
            self._refresh()
            if self.store is None:
                self.store = kitune.retrieval.create_store(self.cfg)
            return self.store, self.rewriter

    def versions(self) -> dict[str, str]:
        """What is served now (program → label, ``"store"`` → table); no refresh."""
        with self.lock:
            return dict(self._versions)


def rewriter_for(instruction: str, lm: Any) -> QueryRewriter:
    """A query rewriter with ``instruction`` whose LM is ``lm``.

    Args:
        instruction: the rewriter's instruction text (a prompt version's).
        lm: the rewrite role's LM (``kitune.lm.build_lm(cfg, "rewrite")`` or a stand-in).

    Returns:
        The rewriter; for a :class:`~kitune.lm.KituneLM` it scopes kitune's adapter for that LM
        (:func:`kitune.lm.adapter_for`) around each rewrite, for any other LM the DSPy
        context's adapter (else the program's default).
    """
    adapter = kitune.lm.adapter_for(lm) if isinstance(lm, kitune.lm.KituneLM) else None
    rewriter = QueryRewriter(instruction, adapter=adapter)
    rewriter.set_lm(lm)
    return rewriter


def open_store(store_cfg: KituneConfig, *, read_only: bool = False) -> Store | None:
    """The KI store ``store_cfg.store`` names (``kitune.retrieval.create_store``).

    Args:
        store_cfg: a setting's configuration (its table named after the extractor version,
            :func:`~kitune.service.serving.prompts.versioned_store_cfg`).
        read_only: return None instead of creating a KI table that does not exist yet (a read
            must not create an empty table; :func:`kitune.retrieval.store_exists`).

    Raises:
        ConfigError, StoreUnavailableError: the store cannot be opened.
    """
    if read_only and not kitune.retrieval.store_exists(store_cfg):
        return None
    return kitune.retrieval.create_store(store_cfg)


def open_serving_store(cfg: KituneConfig, *, read_only: bool = False) -> Store | None:
    """The production extractor's KI table (:func:`~kitune.service.serving.prompts.production_setting`).

    Args:
        cfg: the configuration.
        read_only: return None instead of creating an embedded table that does not exist yet.

    Raises:
        ConfigError, StoreUnavailableError: the store cannot be opened.
    """
    return open_store(production_setting(cfg, programs=(store_program(),)).store_cfg, read_only=read_only)


def active_kis(store_cfg: KituneConfig) -> int:
    """Active KIs in ``store_cfg``'s table (0 when an embedded table does not exist; none is created).

    Raises:
        ConfigError, StoreUnavailableError: the store cannot be opened.
    """
    store = open_store(store_cfg, read_only=True)
    if store is None:
        return 0
    try:
        return store.count(Filter(statuses=("active",)))
    finally:
        store.close()


def served_versions(setting: ProductionSetting, programs: Sequence[str]) -> dict[str, str]:
    """Program → version label for ``programs``, plus ``"store"`` → the KI table or index."""
    summary = setting_summary(setting)
    out = {p: v for p, v in summary["prompts"].items() if p in programs}
    out["store"] = summary["store"]
    return out


def empty_store_message(store: Store, setting: ProductionSetting) -> str | None:
    """A message when the setting's KI table holds no KI (None otherwise or when it cannot count)."""
    try:
        n = store.count()
    except KituneError:
        return None  # an unreachable store is reported by the first search, with its own message
    if n:
        return None
    table = setting_summary(setting)["store"]
    return (
        f"the KI store {table} holds no KIs: run `kitune extract --data DIR` first (with the same "
        "--config), or pick another table with --prompt-version / --packaged"
    )


def build_served(
    cfg: KituneConfig,
    setting: ProductionSetting,
    *,
    programs: Sequence[str],
    use_rewriter: bool,
    ledger: TokenLedger,
    on_empty: Callable[[str], None] | None = None,
) -> ServedSetting:
    """The store and (unless ``use_rewriter`` is false) the rewriter with its LM that ``setting`` serves.

    Args:
        cfg: configuration (the rewrite role's LM).
        setting: from :func:`~kitune.service.serving.prompts.production_setting`.
        programs: the programs whose versions are labelled (:func:`served_versions`).
        use_rewriter: build the rewriter with the rewrite role's LM (False: plain plans, no LM).
        ledger: the token ledger the rewrite LM records into.
        on_empty: called with :func:`empty_store_message` when the store holds no KI, before
            any LM is built (so a refusal costs neither tokens nor the local model's start-up).

    Raises:
        KituneError: the store or the LM cannot be built (``ConfigError``,
            ``StoreUnavailableError``, …).
    """
    store = open_store(setting.store_cfg)
    assert store is not None  # not read-only: created when missing
    if on_empty is not None:
        empty = empty_store_message(store, setting)
        if empty:
            on_empty(empty)
    rewriter = None
    if use_rewriter:
        try:
            lm = kitune.lm.build_lm(cfg, "rewrite", ledger=ledger)
        except BaseException:
            store.close()  # the caller never gets the store: do not leave it open
            raise
        rewriter = rewriter_for(setting.prompts["rewriter"], lm)
    return ServedSetting(store=store, rewriter=rewriter, versions=served_versions(setting, programs))


def follow_production(
    cfg: KituneConfig, programs: Sequence[str], *, use_rewriter: bool, ledger: TokenLedger
) -> Callable[[Mapping[str, str]], ServedSetting | None]:
    """A server's ``setting_source``: re-resolve production, rebuild only when it changed.

    The source is called with the served versions; it resolves production again and returns a
    new :class:`ServedSetting` (:func:`build_served`) only when the versions differ (a promote
    or rollback happened), else None. A new setting that names another KI table holding no
    active KI (a promotion forced past :func:`~kitune.service.serving.prompts.check_promotable`,
    or a table emptied by hand) is not switched to: the server keeps answering from what it serves and
    logs a warning naming the table, on every refresh until production changes again.
    """

    def source(current: Mapping[str, str]) -> ServedSetting | None:
        setting = production_setting(cfg)
        wanted = served_versions(setting, programs)
        if wanted == dict(current):
            return None
        if wanted.get("store") != current.get("store") and active_kis(setting.store_cfg) == 0:
            logger.warning(
                "production now names the KI table %s, which holds no active KI: still serving %s "
                "(extract into it, or roll back)",
                setting_summary(setting)["store"],
                dict(current),
            )
            return None
        return build_served(cfg, setting, programs=programs, use_rewriter=use_rewriter, ledger=ledger)

    return source
