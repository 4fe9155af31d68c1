"""Named plug-ins: :class:`Registry`, name → entry, with built-ins found by module attribute.

Every extension point of kitune (optimisers, program tasks, improvers, KI store backends) is one
:class:`Registry`. A *built-in* entry is declared by its own module as a module-level
``PLUGINS = {"name": entry}``; the registry imports its built-in modules (``modules=``, or every
module of ``packages=``) the first time anyone asks for a name and registers what their
``PLUGINS`` hold. A built-in module therefore never imports the registry that lists it, so the
strings a registry names add no import cycle (``tests/test_layering.py`` counts them as imports).
Any other module — a user's plug-in, a test — registers by calling :meth:`Registry.register`
(through the extension point's ``register_*`` function) when it is imported.

This module sits at the bottom layer so a registry can live in any package.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import ModuleType
from typing import Generic, TypeVar

from kitune.errors import ConfigError

__all__ = ["PLUGINS_ATTRIBUTE", "Registry"]

PLUGINS_ATTRIBUTE = "PLUGINS"
"""The module attribute a built-in module declares its entries in (``{name: entry}``)."""

T = TypeVar("T")


class Registry(Generic[T]):
    """Name → entry, filled by the entries' own modules (see the module docstring).

    Args:
        kind: what an entry is, for messages (``"optimizer"``, ``"program"``, ``"improver"``).
        modules: built-in modules imported on first look-up; each declares its entries in
            ``PLUGINS`` (see the module docstring).
        packages: built-in packages whose every module is imported on first look-up (one file
            per entry: adding a module with a ``PLUGINS`` map to the package is all it takes).
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
                    self._adopt(importlib.import_module(module))
                for package in self._packages:
                    pkg = importlib.import_module(package)
                    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
                        if not info.name.startswith("_"):
                            self._adopt(importlib.import_module(f"{package}.{info.name}"))
            except BaseException:
                self._loaded = False  # a failed import is retried (and raises again) next time
                raise

    def _adopt(self, module: ModuleType) -> None:
        """Register the entries a built-in module declares in its ``PLUGINS`` map."""
        declared: Mapping[str, T] = getattr(module, PLUGINS_ATTRIBUTE, {})
        for name, entry in declared.items():
            self.register(name, entry)

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
