"""``/api/proposals`` and the review MCP tools, end to end over the same queue as ``kitune review``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient

from kitune.config import KituneConfig
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryStore
from kitune.server import create_app
from kitune.service.workflows.proposals import ProposalStore
from kitune.service.workflows.review import ReviewService, file_proposals
from kitune.service.workflows.signals import load_signal_traces, signal_report, store_facts
from kitune.testing.review import TableDrafter, scenario
from kitune.testing.tracking import RecordingTracker

TOKEN = "s3cret-token"


@pytest.fixture
def queue(tmp_path: Path) -> tuple[KituneConfig, ReviewService, MemoryStore, RecordingTracker]:
    cfg = KituneConfig(workdir=tmp_path / "w", review={"mcp_tools": True})
    store = MemoryStore(HashEmbedder(dim=64))
    sc = scenario()
    store.upsert(sc.kis)
    tracker = RecordingTracker()
    svc = ReviewService(cfg, ProposalStore.of(cfg), store, None, tracker)
    path = tmp_path / "prod.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in sc.chats), encoding="utf-8")
    report = signal_report(cfg, load_signal_traces([path]).traces, facts=store_facts(store))
    docs = {d.docid: d for d in sc.docs}
    file_proposals(svc, report, documents=docs.get, draft=TableDrafter(sc.drafts))
    return cfg, svc, store, tracker


def test_http_list_show_approve_reject_revert(queue: Any) -> None:
    cfg, svc, store, tracker = queue
    client = TestClient(
        create_app(cfg, store=store, review=svc, api_token=TOKEN), raise_server_exceptions=False
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/api/proposals").status_code == 401
    listed = client.get("/api/proposals", headers=auth).json()["proposals"]
    assert [(p["kind"], p["status"], p["evidence_traces"]) for p in listed] == [
        ("re_extract", "pending", 2),
        ("add_ki", "pending", 1),
        ("retire_ki", "pending", 2),
    ]
    add, retire = listed[1]["id"], listed[2]["id"]
    assert [p["id"] for p in client.get("/api/proposals?kind=add_ki", headers=auth).json()["proposals"]] == [
        add
    ]
    bad = client.get("/api/proposals?status=done", headers=auth)
    assert bad.status_code == 422 and bad.json()["error"]["type"] == "validation_error"
    shown = client.get(f"/api/proposals/{add}", headers=auth).json()
    assert shown["proposal"]["diff"].startswith("+ [ki-") and [e["action"] for e in shown["events"]] == [
        "filed"
    ]
    assert shown["proposal"]["evidence"][0]["trace_id"] == "conv-3"
    missing = client.get("/api/proposals/p-000000000000", headers=auth)
    assert missing.status_code == 404 and missing.json()["error"] == {
        "type": "not_found",
        "message": "no proposal 'p-000000000000': list them with `kitune review list`",
    }
    no_reason = client.post(f"/api/proposals/{retire}/reject", headers=auth, json={})
    assert no_reason.status_code == 422 and "needs a reason" in no_reason.json()["error"]["message"]
    rejected = client.post(f"/api/proposals/{retire}/reject", headers=auth, json={"reason": "KI is right"})
    assert rejected.status_code == 200 and rejected.json() == {
        "proposal": {**rejected.json()["proposal"], "status": "rejected"},
        "reason": "KI is right",
    }
    conflict = client.post(f"/api/proposals/{retire}/approve", headers=auth, json={})
    assert conflict.status_code == 409 and conflict.json()["error"]["type"] == "conflict"
    approved = client.post(f"/api/proposals/{add}/approve", headers=auth, json={"reason": "ok"})
    assert approved.status_code == 200 and approved.json()["proposal"]["status"] == "approved"
    sauvestre = scenario().drafts["d8"][0].id
    assert store.get(sauvestre).payload.status == "active"
    reverted = client.post(f"/api/proposals/{add}/revert", headers=auth, json={})
    assert (
        reverted.json()["proposal"]["status"] == "reverted"
        and store.get(sauvestre).payload.status == "expired"
    )
    assert svc.queue.events(add)[-1]["actor"] == "http"
    assert tracker.by_name(f"review-{add}-approved").params["review.actor"] == "http"
    paths = client.get("/openapi.json").json()["paths"]
    assert set(paths["/api/proposals/{pid}/approve"]["post"]["responses"]) >= {
        "200",
        "401",
        "404",
        "409",
        "422",
    }


def test_mcp_review_tools(queue: Any) -> None:
    pytest.importorskip("mcp")
    from mcp.server.mcpserver.exceptions import ToolError

    from kitune.mcp_server import create_mcp_server

    cfg, svc, store, _ = queue
    server = create_mcp_server(cfg, store=store, review=svc)

    def call(name: str, **args: Any) -> Any:
        return anyio.run(lambda: server.call_tool(name, args))

    names = {t.name for t in anyio.run(server.list_tools)}
    assert {
        "list_proposals",
        "show_proposal",
        "approve_proposal",
        "reject_proposal",
        "revert_proposal",
    } <= names
    listed = call("list_proposals", status="pending").structured_content["proposals"]
    retire = next(p["id"] for p in listed if p["kind"] == "retire_ki")
    shown = call("show_proposal", proposal_id=retire).structured_content
    assert shown["proposal"]["change"]["ki_ids"] == [scenario().kis[0].id]
    done = call("approve_proposal", proposal_id=retire, reason="both answers were unsupported")
    assert done.structured_content == {
        "proposal": {**done.structured_content["proposal"], "status": "approved"},
        "reason": "both answers were unsupported",
    }
    assert store.get(scenario().kis[0].id).payload.status == "expired"
    with pytest.raises(ToolError, match="is approved; the step 'rejected' needs it pending"):
        call("reject_proposal", proposal_id=retire, reason="late")
    with pytest.raises(ToolError):
        call("show_proposal", proposal_id="not-an-id")
    call("revert_proposal", proposal_id=retire)
    assert store.get(scenario().kis[0].id).payload.status == "active"
    # without review.mcp_tools the write tools are not served
    plain = create_mcp_server(KituneConfig(workdir=cfg.workdir), store=store)
    assert {t.name for t in anyio.run(plain.list_tools)} == {
        "get_context",
        "search_documents",
        "get_document",
    }
