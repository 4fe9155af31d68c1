"""Role resolution: one role's config + environment → a :class:`ResolvedLM` (no network).

:func:`resolve_role` reads the env vars the config names (base URL, key) and fails with a
:class:`~kitune.errors.ConfigError` naming the variable when one is unset (case L3);
:func:`resolve_offline` is the same resolution for replay, without reading the environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from kitune.config import KituneConfig, LMRoleConfig, Role
from kitune.errors import ConfigError

__all__ = ["LOCAL_KEY", "ResolvedLM", "resolve_offline", "resolve_role"]

# Model prefixes that already mean "an OpenAI-compatible endpoint at api_base"; any other model
# string sent through a gateway is the gateway's own model name and gets ``openai/`` in front.
_GATEWAY_PREFIXES = (
    "openai/",
    "litellm_proxy/",
    "hosted_vllm/",
    "openrouter/",
    "azure/",
    "openai_like/",
    "ollama/",
    "ollama_chat/",
    "lm_studio/",
    "llamafile/",
)
_NO_KEY_PLACEHOLDER = "sk-no-key"
LOCAL_KEY = "sk-local"
"""The key sent to the embedded llama.cpp server (it checks none)."""


@dataclass(frozen=True)
class ResolvedLM:
    """One role's LM after config and environment are resolved (no network involved).

    ``api_key`` is never shown by ``repr``/``str``; use :attr:`masked_key` in messages.
    """

    role: str
    """The role this was resolved for (extract, rewrite, agent, judge, reflection)."""
    model: str
    """LiteLLM model string, e.g. ``openai/gpt-4o-mini``."""
    api_base: str | None
    """Base URL the calls go to; None means the provider's default host (no gateway set)."""
    api_key: str | None = field(repr=False)
    """The key value (secret), or None to let LiteLLM read the provider's own env var."""
    key_env: str | None
    """Name of the env var the key came from (for error messages), or None."""
    base_env: str | None
    """Name of the env var the base URL came from, or None."""
    is_local: bool
    """True for the embedded llama.cpp model (started lazily by :func:`build_lm`)."""
    temperature: float
    """Sampling temperature, 0.0–2.0."""
    max_tokens: int
    """Max output tokens per call."""
    timeout_s: float
    """Per-call timeout in seconds, enforced."""
    num_retries: int
    """Bounded retries for 429, 5xx, timeouts and dropped connections."""

    @property
    def masked_key(self) -> str:
        """``'…abcd'`` (last 4 characters), ``'****'`` for short keys, ``'<none>'`` when unset."""
        if not self.api_key:
            return "<none>"
        return f"…{self.api_key[-4:]}" if len(self.api_key) > 8 else "****"

    @property
    def where(self) -> str:
        """The base URL for messages, or ``'the provider default host'``."""
        return self.api_base or "the provider default host"


def _env_value(var: str, setting: str, what: str) -> str:
    value = os.environ.get(var)
    if not value:
        raise ConfigError(
            f"{var} is not set: {setting} names it as the {what}. Export {var} (e.g. `export {var}=...`) "
            f"or remove {setting} from the config; kitune never falls back to a provider default host."
        )
    return value


def _route_through_gateway(model: str) -> str:
    return model if model.startswith(_GATEWAY_PREFIXES) else f"openai/{model}"


def _role_settings(rc: LMRoleConfig, role: Role) -> dict[str, Any]:
    return {
        "role": role,
        "temperature": rc.temperature,
        "max_tokens": rc.max_tokens,
        "timeout_s": rc.timeout_s,
        "num_retries": rc.num_retries,
    }


def resolve_role(cfg: KituneConfig, role: Role) -> ResolvedLM:
    """Resolve ``role``'s model, base URL and key from the config and the environment.

    Precedence: the role's ``model`` → ``lm.gateway.default_model`` → the embedded local model.
    The role's ``api_base_env``/``api_key_env`` override the gateway's. When a base URL is set,
    the model goes to it as an OpenAI-compatible endpoint: model strings that already start
    with an OpenAI-compatible prefix (``openai/``, ``litellm_proxy/``, ``hosted_vllm/``,
    ``openrouter/``, ``azure/`` …) are kept, any other name (``gpt-4o-mini``,
    ``anthropic/claude-3-5``) is the gateway's model name and becomes ``openai/<name>``.

    Args:
        cfg: the loaded config.
        role: one of :data:`kitune.config.ROLES`.

    Returns:
        The :class:`ResolvedLM`; for the local model ``model`` and ``api_base`` are
        placeholders that :func:`build_lm` fills in once the server is up.

    Raises:
        ConfigError: an env var named by the config is unset or empty (case L3): the message
            starts with ``"<VAR> is not set"`` and names the setting.
    """
    rc = cfg.lm.role(role)
    gw = cfg.lm.gateway
    base_env = rc.api_base_env or gw.base_url_env
    key_env = rc.api_key_env or gw.api_key_env
    base_setting = f"lm.{role}.api_base_env" if rc.api_base_env else "lm.gateway.base_url_env"
    key_setting = f"lm.{role}.api_key_env" if rc.api_key_env else "lm.gateway.api_key_env"
    api_base = _env_value(base_env, base_setting, "base URL").rstrip("/") if base_env else None
    api_key = _env_value(key_env, key_setting, "API key") if key_env else None
    model = rc.model or gw.default_model
    if model is None:
        return ResolvedLM(
            model=f"openai/{cfg.lm.local.model}",
            api_base=None,
            api_key=LOCAL_KEY,
            key_env=None,
            base_env=None,
            is_local=True,
            **_role_settings(rc, role),
        )
    if api_base is not None:
        model = _route_through_gateway(model)
        api_key = api_key or _NO_KEY_PLACEHOLDER
    return ResolvedLM(
        model=model,
        api_base=api_base,
        api_key=api_key,
        key_env=key_env,
        base_env=base_env,
        is_local=False,
        **_role_settings(rc, role),
    )


def resolve_offline(cfg: KituneConfig, role: Role) -> ResolvedLM:
    """:func:`resolve_role` without reading the environment (replay: no key or gateway URL needed).

    The model string is the same as when recording (gateway routing included), so hashes match.
    """
    rc = cfg.lm.role(role)
    gw = cfg.lm.gateway
    model = rc.model or gw.default_model
    if model is None:
        return ResolvedLM(
            model=f"openai/{cfg.lm.local.model}",
            api_base=None,
            api_key=None,
            key_env=None,
            base_env=None,
            is_local=True,
            **_role_settings(rc, role),
        )
    if rc.api_base_env or gw.base_url_env:
        model = _route_through_gateway(model)
    return ResolvedLM(
        model=model,
        api_base=None,
        api_key=None,
        key_env=None,
        base_env=None,
        is_local=False,
        **_role_settings(rc, role),
    )
