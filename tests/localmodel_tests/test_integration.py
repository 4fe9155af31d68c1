"""One real call to the embedded local model (skipped unless KITUNE_LOCAL_MODEL_TESTS=1)."""

from __future__ import annotations

import json
import os

import pytest

from kitune.config import LocalModelConfig
from kitune.localmodel import LOCAL_API_KEY, get_local_server

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.environ.get("KITUNE_LOCAL_MODEL_TESTS") != "1",
        reason="needs the real GGUF and llama-cpp-python: set KITUNE_LOCAL_MODEL_TESTS=1 "
        "(model: $KITUNE_LOCAL_MODEL_TEST_MODEL, default qwen2.5-coder-1.5b)",
    ),
]


def test_real_server_answers_a_json_object_completion() -> None:
    import litellm

    model = os.environ.get("KITUNE_LOCAL_MODEL_TEST_MODEL", "qwen2.5-coder-1.5b")
    server = get_local_server(LocalModelConfig(model=model, n_ctx=2048))  # type: ignore[arg-type]
    schema = {"type": "object", "properties": {"capital": {"type": "string"}}, "required": ["capital"]}
    resp = litellm.completion(
        model=server.litellm_model,
        api_base=server.api_base,
        api_key=LOCAL_API_KEY,
        max_tokens=24,
        temperature=0.0,
        num_retries=0,
        timeout=300,
        messages=[{"role": "user", "content": "Reply with JSON: the capital of France."}],
        response_format={"type": "json_object", "schema": schema},
    )
    data = json.loads(resp.choices[0].message.content)
    assert isinstance(data["capital"], str)
    assert resp.usage.prompt_tokens > 5 and resp.usage.completion_tokens > 0
    if model != "gemma3-270m":
        assert "paris" in data["capital"].lower()
