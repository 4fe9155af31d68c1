"""`kitune mcp --transport http`: bearer token, body cap, loopback rule (same as `kitune serve`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from typer.testing import CliRunner

pytest.importorskip("mcp")

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from kitune.cli import _register, app

SRC = Path(__file__).resolve().parents[2] / "src"
TOKEN = "test-token-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mcphttp")
    cfg = root / "kitune.yaml"
    cfg.write_text(
        f"workdir: {root / 'work'}\nembedder: {{type: hash, dim: 64}}\n"
        f"store: {{type: lancedb, path: {root / 'l'}}}\n",
        encoding="utf-8",
    )
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(SRC),
        "KITUNE_API_TOKEN": TOKEN,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kitune",
            "mcp",
            "--transport",
            "http",
            "--port",
            str(port),
            "--no-rewrite",
            "--config",
            str(cfg),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=root,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_missing_or_wrong_token_is_401(endpoint: str) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    r = httpx.post(endpoint, json=body, timeout=10)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json() == {"error": {"type": "http_error", "message": "missing or wrong bearer token"}}
    r2 = httpx.post(endpoint, json=body, headers={"Authorization": "Bearer nope"}, timeout=10)
    assert r2.status_code == 401


def test_body_over_cap_is_413(endpoint: str) -> None:
    r = httpx.post(
        endpoint,
        content=b"{" + b" " * (70 * 1024) + b"}",
        headers={
            "Authorization": f"Bearer {TOKEN}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        },
        timeout=10,
    )
    assert r.status_code == 413


def test_sdk_client_with_token_lists_tools(endpoint: str) -> None:
    import httpx2

    async def main() -> Any:
        client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"})
        async with client, streamable_http_client(endpoint, http_client=client) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = (await session.list_tools()).tools
                empty = await session.call_tool("get_context", {"query": "Globex"})
                return tools, empty

    tools, empty = anyio.run(main)
    assert sorted(t.name for t in tools) == ["get_context", "get_document", "search_documents"]
    assert not empty.is_error and empty.structured_content["kis"] == []


def test_public_host_without_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KITUNE_API_TOKEN", raising=False)
    _register()
    r = CliRunner().invoke(app, ["mcp", "--transport", "http", "--host", "0.0.0.0", "--no-rewrite"])
    assert r.exit_code == 2
    assert "KITUNE_API_TOKEN" in r.output and "0.0.0.0" in r.output
