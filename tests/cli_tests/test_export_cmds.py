"""``kitune export --format elastic-ai-index`` and ``kitune index create --mapping ai-index`` (CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from kitune.cli import export_cmds, store_cmds
from kitune.config import load_config
from kitune.retrieval.ai_index import ai_document_to_ki, ai_index_mapping, check_document_types
from kitune.service.serving.setting import open_serving_store
from kitune.testing.store_contract import make_ki


def _env(tmp_path: Path) -> tuple[typer.Typer, Path]:
    cfg = tmp_path / "kitune.yaml"
    cfg.write_text(
        f"workdir: {tmp_path / 'w'}\nembedder: {{type: hash, dim: 64}}\n"
        f"store: {{type: lancedb, path: {tmp_path / 'lance'}}}\n",
        encoding="utf-8",
    )
    app = typer.Typer()
    store_cmds.register(app)
    export_cmds.register(app)
    return app, cfg


def test_export_writes_valid_documents_and_a_bulk_body(tmp_path: Path) -> None:
    app, cfg = _env(tmp_path)
    run = CliRunner()
    empty = run.invoke(app, ["export", "--out", str(tmp_path / "x.jsonl"), "-c", str(cfg)])
    assert empty.exit_code == 2 and "no KIs yet" in empty.output
    kis = [
        make_ki("Marie Curie", "Warsaw", docid="d1", predicate="born_in"),
        make_ki("Old Bridge", "Mostar", docid="d2", status="expired"),
        make_ki("Many", "Tags", docid="d3", tags=[f"t{i}" for i in range(99)]),  # 102 tags: over the limit
    ]
    store = open_serving_store(load_config(cfg))
    assert store is not None and store.upsert(kis).ok
    store.close()
    out = tmp_path / "kis.jsonl"
    r = run.invoke(app, ["export", "--format", "elastic-ai-index", "--out", str(out), "-c", str(cfg)])
    assert r.exit_code == 1 and f"{out}: 2 KI document(s) written, 1 over a limit" in r.output
    assert f"skipped: KI {kis[2].id}: the number of tags is 102" in r.output.replace("\n", " ")
    docs = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(d["id"] for d in docs) == sorted(k.id for k in kis[:2])
    assert all(check_document_types(d, ai_index_mapping()) == [] for d in docs)
    assert {d["id"]: d["governance"]["lifecycle"]["status"] for d in docs} == {
        kis[0].id: "active",
        kis[1].id: "expired",
    }
    assert sorted(ai_document_to_ki(d).id for d in docs) == sorted(k.id for k in kis[:2])
    bulk = tmp_path / "bulk.ndjson"
    r = run.invoke(
        app,
        ["export", "-o", str(bulk), "--status", "active", "--bulk-index", "ai-index-idx-kis", "-c", str(cfg)],
    )
    assert r.exit_code == 1 and "1 KI document(s) written, 1 over a limit" in r.output  # Many is active too
    lines = [json.loads(line) for line in bulk.read_text().splitlines()]
    assert (
        lines[0] == {"index": {"_index": "ai-index-idx-kis", "_id": kis[0].id}}
        and lines[1]["id"] == kis[0].id
    )
    assert len(lines) == 2
    bad = run.invoke(app, ["export", "-o", str(bulk), "--format", "csv", "-c", str(cfg)])
    assert bad.exit_code == 2 and "use elastic-ai-index" in bad.output


def test_index_create_prints_the_mapping_and_needs_elasticsearch(tmp_path: Path) -> None:
    app, cfg = _env(tmp_path)
    run = CliRunner()
    printed = run.invoke(app, ["index", "create", "--mapping", "ai-index", "--print", "-c", str(cfg)])
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.output) == {"mappings": ai_index_mapping()}
    no_es = run.invoke(app, ["index", "create", "--mapping", "ai-index", "-c", str(cfg)])
    assert no_es.exit_code == 2 and "needs store.type: elasticsearch" in no_es.output
    wrong = run.invoke(app, ["index", "create", "--mapping", "nope", "-c", str(cfg)])
    assert wrong.exit_code == 2 and "use kitune or ai-index" in wrong.output
    stray = run.invoke(app, ["index", str(tmp_path / "kis.jsonl"), "--mapping", "ai-index", "-c", str(cfg)])
    assert stray.exit_code == 2 and "belong to `kitune index create" in stray.output


def test_index_help_teaches_both_forms_and_create_is_a_real_sub_command(tmp_path: Path) -> None:
    app, cfg = _env(tmp_path)
    run = CliRunner()
    env = {"COLUMNS": "200"}
    group = run.invoke(app, ["index", "--help"], env=env)
    assert group.exit_code == 0, group.output
    for said in (
        "Usage: root index [OPTIONS] FILE | COMMAND [ARGS]...",
        "kitune index FILE (the same as kitune index load FILE) loads the KIs of a JSONL file",
        "kitune index create --mapping ai-index creates the configured Elasticsearch index",
        "--mapping kitune: kitune's own layout",
        "--print: print the mapping, no cluster needed",
    ):
        assert said in group.output, said
    assert [
        line.split()[1] for line in group.output.splitlines() if line.startswith(("│ load", "│ create"))
    ] == [
        "load",
        "create",
    ]
    create = run.invoke(app, ["index", "create", "--help"], env=env)
    assert create.exit_code == 0 and "--mapping" in create.output and "--print" in create.output
    assert "Example: kitune index create --mapping ai-index --index ai-index-idx-kis" in create.output
    load = run.invoke(app, ["index", "load", "--help"], env=env)
    assert load.exit_code == 0 and "--batch-size" in load.output and "--mapping" not in load.output
    # a first argument that names no sub-command is the FILE of `load`, options first or last
    for args in (
        ["index", "-c", str(cfg), str(tmp_path / "nope.jsonl")],
        ["index", "load", str(tmp_path / "nope.jsonl")],
    ):
        missing = run.invoke(app, args)
        assert missing.exit_code == 2 and "not found" in missing.output, missing.output
    no_mapping = run.invoke(app, ["index", "create", "-c", str(cfg)])
    assert no_mapping.exit_code == 2
    assert "kitune index create needs --mapping: ai-index or kitune" in no_mapping.output
