"""llama.cpp's llama-server as the embedded model's default server: command, discovery, guard, start."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kitune.config import KituneConfig, LocalModelConfig
from kitune.errors import ConfigError
from kitune.localmodel import (
    LLAMA_SERVER_ENV,
    LocalModelServer,
    build_llama_server_command,
    find_free_port,
    find_llama_server,
    guarded_exec_command,
)
from localmodel_tests.helpers import FAKE_SERVER, gone


def _pairs(argv: list[str]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        key = argv[i]
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[key] = argv[i + 1]
            i += 2
        else:
            out[key] = True
            i += 1
    return out


def test_llama_server_command_gives_every_slot_its_own_n_ctx(tmp_path: Path) -> None:
    cfg = LocalModelConfig(n_ctx=4096, n_threads=2, parallel=4)
    binary = tmp_path / "llama-server"
    argv = build_llama_server_command(cfg, tmp_path / "m.gguf", port=12345, alias="qwen", binary=binary)
    # The guard: python -c <script> <our pid> <the executable and its arguments>
    assert argv[0] == sys.executable and argv[1] == "-c" and argv[3] == str(os.getpid())
    assert argv[4] == str(binary)
    assert _pairs(argv[5:]) == {
        "--model": str(tmp_path / "m.gguf"),
        "--alias": "qwen",
        "--host": "127.0.0.1",
        "--port": "12345",
        "--ctx-size": "16384",  # 4 slots x 4096
        "--parallel": "4",
        "--no-kv-unified": True,
        "--cont-batching": True,
        "--cache-prompt": True,
        "--cache-ram": "2048",
        "--threads": "2",
        "--threads-batch": "2",
        "--jinja": True,
        "--no-webui": True,
    }


def _executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_find_llama_server_order_config_then_env_then_cache_then_beside_python_then_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configured = _executable(tmp_path / "configured")
    from_env = _executable(tmp_path / "from-env")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    on_path = _executable(bindir / "llama-server")
    monkeypatch.setenv(LLAMA_SERVER_ENV, str(from_env))
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv("KITUNE_CACHE", str(tmp_path / "cache"))
    fake_python = tmp_path / "venv" / "python"
    fake_python.parent.mkdir()
    monkeypatch.setattr(sys, "executable", str(fake_python))

    assert find_llama_server(LocalModelConfig(server_path=configured)) == configured
    assert find_llama_server(LocalModelConfig()) == from_env
    monkeypatch.delenv(LLAMA_SERVER_ENV)
    assert find_llama_server(LocalModelConfig()) == on_path
    beside = _executable(fake_python.parent / "llama-server")
    assert find_llama_server(LocalModelConfig()) == beside
    cached_dir = tmp_path / "cache" / "bin" / "abc123"
    cached_dir.mkdir(parents=True)
    cached = _executable(cached_dir / "llama-server")
    (cached_dir / "build.json").write_text('{"cpu_flags": []}', encoding="utf-8")
    assert find_llama_server(LocalModelConfig()) == cached


def test_missing_llama_server_is_none_and_a_bad_named_path_names_the_build_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(LLAMA_SERVER_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("KITUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert find_llama_server(LocalModelConfig()) is None
    not_exec = tmp_path / "plain"
    not_exec.write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"is not an executable file.*kitune lm build"):
        find_llama_server(LocalModelConfig(server_path=not_exec))


def test_guard_forwards_terminate_and_reports_the_exit_code(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    code = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    child = [sys.executable, "-c", code]
    guard = subprocess.Popen(guarded_exec_command(child))
    deadline = time.monotonic() + 20
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline, "child never started"
        time.sleep(0.05)
    child_pid = int(pidfile.read_text())
    guard.terminate()
    guard.wait(timeout=20)
    deadline = time.monotonic() + 20
    while not gone(child_pid):
        assert time.monotonic() < deadline, "terminating the guard left the server running"
        time.sleep(0.05)
    failing = subprocess.run(guarded_exec_command([sys.executable, "-c", "raise SystemExit(7)"]), timeout=30)
    assert failing.returncode == 7
    with pytest.raises(ValueError, match="argv"):
        guarded_exec_command([])


_HEALTH_SERVER = FAKE_SERVER.replace(
    "    def do_GET(self):\n",
    "    def do_GET(self):\n"
    "        if self.path == '/health' and time.monotonic() < READY_AT:\n"
    "            self.send_response(503); self.send_header('Content-Length', '0')\n"
    "            self.end_headers(); return\n",
).replace(
    "class H(BaseHTTPRequestHandler):", "READY_AT = time.monotonic() + 1.0\nclass H(BaseHTTPRequestHandler):"
)


def test_start_waits_for_health_while_the_model_loads(tmp_path: Path) -> None:
    script = tmp_path / "fake_llama_server.py"
    script.write_text(_HEALTH_SERVER, encoding="utf-8")
    port = find_free_port()
    server = LocalModelServer(
        guarded_exec_command([sys.executable, str(script), "--port", str(port)]),
        port=port,
        model_alias="fake-alias",
        log_path=tmp_path / "srv.log",
        startup_timeout_s=20,
        stop_timeout_s=2,
        ready_path="/health",
        slots=4,
    )
    started = time.monotonic()
    with server:
        assert server.is_running()
        assert time.monotonic() - started >= 0.9  # /health answered 503 for the first second
        assert server.slots == 4
        pid = server.pid
    assert pid is not None
    deadline = time.monotonic() + 20
    while not gone(pid):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_from_config_selects_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kitune.localmodel import runtimes
    from kitune.localmodel import server as server_mod

    monkeypatch.setattr(server_mod, "ensure_gguf", lambda cfg: tmp_path / "m.gguf")
    monkeypatch.setattr(runtimes, "_llama_cpp_python_installed", lambda: True)
    monkeypatch.setattr(server_mod, "cache_dir", lambda: tmp_path)
    binary = _executable(tmp_path / "llama-server")
    srv = LocalModelServer.from_config(LocalModelConfig(server_path=binary, parallel=3, port=4242))
    assert srv.command[4] == str(binary) and srv.ready_path == "/health" and srv.slots == 3
    assert srv.runtime is not None and srv.runtime.name == "llama-server"
    assert srv.log_path == tmp_path / "logs" / "llama-server-qwen2.5-coder-1.5b-4242.log"
    old = LocalModelServer.from_config(LocalModelConfig(server="llama-cpp-python", parallel=3, port=4242))
    assert "llama_cpp.server" in old.command and old.ready_path == "/v1/models" and old.slots == 1


def test_concurrency_is_sized_to_the_slots_unless_set() -> None:
    cfg = KituneConfig()
    assert cfg.local_slots() == 4
    assert cfg.concurrency_for("extraction") == 4 and cfg.concurrency_for("agent") == 4
    cfg = KituneConfig.model_validate({"lm": {"local": {"parallel": 6}}, "agent": {"concurrency": 1}})
    assert cfg.concurrency_for("extraction") == 6  # not set: the slots
    assert cfg.concurrency_for("agent") == 1 and cfg.concurrency_for("optimizer") == 1  # set: wins
    fallback = KituneConfig.model_validate({"lm": {"local": {"server": "llama-cpp-python", "parallel": 6}}})
    assert fallback.local_slots() == 1 and fallback.concurrency_for("extraction") == 1
    provider = KituneConfig.model_validate({"lm": {"gateway": {"default_model": "openai/gpt-x"}}})
    assert provider.concurrency_for("extraction") == 4 and provider.concurrency_for("agent") == 2
