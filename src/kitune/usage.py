"""Token ledger: every LLM call's input and output tokens, keyed by role and stage.

The LM layer (:mod:`kitune.lm`) records into a ledger after each call. Usage comes from the
provider's ``usage`` field; when a provider returns none, tokens are *estimated* (tiktoken's
``cl100k_base``, or chars/4 when unavailable) and the record says so. A cache hit is recorded
with its original usage but ``billed`` input/output tokens of 0 (case D1).

Stages are set by the caller with :meth:`TokenLedger.stage`, which uses a ``ContextVar`` so
worker threads started with ``contextvars.copy_context()`` and asyncio tasks keep their stage.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import tiktoken

__all__ = ["CallRecord", "TokenLedger", "current_stage", "estimate_tokens"]

_STAGE: contextvars.ContextVar[str] = contextvars.ContextVar("kitune_stage", default="default")


def current_stage() -> str:
    """Return the stage set by the innermost :meth:`TokenLedger.stage` block (``"default"``)."""
    return _STAGE.get()


def estimate_tokens(text: str) -> int:
    """Estimate the token count of ``text`` (tiktoken cl100k_base; chars/4 if unavailable)."""
    try:
        return len(tiktoken.get_encoding("cl100k_base").encode(text, disallowed_special=()))
    except Exception:  # tiktoken's vocabulary not cached offline
        return max(1, len(text) // 4) if text else 0


@dataclass(frozen=True)
class CallRecord:
    """One LLM call."""

    role: str
    """extract | rewrite | agent | judge | reflection (or a custom role)."""
    stage: str
    """Pipeline stage, e.g. ``extract``, ``eval:baseline``, ``optimize:gepa``."""
    model: str
    """LiteLLM model string."""
    input_tokens: int
    """Prompt tokens as reported (or estimated)."""
    output_tokens: int
    """Completion tokens as reported (or estimated)."""
    cache_hit: bool = False
    """True when the response came from a cache; billed tokens are then 0."""
    estimated: bool = False
    """True when the provider returned no usage and tokens were estimated."""
    failed: bool = False
    """True when the call raised; its tokens are the estimate of the prompt sent and what was
    received (0 unless the provider's reply said otherwise)."""
    latency_s: float = 0.0
    """Wall time of the call in seconds."""
    retry: bool = False
    """True for an attempt that repeats a failed one (a bounded retry after a 429, 5xx, timeout)."""
    timed_out: bool = False
    """True when the call was abandoned at its timeout (output: the tokens actually received)."""
    provider_billed: bool = False
    """For a failed call: the provider's reply carried a usage (it billed the call), e.g. an
    empty or reasoning-only completion. A rejected (4xx/5xx) or timed-out call bills nothing."""

    @property
    def billed_input_tokens(self) -> int:
        """Input tokens that cost money (0 on a cache hit or a failed call the provider did not bill)."""
        if self.cache_hit or (self.failed and not self.provider_billed):
            return 0
        return self.input_tokens

    @property
    def billed_output_tokens(self) -> int:
        """Output tokens that cost money (0 on a cache hit or a failed call the provider did not bill)."""
        if self.cache_hit or (self.failed and not self.provider_billed):
            return 0
        return self.output_tokens


@dataclass
class _Totals:
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    billed_input_tokens: int = 0
    billed_output_tokens: int = 0
    cache_hits: int = 0
    estimated_calls: int = 0
    failed_calls: int = 0
    retries: int = 0
    timeouts: int = 0


@dataclass
class TokenLedger:
    """Thread-safe record of LLM calls. Shapes: ``records`` in call order."""

    records: list[CallRecord] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Attribute calls made inside the block (this thread/task) to stage ``name``."""
        token = _STAGE.set(name)
        try:
            yield
        finally:
            _STAGE.reset(token)

    def record(self, rec: CallRecord) -> None:
        """Append one call record."""
        with self._lock:
            self.records.append(rec)

    def totals(self, *, role: str | None = None, stage: str | None = None) -> dict[str, int]:
        """Sum tokens over records matching ``role``/``stage`` (all when None).

        Returns:
            ``{"calls", "input_tokens", "output_tokens", "billed_input_tokens",
            "billed_output_tokens", "cache_hits", "estimated_calls", "failed_calls", "retries",
            "timeouts"}``: ``retries`` counts attempts that repeated a failed one, ``timeouts``
            calls abandoned at their timeout (both also among ``calls``; failed ones among
            ``failed_calls``).
        """
        t = _Totals()
        with self._lock:
            recs = list(self.records)
        for r in recs:
            if (role is not None and r.role != role) or (stage is not None and r.stage != stage):
                continue
            t.calls += 1
            t.input_tokens += r.input_tokens
            t.output_tokens += r.output_tokens
            t.billed_input_tokens += r.billed_input_tokens
            t.billed_output_tokens += r.billed_output_tokens
            t.cache_hits += int(r.cache_hit)
            t.estimated_calls += int(r.estimated)
            t.failed_calls += int(r.failed)
            t.retries += int(r.retry)
            t.timeouts += int(r.timed_out)
        return asdict(t)

    def by_role_stage(self) -> dict[tuple[str, str], dict[str, int]]:
        """Totals per ``(role, stage)`` pair, in first-seen order."""
        with self._lock:
            keys = list(dict.fromkeys((r.role, r.stage) for r in self.records))
        return {k: self.totals(role=k[0], stage=k[1]) for k in keys}

    def snapshot(self) -> int:
        """Return a marker (the current record count) for :meth:`since`."""
        with self._lock:
            return len(self.records)

    def since(self, marker: int) -> list[CallRecord]:
        """Records added after :meth:`snapshot` returned ``marker``."""
        with self._lock:
            return list(self.records[marker:])

    def to_rows(self) -> list[dict[str, Any]]:
        """Per-(role, stage) rows for tables and MLflow: role, stage + the totals keys."""
        return [{"role": r, "stage": s, **t} for (r, s), t in self.by_role_stage().items()]
