"""Store operations shared by the CLI and the HTTP API.

Store operations the CLI and the HTTP API share: load KIs from JSONL, run the lifecycle sweep,
record re-sightings of documents (:func:`refresh_documents`, :func:`refresh_derived`), count KIs
by status, tag and document.

The lifecycle (DESIGN part 3): a KI's clock is its ``last_seen``. Extraction refreshes it for
every KI of a document it sees again — re-extracted, or unchanged and skipped (no LLM call) — so
the KIs of a document that left the corpus start ageing from the last run that saw it.
Disambiguation and source-description KIs follow ``lifecycle.derived_retention``. The sweep
moves status forward by age (stale after the window, expired after twice it); it never deletes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from kitune.config import ElasticsearchStoreConfig
from kitune.data.loaders import json_error_text
from kitune.errors import ConfigError, DataError
from kitune.ki import DERIVED_SUBTYPES, KI, utcnow
from kitune.retrieval.ai_index import ai_document_to_ki
from kitune.retrieval.base import Store, SweepResult, WriteFailure, WriteResult
from kitune.retrieval.elasticsearch import ElasticsearchStore
from kitune.retrieval.fusion import aggregate
from kitune.schema import Filter

if TYPE_CHECKING:
    from kitune.config import KituneConfig

__all__ = [
    "SOURCE_CHANGED",
    "IndexReport",
    "LineError",
    "StoreStats",
    "check_ki_file",
    "expire_all",
    "expire_documents",
    "expire_kis",
    "index_jsonl",
    "iter_ki_jsonl",
    "refresh_derived",
    "refresh_documents",
    "reindex_elasticsearch",
    "retention_from",
    "stale_after_from",
    "store_stats",
]


@dataclass(frozen=True)
class LineError:
    """One JSONL line that could not be read as a KI."""

    line: int
    """1-based line number."""
    message: str


@dataclass(frozen=True)
class IndexReport:
    """Outcome of :func:`index_jsonl`."""

    path: str
    lines: int
    """Non-blank lines read."""
    bad_lines: list[LineError] = field(default_factory=list)
    """Lines skipped (bad JSON or an invalid KI), with their numbers."""
    write: WriteResult = field(default_factory=lambda: WriteResult(submitted=0, indexed=0))
    """What the store accepted of the valid KIs."""

    @property
    def ok(self) -> bool:
        """True when every line was a valid KI and every KI was written."""
        return not self.bad_lines and self.write.ok


@dataclass(frozen=True)
class StoreStats:
    """Counts over a whole store."""

    total: int
    by_status: dict[str, int]
    """active / stale / expired → count."""
    by_tag: dict[str, int]
    """Top plain tags (no ``entity:``/``doc:`` prefix) → count, most frequent first."""
    by_doc: dict[str, int]
    """Top evidence documents → count."""
    by_entity: dict[str, int]
    """Top entity slugs → count."""


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ())) or "KI"
    return f"{loc}: {err.get('msg', 'invalid')} ({e.error_count()} error(s))"


def check_ki_file(path: str | Path) -> Path:
    """``path`` as a Path when it is a file ``kitune index`` can read (checked before any store opens).

    Raises:
        DataError: a directory, or nothing at ``path``.
    """
    p = Path(path)
    if p.is_dir():
        raise DataError(f"KI file {p} is a directory: pass the JSONL file itself", path=str(p))
    if not p.is_file():
        raise DataError(
            f"KI file {p} not found: pass a JSONL file with one KI JSON object per line", path=str(p)
        )
    return p


def _is_ai_index_document(data: Mapping[str, object]) -> bool:
    """True for a line in Elastic's AI-index shape (``kitune export --format elastic-ai-index``)."""
    return isinstance(data.get("attributes"), dict) and "@timestamp" in data


def _is_bulk_action(data: Mapping[str, object]) -> bool:
    """True for an Elasticsearch ``_bulk`` action line (``{"index": {"_index": …, "_id": …}}``)."""
    if len(data) != 1:
        return False
    ((action, meta),) = data.items()
    return action in {"index", "create"} and isinstance(meta, dict)


def iter_ki_jsonl(path: str | Path) -> Iterator[KI | LineError]:
    """Yield a KI or a :class:`LineError` for every non-blank line of a JSONL file.

    Reads kitune's KI JSONL (``kitune export``) and also the Elastic AI-index shape
    (``kitune export --format elastic-ai-index``, with or without ``--bulk-index``): such a line
    (an ``attributes`` object and an ``@timestamp``) is rebuilt into the same KI by
    :func:`kitune.retrieval.ai_index.ai_document_to_ki` (kitune's fields travel in ``attributes``),
    and ``_bulk`` action lines are skipped. A line that is not UTF-8, not JSON or not a valid KI
    becomes a :class:`LineError`.

    Raises:
        DataError: the file does not exist.
    """
    p = check_ki_file(path)
    with p.open("rb") as fh:
        for n, raw_bytes in enumerate(fh, start=1):
            try:  # decoded line by line: one bad line is reported, the rest still load
                raw = raw_bytes.decode("utf-8")
            except UnicodeDecodeError as e:
                yield LineError(n, f"not valid UTF-8 ({e.reason} at byte {e.start})")
                continue
            if not raw.strip():
                continue
            try:
                data = json.loads(raw)
            except json.JSONDecodeError as e:
                yield LineError(n, f"not JSON: {json_error_text(e)}")
                continue
            if not isinstance(data, dict):
                yield LineError(n, f"expected a JSON object, got {type(data).__name__}")
                continue
            if _is_bulk_action(data):
                continue
            if _is_ai_index_document(data):
                try:
                    yield ai_document_to_ki(data)
                except DataError as e:
                    yield LineError(n, f"AI-index document: {e}")
                except (ValidationError, KeyError, TypeError, ValueError) as e:
                    why = _first_error(e) if isinstance(e, ValidationError) else f"{type(e).__name__}: {e}"
                    yield LineError(n, f"AI-index document with invalid kitune attributes: {why}")
                continue
            try:
                yield KI.model_validate(data)
            except ValidationError as e:
                yield LineError(n, _first_error(e))


def index_jsonl(store: Store, path: str | Path, *, batch_size: int = 512) -> IndexReport:
    """Load KIs from JSONL into ``store`` in batches; bad lines are skipped and reported.

    Args:
        store: any :class:`~kitune.retrieval.base.Store`.
        path: JSONL file, one KI per line (the published KI shape).
        batch_size: KIs per ``upsert`` call (≥ 1).

    Returns:
        :class:`IndexReport` with line counts, bad lines (by number) and the merged write result.

    Raises:
        DataError: the file is missing.
        StoreUnavailableError: the store cannot be reached.
    """
    batch: list[KI] = []
    bad: list[LineError] = []
    lines = 0
    submitted = indexed = 0
    failed: list[WriteFailure] = []

    def flush() -> None:
        nonlocal submitted, indexed
        if batch:
            r = store.upsert(batch)
            submitted += r.submitted
            indexed += r.indexed
            failed.extend(r.failed)
            batch.clear()

    for item in iter_ki_jsonl(path):
        lines += 1
        if isinstance(item, LineError):
            bad.append(item)
            continue
        batch.append(item)
        if len(batch) >= max(1, batch_size):
            flush()
    flush()
    if indexed:
        store.optimize()  # a bulk load folds its rows into the indices before the first query
    return IndexReport(
        path=str(path),
        lines=lines,
        bad_lines=bad,
        write=WriteResult(submitted=submitted, indexed=indexed, failed=failed),
    )


def expire_kis(
    store: Store,
    *,
    now: datetime | None = None,
    stale_after: timedelta = timedelta(days=7),
    retention: Mapping[str, timedelta] | None = None,
) -> SweepResult:
    """Run the lifecycle sweep on ``store`` (status only, never deletes, idempotent).

    Unseen for the window → stale, for twice it (or past ``expires_at``) → expired.

    Args:
        store: the store to sweep.
        now: the reference time (UTC); default the current time.
        stale_after: the stale window (expiry is at twice this).
        retention: subtype → its own window (see :func:`retention_from`).
    """
    return store.sweep(now or utcnow(), stale_after, retention=retention)


SOURCE_CHANGED = "source_changed"
"""``payload.status_reason`` of a KI expired because its document changed or left the corpus."""


def expire_documents(
    store: Store,
    docids: Iterable[str],
    *,
    now: datetime | None = None,
    keep: Iterable[str] = (),
    reason: str = SOURCE_CHANGED,
) -> int:
    """Expire the dataset-fact KIs of ``docids`` (a changed or removed document), except ``keep``.

    Called when a changed document's new KIs are stored (``keep`` = their ids: a fact extracted
    again from the new text stays active) and for documents that left the corpus. Each KI is
    re-written with ``status = "expired"``, ``expires_at = now`` and ``status_reason = reason``
    (the store's lifecycle columns follow the payload), so the reason survives a restart. Only
    active or stale KIs change; nothing is deleted; a second call changes nothing.

    Args:
        store: the KI store (any backend).
        docids: the documents whose old KIs expire.
        now: the expiry time (UTC); default the current time.
        keep: KI ids left alone.
        reason: the lifecycle reason recorded (default :data:`SOURCE_CHANGED`).

    Returns:
        How many KIs were expired.
    """
    ids = tuple(dict.fromkeys(docids))
    if not ids:
        return 0
    when = now or utcnow()
    kept = set(keep)
    old = [
        k
        for k in store.iter_kis(Filter(statuses=("active", "stale"), doc_ids=ids, subtypes=("dataset_fact",)))
        if k.id not in kept and k.payload.properties.docid in ids
    ]
    if not old:
        return 0
    expired = [
        k.model_copy(
            update={
                "payload": k.payload.model_copy(
                    update={"status": "expired", "expires_at": when, "status_reason": reason}
                )
            }
        )
        for k in old
    ]
    result = store.upsert(expired)
    return result.indexed


def expire_all(store: Store, *, now: datetime | None = None, reason: str = "expired_by_hand") -> int:
    """Expire every active or stale KI of ``store`` (``kitune expire --all``), whatever its age.

    The explicit "empty the served set" operation, kept apart from the age-based sweep
    (:func:`expire_kis`). Each KI is re-written with ``status = "expired"``, ``expires_at = now``
    and ``status_reason = reason``; nothing is deleted.

    Returns:
        How many KIs were expired.
    """
    when = now or utcnow()
    old = list(store.iter_kis(Filter(statuses=("active", "stale"))))
    if not old:
        return 0
    return store.upsert(
        [
            k.model_copy(
                update={
                    "payload": k.payload.model_copy(
                        update={"status": "expired", "expires_at": when, "status_reason": reason}
                    )
                }
            )
            for k in old
        ]
    ).indexed


def stale_after_from(cfg: KituneConfig) -> timedelta:
    """The configured stale window (``lifecycle.stale_after_days``)."""
    return timedelta(days=cfg.lifecycle.stale_after_days)


def retention_from(cfg: KituneConfig) -> dict[str, timedelta]:
    """Per-subtype windows for the sweep.

    Disambiguation and source-description KIs get ``lifecycle.derived_stale_after_days``
    (default: the same as ``stale_after_days``).
    """
    days = cfg.lifecycle.derived_stale_after_days or cfg.lifecycle.stale_after_days
    return dict.fromkeys(DERIVED_SUBTYPES, timedelta(days=days))


def refresh_documents(store: Store, docids: Iterable[str], now: datetime, *, chunk: int = 500) -> int:
    """Record that documents were seen again unchanged: their dataset-fact KIs get ``last_seen = now``.

    The no-LLM path for an unchanged document (same content hash): its KIs are re-activated as
    if re-extracted. Disambiguation and source-description KIs are left to
    :func:`refresh_derived`.

    Args:
        store: the KI store.
        docids: documents seen unchanged.
        now: the sighting time (UTC).
        chunk: documents per store filter.

    Returns:
        How many KIs were refreshed.
    """
    ids = list(dict.fromkeys(docids))
    n = 0
    for start in range(0, len(ids), chunk):
        flt = Filter(statuses=(), doc_ids=tuple(ids[start : start + chunk]), subtypes=("dataset_fact",))
        ki_ids = [k.id for k in store.iter_kis(flt)]
        if ki_ids:
            n += store.mark_seen(ki_ids, now)
    return n


def refresh_derived(store: Store, corpus_docids: Iterable[str], now: datetime) -> int:
    """Keep disambiguation and source-description KIs while their evidence documents exist.

    Every such KI whose evidence documents are all in ``corpus_docids`` gets ``last_seen = now``;
    one whose evidence lost a document is left alone, so its clock runs from the last run that
    saw them all (then the sweep ages it with its own window).

    Returns:
        How many KIs were refreshed.
    """
    present = set(corpus_docids)
    keep = [
        k.id
        for k in store.iter_kis(Filter(statuses=(), subtypes=DERIVED_SUBTYPES))
        if k.evidence_doc_ids and set(k.evidence_doc_ids) <= present
    ]
    return store.mark_seen(keep, now) if keep else 0


def store_stats(store: Store, *, top: int = 20) -> StoreStats:
    """Count KIs by status (all of them), and the ``top`` tags, documents and entities.

    Tag/doc/entity counts read every KI once (``iter_kis``), so they cost one pass over the store.
    """
    by_status = {s: store.count(Filter(statuses=(s,))) for s in ("active", "stale", "expired")}
    aggs = aggregate(store.iter_kis())
    cut = max(0, top)
    return StoreStats(
        total=store.count(),
        by_status=by_status,
        by_tag=dict(list(aggs.by_tag.items())[:cut]),
        by_doc=dict(list(aggs.by_doc.items())[:cut]),
        by_entity=dict(list(aggs.by_entity.items())[:cut]),
    )


def reindex_elasticsearch(cfg: KituneConfig, source_index: str) -> WriteResult:
    """Create ``cfg.store.index`` with the current mapping and copy every KI of ``source_index`` into it.

    Args:
        cfg: a config whose store is Elasticsearch; ``store.index`` names the NEW index.
        source_index: the old index (any earlier kitune mapping; it is only read).

    Returns:
        The merged write result (``indexed + failed == submitted``).

    Raises:
        ConfigError: the store is not Elasticsearch, the source is the target, or see
            :class:`kitune.retrieval.elasticsearch.ElasticsearchStore`.
        StoreError: a request failed (with the HTTP status and Elasticsearch's reason).
    """
    if not isinstance(cfg.store, ElasticsearchStoreConfig):
        raise ConfigError(
            f"reindex needs store.type=elasticsearch (the config has {cfg.store.type}): the embedded store "
            "has no mapping to migrate"
        )

    target = ElasticsearchStore.from_config(cfg.store, retrieval=cfg.retrieval)
    try:
        return target.reindex_from(source_index)
    finally:
        target.close()
