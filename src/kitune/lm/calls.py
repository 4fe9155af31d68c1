"""How each :class:`~kitune.lm.client.KituneLM` call ended: :func:`track_calls` and its helpers."""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CallOutcome",
    "content_of",
    "finish_reason_of",
    "generated_text",
    "messages_text",
    "note_finish",
    "note_parse_counts",
    "note_reply",
    "reasoning_of",
    "track_calls",
    "track_parse_counts",
    "track_replies",
]


def messages_text(messages: Sequence[dict[str, Any]]) -> str:
    """Every message's content joined by newlines (non-string content as JSON), for token estimates."""
    parts: list[str] = []
    for m in messages:
        content = m.get("content")
        parts.append(content if isinstance(content, str) else json.dumps(content, default=str))
    return "\n".join(parts)


def content_of(response: Any) -> str:
    """The first choice's message content of a LiteLLM response ("" when absent or empty)."""
    try:
        return response.choices[0].message.content or ""
    except (AttributeError, IndexError, TypeError):
        return ""


def reasoning_of(response: Any) -> str:
    """The first choice's ``reasoning_content`` (a reasoning model's thinking; "" when absent).

    LiteLLM puts a provider's reasoning text (DeepSeek/Qwen ``reasoning_content``, llama.cpp's
    ``--reasoning-format``, Anthropic thinking) on the message's ``reasoning_content``.
    """
    try:
        value = response.choices[0].message.reasoning_content
    except (AttributeError, IndexError, TypeError):
        return ""
    return value if isinstance(value, str) else ""


def generated_text(response: Any) -> str:
    """Everything the model generated in the first choice: reasoning text, then content.

    What the output tokens of a reply without usage are estimated from: a reply whose whole text
    came back in ``reasoning_content`` still cost its tokens.
    """
    return "\n".join(t for t in (reasoning_of(response), content_of(response)) if t)


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


def note_finish(response: Any) -> None:
    """Report how ``response`` ended to every :func:`track_calls` block open in this context."""
    sinks = _CALL_SINKS.get()
    if sinks:
        outcome = CallOutcome(finish_reason_of(response), content_of(response))
        for sink in sinks:
            sink.append(outcome)


_REPLY_SINKS: contextvars.ContextVar[tuple[list[str], ...]] = contextvars.ContextVar(
    "kitune_reply_sinks", default=()
)


@contextlib.contextmanager
def track_replies() -> Iterator[list[str]]:
    """Collect every reply text a kitune adapter read inside the block, whatever the LM.

    Yields a list that gets each completion as the adapter received it, before any parsing (a
    :class:`KituneLM` call's text is also in :func:`track_calls`; this sees test doubles and other
    ``dspy.LM`` classes too). Blocks nest; worker threads started with a copy of the context
    report into the same list.
    """
    sink: list[str] = []
    token = _REPLY_SINKS.set((*_REPLY_SINKS.get(), sink))
    try:
        yield sink
    finally:
        _REPLY_SINKS.reset(token)


def note_reply(text: str) -> None:
    """Report a reply a kitune adapter is about to read to every :func:`track_replies` block open here."""
    for sink in _REPLY_SINKS.get():
        sink.append(text)


_PARSE_SINKS: contextvars.ContextVar[tuple[list[dict[str, int]], ...]] = contextvars.ContextVar(
    "kitune_parse_sinks", default=()
)


@contextlib.contextmanager
def track_parse_counts() -> Iterator[list[dict[str, int]]]:
    """Collect the parse counters of every reply a kitune adapter read inside the block.

    Yields a list that gets one ``{counter: n}`` dict per reply read (``surrogates_replaced``,
    ``think_stripped``, ``fence_stripped``, ``records_rejected`` …; empty when nothing was
    repaired), in read order. Blocks nest; worker threads started with a copy of the context
    report into the same list.
    """
    sink: list[dict[str, int]] = []
    token = _PARSE_SINKS.set((*_PARSE_SINKS.get(), sink))
    try:
        yield sink
    finally:
        _PARSE_SINKS.reset(token)


def note_parse_counts(counts: Mapping[str, int]) -> None:
    """Report the parse counters of one reply to every :func:`track_parse_counts` block open here."""
    for sink in _PARSE_SINKS.get():
        sink.append({k: int(v) for k, v in counts.items() if v})
