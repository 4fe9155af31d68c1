"""Talking to an Elasticsearch client: error wrapping and checked bulk writes.

* :func:`wrap_es_error` — every client error becomes a kitune store error: an HTTP error
  response → :class:`ElasticsearchRequestError` with the status, Elasticsearch's error type and
  reason, and a fix; no response (connection refused, timeout) →
  :class:`~kitune.errors.StoreUnavailableError`.
* :func:`bulk_operations`, :func:`bulk_write` — bulk bodies and a writer that inspects every
  item (``errors: true`` arrives with HTTP 200), retries only 429 items with bounded
  exponential backoff, never retries 4xx mapping errors, and returns a
  :class:`~kitune.retrieval.base.WriteResult` with ``indexed + failed == submitted`` (case S1).

The ``elasticsearch`` package is imported inside the functions (optional extra).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kitune.errors import StoreError, StoreUnavailableError
from kitune.retrieval.base import WriteFailure, WriteResult
from kitune.retrieval.es_query import BACKEND

__all__ = ["ElasticsearchRequestError", "bulk_operations", "bulk_write", "es_error_details", "wrap_es_error"]


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
            f"Elasticsearch unreachable during {what} on index {index}: {e}; "
            "check KITUNE_ES_URL and the network",
            backend=BACKEND,
        )
    status, etype, reason = es_error_details(e)
    fix = _FIXES.get(status or 0, "see Elasticsearch's reason above")
    message = f"Elasticsearch {what} on index {index} failed: HTTP {status} {etype}: {reason}".rstrip(": ")
    return ElasticsearchRequestError(f"{message} — {fix}", status=status, error_type=etype, reason=reason)


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
