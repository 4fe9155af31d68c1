"""Packaged prompt texts (``kitune/prompts/<name>.txt``) as versioned artefacts.

A prompt version is ``"<name>@<sha8>"``: the program name plus the first 8 hex characters of the
SHA-256 of the instruction text (UTF-8, surrounding whitespace stripped). The same text always
has the same version, so a KI's ``prompt_version`` names exactly the instruction that produced
it, whether packaged or rewritten by an optimiser (see :func:`instruction_version`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from kitune.errors import ConfigError

__all__ = [
    "Instruction",
    "available_instructions",
    "instruction_version",
    "load_instruction",
    "prompt_name",
    "resolve_instruction",
]

_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]*$")


@dataclass(frozen=True)
class Instruction:
    """One instruction text and its content-hash version."""

    name: str
    """Program name, e.g. ``"extractor"``."""
    text: str
    """The instruction, surrounding whitespace stripped."""
    version: str
    """``"<name>@<sha8>"``."""


def instruction_version(name: str, text: str) -> str:
    """Return ``"<name>@<sha8>"`` for ``text`` (whitespace at both ends ignored). Deterministic."""
    digest = hashlib.sha256(text.strip().encode("utf-8")).hexdigest()[:8]
    return f"{name}@{digest}"


def available_instructions() -> list[str]:
    """Names of the packaged prompts, sorted."""
    folder = resources.files("kitune").joinpath("prompts")
    return sorted(p.name[: -len(".txt")] for p in folder.iterdir() if p.name.endswith(".txt"))


def load_instruction(name: str) -> Instruction:
    """Load the packaged prompt ``kitune/prompts/<name>.txt``.

    Args:
        name: lowercase program name (``a-z0-9_-``), e.g. ``"extractor"``.

    Returns:
        The :class:`Instruction` with its text and version.

    Raises:
        ValueError: ``name`` is not a plain lowercase name (no paths).
        ConfigError: no such packaged prompt; the message lists the available ones.
    """
    if not _NAME_RE.match(name):
        raise ValueError(f"instruction name {name!r} must match [a-z][a-z0-9_-]* (no paths or extensions)")
    resource = resources.files("kitune").joinpath("prompts", f"{name}.txt")
    if not resource.is_file():
        raise ConfigError(
            f"no packaged prompt {name!r}: expected kitune/prompts/{name}.txt; available: "
            f"{', '.join(available_instructions()) or 'none'}"
        )
    text = resource.read_text(encoding="utf-8").strip()
    return Instruction(name=name, text=text, version=instruction_version(name, text))


def resolve_instruction(name: str, instructions: str | None) -> tuple[str, str]:
    """The instruction a program starts from and its version.

    Args:
        name: the program name, e.g. ``"judge"``.
        instructions: the caller's text (used as given), or None for the packaged prompt.

    Returns:
        ``(text, "<name>@<sha8>")``.

    Raises:
        ValueError, ConfigError: as :func:`load_instruction`, when ``instructions`` is None.
    """
    if instructions is None:
        loaded = load_instruction(name)
        return loaded.text, loaded.version
    return instructions, instruction_version(name, instructions)


_NAME_BAD = re.compile(r"[^A-Za-z0-9_.\-]+")
"""Characters MLflow does not allow in a prompt name."""


def prompt_name(corpus: str, program: str) -> str:
    """The registry name of ``program``'s prompt for ``corpus``: ``kitune-<corpus>-<program>``.

    Characters outside ``[A-Za-z0-9_.-]`` (MLflow's prompt-name rule) become ``-``; case is
    lowered. Deterministic.

    Raises:
        ValueError: ``corpus`` or ``program`` is empty after sanitising.
    """
    parts = []
    for label, value in (("corpus", corpus), ("program", program)):
        clean = _NAME_BAD.sub("-", value.strip().lower()).strip("-.")
        if not clean:
            raise ValueError(f"{label} name {value!r} has no usable characters for a prompt name")
        parts.append(clean)
    return f"kitune-{parts[0]}-{parts[1]}"
