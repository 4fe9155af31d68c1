"""Per-call timeouts sized to the local server's measured speed, and a scope that lengthens them.

On the embedded llama.cpp server a fixed ``timeout_s`` loses documents: on a busy 2-core machine
an extraction of ``max_tokens`` 700 with 4 slots sharing the cores can take longer than 120 s, and
every retry of it starts from scratch. So for calls to the server kitune started, the timeout is
derived from the request and the server's measured rates (:func:`derived_timeout`):

    timeout = max(timeout_s, OVERHEAD_S + SAFETY × slots × (prompt_tokens / prompt_tps
                                                              + max_tokens / gen_tps))

* ``prompt_tps`` / ``gen_tps`` — the server's prompt-reading and generation rates for one request
  (tokens/s), measured at start-up (:meth:`kitune.localmodel.LocalModelServer.probe`) and updated
  from llama.cpp's own ``timings`` of every reply (:class:`RateMeter`, the lowest recent value
  wins, so a slow spell lengthens timeouts at once);
* ``slots`` — requests the server decodes together: in the worst case all share the cores, so one
  request gets ``1/slots`` of them (measured: 2 busy slots ran at 4.4 tokens/s each against 12 for
  one alone, ``benchmarks/results/local_runtimes.md``);
* ``SAFETY`` 1.5 and ``OVERHEAD_S`` 10 s (HTTP, scheduling, the chat template);
* ``timeout_s`` — ``lm.<role>.timeout_s`` stays the floor.

A call to a provider or gateway keeps ``timeout_s``. :func:`timeout_scale` multiplies whatever
applies inside its scope (the extraction retries a timed-out document once under ``×2``).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "DEFAULT_GEN_TPS",
    "DEFAULT_PROMPT_TPS",
    "OVERHEAD_S",
    "SAFETY",
    "RateMeter",
    "current_timeout_scale",
    "derived_timeout",
    "meter_for",
    "timeout_scale",
]

OVERHEAD_S = 10.0
"""Seconds added to every derived timeout (HTTP, scheduling, the chat template)."""

SAFETY = 1.5
"""Factor on the modelled time of a request."""

DEFAULT_PROMPT_TPS = 15.0
"""Prompt tokens/s assumed before anything was measured (2 busy cores, the 1.5B model)."""

DEFAULT_GEN_TPS = 4.0
"""Generated tokens/s assumed before anything was measured."""

_SCALE: contextvars.ContextVar[float] = contextvars.ContextVar("kitune_timeout_scale", default=1.0)


def derived_timeout(
    *,
    max_tokens: int,
    prompt_tokens: int,
    prompt_tps: float,
    gen_tps: float,
    slots: int,
    floor_s: float,
) -> float:
    """The timeout (seconds) of one call to the local server: the module docstring's formula.

    Args:
        max_tokens: the request's output cap (>= 1).
        prompt_tokens: its prompt length in tokens (an estimate is fine; >= 0).
        prompt_tps: the server's measured prompt-reading rate for one request, tokens/s (> 0).
        gen_tps: its measured generation rate for one request, tokens/s (> 0).
        slots: requests the server decodes together (>= 1).
        floor_s: the configured ``timeout_s``; the result is never below it.

    Raises:
        ValueError: a rate is not positive or ``slots`` < 1.
    """
    if prompt_tps <= 0 or gen_tps <= 0:
        raise ValueError(f"rates must be > 0 tokens/s, got prompt {prompt_tps}, generation {gen_tps}")
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    modelled = prompt_tokens / prompt_tps + max_tokens / gen_tps
    return max(float(floor_s), OVERHEAD_S + SAFETY * slots * modelled)


class RateMeter:
    """The local server's recent per-request rates (tokens/s), thread-safe.

    Keeps the last ``window`` observations of each rate; :meth:`rates` returns the lowest of them
    (a slow spell lengthens timeouts at once, a fast one shortens them only after ``window``
    replies), or the defaults before any observation.
    """

    def __init__(
        self, *, window: int = 8, prompt_tps: float = DEFAULT_PROMPT_TPS, gen_tps: float = DEFAULT_GEN_TPS
    ) -> None:
        """Start with ``prompt_tps`` / ``gen_tps`` (tokens/s) until something is measured.

        Args:
            window: observations kept per rate (>= 1).
            prompt_tps: the prompt rate assumed until measured (> 0).
            gen_tps: the generation rate assumed until measured (> 0).
        """
        self.window = max(1, window)
        self._defaults = (prompt_tps, gen_tps)
        self._prompt: list[float] = []
        self._gen: list[float] = []
        self._lock = threading.Lock()
        self._probed = False

    def claim_probe(self) -> bool:
        """True exactly once per meter: the caller should then record the server's start-up probe."""
        with self._lock:
            first, self._probed = not self._probed, True
            return first

    def observe(self, *, prompt_tps: float | None = None, gen_tps: float | None = None) -> None:
        """Record one reply's rates (None or <= 0: not measured, ignored)."""
        with self._lock:
            for value, into in ((prompt_tps, self._prompt), (gen_tps, self._gen)):
                if value is not None and value > 0:
                    into.append(float(value))
                    del into[: -self.window]

    def observe_timings(self, timings: Mapping[str, Any] | None) -> bool:
        """Record llama.cpp's ``timings`` of one reply; True when it held a rate.

        Only requests that read at least 32 prompt tokens / generated at least 8 count: a rate over
        a handful of tokens is noise.
        """
        if not timings:
            return False
        prompt = timings.get("prompt_per_second") if (timings.get("prompt_n") or 0) >= 32 else None
        gen = timings.get("predicted_per_second") if (timings.get("predicted_n") or 0) >= 8 else None
        self.observe(prompt_tps=_num(prompt), gen_tps=_num(gen))
        return prompt is not None or gen is not None

    def rates(self) -> tuple[float, float]:
        """``(prompt_tps, gen_tps)``: the lowest of the recent observations, else the defaults."""
        with self._lock:
            prompt = min(self._prompt) if self._prompt else self._defaults[0]
            gen = min(self._gen) if self._gen else self._defaults[1]
        return prompt, gen

    @property
    def measured(self) -> bool:
        """True once a generation rate was observed."""
        with self._lock:
            return bool(self._gen)


_METERS: dict[str, RateMeter] = {}
_METERS_LOCK = threading.Lock()


def meter_for(api_base: str) -> RateMeter:
    """The process-wide :class:`RateMeter` of the local server at ``api_base`` (created on first use)."""
    with _METERS_LOCK:
        meter = _METERS.get(api_base)
        if meter is None:
            meter = _METERS[api_base] = RateMeter()
        return meter


def _num(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


@contextlib.contextmanager
def timeout_scale(factor: float) -> Iterator[None]:
    """Multiply every call's timeout by ``factor`` (> 0) inside this scope (this thread/context)."""
    if factor <= 0:
        raise ValueError(f"timeout scale must be > 0, got {factor}")
    token = _SCALE.set(_SCALE.get() * factor)
    try:
        yield
    finally:
        _SCALE.reset(token)


def current_timeout_scale() -> float:
    """The factor :func:`timeout_scale` set for this context (1.0 outside any scope)."""
    return _SCALE.get()
