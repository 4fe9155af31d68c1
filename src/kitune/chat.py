"""The chat-model seam used by the eval agent.

The agent loop talks to a :class:`ChatModel`, not to LiteLLM, so tests can drive it with a
scripted model (``kitune.testing.chat.ScriptedChatModel``) and real runs use
``kitune.lm.LiteLLMChatModel``, which goes through the same LM layer (error classification,
timeouts, retries, token ledger) as every other call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["ChatMessage", "ChatModel", "ChatResponse"]

ChatMessage = dict[str, str]
"""``{"role": "system"|"user"|"assistant", "content": str}``."""


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


@runtime_checkable
class ChatModel(Protocol):
    """Something that completes a chat.

    Implementations record every call in their token ledger (if any) and raise
    :class:`kitune.errors.LMError` subclasses for transport failures; a context that does not
    fit raises :class:`kitune.errors.LMContextWindowError`.
    """

    def complete(
        self, messages: Sequence[ChatMessage], *, json_mode: bool = False, max_tokens: int | None = None
    ) -> ChatResponse:
        """Complete ``messages``.

        Args:
            messages: the conversation so far, oldest first.
            json_mode: ask for a single JSON object (``response_format`` json_object where the
                model supports it, prompt-only otherwise).
            max_tokens: cap on output tokens for this call (None: the role's default).

        Raises:
            LMError: a classified transport failure after bounded retries.
        """
        ...
