"""Record/replay at the LM layer: DSPy programs, failed calls, format downgrades, repeats, misses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dspy
import pytest

from kitune.config import KituneConfig, load_config
from kitune.errors import LMAuthError
from kitune.lm import build_lm, reset_format_memory
from kitune.recording import RecordingMissError, find_recorder, request_hash, reset_recorders
from kitune.testing.openai_stub import Reply, StubServer
from kitune.usage import TokenLedger


class QA(dspy.Signature):
    """Answer the question."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField()


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    reset_recorders()
    reset_format_memory()
    yield
    reset_recorders()
    reset_format_memory()


def _cfg(monkeypatch: pytest.MonkeyPatch, stub: StubServer | None, **extra: Any) -> KituneConfig:
    if stub is not None:
        monkeypatch.setenv("KI_GW_URL", stub.base_url)
        monkeypatch.setenv("KI_GW_KEY", "sk-test-1234")
    else:
        monkeypatch.delenv("KI_GW_URL", raising=False)
        monkeypatch.delenv("KI_GW_KEY", raising=False)
    return load_config(
        overrides={
            "lm.gateway.base_url_env": "KI_GW_URL",
            "lm.gateway.api_key_env": "KI_GW_KEY",
            "lm.gateway.default_model": "m-small",
            **extra,
        }
    )


def _ask(lm: Any, questions: list[str]) -> list[str]:
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        return [dspy.Predict(QA)(question=q).answer for q in questions]


def test_dspy_program_replays_answers_ledger_and_format_downgrade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = tmp_path / "rec"
    questions = ["Where is Acme?", "Capital of France?", "Capital of France?"]
    with StubServer(
        [
            Reply.reject_response_format(),
            Reply.ok('{"answer": "Springfield"}', usage=(31, 4)),
            Reply.ok('{"answer": "Paris"}', usage=(29, 3)),
            Reply.ok('{"answer": "Lyon"}', usage=(29, 5)),  # the same request again, another answer
        ]
    ) as stub:
        ledger = TokenLedger()
        lm = build_lm(_cfg(monkeypatch, stub, **{"lm.record_dir": str(rec)}), "extract", ledger=ledger)
        with ledger.stage("extract"):
            recorded = _ask(lm, questions)
        assert len(stub.chat_requests) == 4
    assert recorded == ["Springfield", "Paris", "Lyon"]
    lines = [json.loads(x) for x in (rec / "calls.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and lines[0]["downgrades"] == ["json_schema->json_object"]
    assert [r["failed"] for r in lines[0]["ledger"]] == [True, False]
    assert lines[1]["hash"] == lines[2]["hash"] != lines[0]["hash"]

    reset_format_memory()
    replay_ledger = TokenLedger()
    offline = build_lm(
        _cfg(monkeypatch, None, **{"lm.replay_dir": str(rec)}), "extract", ledger=replay_ledger
    )
    with replay_ledger.stage("extract"):
        assert _ask(offline, questions) == recorded  # n-th identical request → n-th recorded answer
    assert offline.fallback_counts == lm.fallback_counts == {"json_schema->json_object": 1}
    assert offline.format_level == "json_object"
    assert replay_ledger.to_rows() == ledger.to_rows()
    assert replay_ledger.totals()["failed_calls"] == 1 and replay_ledger.totals()["input_tokens"] > 91
    with pytest.raises(RecordingMissError, match="only 2 recording"):
        _ask(offline, ["Capital of France?"])


def test_failed_call_is_recorded_and_reraised_as_the_same_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = tmp_path / "rec"
    msgs = [{"role": "user", "content": "hi"}]
    with StubServer([Reply.unauthorized()]) as stub:
        lm = build_lm(_cfg(monkeypatch, stub, **{"lm.record_dir": str(rec)}), "judge")
        with pytest.raises(LMAuthError) as live:
            lm.forward(messages=msgs)
    entry = json.loads((rec / "calls.jsonl").read_text())
    assert entry["error"]["type"] == "LMAuthError" and entry["response"] is None
    offline = build_lm(_cfg(monkeypatch, None, **{"lm.replay_dir": str(rec)}), "judge")
    with pytest.raises(LMAuthError) as replayed:
        offline.forward(messages=msgs)
    assert str(replayed.value) == str(live.value) and replayed.value.retryable is False
    assert "sk-test-1234" not in (rec / "calls.jsonl").read_text()  # the key is never stored


def test_miss_names_the_call_and_is_kept_for_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "calls.jsonl").write_text("")
    lm = build_lm(_cfg(monkeypatch, None, **{"lm.replay_dir": str(tmp_path / "rec")}), "rewrite")
    msgs = [{"role": "user", "content": "Which river flows through Lyon?"}]
    with pytest.raises(RecordingMissError) as e:
        lm.forward(messages=msgs)
    text = str(e.value)
    assert "no recording for the rewrite call to openai/m-small" in text
    assert "Which river flows through Lyon?" in text and e.value.hash[:12] in text
    rec = find_recorder(tmp_path / "rec", "replay")
    assert rec is not None and rec.misses == [text]


def test_hash_ignores_endpoint_and_cache_flags_but_not_parameters() -> None:
    msgs = [{"role": "user", "content": "q"}]
    base = request_hash("openai/m", msgs, {"temperature": 0.0, "max_tokens": 5})
    assert base == request_hash(
        "openai/m",
        msgs,
        {
            "max_tokens": 5,
            "temperature": 0.0,
            "cache": False,
            "api_base": "http://x",
            "_kitune_refresh": True,
        },
    )
    assert base != request_hash("openai/m", msgs, {"temperature": 0.7, "max_tokens": 5})
    assert base != request_hash("openai/other", msgs, {"temperature": 0.0, "max_tokens": 5})
    assert len(base) == 64


def test_native_tool_call_episode_replays_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kitune.evaluation.agent import Agent
    from kitune.evaluation.budget import Budget
    from kitune.evaluation.tools import closed_book_toolbox
    from kitune.lm import LiteLLMChatModel

    def call(arguments: str) -> Reply:
        body = {
            "id": "x",
            "object": "chat.completion",
            "created": 1,
            "model": "stub-model",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_9",
                                "type": "function",
                                "function": {"name": "answer", "arguments": arguments},
                            }
                        ],
                    },
                }
            ],
            "usage": {"prompt_tokens": 77, "completion_tokens": 8, "total_tokens": 85},
        }
        return Reply._json(200, body, label="tool_call")

    rec = tmp_path / "rec"
    extra = {"agent.tool_calling": "native"}
    with StubServer([call('{"explanation": "e", "exact_answer": "Oslo", "confidence": 90}')]) as stub:
        chat = LiteLLMChatModel(_cfg(monkeypatch, stub, **extra, **{"lm.record_dir": str(rec)}), "agent")
        live = Agent(chat, closed_book_toolbox(), budget=Budget(max_steps=2)).run("Capital of Norway?")
    offline_chat = LiteLLMChatModel(_cfg(monkeypatch, None, **extra, **{"lm.replay_dir": str(rec)}), "agent")
    again = Agent(offline_chat, closed_book_toolbox(), budget=Budget(max_steps=2)).run("Capital of Norway?")
    assert live.tool_mode == again.tool_mode == "native" and again.exact_answer == "Oslo"
    assert [s.to_dict() for s in again.steps] == [s.to_dict() for s in live.steps]
    assert (again.input_tokens, again.output_tokens) == (77, 8)
