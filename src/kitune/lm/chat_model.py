"""The chat model: :class:`LiteLLMChatModel`, the agent's tool-calling :class:`kitune.chat.ChatModel`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from kitune.chat import ChatMessage, ChatResponse, ToolCall, ToolMode
from kitune.config import KituneConfig, Role
from kitune.errors import ConfigError
from kitune.lm.client import KituneLM, build_lm
from kitune.lm.roles import ResolvedLM
from kitune.usage import TokenLedger

__all__ = ["LiteLLMChatModel"]


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
        # A missing id stays empty: the agent names it, unique in the whole episode (a per-reply
        # "call_0" would repeat in every reply of the history sent back).
        calls = tuple(
            ToolCall(
                id=str(getattr(c, "id", "") or ""),
                name=str(c.function.name or ""),
                arguments=c.function.arguments
                if isinstance(c.function.arguments, str)
                else json.dumps(c.function.arguments),
            )
            for c in getattr(choice.message, "tool_calls", None) or []
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
