"""Tests for kitune.testing.openai_stub: scripted replies, recording, default reply, fast stop."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from kitune.testing.openai_stub import Reply, StubServer


def _post(url: str, body: dict[str, object], timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-x"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_replies_in_order_then_default_and_records_requests() -> None:
    with StubServer(
        [Reply.ok("first", usage=(3, 1)), Reply.rate_limited(retry_after_s=0.3)],
        default=Reply.no_usage("rest"),
    ) as stub:
        url = stub.base_url + "/chat/completions"
        status, _, body = _post(url, {"model": "m", "messages": [], "temperature": 0.2})
        data = json.loads(body)
        assert status == 200 and data["choices"][0]["message"]["content"] == "first"
        assert data["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        status, headers, body = _post(url, {"model": "m"})
        assert status == 429 and headers["Retry-After"] == "0.3"
        assert json.loads(body)["error"]["code"] == "rate_limit_exceeded"
        status, _, body = _post(url, {"model": "m"})
        assert status == 200 and "usage" not in json.loads(body)
        assert [r.body.get("temperature") for r in stub.chat_requests] == [0.2, None, None]
        assert stub.chat_requests[0].headers["authorization"] == "Bearer sk-x"
        assert _post(stub.base_url + "/embeddings", {})[0] == 404


def test_scripted_bodies_match_the_cases() -> None:
    empty = json.loads(Reply.empty_choices().body)
    assert empty["choices"] == [] and empty["usage"] is None
    assert empty["prompt_filter_results"][0]["content_filter_results"]["violence"]["filtered"] is True
    msg = json.loads(Reply.reasoning_only().body)["choices"][0]["message"]
    assert msg["content"] == "" and msg["reasoning_content"]
    assert "try again in 0.3s" in json.loads(Reply.rate_limited(body_hint="0.3s").body)["error"]["message"]
    assert Reply.proxy_page().status == 407 and b"<html>" in Reply.proxy_page().body
    assert json.loads(Reply.truncated().body)["choices"][0]["finish_reason"] == "length"
    assert "only json_object and text" in json.loads(Reply.reject_response_format().body)["error"]["message"]


def test_stop_interrupts_a_sleeping_reply() -> None:
    stub = StubServer([Reply.slow(30.0)]).start()
    with pytest.raises(OSError):  # the client times out; the server keeps sleeping
        _post(stub.base_url + "/chat/completions", {}, timeout=0.3)
    started = time.monotonic()
    stub.stop()
    assert time.monotonic() - started < 5.0
    stub.stop()  # idempotent


def test_backlog_accepts_a_burst_of_connections() -> None:
    import concurrent.futures

    with StubServer(default=Reply.slow(0.2)) as stub:
        url = stub.base_url + "/chat/completions"
        with concurrent.futures.ThreadPoolExecutor(40) as pool:
            statuses = list(pool.map(lambda _: _post(url, {}, timeout=10)[0], range(40)))
        assert statuses == [200] * 40
        assert len(stub.chat_requests) == 40
