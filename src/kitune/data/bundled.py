"""The data and config that ship inside the kitune package: the demo's fixture and ``demo.yaml``.

``kitune demo`` (and the README's walk-throughs) read these by default, so a clone on its own or
a ``pip install`` runs the main command with nothing beside it. They live in
``kitune/resources/`` and are read with :mod:`importlib.resources`:

* ``fixture/`` — 24 multi-hop questions (MuSiQue CC BY 4.0, HotpotQA CC BY-SA 4.0), 144
  paragraphs, 104 KB; byte for byte the project's ``../shared/data/fixture``
  (``tests/data_tests/test_bundled.py``). Attribution: ``resources/ATTRIBUTION.md``.
* ``demo.yaml`` — the demo's settings.

The larger sets (``dev/``: 100 questions, 7,568 paragraphs; ``locomo/``) are not packaged: they
live in the project's shared data folder (``../shared/data/`` beside a checkout), and
:func:`missing_data_message` says so when a command is pointed at one that is absent.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

__all__ = ["SHARED_DATA_HINT", "missing_data_message", "packaged_demo_config", "packaged_fixture"]

SHARED_DATA_HINT = (
    "the dev and LoCoMo sets are not packaged: they come from the kitune project's shared data folder "
    "(../shared/data beside the checkout: subsets of MuSiQue, HotpotQA, 2WikiMultihopQA and LoCoMo, see "
    "its README); the 24-question fixture ships with kitune (kitune demo --print-fixture prints its path)"
)
"""Where the unpackaged data sets come from (appended to a missing-path error)."""


def _resource(*parts: str) -> Path:
    """A file or folder under ``kitune/resources`` as a filesystem path (kitune is never zip-imported)."""
    return Path(str(importlib.resources.files("kitune").joinpath("resources", *parts)))


def packaged_fixture() -> Path:
    """The demo's fixture folder inside the installed package (BrowseComp-Plus layout)."""
    return _resource("fixture")


def packaged_demo_config() -> Path:
    """The demo's ``demo.yaml`` inside the installed package."""
    return _resource("demo.yaml")


def missing_data_message(path: Path) -> str:
    """The error for a data folder that does not exist, naming where the data comes from.

    Args:
        path: the folder a command was given (or defaulted to).
    """
    return f"data path {path} does not exist: pass --data DIR; {SHARED_DATA_HINT}"
