"""The service side of the improve step: the optimisers' budget and what the reflection model is.

The improve step itself is a fold over improvers in :mod:`kitune.optimizers.improvers` (prompt
optimisation, knob tuning, disambiguation feedback), which see the environment through
:class:`kitune.optimizers.improve_env.ImproveEnv`. What needs the config, the environment
variables or the network lives here:

* :func:`optimizer_budget` — the loop's :class:`~kitune.optimizers.budget.OptimizerBudget`;
* :func:`reflection_context_tokens` / :func:`server_context_window` — the reflection model's
  context window (config, the embedded model, LiteLLM's table, else the server's own report);
* :func:`reflection_fallback` — the warning when no reflection model is configured.
"""

from __future__ import annotations

from typing import Any, Protocol

import httpx

from kitune.config import KituneConfig
from kitune.errors import ConfigError
from kitune.lm import resolve_role
from kitune.optimizers.budget import OptimizerBudget
from kitune.service.tuning.options import OptimizeOptions

__all__ = [
    "BudgetEnv",
    "optimizer_budget",
    "reflection_context_tokens",
    "reflection_fallback",
    "server_context_window",
]


class BudgetEnv(Protocol):
    """What :func:`optimizer_budget` reads from the loop environment (``ServiceLoopEnv`` has it)."""

    @property
    def cfg(self) -> KituneConfig:
        """The configuration (``optimize.*``, ``lm.reflection.max_tokens``, the optimiser concurrency)."""
        ...

    @property
    def opts(self) -> OptimizeOptions:
        """The command's options (``max_metric_calls``, ``budget_minutes``)."""
        ...

    def reflection_window(self) -> int | None:
        """The reflection model's context window in tokens (asked once), or None when unknown."""
        ...


def optimizer_budget(env: BudgetEnv) -> OptimizerBudget:
    """The loop's :class:`~kitune.optimizers.budget.OptimizerBudget`, from the options and the config.

    ``max_metric_calls`` from the command (``--max-metric-calls``), else
    ``optimize.max_metric_calls`` (both unset: sized by the optimiser to ``optimize.min_proposals``
    proposals); ``minutes`` from ``--budget-minutes``; ``threads`` =
    ``cfg.concurrency_for("optimizer")`` (parallel metric calls: the embedded server's slots, or
    ``agent.concurrency`` when set); ``max_input_tokens`` from ``optimize.max_input_tokens``; the
    reflection window (:func:`reflection_context_tokens`,
    asked once per environment) and reply cap (``lm.reflection.max_tokens``).
    """
    o = env.cfg.optimize
    return OptimizerBudget(
        max_metric_calls=env.opts.max_metric_calls
        if env.opts.max_metric_calls is not None
        else o.max_metric_calls,
        minutes=env.opts.budget_minutes,
        threads=env.cfg.concurrency_for("optimizer"),
        min_proposals=o.min_proposals,
        max_input_tokens=o.max_input_tokens,
        reflection_context_tokens=env.reflection_window(),
        reflection_max_tokens=env.cfg.lm.reflection.max_tokens,
    )


def reflection_context_tokens(cfg: KituneConfig, *, client: httpx.Client | None = None) -> int | None:
    """The reflection model's context window in tokens, or None when nothing reports it.

    None is not "unbounded": the optimiser then sizes reflection prompts to
    :data:`kitune.optimizers.gepa.DEFAULT_REFLECTION_CONTEXT_TOKENS` (8,192 tokens), and a
    provider's context-overflow error halves the prompt for the retry and every later step
    (:class:`kitune.optimizers.gepa.SizedInstructionProposer`).

    In order: ``optimize.reflection_context_tokens`` when set; ``lm.local.n_ctx`` for the embedded
    model (each llama-server slot gets that many tokens); LiteLLM's model table
    (``max_input_tokens``); else what the server itself reports (:func:`server_context_window`:
    llama-server's ``/props``, vLLM's or llama-server's ``/models``). With ``lm.replay_dir`` set
    the server is not asked (a replay contacts nothing).

    Args:
        cfg: the configuration.
        client: the HTTP client for the server probe (tests pass one with a mock transport).
    """
    explicit = cfg.optimize.reflection_context_tokens
    if explicit is not None:
        return int(explicit)
    if cfg.uses_local_model("reflection"):
        return int(cfg.lm.local.n_ctx)
    model = cfg.lm.reflection.model or cfg.lm.gateway.default_model
    if not model:
        return None
    try:
        import litellm

        info = litellm.get_model_info(model)
        window = info.get("max_input_tokens") or info.get("max_tokens")
        if window:
            return int(window)
    except Exception:  # not in LiteLLM's table: ask the server
        pass
    if cfg.lm.replay_dir is not None:
        return None

    try:
        base = resolve_role(cfg, "reflection").api_base
    except ConfigError:
        return None
    return server_context_window(base, client=client) if base else None


def server_context_window(
    base_url: str, *, client: httpx.Client | None = None, timeout_s: float = 5.0
) -> int | None:
    """The per-request context window an OpenAI-compatible server reports, or None.

    Asks ``<root>/props`` (llama-server: ``default_generation_settings.n_ctx``, the per-slot
    window) and then ``<base>/models`` (vLLM: ``max_model_len``; llama-server:
    ``meta.n_ctx_train``). Any failure (no such path, not JSON, unreachable) reads as unknown.

    Args:
        base_url: the role's base URL, e.g. ``http://127.0.0.1:8080/v1``.
        client: an ``httpx.Client`` (default: a new one with ``timeout_s``).
        timeout_s: per request.

    Returns:
        Tokens, ≥ 1, or None.
    """
    base = base_url.rstrip("/")
    root = base[: -len("/v1")] if base.endswith("/v1") else base
    http = client or httpx.Client(timeout=timeout_s)
    try:
        for url, read in ((f"{root}/props", _props_window), (f"{base}/models", _models_window)):
            try:
                resp = http.get(url)
                if resp.status_code == 200:
                    window = read(resp.json())
                    if window:
                        return window
            except (httpx.HTTPError, ValueError):
                continue
        return None
    finally:
        if client is None:
            http.close()


def _positive(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and value >= 1 else None


def _props_window(body: Any) -> int | None:
    if not isinstance(body, dict):
        return None
    settings = body.get("default_generation_settings")
    if isinstance(settings, dict) and _positive(settings.get("n_ctx")):
        return _positive(settings.get("n_ctx"))
    return _positive(body.get("n_ctx"))


def _models_window(body: Any) -> int | None:
    data = body.get("data") if isinstance(body, dict) else None
    for entry in data if isinstance(data, list) else []:
        if not isinstance(entry, dict):
            continue
        meta = entry.get("meta")
        window = _positive(entry.get("max_model_len")) or (
            _positive(meta.get("n_ctx_train")) if isinstance(meta, dict) else None
        )
        if window:
            return window
    return None


def reflection_fallback(cfg: KituneConfig) -> str | None:
    """The warning when no reflection model is configured, else None.

    Without ``lm.reflection.model`` the ``reflection`` role resolves like every other role (the
    gateway's ``default_model``, else the embedded model), so the optimisers reflect with the
    model the tasks run on. That is a documented fallback, not an error (the embedded set-up has
    one model): the loop logs this warning once and notes it in every iteration's ``improve.json``.
    """
    if cfg.lm.reflection.model is not None:
        return None
    label = cfg.lm.model_label("reflection")
    same = [r for r in ("extract", "rewrite") if cfg.lm.model_label(r) == label]
    shared = f", the same model as the {' and '.join(same)} task(s)" if same else ""
    return (
        f"no reflection model configured (lm.reflection.model): the optimisers reflect with {label}{shared}; "
        "set lm.reflection.model to a stronger model for better proposals"
    )
