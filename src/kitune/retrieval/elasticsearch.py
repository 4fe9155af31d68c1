"""Elasticsearch KI store (8.18+; one FORK/FUSE query on 9.2+): the backend users scale out to.

Imports the ``elasticsearch`` client lazily (``pip install 'kitune[elasticsearch]'``). What is
sent is built by the pure helpers in :mod:`kitune.retrieval.es_query` (mapping, filters, ES|QL;
unit-tested against golden files and Elastic's ES|QL grammar without a server). Here:

* :func:`bulk_operations`, :func:`bulk_write` — bulk bodies and a writer on
  ``elasticsearch.helpers.streaming_bulk`` that inspects every item (``errors: true`` arrives
  with HTTP 200), retries only 429s with bounded exponential backoff, never retries 4xx mapping
  errors, and returns a
  :class:`~kitune.retrieval.base.WriteResult` with ``indexed + failed == submitted`` (case S1).
* :func:`wrap_es_error` — every client error becomes a kitune store error carrying the HTTP
  status and Elasticsearch's reason (:class:`ElasticsearchRequestError`), or
  :class:`~kitune.errors.StoreUnavailableError` when no response came back.
* :class:`ElasticsearchStore` — start-up reads the cluster version (``GET /``): 9.2+ (and
  Serverless) run one FORK/FUSE query, 8.18–9.1 run each branch alone and fuse client-side with
  :func:`~kitune.retrieval.fusion.rrf_fuse` (same constant, weights and ranks), older clusters
  get a :class:`~kitune.errors.ConfigError` naming the minimum.

Two index layouts (``mapping``): ``kitune`` (:func:`~kitune.retrieval.es_query.es_mapping`, the
default) and ``ai-index`` — Elastic's published ``ai-index@mappings`` shape
(:mod:`kitune.retrieval.ai_index`): documents from :func:`~kitune.retrieval.ai_index.ki_to_ai_document`,
BM25 on ``title``, the semantic branch on ``description.semantic`` / ``title.semantic``, status in
``governance.lifecycle.status``, payload filters on ``attributes.*``; facets by ``doc`` /
``subtype`` are refused there (ES|QL cannot read flattened fields).

Start-up check (case S2): ``GET _inference/<id>`` must succeed before any index is created;
otherwise :class:`~kitune.errors.ConfigError` says "inference endpoint <id> not found" and no
index exists.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import ValidationError

from kitune.config import ElasticsearchStoreConfig, KituneConfig, RetrievalConfig
from kitune.errors import ConfigError, DataError, DocumentNotFoundError
from kitune.ki import KI, KIStatus
from kitune.retrieval.ai_index import AI_INDEX_FIELDS, ai_document_to_ki, ai_index_mapping, ki_to_ai_document
from kitune.retrieval.base import Hit, SearchResult, StoreBackend, SweepResult, WriteFailure, WriteResult
from kitune.retrieval.es_client import (
    ElasticsearchRequestError,
    bulk_operations,
    bulk_write,
    cluster_info,
    wrap_es_error,
)
from kitune.retrieval.es_query import (
    BACKEND,
    KITUNE_FIELDS,
    EsFields,
    EsqlQuery,
    check_index_name,
    check_mapping_current,
    compile_branch_queries,
    compile_esql,
    compile_facets,
    es_mapping,
    esql_mode,
    facet_column,
    ki_to_source,
    parse_version,
    parse_warnings,
    source_to_ki,
    stats_fingerprint,
    sweep_queries,
    to_es_filter,
)
from kitune.retrieval.fusion import aggregate, branch_weights, rrf_fuse
from kitune.retrieval.rules import validate_ki
from kitune.schema import Filter, QueryPlan

__all__ = [
    "PLUGINS",
    "ElasticsearchRequestError",
    "ElasticsearchStore",
    "EsqlQuery",
    "bulk_operations",
    "bulk_write",
    "compile_branch_queries",
    "compile_esql",
    "compile_facets",
    "es_mapping",
    "ki_to_source",
    "open_elasticsearch",
    "parse_warnings",
    "source_to_ki",
    "sweep_queries",
    "to_es_filter",
    "wrap_es_error",
]


class ElasticsearchStore:
    """Elasticsearch :class:`~kitune.retrieval.base.Store` (8.18+; see the module docstring).

    On 9.2+ fusion runs server-side (``FUSE``), so ``Hit.branches`` is empty; on 8.18–9.1 each
    branch is its own query and ``Hit.branches`` holds the per-branch ranks.
    ``SearchResult.compiled`` is the ES|QL text (per-branch queries joined by a blank line);
    aggregations are computed over the returned hits (as on every backend), and :meth:`facets`
    runs the ``STATS … BY`` query over every matching KI.

    Args:
        client: an ``elasticsearch.Elasticsearch`` (or any object with the same methods;
            writes go through ``elasticsearch.helpers.streaming_bulk``, see :func:`bulk_write`).
        index: KI index name (created with :func:`es_mapping` if missing).
        inference_id: the ``semantic_text`` inference endpoint; must exist (case S2).
        retrieval: RRF constant, branch weights and size, confidence floor, serve_stale.
        bulk_chunk_size: documents per bulk request.
        max_retries: retries of 429 documents (backoff 0.5 s doubling, capped at 30 s; the
            sleep is ``time.sleep`` inside ``elasticsearch.helpers.actions``).
        refresh: ``refresh`` for writes (``"wait_for"`` makes writes visible before returning).
        create_index: create the index if it is missing (False: it must exist).
        mapping: the index layout, ``kitune`` or ``ai-index`` (see the module docstring).

    Raises:
        ConfigError: the cluster is older than 8.18, the inference endpoint does not exist, or
            the index name is invalid.
        StoreUnavailableError: the cluster cannot be reached.
        ElasticsearchRequestError: the cluster answered a start-up request with an error.
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
        create_index: bool = True,
        mapping: Literal["kitune", "ai-index"] = "kitune",
    ) -> None:
        self.client = client
        self.index = check_index_name(index)
        self.inference_id = inference_id
        self.retrieval = retrieval or RetrievalConfig()
        self.bulk_chunk_size = bulk_chunk_size
        self.max_retries = max_retries
        self.refresh = refresh
        self.version: tuple[int, int, int] | None = None
        """Cluster version read at start-up (None: Serverless)."""
        self.esql_mode: Literal["fuse", "per_branch"] = "fuse"
        """``fuse`` (9.2+: one FORK/FUSE query) or ``per_branch`` (8.18–9.1: client-side RRF)."""
        if mapping not in ("kitune", "ai-index"):
            raise ConfigError(f"store.mapping {mapping!r}: use kitune or ai-index")
        self.mapping = mapping

        self.fields: EsFields = AI_INDEX_FIELDS if mapping == "ai-index" else KITUNE_FIELDS
        """Where each KI field lives in the index."""
        self._preflight(create_index)

    @classmethod
    def from_config(
        cls,
        cfg: ElasticsearchStoreConfig,
        *,
        retrieval: RetrievalConfig | None = None,
        index: str | None = None,
    ) -> ElasticsearchStore:
        """Connect using the URL (and optional API key) in the env vars ``cfg`` names.

        Args:
            cfg: the store section.
            retrieval: retrieval knobs.
            index: overrides ``cfg.index`` (e.g. the old index of a reindex).

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
            index=index or cfg.index,
            inference_id=cfg.inference_id,
            retrieval=retrieval,
            bulk_chunk_size=cfg.bulk_chunk_size,
            max_retries=cfg.max_retries,
            create_index=index is None,
            mapping=cfg.mapping,
        )

    def _call(self, what: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """Run one client call; every client error becomes a kitune store error (:func:`wrap_es_error`)."""
        from elasticsearch import ApiError, TransportError

        try:
            return fn(**kwargs)
        except (ApiError, TransportError) as e:
            raise wrap_es_error(what, self.index, e) from e

    # -- start-up ----------------------------------------------------------------------------
    def _preflight(self, create_index: bool) -> None:
        from elasticsearch import NotFoundError

        info = self._call("GET / (version check)", lambda: cluster_info(self.client))  # product, client
        self.version = parse_version(info)
        self.esql_mode = esql_mode(self.version)
        try:
            self.client.inference.get(inference_id=self.inference_id)
        except NotFoundError as e:
            raise ConfigError(
                f"inference endpoint {self.inference_id} not found: create it (PUT _inference/...) or set "
                "store.inference_id to an existing endpoint; no index was created"
            ) from e
        except Exception as e:
            from elasticsearch import ApiError, TransportError

            if isinstance(e, (ApiError, TransportError)):
                raise wrap_es_error(f"GET _inference/{self.inference_id}", self.index, e) from e
            raise
        if not self._call("indices.exists", self.client.indices.exists, index=self.index):
            if not create_index:
                raise ConfigError(f"index {self.index} does not exist: check the index name")
            try:
                self._call(
                    "indices.create",
                    self.client.indices.create,
                    index=self.index,
                    mappings=self.index_mapping(),
                )
            except ElasticsearchRequestError as e:
                if e.error_type != "resource_already_exists_exception":
                    raise
        elif create_index:
            self._check_mapping()

    def _check_mapping(self) -> None:
        resp = self._call("indices.get_mapping", self.client.indices.get_mapping, index=self.index)
        check_mapping_current(resp.body if hasattr(resp, "body") else resp, self.fields)

    def index_mapping(self) -> dict[str, Any]:
        """The mapping this store creates its index with (its layout's)."""
        if self.mapping == "ai-index":
            return ai_index_mapping(self.inference_id)
        return es_mapping(self.inference_id)

    def to_source(self, ki: KI) -> dict[str, Any]:
        """The document body of one KI in this store's layout."""
        if self.mapping == "ai-index":
            return ki_to_ai_document(ki)
        return ki_to_source(ki)

    def from_source(self, source: Mapping[str, Any]) -> KI:
        """The KI of one stored document in this store's layout."""
        if self.mapping == "ai-index":
            return ai_document_to_ki(source)
        return source_to_ki(source)

    def _status_script(self, extra: str = "") -> str:
        """Painless that sets the status (``params.status``) in this layout, plus ``extra``."""
        if self.mapping == "ai-index":
            return (
                "if (ctx._source.governance == null) { ctx._source.governance = new HashMap(); } "
                "if (ctx._source.governance.lifecycle == null) "
                "{ ctx._source.governance.lifecycle = new HashMap(); } "
                "ctx._source.governance.lifecycle.status = params.status; "
                "if (ctx._source.attributes != null) { ctx._source.attributes.status = params.status; }"
                + extra
            )
        return "ctx._source.status = params.status;" + extra

    # -- writes -------------------------------------------------------------------------------
    def upsert(self, kis: Sequence[KI]) -> WriteResult:
        """Bulk-index KIs by id (see :func:`bulk_write`); the last duplicate wins."""
        failed: list[WriteFailure] = []
        good: dict[str, KI] = {}
        copies: dict[str, int] = {}
        for ki in kis:
            try:
                v = validate_ki(ki)
                self.to_source(v)  # an AI-index limit is checked before anything is sent
            except (ValidationError, AttributeError, TypeError, DataError) as e:
                failed.append(WriteFailure(id=str(getattr(ki, "id", "?")), reason=f"invalid KI: {e}"))
                continue
            good.pop(v.id, None)
            good[v.id] = v
            copies[v.id] = copies.get(v.id, 0) + 1
        result = bulk_write(
            self.client,
            self.index,
            [(k.id, self.to_source(k)) for k in good.values()],
            chunk_size=self.bulk_chunk_size,
            max_retries=self.max_retries,
            refresh=self.refresh,
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
        resp = self._call(
            "delete_by_query",
            self.client.delete_by_query,
            index=self.index,
            query={"ids": {"values": ids}},
            refresh=True,
        )
        return int(resp["deleted"])

    def set_status(self, filters: Filter, status: KIStatus) -> int:
        """Set ``status`` on every KI passing ``filters`` (update-by-query); returns how many changed."""
        base = to_es_filter(filters, fields=self.fields) or {"bool": {"filter": []}}
        query = {"bool": {"filter": [base], "must_not": [{"term": {self.fields.status: status}}]}}
        resp = self._call(
            "update_by_query",
            self.client.update_by_query,
            index=self.index,
            query=query,
            refresh=True,
            conflicts="proceed",
            script={"source": self._status_script(), "params": {"status": status}},
        )
        return int(resp["updated"])

    def sweep(
        self, now: datetime, stale_after: timedelta, *, retention: Mapping[str, timedelta] | None = None
    ) -> SweepResult:
        """Expire, then mark stale, by ``last_seen``/``expires_at`` ranges, per subtype window.

        Status only moves forward; nothing is deleted (see :func:`sweep_queries`).
        """
        expired = stale = 0
        for query, status in sweep_queries(now, stale_after, retention, self.fields):
            resp = self._call(
                "update_by_query",
                self.client.update_by_query,
                index=self.index,
                query=query,
                refresh=True,
                conflicts="proceed",
                script={"source": self._status_script(), "params": {"status": status}},
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
                script={"source": self._seen_script(), "params": {"now": seen, "status": "active"}},
            )
            n += int(resp["updated"])
        return n

    def _seen_script(self) -> str:
        if self.mapping == "ai-index":
            return self._status_script(
                " ctx._source['@timestamp'] = params.now;"
                " if (ctx._source.attributes != null) { ctx._source.attributes.last_seen = params.now; }"
            )
        return "ctx._source.status = params.status; ctx._source.last_seen = params.now"

    def fingerprint(self) -> str:
        """Hash of each primary shard's ``max_seq_no`` (plus the index uuid).

        Every index, update and delete operation raises its shard's ``max_seq_no``, which never goes
        back (restarts included), so any KI write changes the fingerprint; reads and merges do not.
        """
        resp = self._call("indices.stats", self.client.indices.stats, index=self.index, level="shards")
        return stats_fingerprint(resp.body if hasattr(resp, "body") else resp, self.index)

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
        except Exception as e:
            from elasticsearch import ApiError, TransportError

            if isinstance(e, (ApiError, TransportError)):
                raise wrap_es_error("get", self.index, e) from e
            raise
        return self.from_source(resp["_source"])

    def count(self, filters: Filter | None = None) -> int:
        """Count KIs passing ``filters`` (all when None)."""
        query = to_es_filter(filters, fields=self.fields)
        kwargs: dict[str, Any] = {"index": self.index}
        if query:
            kwargs["query"] = query
        return int(self._call("count", self.client.count, **kwargs)["count"])

    def iter_kis(self, filters: Filter | None = None, *, page_size: int = 1000) -> Iterator[KI]:
        """Yield KIs passing ``filters`` (all when None), by id ascending.

        Yield KIs by id ascending, paging with a point in time + ``search_after`` (never
        ``from + size``, case S4).
        """
        pit = self._call(
            "open_point_in_time", self.client.open_point_in_time, index=self.index, keep_alive="2m"
        )["id"]
        query = to_es_filter(filters, fields=self.fields) or {"match_all": {}}
        after: list[Any] | None = None
        try:
            while True:
                kwargs: dict[str, Any] = {
                    "pit": {"id": pit, "keep_alive": "2m"},
                    "size": page_size,
                    "sort": [{self.fields.id: "asc"}],
                    "query": query,
                }
                if after is not None:
                    kwargs["search_after"] = after
                resp = self._call("search", self.client.search, **kwargs)
                hits = resp["hits"]["hits"]
                for h in hits:
                    yield self.from_source(h["_source"])
                if len(hits) < page_size:
                    return
                after = hits[-1]["sort"]
                pit = resp.get("pit_id", pit)
        finally:
            self._call("close_point_in_time", self.client.close_point_in_time, id=pit)

    def queries(self, plan: QueryPlan) -> list[EsqlQuery]:
        """The ES|QL requests ``search`` sends for ``plan``: one on 9.2+, one per branch before."""
        if plan.is_empty():
            return []
        if self.esql_mode == "fuse":
            return [compile_esql(plan, self.index, self.retrieval, self.fields)]
        return compile_branch_queries(plan, self.index, self.retrieval, self.fields)

    def compile(self, plan: QueryPlan) -> str:
        """The ES|QL text ``search`` runs for ``plan`` (per-branch queries joined by a blank line).

        Returns ``""`` for a plan with no branch input (nothing would run).
        """
        return "\n\n".join(q.query for q in self.queries(plan))

    def _esql(self, q: EsqlQuery) -> tuple[list[tuple[str, float]], tuple[str, ...], bool]:
        kwargs: dict[str, Any] = {"query": q.query, "params": q.params, "format": "json"}
        if q.filter is not None:
            kwargs["filter"] = q.filter
        resp = self._call("ES|QL query", self.client.esql.query, **kwargs)
        body = resp.body if hasattr(resp, "body") else resp
        truncated, warnings = parse_warnings(getattr(getattr(resp, "meta", None), "headers", None))
        cols = [c["name"] for c in body.get("columns", [])]
        rows = [dict(zip(cols, v, strict=False)) for v in body.get("values", [])]
        scored = sorted(
            ((str(r["_id"]), float(r["_score"] or 0.0)) for r in rows), key=lambda p: (-p[1], p[0])
        )
        return scored, warnings, truncated

    def search(self, plan: QueryPlan) -> SearchResult:
        """Run the hybrid query (FUSE, or per-branch + client RRF), then ``mget`` the KIs; ties by id."""
        t0 = time.perf_counter()
        queries = self.queries(plan)
        if not queries:
            return SearchResult(hits=[], aggregations=aggregate([]), compiled="")
        warnings: list[str] = []
        truncated = False
        if self.esql_mode == "fuse":
            scored, warns, truncated = self._esql(queries[0])
            warnings += warns
            ranked: list[tuple[str, float, dict[str, int]]] = [(i, s, {}) for i, s in scored]
        else:
            rankings: dict[str, list[str]] = {}
            for q in queries:
                rows, warns, cut = self._esql(q)
                rankings[q.branches[0]] = [i for i, _ in rows]
                warnings += warns
                truncated = truncated or cut
            r = self.retrieval
            fused = rrf_fuse(rankings, branch_weights(r), r.rrf_k)[: plan.size]
            ranked = [(f.id, f.score, f.branches) for f in fused]
        kis: dict[str, KI] = {}
        if ranked:
            got = self._call("mget", self.client.mget, index=self.index, ids=[i for i, _, _ in ranked])
            kis = {d["_id"]: self.from_source(d["_source"]) for d in got["docs"] if d.get("found")}
        hits = [
            Hit(ki=kis[i], score=s, rank=rank, branches=dict(b))
            for rank, (i, s, b) in enumerate(((i, s, b) for i, s, b in ranked if i in kis), start=1)
        ]
        return SearchResult(
            hits=hits,
            aggregations=aggregate(h.ki for h in hits),
            compiled="\n\n".join(q.query for q in queries),
            took_ms=(time.perf_counter() - t0) * 1000,
            truncated=truncated,
            warnings=tuple(warnings),
        )

    def facets(self, filters: Filter | None = None, by: str = "tags", limit: int = 100) -> dict[str, int]:
        """Counts per ``by`` value over every KI passing ``filters`` (the STATS query)."""
        q = compile_facets(self.index, filters, by, limit, self.fields)
        kwargs: dict[str, Any] = {"query": q.query, "format": "json"}
        if q.filter is not None:
            kwargs["filter"] = q.filter
        body = self._call("ES|QL facets", self.client.esql.query, **kwargs)
        body = body.body if hasattr(body, "body") else body
        cols = [c["name"] for c in body.get("columns", [])]
        col = facet_column(by, self.fields)
        return {str(r[cols.index(col)]): int(r[cols.index("n")]) for r in body.get("values", [])}

    def reindex_from(self, source_index: str, *, page_size: int = 500) -> WriteResult:
        """Copy every KI of ``source_index`` (any earlier kitune mapping) into this store's index.

        Reads the old index by point in time (each document's ``ki`` object) and bulk-writes the
        KIs with the current mapping's fields; status and ``last_seen`` are kept.

        Raises:
            ConfigError: ``source_index`` is this store's own index or an invalid name.
        """
        check_index_name(source_index)
        if source_index == self.index:
            raise ConfigError(f"reindex source and target are both {self.index}: pass the old index name")
        old = ElasticsearchStore.__new__(ElasticsearchStore)
        old.__dict__.update(self.__dict__)
        old.index = source_index
        submitted = indexed = 0
        failed: list[WriteFailure] = []
        batch: list[KI] = []
        for ki in old.iter_kis(page_size=page_size):
            batch.append(ki)
            if len(batch) >= page_size:
                r = self.upsert(batch)
                submitted, indexed, failed = submitted + r.submitted, indexed + r.indexed, failed + r.failed
                batch = []
        if batch:
            r = self.upsert(batch)
            submitted, indexed, failed = submitted + r.submitted, indexed + r.indexed, failed + r.failed
        return WriteResult(submitted=submitted, indexed=indexed, failed=failed)

    def close(self) -> None:
        """Close the client. Idempotent."""
        close = getattr(self.client, "close", None)
        if callable(close):
            close()


def open_elasticsearch(cfg: KituneConfig, embedder: Any = None) -> ElasticsearchStore:
    """The Elasticsearch KI store of ``cfg`` (index ``store.index``).

    It embeds server-side, so ``embedder`` is ignored.

    Raises:
        ConfigError: ``cfg.store`` is not an Elasticsearch section, the ``elasticsearch`` extra
            is not installed, or the URL variable is unset.
        StoreUnavailableError: the cluster cannot be reached (see :class:`ElasticsearchStore`).
    """
    section = cfg.store
    if not isinstance(section, ElasticsearchStoreConfig):
        raise ConfigError(
            f"store.type is {section.type!r}, not elasticsearch: open it with kitune.retrieval.create_store"
        )
    try:
        import elasticsearch  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            "store.type=elasticsearch needs the Elasticsearch client: pip install 'kitune[elasticsearch]'"
        ) from e
    return ElasticsearchStore.from_config(section, retrieval=cfg.retrieval)


PLUGINS = {"elasticsearch": StoreBackend("elasticsearch", ElasticsearchStoreConfig, open_elasticsearch)}
"""The scale-out backend, registered by :data:`kitune.retrieval.backends.STORES`."""
