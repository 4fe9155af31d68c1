"""kitune.service.serving.stores: JSONL indexing with bad lines, the sweep, stats; and the CLI commands."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kitune.errors import DataError
from kitune.retrieval.memory import MemoryStore
from kitune.service.serving.stores import LineError, expire_kis, index_jsonl, iter_ki_jsonl, store_stats
from kitune.testing.store_contract import T0, make_ki


def _write_jsonl(path: Path) -> list[str]:
    kis = [
        make_ki("Marie Curie", "Warsaw", docid="d1", tags=["person"]),
        make_ki("Eiffel Tower", "Paris", docid="d2", tags=["landmark"], last_seen=T0 - timedelta(days=9)),
        make_ki("Old Bridge", "Mostar", docid="d3", tags=["landmark"], last_seen=T0 - timedelta(days=30)),
    ]
    bad_conf = kis[0].model_dump(mode="json")
    bad_conf["payload"]["confidence"] = "high"
    lines = [
        kis[0].model_dump_json(),
        "",
        "{not json",
        kis[1].model_dump_json(),
        json.dumps(bad_conf),
        "[1, 2]",
        kis[2].model_dump_json(),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [k.id for k in kis]


def test_iter_jsonl_reports_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "kis.jsonl"
    _write_jsonl(path)
    items = list(iter_ki_jsonl(path))
    errors = [i for i in items if isinstance(i, LineError)]
    assert [e.line for e in errors] == [3, 5, 6]
    assert "not JSON" in errors[0].message
    assert errors[1].message.startswith("payload.confidence")
    assert "expected a JSON object" in errors[2].message
    with pytest.raises(DataError, match="not found"):
        list(iter_ki_jsonl(tmp_path / "missing.jsonl"))


def test_index_jsonl_counts_and_batches(tmp_path: Path) -> None:
    path = tmp_path / "kis.jsonl"
    ids = _write_jsonl(path)
    store = MemoryStore()
    report = index_jsonl(store, path, batch_size=2)
    assert report.lines == 6 and [b.line for b in report.bad_lines] == [3, 5, 6]
    assert (report.write.submitted, report.write.indexed, report.write.failed) == (3, 3, [])
    assert not report.ok
    assert sorted(k.id for k in store.iter_kis()) == sorted(ids)


def test_expire_and_stats(tmp_path: Path) -> None:
    path = tmp_path / "kis.jsonl"
    _write_jsonl(path)
    store = MemoryStore()
    index_jsonl(store, path)
    result = expire_kis(store, now=T0, stale_after=timedelta(days=7))
    assert (result.stale, result.expired) == (1, 1)
    stats = store_stats(store, top=1)
    assert stats.total == 3
    assert stats.by_status == {"active": 1, "stale": 1, "expired": 1}
    assert stats.by_tag == {"landmark": 2}
    assert len(stats.by_doc) == 1 and len(stats.by_entity) == 1


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "kitune.yaml"
    cfg.write_text(f"workdir: {tmp_path / 'work'}\nembedder:\n  type: hash\n  dim: 32\n", encoding="utf-8")
    return cfg


def test_cli_index_expire_stats(tmp_path: Path) -> None:
    from kitune.cli import _register, app

    _register()
    runner = CliRunner()
    cfg = _config(tmp_path)
    path = tmp_path / "kis.jsonl"
    _write_jsonl(path)
    res = runner.invoke(app, ["index", str(path), "--config", str(cfg)])
    assert res.exit_code == 1, res.output  # bad lines → exit 1, good KIs still indexed
    assert "6 lines, 3 bad, 3 submitted, 3 indexed, 0 failed (lancedb store)" in res.output
    assert "line 3:" in res.output and "line 5:" in res.output
    res = runner.invoke(app, ["expire", "--config", str(cfg), "--at", "2026-11-01T12:00:00Z"])
    assert res.exit_code == 0, res.output
    assert "1 became stale, 1 became expired" in res.output
    res = runner.invoke(app, ["stats", "--config", str(cfg), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["total"] == 3 and data["by_status"] == {"active": 1, "stale": 1, "expired": 1}
    res = runner.invoke(app, ["stats", "--config", str(cfg)])
    assert res.exit_code == 0 and "Top tags" in res.output and "landmark" in res.output
    res = runner.invoke(app, ["expire", "--config", str(cfg), "--at", "yesterday"])
    assert res.exit_code == 2 and "not an ISO date" in res.output


def test_cli_stats_on_a_fresh_workdir_creates_nothing_and_index_feeds_context(tmp_path: Path) -> None:
    from kitune.cli import _register, app
    from kitune.config import load_config
    from kitune.service.serving.prompts import production_setting

    _register()
    runner = CliRunner()
    cfg = _config(tmp_path)
    res = runner.invoke(app, ["stats", "--config", str(cfg)])
    assert res.exit_code == 0 and "no KIs yet" in res.output
    assert not any(tmp_path.rglob("*.lance"))  # a read-only command wrote nothing
    path = tmp_path / "kis.jsonl"
    _write_jsonl(path)
    runner.invoke(app, ["index", str(path), "--config", str(cfg)])
    # index writes the table the serving commands read (the production extractor's)
    table = production_setting(load_config(cfg), programs=("extractor",)).store_cfg.store.table
    assert [p.name for p in (tmp_path / "work" / "lancedb").glob("*.lance")] == [f"{table}.lance"]


def test_cli_bad_input_creates_no_store(tmp_path: Path) -> None:
    from kitune.cli import _register, app

    _register()
    runner = CliRunner()
    cfg = _config(tmp_path)
    for args, said in (
        (["index", str(tmp_path)], "is a directory"),
        (["index", str(tmp_path / "nope.jsonl")], "not found"),
        (["expire", "--at", "yesterday"], "not an ISO date"),
    ):
        res = runner.invoke(app, [*args, "--config", str(cfg)])
        assert res.exit_code == 2 and said in res.output, res.output
    assert not (tmp_path / "work").exists()  # checked before the store opened


def test_cli_help_teaches() -> None:
    from kitune.cli import _register, app

    _register()
    res = CliRunner().invoke(app, ["expire", "--help"])
    assert res.exit_code == 0
    assert "stale_after_days" in res.output and "--now" in res.output


class _OptimizeCounter(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.optimized = 0

    def optimize(self) -> None:
        self.optimized += 1


def test_index_jsonl_optimizes_once_after_the_bulk_load(tmp_path: Path) -> None:
    path = tmp_path / "kis.jsonl"
    _write_jsonl(path)
    store = _OptimizeCounter()
    index_jsonl(store, path, batch_size=1)
    assert store.optimized == 1


def test_retention_from_config_and_refresh_helpers() -> None:
    from kitune.config import load_config
    from kitune.schema import Filter
    from kitune.service.serving.stores import refresh_derived, refresh_documents, retention_from

    cfg = load_config(overrides={"lifecycle.stale_after_days": 5})
    assert retention_from(cfg) == {
        "disambiguation": timedelta(days=5),
        "source_description": timedelta(days=5),
    }
    cfg = load_config(overrides={"lifecycle.derived_stale_after_days": 40})
    assert set(retention_from(cfg).values()) == {timedelta(days=40)}
    store = MemoryStore()
    old = T0 - timedelta(days=20)
    fact = make_ki("A", "B", docid="d1", last_seen=old, status="expired")
    other = make_ki("C", "D", docid="d2", last_seen=old)
    dis = make_ki("A", "E", docid="d1", last_seen=old, subtype="disambiguation")
    store.upsert([fact, other, dis])
    assert refresh_documents(store, ["d1", "d9"], T0) == 1  # the dataset fact only
    assert store.get(fact.id).payload.status == "active" and store.get(fact.id).payload.last_seen == T0
    assert store.get(dis.id).payload.last_seen == old and store.get(other.id).payload.last_seen == old
    assert refresh_derived(store, ["d2"], T0) == 0
    assert refresh_derived(store, ["d1"], T0) == 1
    assert store.count(Filter(statuses=("active",))) == 3


def test_cli_reindex_refuses_the_embedded_store(tmp_path: Path) -> None:
    from kitune.cli import _register, app

    _register()
    res = CliRunner().invoke(app, ["reindex", "--from", "kitune-kis", "--config", str(_config(tmp_path))])
    assert res.exit_code != 0 and "reindex needs store.type=elasticsearch" in res.output
    res = CliRunner().invoke(app, ["reindex", "--help"])
    assert res.exit_code == 0 and "--from" in res.output


@pytest.mark.parametrize("bulk_index", [None, "ai-index-idx-kis"])
def test_index_reads_back_an_ai_index_export_losslessly(tmp_path: Path, bulk_index: str | None) -> None:
    # `kitune index FILE` on `kitune export --format elastic-ai-index` output said "33 lines, 33 bad"
    # (references.0: Input should be a valid string) (newcomer check, issue 25)
    from kitune.service.serving.export import export_ai_index

    kis = [
        make_ki("Marie Curie", "Warsaw", docid="d1", tags=["person"]),
        make_ki("Eiffel Tower", "Paris", docid="d2", status="stale", last_seen=T0 - timedelta(days=9)),
        make_ki("Old Bridge", "Mostar", docid="d3", expires_at=T0 + timedelta(days=3)),
    ]
    extra = {"references": ["index://fixture"], "prompt_version": "extractor@0a1b2c3d"}
    kis[0] = kis[0].model_copy(update=extra)
    source = MemoryStore()
    source.upsert(kis)
    out = tmp_path / "kis.ndjson"
    export_ai_index(source, out, bulk_index=bulk_index)
    assert '"references": [{"uri": "index://fixture"}]' in out.read_text(encoding="utf-8")
    target = MemoryStore()
    report = index_jsonl(target, out)
    assert report.bad_lines == [] and report.ok
    assert report.write.indexed == 3
    for ki in kis:
        assert target.get(ki.id) == ki
