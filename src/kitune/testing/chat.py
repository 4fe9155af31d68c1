"""``ScriptedChatModel``: a deterministic :class:`kitune.chat.ChatModel` for agent-loop tests.

:func:`native_turn` turns a JSON-protocol reply (``{"tool": ..., "args": ...}`` or
``{"answer": {...}}``) into the equivalent native function-call response, so one script can
drive an episode in both tool modes.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kitune.chat import ChatMessage, ChatResponse, ToolCall, ToolMode
from kitune.errors import HarnessError

__all__ = ["ScriptExhaustedError", "ScriptedCall", "ScriptedChatModel", "Turn", "native_turn"]

Turn = str | ChatResponse | BaseException | Callable[[list[ChatMessage]], "str | ChatResponse"]
"""A reply text, a full response, an exception to raise, or a function of the messages."""


class ScriptExhaustedError(HarnessError):
    """The script ran out of turns: the code under test made more calls than scripted."""


@dataclass(frozen=True)
class ScriptedCall:
    """One call the model received."""

    messages: list[ChatMessage]
    """A copy of the messages, oldest first."""
    json_mode: bool
    max_tokens: int | None
    tools: list[dict[str, Any]] | None = None
    """Function schemas sent (native mode), else None."""
    tool_choice: str | dict[str, Any] | None = None


def native_turn(
    text: str, *, call_id: str = "call_1", usage: tuple[int, int] = (100, 10), model: str = "scripted"
) -> ChatResponse:
    """The native-mode response equivalent to the JSON-protocol reply ``text``.

    ``{"tool": name, "args": {...}}`` becomes a call of ``name``; ``{"answer": {...}}`` a call of
    the ``answer`` function with those arguments; anything else stays a text reply.
    """
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        obj = None
    call: ToolCall | None = None
    if isinstance(obj, dict) and isinstance(obj.get("answer"), dict):
        call = ToolCall(call_id, "answer", json.dumps(obj["answer"]))
    elif isinstance(obj, dict) and isinstance(obj.get("tool"), str):
        call = ToolCall(call_id, obj["tool"], json.dumps(obj.get("args", {})))
    return ChatResponse(
        text="" if call else text,
        input_tokens=usage[0],
        output_tokens=usage[1],
        finish_reason="tool_calls" if call else "stop",
        model=model,
        tool_calls=(call,) if call else (),
    )


class ScriptedChatModel:
    """Replies from a queue of turns, reporting fixed usage per call.

    Args:
        turns: consumed in order, one per ``complete`` call. A ``str`` becomes the reply text; a
            ``ChatResponse`` is returned as is; an exception instance is raised (after being
            recorded as a call); a callable gets the messages and returns either.
        usage: ``(input_tokens, output_tokens)`` reported for every text/callable reply.
        tool_mode: exposed as ``tool_mode`` (the agent's default mode); None: JSON mode.

    Attributes:
        calls: every call received, in order (including ones that raised).

    Raises:
        ScriptExhaustedError: from ``complete`` when no turns are left.
    """

    def __init__(
        self,
        turns: Sequence[Turn],
        *,
        usage: tuple[int, int] = (100, 10),
        model: str = "scripted",
        tool_mode: ToolMode | None = None,
    ) -> None:
        self.tool_mode = tool_mode
        self._turns = list(turns)
        self.usage = usage
        self.model = model
        self.calls: list[ScriptedCall] = []
        self._lock = threading.Lock()

    @property
    def remaining(self) -> int:
        """Turns not yet consumed."""
        return len(self._turns)

    def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        json_mode: bool = False,
        max_tokens: int | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
    ) -> ChatResponse:
        """Return the next scripted reply (see the class docstring)."""
        copied = [dict(m) for m in messages]
        with self._lock:
            sent = [dict(t) for t in tools] if tools is not None else None
            self.calls.append(ScriptedCall(copied, json_mode, max_tokens, sent, tool_choice))
            if not self._turns:
                raise ScriptExhaustedError(
                    f"ScriptedChatModel: no turns left after {len(self.calls) - 1} call(s)"
                )
            turn = self._turns.pop(0)
        if isinstance(turn, BaseException):
            raise turn
        if callable(turn):
            turn = turn(copied)
        if isinstance(turn, ChatResponse):
            return turn
        return ChatResponse(
            text=str(turn),
            input_tokens=self.usage[0],
            output_tokens=self.usage[1],
            finish_reason="stop",
            model=self.model,
        )
