"""Lazy package exports (PEP 562): a package lists its public names without importing them.

Used by the ``__init__`` of packages whose modules pull heavy dependencies (DSPy, MLflow,
LanceDB), so ``import kitune.service`` costs nothing until a name is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: Mapping[str, Any]
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for a package exporting ``exports`` lazily.

    Args:
        package: the package's ``__name__`` (for error messages).
        exports: public name → the module that defines it.
        namespace: the package's ``globals()``.

    Returns:
        ``__all__`` (sorted names), a module ``__getattr__`` that imports a name's module on first
        use (AttributeError for unknown names), and a ``__dir__`` listing both.
    """
    names = sorted(exports)

    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def dir_() -> list[str]:
        return sorted([*namespace, *names])

    return names, getattr_, dir_
