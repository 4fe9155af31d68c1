"""``ScriptedChatModel``: a deterministic :class:`kitune.chat.ChatModel` for agent-loop tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kitune.chat import ChatMessage, ChatResponse
from kitune.errors import HarnessError

__all__ = ["ScriptExhaustedError", "ScriptedCall", "ScriptedChatModel", "Turn"]

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


class ScriptedChatModel:
    """Replies from a queue of turns, reporting fixed usage per call.

    Args:
        turns: consumed in order, one per ``complete`` call. A ``str`` becomes the reply text; a
            ``ChatResponse`` is returned as is; an exception instance is raised (after being
            recorded as a call); a callable gets the messages and returns either.
        usage: ``(input_tokens, output_tokens)`` reported for every text/callable reply.

    Attributes:
        calls: every call received, in order (including ones that raised).

    Raises:
        ScriptExhaustedError: from ``complete`` when no turns are left.
    """

    def __init__(
        self, turns: Sequence[Turn], *, usage: tuple[int, int] = (100, 10), model: str = "scripted"
    ) -> None:
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
        self, messages: Sequence[ChatMessage], *, json_mode: bool = False, max_tokens: int | None = None
    ) -> ChatResponse:
        """Return the next scripted reply (see the class docstring)."""
        copied = [dict(m) for m in messages]
        with self._lock:
            self.calls.append(ScriptedCall(copied, json_mode, max_tokens))
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
