"""The child process serving the GGUF with the prebuilt xllamacpp wheel (``python -m`` this module).

``xllamacpp.Server(CommonParams)`` starts llama.cpp's own HTTP server (the same code as
``llama-server``: ``/health``, ``/v1/chat/completions``, slots, continuous batching) on threads of
the process that builds it, so kitune runs it in a child (under
:func:`kitune.localmodel.server.guarded_module_command`): the same port, health check, log file and
shutdown as the native binary. The arguments mirror llama-server's (see
:func:`kitune.localmodel.server.build_xllamacpp_command`); SIGTERM/SIGINT end it.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["build_params", "main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kitune.localmodel.xllamacpp_main")
    p.add_argument("--model", required=True)
    p.add_argument("--alias", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ctx-size", type=int, required=True, help="total: slots x per-slot context")
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--cache-ram", type=int, default=2048, help="MiB of host RAM for evicted prompt prefixes")
    return p


def build_params(xlc: Any, args: argparse.Namespace) -> Any:
    """``xllamacpp.CommonParams`` equal to kitune's llama-server command line.

    Args:
        xlc: the imported ``xllamacpp`` module.
        args: the parsed arguments of :func:`main`.
    """
    params = xlc.CommonParams()
    params.model.path = args.model
    params.model_alias = {args.alias}
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx_size
    params.n_parallel = args.parallel
    params.kv_unified = False  # each slot owns n_ctx tokens, as --no-kv-unified
    params.cont_batching = True
    params.cache_prompt = True
    params.cache_ram_mib = args.cache_ram
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.use_jinja = True
    params.ui = False
    params.endpoint_metrics = True
    return params


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit code (0)."""
    args = _parser().parse_args(argv)
    import xllamacpp as xlc  # heavy native extension: imported only in the child

    print(f"kitune: xllamacpp {xlc.__version__}: {xlc.get_system_info().strip()}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = xlc.Server(build_params(xlc, args))
    print(f"kitune: xllamacpp serving {args.alias} at {server.listening_address}", flush=True)
    while not stop.wait(1.0):
        pass
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
