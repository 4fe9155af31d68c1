"""Tests for kitune.testing.lm: ReplayLM, ReplayMissError, mock_usage_lm, DummyLM re-export."""

from __future__ import annotations

import json
from pathlib import Path

import dspy
import pytest

from kitune.errors import ConfigError, DataError
from kitune.testing.lm import DummyLM, ReplayLM, ReplayMissError, mock_usage_lm, replay_key
from kitune.testing.openai_stub import Reply, StubServer
from kitune.usage import TokenLedger

MSG = [{"role": "user", "content": "Where is Acme Corp headquartered?"}]


class QA(dspy.Signature):
    """Answer the question."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField()


def _write(path: Path, entries: dict[str, dict[str, object]]) -> None:
    path.write_text(json.dumps({"version": 1, "entries": entries}), encoding="utf-8")


def test_replays_a_recorded_entry_with_fixed_usage(tmp_path: Path) -> None:
    path = tmp_path / "replay.json"
    _write(path, {replay_key(MSG): {"text": "Springfield", "usage": [30, 4]}})
    ledger = TokenLedger()
    lm = ReplayLM(path, ledger=ledger, role="judge")
    with ledger.stage("eval"):
        assert lm(messages=MSG) == ["Springfield"]
        assert lm(messages=MSG) == ["Springfield"]
    assert ledger.totals(role="judge", stage="eval") == {
        "calls": 2,
        "input_tokens": 60,
        "output_tokens": 8,
        "billed_input_tokens": 60,
        "billed_output_tokens": 8,
        "cache_hits": 0,
        "estimated_calls": 0,
        "failed_calls": 0,
        "retries": 0,
        "timeouts": 0,
    }


def test_miss_raises_with_the_key(tmp_path: Path) -> None:
    lm = ReplayLM(tmp_path / "none.json", fail_under_pytest=False)
    with pytest.raises(ReplayMissError) as info:
        lm(messages=MSG)
    assert info.value.key == replay_key(MSG)
    assert "Where is Acme Corp headquartered?" in str(info.value) and "RECORD_LM=1" in str(info.value)
    assert lm.misses == [replay_key(MSG)]


def test_miss_under_pytest_fails_the_test(tmp_path: Path) -> None:
    lm = ReplayLM(tmp_path / "none.json")
    with pytest.raises(pytest.fail.Exception, match="no recorded completion"):
        lm(messages=MSG)


def test_records_through_the_real_lm_layer_then_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kitune.config import load_config
    from kitune.lm import build_lm

    path = tmp_path / "rec.json"
    with StubServer([Reply.ok('{"answer": "Springfield"}', usage=(77, 5))]) as stub:
        monkeypatch.setenv("GW", stub.base_url)
        cfg = load_config(overrides={"lm.gateway.base_url_env": "GW", "lm.gateway.default_model": "m"})
        recorder = ReplayLM(path, record_with=build_lm(cfg, "extract"))
        with dspy.context(lm=recorder, adapter=dspy.JSONAdapter()):
            assert dspy.Predict(QA)(question="Where?").answer == "Springfield"
        assert len(stub.chat_requests) == 1
        assert "response_format" not in stub.chat_requests[0].body  # keys never depend on capabilities
    (entry,) = json.loads(path.read_text())["entries"].values()
    assert entry == {"text": '{"answer": "Springfield"}', "usage": [77, 5]}
    replay = ReplayLM(path)  # the stub is gone: this must be served from the file
    with dspy.context(lm=replay, adapter=dspy.JSONAdapter()):
        assert dspy.Predict(QA)(question="Where?").answer == "Springfield"


def test_record_env_without_recorder_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECORD_LM", "1")
    with pytest.raises(ConfigError, match="record_with"):
        ReplayLM(tmp_path / "x.json")(messages=MSG)


def test_bad_file_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("[1, 2]")
    with pytest.raises(DataError, match="not a ReplayLM file"):
        ReplayLM(path)


def test_key_covers_rollout_id_but_not_cache_flag() -> None:
    assert replay_key(MSG, {"rollout_id": 1}) != replay_key(MSG)
    assert replay_key(MSG, {"cache": False, "temperature": 0.7}) == replay_key(MSG)


def test_mock_usage_lm_records_litellm_mock_usage() -> None:
    ledger = TokenLedger()
    lm = mock_usage_lm('{"answer": "42"}', role="agent", ledger=ledger)
    assert lm(messages=MSG) == ['{"answer": "42"}']
    assert lm(messages=MSG) == ['{"answer": "42"}']
    assert ledger.totals(role="agent")["input_tokens"] == 20
    assert ledger.totals(role="agent")["output_tokens"] == 40
    assert ledger.totals()["estimated_calls"] == 0


def test_dummy_lm_is_dspys() -> None:
    assert DummyLM is dspy.utils.DummyLM
