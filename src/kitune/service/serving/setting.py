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
  changed production, which is how a running server or MCP server follows the registry;
* :class:`LiveSetting` — what a running server answers with. Before every request it reads the
  registry's production stamp (one small file that every promote and rollback rewrites,
  :func:`kitune.tracking.prompts.production_stamp_path`; no registry query, no LLM call), so a
  promotion is served from the next request on, not the next refresh tick;
* :class:`ServedRequestLog` — every served request as one trace in the tracking store (MLflow),
  tagged with the prompt versions and the KI table that answered it (``kitune.prompt.<program>``,
  ``kitune.store``), written off the request path by one background thread.

``kitune.lm.build_lm``, ``kitune.lm.adapter_for`` and ``kitune.retrieval.create_store`` are
looked up on their packages at call time (``kitune.lm.build_lm(...)``), so a replacement patched
there (tests, AGENTS.md) is the one used.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
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
from kitune.tracking.episodes import MAX_ATTR_CHARS, EpisodeRecord
from kitune.tracking.prompts import read_production_stamp
from kitune.tracking.tracker_base import BaseTracker
from kitune.usage import TokenLedger

logger = logging.getLogger(__name__)

__all__ = [
    "LiveSetting",
    "ServedRequest",
    "ServedRequestLog",
    "ServedSetting",
    "active_kis",
    "build_served",
    "empty_store_message",
    "follow_production",
    "open_serving_store",
    "open_store",
    "rewriter_for",
    "served_request_record",
    "served_versions",
]


@dataclass(frozen=True)
class ServedSetting:
    """The store, rewriter and prompt versions a server answers with."""

    store: Store
    rewriter: QueryRewriter | None
    versions: Mapping[str, str] = field(default_factory=dict)
    """Program → prompt version label, plus ``"store"`` → KI table/index (shown in /healthz)."""


@dataclass(frozen=True)
class ServedRequest:
    """One served request: what answered it and how it ended."""

    endpoint: str
    """Where it came in: ``http /api/_get_context``, ``mcp get_context``."""
    query: str
    """The question asked."""
    versions: Mapping[str, str]
    """Program → prompt version label and ``"store"`` → KI table, as served for this request."""
    start_ns: int
    """Start, ns since the epoch."""
    end_ns: int
    """End, ns since the epoch."""
    ok: bool
    """False when the request raised."""
    error: str = ""
    """``<Type>: <message>`` when it raised (cut to 2,000 characters)."""


def served_request_record(request: ServedRequest, seq: int) -> EpisodeRecord:
    """A served request as one trace record (no steps), tagged with the versions that answered it.

    Tags and root attributes: ``kitune.served`` (``true``), ``kitune.endpoint``,
    ``kitune.prompt.<program>`` (each served program's version label), ``kitune.store`` (the KI
    table), ``kitune.status`` (``ok`` / ``error``).
    """
    tags = {"kitune.served": "true", "kitune.endpoint": request.endpoint}
    tags |= {f"kitune.prompt.{p}": v for p, v in sorted(request.versions.items()) if p != "store"}
    tags["kitune.store"] = request.versions.get("store", "")
    tags["kitune.status"] = "ok" if request.ok else "error"
    return EpisodeRecord(
        name=f"serve/{request.endpoint.split()[0]}/{seq}",
        query_id=str(seq),
        start_ns=request.start_ns,
        end_ns=max(request.end_ns, request.start_ns),
        inputs={"query": request.query[:MAX_ATTR_CHARS]},
        outputs={"status": tags["kitune.status"]},
        attributes={**tags, "kitune.error": request.error[:MAX_ATTR_CHARS]},
        tags=tags,
        ok=request.ok,
    )


_STOP = object()


class ServedRequestLog:
    """Writes every served request to the tracking store, off the request path (thread-safe).

    One background thread takes :class:`ServedRequest` s from a queue and logs each as a trace
    (:func:`served_request_record`) in one run named ``run_name`` that stays open until
    :meth:`close`. The run is opened when the log is made, on the caller's thread, so the tracking
    store (MLflow's SQLite database and its schema migrations, seconds on a new work dir) is set
    up before the server answers anything: a server stopped right after its first request (an MCP
    stdio client closing) must never be killed half-way through creating the database, which
    left it unreadable to the next process. A tracking failure is recorded by the tracker
    (``tracker.failures``) and never reaches a request.

    Args:
        tracker: where to write (``kitune.tracking.trackers.create_tracker(cfg)``: MLflow at
            ``cfg.mlflow_uri``).
        run_name: the run the traces are linked to.
    """

    def __init__(self, tracker: BaseTracker, *, run_name: str = "serve") -> None:
        self.tracker = tracker
        self.run_name = run_name
        self.written = 0
        """Requests logged so far."""
        self._seq = 0
        self._queue: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        self._stack = contextlib.ExitStack()
        self._handle: Any = None
        try:
            self._handle = self._stack.enter_context(
                self.tracker.run(self.run_name, tags={"kitune.kind": "serve"}, nested=False)
            )
        except Exception:  # the server runs without its log rather than not at all
            logger.exception("could not open the tracking run for served requests")
        self._thread = threading.Thread(target=self._run, name="kitune-served-log", daemon=True)
        self._thread.start()

    def record(self, request: ServedRequest) -> None:
        """Queue ``request`` for the tracking store (returns at once)."""
        self._queue.put(request)

    def flush(self) -> None:
        """Wait until every queued request is written."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued, end the run, stop the thread (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        self._stack.close()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                if self._handle is None:  # opening it at start failed: try again
                    self._handle = self._stack.enter_context(
                        self.tracker.run(self.run_name, tags={"kitune.kind": "serve"}, nested=False)
                    )
                handle = self._handle
                with self._lock:
                    self._seq += 1
                    seq = self._seq
                if self.tracker.log_records([served_request_record(item, seq)], run_id=handle.run_id):
                    self.written += 1
            except Exception:  # the log must never stop: the next request is written again
                logger.exception("could not log a served request")
            finally:
                self._queue.task_done()


class LiveSetting:
    """The store and rewriter a running server answers with, following a setting source (thread-safe).

    :meth:`current` asks ``source`` (with the served versions) when the production stamp changed
    since the last look — a promote or rollback through kitune rewrites it, and reading it costs
    one small file read per request (``stamp``) — and otherwise at most every ``refresh_s`` seconds
    (a change made outside kitune, a registry without a stamp file), on a request or tool call, and
    swaps in what it returns; None means unchanged, and a failing source keeps the current setting
    (logged, so a registry hiccup never takes the server down). Without a store, one is created
    from ``cfg`` on first use (``kitune.retrieval.create_store``). Shared by the HTTP API
    (:mod:`kitune.server`) and the MCP server (:mod:`kitune.mcp_server`).

    Args:
        cfg: configuration (the store created when none is given; ``mlflow_uri`` names the stamp).
        store: the KI store served first (None: created on first use).
        rewriter: the query rewriter with its LM, or None (plain plans).
        versions: what ``store``/``rewriter`` are (program → label, ``"store"`` → table).
        source: e.g. :func:`follow_production`; None serves what was given until exit.
        refresh_s: seconds between ``source`` calls when the stamp has not changed.
        clock: monotonic clock in seconds.
        stamp: returns the production stamp (any string that changes with every promotion, None
            when there is none); None with a ``source``: the registry's
            (:func:`kitune.tracking.prompts.read_production_stamp` of ``cfg.mlflow_uri``).
        request_log: where :meth:`serve` records each request (None: not recorded).
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
        stamp: Callable[[], str | None] | None = None,
        request_log: ServedRequestLog | None = None,
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
        if stamp is None and source is not None:
            uri = cfg.mlflow_uri
            stamp = lambda: read_production_stamp(uri)  # noqa: E731
        self.stamp = stamp
        self._stamp_seen = stamp() if stamp is not None else None
        self.request_log = request_log

    def _refresh(self) -> None:
        if self.source is None:
            return
        stamp = self.stamp() if self.stamp is not None else None
        promoted = stamp != self._stamp_seen
        if not promoted and self.clock() - self.checked < self.refresh_s:
            return
        self.checked = self.clock()
        try:
            new = self.source(dict(self._versions))
        except Exception:  # a registry hiccup must not take the server down: keep serving
            logger.exception("could not re-resolve the production setting; serving %s", self._versions)
            return
        self._stamp_seen = stamp  # only once the source answered: a failed look is tried again
        if new is not None:
            logger.info("now serving %s (was %s)", dict(new.versions), self._versions)
            self.store, self.rewriter, self._versions = new.store, new.rewriter, dict(new.versions)

    def _current(self) -> tuple[Store, QueryRewriter | None, dict[str, str]]:
        with self.lock:
            self._refresh()
            if self.store is None:
                self.store = kitune.retrieval.create_store(self.cfg)
            return self.store, self.rewriter, dict(self._versions)

    def current(self) -> tuple[Store, QueryRewriter | None]:
        """The store (created from the config on first use when none was given) and the rewriter."""
        store, rewriter, _versions = self._current()
        return store, rewriter

    @contextlib.contextmanager
    def serve(self, endpoint: str, query: str) -> Iterator[tuple[Store, QueryRewriter | None]]:
        """One request: the current store and rewriter, and the request recorded with their versions.

        The versions recorded are the ones read with the store and rewriter (one lock), so a
        promotion during the request never mislabels it. Recording happens on exit, ok or not
        (``request_log``; nothing when None).

        Args:
            endpoint: where the request came in (``http /api/_get_context``, ``mcp get_context``).
            query: the question.
        """
        start = time.time_ns()
        store, rewriter, versions = self._current()
        error = ""
        try:
            yield store, rewriter
        except BaseException as e:
            error = f"{type(e).__name__}: {e}"[:MAX_ATTR_CHARS]
            raise
        finally:
            if self.request_log is not None:
                self.request_log.record(
                    ServedRequest(endpoint, query, versions, start, time.time_ns(), not error, error)
                )

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
