"""LocalModelServer start/wait/stop against a fake server, the command line, the singleton."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from kitune import localmodel
from kitune.config import LocalModelConfig
from kitune.errors import ConfigError, LMConnectionError
from kitune.localmodel import (
    LocalModelServer,
    build_server_command,
    build_server_env,
    find_free_port,
    get_local_server,
    stop_local_server,
)
from localmodel_tests.helpers import fake_command, gone


def test_find_free_port_is_bindable() -> None:
    port = find_free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_server_command_and_env_from_config(tmp_path: Path) -> None:
    cfg = LocalModelConfig(n_ctx=4096, n_threads=2)
    argv = build_server_command(cfg, tmp_path / "m.gguf", port=12345, alias="qwen2.5-coder-1.5b")
    assert argv[1] == "-c" and argv[3:5] == [str(os.getpid()), "llama_cpp.server"]
    pairs = dict(zip(argv[5::2], argv[6::2], strict=True))
    assert pairs == {
        "--model": str(tmp_path / "m.gguf"),
        "--model_alias": "qwen2.5-coder-1.5b",
        "--host": "127.0.0.1",
        "--port": "12345",
        "--n_ctx": "4096",
        "--n_threads": "2",
        "--n_threads_batch": "2",
        "--interrupt_requests": "False",
        "--logits_all": "False",
        "--verbose": "True",
    }
    default_threads = build_server_command(LocalModelConfig(), tmp_path / "m.gguf", port=1, alias="a")
    assert default_threads[default_threads.index("--n_threads") + 1] == str(os.cpu_count())
    env = build_server_env({"PATH": "/bin", "OMP_WAIT_POLICY": "ACTIVE"})
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert env["PATH"] == "/bin"


def _server(script: Path, tmp_path: Path, *flags: str, timeout_s: float = 20.0) -> LocalModelServer:
    port = find_free_port()
    return LocalModelServer(
        fake_command(script, port, *flags),
        port=port,
        model_alias="fake-alias",
        log_path=tmp_path / "srv.log",
        startup_timeout_s=timeout_s,
        stop_timeout_s=1.0,
    )


def test_start_waits_for_models_endpoint_and_stop_ends_the_process(
    fake_server_script: Path, tmp_path: Path
) -> None:
    import urllib.request

    with _server(fake_server_script, tmp_path) as server:
        assert server.is_running()
        assert server.api_base == f"http://127.0.0.1:{server.port}/v1"
        assert server.litellm_model == "openai/fake-alias"
        with urllib.request.urlopen(f"{server.api_base}/models", timeout=5) as resp:
            assert b"fake-alias" in resp.read()
        pid = server.pid
        assert pid is not None
        assert server.start() is server  # no-op while running
        assert server.pid == pid
    assert not server.is_running()
    assert gone(pid)
    assert "fake: listening" in (tmp_path / "srv.log").read_text()
    server.stop()  # idempotent


def test_stop_kills_a_process_that_ignores_sigterm(fake_server_script: Path, tmp_path: Path) -> None:
    server = _server(fake_server_script, tmp_path, "--ignore-term").start()
    proc = server._proc
    assert proc is not None
    server.stop()
    assert proc.returncode == -9
    assert gone(proc.pid)


def test_crash_during_startup_raises_with_log_tail(fake_server_script: Path, tmp_path: Path) -> None:
    server = _server(fake_server_script, tmp_path, "--exit-now")
    with pytest.raises(LMConnectionError, match=r"exited with code 3 .*Illegal instruction.*--rebuild"):
        server.start()
    assert not server.is_running()


def test_startup_timeout_raises_and_kills(fake_server_script: Path, tmp_path: Path) -> None:
    server = _server(fake_server_script, tmp_path, "--no-listen", timeout_s=1.0)
    with pytest.raises(LMConnectionError, match=r"did not answer .* within 1 s .*startup_timeout_s"):
        server.start()
    assert server.pid is None


def test_litellm_reaches_the_server_as_openai_alias(fake_server_script: Path, tmp_path: Path) -> None:
    import litellm

    with _server(fake_server_script, tmp_path) as server:
        resp = litellm.completion(
            model=server.litellm_model,
            api_base=server.api_base,
            api_key=localmodel.LOCAL_API_KEY,
            messages=[{"role": "user", "content": "ping"}],
            num_retries=0,
        )
    assert resp.choices[0].message.content == "pong"
    assert resp.usage.prompt_tokens == 7


def test_get_local_server_is_a_thread_safe_lazy_singleton(fake_server_script: Path, tmp_path: Path) -> None:
    built: list[LocalModelServer] = []
    lock = threading.Lock()

    def factory(cfg: LocalModelConfig) -> LocalModelServer:
        with lock:
            built.append(_server(fake_server_script, tmp_path))
            return built[-1]

    cfg = LocalModelConfig(n_threads=1)
    got: list[LocalModelServer] = []
    barrier = threading.Barrier(8)

    def call() -> None:
        barrier.wait()
        got.append(get_local_server(cfg, factory=factory))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(built) == 1
    assert len(got) == 8 and all(s is built[0] for s in got)
    assert built[0].is_running()

    with pytest.raises(ConfigError, match="already runs in this process with other settings"):
        get_local_server(LocalModelConfig(n_threads=2), factory=factory)

    # A dead server is restarted in place; stop_local_server ends it and forgets it.
    built[0].stop()
    assert get_local_server(cfg, factory=factory) is built[0]
    assert built[0].is_running()
    stop_local_server()
    assert not built[0].is_running()
    assert get_local_server(LocalModelConfig(n_threads=2), factory=factory) is built[1]


def test_guarded_server_exits_when_its_parent_is_killed(fake_server_script: Path, tmp_path: Path) -> None:
    """A parent killed with SIGKILL (no atexit) must not leave the server behind."""
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "kitune_fake_srv.py").write_text(fake_server_script.read_text())
    port = find_free_port()
    pid_file = tmp_path / "child.pid"
    parent_code = (
        "import subprocess, sys, time\n"
        "from kitune.localmodel import guarded_module_command\n"
        f"argv = guarded_module_command('kitune_fake_srv', ['--port', '{port}'])\n"
        f"p = subprocess.Popen(argv, cwd={str(tmp_path)!r})\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], cwd=tmp_path)
    server = LocalModelServer(["true"], port=port, model_alias="x", log_path=tmp_path / "unused.log")
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and pid_file.read_text() and server._ready()):
        assert time.monotonic() < deadline, "guarded fake server never became ready"
        time.sleep(0.1)
    child = int(pid_file.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=5)
    deadline = time.monotonic() + 5
    while not gone(child):
        assert time.monotonic() < deadline, "server outlived its killed parent"
        time.sleep(0.1)
