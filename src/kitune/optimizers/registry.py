"""Named plug-ins of the loop: optimisers, found by name, each registered by its own file.

A :class:`Registry` maps a name to an entry (a factory, a task, an improver). Entries register
themselves when their module is imported (``register_optimizer("gepa", make_gepa)`` at the end of
``optimizers/gepa.py``); the registry imports its *built-in* modules the first time anyone asks
for a name, so ``optimizer_names()`` always lists ``gepa`` and ``mipro`` without the caller
importing them. Any other module — a user's plug-in, a test — registers by being imported.

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

import importlib
import pkgutil
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

from kitune.errors import ConfigError

if TYPE_CHECKING:
    from kitune.optimizers.base import Optimizer
    from kitune.optimizers.budget import OptimizerBudget

__all__ = [
    "OptimizerFactory",
    "Registry",
    "check_optimizer",
    "make_optimizer",
    "optimizer_names",
    "register_optimizer",
    "unregister_optimizer",
]

T = TypeVar("T")


class Registry(Generic[T]):
    """Name → entry, filled by the entries' own modules (see the module docstring).

    Args:
        kind: what an entry is, for messages (``"optimizer"``, ``"program"``, ``"improver"``).
        modules: built-in modules imported on first look-up (each registers its entries).
        packages: built-in packages whose every module is imported on first look-up (one file
            per entry: adding a module to the package is all it takes).
        setting: the config key or flag that names an entry, for error messages.
    """

    def __init__(
        self,
        kind: str,
        *,
        modules: Sequence[str] = (),
        packages: Sequence[str] = (),
        setting: str = "",
    ) -> None:
        self.kind = kind
        self.setting = setting
        self._modules = tuple(modules)
        self._packages = tuple(packages)
        self._entries: dict[str, T] = {}
        self._loaded = False
        self._lock = threading.RLock()

    def _load(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            self._loaded = True  # before importing: a built-in module registering itself re-enters
            try:
                for module in self._modules:
                    importlib.import_module(module)
                for package in self._packages:
                    pkg = importlib.import_module(package)
                    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
                        if not info.name.startswith("_"):
                            importlib.import_module(f"{package}.{info.name}")
            except BaseException:
                self._loaded = False  # a failed import is retried (and raises again) next time
                raise

    def register(self, name: str, entry: T, *, replace: bool = False) -> T:
        """Add ``entry`` under ``name``; returns ``entry`` (so it can decorate).

        Re-registering the same object under the same name is a no-op (a module imported twice).

        Raises:
            ValueError: ``name`` is empty or not lower-case ``[a-z0-9_-]``, or already taken by
                another entry and ``replace`` is False.
        """
        if not name or name != name.strip().lower() or not all(c.isalnum() or c in "_-" for c in name):
            raise ValueError(f"{self.kind} name {name!r}: use lower-case letters, digits, '_' or '-'")
        with self._lock:
            old = self._entries.get(name)
            if old is not None and old is not entry and not replace:
                raise ValueError(f"{self.kind} {name!r} is already registered ({old!r})")
            self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove ``name`` (no error when absent); for tests and plug-ins that withdraw."""
        with self._lock:
            self._entries.pop(name, None)

    def names(self) -> tuple[str, ...]:
        """Every registered name, sorted."""
        self._load()
        return tuple(sorted(self._entries))

    def entries(self) -> Iterator[tuple[str, T]]:
        """``(name, entry)`` pairs, sorted by name."""
        self._load()
        return iter(sorted(self._entries.items()))

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def get(self, name: str) -> T:
        """The entry registered as ``name``.

        Raises:
            ConfigError: no such name (the message lists the registered ones and the setting).
        """
        self._load()
        entry = self._entries.get(name)
        if entry is None:
            where = f" ({self.setting})" if self.setting else ""
            raise ConfigError(
                f"unknown {self.kind} {name!r}{where}: registered {self.kind}s are "
                f"{', '.join(self.names()) or '(none)'}"
            )
        return entry

    def check(self, names: Sequence[str], *, setting: str | None = None) -> tuple[str, ...]:
        """Validate several names at once (``--programs a,b``); returns them as a tuple.

        Raises:
            ConfigError: any unknown name, or none given (the message lists the registered ones).
        """
        self._load()
        bad = [n for n in names if n not in self._entries]
        if bad or not names:
            where = setting if setting is not None else self.setting
            raise ConfigError(
                f"unknown {self.kind}(s) {bad or '(none)'}{f' ({where})' if where else ''}: "
                f"choose from {', '.join(self.names())}"
            )
        return tuple(names)


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
        ValueError: bad or taken name (see :meth:`Registry.register`).
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
