"""A scripted OpenAI-compatible HTTP server on 127.0.0.1 for tests and fault injection.

:class:`StubServer` answers ``POST /v1/chat/completions`` (any path ending in
``/chat/completions``) from a queue of :class:`Reply` objects, one per request, and records
every request it received. When the queue is empty it answers with ``default`` (a normal
reply unless told otherwise). It never reaches a network; benchmarks and reliability tests
reuse it to inject 401s, proxies, 429s, timeouts, empty choices and format rejections::

    with StubServer([Reply.rate_limited(retry_after_s=0.3), Reply.ok("hi")]) as stub:
        lm = build_lm(cfg_pointing_at(stub.base_url), "extract")
        lm("hello")
        assert len(stub.requests) == 2
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["RecordedRequest", "Reply", "StubServer"]

_PROXY_HTML = (
    "<!DOCTYPE html><html><head><title>Proxy Authentication Required</title></head>"
    "<body><h1>407 Proxy Authentication Required</h1><p>Corporate proxy: please log in.</p></body></html>"
)


def _completion(
    content: str | None,
    *,
    usage: tuple[int, int] | None,
    finish_reason: str = "stop",
    model: str = "stub-model",
    reasoning_content: str | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning_content is not None:
        message["reasoning_content"] = reasoning_content
    body: dict[str, Any] = {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    if usage is not None:
        body["usage"] = {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": usage[0] + usage[1],
        }
    return body


def _error(message: str, *, type_: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": code, "param": param}}


@dataclass(frozen=True)
class Reply:
    """One scripted answer. Build with the class methods rather than by hand."""

    status: int = 200
    """HTTP status code."""
    body: bytes = b""
    """Raw response body."""
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)
    """Response headers."""
    delay_s: float = 0.0
    """Seconds to wait before answering (interrupted when the server stops)."""
    label: str = "custom"
    """A name for the behaviour, for test messages."""

    @staticmethod
    def _json(status: int, data: Any, *, label: str, extra_headers: Iterable[tuple[str, str]] = ()) -> Reply:
        headers = (("Content-Type", "application/json"), *extra_headers)
        return Reply(status=status, body=json.dumps(data).encode(), headers=headers, label=label)

    @classmethod
    def ok(
        cls,
        content: str = "ok",
        *,
        usage: tuple[int, int] | None = (11, 7),
        finish_reason: str = "stop",
        model: str = "stub-model",
    ) -> Reply:
        """A normal completion; ``usage`` is ``(prompt_tokens, completion_tokens)`` or None to omit it."""
        data = _completion(content, usage=usage, finish_reason=finish_reason, model=model)
        return cls._json(200, data, label="ok" if usage is not None else "ok_no_usage")

    @classmethod
    def no_usage(cls, content: str = "ok") -> Reply:
        """A normal completion without a ``usage`` field."""
        return cls.ok(content, usage=None)

    @classmethod
    def truncated(cls, content: str = '{"answer": "Spring', *, usage: tuple[int, int] = (11, 7)) -> Reply:
        """Content cut off with ``finish_reason="length"``."""
        data = _completion(content, usage=usage, finish_reason="length")
        return cls._json(200, data, label="truncated")

    @classmethod
    def error(
        cls,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: Iterable[tuple[str, str]] = (),
    ) -> Reply:
        """An OpenAI-style error body with ``status``."""
        return cls._json(
            status,
            _error(message, type_=type_, code=code, param=param),
            label=f"http_{status}",
            extra_headers=headers,
        )

    @classmethod
    def unauthorized(cls) -> Reply:
        """401 with an invalid-key message."""
        return cls.error(
            401,
            "Incorrect API key provided: sk-****. You can find your API key at your provider.",
            type_="invalid_request_error",
            code="invalid_api_key",
        )

    @classmethod
    def proxy_page(cls, status: int = 407) -> Reply:
        """An HTML page from a proxy in the way (407 by default; pass 200 for a captive portal)."""
        return Reply(
            status=status,
            body=_PROXY_HTML.encode(),
            headers=(("Content-Type", "text/html"),),
            label=f"proxy_{status}",
        )

    @classmethod
    def rate_limited(cls, *, retry_after_s: float | None = None, body_hint: str | None = None) -> Reply:
        """429 with a ``Retry-After`` header and/or a body hint.

        ``retry_after_s`` sets the header; ``body_hint`` (e.g. ``"0.3s"`` or ``"300ms"``) appends
        ``"Please try again in <body_hint>."`` to the message.
        """
        message = (
            "Rate limit reached for model m-small on tokens per minute: limit 10000, used 9100, "
            "requested 2500."
        )
        if body_hint is not None:
            message += f" Please try again in {body_hint}."
        headers = [("Retry-After", f"{retry_after_s:g}")] if retry_after_s is not None else []
        return cls.error(429, message, type_="tokens", code="rate_limit_exceeded", headers=headers)

    @classmethod
    def server_error(cls, status: int = 500) -> Reply:
        """A 5xx error."""
        return cls.error(
            status, "The server had an error while processing your request.", type_="server_error"
        )

    @classmethod
    def slow(cls, delay_s: float, then: Reply | None = None) -> Reply:
        """Wait ``delay_s`` seconds, then answer with ``then`` (a normal reply by default)."""
        inner = then or cls.ok()
        return Reply(
            status=inner.status,
            body=inner.body,
            headers=inner.headers,
            delay_s=delay_s,
            label=f"slow_{delay_s:g}s",
        )

    @classmethod
    def empty_choices(cls, *, content_filter: bool = True) -> Reply:
        """HTTP 200 with ``choices: []`` and ``usage: null`` (Azure's content filter, case L1)."""
        data: dict[str, Any] = {
            "id": "",
            "object": "",
            "created": 0,
            "model": "",
            "choices": [],
            "usage": None,
        }
        if content_filter:
            data["prompt_filter_results"] = [
                {
                    "prompt_index": 0,
                    "content_filter_results": {"violence": {"filtered": True, "severity": "medium"}},
                }
            ]
        return cls._json(200, data, label="empty_choices")

    @classmethod
    def reasoning_only(
        cls, reasoning: str = "The answer is Springfield.", *, usage: tuple[int, int] | None = (11, 64)
    ) -> Reply:
        """Empty ``content`` with the text in ``reasoning_content`` (a reasoning model out of tokens).

        ``usage`` is ``(prompt_tokens, completion_tokens)``, or None to omit it.
        """
        data = _completion("", usage=usage, finish_reason="length", reasoning_content=reasoning)
        return cls._json(200, data, label="reasoning_only")

    @classmethod
    def context_overflow(cls) -> Reply:
        """400 saying the prompt exceeds the context window (OpenAI's wording)."""
        return cls.error(
            400,
            "This model's maximum context length is 8192 tokens. However, your messages "
            "resulted in 9000 tokens. Please reduce the length of the messages.",
            code="context_length_exceeded",
            param="messages",
        )

    @classmethod
    def reject_response_format(cls, status: int = 400) -> Reply:
        """400 (or 500, as llama.cpp does) rejecting an OpenAI-style json_schema ``response_format``."""
        return cls.error(
            status,
            "Invalid value for response_format.type: only json_object and text are supported.",
            type_="invalid_request_error",
            code="InvalidParameter",
            param="response_format.type",
        )


@dataclass(frozen=True)
class RecordedRequest:
    """One request the stub received."""

    method: str
    """``"POST"`` or ``"GET"``."""
    path: str
    """The request path, e.g. ``/v1/chat/completions``."""
    headers: dict[str, str]
    """Request headers (names lower-cased)."""
    body: dict[str, Any] = field(default_factory=dict)
    """The parsed JSON body ({} when absent or not JSON)."""
    received_at: float = 0.0
    """``time.monotonic()`` when the request arrived."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    """listen() backlog; the stdlib's 5 drops connection bursts (64 clients opening at once retry
    after a 1 s SYN timeout, which a throughput benchmark would measure as server latency)."""


class StubServer:
    """A threaded OpenAI-compatible server on ``127.0.0.1`` (a free port), scripted by a queue.

    Thread-safe: requests are answered concurrently, replies are popped in arrival order.

    Args:
        replies: the scripted replies, one per request, in order.
        default: the reply once the queue is empty (a normal reply with usage when None).
        responder: called with each chat request once the queue is empty; its reply wins over
            ``default`` (None: use ``default``). Lets a test answer from the request's content,
            e.g. per-document replies or seeded faults under concurrency. Runs in the server's
            handler threads, so it must be thread-safe.

    Attributes:
        base_url: ``http://127.0.0.1:<port>/v1`` (valid after :meth:`start`).
        requests: every request received, in arrival order.
    """

    def __init__(
        self,
        replies: Iterable[Reply] = (),
        *,
        default: Reply | None = None,
        responder: Callable[[RecordedRequest], Reply] | None = None,
    ) -> None:
        self._queue: deque[Reply] = deque(replies)
        self.default = default or Reply.ok()
        self.responder = responder
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.base_url = ""

    def push(self, *replies: Reply) -> None:
        """Append replies to the queue."""
        with self._lock:
            self._queue.extend(replies)

    def _next_reply(self, request: RecordedRequest | None = None) -> Reply:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        if self.responder is not None and request is not None:
            return self.responder(request)
        return self.default

    def _record(self, req: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(req)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        """The recorded ``/chat/completions`` requests."""
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def start(self) -> StubServer:
        """Bind a free port on 127.0.0.1 and serve in a daemon thread; returns self."""
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _read_body(self) -> dict[str, Any]:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    data = json.loads(raw) if raw else {}
                except ValueError:
                    data = {}
                return data if isinstance(data, dict) else {"_": data}

            def _send(self, reply: Reply) -> None:
                if reply.delay_s > 0 and stub._stopping.wait(reply.delay_s):
                    return
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers:
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                    pass

            def do_POST(self) -> None:
                body = self._read_body()
                request = RecordedRequest(
                    "POST",
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                    time.monotonic(),
                )
                stub._record(request)
                if not self.path.endswith("/chat/completions"):
                    self._send(Reply.error(404, f"stub serves /v1/chat/completions only, not {self.path}"))
                    return
                self._send(stub._next_reply(request))

            def do_GET(self) -> None:
                stub._record(
                    RecordedRequest(
                        "GET",
                        self.path,
                        {k.lower(): v for k, v in self.headers.items()},
                        {},
                        time.monotonic(),
                    )
                )
                if self.path.endswith("/models"):
                    self._send(
                        Reply._json(
                            200,
                            {"object": "list", "data": [{"id": "stub-model", "object": "model"}]},
                            label="models",
                        )
                    )
                else:
                    self._send(Reply.error(404, f"no such path {self.path}"))

        server = _Server(("127.0.0.1", 0), Handler)
        self._server = server
        self.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        self._thread = threading.Thread(target=server.serve_forever, name="kitune-openai-stub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; sleeping replies are interrupted. Idempotent."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
