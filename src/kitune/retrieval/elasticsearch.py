"""Elasticsearch 9.x KI store: the backend users scale out to.

Imports the ``elasticsearch`` client lazily (``pip install 'kitune[elasticsearch]'``). Pure
helpers carry the logic and are unit-tested against golden files without a server:

* :func:`es_mapping` — ``title`` as ``text``, ``description`` as ``semantic_text`` on the
  configured inference endpoint, tags/ids as ``keyword``, the full KI kept in a disabled object.
* :func:`to_es_filter` — a :class:`~kitune.schema.Filter` as a Query DSL ``bool`` filter.
* :func:`bulk_operations`, :func:`bulk_write` — bulk bodies and a writer that inspects every
  item (``errors: true`` arrives with HTTP 200), retries only 429 items with bounded
  exponential backoff, never retries 4xx mapping errors, and returns a
  :class:`~kitune.retrieval.base.WriteResult` with ``indexed + failed == submitted`` (case S1).
* :func:`compile_esql` — ONE ES|QL query: ``FROM … METADATA _id, _index, _score``, a status
  filter, ``FORK`` with up to three branches (tags, ``MATCH`` on title, ``MATCH`` on the
  semantic description), each ``SORT _score DESC | LIMIT n``, then ``FUSE RRF`` with the
  configured constant and weights, ``SORT _score DESC`` and an explicit ``LIMIT`` (case S4).
  Every user/LLM value travels as a named ES|QL parameter; only validated integers, the
  configured index name and config numbers are written into the text.
* :func:`compile_facets` — the second ``STATS COUNT(*) BY …`` query for facets.

Start-up check (case S2): ``GET _inference/<id>`` must succeed before any index is created;
otherwise :class:`~kitune.errors.ConfigError` says "inference endpoint <id> not found" and no
index exists.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from kitune.config import ElasticsearchStoreConfig, RetrievalConfig
from kitune.errors import ConfigError, DocumentNotFoundError, StoreError, StoreUnavailableError
from kitune.ki import KI, KIStatus
from kitune.retrieval.base import Hit, SearchResult, SweepResult, WriteFailure, WriteResult
from kitune.retrieval.fusion import aggregate
from kitune.retrieval.memory import effective_filter, validate_ki
from kitune.schema import Filter, QueryPlan

__all__ = [
    "ElasticsearchRequestError",
    "ElasticsearchStore",
    "EsqlQuery",
    "bulk_operations",
    "bulk_write",
    "compile_esql",
    "compile_facets",
    "es_mapping",
    "ki_to_source",
    "parse_warnings",
    "source_to_ki",
    "sweep_queries",
    "to_es_filter",
    "wrap_es_error",
]

BACKEND = "elasticsearch"
_INDEX_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,254}$")
_FACET_FIELDS = {"tags": "tags", "doc": "evidence_doc_ids", "status": "status", "subtype": "subtype"}


@dataclass(frozen=True)
class EsqlQuery:
    """An ES|QL request: the query text, its named parameters and an optional DSL pre-filter."""

    query: str
    params: list[dict[str, Any]] = field(default_factory=list)
    """Named parameters, ``[{"name": value}, …]``, in order of first use."""
    filter: dict[str, Any] | None = None
    """Query DSL applied before the ES|QL query runs (non-scoring)."""
    branches: tuple[str, ...] = ()
    """Branch names in FORK order (``fork1`` is the first)."""

    def to_json(self) -> dict[str, Any]:
        """The request body as a JSON-able dict."""
        body: dict[str, Any] = {"query": self.query, "params": self.params}
        if self.filter is not None:
            body["filter"] = self.filter
        return body


class ElasticsearchRequestError(StoreError):
    """An Elasticsearch request failed; carries the HTTP status and Elasticsearch's own reason.

    Attributes:
        status: HTTP status (e.g. 400, 401, 404, 429), or None when no response came back.
        error_type: Elasticsearch's ``error.type`` (e.g. ``verification_exception``), or "".
        reason: Elasticsearch's ``error.reason`` (root cause first), or the client's message.
    """

    def __init__(self, message: str, *, status: int | None, error_type: str = "", reason: str = "") -> None:
        super().__init__(message, backend=BACKEND)
        self.status = status
        self.error_type = error_type
        self.reason = reason


_FIXES = {
    400: "the request was rejected as invalid (see the reason; a query syntax error is a kitune bug, please report it)",
    401: "check the API key in KITUNE_ES_API_KEY (store.api_key_env)",
    403: "the API key lacks privileges on the index: grant read/write/manage on it",
    404: "the index or endpoint does not exist: check store.index / store.inference_id",
    429: "the cluster is overloaded: retry later or lower extraction.concurrency",
}


def es_error_details(e: Exception) -> tuple[int | None, str, str]:
    """``(status, error type, reason)`` of a client error (root cause first when the body has one)."""
    meta = getattr(e, "meta", None)
    status = getattr(meta, "status", None)
    body = getattr(e, "body", None)
    err = body.get("error") if isinstance(body, Mapping) else None
    if isinstance(err, Mapping):
        root = err.get("root_cause")
        first = root[0] if isinstance(root, list) and root and isinstance(root[0], Mapping) else err
        return status, str(first.get("type", err.get("type", ""))), str(first.get("reason", err.get("reason", "")))
    if isinstance(err, str):
        return status, "", err
    return status, str(getattr(e, "message", "") or ""), str(e)


def wrap_es_error(what: str, index: str, e: Exception) -> StoreError:
    """Turn an ``elasticsearch`` client exception into a kitune store error.

    Returns:
        :class:`~kitune.errors.StoreUnavailableError` for connection/timeout errors (no HTTP
        response), else :class:`ElasticsearchRequestError` naming the operation, the index, the
        HTTP status, Elasticsearch's error type and reason, and a fix.
    """
    from elasticsearch import ApiError

    if not isinstance(e, ApiError):
        return StoreUnavailableError(
            f"Elasticsearch unreachable during {what} on index {index}: {e}; check KITUNE_ES_URL and the network",
            backend=BACKEND,
        )
    status, etype, reason = es_error_details(e)
    fix = _FIXES.get(status or 0, "see Elasticsearch's reason above")
    message = f"Elasticsearch {what} on index {index} failed: HTTP {status} {etype}: {reason}".rstrip(": ")
    return ElasticsearchRequestError(f"{message} — {fix}", status=status, error_type=etype, reason=reason)


def check_index_name(index: str) -> str:
    """Return ``index`` if it is a valid lowercase index name.

    Raises:
        ConfigError: the name has characters outside ``a-z0-9._-`` or starts badly.
    """
    if not _INDEX_RE.match(index):
        raise ConfigError(f"store.index {index!r} is not a valid index name: use lowercase a-z0-9 . _ -")
    return index


def es_mapping(inference_id: str) -> dict[str, Any]:
    """The KI index mapping (``semantic_text`` description on ``inference_id``)."""
    return {
        "dynamic": "strict",
        "properties": {
            "id": {"type": "keyword"},
            "title": {"type": "text"},
            "description": {"type": "semantic_text", "inference_id": inference_id},
            "tags": {"type": "keyword"},
            "evidence_doc_ids": {"type": "keyword"},
            "status": {"type": "keyword"},
            "subtype": {"type": "keyword"},
            "confidence": {"type": "integer"},
            "last_seen": {"type": "date"},
            "expires_at": {"type": "date"},
            "prompt_version": {"type": "keyword"},
            "ki": {"type": "object", "enabled": False},
        },
    }


def ki_to_source(ki: KI) -> dict[str, Any]:
    """The document body for one KI (flat fields for search plus the full KI under ``ki``)."""
    data = ki.model_dump(mode="json")
    return {
        "id": ki.id,
        "title": ki.title,
        "description": ki.description,
        "tags": list(ki.tags),
        "evidence_doc_ids": list(ki.evidence_doc_ids),
        "status": ki.payload.status,
        "subtype": ki.payload.subtype,
        "confidence": ki.payload.confidence,
        "last_seen": data["payload"]["last_seen"],
        "expires_at": data["payload"]["expires_at"],
        "prompt_version": ki.prompt_version,
        "ki": data,
    }


def source_to_ki(source: Mapping[str, Any]) -> KI:
    """Rebuild the KI from a stored document.

    ``status`` and ``last_seen`` come from their own fields (update-by-query changes those only).
    """
    ki = KI.model_validate(source["ki"])
    ki.payload.status = source.get("status", ki.payload.status)
    seen = source.get("last_seen")
    if isinstance(seen, str):
        parsed = datetime.fromisoformat(seen.replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        if parsed != ki.payload.last_seen:
            ki.payload.last_seen = parsed
    return ki


def to_es_filter(f: Filter | None, *, include_status: bool = True) -> dict[str, Any] | None:
    """Translate a filter into a Query DSL ``bool`` filter (pure; values go in as terms).

    Args:
        f: the filter, or None for no filtering.
        include_status: also filter on ``statuses`` (the search puts statuses in the ES|QL text).

    Returns:
        ``{"bool": {"filter": [...]}}`` or None when nothing is filtered.
    """
    if f is None:
        return None
    clauses: list[dict[str, Any]] = []
    if include_status and f.statuses and set(f.statuses) != {"active", "stale", "expired"}:
        clauses.append({"terms": {"status": list(f.statuses)}})
    clauses.extend({"term": {"tags": t}} for t in f.tags_all)
    if f.tags_any:
        clauses.append({"terms": {"tags": list(f.tags_any)}})
    if f.doc_ids:
        clauses.append({"terms": {"evidence_doc_ids": list(f.doc_ids)}})
    if f.subtypes:
        clauses.append({"terms": {"subtype": list(f.subtypes)}})
    if f.min_confidence > 0:
        clauses.append({"range": {"confidence": {"gte": f.min_confidence}}})
    return {"bool": {"filter": clauses}} if clauses else None


def bulk_operations(index: str, docs: Sequence[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Bulk body for ``(id, source)`` pairs: one ``index`` action (replace by id) + source each."""
    ops: list[dict[str, Any]] = []
    for doc_id, source in docs:
        ops.append({"index": {"_index": index, "_id": doc_id}})
        ops.append(dict(source))
    return ops


def _item_outcome(item: Mapping[str, Any]) -> tuple[int, str]:
    action = next(iter(item.values())) if item else {}
    status = int(action.get("status", 0))
    error = action.get("error")
    if isinstance(error, Mapping):
        reason = f"{error.get('type', 'error')}: {error.get('reason', '')}".strip()
    else:
        reason = str(error or "")
    return status, reason


def bulk_write(
    client: Any,
    index: str,
    docs: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    chunk_size: int = 500,
    max_retries: int = 5,
    backoff_s: float = 0.5,
    max_backoff_s: float = 30.0,
    refresh: str | bool | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> WriteResult:
    """Bulk-index ``docs`` in chunks, checking every item.

    * 2xx items count as indexed; 429 items (and whole-request 429s) are retried up to
      ``max_retries`` times, waiting ``min(backoff_s * 2**attempt, max_backoff_s)`` seconds;
    * any other failure (400 mapping errors, 404, …) is reported at once, never retried;
    * a chunk that fails for a non-429 reason reports all its documents; later chunks still run.

    Returns:
        ``WriteResult`` with ``indexed + len(failed) == len(docs)``.

    Raises:
        StoreUnavailableError: the cluster cannot be reached at all.
    """
    from elasticsearch import ApiError, TransportError

    indexed = 0
    failed: list[WriteFailure] = []
    for start in range(0, len(docs), chunk_size):
        pending = list(docs[start : start + chunk_size])
        attempt = 0
        while pending:
            retry: list[tuple[str, Mapping[str, Any]]] = []
            last_reason = "es_rejected_execution_exception"
            try:
                resp = client.bulk(operations=bulk_operations(index, pending), refresh=refresh)
                body = resp.body if hasattr(resp, "body") else resp
                items = list(body.get("items", []))
                for pos, (doc_id, source) in enumerate(pending):
                    if pos >= len(items):
                        failed.append(WriteFailure(id=doc_id, reason="no item in the bulk response"))
                        continue
                    status, reason = _item_outcome(items[pos])
                    if 200 <= status < 300:
                        indexed += 1
                    elif status == 429:
                        retry.append((doc_id, source))
                        last_reason = reason
                    else:
                        failed.append(
                            WriteFailure(id=doc_id, reason=reason or f"status {status}", status=status)
                        )
            except ApiError as e:
                if e.meta.status == 429:
                    retry = pending
                    last_reason = f"whole bulk request rejected: {e.message}"
                else:
                    failed.extend(
                        WriteFailure(id=d, reason=f"bulk request failed: {e.message}", status=e.meta.status)
                        for d, _ in pending
                    )
            except TransportError as e:
                raise StoreUnavailableError(
                    f"Elasticsearch unreachable during bulk: {e}", backend=BACKEND
                ) from e
            if retry and attempt < max_retries:
                sleep(min(backoff_s * (2**attempt), max_backoff_s))
                attempt += 1
            elif retry:
                failed.extend(
                    WriteFailure(id=d, reason=f"429 after {max_retries} retries: {last_reason}", status=429)
                    for d, _ in retry
                )
                retry = []
            pending = retry
    return WriteResult(submitted=len(docs), indexed=indexed, failed=failed)


def _params(prefix: str, values: Sequence[Any], params: list[dict[str, Any]]) -> list[str]:
    names = []
    for i, v in enumerate(values):
        name = f"{prefix}{i}"
        params.append({name: v})
        names.append(f"?{name}")
    return names


def compile_esql(plan: QueryPlan, index: str, retrieval: RetrievalConfig) -> EsqlQuery:
    """Compile a plan into one ES|QL hybrid query (see the module docstring).

    A plan with one branch input skips FORK/FUSE (FORK needs two branches). Filters other than
    status go in the DSL ``filter``; the configured confidence floor applies.

    Raises:
        StoreError: the plan has no branch input.
    """
    check_index_name(index)
    if plan.is_empty():
        raise StoreError(
            "the query plan has no entity tags, lexical or semantic text: nothing to search", backend=BACKEND
        )
    flt = effective_filter(plan, retrieval)
    params: list[dict[str, Any]] = []
    n = int(retrieval.branch_size)
    lines = [f"FROM {index} METADATA _id, _index, _score"]
    statuses = list(flt.statuses) or ["active", "stale", "expired"]
    lines.append(f"| WHERE status IN ({', '.join(_params('status', statuses, params))})")
    branches: list[tuple[str, str]] = []
    if plan.entity_tags:
        tag_names = _params("tag", list(plan.entity_tags), params)
        branches.append(("tag", " OR ".join(f"MATCH(tags, {p})" for p in tag_names)))
    if plan.lexical.strip():
        params.append({"lexical": plan.lexical})
        branches.append(("lexical", "MATCH(title, ?lexical)"))
    if plan.semantic.strip():
        params.append({"semantic": plan.semantic})
        branches.append(("semantic", "MATCH(description, ?semantic)"))
    weights = {
        "tag": retrieval.tag_weight,
        "lexical": retrieval.lexical_weight,
        "semantic": retrieval.semantic_weight,
    }
    if len(branches) == 1:
        lines.append(f"| WHERE {branches[0][1]}")
    else:
        forks = [f"(WHERE {cond} | SORT _score DESC | LIMIT {n})" for _, cond in branches]
        lines.append("| FORK " + "\n       ".join(forks))
        options = {
            "rank_constant": int(retrieval.rrf_k),
            "weights": {f"fork{i + 1}": float(weights[name]) for i, (name, _) in enumerate(branches)},
        }
        lines.append(f"| FUSE RRF WITH {json.dumps(options)}")
    lines.append("| SORT _score DESC")
    lines.append("| KEEP _id, _score")
    lines.append(f"| LIMIT {int(plan.size)}")
    return EsqlQuery(
        query="\n".join(lines),
        params=params,
        filter=to_es_filter(flt, include_status=False),
        branches=tuple(name for name, _ in branches),
    )


def compile_facets(index: str, filters: Filter | None, by: str = "tags", limit: int = 100) -> EsqlQuery:
    """The facet query: ``STATS n = COUNT(*) BY <field>`` over KIs passing ``filters``.

    Args:
        index: the KI index.
        filters: conditions on the counted KIs (None: all).
        by: ``tags``, ``doc``, ``status`` or ``subtype``.
        limit: most groups returned (explicit LIMIT, case S4), 1–10000.

    Raises:
        StoreError: unknown ``by`` or ``limit`` out of range.
    """
    check_index_name(index)
    if by not in _FACET_FIELDS:
        raise StoreError(f"unknown facet {by!r}: use one of {', '.join(_FACET_FIELDS)}", backend=BACKEND)
    if not 1 <= limit <= 10_000:
        raise StoreError(f"facet limit {limit} out of range: use 1..10000", backend=BACKEND)
    col = _FACET_FIELDS[by]
    query = f"FROM {index}\n| STATS n = COUNT(*) BY {col}\n| SORT n DESC, {col} ASC\n| LIMIT {int(limit)}"
    return EsqlQuery(query=query, params=[], filter=to_es_filter(filters))


def sweep_queries(
    now: datetime, stale_after: timedelta, retention: Mapping[str, timedelta] | None = None
) -> list[tuple[dict[str, Any], str]]:
    """The update-by-query bodies of a sweep: ``(query, new status)``, expiries first.

    One pair per distinct window: each subtype in ``retention`` gets its own, every other
    subtype uses ``stale_after``.
    """
    overrides = dict(sorted((retention or {}).items()))
    groups: list[tuple[dict[str, Any] | None, bool, timedelta]] = [
        ({"term": {"subtype": k}}, False, v) for k, v in overrides.items()
    ]
    groups.append(({"terms": {"subtype": list(overrides)}} if overrides else None, True, stale_after))
    out: list[tuple[dict[str, Any], str]] = []
    iso = now.isoformat()
    for clause, negate, window in groups:
        scope: dict[str, list[dict[str, Any]]] = {"filter": [], "must_not": []}
        if clause is not None:
            scope["must_not" if negate else "filter"].append(clause)
        expired_q = {
            "bool": {
                "filter": list(scope["filter"]),
                "must_not": [*scope["must_not"], {"term": {"status": "expired"}}],
                "should": [
                    {"range": {"last_seen": {"lt": (now - 2 * window).isoformat()}}},
                    {"range": {"expires_at": {"lte": iso}}},
                ],
                "minimum_should_match": 1,
            }
        }
        stale_q = {
            "bool": {
                "filter": [
                    *scope["filter"],
                    {"term": {"status": "active"}},
                    {"range": {"last_seen": {"lt": (now - window).isoformat()}}},
                ],
                "must_not": list(scope["must_not"]),
            }
        }
        out += [(expired_q, "expired"), (stale_q, "stale")]
    return sorted(out, key=lambda qs: qs[1] != "expired")


def parse_warnings(headers: Mapping[str, str] | None) -> tuple[bool, tuple[str, ...]]:
    """Read ES|QL ``Warning`` headers.

    Returns:
        ``(truncated, warnings)``: truncated is True when a warning mentions a (default) LIMIT or
        a result cap.
    """
    if not headers:
        return False, ()
    raw = [v for k, v in headers.items() if k.lower() == "warning"]
    warnings: list[str] = []
    for value in raw:
        warnings.extend(p.strip() for p in re.split(r",\s*(?=\d{3}\s)", value) if p.strip())
    truncated = any(re.search(r"limit|truncat|result window", w, re.IGNORECASE) for w in warnings)
    return truncated, tuple(warnings)


class ElasticsearchStore:
    """Elasticsearch 9.x :class:`~kitune.retrieval.base.Store`.

    Fusion runs server-side (``FUSE``), so ``Hit.branches`` is empty; ``SearchResult.compiled`` is
    the ES|QL text; aggregations are computed over the returned hits (as on every backend), and
    :meth:`facets` runs the ``STATS … BY`` query over every matching KI.

    Args:
        client: an ``elasticsearch.Elasticsearch`` (or any object with the same methods).
        index: KI index name (created with :func:`es_mapping` if missing).
        inference_id: the ``semantic_text`` inference endpoint; must exist (case S2).
        retrieval: RRF constant, branch weights and size, confidence floor.
        bulk_chunk_size: documents per bulk request.
        max_retries: retries of 429 items.
        refresh: ``refresh`` for writes (``"wait_for"`` makes writes visible before returning).

    Raises:
        ConfigError: the inference endpoint does not exist, or the index name is invalid.
        StoreUnavailableError: the cluster cannot be reached.
    """

    backend = BACKEND

    def __init__(
        self,
        client: Any,
        *,
        index: str = "kitune-kis",
        inference_id: str = ".elser-2-elasticsearch",
        retrieval: RetrievalConfig | None = None,
        bulk_chunk_size: int = 500,
        max_retries: int = 5,
        refresh: str | bool = "wait_for",
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.index = check_index_name(index)
        self.inference_id = inference_id
        self.retrieval = retrieval or RetrievalConfig()
        self.bulk_chunk_size = bulk_chunk_size
        self.max_retries = max_retries
        self.refresh = refresh
        self._sleep = sleep
        self._preflight()

    @classmethod
    def from_config(
        cls, cfg: ElasticsearchStoreConfig, *, retrieval: RetrievalConfig | None = None
    ) -> ElasticsearchStore:
        """Connect using the URL (and optional API key) in the env vars ``cfg`` names.

        Raises:
            ConfigError: the URL variable is unset, or see the class doc.
        """
        from elasticsearch import Elasticsearch

        url = os.environ.get(cfg.url_env, "").strip()
        if not url:
            raise ConfigError(
                f"store.type=elasticsearch needs a cluster URL: set {cfg.url_env}=http://host:9200"
            )
        api_key = os.environ.get(cfg.api_key_env, "").strip() if cfg.api_key_env else ""
        client = Elasticsearch(url, api_key=api_key or None, request_timeout=30)
        return cls(
            client,
            index=cfg.index,
            inference_id=cfg.inference_id,
            retrieval=retrieval,
            bulk_chunk_size=cfg.bulk_chunk_size,
            max_retries=cfg.max_retries,
        )

    def _call(self, what: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """Run one client call; every client error becomes a kitune store error (:func:`wrap_es_error`)."""
        from elasticsearch import ApiError, TransportError

        try:
            return fn(**kwargs)
        except (ApiError, TransportError) as e:
            raise wrap_es_error(what, self.index, e) from e

    # -- start-up ----------------------------------------------------------------------------
    def _preflight(self) -> None:
        from elasticsearch import ApiError, NotFoundError, TransportError

        try:
            self.client.inference.get(inference_id=self.inference_id)
        except NotFoundError as e:
            raise ConfigError(
                f"inference endpoint {self.inference_id} not found: create it (PUT _inference/...) or set "
                "store.inference_id to an existing endpoint; no index was created"
            ) from e
        except TransportError as e:
            raise StoreUnavailableError(f"Elasticsearch unreachable: {e}", backend=BACKEND) from e
        try:
            if not self.client.indices.exists(index=self.index):
                self.client.indices.create(index=self.index, mappings=es_mapping(self.inference_id))
        except ApiError as e:
            if getattr(e, "error", "") != "resource_already_exists_exception":
                raise StoreError(f"cannot create index {self.index}: {e.message}", backend=BACKEND) from e

    # -- writes -------------------------------------------------------------------------------
    def upsert(self, kis: Sequence[KI]) -> WriteResult:
        """Bulk-index KIs by id (see :func:`bulk_write`); the last duplicate wins."""
        failed: list[WriteFailure] = []
        good: dict[str, KI] = {}
        copies: dict[str, int] = {}
        for ki in kis:
            try:
                v = validate_ki(ki)
            except (ValidationError, AttributeError, TypeError) as e:
                failed.append(WriteFailure(id=str(getattr(ki, "id", "?")), reason=f"invalid KI: {e}"))
                continue
            good.pop(v.id, None)
            good[v.id] = v
            copies[v.id] = copies.get(v.id, 0) + 1
        result = bulk_write(
            self.client,
            self.index,
            [(k.id, ki_to_source(k)) for k in good.values()],
            chunk_size=self.bulk_chunk_size,
            max_retries=self.max_retries,
            refresh=self.refresh,
            sleep=self._sleep,
        )
        failed_ids = {f.id for f in result.failed}
        indexed = sum(c for i, c in copies.items() if i not in failed_ids)
        failed.extend(f for f in result.failed for _ in range(copies.get(f.id, 1)))
        return WriteResult(submitted=len(kis), indexed=indexed, failed=failed)

    def delete(self, ki_ids: Sequence[str]) -> int:
        """Delete KIs by id; returns how many were deleted."""
        ids = list(dict.fromkeys(ki_ids))
        if not ids:
            return 0
        resp = self.client.delete_by_query(index=self.index, query={"ids": {"values": ids}}, refresh=True)
        return int(resp["deleted"])

    def set_status(self, filters: Filter, status: KIStatus) -> int:
        """Set ``status`` on every KI passing ``filters`` (update-by-query); returns how many changed."""
        base = to_es_filter(filters) or {"bool": {"filter": []}}
        query = {"bool": {"filter": [base], "must_not": [{"term": {"status": status}}]}}
        resp = self.client.update_by_query(
            index=self.index,
            query=query,
            refresh=True,
            conflicts="proceed",
            script={"source": "ctx._source.status = params.status", "params": {"status": status}},
        )
        return int(resp["updated"])

    def sweep(
        self, now: datetime, stale_after: timedelta, *, retention: Mapping[str, timedelta] | None = None
    ) -> SweepResult:
        """Expire, then mark stale, by ``last_seen``/``expires_at`` ranges, per subtype window.

        Status only moves forward; nothing is deleted (see :func:`sweep_queries`).
        """
        expired = stale = 0
        for query, status in sweep_queries(now, stale_after, retention):
            resp = self._call(
                "update_by_query",
                self.client.update_by_query,
                index=self.index,
                query=query,
                refresh=True,
                conflicts="proceed",
                script={"source": "ctx._source.status = params.status", "params": {"status": status}},
            )
            if status == "expired":
                expired += int(resp["updated"])
            else:
                stale += int(resp["updated"])
        return SweepResult(stale=stale, expired=expired)

    def mark_seen(self, ki_ids: Sequence[str], now: datetime) -> int:
        """Set ``last_seen = now`` and status ``active`` (update-by-query on ids); returns how many."""
        ids = list(dict.fromkeys(ki_ids))
        n = 0
        seen = now.astimezone(UTC).isoformat().replace("+00:00", "Z")
        for start in range(0, len(ids), 1000):
            resp = self._call(
                "update_by_query",
                self.client.update_by_query,
                index=self.index,
                query={"ids": {"values": ids[start : start + 1000]}},
                refresh=True,
                conflicts="proceed",
                script={
                    "source": "ctx._source.status = 'active'; ctx._source.last_seen = params.now",
                    "params": {"now": seen},
                },
            )
            n += int(resp["updated"])
        return n

    def fingerprint(self) -> str:
        """Hash of each primary shard's ``max_seq_no`` (plus the index uuid).

        Every index, update and delete operation raises its shard's ``max_seq_no``, which never goes
        back (restarts included), so any KI write changes the fingerprint; reads and merges do not.
        """
        resp = self._call("indices.stats", self.client.indices.stats, index=self.index, level="shards")
        body = resp.body if hasattr(resp, "body") else resp
        parts = []
        for name, data in sorted(body.get("indices", {}).items()):
            shards = []
            for shard, copies in sorted(data.get("shards", {}).items()):
                for copy in copies:
                    if copy.get("routing", {}).get("primary", True):
                        shards.append((shard, copy.get("seq_no", {}).get("max_seq_no")))
            parts.append((name, data.get("uuid", ""), shards))
        digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]
        return f"elasticsearch:{self.index}:{digest}"

    def optimize(self) -> None:
        """Nothing to do: Elasticsearch merges segments itself."""
        return None

    # -- reads --------------------------------------------------------------------------------
    def get(self, ki_id: str) -> KI:
        """Return one KI; raises DocumentNotFoundError for an unknown id."""
        from elasticsearch import NotFoundError

        try:
            resp = self.client.get(index=self.index, id=ki_id)
        except NotFoundError:
            raise DocumentNotFoundError(ki_id, backend=BACKEND) from None
        return source_to_ki(resp["_source"])

    def count(self, filters: Filter | None = None) -> int:
        """Count KIs passing ``filters`` (all when None)."""
        query = to_es_filter(filters)
        resp = (
            self.client.count(index=self.index, query=query) if query else self.client.count(index=self.index)
        )
        return int(resp["count"])

    def iter_kis(self, filters: Filter | None = None, *, page_size: int = 1000) -> Iterator[KI]:
        """Yield KIs passing ``filters`` (all when None), by id ascending.

        Yield KIs by id ascending, paging with a point in time + ``search_after`` (never
        ``from + size``, case S4).
        """
        pit = self.client.open_point_in_time(index=self.index, keep_alive="2m")["id"]
        query = to_es_filter(filters) or {"match_all": {}}
        after: list[Any] | None = None
        try:
            while True:
                kwargs: dict[str, Any] = {
                    "pit": {"id": pit, "keep_alive": "2m"},
                    "size": page_size,
                    "sort": [{"id": "asc"}],
                    "query": query,
                }
                if after is not None:
                    kwargs["search_after"] = after
                resp = self.client.search(**kwargs)
                hits = resp["hits"]["hits"]
                for h in hits:
                    yield source_to_ki(h["_source"])
                if len(hits) < page_size:
                    return
                after = hits[-1]["sort"]
                pit = resp.get("pit_id", pit)
        finally:
            self.client.close_point_in_time(id=pit)

    def compile(self, plan: QueryPlan) -> str:
        """The ES|QL text ``search`` runs for ``plan`` (parameters shown by :func:`compile_esql`).

        Returns ``""`` for a plan with no branch input (nothing would run).
        """
        if plan.is_empty():
            return ""
        return compile_esql(plan, self.index, self.retrieval).query

    def search(self, plan: QueryPlan) -> SearchResult:
        """Run the one ES|QL hybrid query, then fetch the KIs with ``mget``; ties break by id."""
        t0 = time.perf_counter()
        if plan.is_empty():
            return SearchResult(hits=[], aggregations=aggregate([]), compiled="")
        q = compile_esql(plan, self.index, self.retrieval)
        kwargs: dict[str, Any] = {"query": q.query, "params": q.params, "format": "json"}
        if q.filter is not None:
            kwargs["filter"] = q.filter
        resp = self.client.esql.query(**kwargs)
        body = resp.body if hasattr(resp, "body") else resp
        headers = getattr(getattr(resp, "meta", None), "headers", None)
        truncated, warnings = parse_warnings(headers)
        cols = [c["name"] for c in body.get("columns", [])]
        rows = [dict(zip(cols, v, strict=False)) for v in body.get("values", [])]
        scored = sorted(
            ((str(r["_id"]), float(r["_score"] or 0.0)) for r in rows), key=lambda p: (-p[1], p[0])
        )
        kis: dict[str, KI] = {}
        if scored:
            got = self.client.mget(index=self.index, ids=[i for i, _ in scored])
            kis = {d["_id"]: source_to_ki(d["_source"]) for d in got["docs"] if d.get("found")}
        hits = [
            Hit(ki=kis[i], score=s, rank=rank)
            for rank, (i, s) in enumerate(((i, s) for i, s in scored if i in kis), start=1)
        ]
        return SearchResult(
            hits=hits,
            aggregations=aggregate(h.ki for h in hits),
            compiled=q.query,
            took_ms=(time.perf_counter() - t0) * 1000,
            truncated=truncated,
            warnings=warnings,
        )

    def facets(self, filters: Filter | None = None, by: str = "tags", limit: int = 100) -> dict[str, int]:
        """Counts per ``by`` value over every KI passing ``filters`` (the STATS query)."""
        q = compile_facets(self.index, filters, by, limit)
        kwargs: dict[str, Any] = {"query": q.query, "format": "json"}
        if q.filter is not None:
            kwargs["filter"] = q.filter
        body = self.client.esql.query(**kwargs)
        body = body.body if hasattr(body, "body") else body
        cols = [c["name"] for c in body.get("columns", [])]
        return {
            str(r[cols.index(_FACET_FIELDS[by])]): int(r[cols.index("n")]) for r in body.get("values", [])
        }

    def close(self) -> None:
        """Close the client. Idempotent."""
        close = getattr(self.client, "close", None)
        if callable(close):
            close()
