"""The kitune.localmodel package: its re-exports, and the atexit stop hook registered on first start."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import kitune.localmodel as localmodel
from kitune.localmodel import LocalModelServer, find_free_port, gguf, runtimes, server, weights
from localmodel_tests.helpers import fake_command


def test_package_re_exports_each_name_from_its_module() -> None:
    homes = {
        gguf: ["INSTALL_HINT", "GGUFInfo", "read_gguf_info"],
        weights: [
            "PACKAGED_MODELS",
            "PackagedModel",
            "cache_dir",
            "check_server_installed",
            "ensure_gguf",
            "is_model_installed",
        ],
        runtimes: [
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
        ],
        server: [
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
        ],
    }
    exported = [name for names in homes.values() for name in names]
    assert sorted(localmodel.__all__) == sorted(exported)
    for module, names in homes.items():
        assert sorted(module.__all__) == sorted(names)
        for name in names:
            assert getattr(localmodel, name) is getattr(module, name), name
    # One dict object: patching localmodel.PACKAGED_MODELS is seen by ensure_gguf in weights.
    assert localmodel.PACKAGED_MODELS is weights.PACKAGED_MODELS


def test_importing_the_package_registers_no_exit_hook() -> None:
    code = (
        "import atexit, json, sys\n"
        "seen = []\n"
        "real = atexit.register\n"
        "def spy(fn, *a, **k):\n"
        '    seen.append(f\'{getattr(fn, "__module__", None)}.{getattr(fn, "__qualname__", fn)}\')\n'
        "    return real(fn, *a, **k)\n"
        "atexit.register = spy\n"
        "import kitune.localmodel as lm\n"
        "mods = sorted(m for m in sys.modules if m.startswith('kitune.localmodel'))\n"
        "print(json.dumps({'hooks': seen, 'flag': lm.server._stop_hook_registered, 'modules': mods}))\n"
    )
    src = Path(localmodel.__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(src)},
        timeout=60,
    ).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["modules"] == [
        "kitune.localmodel",
        "kitune.localmodel.gguf",
        "kitune.localmodel.runtimes",
        "kitune.localmodel.server",
        "kitune.localmodel.weights",
    ]  # the spy watched the import of the module that owns the hook
    assert [h for h in got["hooks"] if h.startswith("kitune")] == []
    assert got["flag"] is False


def test_first_started_server_registers_the_stop_hook_once(
    fake_server_script: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registered: list[Callable[[], None]] = []
    monkeypatch.setattr(server, "_stop_hook_registered", False)
    monkeypatch.setattr(atexit, "register", lambda fn, *a, **k: registered.append(fn) or fn)

    def make(name: str) -> LocalModelServer:
        port = find_free_port()
        return LocalModelServer(
            fake_command(fake_server_script, port),
            port=port,
            model_alias="fake-alias",
            log_path=tmp_path / f"{name}.log",
            stop_timeout_s=1.0,
        )

    first, second = make("a"), make("b")
    assert registered == []  # building a server is not starting it
    try:
        first.start()
        assert registered == [server._stop_all]
        second.start()
        first.stop()
        first.start()  # restarting, or a second server, does not register again
        assert registered == [server._stop_all]
        assert first.is_running() and second.is_running()
        registered[0]()  # what the interpreter runs at exit stops every live server
        assert not first.is_running() and not second.is_running()
    finally:
        first.stop()
        second.stop()
