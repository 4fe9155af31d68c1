"""The embedded local model: a GGUF shipped on PyPI, served by llama.cpp on 127.0.0.1.

When no provider is configured, kitune serves a small instruct model with llama.cpp's own
HTTP server (parallel slots, continuous batching) in a child process and reaches it through
LiteLLM as ``openai/<alias>`` (api_key ``"sk-local"``), the same path as any OpenAI-compatible
provider: from the prebuilt ``xllamacpp`` wheel on a first run, from a llama-server compiled for
this CPU once ``kitune lm build`` has made one (``lm.local.server``). This package only assembles
the weights and runs the server; :mod:`kitune.lm` builds the calls.

* :mod:`~kitune.localmodel.gguf` — the GGUF header reader (:func:`read_gguf_info`).
* :mod:`~kitune.localmodel.weights` — the pinned chunk packages, assembly into
  ``$KITUNE_CACHE/models`` with SHA-256 and header checks (:func:`ensure_gguf`), install checks.
* :mod:`~kitune.localmodel.runtimes` — which runtime serves and why (:func:`choose_runtime`),
  the wheel's CPU check, the native build (:func:`build_native_server`).
* :mod:`~kitune.localmodel.xllamacpp_main` — the wheel's child process (``python -m``).
* :mod:`~kitune.localmodel.server` — the server process and the per-process singleton
  (:func:`get_local_server`); the :mod:`atexit` stop hook is registered when the first server
  starts, not at import.

The llama.cpp server rejects OpenAI ``response_format: json_schema`` (HTTP 500) but accepts
``{"type": "json_object", "schema": {...}}``.
"""

from __future__ import annotations

from kitune.localmodel.gguf import INSTALL_HINT, GGUFInfo, read_gguf_info
from kitune.localmodel.runtimes import (
    BUILD_HINT,
    LLAMA_SERVER_ENV,
    WHEEL_CPU_FLAGS,
    WHEEL_PACKAGE,
    Runtime,
    build_native_server,
    build_script,
    check_wheel_cpu,
    choose_runtime,
    cpu_flags,
    find_llama_server,
    find_native_build,
    wheel_version,
)
from kitune.localmodel.server import (
    LOCAL_API_KEY,
    LocalModelServer,
    build_llama_server_command,
    build_server_command,
    build_server_env,
    build_xllamacpp_command,
    find_free_port,
    get_local_server,
    guarded_exec_command,
    guarded_module_command,
    running_local_server,
    stop_local_server,
)
from kitune.localmodel.weights import (
    PACKAGED_MODELS,
    PackagedModel,
    cache_dir,
    check_server_installed,
    ensure_gguf,
    is_model_installed,
)

__all__ = [
    "BUILD_HINT",
    "INSTALL_HINT",
    "LLAMA_SERVER_ENV",
    "LOCAL_API_KEY",
    "PACKAGED_MODELS",
    "WHEEL_CPU_FLAGS",
    "WHEEL_PACKAGE",
    "GGUFInfo",
    "LocalModelServer",
    "PackagedModel",
    "Runtime",
    "build_llama_server_command",
    "build_native_server",
    "build_script",
    "build_server_command",
    "build_server_env",
    "build_xllamacpp_command",
    "cache_dir",
    "check_server_installed",
    "check_wheel_cpu",
    "choose_runtime",
    "cpu_flags",
    "ensure_gguf",
    "find_free_port",
    "find_llama_server",
    "find_native_build",
    "get_local_server",
    "guarded_exec_command",
    "guarded_module_command",
    "is_model_installed",
    "read_gguf_info",
    "running_local_server",
    "stop_local_server",
    "wheel_version",
]
