"""The store contracts: :class:`Store` for KIs and :class:`CorpusStore` for raw documents.

Cross-backend rules (every implementation, checked by ``kitune.testing.store_contract``):

* **Upsert**: ``upsert(kis)`` writes by ``KI.id``; writing an id that exists replaces the
  whole record (re-seeing a KI refreshes ``last_seen``). Duplicate ids inside one call: the last
  one wins. Writes are batched; a batch that is committed survives a crash of the process.
* **Accounting**: ``WriteResult.indexed + len(WriteResult.failed) == WriteResult.submitted``
  always; one bad KI never aborts its siblings.
* **Ordering**: search results are best first; ``score`` is higher-is-better and comparable
  only within one result list. Ties break by KI id ascending, so results are deterministic.
* **Filters**: ``search`` serves only ``active`` KIs unless the plan's filter names its
  ``statuses`` (or ``retrieval.serve_stale`` is set, which adds ``stale``); ``count``/``iter_kis``
  apply the filter as given (a default :class:`~kitune.schema.Filter` excludes expired only).
* **Lifecycle**: status moves only by ``sweep`` (forward: active → stale → expired, by
  ``last_seen`` age, per-subtype windows), ``set_status``, or a re-sighting (``upsert`` of the KI,
  or ``mark_seen``), which sets ``last_seen`` and makes it ``active`` again. Nothing in the
  lifecycle deletes a KI; ``sweep`` is idempotent for a given ``now``.
* **Fingerprint**: ``fingerprint()`` is an opaque string that changes after every write that
  changes stored KIs (``upsert`` of ≥ 1 KI, ``delete`` that removed one, ``set_status``/``sweep``
  that changed one, ``mark_seen`` that found one) and never after reads. Equal strings from one
  store mean no KI was written in between. Backends may also change it on maintenance (LanceDB
  compaction) — a false "changed", never a false "unchanged".
* **Copies**: returned KIs are copies; mutating them never changes the store.
* **Thread safety**: one instance may be shared by threads (reads concurrent with one writer);
  a second process may read the same on-disk store.
* **Errors**: ``get`` of an unknown id raises :class:`kitune.errors.DocumentNotFoundError`;
  an unreachable backend raises :class:`kitune.errors.StoreUnavailableError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from kitune.ki import KI, KIStatus
from kitune.schema import Document, Filter, QueryPlan

if TYPE_CHECKING:
    from kitune.config import KituneConfig, StoreSection

__all__ = [
    "Aggregations",
    "CorpusHit",
    "CorpusStore",
    "Hit",
    "SearchResult",
    "Store",
    "StoreBackend",
    "SweepResult",
    "WriteFailure",
    "WriteResult",
]


@dataclass(frozen=True)
class Hit:
    """One retrieved KI."""

    ki: KI
    """A copy of the stored KI."""
    score: float
    """Fused score, higher is better; comparable only within one result list."""
    rank: int
    """1-based rank in the result list."""
    branches: dict[str, int] = field(default_factory=dict)
    """Branch name (``tag``, ``lexical``, ``semantic``) → 1-based rank in that branch."""


@dataclass(frozen=True)
class Aggregations:
    """Counts over the result set (not the whole store), most frequent first."""

    by_tag: dict[str, int] = field(default_factory=dict)
    """Plain tags (no ``entity:``/``doc:`` prefix) → count."""
    by_doc: dict[str, int] = field(default_factory=dict)
    """Evidence doc id → count."""
    by_entity: dict[str, int] = field(default_factory=dict)
    """Entity slug → count."""


@dataclass(frozen=True)
class SearchResult:
    """What :meth:`Store.search` returns."""

    hits: list[Hit]
    """Best first, at most ``plan.size``."""
    aggregations: Aggregations
    """Facets over ``hits``."""
    compiled: Any
    """The compiled query: ES|QL text for Elasticsearch, a JSON-able dict for the embedded store."""
    took_ms: float = 0.0
    """Execution time in milliseconds."""
    truncated: bool = False
    """True when the backend says rows were cut (e.g. an ES|QL Warning header about a LIMIT, case S4)."""
    warnings: tuple[str, ...] = ()
    """Backend warnings (ES|QL ``Warning`` headers), verbatim."""


@dataclass(frozen=True)
class WriteFailure:
    """One KI that could not be written."""

    id: str
    reason: str
    status: int | None = None
    """HTTP-like status for remote backends (e.g. 400, 429), None for local failures."""


@dataclass(frozen=True)
class WriteResult:
    """Outcome of a write; ``indexed + len(failed) == submitted`` always."""

    submitted: int
    indexed: int
    failed: list[WriteFailure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True only when every submitted KI was indexed."""
        return not self.failed and self.indexed == self.submitted


@dataclass(frozen=True)
class SweepResult:
    """Outcome of a lifecycle sweep: how many KIs changed to each status."""

    stale: int
    expired: int


@runtime_checkable
class Store(Protocol):
    """A KI store. See the module docstring for the rules every backend follows."""

    backend: str
    """Short backend name, e.g. ``"lancedb"``."""

    def upsert(self, kis: Sequence[KI]) -> WriteResult:
        """Insert or replace KIs by id, in batches. Never raises for one bad KI (see WriteResult).

        Raises:
            StoreUnavailableError: the backend cannot be reached.
        """
        ...

    def get(self, ki_id: str) -> KI:
        """Return a copy of one KI.

        Raises:
            DocumentNotFoundError: no KI has this id.
        """
        ...

    def delete(self, ki_ids: Sequence[str]) -> int:
        """Delete KIs by id; unknown ids are ignored. Returns how many were deleted."""
        ...

    def count(self, filters: Filter | None = None) -> int:
        """Count KIs passing ``filters`` (all statuses when None)."""
        ...

    def iter_kis(self, filters: Filter | None = None) -> Iterator[KI]:
        """Yield copies of every KI passing ``filters`` (all statuses when None), by id ascending."""
        ...

    def compile(self, plan: QueryPlan) -> Any:
        """Return the query ``search`` would run for ``plan``, without running it."""
        ...

    def search(self, plan: QueryPlan) -> SearchResult:
        """Hybrid retrieval: tag + lexical + semantic branches fused with weighted RRF.

        Returns:
            At most ``plan.size`` hits, best first, plus aggregations over those hits.
        """
        ...

    def set_status(self, filters: Filter, status: KIStatus) -> int:
        """Set ``payload.status`` on every KI passing ``filters``. Returns how many changed."""
        ...

    def sweep(
        self, now: datetime, stale_after: timedelta, *, retention: Mapping[str, timedelta] | None = None
    ) -> SweepResult:
        """Move KIs forward: unseen for their window → stale, for twice it (or past expires_at) → expired.

        Args:
            now: the reference time, UTC.
            stale_after: the window of every subtype not in ``retention``.
            retention: payload subtype → its own window (e.g. ``{"disambiguation": 30 days}``).

        Status only; never deletes; a second sweep with the same ``now`` changes nothing.
        """
        ...

    def mark_seen(self, ki_ids: Sequence[str], now: datetime) -> int:
        """Record a re-sighting without re-writing the KIs: ``last_seen = now``, status ``active``.

        Unknown ids are ignored. Returns how many KIs were found and refreshed.
        """
        ...

    def fingerprint(self) -> str:
        """An opaque string that changes whenever a KI is written (see the module docstring)."""
        ...

    def optimize(self) -> None:
        """Fold pending writes into the indices (compaction); call after a bulk load. May be a no-op."""
        ...

    def close(self) -> None:
        """Flush pending writes and release resources. Idempotent."""
        ...


@dataclass(frozen=True)
class CorpusHit:
    """One document hit from the baseline corpus search."""

    docid: str
    title: str
    snippets: list[str]
    """Up to ``snippets_per_hit`` passages of at most ``snippet_chars`` characters, best first."""
    score: float
    """Higher is better; comparable only within one result list."""


@runtime_checkable
class CorpusStore(Protocol):
    """Raw documents, chunked and searchable (BM25 + vectors), for the baseline skill."""

    def add_documents(self, docs: Sequence[Document]) -> WriteResult:
        """Insert or replace documents by ``docid`` (chunking them)."""
        ...

    def search(
        self, query: str, *, k: int = 10, snippets_per_hit: int = 3, snippet_chars: int = 700
    ) -> list[CorpusHit]:
        """Return at most ``k`` documents, best first, each with its best snippets."""
        ...

    def get(self, docid: str) -> Document:
        """Return the full document.

        Raises:
            DocumentNotFoundError: no document has this id.
        """
        ...

    def count(self) -> int:
        """Number of documents."""
        ...


def _exists_unknown(cfg: KituneConfig) -> bool:
    return True


@dataclass(frozen=True)
class StoreBackend:
    """A KI store backend as the store registry (:mod:`kitune.retrieval.backends`) knows it.

    A backend is one module: its :class:`Store` implementation, its config section (a
    :class:`~kitune.config.StoreSection` subclass) and, at the end, ``PLUGINS = {name:
    StoreBackend(...)}`` (built-ins) or a :func:`~kitune.retrieval.backends.register_store_backend`
    call (plug-ins). Nothing else in kitune names a backend.

    Args:
        name: the ``store.type`` value (lower case); equal to ``section``'s ``type`` default.
        section: the backend's config section class.
        open: ``(cfg, embedder) -> Store`` for ``cfg.store`` (an instance of ``section``);
            ``embedder`` (a :class:`kitune.retrieval.embedders.Embedder` or None) overrides
            ``cfg.embedder`` where the backend embeds locally (None: build it from
            ``cfg.embedder``). Raises ``ConfigError`` (e.g. a missing extra) or
            ``StoreUnavailableError``.
        exists: ``cfg -> bool``: the KI collection ``cfg.store`` names exists already, so a
            read-only command can skip creating an empty one. Default: always True (the backend
            cannot tell without opening, so it is opened).
    """

    name: str
    section: type[StoreSection]
    open: Callable[[KituneConfig, Any], Store]
    exists: Callable[[KituneConfig], bool] = _exists_unknown
