"""``kitune mcp``: kitune's tools over the Model Context Protocol (the official ``mcp`` SDK).

Tools (JSON schemas generated from the signatures below; the tool bodies are
:mod:`kitune.service.mcp`):

* ``get_context(query, size?, filters?)`` → KIs with tags, references, evidence doc ids,
  subtype, confidence and score, plus the aggregations (by tag, doc, entity);
* ``search_documents(query, k?)`` → raw corpus hits with snippets;
* ``get_document(docid)`` → one document's text (capped).

Resource: ``kitune://source-description`` (Markdown), the corpus's source-description KIs, for
an agent to read first.

Transports: ``stdio`` (the client starts ``kitune mcp`` as a subprocess) and ``http``
(streamable HTTP at ``http://HOST:PORT/mcp``). The HTTP transport follows ``kitune serve``'s
rules: a non-loopback host is refused unless ``KITUNE_API_TOKEN`` is set; with a token every
request needs ``Authorization: Bearer <token>`` (constant-time compare, 401 otherwise);
request bodies are capped at :data:`kitune.server.MAX_BODY_BYTES`; loopback binds get the
SDK's DNS-rebinding protection. Tool errors name the argument and the fix and never carry a
stack trace, a store URL or a secret; the log names tools and argument *fields*, never the
query text.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import Field, ValidationError

from kitune.config import KituneConfig
from kitune.errors import DocumentNotFoundError, KituneError, StoreUnavailableError
from kitune.server import API_TOKEN_ENV, MAX_BODY_BYTES, is_loopback_host
from kitune.service.mcp import (
    MAX_QUERY_CHARS,
    ContextFilters,
    context_tool,
    get_document_tool,
    search_documents_tool,
    source_description_kis,
)

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from starlette.types import ASGIApp, Receive, Scope, Send

    from kitune.programs.query_rewriter import QueryRewriter
    from kitune.retrieval.base import CorpusStore, Store
    from kitune.usage import TokenLedger

__all__ = ["SOURCE_DESCRIPTION_URI", "BearerAuth", "check_bind", "create_mcp_server", "run_mcp"]

logger = logging.getLogger(__name__)

SOURCE_DESCRIPTION_URI = "kitune://source-description"
"""URI of the resource holding the source-description KIs."""

_STORE_DOWN = "the KI store is unavailable: check that its backend is running and configured"
_INSTRUCTIONS = (
    "kitune answers questions over a document collection with pre-computed Knowledge Indicators "
    "(KIs): short, evidence-backed facts that cite their documents. Read the resource "
    f"{SOURCE_DESCRIPTION_URI} first to learn what the collection holds. Call get_context with one "
    "entity or relation per query; follow a KI's evidence_doc_ids with get_document when you need "
    "the source text; use search_documents only when get_context has no answer."
)

_T = TypeVar("_T")


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback ``host`` without a bearer token (same rule as ``kitune serve``).

    Raises:
        ConfigError: ``host`` is not loopback and ``token`` is empty.
    """
    from kitune.errors import ConfigError

    if not is_loopback_host(host) and not token:
        raise ConfigError(
            f"binding to {host} exposes the MCP endpoint beyond this machine: set {API_TOKEN_ENV} to a "
            "secret bearer token (clients send 'Authorization: Bearer <token>'), or use --host 127.0.0.1"
        )


class BearerAuth:
    """ASGI middleware: every HTTP request needs ``Authorization: Bearer <token>`` (else 401)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer 401 without a matching token; pass everything else (lifespan too) through."""
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            value = headers.get(b"authorization", b"")
            scheme, _, given = value.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.token):
                body = json.dumps(
                    {"error": {"type": "http_error", "message": "missing or wrong bearer token"}}
                ).encode("utf-8")
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def _describe(e: ValidationError) -> str:
    """``"filters.tags_any: malformed tags ['Bad Tag!'] (tags are lowercase a-z0-9-, entity:<slug>…)"``."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"filters.{loc}: {msg}")
    hint = "tags are lowercase a-z0-9- words, entity:<slug> or doc:<docid>"
    return "; ".join(parts) + (f" ({hint})" if any("tag" in p for p in parts) else "")


def _guard(tool: str, fn: Callable[[], _T]) -> _T:
    """Run one tool body; map kitune errors to MCP tool errors with a clean message."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        return fn()
    except DocumentNotFoundError as e:
        raise ToolError(f"{e}: use a docid from a KI's evidence_doc_ids or a search_documents hit") from e
    except StoreUnavailableError as e:
        logger.warning("%s: store unavailable: %s", tool, type(e).__name__)
        raise ToolError(_STORE_DOWN) from e
    except ValidationError as e:  # a filter value the KI filter rejects (e.g. a malformed tag)
        logger.info("%s: rejected arguments (%s)", tool, type(e).__name__)
        raise ToolError(f"invalid argument: {_describe(e)}") from e
    except ValueError as e:  # argument checks in kitune.service.mcp
        logger.info("%s: rejected arguments (%s)", tool, type(e).__name__)
        raise ToolError(f"invalid argument: {e}") from e
    except KituneError as e:
        logger.error("%s failed: %s", tool, type(e).__name__, exc_info=e)
        raise ToolError(f"{tool} failed ({type(e).__name__}); see the server log") from e


def create_mcp_server(
    cfg: KituneConfig,
    *,
    store: Store | None = None,
    corpus_store: CorpusStore | None = None,
    rewriter: QueryRewriter | None = None,
    ledger: TokenLedger | None = None,
) -> MCPServer[Any]:
    """Build the MCP server with kitune's three tools and the source-description resource.

    Args:
        cfg: configuration; ``retrieval.max_size`` bounds ``size``, ``retrieval.search_hits`` is
            ``k``'s default.
        store: the KI store (None: ``create_store(cfg)`` on first use).
        corpus_store: the document store (None: ``create_corpus_store(cfg)`` on first use).
        rewriter: the query rewriter with its LM (None: plain plans, no LLM calls).
        ledger: token ledger of the rewrites.

    Returns:
        An ``mcp.server.mcpserver.MCPServer``; run it with :func:`run_mcp` or its own ``run``.
    """
    from mcp.server.mcpserver import MCPServer

    lock = threading.Lock()
    held: dict[str, Any] = {}
    if store is not None:
        held["store"] = store
    if corpus_store is not None:
        held["corpus"] = corpus_store

    def kis() -> Store:
        with lock:
            if "store" not in held:
                from kitune.retrieval import create_store

                held["store"] = create_store(cfg)
            return held["store"]  # type: ignore[no-any-return]

    def corpus() -> CorpusStore:
        with lock:
            if "corpus" not in held:
                from kitune.retrieval import create_corpus_store

                held["corpus"] = create_corpus_store(cfg)
            return held["corpus"]  # type: ignore[no-any-return]

    max_size = cfg.retrieval.max_size
    server: MCPServer[Any] = MCPServer("kitune", instructions=_INSTRUCTIONS, version="1")

    query_t = Annotated[
        str,
        Field(
            min_length=1,
            max_length=MAX_QUERY_CHARS,
            description="The question, or one entity and relation (1–2000 characters).",
        ),
    ]
    size_t = Annotated[
        int | None,
        Field(
            ge=1,
            le=max_size,
            description=f"KIs wanted, 1–{max_size} (default {min(cfg.retrieval.default_size, max_size)}).",
        ),
    ]
    filters_t = Annotated[ContextFilters | None, Field(description="Optional conditions every KI must meet.")]
    keywords_t = Annotated[
        str, Field(min_length=1, max_length=MAX_QUERY_CHARS, description="Keywords (1–2000 characters).")
    ]
    k_t = Annotated[
        int | None,
        Field(ge=1, le=100, description=f"Documents wanted, 1–100 (default {cfg.retrieval.search_hits})."),
    ]
    docid_t = Annotated[
        str, Field(min_length=1, max_length=512, description="A doc id from evidence_doc_ids or a hit.")
    ]

    def get_context(
        query: str, size: int | None = None, filters: ContextFilters | None = None
    ) -> dict[str, Any]:
        """Retrieve Knowledge Indicators (evidence-backed facts citing [docid]) for a question.

        Returns the KIs best first, each with tags, references, evidence doc ids, subtype,
        confidence and score, plus aggregations (counts by tag, document and entity).
        """
        return _guard(
            "get_context",
            lambda: context_tool(
                query, store=kis(), cfg=cfg, size=size, filters=filters, rewriter=rewriter, ledger=ledger
            ),
        )

    def search_documents(query: str, k: int | None = None) -> dict[str, Any]:
        """Search the raw documents (BM25 + vectors); returns doc ids, titles and best snippets."""
        return _guard(
            "search_documents", lambda: search_documents_tool(query, corpus_store=corpus(), cfg=cfg, k=k)
        )

    def get_document(docid: str) -> dict[str, Any]:
        """Fetch one document's full text by id (capped at 20,000 characters)."""
        return _guard("get_document", lambda: get_document_tool(docid, corpus_store=corpus()))

    # The schemas' bounds come from cfg, so the annotations are set as objects: string
    # annotations (PEP 563) cannot name these local types.
    result_t = dict[str, Any]
    get_context.__annotations__ = {"query": query_t, "size": size_t, "filters": filters_t, "return": result_t}
    search_documents.__annotations__ = {"query": keywords_t, "k": k_t, "return": result_t}
    get_document.__annotations__ = {"docid": docid_t, "return": result_t}

    read_only = {"readOnlyHint": True, "openWorldHint": False}
    for fn in (get_context, search_documents, get_document):
        server.add_tool(fn, annotations=read_only)  # type: ignore[arg-type]

    @server.resource(
        SOURCE_DESCRIPTION_URI,
        name="source-description",
        description="What the knowledge base holds (the corpus's source-description KIs). Read first.",
        mime_type="text/markdown",
    )
    def source_description() -> str:
        return _guard("source-description", lambda: source_description_kis(kis()).to_text())

    return server


def run_mcp(
    server: MCPServer[Any],
    *,
    transport: Literal["stdio", "http"] = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
) -> None:
    """Serve ``server`` until interrupted.

    Args:
        server: from :func:`create_mcp_server`.
        transport: ``stdio`` or ``http`` (streamable HTTP at ``/mcp``).
        host: HTTP interface; non-loopback needs ``token``.
        port: HTTP port.
        token: bearer token (None: read ``KITUNE_API_TOKEN``; unset or empty: no auth).

    Raises:
        ConfigError: non-loopback ``host`` without a token.
    """
    if transport == "stdio":
        server.run("stdio")
        return
    token = token if token is not None else (os.environ.get(API_TOKEN_ENV) or None)
    check_bind(host, token)
    import anyio
    import uvicorn

    app: Any = server.streamable_http_app(max_request_body_size=MAX_BODY_BYTES, host=host)
    if token:
        app = BearerAuth(app, token)

    async def serve() -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="info")
        await uvicorn.Server(config).serve()

    anyio.run(serve)
