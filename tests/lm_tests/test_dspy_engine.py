"""Why KituneLM still overrides ``dspy.LM.forward``: the blockers of a DSPy engine, measured (issue 24).

DSPy 3.4 deprecates custom LMs that override ``forward`` and asks for an engine,
``dspy.LM(engine=...)`` with ``complete(Request) -> Response``, DSPy owning retries and the
cache. These tests run a minimal engine through the installed DSPy and pin what would change for
kitune; docs/guide.md "Why KituneLM still overrides dspy.LM.forward" cites them. When one fails after a
DSPy upgrade, that blocker is gone: revisit the migration.
"""

from __future__ import annotations

import json
from typing import Any

import dspy
import pytest
from dspy.lm15 import Request, Response, response_from_openai_chat
from dspy.utils.exceptions import LMUnexpectedError, LMUnsupportedFeatureError

from kitune.errors import LMRateLimitError


class Engine:
    """One attempt per call, as the engine contract asks; records each request, then replies or raises."""

    def __init__(self, error: Exception | None = None) -> None:
        self.requests: list[Request] = []
        self.error = error

    def complete(self, request: Request) -> Response:
        self.requests.append(request)
        if self.error is not None:
            raise self.error
        reply = {"role": "assistant", "content": "ok"}
        body = {
            "id": "r",
            "model": request.model,
            "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
        }
        return response_from_openai_chat(body, model=request.model)  # type: ignore[no-any-return]

    def stream(self, request: Request) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        pass


MSGS = [{"role": "system", "content": "Extract."}, {"role": "user", "content": "Acme was founded in 1999."}]


def test_kitunes_errors_come_back_as_dspy_unexpected_errors_and_are_not_retried() -> None:
    engine = Engine(LMRateLimitError("429 slow down", model="m", retry_after_s=0.0))
    lm = dspy.LM("openai/m", engine=engine, num_retries=2, cache=False)
    with pytest.raises(LMUnexpectedError) as info:
        lm("hi")
    # the caller's except LMRateLimitError / LMAuthError / EmptyCompletionError no longer matches
    assert not isinstance(info.value, LMRateLimitError)
    assert isinstance(info.value.__cause__, LMRateLimitError)
    assert len(engine.requests) == 1  # a retryable 429, yet one attempt: DSPy retries only its own classes


def test_the_local_models_response_format_cannot_reach_an_engine() -> None:
    # llama.cpp's grammar mode, what LocalJSONAdapter sends on the default (embedded model) path
    local = {"type": "json_object", "schema": {"type": "object", "properties": {"facts": {"type": "array"}}}}
    engine = Engine()
    lm = dspy.LM("openai/local", engine=engine, cache=False)
    with pytest.raises(LMUnsupportedFeatureError, match="response_format key 'schema'"):
        lm(messages=MSGS, response_format=local)
    assert engine.requests == []


def test_tool_call_arguments_reach_an_engine_parsed_and_malformed_ones_not_at_all() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_context", "arguments": '{"query": "x"}'},
    }
    history = [
        *MSGS,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "no result"},
    ]
    engine = Engine()
    lm = dspy.LM("openai/m", engine=engine, cache=False)
    lm(messages=history)
    part = engine.requests[0].messages[1].parts[0]
    # the string the model wrote (and kitune sends back verbatim) is gone: only a dict is left,
    # which lm15's dialect writes back as '{"query":"x"}' (compact), so the request bytes change
    assert part.input == {"query": "x"} and json.dumps(part.input, separators=(",", ":")) != '{"query": "x"}'
    call["function"]["arguments"] = '{"query": "x"'  # a small model's broken tool call, echoed back
    with pytest.raises(ValueError, match="arguments is not JSON"):
        lm(messages=history)
    assert len(engine.requests) == 1


def test_rollout_id_and_the_per_call_cache_flag_never_reach_an_engine() -> None:
    engine = Engine()
    lm = dspy.LM("openai/m", engine=engine, cache=False)
    lm("hi", rollout_id=1, temperature=0.7)
    lm("hi", rollout_id=2, temperature=0.7, cache=False)
    first, second = engine.requests
    # kitune's recording hash and response cache key include rollout_id; an engine cannot tell
    # the two calls apart, and a cache=False retry (the extractor's, case D2) is invisible to it
    assert first == second
    assert first.config.extensions is None
