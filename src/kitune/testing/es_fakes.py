"""An in-process Elasticsearch for bulk tests: the real client, a Python ``_bulk`` endpoint.

:func:`bulk_client` returns a real ``elasticsearch.Elasticsearch`` whose only node is in-process
(no socket): the client serializes the NDJSON body, sends the query string, parses the JSON reply
and raises its own ``ApiError`` subclasses for HTTP errors exactly as against a cluster, so
``elasticsearch.helpers.streaming_bulk`` (which needs ``client.options()``, ``client.transport``
and ``client._otel``) runs unchanged. Only ``PUT``/``POST [/<index>]/_bulk`` is answered (by ``handler``);
any other request gets a 404 ``fake_es_no_such_endpoint``.

The transport's own retries are off (``max_retries=0``) so a scripted 429 reaches the bulk
helper instead of being re-sent by ``elastic_transport``; replies carry
``X-Elastic-Product: Elasticsearch`` so the client's product check passes.

Needs the ``elasticsearch`` extra (imported inside :func:`bulk_client`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl

__all__ = ["BulkHandler", "BulkOp", "bulk_client", "bulk_item"]

BulkOp = tuple[dict[str, Any], dict[str, Any] | None]
"""One bulk action: ``({op_type: {"_index": ..., "_id": ...}}, source or None for delete)``."""

BulkHandler = Callable[[list[BulkOp], Mapping[str, str]], tuple[int, dict[str, Any]]]
"""``(actions, query parameters) -> (HTTP status, JSON reply)`` for one ``_bulk`` request."""


def bulk_item(
    action: Mapping[str, Any], status: int, error: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """One ``items[]`` entry as Elasticsearch 9 answers it for ``action`` (a :data:`BulkOp` head).

    Args:
        action: ``{op_type: {"_index": ..., "_id": ...}}``.
        status: the item's HTTP status (2xx: written).
        error: ``{"type": ..., "reason": ...}`` for a failed item.
    """
    ((op_type, meta),) = action.items()
    item: dict[str, Any] = {"_index": meta.get("_index", ""), "_id": meta.get("_id", ""), "status": status}
    if 200 <= status < 300:
        item |= {"_version": 1, "result": "created", "_seq_no": 0, "_primary_term": 1}
    else:
        item["error"] = {"type": "exception", "reason": ""} | dict(error or {})
    return {op_type: item}


def _parse_ndjson(body: bytes) -> list[BulkOp]:
    lines = [json.loads(line) for line in body.splitlines() if line.strip()]
    ops: list[BulkOp] = []
    pos = 0
    while pos < len(lines):
        action = lines[pos]
        has_source = next(iter(action)) != "delete"
        ops.append((action, lines[pos + 1] if has_source else None))
        pos += 2 if has_source else 1
    return ops


def bulk_client(handler: BulkHandler) -> Any:
    """A real ``elasticsearch.Elasticsearch`` whose ``_bulk`` requests are answered by ``handler``.

    Args:
        handler: called once per HTTP request with the parsed actions and query parameters (e.g.
            ``{"refresh": "true"}``); returns the HTTP status and JSON body (use
            :func:`bulk_item` for the items; a status >= 400 makes the client raise).

    Returns:
        The client (typed ``Any``: the ``elasticsearch`` extra is optional).
    """
    from elastic_transport import ApiResponseMeta, BaseNode, HttpHeaders
    from elastic_transport._node import NodeApiResponse  # what a node returns; not re-exported at the top
    from elasticsearch import Elasticsearch

    class _InProcessNode(BaseNode):
        def perform_request(
            self,
            method: str,
            target: str,
            body: bytes | None = None,
            headers: HttpHeaders | None = None,
            request_timeout: Any = None,
        ) -> NodeApiResponse:
            path, _, query = target.partition("?")
            if method in ("POST", "PUT") and path.endswith("/_bulk"):
                status, reply = handler(_parse_ndjson(body or b""), dict(parse_qsl(query)))
            else:
                error = {"type": "fake_es_no_such_endpoint", "reason": f"{method} {path}"}
                status, reply = 404, {"error": error, "status": 404}
            meta = ApiResponseMeta(
                status=status,
                http_version="1.1",
                headers=HttpHeaders(
                    {"content-type": "application/json", "x-elastic-product": "Elasticsearch"}
                ),
                duration=0.0,
                node=self.config,
            )
            return NodeApiResponse(meta, json.dumps(reply).encode())

    return Elasticsearch("http://kitune-fake-es:9200", node_class=_InProcessNode, max_retries=0)
