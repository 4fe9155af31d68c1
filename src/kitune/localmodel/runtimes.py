"""Which llama.cpp runtime serves the embedded model, and why: native build, prebuilt wheel, fallback.

Three runtimes serve the same GGUF behind the same OpenAI-compatible HTTP API (the llama.cpp
server: parallel slots, continuous batching, prompt cache, ``/health``):

* ``llama-server`` — llama.cpp's server **compiled for this CPU** (AVX-512 where present) by
  ``kitune lm build`` / ``scripts/install_local_model.sh --build-native`` into
  ``$KITUNE_CACHE/bin/<key>/llama-server`` (with ``build.json`` naming the CPU flags it needs).
  Measured faster at reading prompts on an AVX-512 CPU (``benchmarks/results/local_runtimes.md``);
  costs a one-off ~8 min compile on 2 cores.
* ``xllamacpp`` — the prebuilt wheel (``pip install 'kitune[local]'``): llama.cpp's server in a
  Python extension, AVX2/FMA/F16C kernels, no compiler, installs in seconds. What a first run uses.
* ``llama-cpp-python`` — ``python -m llama_cpp.server``, one request at a time (the old fallback).

``lm.local.server: auto`` (the default) takes the fastest one present: a native build whose CPU
flags this CPU has, else the wheel (its CPU needs are checked first, so a CPU without AVX2 gets a
clear error naming ``kitune lm build`` instead of an "Illegal instruction" crash).
:func:`choose_runtime` returns the choice with its reason; the launcher logs both.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kitune.config import LocalModelConfig
from kitune.errors import ConfigError
from kitune.localmodel.gguf import INSTALL_HINT
from kitune.localmodel.weights import cache_dir

__all__ = [
    "BUILD_HINT",
    "LLAMA_SERVER_ENV",
    "WHEEL_CPU_FLAGS",
    "WHEEL_PACKAGE",
    "Runtime",
    "build_native_server",
    "build_script",
    "check_wheel_cpu",
    "choose_runtime",
    "cpu_flags",
    "find_llama_server",
    "find_native_build",
    "wheel_version",
]

LLAMA_SERVER_ENV = "KITUNE_LLAMA_SERVER"
"""Environment variable naming the llama-server executable (overrides the default search)."""

WHEEL_PACKAGE = "xllamacpp"
"""The prebuilt llama.cpp wheel (the ``local`` extra; pinned in ``constraints/``)."""

WHEEL_CPU_FLAGS: tuple[str, ...] = ("ssse3", "pni", "avx", "avx2", "fma", "f16c", "bmi2")
"""``/proc/cpuinfo`` flags the pinned wheel's kernels use (``pni`` is SSE3).

From ``xllamacpp.get_system_info()`` of xllamacpp 2026.10.11549 (``SSE3 SSSE3 AVX AVX2 F16C FMA
BMI2``); ``tests/localmodel_tests/test_runtimes.py`` checks the installed wheel still says so."""

BUILD_HINT = "kitune lm build"
"""The command that compiles llama-server for this CPU into the cache."""


@dataclass(frozen=True)
class Runtime:
    """The runtime the launcher starts.

    Attributes:
        name: ``"llama-server"`` (native build), ``"xllamacpp"`` (prebuilt wheel) or
            ``"llama-cpp-python"``.
        reason: one sentence saying why this one (logged at start and shown by ``kitune lm models``).
        binary: the llama-server executable (``llama-server`` only).
    """

    name: str
    reason: str
    binary: Path | None = None


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The CPU's feature flags from the first ``flags`` line of ``cpuinfo``; None if unreadable."""
    try:
        with cpuinfo.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def wheel_version() -> str | None:
    """The installed xllamacpp version, or None when the wheel is not installed (nothing imported)."""
    if importlib.util.find_spec(WHEEL_PACKAGE) is None:
        return None
    try:
        return importlib.metadata.version(WHEEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_wheel_cpu(flags: frozenset[str] | None) -> None:
    """Raise when the CPU lacks a feature the prebuilt wheel's kernels need.

    Args:
        flags: :func:`cpu_flags` (None: unknown, e.g. not Linux: not checked).

    Raises:
        ConfigError: names the missing flags and the fallback (``kitune lm build``, which compiles
            llama.cpp for this CPU's own features).
    """
    if flags is None:
        return
    missing = [f for f in WHEEL_CPU_FLAGS if f not in flags]
    if missing:
        raise ConfigError(
            f"this CPU lacks {', '.join(missing)}, which the prebuilt llama.cpp wheel ({WHEEL_PACKAGE}) "
            "needs, so it would die with 'Illegal instruction': compile llama-server for this CPU "
            f"instead with `{BUILD_HINT}` (about 8 min on 2 cores; it then serves the model), or use "
            "lm.local.server: llama-cpp-python, or configure a provider (lm.gateway or lm.<role>.model)"
        )


def find_native_build(root: Path | None = None, flags: frozenset[str] | None = None) -> Path | None:
    """The newest cached ``llama-server`` built for a CPU this one covers, or None.

    Looks at ``<root>/bin/*/build.json`` (written by the build script); a build is usable when every
    CPU flag it was compiled for is in ``flags`` (unknown flags: any build).

    Args:
        root: the cache root (default :func:`kitune.localmodel.cache_dir`).
        flags: :func:`cpu_flags` of this machine.
    """
    found: list[tuple[float, Path]] = []
    for meta in sorted((root or cache_dir()).glob("bin/*/build.json")):
        binary = meta.parent / "llama-server"
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            continue
        try:
            needs = set(json.loads(meta.read_text(encoding="utf-8")).get("cpu_flags") or [])
        except (OSError, ValueError, AttributeError):
            continue
        if flags is not None and not needs <= flags:
            continue
        found.append((binary.stat().st_mtime, binary))
    return max(found)[1] if found else None


def find_llama_server(cfg: LocalModelConfig, *, root: Path | None = None) -> Path | None:
    """The native llama-server executable for ``cfg``, or None when there is none.

    Search order: ``lm.local.server_path``; ``$KITUNE_LLAMA_SERVER``; the newest cached build for
    this CPU (:func:`find_native_build`); ``llama-server`` beside the running Python interpreter
    (where earlier install scripts put it, e.g. ``.venv/bin``); ``llama-server`` on ``PATH``.

    Raises:
        ConfigError: ``server_path`` or ``$KITUNE_LLAMA_SERVER`` names a file that is not executable.
    """
    from_env = os.environ.get(LLAMA_SERVER_ENV)
    named = cfg.server_path or (Path(from_env) if from_env else None)
    if named is not None:
        if named.is_file() and os.access(named, os.X_OK):
            return named
        raise ConfigError(
            f"llama-server {named} (from lm.local.server_path or ${LLAMA_SERVER_ENV}) is not an executable "
            f"file: fix the path, or run `{BUILD_HINT}` to compile one into the cache"
        )
    cached = find_native_build(root, cpu_flags())
    if cached is not None:
        return cached
    beside = Path(sys.executable).parent / "llama-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    on_path = shutil.which("llama-server")
    return Path(on_path) if on_path else None


def _llama_cpp_python_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def choose_runtime(
    cfg: LocalModelConfig,
    *,
    native: Callable[[LocalModelConfig], Path | None] = find_llama_server,
    wheel: Callable[[], str | None] = wheel_version,
    flags: Callable[[], frozenset[str] | None] = cpu_flags,
) -> Runtime:
    """Pick the runtime for ``cfg.server`` (``auto``: the fastest present) and say why.

    ``auto``: a native llama-server (:func:`find_llama_server`) when one exists, else the prebuilt
    wheel after its CPU check. ``llama-server`` / ``xllamacpp`` / ``llama-cpp-python``: that one
    or an error.

    Args:
        cfg: the ``lm.local`` section.
        native: finds the native binary (tests pass a fake).
        wheel: the installed wheel's version or None (tests pass a fake).
        flags: the CPU's flags or None (tests pass a fake).

    Raises:
        ConfigError: the chosen runtime is absent or cannot run on this CPU; the message names the
            install command and the fallback.
    """
    if cfg.server == "llama-cpp-python":
        if not _llama_cpp_python_installed():
            raise ConfigError(
                "lm.local.server: llama-cpp-python is not installed: run "
                f"`{INSTALL_HINT} --python-server` (compiles it), or use lm.local.server: auto"
            )
        return Runtime("llama-cpp-python", "lm.local.server: llama-cpp-python (one request at a time)")
    if cfg.server in ("auto", "llama-server"):
        binary = native(cfg)
        if binary is not None:
            why = "lm.local.server: llama-server" if cfg.server == "llama-server" else "auto"
            return Runtime(
                "llama-server",
                f"{why}: a native llama-server compiled for this CPU is present ({binary}); it reads prompts "
                "faster than the prebuilt wheel on AVX-512 CPUs (docs/local-model.md)",
                binary,
            )
        if cfg.server == "llama-server":
            raise ConfigError(
                "lm.local.server: llama-server, but no native llama-server is built: run "
                f"`{BUILD_HINT}` (compiles it for this CPU, about 8 min on 2 cores), set "
                f"${LLAMA_SERVER_ENV}, or use lm.local.server: auto (the prebuilt {WHEEL_PACKAGE} wheel)"
            )
    version = wheel()
    if version is None:
        raise ConfigError(
            f"the embedded local model needs llama.cpp's server: the prebuilt {WHEEL_PACKAGE} wheel is not "
            "installed and no native llama-server is built. Run `pip install 'kitune[local]'` (or "
            f"`{INSTALL_HINT}`, which also installs the model), or compile one with `{BUILD_HINT}`, or "
            "configure a provider (lm.gateway or lm.<role>.model)"
        )
    check_wheel_cpu(flags())
    reason = (
        f"no native llama-server is built (`{BUILD_HINT}` compiles one for this CPU once)"
        if cfg.server == "auto"
        else "lm.local.server: xllamacpp"
    )
    return Runtime(WHEEL_PACKAGE, f"{reason}: prebuilt {WHEEL_PACKAGE} {version} wheel (AVX2 kernels)")


def build_script() -> Path:
    """The packaged build script (``kitune/localmodel/build_llama_server.sh``)."""
    return Path(str(importlib.resources.files("kitune.localmodel") / "build_llama_server.sh"))


def build_native_server(
    *,
    rebuild: bool = False,
    env: Mapping[str, str] | None = None,
    run: Callable[..., subprocess.CompletedProcess[bytes]] = subprocess.run,
) -> Path:
    """Compile llama-server for this CPU into the cache (only when asked: ``kitune lm build``).

    Runs :func:`build_script` with bash (cmake and a C++17 compiler needed; about 8 min on 2 cores;
    a cached build for the same flags is reused unless ``rebuild``); its output goes to the terminal.

    Args:
        rebuild: build again even when cached.
        env: the build's environment (default ``os.environ`` with ``PYTHON`` = this interpreter).
        run: :func:`subprocess.run` (tests pass a fake).

    Returns:
        The built executable (``$KITUNE_CACHE/bin/<key>/llama-server``).

    Raises:
        ConfigError: bash is missing or the build failed (the script's own message says why).
    """
    bash = shutil.which("bash")
    if bash is None:
        raise ConfigError(f"{BUILD_HINT} needs bash, cmake and a C++17 compiler; none found (bash missing)")
    argv = [bash, str(build_script()), *(["--rebuild"] if rebuild else [])]
    full_env = dict(os.environ if env is None else env)
    full_env.setdefault("PYTHON", sys.executable)
    done = run(argv, env=full_env, check=False)
    if done.returncode != 0:
        raise ConfigError(f"compiling llama-server failed (exit {done.returncode}); see the output above")
    binary = find_native_build(
        Path(full_env["KITUNE_CACHE"]) if full_env.get("KITUNE_CACHE") else None, cpu_flags()
    )
    if binary is None:
        raise ConfigError("the build script finished but left no llama-server with build.json in the cache")
    return binary
