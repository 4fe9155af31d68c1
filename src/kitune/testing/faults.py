"""Seeded fault injection for :class:`kitune.testing.openai_stub.StubServer` (reliability tests, soak).

A :class:`FaultyProvider` is a stub ``responder``: for each chat request it works out a *key*
(which document or question the request is about) and the attempt number for that key, asks
its :class:`FaultPlan` whether this attempt fails, and answers with the fault or with the good
reply the test supplies. Decisions depend only on ``(seed, key, attempt)``, never on arrival
order, so a concurrent run injects the same faults as a sequential one::

    provider = FaultyProvider(good=lambda req: my_reply(req), key=docid_of, plan=FaultPlan(seed=1, rate=0.3))
    with StubServer(responder=provider) as stub:
        ...
    provider.injected  # Counter: fault kind -> how many were sent

Fault kinds (:data:`FAULT_KINDS`): ``rate_limited`` (429 with ``Retry-After``), ``server_500``,
``server_503``, ``timeout`` (the reply is delayed past the client's timeout), ``truncated`` (the
good reply cut at 60 % with ``finish_reason="length"``), ``empty_choices`` (HTTP 200,
``choices: []``, case L1) and ``prose`` (text with no JSON, case L4-C).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kitune.testing.openai_stub import RecordedRequest, Reply

__all__ = [
    "FAULT_KINDS",
    "RETRYABLE_KINDS",
    "FaultPlan",
    "FaultyProvider",
    "dspy_docid",
    "fault_reply",
    "request_text",
    "scripted",
]

FAULT_KINDS: tuple[str, ...] = (
    "rate_limited",
    "server_500",
    "server_503",
    "timeout",
    "truncated",
    "empty_choices",
    "prose",
)
"""Every fault a :class:`FaultPlan` can inject."""

RETRYABLE_KINDS: frozenset[str] = frozenset({"rate_limited", "server_500", "server_503", "timeout"})
"""Transport faults the LM layer retries itself (bounded by ``num_retries``)."""

PROSE = "Let me analyze the provided document step by step:\n1. Identify the organisations\n2. Their places"
"""The no-JSON reply used for ``prose`` (case P1 input B)."""


def _unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from ``parts`` (stable across processes, unlike ``hash``)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


@dataclass(frozen=True)
class FaultPlan:
    """Which attempts fail, and how.

    Args:
        seed: any integer; the same seed gives the same faults.
        rate: probability (0–1) that one attempt gets a fault.
        kinds: the fault kinds to draw from (uniformly), a subset of :data:`FAULT_KINDS`.
        max_faulty_attempts: attempts ``>= this`` (0-based) are never faulted, so every key
            eventually gets a good reply when the caller retries enough (None: no such bound).
        timeout_delay_s: how long a ``timeout`` reply waits, in seconds (set it above the
            client's ``timeout_s``).
        retry_after_s: the ``Retry-After`` value sent with ``rate_limited``, in seconds.

    Raises:
        ValueError: ``rate`` outside [0, 1] or an unknown kind.
    """

    seed: int = 0
    rate: float = 0.3
    kinds: tuple[str, ...] = FAULT_KINDS
    max_faulty_attempts: int | None = None
    timeout_delay_s: float = 2.0
    retry_after_s: float = 0.05

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"FaultPlan.rate must be in [0, 1], got {self.rate}")
        unknown = set(self.kinds) - set(FAULT_KINDS)
        if unknown or not self.kinds:
            raise ValueError(f"FaultPlan.kinds must be a non-empty subset of {FAULT_KINDS}, got {self.kinds}")

    def fault_for(self, key: str, attempt: int) -> str | None:
        """The fault for ``key``'s ``attempt``-th request (0-based), or None for a good reply."""
        if self.max_faulty_attempts is not None and attempt >= self.max_faulty_attempts:
            return None
        if _unit(self.seed, key, attempt, "hit") >= self.rate:
            return None
        return self.kinds[int(_unit(self.seed, key, attempt, "kind") * len(self.kinds))]


def scripted(script: dict[str, Sequence[str | None]]) -> Callable[[str, int], str | None]:
    """A fault chooser from an explicit script: ``{key: [kind or None per attempt]}``.

    Attempts past the end of a key's list, and keys not in the script, get a good reply.
    """

    def choose(key: str, attempt: int) -> str | None:
        kinds = script.get(key, ())
        return kinds[attempt] if attempt < len(kinds) else None

    return choose


def fault_reply(kind: str, good: str, *, timeout_delay_s: float = 2.0, retry_after_s: float = 0.05) -> Reply:
    """The :class:`Reply` for fault ``kind`` given the ``good`` content it replaces.

    Raises:
        ValueError: unknown ``kind``.
    """
    if kind == "rate_limited":
        return Reply.rate_limited(retry_after_s=retry_after_s)
    if kind == "server_500":
        return Reply.server_error(500)
    if kind == "server_503":
        return Reply.server_error(503)
    if kind == "timeout":
        return Reply.slow(timeout_delay_s, Reply.ok(good))
    if kind == "truncated":
        return Reply.truncated(good[: max(1, int(len(good) * 0.6))])
    if kind == "empty_choices":
        return Reply.empty_choices()
    if kind == "prose":
        return Reply.ok(PROSE)
    raise ValueError(f"unknown fault kind {kind!r}; use one of {FAULT_KINDS}")


def request_text(request: RecordedRequest) -> str:
    """All message contents of a chat request joined by newlines (``""`` when there are none)."""
    parts: list[str] = []
    for m in request.body.get("messages", []) or []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(c.get("text", "")) for c in content if isinstance(c, dict))
    return "\n".join(parts)


_DSPY_FIELD = re.compile(r"\[\[ ## docid ## \]\]\s*\n(?P<value>[^\n]*)")


def dspy_docid(request: RecordedRequest) -> str:
    """The ``docid`` input of a DSPy ChatAdapter request (``""`` when absent).

    The last ``[[ ## docid ## ]]`` block wins: the system message shows the field's template first.
    """
    found = _DSPY_FIELD.findall(request_text(request))
    return str(found[-1]).strip() if found else ""


@dataclass
class FaultyProvider:
    """A thread-safe ``StubServer`` responder that injects seeded faults per (key, attempt).

    Args:
        good: the good reply's content for a request.
        key: which unit of work a request belongs to (a docid, a question).
        plan: a :class:`FaultPlan`, or a ``(key, attempt) -> kind | None`` callable
            (e.g. :func:`scripted`).
        timeout_delay_s: delay of ``timeout`` replies when ``plan`` is a callable.
        delay_s: seconds every good reply waits (to stretch a run so a kill lands inside it).

    Attributes:
        attempts: key → requests received so far.
        injected: fault kind → times sent.
        log: ``(key, attempt, kind or "ok")`` per request, in arrival order.
    """

    good: Callable[[RecordedRequest], str]
    key: Callable[[RecordedRequest], str]
    plan: FaultPlan | Callable[[str, int], str | None]
    timeout_delay_s: float = 2.0
    delay_s: float = 0.0
    attempts: Counter[str] = field(default_factory=Counter)
    injected: Counter[str] = field(default_factory=Counter)
    log: list[tuple[str, int, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __call__(self, request: RecordedRequest) -> Reply:
        """Answer one request (called by the stub's handler threads)."""
        k = self.key(request)
        with self._lock:
            attempt = self.attempts[k]
            self.attempts[k] += 1
        if isinstance(self.plan, FaultPlan):
            kind = self.plan.fault_for(k, attempt)
            delay, retry_after = self.plan.timeout_delay_s, self.plan.retry_after_s
        else:
            kind = self.plan(k, attempt)
            delay, retry_after = self.timeout_delay_s, 0.05
        with self._lock:
            self.log.append((k, attempt, kind or "ok"))
            if kind is not None:
                self.injected[kind] += 1
        content = self.good(request)
        if kind is None:
            ok = Reply.ok(content, usage=(100, 20))
            return Reply.slow(self.delay_s, ok) if self.delay_s > 0 else ok
        return fault_reply(kind, content, timeout_delay_s=delay, retry_after_s=retry_after)

    def kinds_for(self, key: str) -> list[str]:
        """The replies ``key`` got, in attempt order (``"ok"`` for good ones)."""
        with self._lock:
            return [kind for k, _a, kind in sorted(self.log) if k == key]
