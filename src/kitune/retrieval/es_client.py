"""Talking to an Elasticsearch client: error wrapping and checked bulk writes.

* :func:`wrap_es_error` — every client error becomes a kitune store error: an HTTP error
  response → :class:`ElasticsearchRequestError` with the status, Elasticsearch's error type and
  reason, and a fix; no response (connection refused, timeout) →
  :class:`~kitune.errors.StoreUnavailableError`. Two identity errors get their own message:
  a client/cluster major-version mismatch (the 9.x client's ``compatible-with=9`` media types
  refused by an 8.x cluster with HTTP 400 ``media_type_header_exception``) names both versions
  and the fix, and a server that is not Elasticsearch (OpenSearch) is named as such.
* :func:`cluster_info` — the start-up ``GET /``: the cluster's identity checked before anything
  else, with those two cases raised as :class:`~kitune.errors.ConfigError` naming the exact
  versions.
* :func:`bulk_operations`, :func:`bulk_write` — bulk bodies, and a writer on
  ``elasticsearch.helpers.streaming_bulk`` (its chunking, per-item checks and bounded
  exponential-backoff retries of 429s) that never retries 4xx mapping errors and returns a
  :class:`~kitune.retrieval.base.WriteResult` with ``indexed + failed == submitted`` (case S1).

The ``elasticsearch`` package is imported inside the functions (optional extra).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from typing import Any

from kitune.errors import ConfigError, StoreError, StoreUnavailableError
from kitune.retrieval.base import WriteFailure, WriteResult
from kitune.retrieval.es_query import BACKEND, not_elasticsearch

__all__ = [
    "CLIENT_REQUIREMENT",
    "ElasticsearchRequestError",
    "bulk_operations",
    "bulk_write",
    "cluster_info",
    "es_error_details",
    "version_mismatch",
    "wrap_es_error",
]


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
    400: "the request was rejected as invalid (see the reason; a query syntax error is a kitune bug)",
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
        return (
            status,
            str(first.get("type", err.get("type", ""))),
            str(first.get("reason", err.get("reason", ""))),
        )
    if isinstance(err, str):
        return status, "", err
    return status, str(getattr(e, "message", "") or ""), str(e)


_ACCEPTS = re.compile(r"Accept version must be either version (\d+) or (\d+), but found (\d+)")
_COMPAT_ACCEPT = "application/vnd.elasticsearch+json; compatible-with={major}"

CLIENT_REQUIREMENT = "elasticsearch>=9.5.1"
"""The client kitune's ``elasticsearch`` extra requires (``pyproject.toml``; a test keeps them equal).

Its major version is the only one whose clusters accept its media types: the 9.x client sends
``compatible-with=9`` and Elasticsearch 8.x refuses it, so an 8.x cluster cannot be served by
this install, and installing an 8.x client would break kitune's own requirement."""


def _client_version() -> str:
    return version("elasticsearch")


def _caused_by(body: Any) -> str:
    """Every ``reason`` in an error body's ``caused_by`` chain, joined (what the 8.x refusal says)."""
    err = body.get("error") if isinstance(body, Mapping) else None
    reasons: list[str] = []
    while isinstance(err, Mapping) and len(reasons) < 10:
        reasons.append(str(err.get("reason", "")))
        err = err.get("caused_by")
    return " ".join(reasons)


def version_mismatch(e: Exception, server_version: str | None = None) -> str | None:
    """The client/cluster major-version mismatch behind an HTTP 400/406 media-type refusal, or None.

    A 9.x ``elasticsearch`` client sends ``application/vnd.elasticsearch+json; compatible-with=9``;
    an 8.x cluster answers ``media_type_header_exception`` caused by "Accept version must be either
    version 8 or 7, but found 9".

    Args:
        e: the client error.
        server_version: the cluster's version when known (e.g. ``"8.15.1"``), else its major
            version is taken from the refusal.

    Returns:
        A message naming the client version, the cluster version and the fix (a cluster of the
        client's major version: kitune requires :data:`CLIENT_REQUIREMENT`, so an 8.x cluster is
        upgraded, never served by downgrading the client), or None when ``e`` is not such a refusal.
    """
    status, etype, reason = es_error_details(e)
    text = f"{etype} {reason} {_caused_by(getattr(e, 'body', None))}"
    m = _ACCEPTS.search(text)
    if m is None and not (status in (400, 406) and "compatible-with" in text):
        return None
    client = _client_version()
    client_major = client.split(".")[0]
    major = m[1] if m else None
    if server_version:
        cluster = f"Elasticsearch {server_version}"
    else:
        cluster = f"an Elasticsearch {major}.x cluster" if major else "the cluster"
    fix = (
        f"kitune requires the {client_major}.x client ({CLIENT_REQUIREMENT}, its elasticsearch extra), "
        f"which works with Elasticsearch {client_major}.x clusters only: upgrade the cluster to "
        f"Elasticsearch {client_major}.x, or use the embedded store (store.type: lancedb)"
    )
    return (
        f"the elasticsearch Python client {client} sends {client_major}.x media types "
        f"(compatible-with={client_major}) and {cluster} refuses them (HTTP {status} {etype}): {fix}"
    )


def cluster_info(client: Any) -> Mapping[str, Any]:
    """The cluster's ``GET /`` body, with its identity checked first (the start-up call).

    Args:
        client: an ``elasticsearch.Elasticsearch``.

    Returns:
        The ``GET /`` body of an Elasticsearch cluster (version not yet checked against the
        minimum; see :func:`kitune.retrieval.es_query.parse_version`).

    Raises:
        ConfigError: the server is not Elasticsearch (OpenSearch: named, with its version), or the
            cluster refused the client's media types (a 9.x client against an 8.x cluster: names
            the client version, the cluster's version — asked once more with its own major
            version's media type — and the fix).
        elasticsearch.ApiError, elasticsearch.TransportError: any other failure (the caller wraps).
    """
    from elasticsearch import ApiError, UnsupportedProductError

    try:
        resp = client.info()
    except UnsupportedProductError as e:
        raise ConfigError(_product_message(getattr(e, "body", None))) from e
    except ApiError as e:
        if version_mismatch(e) is None:
            raise
        m = _ACCEPTS.search(_caused_by(getattr(e, "body", None)))
        server: str | None = None
        if m is not None:  # ask again in the cluster's own dialect, to name its exact version
            try:
                accept = {"accept": _COMPAT_ACCEPT.format(major=m[1])}  # info() would reset it to 9
                body = client.perform_request("GET", "/", headers=accept)
                version = getattr(body, "body", body).get("version", {})
                server = str(version.get("number", "")) or None
            except Exception:  # best effort: the refusal alone names the major version
                server = None
        raise ConfigError(str(version_mismatch(e, server))) from e
    body = resp.body if hasattr(resp, "body") else resp
    problem = not_elasticsearch(body)
    if problem is not None:
        raise ConfigError(problem)
    return body  # type: ignore[no-any-return]


def _product_message(body: Any) -> str:
    """Why the client refused the server as "not Elasticsearch" (no ``X-Elastic-Product`` header)."""
    problem = not_elasticsearch(body)
    if problem is not None:
        return problem
    version = body.get("version") if isinstance(body, Mapping) else None
    shown = f" (it reports version {version.get('number')})" if isinstance(version, Mapping) else ""
    return (
        f"the server at the store URL is not Elasticsearch{shown}: its answers lack the X-Elastic-Product "
        "header the elasticsearch client requires. Point store.url_env (KITUNE_ES_URL) at an Elasticsearch "
        f"{_client_version().split('.')[0]}.x cluster, or use the embedded store (store.type: lancedb)"
    )


def wrap_es_error(what: str, index: str, e: Exception) -> StoreError:
    """Turn an ``elasticsearch`` client exception into a kitune store error.

    Returns:
        :class:`~kitune.errors.StoreUnavailableError` for connection/timeout errors (no HTTP
        response), else :class:`ElasticsearchRequestError` naming the operation, the index, the
        HTTP status, Elasticsearch's error type and reason, and a fix.
    """
    from elasticsearch import ApiError, UnsupportedProductError

    if not isinstance(e, ApiError):
        return StoreUnavailableError(
            f"Elasticsearch unreachable during {what} on index {index}: {e}; "
            "check KITUNE_ES_URL and the network",
            backend=BACKEND,
        )
    status, etype, reason = es_error_details(e)
    if isinstance(e, UnsupportedProductError):
        return ElasticsearchRequestError(
            f"Elasticsearch {what} on index {index} failed: {_product_message(getattr(e, 'body', None))}",
            status=status,
            error_type="unsupported_product",
            reason=reason,
        )
    fix = version_mismatch(e) or _FIXES.get(status or 0, "see Elasticsearch's reason above")
    message = f"Elasticsearch {what} on index {index} failed: HTTP {status} {etype}: {reason}".rstrip(": ")
    return ElasticsearchRequestError(f"{message} — {fix}", status=status, error_type=etype, reason=reason)


def bulk_operations(index: str, docs: Sequence[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Bulk body for ``(id, source)`` pairs: one ``index`` action (replace by id) + source each."""
    ops: list[dict[str, Any]] = []
    for doc_id, source in docs:
        ops.append({"index": {"_index": index, "_id": doc_id}})
        ops.append(dict(source))
    return ops


def _outcome(ok: bool, info: Mapping[str, Any], max_retries: int) -> tuple[str, WriteFailure | None]:
    """``(_id, failure or None)`` of one ``(ok, {op_type: info})`` that ``streaming_bulk`` yields.

    A whole-request error arrives once per document with the ``exception`` (its type and reason
    via :func:`es_error_details`) and the action's own ``_id``; an item error carries
    Elasticsearch's ``error`` (type and reason). A 429 that is still yielded has exhausted
    ``max_retries`` (``retry_on_status`` is 429 only).
    """
    doc_id = str(info.get("_id", ""))
    if ok:
        return doc_id, None
    status = int(info.get("status", 0))
    exc = info.get("exception")
    if exc is not None:
        _, etype, ereason = es_error_details(exc)
        what = "whole bulk request rejected" if status == 429 else "bulk request failed"
        reason = f"{what}: HTTP {status} {etype}: {ereason}"
    else:
        error = info.get("error")
        if isinstance(error, Mapping):
            reason = f"{error.get('type', 'error')}: {error.get('reason', '')}".strip()
        else:
            reason = str(error or "") or f"status {status}"
    if status == 429:
        reason = f"429 after {max_retries} retries: {reason}"
    return doc_id, WriteFailure(id=doc_id, reason=reason, status=status)


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
) -> WriteResult:
    """Bulk-index ``docs`` (``(id, source)`` pairs) with ``elasticsearch.helpers.streaming_bulk``.

    ``streaming_bulk`` chunks (``chunk_size`` documents, at most 100 MB), checks every item
    (``errors: true`` arrives with HTTP 200) and retries 429s itself; kitune turns what it yields
    into a :class:`~kitune.retrieval.base.WriteResult`:

    * 2xx items count as indexed;
    * 429 items and whole-request 429s are retried up to ``max_retries`` times (only the
      rejected documents are re-sent); before retry ``n`` (1-based) it sleeps
      ``min(backoff_s * 2**(n - 1), max_backoff_s)`` seconds — ``streaming_bulk``'s
      ``initial_backoff``/``max_backoff`` are exactly ``backoff_s``/``max_backoff_s``. The sleep
      is ``time.sleep`` called inside ``elasticsearch.helpers.actions`` (it cannot be injected):
      tests patch ``elasticsearch.helpers.actions.time.sleep``;
    * any other item failure (400 mapping error, 404, …) is reported at once with Elasticsearch's
      error type and reason, never retried;
    * a chunk whose whole request fails for a non-429 reason reports each of its documents with
      the HTTP status (``raise_on_exception=False``); later chunks still run;
    * a document the response has no item for (``streaming_bulk`` zips items to actions and
      drops the rest silently) is reported as failed, so the counts always add up.

    Args:
        client: an ``elasticsearch.Elasticsearch`` (``streaming_bulk`` uses ``client.options()``,
            ``client.transport`` and ``client._otel``).
        index: target index.
        docs: ``(id, source)`` pairs; each becomes one ``index`` action (replace by id).
        chunk_size: documents per bulk request.
        max_retries: retries of 429 documents (0: report them at once).
        backoff_s: seconds before the first retry; doubles per retry.
        max_backoff_s: cap on one backoff sleep, seconds.
        refresh: ``refresh`` parameter of each bulk request (None: not sent).

    Returns:
        ``WriteResult`` with ``indexed + len(failed) == len(docs)``; failures in the order
        Elasticsearch reported them (exhausted 429s after their chunk's other outcomes).

    Raises:
        StoreUnavailableError: the cluster cannot be reached (no HTTP response); documents of
            earlier chunks may already be indexed.
    """
    from elasticsearch import TransportError
    from elasticsearch.helpers import streaming_bulk

    actions = (
        {"_op_type": "index", "_index": index, "_id": doc_id, "_source": dict(source)}
        for doc_id, source in docs
    )
    outstanding = Counter(doc_id for doc_id, _ in docs)
    params: dict[str, Any] = {} if refresh is None else {"refresh": refresh}
    indexed = 0
    failed: list[WriteFailure] = []
    try:
        for ok, result in streaming_bulk(
            client,
            actions,
            chunk_size=chunk_size,
            max_retries=max_retries,
            initial_backoff=backoff_s,
            max_backoff=max_backoff_s,
            retry_on_status=(429,),
            raise_on_error=False,
            raise_on_exception=False,
            yield_ok=True,
            **params,
        ):
            doc_id, failure = _outcome(ok, next(iter(result.values()), {}), max_retries)
            if outstanding[doc_id] <= 0:
                continue  # an item for no submitted id: its document is reported missing below
            outstanding[doc_id] -= 1
            if failure is None:
                indexed += 1
            else:
                failed.append(failure)
    except TransportError as e:
        raise StoreUnavailableError(
            f"Elasticsearch unreachable during bulk on index {index}: {e}", backend=BACKEND
        ) from e
    failed.extend(
        WriteFailure(id=doc_id, reason="no item for this document in the bulk response")
        for doc_id, n in outstanding.items()
        for _ in range(n)
    )
    return WriteResult(submitted=len(docs), indexed=indexed, failed=failed)
