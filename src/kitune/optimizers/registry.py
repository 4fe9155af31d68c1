"""The optimiser registry: optimisers found by name, each declared by its own file.

:data:`OPTIMIZERS` is a :class:`kitune.plugins.Registry`: a built-in optimiser module declares
``PLUGINS = {"gepa": make_gepa}`` at its end and the registry imports it the first time anyone
asks for a name, so ``optimizer_names()`` always lists ``gepa`` and ``mipro`` without the caller
importing them (and the built-ins never import this module). Any other module — a user's plug-in,
a test — registers when it is imported.

The optimiser registry (this module's functions) builds every optimiser from one
:class:`~kitune.optimizers.budget.OptimizerBudget`::

    @register_optimizer("toy")
    def make_toy(metric, *, reflection_lm, budget, rng, input_tokens=None):
        return ToyOptimizer(metric, calls=budget.max_metric_calls or 4)

``check_optimizer(name)`` is how config and CLI validate a name: a :class:`~kitune.errors.ConfigError`
listing the registered names. (``config.py`` sits at the bottom layer and cannot import this
module, so ``optimize.optimizer`` is a plain string there and is checked here, before any work.)
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

from kitune.plugins import Registry

if TYPE_CHECKING:
    from kitune.optimizers.base import Optimizer
    from kitune.optimizers.budget import OptimizerBudget

__all__ = [
    "OptimizerFactory",
    "check_optimizer",
    "make_optimizer",
    "optimizer_names",
    "register_optimizer",
    "unregister_optimizer",
]


class OptimizerFactory(Protocol):
    """Builds an optimiser from the one budget object.

    Args:
        metric: the program task's feedback metric (``(gold, pred, trace, pred_name,
            pred_trace) -> dspy.Prediction(score, feedback)`` or a float).
        reflection_lm: the ``dspy.LM`` that proposes instructions (the ``reflection`` role).
        budget: metric calls / trials, minutes, threads, reflection window, min proposals.
        rng: the seed source (the factory draws its seed from it).
        input_tokens: tokens spent so far (the token ledger), for token stoppers.
    """

    def __call__(
        self,
        metric: Callable[..., Any],
        *,
        reflection_lm: Any,
        budget: OptimizerBudget,
        rng: random.Random,
        input_tokens: Callable[[], int] | None = None,
    ) -> Optimizer:
        """Return a ready :class:`~kitune.optimizers.base.Optimizer`."""
        ...


OPTIMIZERS: Registry[OptimizerFactory] = Registry(
    "optimizer",
    modules=("kitune.optimizers.gepa", "kitune.optimizers.mipro"),
    setting="optimize.optimizer / --optimizer",
)
"""Optimiser name → factory. Built-ins: ``gepa`` (:mod:`kitune.optimizers.gepa`), ``mipro``."""


F = TypeVar("F", bound=OptimizerFactory)


@overload
def register_optimizer(name: str, factory: F, *, replace: bool = False) -> F: ...


@overload
def register_optimizer(name: str, factory: None = None, *, replace: bool = False) -> Callable[[F], F]: ...


def register_optimizer(name: str, factory: F | None = None, *, replace: bool = False) -> F | Callable[[F], F]:
    """Register an optimiser factory under ``name``; usable as a decorator.

    Args:
        name: what ``--optimizer`` / ``optimize.optimizer`` call it (lower case).
        factory: the :class:`OptimizerFactory`; omit to use as ``@register_optimizer("name")``.
        replace: allow replacing another factory of that name.

    Returns:
        ``factory`` (or the decorator).

    Raises:
        ValueError: bad or taken name (see :meth:`kitune.plugins.Registry.register`).
    """
    if factory is not None:
        OPTIMIZERS.register(name, factory, replace=replace)
        return factory

    def decorate(fn: F) -> F:
        OPTIMIZERS.register(name, fn, replace=replace)
        return fn

    return decorate


def unregister_optimizer(name: str) -> None:
    """Remove an optimiser (tests that registered a toy one clean up with this)."""
    OPTIMIZERS.unregister(name)


def optimizer_names() -> tuple[str, ...]:
    """Every registered optimiser name, sorted (``("gepa", "mipro")`` plus plug-ins)."""
    return OPTIMIZERS.names()


def check_optimizer(name: str) -> str:
    """Validate an optimiser name; returns it.

    Raises:
        ConfigError: not registered (``unknown optimizer 'x' (optimize.optimizer / --optimizer):
            registered optimizers are gepa, mipro``).
    """
    OPTIMIZERS.get(name)
    return name


def make_optimizer(
    name: str,
    metric: Callable[..., Any],
    *,
    reflection_lm: Any,
    budget: OptimizerBudget,
    rng: random.Random,
    input_tokens: Callable[[], int] | None = None,
) -> Optimizer:
    """Build the optimiser registered as ``name`` (see :class:`OptimizerFactory` for the arguments).

    Raises:
        ConfigError: unknown ``name``, or the factory refused the metric, the reflection model or
            the budget (each factory names the setting to change).
    """
    factory = OPTIMIZERS.get(name)
    return factory(metric, reflection_lm=reflection_lm, budget=budget, rng=rng, input_tokens=input_tokens)
