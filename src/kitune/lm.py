"""The LM layer: the ONLY module that builds ``dspy.LM`` objects and names LiteLLM model strings.

Flow: :func:`resolve_role` turns the config of one role into a :class:`ResolvedLM` (model string,
base URL, key) and validates it before any network call; :func:`build_lm` wraps that in a
:class:`KituneLM`, a ``dspy.LM`` whose ``forward`` owns the whole call:

* the configured ``timeout_s`` is passed to LiteLLM for real, and LiteLLM's / the OpenAI
  client's own retries are 0, so kitune's bounded retries are the only ones in force;
* failures are classified into :mod:`kitune.errors` (401/403 → :class:`LMAuthError`, proxy or
  refused connection → :class:`LMConnectionError`, timeout → :class:`LMTimeoutError`, 429 after
  retries → :class:`LMRateLimitError`, empty ``choices`` → :class:`EmptyCompletionError`,
  context overflow → :class:`LMContextWindowError`);
* 429 waits honour ``Retry-After``, then a "try again in 4.2s" hint in the body, then jittered
  exponential backoff (case L5);
* ``response_format`` follows a capability ladder per (model, base URL): json_schema →
  json_object → prompt-only JSON; a rejection downgrades exactly once per rung, is remembered
  and counted in :attr:`KituneLM.fallback_counts` (case L4);
* every attempt is recorded in the :class:`~kitune.usage.TokenLedger` under (role, stage),
  failed ones included; missing usage is estimated; cache hits keep their original usage with
  ``cache_hit=True`` (case D1);
* the response cache key covers every request parameter (temperature, max_tokens,
  response_format, rollout_id …) and :meth:`KituneLM.call_uncached` bypasses it (case D2).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import email.utils
import json
import logging
import os
import random
import re
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import dspy
from dspy.adapters.json_adapter import _get_structured_outputs_response_format

from kitune.chat import ChatMessage, ChatResponse, ToolCall, ToolMode
from kitune.config import KituneConfig, LMRoleConfig, Role
from kitune.errors import (
    ConfigError,
    EmptyCompletionError,
    LMAuthError,
    LMConnectionError,
    LMContextWindowError,
    LMError,
    LMRateLimitError,
    LMTimeoutError,
    ResponseFormatError,
)
from kitune.recording import CallRecorder, get_recorder, request_hash
from kitune.recording import capture as recording_capture
from kitune.recording import rebuild_error as rebuild_recorded_error
from kitune.usage import CallRecord, TokenLedger, current_stage, estimate_tokens

__all__ = [
    "FORMAT_LEVELS",
    "CallOutcome",
    "KituneLM",
    "LiteLLMChatModel",
    "LocalJSONAdapter",
    "ResolvedLM",
    "adapter_for",
    "build_lm",
    "classify_error",
    "default_adapter",
    "finish_reason_of",
    "parse_retry_after",
    "reset_format_memory",
    "resolve_role",
    "track_calls",
]

logger = logging.getLogger(__name__)

# KituneLM overrides forward()/aforward() to own timeouts, retries and the ledger; dspy 3.4 warns
# on every such call that the interface goes away in 3.5. Silence exactly that message (the
# migration to a dspy engine is tracked for the dspy 3.5 upgrade).
warnings.filterwarnings(
    "ignore", message="Implementing custom LMs through BaseLM.forward", category=DeprecationWarning
)

FORMAT_LEVELS: tuple[str, ...] = ("json_schema", "json_object", "text")
"""The response_format ladder, strongest first; ``text`` means prompt-only JSON."""

# Model prefixes that already mean "an OpenAI-compatible endpoint at api_base"; any other model
# string sent through a gateway is the gateway's own model name and gets ``openai/`` in front.
_GATEWAY_PREFIXES = (
    "openai/",
    "litellm_proxy/",
    "hosted_vllm/",
    "openrouter/",
    "azure/",
    "openai_like/",
    "ollama/",
    "ollama_chat/",
    "lm_studio/",
    "llamafile/",
)
_NO_KEY_PLACEHOLDER = "sk-no-key"
_LOCAL_KEY = "sk-local"
_RETRY_HINT = re.compile(
    r"try again in\s+(?:(\d+(?:\.\d+)?)m(?!s))?\s*(\d+(?:\.\d+)?)\s*(ms|s)\b", re.IGNORECASE
)
_FORMAT_WORDS = ("response_format", "json_schema", "response format")
_HTML_MARKERS = ("<!doctype html", "<html")

# Capability memory shared by every KituneLM: (model, api_base) -> index into FORMAT_LEVELS.
_FORMAT_LEVEL: dict[tuple[str, str | None], int] = {}
_FORMAT_LOCK = threading.Lock()


def reset_format_memory() -> None:
    """Forget every remembered response_format downgrade (tests; after a server upgrade)."""
    with _FORMAT_LOCK:
        _FORMAT_LEVEL.clear()


@dataclass(frozen=True)
class ResolvedLM:
    """One role's LM after config and environment are resolved (no network involved).

    ``api_key`` is never shown by ``repr``/``str``; use :attr:`masked_key` in messages.
    """

    role: str
    """The role this was resolved for (extract, rewrite, agent, judge, reflection)."""
    model: str
    """LiteLLM model string, e.g. ``openai/gpt-4o-mini``."""
    api_base: str | None
    """Base URL the calls go to; None means the provider's default host (no gateway set)."""
    api_key: str | None = field(repr=False)
    """The key value (secret), or None to let LiteLLM read the provider's own env var."""
    key_env: str | None
    """Name of the env var the key came from (for error messages), or None."""
    base_env: str | None
    """Name of the env var the base URL came from, or None."""
    is_local: bool
    """True for the embedded llama.cpp model (started lazily by :func:`build_lm`)."""
    temperature: float
    """Sampling temperature, 0.0–2.0."""
    max_tokens: int
    """Max output tokens per call."""
    timeout_s: float
    """Per-call timeout in seconds, enforced."""
    num_retries: int
    """Bounded retries for 429, 5xx, timeouts and dropped connections."""

    @property
    def masked_key(self) -> str:
        """``'…abcd'`` (last 4 characters), ``'****'`` for short keys, ``'<none>'`` when unset."""
        if not self.api_key:
            return "<none>"
        return f"…{self.api_key[-4:]}" if len(self.api_key) > 8 else "****"

    @property
    def where(self) -> str:
        """The base URL for messages, or ``'the provider default host'``."""
        return self.api_base or "the provider default host"


def _env_value(var: str, setting: str, what: str) -> str:
    value = os.environ.get(var)
    if not value:
        raise ConfigError(
            f"{var} is not set: {setting} names it as the {what}. Export {var} (e.g. `export {var}=...`) "
            f"or remove {setting} from the config; kitune never falls back to a provider default host."
        )
    return value


def _route_through_gateway(model: str) -> str:
    return model if model.startswith(_GATEWAY_PREFIXES) else f"openai/{model}"


def _role_settings(rc: LMRoleConfig, role: Role) -> dict[str, Any]:
    return {
        "role": role,
        "temperature": rc.temperature,
        "max_tokens": rc.max_tokens,
        "timeout_s": rc.timeout_s,
        "num_retries": rc.num_retries,
    }


def resolve_role(cfg: KituneConfig, role: Role) -> ResolvedLM:
    """Resolve ``role``'s model, base URL and key from the config and the environment.

    Precedence: the role's ``model`` → ``lm.gateway.default_model`` → the embedded local model.
    The role's ``api_base_env``/``api_key_env`` override the gateway's. When a base URL is set,
    the model goes to it as an OpenAI-compatible endpoint: model strings that already start
    with an OpenAI-compatible prefix (``openai/``, ``litellm_proxy/``, ``hosted_vllm/``,
    ``openrouter/``, ``azure/`` …) are kept, any other name (``gpt-4o-mini``,
    ``anthropic/claude-3-5``) is the gateway's model name and becomes ``openai/<name>``.

    Args:
        cfg: the loaded config.
        role: one of :data:`kitune.config.ROLES`.

    Returns:
        The :class:`ResolvedLM`; for the local model ``model`` and ``api_base`` are
        placeholders that :func:`build_lm` fills in once the server is up.

    Raises:
        ConfigError: an env var named by the config is unset or empty (case L3): the message
            starts with ``"<VAR> is not set"`` and names the setting.
    """
    rc = cfg.lm.role(role)
    gw = cfg.lm.gateway
    base_env = rc.api_base_env or gw.base_url_env
    key_env = rc.api_key_env or gw.api_key_env
    base_setting = f"lm.{role}.api_base_env" if rc.api_base_env else "lm.gateway.base_url_env"
    key_setting = f"lm.{role}.api_key_env" if rc.api_key_env else "lm.gateway.api_key_env"
    api_base = _env_value(base_env, base_setting, "base URL").rstrip("/") if base_env else None
    api_key = _env_value(key_env, key_setting, "API key") if key_env else None
    model = rc.model or gw.default_model
    if model is None:
        return ResolvedLM(
            model=f"openai/{cfg.lm.local.model}",
            api_base=None,
            api_key=_LOCAL_KEY,
            key_env=None,
            base_env=None,
            is_local=True,
            **_role_settings(rc, role),
        )
    if api_base is not None:
        model = _route_through_gateway(model)
        api_key = api_key or _NO_KEY_PLACEHOLDER
    return ResolvedLM(
        model=model,
        api_base=api_base,
        api_key=api_key,
        key_env=key_env,
        base_env=base_env,
        is_local=False,
        **_role_settings(rc, role),
    )


# ---------------------------------------------------------------------------------------------
# Error classification


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
    import httpx
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
        return LMTimeoutError(
            f"{model} at {resolved.where} did not answer within timeout_s={resolved.timeout_s:g} "
            f"(lm.{resolved.role}.timeout_s); raise it or check the server.",
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


# ---------------------------------------------------------------------------------------------
# response_format ladder


def _format_level(rf: Any) -> int | None:
    if rf is None:
        return None
    if isinstance(rf, dict):
        kind = rf.get("type")
        return {"json_schema": 0, "json_object": 1, "text": 2}.get(kind) if isinstance(kind, str) else None
    return 0  # a pydantic model class: LiteLLM sends it as json_schema


def _normalise_format(rf: Any) -> Any:
    if rf is None or isinstance(rf, dict):
        return rf
    import litellm.utils

    return litellm.utils.type_to_response_format_param(rf)  # type: ignore[attr-defined]


def _schema_of(rf: dict[str, Any]) -> dict[str, Any] | None:
    if rf.get("type") == "json_schema":
        inner = rf.get("json_schema") or {}
        schema = inner.get("schema")
        return schema if isinstance(schema, dict) else None
    schema = rf.get("schema")
    return schema if isinstance(schema, dict) else None


def _apply_level(rf: dict[str, Any] | None, level: int, *, keep_schema: bool) -> dict[str, Any] | None:
    if rf is None:
        return None
    sent = _format_level(rf)
    if sent is None or sent >= level:
        return rf
    if level >= 2:
        return None
    schema = _schema_of(rf)
    return {"type": "json_object", "schema": schema} if keep_schema and schema else {"type": "json_object"}


# ---------------------------------------------------------------------------------------------
# KituneLM


def _messages_text(messages: Sequence[dict[str, Any]]) -> str:
    parts: list[str] = []
    for m in messages:
        content = m.get("content")
        parts.append(content if isinstance(content, str) else json.dumps(content, default=str))
    return "\n".join(parts)


def _content_of(response: Any) -> str:
    try:
        return response.choices[0].message.content or ""
    except (AttributeError, IndexError, TypeError):
        return ""


# ---------------------------------------------------------------------------------------------
# finish_reason of every call


@dataclass(frozen=True)
class CallOutcome:
    """How one :class:`KituneLM` call ended, as seen by :func:`track_calls`."""

    finish_reason: str | None
    """``"stop"``, ``"length"`` (cut at ``max_tokens``), ``"tool_calls"`` …; None when not given."""
    content: str
    """The raw text of the first choice (what an adapter parsed, before any parsing)."""


_CALL_SINKS: contextvars.ContextVar[tuple[list[CallOutcome], ...]] = contextvars.ContextVar(
    "kitune_call_sinks", default=()
)


@contextlib.contextmanager
def track_calls() -> Iterator[list[CallOutcome]]:
    """Collect how every :class:`KituneLM` call made inside the block ended.

    Yields a list that gets one :class:`CallOutcome` per completed call (cache hits included),
    in call order, so a caller can read ``finish_reason`` on every call and see the raw reply
    even when an adapter rewrote it in its error. Blocks nest; worker threads started with a
    copy of the context report into the same list. Calls through other ``dspy.LM`` classes are
    not seen.
    """
    sink: list[CallOutcome] = []
    token = _CALL_SINKS.set((*_CALL_SINKS.get(), sink))
    try:
        yield sink
    finally:
        _CALL_SINKS.reset(token)


def finish_reason_of(response: Any) -> str | None:
    """The first choice's ``finish_reason`` of a LiteLLM/OpenAI response (None when absent)."""
    try:
        reason = response.choices[0].finish_reason
    except (AttributeError, IndexError, TypeError, KeyError):
        try:
            reason = response["choices"][0]["finish_reason"]
        except (IndexError, TypeError, KeyError):
            return None
    return str(reason) if reason is not None else None


def _note_finish(response: Any) -> None:
    sinks = _CALL_SINKS.get()
    if sinks:
        outcome = CallOutcome(finish_reason_of(response), _content_of(response))
        for sink in sinks:
            sink.append(outcome)


class KituneLM(dspy.LM):  # type: ignore[misc]
    """A ``dspy.LM`` that owns timeouts, retries, errors, the format ladder, cache and ledger.

    Build it with :func:`build_lm`.

    Thread-safe for concurrent calls (the ledger and the capability memory are locked).

    Attributes:
        resolved: the :class:`ResolvedLM` it calls.
        role: the ledger role.
        ledger: the :class:`TokenLedger` every attempt is recorded in (None: not recorded).
        fallback_counts: ``{"json_schema->json_object": n, ...}`` downgrades done by this LM.
        backoff_base_s: first backoff step in seconds (doubles per retry, jittered ×0.5–1.0).
        max_wait_s: cap on any single retry wait, in seconds.
    """

    def __init__(
        self,
        resolved: ResolvedLM,
        *,
        ledger: TokenLedger | None = None,
        cache: bool = False,
        backoff_base_s: float = 1.0,
        max_wait_s: float = 60.0,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.resolved = resolved
        self.role = resolved.role
        self.ledger = ledger
        self.fallback_counts: dict[str, int] = {}
        self.backoff_base_s = backoff_base_s
        self.max_wait_s = max_wait_s
        self.recorder: CallRecorder | None = None
        """Records or replays every call (``--record``/``--replay``; set by :func:`build_lm`)."""
        self.model_identity = resolved.model
        """The model as configured (before the local server's alias): part of the recording hash."""
        self._rng = random.Random(seed)
        self._counts_lock = threading.Lock()
        super().__init__(
            model=resolved.model,
            temperature=resolved.temperature,
            max_tokens=resolved.max_tokens,
            cache=cache,
            num_retries=0,
            **kwargs,
        )
        if resolved.is_local:
            with _FORMAT_LOCK:  # llama.cpp's server rejects OpenAI-style json_schema (HTTP 500)
                _FORMAT_LEVEL.setdefault(self._capability_key, 1)

    # -- capability ladder ------------------------------------------------------------------

    @property
    def _capability_key(self) -> tuple[str, str | None]:
        return (self.resolved.model, self.resolved.api_base)

    @property
    def format_level(self) -> str:
        """The strongest ``response_format`` this model is known to accept (see FORMAT_LEVELS)."""
        with _FORMAT_LOCK:
            return FORMAT_LEVELS[_FORMAT_LEVEL.get(self._capability_key, 0)]

    def _downgrade(self, sent_level: int) -> bool:
        if sent_level >= 2:
            return False
        new = sent_level + 1
        with _FORMAT_LOCK:
            _FORMAT_LEVEL[self._capability_key] = max(_FORMAT_LEVEL.get(self._capability_key, 0), new)
        name = f"{FORMAT_LEVELS[sent_level]}->{FORMAT_LEVELS[new]}"
        cap = recording_capture()
        if cap is not None:
            cap.downgrades.append(name)
        with self._counts_lock:
            self.fallback_counts[name] = self.fallback_counts.get(name, 0) + 1
        logger.warning(
            "%s at %s rejected response_format %s; using %s from now on",
            self.resolved.model,
            self.resolved.where,
            FORMAT_LEVELS[sent_level],
            FORMAT_LEVELS[new],
        )
        return True

    @property
    def supported_params(self) -> set[str]:
        """DSPy's view of the parameters, with ``response_format`` per the capability ladder."""
        try:
            params = set(super().supported_params)
        except Exception:  # capability lookup failed for an unknown model name
            params = set()
        if self.format_level == "text":
            params.discard("response_format")
        else:
            params.add("response_format")
        return params

    @property
    def supports_response_schema(self) -> bool:
        """True while json_schema has not been rejected (and never for the local model)."""
        return self.format_level == "json_schema"

    # -- the call ---------------------------------------------------------------------------

    def _record(
        self,
        *,
        input_tokens: int,
        output_tokens: int,
        latency_s: float,
        estimated: bool = False,
        failed: bool = False,
        cache_hit: bool = False,
    ) -> None:
        cap = recording_capture()
        if cap is not None:
            cap.ledger.append(
                {
                    "model": self.resolved.model,
                    "input_tokens": input_tokens,
                    "output_tokens": output_tokens,
                    "cache_hit": cache_hit,
                    "estimated": estimated,
                    "failed": failed,
                    "latency_s": round(latency_s, 4),
                }
            )
        if self.ledger is None:
            return
        self.ledger.record(
            CallRecord(
                role=self.role,
                stage=current_stage(),
                model=self.resolved.model,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                cache_hit=cache_hit,
                estimated=estimated,
                failed=failed,
                latency_s=latency_s,
            )
        )

    def _usage(self, response: Any, messages: Sequence[dict[str, Any]]) -> tuple[int, int, bool]:
        usage = getattr(response, "usage", None)
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0) if usage is not None else 0
        completion = int(getattr(usage, "completion_tokens", 0) or 0) if usage is not None else 0
        if prompt == 0 and completion == 0:  # LiteLLM turns a missing usage into zeros
            return estimate_tokens(_messages_text(messages)), estimate_tokens(_content_of(response)), True
        return prompt, completion, False

    def _wait_for(self, err: LMError, attempt: int) -> float:
        hint = err.retry_after_s if isinstance(err, LMRateLimitError) else None
        if hint is not None:
            return min(float(hint), self.max_wait_s)
        step = self.backoff_base_s * (2 ** min(attempt, 10))
        return float(min(step * self._rng.uniform(0.5, 1.0), self.max_wait_s))

    def _check_completion(self, response: Any) -> None:
        r = self.resolved
        choices = getattr(response, "choices", None) or []
        if not choices:
            filtered = getattr(response, "prompt_filter_results", None)
            reason = "content_filter" if filtered else "no_choices"
            raise EmptyCompletionError(
                f"{r.model} at {r.where} returned HTTP 200 with no choices ({reason}); the prompt was not "
                "answered. Not retried with the same prompt.",
                reason=reason,
                model=r.model,
                api_base=r.api_base,
            )
        first = choices[0]
        if getattr(first, "finish_reason", None) == "content_filter":
            raise EmptyCompletionError(
                f"{r.model} filtered the completion (content_filter)",
                reason="content_filter",
                model=r.model,
                api_base=r.api_base,
            )
        message = getattr(first, "message", None)
        if message is None or (message.content or "").strip() or getattr(message, "tool_calls", None):
            return
        if (getattr(message, "reasoning_content", None) or "").strip():
            raise EmptyCompletionError(
                f"{r.model} put its whole reply in reasoning_content and left content empty (finish_reason="
                f"{first.finish_reason}): raise lm.{r.role}.max_tokens (now {r.max_tokens}) or disable the "
                "model's reasoning/thinking mode.",
                reason="answer_in_reasoning_field",
                model=r.model,
                api_base=r.api_base,
            )
        raise EmptyCompletionError(
            f"{r.model} returned an empty completion (finish_reason={first.finish_reason})",
            reason="empty_content",
            model=r.model,
            api_base=r.api_base,
        )

    def _send(self, messages: list[dict[str, Any]], request: dict[str, Any]) -> Any:
        import litellm

        litellm.suppress_debug_info = True  # no "Give Feedback" banner on stdout; we classify errors
        r = self.resolved
        requested = request.pop("response_format", None)
        retries_used = 0
        while True:
            with _FORMAT_LOCK:
                level = _FORMAT_LEVEL.get(self._capability_key, 0)
            rf = _apply_level(requested, level, keep_schema=r.is_local)
            body = dict(request)
            if rf is not None:
                body["response_format"] = rf
            started = time.monotonic()
            try:
                response = litellm.completion(
                    model=r.model,
                    messages=messages,
                    api_base=r.api_base,
                    api_key=r.api_key,
                    timeout=r.timeout_s,
                    num_retries=0,
                    max_retries=0,
                    **body,
                )
            except Exception as exc:
                latency = time.monotonic() - started
                self._record(
                    input_tokens=estimate_tokens(_messages_text(messages)),
                    output_tokens=0,
                    latency_s=latency,
                    estimated=True,
                    failed=True,
                )
                err = classify_error(exc, r, format_sent=rf is not None)
                if isinstance(err, ResponseFormatError):
                    sent_level = _format_level(rf)
                    if sent_level is not None and self._downgrade(sent_level):
                        continue  # exactly one retry per rung, not counted as a transient retry
                    raise err from exc
                if err.retryable and retries_used < r.num_retries:
                    wait = self._wait_for(err, retries_used)
                    retries_used += 1
                    logger.info(
                        "%s: %s; retry %d/%d in %.2fs",
                        r.model,
                        type(err).__name__,
                        retries_used,
                        r.num_retries,
                        wait,
                    )
                    time.sleep(wait)
                    continue
                raise err from exc
            latency = time.monotonic() - started
            prompt_toks, completion_toks, estimated = self._usage(response, messages)
            try:
                self._check_completion(response)
            except EmptyCompletionError:
                has_usage = not estimated
                self._record(
                    input_tokens=prompt_toks,
                    output_tokens=completion_toks if has_usage else 0,
                    latency_s=latency,
                    estimated=not has_usage,
                    failed=True,
                )
                raise
            self._record(
                input_tokens=prompt_toks,
                output_tokens=completion_toks,
                latency_s=latency,
                estimated=estimated,
            )
            response._hidden_params["kitune_usage"] = {
                "input_tokens": prompt_toks,
                "output_tokens": completion_toks,
                "estimated": estimated,
                "cache_hit": False,
            }
            return response

    def _cache_key(self, messages: list[dict[str, Any]], request: dict[str, Any]) -> dict[str, Any]:
        key = {"_kitune": "chat", "model": self.resolved.model, "messages": messages}
        key.update({k: v for k, v in request.items() if not k.startswith("api_")})
        return key

    def forward(
        self, prompt: str | None = None, messages: list[dict[str, Any]] | None = None, **kwargs: Any
    ) -> Any:
        """Run one chat completion with kitune's policies; returns LiteLLM's ``ModelResponse``.

        Keyword args override the LM's defaults (``temperature``, ``max_tokens``,
        ``response_format`` …). ``cache=False`` skips the response cache; ``rollout_id`` only
        changes the cache key. The response's ``_hidden_params["kitune_usage"]`` holds
        ``{"input_tokens", "output_tokens", "estimated", "cache_hit"}``.

        Raises:
            LMError: a subclass from :mod:`kitune.errors` after bounded retries.
        """
        import litellm

        if self.recorder is not None and not kwargs.pop("_kitune_recording", False):
            return self._recorded_forward(prompt, messages, kwargs)
        msgs = list(messages) if messages else [{"role": "user", "content": prompt or ""}]
        refresh = bool(kwargs.pop("_kitune_refresh", False))
        use_cache = bool(kwargs.pop("cache", self.cache)) or refresh
        request = {**self.kwargs, **kwargs}
        request.pop("num_retries", None)
        # Calls are never streamed: a streamed reply carries no usage unless asked (case D1), and
        # the retry/classification logic needs the whole response.
        request.pop("stream", None)
        request.pop("stream_options", None)
        rollout_id = request.pop("rollout_id", None)
        if "response_format" in request:
            request["response_format"] = _normalise_format(request["response_format"])
        request = {k: v for k, v in request.items() if v is not None}
        key = self._cache_key(msgs, {**request, "rollout_id": rollout_id}) if use_cache else None
        if key is not None and not refresh:
            hit = dspy.cache.get(key)
            if isinstance(hit, dict) and "kitune_response" in hit:
                response = litellm.ModelResponse(**hit["kitune_response"])
                usage = hit["kitune_usage"]
                self._record(
                    input_tokens=usage["input_tokens"],
                    output_tokens=usage["output_tokens"],
                    latency_s=0.0,
                    estimated=usage["estimated"],
                    cache_hit=True,
                )
                response._hidden_params["kitune_usage"] = {**usage, "cache_hit": True}
                _note_finish(response)
                return response
        response = self._send(msgs, dict(request))
        if key is not None:
            usage = {k: v for k, v in response._hidden_params["kitune_usage"].items() if k != "cache_hit"}
            dspy.cache.put(key, {"kitune_response": response.model_dump(), "kitune_usage": usage})
        _note_finish(response)
        return response

    # -- record / replay (kitune.recording) -------------------------------------------------

    def _recorded_forward(
        self, prompt: str | None, messages: list[dict[str, Any]] | None, kwargs: dict[str, Any]
    ) -> Any:
        """:meth:`forward` through :attr:`recorder`: record the real call, or answer from the file."""
        import litellm

        assert self.recorder is not None
        msgs = [dict(m) for m in messages] if messages else [{"role": "user", "content": prompt or ""}]
        params = {**self.kwargs, **kwargs}
        if "response_format" in params:
            params["response_format"] = _normalise_format(params["response_format"])
        params = {k: v for k, v in params.items() if v is not None}
        digest = request_hash(self.model_identity, msgs, params)
        rec = self.recorder
        if rec.mode == "record":
            return rec.record_call(
                digest=digest,
                role=self.role,
                model=self.model_identity,
                messages=msgs,
                params=params,
                run=lambda: self.forward(prompt, messages, _kitune_recording=True, **kwargs),
                started=time.monotonic(),
                clock=time.monotonic,
            )
        entry = rec.lookup(digest, role=self.role, model=self.model_identity, messages=msgs)
        for name in entry.get("downgrades") or []:
            sent = FORMAT_LEVELS.index(name.split("->", 1)[0])
            with _FORMAT_LOCK:
                already = _FORMAT_LEVEL.get(self._capability_key, 0) > sent
            if not already:
                self._downgrade(sent)
        for r in entry.get("ledger") or []:
            self._record(
                input_tokens=int(r["input_tokens"]),
                output_tokens=int(r["output_tokens"]),
                latency_s=float(r.get("latency_s", 0.0)),
                estimated=bool(r.get("estimated")),
                failed=bool(r.get("failed")),
                cache_hit=bool(r.get("cache_hit")),
            )
        if entry.get("error"):
            raise rebuild_recorded_error(entry["error"])
        response = litellm.ModelResponse(**entry["response"])
        response._hidden_params["kitune_usage"] = {
            **entry["usage"],
            "recorded_latency_s": float(entry.get("latency_s") or 0.0),
        }
        _note_finish(response)  # a replayed cut reply is seen as cut, as when it was recorded
        return response

    async def aforward(
        self, prompt: str | None = None, messages: list[dict[str, Any]] | None = None, **kwargs: Any
    ) -> Any:
        """Async :meth:`forward` (runs it in a worker thread; the ledger stage is kept)."""
        return await asyncio.to_thread(self.forward, prompt, messages, **kwargs)

    def call_uncached(
        self, prompt: str | None = None, *, messages: list[dict[str, Any]] | None = None, **kwargs: Any
    ) -> list[Any]:
        """Call like ``lm(...)`` but never serve from the cache; the fresh reply replaces any cached one.

        Use it for a retry after a ParseError or truncated output (case D2).
        """
        outputs: list[Any] = self(prompt, messages=messages, _kitune_refresh=True, **kwargs)
        return outputs


class LocalJSONAdapter(dspy.JSONAdapter):  # type: ignore[misc]
    """JSONAdapter for llama.cpp's server: the schema goes as ``{"type": "json_object", "schema": ...}``.

    That is llama.cpp's grammar-constrained JSON mode, which it accepts; OpenAI's ``json_schema``
    form it rejects with HTTP 500.
    """

    def _prepare_response_format(self, lm: Any, lm_kwargs: dict[str, Any], signature: Any) -> None:
        try:
            model = _get_structured_outputs_response_format(signature, self.use_native_function_calling)
            schema = model.model_json_schema()
        except Exception:  # open-ended mapping or unschematisable field: plain JSON mode
            lm_kwargs["response_format"] = {"type": "json_object"}
            return
        lm_kwargs["response_format"] = {"type": "json_object", "schema": schema}


def adapter_for(lm: KituneLM) -> dspy.Adapter:
    """The adapter to use with ``lm``: :class:`LocalJSONAdapter` for the local model, else JSONAdapter.

    JSONAdapter sends the signature's output types as ``response_format`` (native structured
    output where the provider supports it; the capability ladder downgrades to ``json_object`` or
    prompt-only JSON when it does not). Scope it with ``dspy.context(lm=lm, adapter=adapter_for(lm))``.
    """
    return LocalJSONAdapter() if lm.resolved.is_local else dspy.JSONAdapter()


def default_adapter(lm: Any) -> dspy.Adapter:
    """The adapter a program uses when the DSPy context sets none.

    :func:`adapter_for` for a :class:`KituneLM` (the output types become ``response_format``);
    for any other ``dspy.LM`` (test doubles, plain LiteLLM) a ChatAdapter *without* its JSON
    fallback, so a reply the adapter cannot parse costs no second call: the program's own
    parser reads the raw reply instead.
    """
    if isinstance(lm, KituneLM):
        return adapter_for(lm)
    return dspy.ChatAdapter(use_json_adapter_fallback=False)


def build_lm(
    cfg: KituneConfig, role: Role, *, ledger: TokenLedger | None = None, **lm_kwargs: Any
) -> KituneLM:
    """Build the :class:`KituneLM` for ``role``.

    For the embedded local model this starts (or reuses) the llama.cpp server via
    ``kitune.localmodel.get_local_server`` and calls it as ``openai/<alias>``.

    Args:
        cfg: the loaded config (``cfg.lm.cache`` turns the response cache on).
        role: which role's settings to use.
        ledger: where to record token usage (None: not recorded).
        **lm_kwargs: passed to :class:`KituneLM` (``backoff_base_s``, ``max_wait_s``, ``seed``)
            or kept as default request parameters.

    Raises:
        ConfigError: see :func:`resolve_role`.
    """
    if cfg.lm.replay_dir is not None:  # offline: no env vars, no local server, no provider
        lm = KituneLM(_resolve_offline(cfg, role), ledger=ledger, cache=cfg.lm.cache, **lm_kwargs)
        lm.recorder = get_recorder(cfg.lm.replay_dir, "replay")
        return lm
    resolved = resolve_role(cfg, role)
    identity = resolved.model
    if resolved.is_local:
        from kitune.localmodel import get_local_server

        server = get_local_server(cfg.lm.local)
        resolved = replace(
            resolved, model=f"openai/{server.model_alias}", api_base=server.api_base, api_key=_LOCAL_KEY
        )
    lm = KituneLM(resolved, ledger=ledger, cache=cfg.lm.cache, **lm_kwargs)
    lm.model_identity = identity
    lm.recorder = get_recorder(cfg.lm.record_dir, "record")
    return lm


def _resolve_offline(cfg: KituneConfig, role: Role) -> ResolvedLM:
    """:func:`resolve_role` without reading the environment (replay: no key or gateway URL needed).

    The model string is the same as when recording (gateway routing included), so hashes match.
    """
    rc = cfg.lm.role(role)
    gw = cfg.lm.gateway
    model = rc.model or gw.default_model
    if model is None:
        return ResolvedLM(
            model=f"openai/{cfg.lm.local.model}",
            api_base=None,
            api_key=None,
            key_env=None,
            base_env=None,
            is_local=True,
            **_role_settings(rc, role),
        )
    if rc.api_base_env or gw.base_url_env:
        model = _route_through_gateway(model)
    return ResolvedLM(
        model=model,
        api_base=None,
        api_key=None,
        key_env=None,
        base_env=None,
        is_local=False,
        **_role_settings(rc, role),
    )


class LiteLLMChatModel:
    """:class:`kitune.chat.ChatModel` over :class:`KituneLM` (same errors, timeouts, retries, ledger).

    Args:
        cfg: the loaded config (``agent.tool_calling`` picks :attr:`tool_mode`).
        role: the role whose settings apply (usually ``"agent"``).
        ledger: token ledger (None: not recorded).
        lm: use this LM instead of building one (tests, shared LMs).
        tool_mode: ``"native"`` or ``"json"``; None: from ``cfg.agent.tool_calling`` (``auto``:
            native when ``litellm.supports_function_calling`` says so for the model; always json
            for the embedded local model).

    Attributes:
        tool_mode: the agent's tool mode with this model (read by :class:`kitune.evaluation.agent.Agent`).
    """

    def __init__(
        self,
        cfg: KituneConfig | None = None,
        role: Role = "agent",
        *,
        ledger: TokenLedger | None = None,
        lm: KituneLM | None = None,
        tool_mode: ToolMode | None = None,
    ) -> None:
        if lm is None:
            if cfg is None:
                raise ConfigError(
                    "LiteLLMChatModel needs a config or an lm: pass cfg=load_config(...) or lm=..."
                )
            lm = build_lm(cfg, role, ledger=ledger)
        self.lm = lm
        setting = tool_mode or (cfg.agent.tool_calling if cfg is not None else "auto")
        self.tool_mode: ToolMode = setting if setting != "auto" else _auto_tool_mode(lm.resolved)

    def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        json_mode: bool = False,
        max_tokens: int | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
    ) -> ChatResponse:
        """Complete ``messages``; see :meth:`kitune.chat.ChatModel.complete`.

        Raises:
            LMContextWindowError: the conversation does not fit the model's context.
            LMError: another classified failure after bounded retries.
        """
        kwargs: dict[str, Any] = {}
        if json_mode:
            kwargs["response_format"] = {"type": "json_object"}
        if max_tokens is not None:
            kwargs["max_tokens"] = max_tokens
        if tools:
            kwargs["tools"] = [dict(t) for t in tools]
            if tool_choice is not None:
                kwargs["tool_choice"] = tool_choice
        response = self.lm.forward(messages=[dict(m) for m in messages], **kwargs)
        usage = response._hidden_params["kitune_usage"]
        choice = response.choices[0]
        calls = tuple(
            ToolCall(
                id=str(getattr(c, "id", "") or f"call_{i}"),
                name=str(c.function.name or ""),
                arguments=c.function.arguments
                if isinstance(c.function.arguments, str)
                else json.dumps(c.function.arguments),
            )
            for i, c in enumerate(getattr(choice.message, "tool_calls", None) or [])
        )
        return ChatResponse(
            text=choice.message.content or "",
            input_tokens=usage["input_tokens"],
            output_tokens=usage["output_tokens"],
            estimated=usage["estimated"],
            finish_reason=choice.finish_reason,
            model=getattr(response, "model", "") or "",
            tool_calls=calls,
            latency_s=usage.get("recorded_latency_s"),
        )


def _auto_tool_mode(resolved: ResolvedLM) -> ToolMode:
    """``native`` when LiteLLM knows ``resolved.model`` supports function calling, else ``json``."""
    if resolved.is_local:
        return "json"
    import litellm

    try:
        return "native" if litellm.supports_function_calling(model=resolved.model) else "json"
    except Exception:  # unknown model names raise in some LiteLLM versions
        return "json"
