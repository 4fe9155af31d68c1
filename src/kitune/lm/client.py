"""The client: :class:`KituneLM`, a ``dspy.LM`` whose ``forward`` owns the whole call, and :func:`build_lm`.

* the configured ``timeout_s`` is passed to LiteLLM for real, and LiteLLM's / the OpenAI
  client's own retries are 0, so kitune's bounded retries (a ``tenacity.Retrying`` over
  :class:`~kitune.errors.LMError` with ``retryable`` set) are the only ones in force;
* failures are classified by :func:`kitune.lm.errors.classify_error`; 429 waits honour
  ``Retry-After``, then a "try again in 4.2s" hint in the body, then jittered exponential
  backoff (case L5);
* ``response_format`` follows the capability ladder of :mod:`kitune.lm.formats`; a rejection
  downgrades exactly once per rung and is counted in :attr:`KituneLM.fallback_counts` (case L4);
* every attempt is recorded in the :class:`~kitune.usage.TokenLedger` under (role, stage),
  failed ones included; missing usage is estimated; cache hits keep their original usage with
  ``cache_hit=True`` (case D1);
* the response cache key covers every request parameter (temperature, max_tokens,
  response_format, rollout_id …) and :meth:`KituneLM.call_uncached` bypasses it (case D2).

``forward`` is DSPy 3.4's deprecated extension point; a DSPy engine (``dspy.LM(engine=…)``) was
measured and cannot carry these requests unchanged nor let kitune's errors reach callers (the
local model's ``response_format`` is refused before any engine, tool-call arguments and
``rollout_id`` do not survive, non-DSPy errors become ``LMUnexpectedError`` and are not retried):
docs/guide.md "Why KituneLM still overrides dspy.LM.forward", ``tests/lm_tests/test_dspy_engine.py``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import dspy
import tenacity

import kitune.localmodel
from kitune.config import KituneConfig, Role
from kitune.errors import EmptyCompletionError, LMError, LMRateLimitError, LMTimeoutError, ResponseFormatError
from kitune.lm.calls import generated_text, messages_text, note_finish
from kitune.lm.errors import classify_error
from kitune.lm.formats import (
    FORMAT_LEVELS,
    apply_level,
    assume_level,
    format_level_of,
    normalise_format,
    raise_level,
    remembered_level,
)
from kitune.lm.roles import LOCAL_KEY, ResolvedLM, resolve_offline, resolve_role
from kitune.lm.timeouts import RateMeter, current_timeout_scale, derived_timeout, meter_for
from kitune.recording import CallRecorder, get_recorder, request_hash
from kitune.recording import capture as recording_capture
from kitune.recording import rebuild_error as rebuild_recorded_error
from kitune.usage import CallRecord, TokenLedger, current_stage, estimate_tokens

__all__ = ["KituneLM", "build_lm"]

logger = logging.getLogger("kitune.lm")


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
        self.rate_meter: RateMeter | None = None
        """The local server's measured rates (set by :func:`build_lm` for the server kitune started):
        the per-call timeout is then derived from them (:mod:`kitune.lm.timeouts`)."""
        self.local_slots = 1
        """Requests the local server decodes together (the derived timeout's ``slots``)."""
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
            # llama.cpp's server rejects OpenAI-style json_schema (HTTP 500)
            assume_level(self._capability_key, 1)

    # -- capability ladder ------------------------------------------------------------------

    @property
    def _capability_key(self) -> tuple[str, str | None]:
        return (self.resolved.model, self.resolved.api_base)

    @property
    def format_level(self) -> str:
        """The strongest ``response_format`` this model is known to accept (see FORMAT_LEVELS)."""
        return FORMAT_LEVELS[remembered_level(self._capability_key)]

    def _downgrade(self, sent_level: int) -> bool:
        if sent_level >= 2:
            return False
        new = sent_level + 1
        raise_level(self._capability_key, new)
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
        retry: bool = False,
        timed_out: bool = False,
        provider_billed: bool = False,
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
                retry=retry,
                timed_out=timed_out,
                provider_billed=provider_billed,
            )
        )

    def _usage(self, response: Any, messages: Sequence[dict[str, Any]]) -> tuple[int, int, bool]:
        """``(input, output, estimated)`` tokens of a reply.

        The provider's usage when it gives one. A missing usage (LiteLLM turns it into zeros) is
        estimated on both sides; a usage reporting 0 output tokens for a reply that holds text is
        estimated on the output side. Output is estimated from everything generated, the
        ``reasoning_content`` included, so a reply whose whole text came back there is never
        booked as 0 output tokens.
        """
        usage = getattr(response, "usage", None)
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0) if usage is not None else 0
        completion = int(getattr(usage, "completion_tokens", 0) or 0) if usage is not None else 0
        if prompt == 0 and completion == 0:
            return estimate_tokens(messages_text(messages)), estimate_tokens(generated_text(response)), True
        if completion == 0:
            generated = estimate_tokens(generated_text(response))
            if generated:
                return prompt, generated, True
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
        """One call with bounded retries (tenacity): retryable LMErrors only, ``num_retries`` at most.

        The wait before each retry is :meth:`_wait_for` (``Retry-After`` first, then jittered
        exponential backoff); a ``response_format`` downgrade inside :meth:`_attempt` is not a retry.
        """
        r = self.resolved
        requested = request.pop("response_format", None)
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, LMError) and e.retryable),
            stop=tenacity.stop_after_attempt(r.num_retries + 1),
            wait=self._retry_wait,
            before_sleep=self._log_retry,
            reraise=True,  # the classified LMError itself, not tenacity's RetryError
        )
        spent = [0, 0]  # input, output tokens recorded for this call's failed attempts
        attempts = [0]  # attempts made so far: the second and later are retries in the ledger

        def attempt() -> Any:
            attempts[0] += 1
            return self._attempt(messages, request, requested, spent, retry=attempts[0] > 1)

        try:
            return retrying(attempt)
        except LMError as err:  # the caller sees what the ledger was billed for this call
            err.input_tokens, err.output_tokens = spent
            raise

    def _retry_wait(self, state: tenacity.RetryCallState) -> float:
        if state.attempt_number > self.resolved.num_retries:  # no retry follows: keep the RNG untouched
            return 0.0
        err = state.outcome.exception() if state.outcome is not None else None
        assert isinstance(err, LMError)
        return self._wait_for(err, state.attempt_number - 1)

    def _log_retry(self, state: tenacity.RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        logger.info(
            "%s: %s; retry %d/%d in %.2fs",
            self.resolved.model,
            type(err).__name__,
            state.attempt_number,
            self.resolved.num_retries,
            wait,
        )

    def _attempt(
        self,
        messages: list[dict[str, Any]],
        request: dict[str, Any],
        requested: Any,
        spent: list[int],
        *,
        retry: bool = False,
    ) -> Any:
        """One attempt: send at the remembered format rung, stepping down once per rejected rung.

        Tokens recorded for a failed send are added to ``spent`` (``[input, output]``).
        """
        import litellm

        litellm.suppress_debug_info = True  # no "Give Feedback" banner on stdout; we classify errors
        r = self.resolved
        while True:
            level = remembered_level(self._capability_key)
            rf = apply_level(requested, level, keep_schema=r.is_local)
            body = dict(request)
            if rf is not None:
                body["response_format"] = rf
            timeout = self.timeout_for(messages, body)
            started = time.monotonic()
            try:
                response = litellm.completion(
                    model=r.model,
                    messages=messages,
                    api_base=r.api_base,
                    api_key=r.api_key,
                    timeout=timeout,
                    num_retries=0,
                    max_retries=0,
                    **body,
                )
            except Exception as exc:
                latency = time.monotonic() - started
                sent_tokens = estimate_tokens(messages_text(messages))
                spent[0] += sent_tokens
                err = classify_error(exc, replace(r, timeout_s=timeout), format_sent=rf is not None)
                # a rejected (4xx/5xx) or abandoned call: the prompt's estimate is kept for the
                # record, billed 0; nothing was received (no streaming here), so output is 0
                self._record(
                    input_tokens=sent_tokens,
                    output_tokens=0,
                    latency_s=latency,
                    estimated=True,
                    failed=True,
                    retry=retry,
                    timed_out=isinstance(err, LMTimeoutError),
                )
                if isinstance(err, ResponseFormatError):
                    sent_level = format_level_of(rf)
                    if sent_level is not None and self._downgrade(sent_level):
                        continue  # exactly one retry per rung, not counted as a transient retry
                raise err from exc
            latency = time.monotonic() - started
            if self.rate_meter is not None:  # llama.cpp's own timings of this reply
                self.rate_meter.observe_timings(getattr(response, "timings", None))
            prompt_toks, completion_toks, estimated = self._usage(response, messages)
            try:
                self._check_completion(response)
            except EmptyCompletionError:
                spent[0] += prompt_toks
                spent[1] += completion_toks  # a reasoning-only reply cost its reasoning tokens
                self._record(
                    input_tokens=prompt_toks,
                    output_tokens=completion_toks,
                    latency_s=latency,
                    estimated=estimated,
                    failed=True,
                    retry=retry,
                    provider_billed=not estimated,  # the reply carried a usage: the provider billed it
                )
                raise
            self._record(
                input_tokens=prompt_toks,
                output_tokens=completion_toks,
                latency_s=latency,
                estimated=estimated,
                retry=retry,
            )
            response._hidden_params["kitune_usage"] = {
                "input_tokens": prompt_toks,
                "output_tokens": completion_toks,
                "estimated": estimated,
                "cache_hit": False,
            }
            return response

    def timeout_for(self, messages: Sequence[dict[str, Any]], request: dict[str, Any]) -> float:
        """The timeout (seconds) of one call: derived from the local server's rates, else ``timeout_s``.

        For the server kitune started: :func:`kitune.lm.timeouts.derived_timeout` of the request's
        ``max_tokens``, its estimated prompt tokens, the measured rates and the server's slots, never
        below ``lm.<role>.timeout_s``. Either is multiplied by
        :func:`kitune.lm.timeouts.timeout_scale`.
        """
        r = self.resolved
        scale = current_timeout_scale()
        if self.rate_meter is None:
            return r.timeout_s * scale
        prompt_tps, gen_tps = self.rate_meter.rates()
        base = derived_timeout(
            max_tokens=int(request.get("max_tokens") or r.max_tokens or 1024),
            prompt_tokens=estimate_tokens(messages_text(messages)),
            prompt_tps=prompt_tps,
            gen_tps=gen_tps,
            slots=self.local_slots,
            floor_s=r.timeout_s,
        )
        return base * scale

    def _cache_key(self, messages: list[dict[str, Any]], request: dict[str, Any]) -> dict[str, Any]:
        key = {"_kitune": "chat", "model": self.resolved.model, "messages": messages}
        key.update({k: v for k, v in request.items() if not k.startswith("api_")})
        return key

    def _warn_zero_temp_rollout(self, temperature: float | None, rollout_id: Any) -> None:
        """No warning: DSPy's "rollout_id has no effect when temperature=0" is wrong for KituneLM.

        DSPy (``dspy.clients.execution``) calls this hook before each call because in DSPy only the
        response cache key is varied by ``rollout_id``. KituneLM's own cache key and recording hash
        include ``rollout_id``, and a fresh retry at temperature 0 (the disambiguator's) also sends
        ``cache=False``; the warning only cluttered the demo's output.
        """

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
            request["response_format"] = normalise_format(request["response_format"])
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
                note_finish(response)
                return response
        response = self._send(msgs, dict(request))
        if key is not None:
            usage = {k: v for k, v in response._hidden_params["kitune_usage"].items() if k != "cache_hit"}
            dspy.cache.put(key, {"kitune_response": response.model_dump(), "kitune_usage": usage})
        note_finish(response)
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
            params["response_format"] = normalise_format(params["response_format"])
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
            already = remembered_level(self._capability_key) > sent
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
            err = rebuild_recorded_error(entry["error"])
            # what the recorded call was billed, as when it was recorded
            err.input_tokens = sum(int(r["input_tokens"]) for r in entry.get("ledger") or [])
            err.output_tokens = sum(int(r["output_tokens"]) for r in entry.get("ledger") or [])
            raise err
        response = litellm.ModelResponse(**entry["response"])
        response._hidden_params["kitune_usage"] = {
            **entry["usage"],
            "recorded_latency_s": float(entry.get("latency_s") or 0.0),
        }
        note_finish(response)  # a replayed cut reply is seen as cut, as when it was recorded
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

        Use it for a retry after a ParseError or truncated output (case D2). It runs :meth:`forward`
        and turns the response into ``lm(...)``'s outputs with ``dspy.BaseLM``'s legacy processing
        (history and DSPy's usage tracker included), so OpenAI-style ``messages`` never go through
        ``lm(messages=...)``, which DSPy 3.4 deprecates.
        """
        response = self.forward(prompt, messages, _kitune_refresh=True, **kwargs)
        outputs: list[Any] = self._process_lm_response(response, prompt, messages, **kwargs)
        return outputs


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
        lm = KituneLM(resolve_offline(cfg, role), ledger=ledger, cache=cfg.lm.cache, **lm_kwargs)
        lm.recorder = get_recorder(cfg.lm.replay_dir, "replay")
        return lm
    resolved = resolve_role(cfg, role)
    identity = resolved.model
    meter: RateMeter | None = None
    if resolved.is_local:
        server = kitune.localmodel.get_local_server(cfg.lm.local)
        resolved = replace(
            resolved, model=f"openai/{server.model_alias}", api_base=server.api_base, api_key=LOCAL_KEY
        )
        meter = meter_for(server.api_base)
        if meter.claim_probe():  # once per server: its rates, measured at start, before any real reply
            meter.observe_timings(getattr(server, "startup_timings", None))
    lm = KituneLM(resolved, ledger=ledger, cache=cfg.lm.cache, **lm_kwargs)
    if meter is not None:
        lm.rate_meter = meter
        lm.local_slots = cfg.lm.local.slots
    lm.model_identity = identity
    lm.recorder = get_recorder(cfg.lm.record_dir, "record")
    return lm
