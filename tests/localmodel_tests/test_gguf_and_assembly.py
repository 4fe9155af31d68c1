"""GGUF header parsing, assembly from chunk packages, pinned hashes and install hints."""

from __future__ import annotations

import hashlib
import importlib.util
import struct
import sys
from pathlib import Path

import pytest

from kitune import localmodel
from kitune.config import LocalModelConfig
from kitune.errors import ConfigError
from kitune.localmodel import PackagedModel, ensure_gguf, read_gguf_info, weights
from localmodel_tests.helpers import qwen_like_kvs, write_gguf


def test_read_gguf_info_parses_scalars_strings_and_arrays(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", qwen_like_kvs())
    info = read_gguf_info(path)
    assert info.version == 3
    assert info.tensor_count == 0
    assert info.architecture == "qwen2"
    assert info.name == "Tiny Test Model"
    assert info.context_length == 32768
    assert info.has_chat_template is True
    assert info.metadata["general.file_type"] == 15
    assert info.metadata["tokenizer.ggml.add_bos_token"] is False
    assert info.metadata["tokenizer.ggml.tokens"] == "<array of 3>"
    assert info.metadata["qwen2.rope.freq_base"] == pytest.approx(1e6)
    assert "tokenizer.chat_template" not in info.metadata


def test_read_gguf_info_rejects_bad_magic_truncation_and_missing_arch(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not a GGUF file .*b'GGML'"):
        read_gguf_info(write_gguf(tmp_path / "a.gguf", qwen_like_kvs(), magic=b"GGML"))
    whole = write_gguf(tmp_path / "b.gguf", qwen_like_kvs()).read_bytes()
    (tmp_path / "c.gguf").write_bytes(whole[:60])
    with pytest.raises(ConfigError, match="truncated"):
        read_gguf_info(tmp_path / "c.gguf")
    with pytest.raises(ConfigError, match="version 1"):
        read_gguf_info(write_gguf(tmp_path / "d.gguf", qwen_like_kvs(), version=1))
    no_arch = [kv for kv in qwen_like_kvs() if kv[0] != "general.architecture"]
    with pytest.raises(ConfigError, match=r"no general\.architecture"):
        read_gguf_info(write_gguf(tmp_path / "e.gguf", no_arch))


def _fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, tamper: bool = False) -> PackagedModel:
    """Install two fake chunk packages (get_part_path style) that concatenate to a GGUF."""
    whole = write_gguf(tmp_path / "whole.gguf", qwen_like_kvs()).read_bytes()
    sha = hashlib.sha256(whole).hexdigest()
    if tamper:
        whole = whole[:-1] + bytes([whole[-1] ^ 1])
    site = tmp_path / "site"
    half = len(whole) // 2
    for i, chunk in enumerate((whole[:half], whole[half:]), start=1):
        pkg = site / f"kitune_fake_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        (pkg / "__init__.py").write_text(
            "import os\ndef get_part_path():\n"
            f"    return os.path.join(os.path.dirname(__file__), 'data', 'part{i:02d}.bin')\n"
        )
    monkeypatch.syspath_prepend(str(site))
    for i in (1, 2):
        sys.modules.pop(f"kitune_fake_part{i}", None)
    model = PackagedModel(
        name="qwen2.5-0.5b",
        description="fake",
        filename="fake.gguf",
        sha256=sha,
        size_bytes=len(whole),
        architecture="qwen2",
        requirements=("kitune-fake-part1==1", "kitune-fake-part2==1"),
        modules=("kitune_fake_part1", "kitune_fake_part2"),
        is_instruct=True,
    )
    monkeypatch.setitem(localmodel.PACKAGED_MODELS, "qwen2.5-0.5b", model)
    monkeypatch.setenv("KITUNE_CACHE", str(tmp_path / "cache"))
    return model


def test_ensure_gguf_assembles_once_and_verifies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _fake_model(tmp_path, monkeypatch)
    cfg = LocalModelConfig(model="qwen2.5-0.5b")
    path = ensure_gguf(cfg)
    assert path == tmp_path / "cache" / "models" / "fake.gguf"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == model.sha256
    assert path.read_bytes() == (tmp_path / "whole.gguf").read_bytes()
    assert list(path.parent.glob("*.tmp")) == []
    # Second call: the stamp short-circuits both assembly and hashing.
    # ensure_gguf looks both up in kitune.localmodel.weights, so that is where they are patched.
    monkeypatch.setattr(weights, "_assemble", lambda *a: pytest.fail("re-assembled"))
    monkeypatch.setattr(weights, "_sha256", lambda *a: pytest.fail("re-hashed"))
    assert ensure_gguf(cfg) == path


def test_ensure_gguf_reassembles_a_modified_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _fake_model(tmp_path, monkeypatch)
    path = ensure_gguf(LocalModelConfig(model="qwen2.5-0.5b"))
    path.write_bytes(b"GGUF garbage")
    assert (
        hashlib.sha256(ensure_gguf(LocalModelConfig(model="qwen2.5-0.5b")).read_bytes()).hexdigest()
        == model.sha256
    )


def test_sha_mismatch_is_a_clear_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _fake_model(tmp_path, monkeypatch, tamper=True)
    with pytest.raises(ConfigError) as err:
        ensure_gguf(LocalModelConfig(model="qwen2.5-0.5b"))
    msg = str(err.value)
    assert f"expected {model.sha256}" in msg
    assert "bash scripts/install_local_model.sh --model qwen2.5-0.5b --force" in msg
    assert not (tmp_path / "cache" / "models" / "fake.gguf").exists()
    assert list((tmp_path / "cache" / "models").glob("*.tmp")) == []


def test_missing_package_names_it_and_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _fake_model(tmp_path, monkeypatch)
    broken = PackagedModel(
        **{
            **model.__dict__,
            "modules": ("kitune_fake_part1", "kitune_no_such_part_xyz"),
            "requirements": ("kitune-fake-part1==1", "kitune-no-such-part==1"),
        }
    )
    monkeypatch.setitem(localmodel.PACKAGED_MODELS, "qwen2.5-0.5b", broken)
    with pytest.raises(
        ConfigError,
        match=r"package kitune-no-such-part==1 is missing\): "
        r"run `bash scripts/install_local_model.sh --model qwen2.5-0.5b`",
    ):
        ensure_gguf(LocalModelConfig(model="qwen2.5-0.5b"))
    assert localmodel.is_model_installed("qwen2.5-0.5b") is False


def test_missing_llama_cpp_server_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    # Hide the server's three modules so the message is the same with or without [local] installed.
    hidden = {"llama_cpp", "sse_starlette", "starlette_context"}
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in hidden else real(name, *a)
    )
    with pytest.raises(
        ConfigError,
        match=r"missing modules: llama_cpp, sse_starlette, starlette_context\): run `bash scripts/install_local_model.sh`",  # noqa: E501
    ):
        localmodel.check_server_installed()


def test_gguf_path_is_checked_for_existence_and_context(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"lm.local.gguf_path=.*does not exist"):
        ensure_gguf(LocalModelConfig(gguf_path=tmp_path / "nope.gguf"))
    small = write_gguf(tmp_path / "small.gguf", qwen_like_kvs(context_length=4096))
    with pytest.raises(ConfigError, match=r"lm.local.n_ctx=8192 exceeds the model's trained context of 4096"):
        ensure_gguf(LocalModelConfig(gguf_path=small, n_ctx=8192))
    assert ensure_gguf(LocalModelConfig(gguf_path=small, n_ctx=4096)) == small.resolve()


def test_wrong_architecture_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _fake_model(tmp_path, monkeypatch)
    monkeypatch.setitem(
        localmodel.PACKAGED_MODELS,
        "qwen2.5-0.5b",
        PackagedModel(**{**model.__dict__, "architecture": "llama"}),
    )
    with pytest.raises(ConfigError, match="declares architecture 'qwen2', expected 'llama'"):
        ensure_gguf(LocalModelConfig(model="qwen2.5-0.5b"))


def test_pinned_models_are_consistent() -> None:
    for name, m in localmodel.PACKAGED_MODELS.items():
        assert name == m.name
        assert len(m.sha256) == 64 and int(m.sha256, 16) >= 0
        assert len(m.modules) == len(m.requirements) > 0
    assert localmodel.PACKAGED_MODELS["qwen2.5-coder-1.5b"].size_bytes == 1_117_320_768
    assert struct.calcsize("<Q") == 8
