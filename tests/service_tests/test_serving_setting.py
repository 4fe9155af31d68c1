"""service/serving/setting: the one wiring of a served setting (store + rewriter with its LM)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dspy.utils import DummyLM

from kitune.config import KituneConfig
from kitune.errors import ConfigError
from kitune.lm import KituneJSONAdapter, KituneLM, build_lm
from kitune.retrieval.memory import MemoryStore
from kitune.service.serving.prompts import production_setting
from kitune.service.serving.setting import (
    build_served,
    follow_production,
    open_store,
    rewriter_for,
    served_versions,
)
from kitune.testing.embedders import HashEmbedder
from kitune.testing.store_contract import make_ki


class _ClosingStore(MemoryStore):
    closed = 0

    def close(self) -> None:
        _ClosingStore.closed += 1
        super().close()


def _cfg(tmp_path: Path) -> KituneConfig:
    return KituneConfig(
        workdir=tmp_path / "w",
        corpus_name="tiny",
        lm={"gateway": {"base_url_env": "KI_TEST_GW", "default_model": "my-own-model"}},
    )


def test_rewriter_for_scopes_kitunes_adapter_around_a_kitune_lm_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KI_TEST_GW", "http://127.0.0.1:9/v1")
    lm = build_lm(_cfg(tmp_path), "rewrite")
    assert isinstance(lm, KituneLM)
    served = rewriter_for("Rewrite the question.", lm)
    assert type(served.adapter) is KituneJSONAdapter  # a gateway model: the JSON adapter
    assert served.get_lm() is lm
    stand_in = DummyLM([{"plan": "{}"}])
    plain = rewriter_for("Rewrite the question.", stand_in)
    assert plain.adapter is None and plain.get_lm() is stand_in  # the DSPy context's adapter decides


def test_build_served_warns_before_building_an_lm_and_closes_the_store_when_it_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kitune.lm
    import kitune.retrieval
    from kitune.usage import TokenLedger

    events: list[str] = []
    monkeypatch.setattr(
        kitune.retrieval, "create_store", lambda cfg: _ClosingStore(embedder=HashEmbedder(dim=8))
    )

    def no_lm(cfg: KituneConfig, role: str, **kw: Any) -> Any:
        events.append(f"build_lm {role}")
        raise ConfigError("lm.rewrite: no model")

    monkeypatch.setattr(kitune.lm, "build_lm", no_lm)
    cfg = _cfg(tmp_path)
    setting = production_setting(cfg)
    table = setting.store_cfg.store.table
    _ClosingStore.closed = 0
    with pytest.raises(ConfigError, match="no model"):
        build_served(
            cfg,
            setting,
            programs=("extractor", "rewriter"),
            use_rewriter=True,
            ledger=TokenLedger(),
            on_empty=lambda message: events.append(message.split(":", 1)[0]),
        )
    assert events == [f"the KI store {table} holds no KIs", "build_lm rewrite"]
    assert _ClosingStore.closed == 1


def test_follow_production_rebuilds_only_when_the_served_versions_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kitune.retrieval
    from kitune.usage import TokenLedger

    opened: list[str] = []
    held = [0]

    def create_store(cfg: KituneConfig) -> MemoryStore:
        opened.append(cfg.store.table)
        store = MemoryStore(embedder=HashEmbedder(dim=8))
        store.upsert([make_ki(f"Thing {i}", f"Place {i}", docid=f"d{i}") for i in range(held[0])])
        return store

    monkeypatch.setattr(kitune.retrieval, "create_store", create_store)
    cfg = _cfg(tmp_path)
    now = served_versions(production_setting(cfg), ("extractor",))
    (tmp_path / "w" / "lancedb" / f"{now['store']}.lance").mkdir(parents=True)
    source = follow_production(cfg, ("extractor",), use_rewriter=False, ledger=TokenLedger())
    assert source(now) is None and opened == []
    other = {**now, "extractor": "kitune-tiny-extractor v1 (production)", "store": "kis-old"}
    # issue 37: production names an empty table: the server keeps what it serves
    assert source(other) is None and opened == [now["store"]]
    held[0] = 2
    new = source(other)
    assert new is not None and dict(new.versions) == now and new.rewriter is None
    assert opened == [now["store"]] * 3  # counted (twice) and opened to serve


def test_open_store_read_only_does_not_create_a_missing_embedded_table(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    assert open_store(cfg, read_only=True) is None
    assert not (tmp_path / "w" / "lancedb").exists()


# --- issue 40: a promotion reaches a running server at once; every request is recorded --------


def test_a_changed_stamp_refreshes_on_the_next_request_and_each_request_is_recorded(tmp_path: Path) -> None:
    from kitune.service.serving.setting import LiveSetting, ServedRequestLog, ServedSetting
    from kitune.testing.tracking import RecordingTracker

    old, new = MemoryStore(embedder=HashEmbedder(dim=8)), MemoryStore(embedder=HashEmbedder(dim=8))
    stamp = ["1 kitune-tiny-rewriter 1"]
    asked: list[dict[str, str]] = []

    def source(current: Any) -> ServedSetting | None:
        asked.append(dict(current))
        if stamp[0].endswith(" 2"):
            return ServedSetting(store=new, rewriter=None, versions={"rewriter": "v2", "store": "kis_b"})
        return None

    tracker = RecordingTracker()
    log = ServedRequestLog(tracker)
    live = LiveSetting(
        _cfg(tmp_path),
        store=old,
        rewriter=None,
        versions={"rewriter": "v1", "store": "kis_a"},
        source=source,
        refresh_s=30.0,
        clock=lambda: 0.0,
        stamp=lambda: stamp[0],
        request_log=log,
    )
    with live.serve("mcp get_context", "q1") as (store, _):
        assert store is old
    stamp[0] = "2 kitune-tiny-rewriter 2"  # a promotion
    with live.serve("mcp get_context", "q2") as (store, _):
        assert store is new
    with pytest.raises(RuntimeError), live.serve("mcp get_context", "q3"):
        raise RuntimeError("store down")
    log.close()
    assert len(asked) == 1  # only the promotion made it look; the clock never reached refresh_s
    traces = tracker.by_name("serve").episodes
    assert [
        (t.inputs["query"], t.tags["kitune.prompt.rewriter"], t.tags["kitune.store"]) for t in traces
    ] == [
        ("q1", "v1", "kis_a"),
        ("q2", "v2", "kis_b"),
        ("q3", "v2", "kis_b"),
    ]
    assert [t.tags["kitune.status"] for t in traces] == ["ok", "ok", "error"]
    assert traces[2].attributes["kitune.error"] == "RuntimeError: store down" and not traces[2].ok
    assert log.written == 3


def test_promote_and_rollback_rewrite_the_registrys_production_stamp(tmp_path: Path) -> None:
    from kitune.tracking.prompts import PromptRegistry, production_stamp_path, read_production_stamp

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert production_stamp_path(uri) == tmp_path / "mlflow.db.production"
    assert production_stamp_path("http://mlflow:5000") is None and read_production_stamp(uri) is None
    reg = PromptRegistry(uri)
    v1 = reg.register("kitune-tiny-rewriter", "one")
    v2 = reg.register("kitune-tiny-rewriter", "two")
    reg.promote("kitune-tiny-rewriter", v1.version)
    first = read_production_stamp(uri)
    reg.promote("kitune-tiny-rewriter", v2.version)
    second = read_production_stamp(uri)
    reg.rollback("kitune-tiny-rewriter")
    third = read_production_stamp(uri)
    assert first and second and third and len({first, second, third}) == 3
    assert [s.split()[1:] for s in (first, second, third)] == [
        ["kitune-tiny-rewriter", "1"],
        ["kitune-tiny-rewriter", "2"],
        ["kitune-tiny-rewriter", "1"],
    ]
