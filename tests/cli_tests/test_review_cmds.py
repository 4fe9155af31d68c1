"""``kitune signals`` and ``kitune review`` from the shell, end to end on unlabelled production chats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from kitune.cli import review_cmds, signals_cmds
from kitune.config import load_config
from kitune.service.serving.setting import open_serving_store
from kitune.testing.review import scenario


@pytest.fixture
def env(tmp_path: Path) -> tuple[typer.Typer, Path, Path]:
    cfg_file = tmp_path / "kitune.yaml"
    cfg_file.write_text(
        f"workdir: {tmp_path / 'w'}\nembedder: {{type: hash, dim: 64}}\n"
        f"store: {{type: lancedb, path: {tmp_path / 'lance'}}}\n",
        encoding="utf-8",
    )
    store = open_serving_store(load_config(cfg_file))
    assert store is not None and store.upsert(scenario().kis).ok
    store.close()
    prod = tmp_path / "prod.jsonl"
    prod.write_text("".join(json.dumps(c) + "\n" for c in scenario().chats), encoding="utf-8")
    app = typer.Typer()
    signals_cmds.register(app)
    review_cmds.register(app)
    return app, cfg_file, prod


def test_signals_json_and_table(env: tuple[typer.Typer, Path, Path]) -> None:
    app, cfg, prod = env
    r = CliRunner().invoke(app, ["signals", str(prod), "--json", "--no-track", "-c", str(cfg)])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["by_kind"] == {
        "empty_retrieval": 3,
        "fell_back_to_raw": 3,
        "looped": 1,
        "budget_exhausted": 0,
        "answer_unsupported": 2,
        "coverage_gap": 3,
        "query_error": 0,
    }
    assert data["coverage_computed"] is True and data["n_traces"] == 5
    table = CliRunner().invoke(app, ["signals", str(prod), "--no-track", "-c", str(cfg)], terminal_width=200)
    assert table.exit_code == 0 and "answer unsupported" in table.output and "conv-4" in table.output
    missing = CliRunner().invoke(app, ["signals", "--no-track", "-c", str(cfg)])
    assert missing.exit_code == 2 and "no traces given" in missing.output


def test_review_queue_end_to_end(env: tuple[typer.Typer, Path, Path]) -> None:
    app, cfg, prod = env
    run = CliRunner()
    filed = run.invoke(
        app, ["review", "propose", str(prod), "--no-track", "-c", str(cfg)], terminal_width=200
    )
    assert filed.exit_code == 0, filed.output
    assert "5 trace(s) → 2 new proposal(s)" in filed.output
    listed = json.loads(run.invoke(app, ["review", "list", "--json", "-c", str(cfg)]).output)
    assert [(p["kind"], p["status"]) for p in listed] == [
        ("retire_ki", "pending"),
        ("rewriter_feedback", "pending"),
    ]
    retire, feedback = listed[0]["id"], listed[1]["id"]
    shown = run.invoke(app, ["review", "show", retire, "-c", str(cfg)], terminal_width=200)
    assert (
        shown.exit_code == 0
        and "status active → expired; reversible" in shown.output
        and "conv-5" in shown.output
    )
    no_reason = run.invoke(app, ["review", "reject", feedback, "--no-track", "-c", str(cfg)])
    assert no_reason.exit_code == 2 and "needs a reason" in no_reason.output
    rejected = run.invoke(
        app, ["review", "reject", feedback, "--reason", "plans are fine", "--no-track", "-c", str(cfg)]
    )
    assert rejected.exit_code == 0 and f"{feedback} rewriter_feedback: rejected" in rejected.output
    approved = run.invoke(app, ["review", "approve", retire, "--no-track", "-c", str(cfg)])
    assert approved.exit_code == 0 and "approved" in approved.output
    store = open_serving_store(load_config(cfg))
    assert store is not None and store.get(scenario().kis[0].id).payload.status == "expired"
    again = run.invoke(app, ["review", "approve", retire, "--no-track", "-c", str(cfg)])
    assert again.exit_code == 2 and "is approved" in again.output
    reverted = run.invoke(
        app, ["review", "revert", retire, "--reason", "KI was right", "--no-track", "-c", str(cfg)]
    )
    store.close()
    store = open_serving_store(load_config(cfg))  # a fresh reader sees the other writer's commit
    assert reverted.exit_code == 0 and store is not None
    assert store.get(scenario().kis[0].id).payload.status == "active"
    store.close()
    unknown = run.invoke(app, ["review", "show", "p-000000000000", "-c", str(cfg)])
    assert unknown.exit_code == 2 and "no proposal 'p-000000000000'" in unknown.output
    # the rejected and the reverted change are history: proposing again files nothing
    refiled = run.invoke(
        app, ["review", "propose", str(prod), "--no-track", "-c", str(cfg)], terminal_width=200
    )
    assert "5 trace(s) → 0 new proposal(s)" in refiled.output and "already proposed" in refiled.output
