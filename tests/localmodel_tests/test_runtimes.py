"""Which runtime serves the embedded model: native build when cached, else the prebuilt wheel; and why."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kitune.config import LocalModelConfig
from kitune.errors import ConfigError
from kitune.localmodel import (
    WHEEL_CPU_FLAGS,
    LocalModelServer,
    build_native_server,
    build_xllamacpp_command,
    check_wheel_cpu,
    choose_runtime,
    cpu_flags,
    find_native_build,
)
from kitune.localmodel import runtimes as runtimes_mod
from kitune.localmodel import server as server_mod
from kitune.localmodel.xllamacpp_main import _parser, build_params

AVX512_CPU = frozenset({*WHEEL_CPU_FLAGS, "avx512f", "avx512_vnni"})


def _native_build(root: Path, key: str, needs: list[str]) -> Path:
    d = root / "bin" / key
    d.mkdir(parents=True)
    binary = d / "llama-server"
    binary.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    (d / "build.json").write_text(json.dumps({"cpu_flags": needs}), encoding="utf-8")
    return binary


def test_auto_picks_the_native_build_when_cached_and_says_why(tmp_path: Path) -> None:
    binary = _native_build(tmp_path, "k1", ["avx2", "avx512f"])
    rt = choose_runtime(
        LocalModelConfig(),
        native=lambda cfg: find_native_build(tmp_path, AVX512_CPU),
        wheel=lambda: "2026.10.11549",
        flags=lambda: AVX512_CPU,
    )
    assert rt.name == "llama-server" and rt.binary == binary
    assert rt.reason.startswith("auto: a native llama-server compiled for this CPU is present")
    assert str(binary) in rt.reason


def test_auto_falls_back_to_the_wheel_and_names_the_build_command(tmp_path: Path) -> None:
    rt = choose_runtime(
        LocalModelConfig(), native=lambda cfg: None, wheel=lambda: "2026.10.11549", flags=lambda: AVX512_CPU
    )
    assert rt.name == "xllamacpp" and rt.binary is None
    assert rt.reason == (
        "no native llama-server is built (`kitune lm build` compiles one for this CPU once): "
        "prebuilt xllamacpp 2026.10.11549 wheel (AVX2 kernels)"
    )


def test_a_native_build_for_another_cpu_is_not_used(tmp_path: Path) -> None:
    _native_build(tmp_path, "avx512", ["avx2", "avx512f"])
    assert find_native_build(tmp_path, frozenset(WHEEL_CPU_FLAGS)) is None  # this CPU has no AVX-512
    ok = _native_build(tmp_path, "avx2", ["avx2"])
    assert find_native_build(tmp_path, frozenset(WHEEL_CPU_FLAGS)) == ok
    (tmp_path / "bin" / "broken").mkdir()
    (tmp_path / "bin" / "broken" / "build.json").write_text("{", encoding="utf-8")  # no binary, bad JSON
    assert find_native_build(tmp_path, frozenset(WHEEL_CPU_FLAGS)) == ok


def test_missing_wheel_names_the_extra_the_install_script_and_the_build() -> None:
    with pytest.raises(ConfigError) as e:
        choose_runtime(
            LocalModelConfig(), native=lambda cfg: None, wheel=lambda: None, flags=lambda: AVX512_CPU
        )
    msg = str(e.value)
    assert "xllamacpp wheel is not installed" in msg
    assert "pip install 'kitune[local]'" in msg and "kitune lm build" in msg


def test_cpu_without_avx2_gets_a_clear_error_naming_the_fallback() -> None:
    old_cpu = frozenset({"sse", "sse2", "ssse3", "pni", "avx"})
    with pytest.raises(ConfigError) as e:
        choose_runtime(LocalModelConfig(), native=lambda cfg: None, wheel=lambda: "1", flags=lambda: old_cpu)
    msg = str(e.value)
    assert msg.startswith("this CPU lacks avx2, fma, f16c, bmi2, which the prebuilt llama.cpp wheel")
    assert "Illegal instruction" in msg and "`kitune lm build`" in msg and "llama-cpp-python" in msg
    check_wheel_cpu(None)  # unknown flags (not Linux): not checked
    check_wheel_cpu(AVX512_CPU)


def test_explicit_runtimes_fail_clearly_when_absent() -> None:
    with pytest.raises(ConfigError, match=r"no native llama-server is built: run `kitune lm build`"):
        choose_runtime(
            LocalModelConfig(server="llama-server"),
            native=lambda cfg: None,
            wheel=lambda: "1",
            flags=lambda: None,
        )
    rt = choose_runtime(
        LocalModelConfig(server="xllamacpp"),
        native=lambda cfg: Path("/x/llama-server"),  # present, but the wheel was asked for
        wheel=lambda: "1",
        flags=lambda: None,
    )
    assert rt.name == "xllamacpp" and rt.reason.startswith("lm.local.server: xllamacpp")


def test_cpu_flags_reads_the_first_flags_line(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx avx2\nflags\t\t: other\n", encoding="utf-8")
    assert cpu_flags(info) == frozenset({"fpu", "avx", "avx2"})
    assert cpu_flags(tmp_path / "missing") is None


@pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason="the local extra is not installed")
def test_the_declared_wheel_cpu_flags_cover_what_the_installed_wheel_reports() -> None:
    # get_system_info() names the kernels compiled in; each must be one WHEEL_CPU_FLAGS checks.
    code = "import xllamacpp; print(xllamacpp.get_system_info())"
    info = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    cpu_part = info.stdout.split("|")
    compiled = {p.split("=")[0].strip().replace("CPU : ", "") for p in cpu_part if p.strip().endswith("= 1")}
    to_proc = {
        "SSE3": "pni",
        "SSSE3": "ssse3",
        "AVX": "avx",
        "AVX2": "avx2",
        "F16C": "f16c",
        "FMA": "fma",
        "BMI2": "bmi2",
    }
    isa = {name for name in compiled if name.isupper() and name not in {"LLAMAFILE", "OPENMP", "REPACK"}}
    assert isa <= set(to_proc), f"the wheel reports kernels kitune does not check: {isa - set(to_proc)}"
    assert {to_proc[n] for n in isa} == set(WHEEL_CPU_FLAGS)


def test_wheel_server_parameters_mirror_the_native_command(tmp_path: Path) -> None:
    cfg = LocalModelConfig(n_ctx=4096, n_threads=2, parallel=4)
    argv = build_xllamacpp_command(cfg, tmp_path / "m.gguf", port=12345, alias="qwen")
    assert argv[0] == sys.executable and argv[3] == str(os.getpid())
    assert argv[4] == "kitune.localmodel.xllamacpp_main"
    args = _parser().parse_args(argv[5:])

    class _Obj:
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)

    class FakeXlc:
        @staticmethod
        def CommonParams() -> Any:  # noqa: N802  (the wheel's name)
            return _Obj(model=_Obj(), cpuparams=_Obj(), cpuparams_batch=_Obj())

    p = build_params(FakeXlc, args)
    assert p.model.path == str(tmp_path / "m.gguf") and p.model_alias == {"qwen"}
    assert (p.hostnames, p.port, p.n_ctx, p.n_parallel) == (["127.0.0.1"], 12345, 16384, 4)
    assert (p.kv_unified, p.cont_batching, p.cache_prompt, p.cache_ram_mib) == (False, True, True, 2048)
    assert (p.cpuparams.n_threads, p.cpuparams_batch.n_threads, p.use_jinja, p.ui) == (2, 2, True, False)


def test_from_config_starts_the_wheel_when_no_native_build_and_logs_which(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(server_mod, "ensure_gguf", lambda cfg: tmp_path / "m.gguf")
    monkeypatch.setattr(server_mod, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(runtimes_mod, "find_llama_server", lambda cfg, root=None: None)
    monkeypatch.setattr(runtimes_mod, "wheel_version", lambda: "2026.10.11549")
    monkeypatch.setattr(runtimes_mod, "cpu_flags", lambda cpuinfo=None: AVX512_CPU)
    monkeypatch.setattr(
        server_mod,
        "choose_runtime",
        lambda cfg: runtimes_mod.choose_runtime(
            cfg, native=lambda c: None, wheel=lambda: "2026.10.11549", flags=lambda: AVX512_CPU
        ),
    )
    srv = LocalModelServer.from_config(LocalModelConfig(parallel=2, port=4243))
    assert srv.command[4] == "kitune.localmodel.xllamacpp_main" and srv.ready_path == "/health"
    assert srv.slots == 2 and srv.log_path == tmp_path / "logs" / "xllamacpp-qwen2.5-coder-1.5b-4243.log"
    srv.command = [sys.executable, "-c", "raise SystemExit(5)"]  # start it without a model: it exits at once
    srv.startup_timeout_s = 10
    with caplog.at_level(logging.INFO, logger="kitune.localmodel"), pytest.raises(Exception, match="code 5"):
        srv.start()
    assert any(
        r.getMessage().startswith("local model runtime: xllamacpp (no native llama-server is built")
        for r in caplog.records
    )


def test_native_server_is_built_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def fake_run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[bytes]:
        calls.append(argv)
        _native_build(tmp_path, "built", ["avx2"])
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(runtimes_mod, "cpu_flags", lambda cpuinfo=None: AVX512_CPU)
    env = {"KITUNE_CACHE": str(tmp_path), "PATH": os.environ.get("PATH", "")}
    # choosing a runtime never builds: with no build cached it picks the wheel
    choose_runtime(LocalModelConfig(), native=lambda cfg: None, wheel=lambda: "1", flags=lambda: AVX512_CPU)
    assert calls == []
    binary = build_native_server(rebuild=True, env=env, run=fake_run)
    assert binary == tmp_path / "bin" / "built" / "llama-server"
    assert calls[0][1].endswith("kitune/localmodel/build_llama_server.sh") and calls[0][2:] == ["--rebuild"]
    assert Path(calls[0][1]).is_file()


def test_native_build_failure_is_a_clear_error(tmp_path: Path) -> None:
    def failing(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[bytes]:
        return subprocess.CompletedProcess(argv, 1)

    with pytest.raises(ConfigError, match=r"compiling llama-server failed \(exit 1\)"):
        build_native_server(env={"KITUNE_CACHE": str(tmp_path)}, run=failing)


def test_install_script_compiles_nothing_by_default() -> None:
    script = (Path(__file__).resolve().parents[2] / "scripts" / "install_local_model.sh").read_text()
    body = script.split("set -euo pipefail", 1)[1]
    # the only compile paths are behind --build-native / --python-server
    assert "cmake" not in body and "pip wheel" not in body
    assert "if [[ $BUILD_NATIVE -eq 1 || $PYTHON_SERVER -eq 1 ]]; then" in body
    assert '--only-binary xllamacpp "xllamacpp==$XLLAMACPP_VERSION"' in body
