"""The HTTP API: ``POST /api/_get_context`` over :func:`kitune.service.serving.context.get_context`.

Thin: validate the request, call the service, map errors to statuses. One exception → status
table (:data:`ERROR_STATUS`): ``ConfigError`` → 422, ``DocumentNotFoundError`` → 404,
``StoreUnavailableError`` → 503, any other error → 500 with a generic message. Error bodies are
``{"error": {"type": str, "message": str}}`` (plus ``details`` for request validation) and never
carry a stack trace or a secret.

What is served: the store and rewriter given to :func:`create_app` (``kitune serve`` passes
the production rewriter prompt and the production extractor's KI table, see
:func:`kitune.service.serving.prompts.production_setting`), named in ``GET /healthz`` under
``serving``. With a ``setting_source`` the app re-resolves them on the first request after a
``kitune prompts promote`` / ``rollback`` (the registry's production stamp changed; checked on
every request without a registry query) and otherwise at most every ``refresh_s`` seconds. With a
``request_log`` every request is recorded in the tracking store with the versions that answered it.

Other rules: the request body is capped (:data:`MAX_BODY_BYTES`, 413 beyond); the OpenAPI schema
is served at ``/openapi.json`` and documents every error status with the ``{"error": …}`` body;
``/docs`` is Swagger UI served from local assets (no CDN; a plain endpoint list when none are
installed); ``GET /healthz`` names the served prompt versions, the KI table and its active KI
count, and answers 503 (``"status": "empty"``) when that table holds no active KI.
``/api/proposals`` serves the review queue (:mod:`kitune.service.workflows.review`): list, show,
approve, reject (a reason is required), revert; an unknown id is 404, an action that does not fit
the proposal's status 409.
A rewrite that fell back is logged with its full reason; the response carries only its reason
code (never provider text). When a bearer token is configured (``KITUNE_API_TOKEN``), ``/api/*``
requires ``Authorization: Bearer <token>``; ``kitune serve`` refuses to bind a non-loopback host without one.
"""

from __future__ import annotations

import hmac
import html
import importlib.util
import ipaddress
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kitune.config import KituneConfig
from kitune.errors import (
    ConfigError,
    DocumentNotFoundError,
    KituneError,
    ProposalNotFoundError,
    ProposalStateError,
    StoreUnavailableError,
)
from kitune.programs.query_rewriter import QueryRewriter
from kitune.retrieval.base import Store
from kitune.schema import Filter
from kitune.service.serving.context import ContextResponse, get_context
from kitune.service.serving.setting import LiveSetting, ServedRequestLog, ServedSetting
from kitune.service.workflows.review import ReviewService, review_opener
from kitune.usage import TokenLedger

__all__ = [
    "API_TOKEN_ENV",
    "ERROR_STATUS",
    "MAX_BODY_BYTES",
    "create_app",
    "is_loopback_host",
]

logger = logging.getLogger(__name__)

API_TOKEN_ENV = "KITUNE_API_TOKEN"
"""Environment variable holding the optional bearer token."""

MAX_BODY_BYTES = 64 * 1024
"""Largest accepted request body, in bytes (a 2000-character query is at most 8 KiB of UTF-8)."""

MAX_QUERY_CHARS = 2000

ERROR_STATUS: tuple[tuple[type[Exception], int, str], ...] = (
    (ConfigError, 422, "config_error"),
    (DocumentNotFoundError, 404, "not_found"),
    (StoreUnavailableError, 503, "store_unavailable"),
    (ProposalNotFoundError, 404, "not_found"),
    (ProposalStateError, 409, "conflict"),
    (KituneError, 500, "internal_error"),
)
"""Exception class → (HTTP status, error type); the most specific class wins."""

_GENERIC_500 = "internal error while answering the request; see the server log"
_STORE_503 = "the KI store is unavailable: check that its backend is running and configured"


class ErrorDetail(BaseModel):
    """The ``error`` member of every error response."""

    type: str = Field(description="Error kind, e.g. validation_error, http_error, body_too_large, not_found.")
    message: str = Field(description="What went wrong and how to fix it; never a stack trace or a secret.")
    details: list[dict[str, Any]] | None = Field(
        default=None, description="validation_error only: one {loc, msg} per invalid field."
    )


class ErrorBody(BaseModel):
    """Body of every non-2xx response: ``{"error": {"type", "message", "details"?}}``."""

    error: ErrorDetail


_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or wrong bearer token (when KITUNE_API_TOKEN is set)."},
    413: {"model": ErrorBody, "description": "Request body larger than the cap (64 KiB by default)."},
    422: {"model": ErrorBody, "description": "Invalid request (details lists each field) or configuration."},
    503: {"model": ErrorBody, "description": "The KI store is unavailable."},
    500: {"model": ErrorBody, "description": "Internal error (details only in the server log)."},
}


def _swagger_assets() -> Path | None:
    """A local folder holding ``swagger-ui-bundle.js`` and ``swagger-ui.css``, or None.

    LiteLLM (a kitune dependency) ships them for its proxy; found without importing LiteLLM.
    """
    try:
        spec = importlib.util.find_spec("litellm")
    except (ImportError, ValueError):
        return None
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        folder = Path(root) / "proxy" / "swagger"
        if (folder / "swagger-ui-bundle.js").is_file() and (folder / "swagger-ui.css").is_file():
            return folder
    return None


def _endpoint_list_page(schema: dict[str, Any]) -> str:
    """A self-contained HTML page listing the schema's endpoints (no Swagger assets available)."""
    rows = []
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            codes = ", ".join(sorted(op.get("responses", {})))
            cells = (
                f"<code>{html.escape(method.upper())}</code>",
                f"<code>{html.escape(path)}</code>",
                html.escape(op.get("summary", "")),
                html.escape(codes),
            )
            rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    title = html.escape(str(schema.get("info", {}).get("title", "API")))
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title} API</title></head><body>"
        f"<h1>{title} API</h1><p>Swagger UI assets are not installed; the full schema is at "
        "<a href='/openapi.json'>/openapi.json</a>.</p>"
        "<table border='1' cellpadding='4'>"
        "<tr><th>method</th><th>path</th><th>summary</th><th>statuses</th></tr>"
        + "".join(rows)
        + "</table></body></html>"
    )


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (``127.0.0.0/8``, ``::1``)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _public_reason(resp: ContextResponse) -> ContextResponse:
    """Log a rewrite fallback in full; answer with its reason code only.

    The full reason can hold a provider's error text (a 401 body, the gateway URL); it goes to
    the server log (warning), and the response keeps only the code before the first colon
    (``lm_error``, ``no_json``, ``invalid_plan``, ``empty_plan``).
    """
    if not resp.rewrite_fell_back:
        return resp
    reason = resp.rewrite_reason or "unknown"
    logger.warning("query rewrite fell back to the plain plan: %s", reason)
    return resp.model_copy(update={"rewrite_reason": reason.split(":", 1)[0].strip() or "unknown"})


def _error(status: int, type_: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"type": type_, "message": message, **extra}})


class _BodyLimit:
    """ASGI middleware: reject request bodies over ``max_bytes`` with 413 (declared or streamed)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = _error(413, "body_too_large", f"request body exceeds {self.max_bytes} bytes")
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                if int(declared) > self.max_bytes:
                    await too_large(scope, receive, send)
                    return
            except ValueError:
                await _error(400, "bad_request", "invalid Content-Length header")(scope, receive, send)
                return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client went away
                return
            body = message.get("body", b"")
            total += len(body)
            if total > self.max_bytes:
                await too_large(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        payload = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": payload, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def create_app(
    cfg: KituneConfig,
    *,
    store: Store | None = None,
    rewriter: QueryRewriter | None = None,
    ledger: TokenLedger | None = None,
    api_token: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    versions: Mapping[str, str] | None = None,
    setting_source: Callable[[Mapping[str, str]], ServedSetting | None] | None = None,
    refresh_s: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
    review: ReviewService | None = None,
    request_log: ServedRequestLog | None = None,
) -> FastAPI:
    """Build the FastAPI app.

    Args:
        cfg: configuration; ``retrieval.max_size`` bounds the request's ``size``.
        store: the KI store; None creates one from ``cfg`` on the first request
            (``kitune.retrieval.create_store``).
        rewriter: the query rewriter with its LM set; None uses plain plans (no LM calls).
        ledger: token ledger the rewriter's LM records into.
        api_token: bearer token required on ``/api/*``; None reads ``KITUNE_API_TOKEN`` (unset or
            empty: no auth).
        max_body_bytes: request body cap in bytes (413 beyond).
        versions: what ``store``/``rewriter`` are (program → prompt version label, ``"store"`` →
            table); shown in ``GET /healthz`` under ``serving``.
        setting_source: called with the served ``versions`` at most every ``refresh_s`` seconds
            (on a request); returns a new :class:`~kitune.service.serving.setting.ServedSetting`
            when production changed, else None. A failing source keeps the current setting (logged).
        refresh_s: seconds between ``setting_source`` calls (> 0).
        clock: monotonic clock in seconds (tests).
        review: the review queue behind ``/api/proposals`` (None: ``open_review(cfg)`` on the
            first such request, logging to ``create_tracker(cfg)``).
        request_log: records every ``_get_context`` request in the tracking store with the
            prompt versions that answered it (None: not recorded).

    Returns:
        The app; routes: ``POST /api/_get_context``, ``GET /api/proposals``,
        ``GET /api/proposals/{id}``, ``POST /api/proposals/{id}/approve|reject|revert``,
        ``GET /healthz``, ``GET /openapi.json``.
    """
    token = api_token if api_token is not None else (os.environ.get(API_TOKEN_ENV) or None)
    max_size = cfg.retrieval.max_size
    default_size = min(cfg.retrieval.default_size, max_size)
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

    class ContextRequest(BaseModel):
        """Body of ``POST /api/_get_context``."""

        model_config = ConfigDict(extra="forbid")

        query: str = Field(
            min_length=1, max_length=MAX_QUERY_CHARS, strict=True, description="The question, 1–2000 chars."
        )
        size: int = Field(
            default=default_size, ge=1, le=max_size, strict=True, description=f"KIs wanted, 1–{max_size}."
        )
        execute: bool = Field(
            default=True, strict=True, description="False: return the compiled query without running it."
        )

        @field_validator("query")
        @classmethod
        def _not_blank(cls, v: str) -> str:
            if not v.strip():
                raise ValueError("query is blank: send the question text")
            return v

    app = FastAPI(
        title="kitune",
        summary="Knowledge Indicators for LLM agents: hybrid retrieval behind one context call.",
        version="1",
        docs_url=None,  # FastAPI's /docs and /redoc load their assets from a CDN: blank offline
        redoc_url=None,
    )
    app.add_middleware(_BodyLimit, max_bytes=max_body_bytes)
    bearer = HTTPBearer(auto_error=False, description=f"Required when {API_TOKEN_ENV} is set.")

    def check_token(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:  # noqa: B008
        if token is None:
            return
        given = creds.credentials if creds is not None else ""
        if not hmac.compare_digest(given.encode("utf-8"), token.encode("utf-8")):
            raise StarletteHTTPException(
                401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
            )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = [
            {"loc": [str(p) for p in err.get("loc", ())], "msg": str(err.get("msg", ""))}
            for err in exc.errors()
        ]
        summary = "; ".join(f"{'.'.join(d['loc'])}: {d['msg']}" for d in details)
        return _error(422, "validation_error", f"invalid request: {summary}", details=details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        resp = _error(exc.status_code, "http_error", str(exc.detail))
        if exc.headers:
            resp.headers.update(exc.headers)
        return resp

    @app.exception_handler(Exception)
    async def _any(request: Request, exc: Exception) -> JSONResponse:
        matches = ((code, name) for cls, code, name in ERROR_STATUS if isinstance(exc, cls))
        status, type_ = next(matches, (500, "internal_error"))
        if status == 500:
            logger.error("request %s %s failed", request.method, request.url.path, exc_info=exc)
            return _error(500, type_, _GENERIC_500)
        if status == 503:
            logger.warning("store unavailable: %s", exc)
            return _error(503, type_, _STORE_503)
        return _error(status, type_, str(exc))

    for cls, _, _ in ERROR_STATUS:  # route KituneErrors through the table before the 500 fallback
        app.add_exception_handler(cls, _any)

    def context_endpoint(body: Any) -> ContextResponse:
        with served.serve("http /api/_get_context", body.query) as (served_store, served_rewriter):
            resp = get_context(
                body.query,
                store=served_store,
                rewriter=served_rewriter,
                size=body.size,
                execute=body.execute,
                cfg=cfg,
                ledger=ledger,
            )
        return _public_reason(resp)

    # The request model is built here (its bounds come from cfg), so its annotation is set as an
    # object: string annotations (PEP 563) cannot name a class local to this function.
    context_endpoint.__annotations__ = {"body": ContextRequest, "return": ContextResponse}
    app.post(
        "/api/_get_context",
        response_model=ContextResponse,
        responses=_ERROR_RESPONSES,
        dependencies=[Depends(check_token)],
        summary="Retrieve KIs, facets and the compiled query for a question.",
    )(context_endpoint)

    _review_routes(app, cfg, review, check_token)

    assets = _swagger_assets()

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        if assets is None:
            return HTMLResponse(_endpoint_list_page(app.openapi()))
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title="kitune API",
            swagger_js_url="/docs-assets/swagger-ui-bundle.js",
            swagger_css_url="/docs-assets/swagger-ui.css",
            swagger_favicon_url="/docs-assets/favicon.png",
        )

    @app.get("/docs-assets/{name}", include_in_schema=False)
    def docs_asset(name: str) -> FileResponse:
        allowed = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon.png")
        if assets is None or name not in allowed or not (assets / name).is_file():
            raise StarletteHTTPException(404, f"no docs asset {name!r}")
        return FileResponse(assets / name)

    @app.get(
        "/healthz",
        summary="Served prompt versions, KI table and active KI count; 503 when nothing is served.",
        responses={503: {"description": "The served KI table holds no active KI, or the store is down."}},
    )
    def healthz() -> JSONResponse:
        try:
            store, _rewriter = served.current()
            n = store.count(Filter(statuses=("active",)))
        except KituneError as e:
            return JSONResponse({"status": "unavailable", "error": str(e)}, status_code=503)
        now = served.versions()
        body: dict[str, Any] = {"status": "ok" if n else "empty", "kis": n}
        if now:
            body["serving"] = now
            body["table"] = now.get("store", "")
        return JSONResponse(body, status_code=200 if n else 503)

    return app


class ReviewAction(BaseModel):
    """Body of ``POST /api/proposals/{id}/approve|reject|revert``."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(
        default="", max_length=2000, description="Why; required to reject (kept in the history)."
    )


def _review_routes(
    app: FastAPI, cfg: KituneConfig, review: ReviewService | None, check_token: Callable[..., None]
) -> None:
    """``/api/proposals``: the review queue over HTTP (same service as ``kitune review``)."""
    service = review_opener(cfg, review)

    deps = [Depends(check_token)]
    errors = {k: v for k, v in _ERROR_RESPONSES.items() if k != 413} | {
        404: {"model": ErrorBody, "description": "No proposal with this id."},
        409: {"model": ErrorBody, "description": "The action does not fit the proposal's status."},
    }
    status_t = Literal["pending", "applying", "approved", "rejected", "reverted"]
    kind_t = Literal["re_extract", "add_ki", "retire_ki", "rewriter_feedback"]

    def list_proposals(status: Any = None, kind: Any = None) -> dict[str, Any]:
        return {"proposals": [p.summary() for p in service().list(status=status, kind=kind)]}

    # local Literal types: the annotations are set as objects (PEP 563 strings cannot name them)
    list_proposals.__annotations__ = {
        "status": status_t | None,
        "kind": kind_t | None,
        "return": dict[str, Any],
    }
    app.get("/api/proposals", dependencies=deps, responses=errors, summary="List proposals, filing order.")(
        list_proposals
    )

    @app.get(
        "/api/proposals/{pid}",
        dependencies=deps,
        responses=errors,
        summary="One proposal: change, diff, evidence, effect, and its history.",
    )
    def show_proposal(pid: str) -> dict[str, Any]:
        p, events = service().show(pid)
        return {"proposal": p.to_dict(), "events": events}

    def act(action: str) -> Callable[[str, ReviewAction], dict[str, Any]]:
        def endpoint(pid: str, body: ReviewAction) -> dict[str, Any]:
            svc = service()
            if action == "approve":
                p = svc.approve(pid, actor="http", reason=body.reason)
            elif action == "reject":
                if not body.reason.strip():
                    raise RequestValidationError(
                        [
                            {
                                "loc": ("body", "reason"),
                                "msg": "a rejection needs a reason (kept in the history)",
                            }
                        ]
                    )
                p = svc.reject(pid, reason=body.reason, actor="http")
            else:
                p = svc.revert(pid, reason=body.reason, actor="http")
            return {"proposal": p.summary(), "reason": p.reason}

        endpoint.__annotations__ = {"pid": str, "body": ReviewAction, "return": dict[str, Any]}
        return endpoint

    for action, what in (
        ("approve", "Approve: apply the change (KI upsert or status, or a new production prompt version)."),
        ("reject", "Reject with a reason; the change is not proposed again."),
        ("revert", "Undo an approved proposal, softly (statuses and prompt versions, never a delete)."),
    ):
        app.post(f"/api/proposals/{{pid}}/{action}", dependencies=deps, responses=errors, summary=what)(
            act(action)
        )
