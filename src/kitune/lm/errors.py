"""Error classification: a LiteLLM/OpenAI-client exception → a :mod:`kitune.errors` type.

401/403 → :class:`~kitune.errors.LMAuthError`, proxy or refused connection →
:class:`~kitune.errors.LMConnectionError`, timeout → :class:`~kitune.errors.LMTimeoutError`,
429 → :class:`~kitune.errors.LMRateLimitError` (with the wait :func:`parse_retry_after` reads),
context overflow → :class:`~kitune.errors.LMContextWindowError`, a rejected ``response_format``
→ :class:`~kitune.errors.ResponseFormatError`. No I/O.
"""

from __future__ import annotations

import email.utils
import re
import time

import httpx

from kitune.errors import (
    LMAuthError,
    LMConnectionError,
    LMContextWindowError,
    LMError,
    LMRateLimitError,
    LMTimeoutError,
    ResponseFormatError,
)
from kitune.lm.roles import ResolvedLM

__all__ = ["classify_error", "parse_retry_after"]

_RETRY_HINT = re.compile(
    r"try again in\s+(?:(\d+(?:\.\d+)?)m(?!s))?\s*(\d+(?:\.\d+)?)\s*(ms|s)\b", re.IGNORECASE
)
_FORMAT_WORDS = ("response_format", "json_schema", "response format")
_HTML_MARKERS = ("<!doctype html", "<html")


def parse_retry_after(exc: BaseException) -> float | None:
    """The wait a 429 asks for, in seconds, or None when it gives no hint.

    The ``Retry-After`` header wins (seconds or an HTTP date); else a ``"try again in 4.2s"`` /
    ``"300ms"`` / ``"1m30s"`` hint in the message.
    """
    for headers in (
        getattr(getattr(exc, "response", None), "headers", None),
        getattr(exc, "litellm_response_headers", None),
    ):
        if not headers:
            continue
        try:
            raw = headers.get("retry-after") or headers.get("Retry-After")
        except Exception:  # some header containers are not mappings
            raw = None
        if raw:
            try:
                return max(0.0, float(raw))
            except ValueError:
                try:
                    when = email.utils.parsedate_to_datetime(str(raw))
                except (TypeError, ValueError):  # neither seconds nor an HTTP date: ignore it
                    continue
                return max(0.0, when.timestamp() - time.time())
    match = _RETRY_HINT.search(str(exc))
    if match:
        minutes = float(match.group(1) or 0)
        amount = float(match.group(2))
        return minutes * 60 + (amount / 1000 if match.group(3).lower() == "ms" else amount)
    return None


def _status(exc: BaseException) -> int | None:
    code = getattr(exc, "status_code", None)
    return code if isinstance(code, int) else None


def _is_connection_failure(exc: BaseException) -> bool:
    """True when the chain holds a refused/dropped connection (LiteLLM reports some as a 500)."""
    import openai

    seen: set[int] = set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        if isinstance(node, (ConnectionError, httpx.ConnectError, httpx.RemoteProtocolError)):
            return True
        if isinstance(node, openai.APIConnectionError) and not isinstance(node, openai.APITimeoutError):
            return True
        node = node.__cause__ or node.__context__
    return "connection error" in str(exc).lower()


def classify_error(exc: BaseException, resolved: ResolvedLM, *, format_sent: bool = False) -> LMError:
    """Map a LiteLLM/OpenAI-client exception to a :mod:`kitune.errors` type (no I/O).

    Args:
        exc: what LiteLLM raised.
        resolved: the LM that was called (for model, base URL and key env var in messages).
        format_sent: whether the request carried ``response_format`` (a 400/500 naming it is
            then a :class:`ResponseFormatError`).

    Returns:
        An :class:`LMError` subclass with ``retryable`` set: True for timeouts, 429, 5xx and
        dropped connections; False for auth, proxies, format rejections and bad requests.
    """
    import litellm.exceptions as lx

    model, base = resolved.model, resolved.api_base
    text = str(exc)
    low = text.lower()
    status = _status(exc)
    if isinstance(exc, lx.ContextWindowExceededError):
        return LMContextWindowError(
            f"the prompt does not fit {model}'s context window: {text}", model=model, api_base=base
        )
    if format_sent and (
        isinstance(exc, lx.UnsupportedParamsError)
        or (status in (400, 422, 500) and any(w in low for w in _FORMAT_WORDS))
    ):
        return ResponseFormatError(
            f"{model} at {resolved.where} rejected response_format: {text}", model=model, api_base=base
        )
    if isinstance(exc, (lx.AuthenticationError, lx.PermissionDeniedError)) or status in (401, 403):
        key_hint = (
            f"the key in ${resolved.key_env} ({resolved.masked_key})"
            if resolved.key_env
            else "no key env var is configured (set lm.gateway.api_key_env or lm.<role>.api_key_env)"
        )
        return LMAuthError(
            f"HTTP {status or 401} from {resolved.where} for model {model}: {key_hint} was rejected. "
            f"Check the key and that {resolved.where} is the host you meant. Not retried.",
            model=model,
            api_base=base,
            retryable=False,
        )
    if status == 407 or any(m in low for m in _HTML_MARKERS):
        return LMConnectionError(
            f"a proxy answered instead of the model server at {resolved.where} (HTTP {status}, an HTML "
            f"page or 407 Proxy Authentication Required) for {model}: set NO_PROXY=127.0.0.1,localhost "
            "or configure the proxy credentials (HTTPS_PROXY).",
            model=model,
            api_base=base,
            retryable=False,
        )
    if isinstance(exc, lx.Timeout) or status == 408:
        where_still = (
            "the embedded server stopped the abandoned generation when the connection closed"
            if resolved.is_local
            else "a gateway or provider may still be generating the abandoned request (it does not stop when "
            "kitune gives up; a retry can queue behind it)"
        )
        return LMTimeoutError(
            f"{model} at {resolved.where} did not answer within timeout_s={resolved.timeout_s:g} "
            f"(lm.{resolved.role}.timeout_s); raise it or check the server; {where_still}.",
            timeout_s=resolved.timeout_s,
            model=model,
            api_base=base,
        )
    if isinstance(exc, lx.RateLimitError) or status == 429:
        return LMRateLimitError(
            f"rate limited by {resolved.where} for {model}: {text}",
            retry_after_s=parse_retry_after(exc),
            model=model,
            api_base=base,
        )
    if isinstance(exc, lx.APIConnectionError) or (status in (None, 500) and _is_connection_failure(exc)):
        return LMConnectionError(
            f"cannot reach {resolved.where} for {model}: {text}. Is the server running "
            "and the base URL right?",
            model=model,
            api_base=base,
            retryable=True,
        )
    if status is not None and status >= 500:
        return LMError(
            f"server error {status} from {resolved.where} for {model}: {text}",
            model=model,
            api_base=base,
            retryable=True,
        )
    return LMError(
        f"{model} at {resolved.where} failed ({type(exc).__name__}): {text}",
        model=model,
        api_base=base,
        retryable=False,
    )
