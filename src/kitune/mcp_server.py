"""``kitune mcp``: kitune's tools over the Model Context Protocol (the official ``mcp`` SDK).

Tools (JSON schemas generated from the signatures below; the tool bodies are
:mod:`kitune.service.serving.mcp`):

* ``get_context(query, size?, filters?)`` → KIs with tags, references, evidence doc ids,
  subtype, confidence and score, plus the aggregations (by tag, doc, entity);
* ``search_documents(query, k?)`` → raw corpus hits with snippets;
* ``get_document(docid)`` → one document's text (capped).

Every tool refuses arguments it does not take: its input schema has ``additionalProperties:
false`` and a call with an unknown argument (``{"query": …, "sise": 3}``) is a tool error naming
it and the arguments the tool takes, never silently ignored.

Resource: ``kitune://source-description`` (Markdown), the corpus's source-description KIs, for
an agent to read first.

What is served follows production like ``kitune serve``: with a ``setting_source`` (``kitune
mcp`` passes the production rewriter prompt and the production extractor's KI table) the server
re-resolves them on the first call after a ``kitune prompts promote`` / ``rollback`` (the
registry's production stamp changed) and otherwise at most every ``refresh_s`` seconds, so a
promotion changes what a running ``kitune mcp`` answers with from its next call, no restart. With
a ``request_log`` every ``get_context`` call is recorded in the tracking store with its versions.

Transports: ``stdio`` (the client starts ``kitune mcp`` as a subprocess; stdout carries only
MCP messages, see :mod:`kitune.cli.mcp_cmds`) and ``http``
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
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import anyio
from pydantic import Field, ValidationError

import kitune.retrieval
from kitune.config import KituneConfig
from kitune.errors import ConfigError, DocumentNotFoundError, KituneError, StoreUnavailableError
from kitune.server import API_TOKEN_ENV, MAX_BODY_BYTES, is_loopback_host
from kitune.service.serving.mcp import (
    MAX_QUERY_CHARS,
    ContextFilters,
    context_tool,
    get_document_tool,
    review_action_tool,
    review_list_tool,
    review_show_tool,
    search_documents_tool,
    source_description_kis,
)
from kitune.service.serving.setting import LiveSetting, ServedRequestLog, ServedSetting
from kitune.service.workflows.review import ReviewService, review_opener

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.tools import Tool
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
    except ValueError as e:  # argument checks in kitune.service.serving.mcp
        logger.info("%s: rejected arguments (%s)", tool, type(e).__name__)
        raise ToolError(f"invalid argument: {e}") from e
    except KituneError as e:
        logger.error("%s failed: %s", tool, type(e).__name__, exc_info=e)
        raise ToolError(f"{tool} failed ({type(e).__name__}); see the server log") from e


def _strict_tools(fns: Sequence[Callable[..., Any]], annotations: Mapping[str, Any]) -> list[Tool]:
    """SDK tools for ``fns`` that refuse unknown arguments.

    The SDK's argument model ignores keys it does not know; here the input schema says
    ``additionalProperties: false`` and a call naming any other key is a ``ToolError``: ``Error
    executing tool get_context: unknown argument(s) ['sise']: get_context takes query, size,
    filters``. Nested objects (``filters``) are refused by their own models.
    """
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.server.mcpserver.tools import Tool

    class StrictTool(Tool):
        async def run(self, arguments: dict[str, Any], context: Any, convert_result: bool = False) -> Any:
            known = list(self.parameters.get("properties", {}))
            unknown = sorted(set(arguments) - set(known))
            if unknown:
                raise ToolError(
                    f"Error executing tool {self.name}: unknown argument(s) {unknown}: {self.name} takes "
                    f"{', '.join(known)}"
                )
            return await super().run(arguments, context, convert_result)

    tools: list[Tool] = []
    for fn in fns:
        tool = StrictTool.from_function(fn, annotations=dict(annotations))  # type: ignore[arg-type]
        tool.parameters["additionalProperties"] = False
        tools.append(tool)
    return tools


def create_mcp_server(
    cfg: KituneConfig,
    *,
    store: Store | None = None,
    corpus_store: CorpusStore | None = None,
    rewriter: QueryRewriter | None = None,
    ledger: TokenLedger | None = None,
    versions: Mapping[str, str] | None = None,
    setting_source: Callable[[Mapping[str, str]], ServedSetting | None] | None = None,
    refresh_s: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
    review: ReviewService | None = None,
    request_log: ServedRequestLog | None = None,
) -> MCPServer[Any]:
    """Build the MCP server with kitune's three tools and the source-description resource.

    Args:
        cfg: configuration; ``retrieval.max_size`` bounds ``size``, ``retrieval.search_hits`` is
            ``k``'s default.
        store: the KI store (None: ``create_store(cfg)`` on first use).
        corpus_store: the document store (None: ``create_corpus_store(cfg)`` on first use).
        rewriter: the query rewriter with its LM (None: plain plans, no LLM calls).
        ledger: token ledger of the rewrites.
        versions: what ``store``/``rewriter`` are (program → prompt version label, ``"store"`` →
            table), handed to ``setting_source``.
        setting_source: called with the served ``versions`` at most every ``refresh_s`` seconds
            (on a tool call or resource read); returns a new ``ServedSetting`` when production
            changed, else None (None: what was given is served until exit).
        refresh_s: seconds between ``setting_source`` calls (> 0).
        clock: monotonic clock in seconds (tests).
        review: the review queue behind the review tools, which are registered only when
            ``review.mcp_tools`` is true (None: ``open_review(cfg)`` on first use).
        request_log: records every ``get_context`` call in the tracking store with the prompt
            versions that answered it (None: not recorded).

    Returns:
        An ``mcp.server.mcpserver.MCPServer``; run it with :func:`run_mcp` or its own ``run``.

    Raises:
        ValueError: ``refresh_s <= 0``.
    """
    from mcp.server.mcpserver import MCPServer

    if refresh_s <= 0:
        raise ValueError(f"refresh_s must be > 0, got {refresh_s}")
    served = LiveSetting(
        cfg,
        store=store,
        rewriter=rewriter,
        versions=versions,
        source=setting_source,
        refresh_s=refresh_s,
        clock=clock,
        request_log=request_log,
    )
    lock = threading.Lock()
    held: dict[str, Any] = {}
    if corpus_store is not None:
        held["corpus"] = corpus_store

    def kis() -> Store:
        return served.current()[0]

    def corpus() -> CorpusStore:
        with lock:
            if "corpus" not in held:
                held["corpus"] = kitune.retrieval.create_corpus_store(cfg)
            return held["corpus"]  # type: ignore[no-any-return]

    max_size = cfg.retrieval.max_size

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

        def run() -> dict[str, Any]:
            with served.serve("mcp get_context", query) as (store, rewriter):
                return context_tool(
                    query, store=store, cfg=cfg, size=size, filters=filters, rewriter=rewriter, ledger=ledger
                )

        return _guard("get_context", run)

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
    tools = _strict_tools((get_context, search_documents, get_document), read_only)  # every tool goes here
    if cfg.review.mcp_tools:
        tools += _review_tools(cfg, review)
    server: MCPServer[Any] = MCPServer("kitune", instructions=_INSTRUCTIONS, version="1", tools=tools)

    @server.resource(
        SOURCE_DESCRIPTION_URI,
        name="source-description",
        description="What the knowledge base holds (the corpus's source-description KIs). Read first.",
        mime_type="text/markdown",
    )
    def source_description() -> str:
        return _guard("source-description", lambda: source_description_kis(kis()).to_text())

    return server


def _review_tools(cfg: KituneConfig, review: ReviewService | None) -> list[Tool]:
    """The review queue as strict MCP tools (``review.mcp_tools``): list, show, approve, reject, revert."""
    service = review_opener(cfg, review)

    id_t = Annotated[
        str, Field(pattern=r"^p-[0-9a-f]{12}$", description="A proposal id from list_proposals.")
    ]
    reason_t = Annotated[str, Field(max_length=2000, description="Why (kept in the history).")]
    status_t = Annotated[
        Literal["pending", "applying", "approved", "rejected", "reverted"] | None,
        Field(description="Only proposals with this status."),
    ]
    kind_t = Annotated[
        Literal["re_extract", "add_ki", "retire_ki", "rewriter_feedback"] | None,
        Field(description="Only proposals of this kind."),
    ]

    def list_proposals(status: str | None = None, kind: str | None = None) -> dict[str, Any]:
        """List the proposals made from failure signals (filing order), with status and measured effect."""
        return _guard("list_proposals", lambda: review_list_tool(service(), status=status, kind=kind))

    def show_proposal(proposal_id: str) -> dict[str, Any]:
        """One proposal: its change and diff, the evidence (traces, signals, steps), effect and history."""
        return _guard("show_proposal", lambda: review_show_tool(service(), proposal_id))

    def approve_proposal(proposal_id: str, reason: str = "") -> dict[str, Any]:
        """Approve a pending proposal: its change is applied to the KI store or the prompt registry."""
        return _guard(
            "approve_proposal", lambda: review_action_tool(service(), "approve", proposal_id, reason=reason)
        )

    def reject_proposal(proposal_id: str, reason: str) -> dict[str, Any]:
        """Reject a pending proposal with a reason; the same change is not proposed again."""
        return _guard(
            "reject_proposal", lambda: review_action_tool(service(), "reject", proposal_id, reason=reason)
        )

    def revert_proposal(proposal_id: str, reason: str = "") -> dict[str, Any]:
        """Undo an approved proposal softly (statuses and prompt versions; nothing is deleted)."""
        return _guard(
            "revert_proposal", lambda: review_action_tool(service(), "revert", proposal_id, reason=reason)
        )

    result_t = dict[str, Any]
    list_proposals.__annotations__ = {"status": status_t, "kind": kind_t, "return": result_t}
    show_proposal.__annotations__ = {"proposal_id": id_t, "return": result_t}
    for fn in (approve_proposal, revert_proposal):
        fn.__annotations__ = {"proposal_id": id_t, "reason": reason_t, "return": result_t}
    reject_proposal.__annotations__ = {"proposal_id": id_t, "reason": reason_t, "return": result_t}
    reads = {"readOnlyHint": True, "openWorldHint": False}
    writes = {
        "readOnlyHint": False,
        "destructiveHint": False,
        "idempotentHint": False,
        "openWorldHint": False,
    }
    return [
        *_strict_tools((list_proposals, show_proposal), reads),
        *_strict_tools((approve_proposal, reject_proposal, revert_proposal), writes),
    ]


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
    import uvicorn

    app: Any = server.streamable_http_app(max_request_body_size=MAX_BODY_BYTES, host=host)
    if token:
        app = BearerAuth(app, token)

    async def serve() -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="info")
        await uvicorn.Server(config).serve()

    anyio.run(serve)
