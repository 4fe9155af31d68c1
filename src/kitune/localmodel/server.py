"""The llama.cpp server process: command line, start/wait/stop, one shared server per process.

Three runtimes can serve the GGUF (:mod:`kitune.localmodel.runtimes` picks one, ``lm.local.server``,
default ``auto``: the fastest present), each as a child process on ``127.0.0.1`` reached through
LiteLLM as ``openai/<alias>`` with api_key :data:`LOCAL_API_KEY`, with the same port, ``/health``
check, log file and shutdown:

* ``llama-server``: llama.cpp's own HTTP server compiled for this CPU (``kitune lm build``). It
  decodes ``lm.local.parallel`` requests together (continuous batching: a new request joins the
  running batch at the next token), each slot with ``lm.local.n_ctx`` tokens of context and its
  own prompt cache. On a CPU, decoding is memory-bound, so one batched step costs about what one
  sequence's step costs and aggregate throughput grows with the slots in use.
* ``xllamacpp``: the same server from the prebuilt wheel (:mod:`kitune.localmodel.xllamacpp_main`),
  the same parameters; what a first run uses (nothing compiled).
* ``llama-cpp-python``: ``python -m llama_cpp.server``, one request at a time (the old fallback).

All run with ``OMP_WAIT_POLICY=PASSIVE``: with another busy process on a 2-core machine,
spinning OpenMP threads otherwise drop generation from ~10 to ~3 tokens/s. Every started server
is stopped at interpreter exit by an :mod:`atexit` hook registered when the first server starts
(importing this module registers nothing); a child whose parent is killed outright exits by
itself (:func:`guarded_module_command`, :func:`guarded_exec_command`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from kitune.config import LocalModelConfig
from kitune.errors import ConfigError, LMConnectionError
from kitune.localmodel.runtimes import BUILD_HINT, Runtime, choose_runtime
from kitune.localmodel.weights import cache_dir, ensure_gguf

__all__ = [
    "LOCAL_API_KEY",
    "LocalModelServer",
    "build_llama_server_command",
    "build_server_command",
    "build_server_env",
    "build_xllamacpp_command",
    "find_free_port",
    "get_local_server",
    "guarded_exec_command",
    "guarded_module_command",
    "running_local_server",
    "stop_local_server",
]

logger = logging.getLogger("kitune.localmodel")

LOCAL_API_KEY = "sk-local"
"""The API key LiteLLM sends to the local server (which checks none)."""


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


# Runs an executable in a grandchild and ends it when kitune dies (the daemon thread polls
# getppid()) or when this guard is terminated (SIGTERM is forwarded); exits with its exit code.
_EXEC_GUARD = (
    "import os, signal, subprocess, sys, threading, time\n"
    "parent = int(sys.argv[1])\n"
    "child = subprocess.Popen(sys.argv[2:])\n"
    "def stop(*_):\n"
    "    if child.poll() is None:\n"
    "        child.terminate()\n"
    "        try:\n"
    "            child.wait(timeout=10)\n"
    "        except subprocess.TimeoutExpired:\n"
    "            child.kill()\n"
    "    os._exit(0)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "signal.signal(signal.SIGINT, stop)\n"
    "def watch():\n"
    "    while os.getppid() == parent:\n"
    "        time.sleep(0.5)\n"
    "    stop()\n"
    "threading.Thread(target=watch, daemon=True).start()\n"
    "sys.exit(child.wait())\n"
)


def guarded_exec_command(argv: Sequence[str]) -> list[str]:
    """Return argv running the executable ``argv`` so that it also ends when this process dies.

    A small Python guard starts ``argv`` as its own child, forwards SIGTERM/SIGINT to it, ends it
    within ~0.5 s of this process's death (even by SIGKILL) and exits with its exit code.

    Args:
        argv: the executable and its arguments (non-empty).

    Raises:
        ValueError: ``argv`` is empty.
    """
    if not argv:
        raise ValueError("argv must name an executable")
    return [sys.executable, "-c", _EXEC_GUARD, str(os.getpid()), *argv]


def build_llama_server_command(
    cfg: LocalModelConfig, gguf: Path, *, port: int, alias: str, binary: Path
) -> list[str]:
    """Return the argv that serves ``gguf`` with llama.cpp's llama-server on ``127.0.0.1:port``.

    ``lm.local.parallel`` slots, each with ``lm.local.n_ctx`` tokens (so ``--ctx-size`` is their
    product and the KV cache is not unified), continuous batching, prompt caching per slot, the
    GGUF's chat template (jinja), no web UI. Runs under :func:`guarded_exec_command`, so it never
    outlives kitune.

    Args:
        cfg: the ``lm.local`` section (``n_ctx``, ``n_threads``, ``parallel``).
        gguf: the model file.
        port: a TCP port (1–65535).
        alias: the model name clients send (``openai/<alias>`` in LiteLLM).
        binary: the llama-server executable (:func:`kitune.localmodel.runtimes.find_llama_server`).
    """
    threads = str(_threads(cfg))
    argv = [
        str(binary),
        "--model", str(gguf),
        "--alias", alias,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--ctx-size", str(cfg.n_ctx * cfg.parallel),
        "--parallel", str(cfg.parallel),
        "--no-kv-unified",  # each slot owns n_ctx tokens: one long prompt cannot starve the others
        "--cont-batching",
        "--cache-prompt",
        "--cache-ram", "2048",  # MiB of host RAM for prompt prefixes evicted from the slots
        "--threads", threads,
        "--threads-batch", threads,
        "--jinja",
        "--no-webui",
    ]  # fmt: skip
    return guarded_exec_command(argv)


def build_xllamacpp_command(cfg: LocalModelConfig, gguf: Path, *, port: int, alias: str) -> list[str]:
    """Return the argv that serves ``gguf`` with the prebuilt xllamacpp wheel on ``127.0.0.1:port``.

    The same server parameters as :func:`build_llama_server_command` (``parallel`` slots of
    ``n_ctx`` tokens each, no unified KV cache, continuous batching, prompt cache, 2 GiB of
    host-RAM prompt cache, jinja chat template, no web UI), run by
    :mod:`kitune.localmodel.xllamacpp_main` under :func:`guarded_module_command`.

    Args:
        cfg: the ``lm.local`` section (``n_ctx``, ``n_threads``, ``parallel``).
        gguf: the model file.
        port: a TCP port (1–65535).
        alias: the model name clients send (``openai/<alias>`` in LiteLLM).
    """
    args = [
        "--model", str(gguf),
        "--alias", alias,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--ctx-size", str(cfg.n_ctx * cfg.parallel),
        "--parallel", str(cfg.parallel),
        "--threads", str(_threads(cfg)),
        "--cache-ram", "2048",
    ]  # fmt: skip
    return guarded_module_command("kitune.localmodel.xllamacpp_main", args)


def build_server_command(cfg: LocalModelConfig, gguf: Path, *, port: int, alias: str) -> list[str]:
    """Return the argv that serves ``gguf`` with llama-cpp-python on ``127.0.0.1:port``.

    The fallback server (``lm.local.server: llama-cpp-python``): one request at a time. It runs
    under :func:`guarded_module_command`, so it never outlives kitune.

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
        ready_path: str = "/v1/models",
        slots: int = 1,
        runtime: Runtime | None = None,
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
            ready_path: path polled until it answers 200 (``/health`` for llama-server, which
                answers 503 while loading; ``/v1/models`` for llama-cpp-python).
            slots: requests the server decodes at once (>= 1); what callers size their
                concurrency to.
            runtime: which runtime this is and why (logged at start); None for a hand-made command.
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
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.ready_path = ready_path if ready_path.startswith("/") else f"/{ready_path}"
        self.slots = slots
        self.runtime = runtime
        self.startup_timings: dict[str, Any] | None = None
        """llama.cpp's ``timings`` of the start-up probe (:meth:`probe`), or None."""
        self.started_in_s: float | None = None
        """Seconds the last :meth:`start` took until the server answered (None before)."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, cfg: LocalModelConfig) -> LocalModelServer:
        """Build (not start) the server for ``cfg``: runtime, assembled/verified GGUF, port.

        Raises:
            ConfigError: no runtime can serve (see :func:`kitune.localmodel.runtimes.choose_runtime`),
                the model packages are missing, or the GGUF is bad.
        """
        runtime = choose_runtime(cfg)
        gguf = ensure_gguf(cfg)
        alias = cfg.model if cfg.gguf_path is None else gguf.stem
        port = cfg.port or find_free_port()
        log = cache_dir() / "logs" / f"{runtime.name}-{alias}-{port}.log"
        if runtime.name == "llama-server":
            assert runtime.binary is not None
            command = build_llama_server_command(cfg, gguf, port=port, alias=alias, binary=runtime.binary)
            ready_path = "/health"
        elif runtime.name == "xllamacpp":
            command = build_xllamacpp_command(cfg, gguf, port=port, alias=alias)
            ready_path = "/health"
        else:
            command = build_server_command(cfg, gguf, port=port, alias=alias)
            ready_path = "/v1/models"
        return cls(
            command,
            port=port,
            model_alias=alias,
            log_path=log,
            startup_timeout_s=cfg.startup_timeout_s,
            ready_path=ready_path,
            slots=cfg.slots,
            runtime=runtime,
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
            with opener.open(f"http://127.0.0.1:{self.port}{self.ready_path}", timeout=2.0) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    _PROBE_PROMPT = " ".join(["The quick brown fox jumps over the lazy dog."] * 12)

    def probe(self, timeout_s: float = 120.0) -> dict[str, Any] | None:
        """Measure the running server once: a ~130-token prompt, 16 generated tokens (llama.cpp's API).

        Sends ``/completion`` (prompt cache off, ``ignore_eos``) and keeps its ``timings``
        (``prompt_per_second``, ``predicted_per_second`` …) in :attr:`startup_timings`: the rates
        kitune sizes its first timeouts by (:mod:`kitune.lm.timeouts`). Best effort: a server that
        does not answer this way (llama-cpp-python) leaves it None. Costs a few seconds once.
        """
        body = {"prompt": self._PROBE_PROMPT, "n_predict": 16, "cache_prompt": False, "ignore_eos": True}
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/completion",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
        try:
            with opener.open(request, timeout=timeout_s) as resp:
                timings = json.loads(resp.read()).get("timings")
        except (urllib.error.URLError, OSError, ValueError):
            return None
        self.startup_timings = timings if isinstance(timings, dict) else None
        if self.startup_timings:
            logger.info(
                "local model server measured at start: %.1f prompt tokens/s, %.1f generated tokens/s",
                float(self.startup_timings.get("prompt_per_second") or 0),
                float(self.startup_timings.get("predicted_per_second") or 0),
            )
        return self.startup_timings

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
            if self.runtime is not None:
                logger.info(
                    "local model runtime: %s (%s); log %s",
                    self.runtime.name,
                    self.runtime.reason,
                    self.log_path,
                )
            _register_stop_hook()  # before the child exists, so no window leaves it unstopped at exit
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
                        f"{self._log_tail()!r}. If the log shows 'Illegal instruction', the runtime was "
                        f"built for another CPU: compile one for this CPU with `{BUILD_HINT} --rebuild`",
                        model=self.litellm_model,
                        api_base=self.api_base,
                    )
                if self._ready():
                    self.started_in_s = self.startup_timeout_s - (deadline - time.monotonic())
                    return self
                time.sleep(0.2)
            self._stop_locked()
            raise LMConnectionError(
                f"local model server did not answer http://127.0.0.1:{self.port}{self.ready_path} within "
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


_STOP_HOOK_LOCK = threading.Lock()
_stop_hook_registered = False


def _stop_all() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop()


def _register_stop_hook() -> None:
    """Register :func:`_stop_all` with :mod:`atexit` once, when the first server starts.

    Not at import: a process that only reads GGUF headers or lists models gets no exit hook.
    """
    global _stop_hook_registered
    with _STOP_HOOK_LOCK:
        if not _stop_hook_registered:
            atexit.register(_stop_all)
            _stop_hook_registered = True


def _key(cfg: LocalModelConfig) -> tuple[object, ...]:
    return (
        cfg.model,
        str(cfg.gguf_path) if cfg.gguf_path else None,
        cfg.n_ctx,
        _threads(cfg),
        cfg.port,
        cfg.server,
        cfg.slots,
        str(cfg.server_path) if cfg.server_path else None,
    )


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
        if factory is None and server.ready_path == "/health":  # llama.cpp's server: measure it once
            server.probe()
        _SINGLETON = (key, server)
        return server


def running_local_server() -> LocalModelServer | None:
    """This process's local model server if one was started and still runs, else None (starts nothing)."""
    with _SINGLETON_LOCK:
        if _SINGLETON is not None and _SINGLETON[1].is_running():
            return _SINGLETON[1]
    return None


def stop_local_server() -> None:
    """Stop this process's local model server, if any; the next :func:`get_local_server` restarts it."""
    global _SINGLETON
    with _SINGLETON_LOCK:
        if _SINGLETON is not None:
            _SINGLETON[1].stop()
            _SINGLETON = None
