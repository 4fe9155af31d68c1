"""The chat-model seam used by the eval agent.

The agent loop talks to a :class:`ChatModel`, not to LiteLLM, so tests can drive it with a
scripted model (``kitune.testing.chat.ScriptedChatModel``) and real runs use
``kitune.lm.LiteLLMChatModel``, which goes through the same LM layer (error classification,
timeouts, retries, token ledger) as every other call.

Two tool-calling modes (:data:`ToolMode`): ``json`` — the model writes one JSON object per turn
in its text (works with any model, including the embedded 1.5B one); ``native`` — tools are
sent as OpenAI-style function schemas (``tools=``) and the model answers with
:class:`ToolCall` s, for models that support function calling. A model object may expose a
``tool_mode`` attribute; the agent uses it unless told otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = ["ChatMessage", "ChatModel", "ChatResponse", "ToolCall", "ToolMode"]

ChatMessage = dict[str, Any]
"""``{"role": "system"|"user"|"assistant", "content": str}``; in native tool mode also
``{"role": "assistant", "content": str | None, "tool_calls": [...]}`` and
``{"role": "tool", "tool_call_id": str, "content": str}`` (OpenAI chat format)."""

ToolMode = Literal["json", "native"]
"""How the agent talks tools with the model: JSON in text, or native function calling."""


@dataclass(frozen=True)
class ToolCall:
    """One native function call the model made."""

    id: str
    """The provider's call id (answered by a ``role="tool"`` message with this ``tool_call_id``);
    empty when the provider sent none (the agent then names it)."""
    name: str
    """The function name."""
    arguments: str
    """The arguments as the model wrote them: a JSON object as text (may be malformed)."""

    def to_message(self) -> dict[str, Any]:
        """The OpenAI ``tool_calls`` entry for an assistant message."""
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


@dataclass(frozen=True)
class ChatResponse:
    """One completion."""

    text: str
    """The assistant message content (never None; may be empty only with an error raised instead)."""
    input_tokens: int
    """Prompt tokens from the provider's usage (estimated when ``estimated``)."""
    output_tokens: int
    """Completion tokens from the provider's usage (estimated when ``estimated``)."""
    estimated: bool = False
    """True when the provider returned no usage and tokens were estimated."""
    finish_reason: str | None = None
    """``"stop"``, ``"length"`` (truncated), … as reported."""
    model: str = ""
    """The model that answered."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Native function calls (only when ``tools`` were sent), in the model's order."""
    latency_s: float | None = None
    """The call's wall time in seconds as stored by ``--record``/``--replay`` (None: the caller measures)."""


@runtime_checkable
class ChatModel(Protocol):
    """Something that completes a chat.

    Implementations record every call in their token ledger (if any) and raise
    :class:`kitune.errors.LMError` subclasses for transport failures; a context that does not
    fit raises :class:`kitune.errors.LMContextWindowError`.
    """

    def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        json_mode: bool = False,
        max_tokens: int | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
    ) -> ChatResponse:
        """Complete ``messages``.

        Args:
            messages: the conversation so far, oldest first.
            json_mode: ask for a single JSON object (``response_format`` json_object where the
                model supports it, prompt-only otherwise).
            max_tokens: cap on output tokens for this call (None: the role's default).
            tools: OpenAI function schemas (native tool mode only; callers in JSON mode never
                pass it, so JSON-only implementations may omit the parameter).
            tool_choice: ``"auto"``, ``"required"`` or ``{"type": "function", "function":
                {"name": ...}}`` to force one function (None: the provider default).

        Raises:
            LMError: a classified transport failure after bounded retries.
        """
        ...
