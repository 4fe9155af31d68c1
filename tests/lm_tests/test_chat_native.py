"""LiteLLMChatModel in native tool mode against the OpenAI-compatible stub (issue 16)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kitune.config import KituneConfig
from kitune.errors import LMError
from kitune.evaluation.agent import Agent
from kitune.evaluation.budget import Budget
from kitune.evaluation.tools import closed_book_toolbox
from kitune.lm import LiteLLMChatModel, resolve_role
from kitune.lm.chat_model import _auto_tool_mode
from kitune.testing.openai_stub import Reply, StubServer
from kitune.usage import TokenLedger

CfgFactory = Callable[..., KituneConfig]


def _tool_reply(name: str, arguments: str, usage: tuple[int, int] = (60, 9)) -> Reply:
    body: dict[str, Any] = {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 1_700_000_000,
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
                            "id": "call_7",
                            "type": "function",
                            "function": {"name": name, "arguments": arguments},
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }
    return Reply._json(200, body, label="tool_call")


def test_mode_follows_config_and_litellm_capabilities(gateway_cfg: CfgFactory) -> None:
    assert LiteLLMChatModel(gateway_cfg(), "agent").tool_mode == "json"  # unknown gateway model
    known = gateway_cfg(**{"lm.gateway.default_model": "gpt-4o-mini"})
    assert LiteLLMChatModel(known, "agent").tool_mode == "native"  # LiteLLM: supports function calling
    forced = gateway_cfg(**{"agent.tool_calling": "native"})
    assert LiteLLMChatModel(forced, "agent").tool_mode == "native"
    off = gateway_cfg(**{"lm.gateway.default_model": "gpt-4o-mini", "agent.tool_calling": "json"})
    assert LiteLLMChatModel(off, "agent").tool_mode == "json"
    from kitune.config import load_config

    assert _auto_tool_mode(resolve_role(load_config(), "agent")) == "json"  # the embedded local model


def test_native_episode_sends_tools_and_reads_tool_calls(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(_tool_reply("answer", '{"explanation": "known", "exact_answer": "Paris", "confidence": 70}'))
    ledger = TokenLedger()
    chat = LiteLLMChatModel(gateway_cfg(**{"agent.tool_calling": "native"}), "agent", ledger=ledger)
    ep = Agent(chat, closed_book_toolbox(), budget=Budget(max_steps=3)).run("Capital of France?")
    assert ep.tool_mode == "native" and ep.status == "answered" and ep.exact_answer == "Paris"
    assert (
        (ep.input_tokens, ep.output_tokens)
        == (60, 9)
        == (ledger.totals(role="agent")["input_tokens"], ledger.totals(role="agent")["output_tokens"])
    )
    sent = stub.chat_requests[0].body
    assert [t["function"]["name"] for t in sent["tools"]] == ["answer"]
    assert "response_format" not in sent


def test_tool_call_message_round_trips_to_the_provider(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    stub.push(_tool_reply("answer", '{"exact_answer": "Paris"}'))
    chat = LiteLLMChatModel(gateway_cfg(), "agent", tool_mode="native")
    history = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"query": "x"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "1. [d1] Paris"},
    ]
    forced = {"type": "function", "function": {"name": "answer"}}
    resp = chat.complete(
        history,
        tools=[
            {
                "type": "function",
                "function": {"name": "answer", "parameters": {"type": "object", "properties": {}}},
            }
        ],
        tool_choice=forced,
    )
    assert resp.tool_calls[0].name == "answer" and resp.tool_calls[0].id == "call_7"
    assert resp.finish_reason == "tool_calls" and resp.text == ""
    body = stub.chat_requests[0].body
    assert body["tool_choice"] == forced
    assert body["messages"][2] == {"role": "tool", "tool_call_id": "call_1", "content": "1. [d1] Paris"}


def test_failed_agent_call_records_the_ledgers_estimate_not_zero(
    gateway_cfg: CfgFactory, stub: StubServer
) -> None:
    # empty content and no usage: the LM layer bills an estimated prompt in the ledger; the
    # agent's lm_error step must carry that same count, not 0/0
    stub.push(Reply.no_usage(""))
    ledger = TokenLedger()
    chat = LiteLLMChatModel(gateway_cfg(**{"lm.agent.num_retries": 0}), "agent", ledger=ledger)
    ep = Agent(chat, closed_book_toolbox(), budget=Budget(max_steps=3)).run("Capital of France?")
    assert ep.status == "failed" and [s.kind for s in ep.steps] == ["lm_error"]
    (billed,) = ledger.records
    assert billed.failed and billed.estimated and billed.input_tokens > 0 and billed.output_tokens == 0
    assert (ep.steps[0].input_tokens, ep.steps[0].output_tokens) == (billed.input_tokens, 0)
    assert (ep.input_tokens, ep.output_tokens) == (billed.input_tokens, 0)


def test_failed_call_after_retries_carries_every_attempts_tokens(
    gateway_cfg: CfgFactory, stub: StubServer
) -> None:
    stub.push(Reply.server_error(500), Reply.server_error(503))
    ledger = TokenLedger()
    chat = LiteLLMChatModel(gateway_cfg(**{"lm.agent.num_retries": 1}), "agent", ledger=ledger)
    chat.lm.backoff_base_s = 0.01
    with pytest.raises(LMError) as info:
        chat.complete([{"role": "user", "content": "Capital of France?"}])
    assert [r.failed for r in ledger.records] == [True, True]
    assert info.value.input_tokens == sum(r.input_tokens for r in ledger.records) > 0
    assert info.value.output_tokens == 0


def _calls_reply(calls: list[dict[str, Any]], finish_reason: str, usage: tuple[int, int] = (60, 9)) -> Reply:
    body: dict[str, Any] = {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "stub-model",
        "choices": [
            {
                "index": 0,
                "finish_reason": finish_reason,
                "message": {"role": "assistant", "content": None, "tool_calls": calls},
            }
        ],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }
    return Reply._json(200, body, label="tool_calls")


def test_cut_arguments_reach_the_agent_raw_with_the_length_finish_reason(
    gateway_cfg: CfgFactory, stub: StubServer
) -> None:
    """Issue 25: '{"city": "Par' cut at max_tokens is kept as sent and reported as a named error."""
    cut = {"id": "call_9", "type": "function", "function": {"name": "answer", "arguments": '{"city": "Par'}}
    stub.push(_calls_reply([cut], "length"))
    stub.push(_tool_reply("answer", '{"explanation": "known", "exact_answer": "Paris", "confidence": 70}'))
    chat = LiteLLMChatModel(gateway_cfg(**{"agent.tool_calling": "native"}), "agent")
    ep = Agent(chat, closed_book_toolbox(), budget=Budget(max_steps=3)).run("Capital of France?")
    first = ep.steps[0]
    assert (first.kind, first.finish_reason, first.call_id) == ("invalid", "length", "call_9")
    assert first.reply == 'answer({"city": "Par)' and first.error is not None
    assert first.error.startswith("truncated_arguments: the arguments of answer are not valid JSON")
    assert ep.status == "answered" and ep.exact_answer == "Paris"
    resent = stub.chat_requests[1].body["messages"]
    assert resent[-2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Par'  # raw, not repaired
    assert resent[-1]["tool_call_id"] == "call_9" and resent[-1]["content"].startswith(
        '{"error": {"type": "truncated_arguments", "tool": "answer"'  # a JSON error object (issue 40)
    )


def test_parallel_calls_without_ids_get_unique_ids(gateway_cfg: CfgFactory, stub: StubServer) -> None:
    no_id = [
        {"type": "function", "function": {"name": "answer", "arguments": "{}"}},
        {"type": "function", "function": {"name": "answer", "arguments": "[1]"}},
    ]
    stub.push(_calls_reply(no_id, "tool_calls"))
    chat = LiteLLMChatModel(gateway_cfg(), "agent", tool_mode="native")
    resp = chat.complete(
        [{"role": "user", "content": "q"}], tools=[{"type": "function", "function": {"name": "answer"}}]
    )
    assert [(c.name, c.arguments) for c in resp.tool_calls] == [("answer", "{}"), ("answer", "[1]")]
    ids = [c.id for c in resp.tool_calls]
    assert len(set(ids)) == 2 and all(ids)  # LiteLLM names a missing id itself (a uuid)
