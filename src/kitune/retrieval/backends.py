"""The KI store registry: ``store.type`` → :class:`~kitune.retrieval.base.StoreBackend`.

Built-ins: ``lancedb`` (:mod:`kitune.retrieval.lance`, the embedded default), ``elasticsearch``
(:mod:`kitune.retrieval.elasticsearch`) and ``memory`` (:mod:`kitune.retrieval.memory`,
in-process), each declared by its module's ``PLUGINS`` map. Adding a backend is one module: a
:class:`~kitune.retrieval.base.Store`, a :class:`~kitune.config.StoreSection` subclass with a
``type`` default naming it, and a :func:`register_store_backend` call when the module is
imported; ``store.type: <name>`` then opens it everywhere (serve, context, extract, eval, the
loop). Callers never name a backend: they call :func:`kitune.retrieval.create_store` and
:func:`store_exists`, and read the collection's name as ``cfg.store.collection``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kitune.config import STORE_SECTIONS, register_store_section
from kitune.plugins import Registry
from kitune.retrieval.base import StoreBackend

if TYPE_CHECKING:
    from kitune.config import KituneConfig

__all__ = [
    "STORES",
    "register_store_backend",
    "store_backend",
    "store_exists",
    "store_types",
    "unregister_store_backend",
]

STORES: Registry[StoreBackend] = Registry(
    "store backend",
    modules=("kitune.retrieval.lance", "kitune.retrieval.elasticsearch", "kitune.retrieval.memory"),
    setting="store.type",
)
"""``store.type`` → backend."""


def register_store_backend(backend: StoreBackend, *, replace: bool = False) -> StoreBackend:
    """Register ``backend`` and its config section (so ``store.type: <name>`` validates); returns it.

    Raises:
        ValueError: ``backend.name`` differs from its section's ``type`` default, or is bad or
            taken (see :meth:`kitune.plugins.Registry.register`).
    """
    declared = backend.section.model_fields["type"].default
    if declared != backend.name:
        raise ValueError(
            f"store backend {backend.name!r}: its section {backend.section.__name__} has type "
            f"default {declared!r}; give both the same name"
        )
    STORES.register(backend.name, backend, replace=replace)
    register_store_section(backend.section, replace=replace)
    return backend


def unregister_store_backend(name: str) -> None:
    """Remove a plug-in backend and its config section (tests that added one clean up with this)."""
    STORES.unregister(name)
    STORE_SECTIONS.pop(name, None)


def store_types() -> tuple[str, ...]:
    """Every registered ``store.type``, sorted (``("elasticsearch", "lancedb", "memory")`` plus plug-ins)."""
    return STORES.names()


def store_backend(cfg: KituneConfig) -> StoreBackend:
    """The backend ``cfg.store.type`` names.

    Raises:
        ConfigError: not registered (the message lists the registered types).
    """
    return STORES.get(cfg.store.type)


def store_exists(cfg: KituneConfig) -> bool:
    """True when the KI collection ``cfg.store`` names exists (True when the backend cannot tell).

    Raises:
        ConfigError: unknown ``store.type``.
    """
    return store_backend(cfg).exists(cfg)
