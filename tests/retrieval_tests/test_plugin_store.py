"""A KI store backend added from this one module (issue 38, done-when 1): serve and eval use it.

The plug-in is a store class, its config section and one :func:`register_store_backend` call;
nothing else in kitune names it. ``store.type: shelf`` then validates, the loop's versioned table
name goes into the backend's own collection field (``shelf``), the conformance suite passes
through ``create_store``, the HTTP server answers from it and an evaluation reads it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest

import kitune.retrieval
from kitune.config import KituneConfig, StoreSection, load_config
from kitune.errors import ConfigError
from kitune.optimizers.program_task import read_programs
from kitune.retrieval import StoreBackend, register_store_backend, store_exists, store_types
from kitune.retrieval.backends import unregister_store_backend
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryStore
from kitune.service.serving.prompts import describe_setting, production_setting, setting_summary
from kitune.service.serving.setting import build_served, open_serving_store
from kitune.testing.store_contract import StoreContract, make_ki
from kitune.usage import TokenLedger

# -- the plug-in: one store class, one config section, one registration ------------------------


class ShelfStoreConfig(StoreSection):
    """A toy backend whose KI collection is called a shelf."""

    collection_field: ClassVar[str] = "shelf"
    collection_kind: ClassVar[str] = "shelf"
    type: Literal["shelf"] = "shelf"
    shelf: str = "kis"


class ShelfStore(MemoryStore):
    """The memory store under another name (a real backend would talk to its own engine)."""

    backend = "shelf"


SHELVES: dict[str, ShelfStore] = {}


def open_shelf(cfg: KituneConfig, embedder: Any = None) -> ShelfStore:
    assert isinstance(cfg.store, ShelfStoreConfig)
    return SHELVES.setdefault(cfg.store.shelf, ShelfStore(embedder or HashEmbedder(dim=64), cfg.retrieval))


SHELF = StoreBackend("shelf", ShelfStoreConfig, open_shelf, lambda cfg: cfg.store.collection in SHELVES)

# ----------------------------------------------------------------------------------------------


@pytest.fixture
def shelf() -> Iterator[StoreBackend]:
    SHELVES.clear()
    register_store_backend(SHELF)
    yield SHELF
    unregister_store_backend("shelf")
    SHELVES.clear()


@pytest.fixture
def cfg(tmp_path: Path, shelf: StoreBackend) -> KituneConfig:
    return KituneConfig(workdir=tmp_path / "w", corpus_name="fixture", store={"type": "shelf"})


class TestShelfThroughTheRegistry(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path, shelf: StoreBackend) -> Iterator[Any]:
        cfg = KituneConfig(workdir=tmp_path, store={"type": "shelf", "shelf": "contract"})
        s = kitune.retrieval.create_store(cfg)
        assert isinstance(s, ShelfStore)
        yield s
        s.close()


def test_the_type_validates_only_while_registered(tmp_path: Path, shelf: StoreBackend) -> None:
    assert store_types() == ("elasticsearch", "lancedb", "memory", "shelf")
    path = tmp_path / "kitune.yaml"
    path.write_text("store:\n  type: shelf\n  shelf: facts\n", encoding="utf-8")
    assert load_config(path).store == ShelfStoreConfig(shelf="facts")
    unregister_store_backend("shelf")
    with pytest.raises(
        ConfigError, match=r"unknown store\.type 'shelf': use one of elasticsearch, lancedb, memory"
    ):
        load_config(path)
    register_store_backend(SHELF)
    with pytest.raises(ValueError, match="give both the same name"):
        register_store_backend(StoreBackend("shelf2", ShelfStoreConfig, open_shelf))


def test_serving_opens_and_answers_from_the_plugin(cfg: KituneConfig) -> None:
    from fastapi.testclient import TestClient

    from kitune.server import create_app

    setting = production_setting(cfg)
    shelf_name = setting.store_cfg.store.collection
    assert shelf_name.startswith("kis-") and setting_summary(setting)["store"] == shelf_name
    assert describe_setting(setting, ())[-1] == f"KI store: shelf shelf {shelf_name}"
    assert not store_exists(setting.store_cfg) and open_serving_store(cfg, read_only=True) is None
    served = build_served(
        cfg, setting, programs=read_programs(rewrite=False), use_rewriter=False, ledger=TokenLedger()
    )
    assert served.store is SHELVES[shelf_name] and store_exists(setting.store_cfg)
    served.store.upsert([make_ki("LaHave River", "Lunenburg County", docid="100818", predicate="located_in")])
    client = TestClient(create_app(cfg, store=served.store, versions=served.versions))
    kis = client.post("/api/_get_context", json={"query": "Where is the LaHave River?"}).json()["kis"]
    assert [k["evidence_doc_ids"] for k in kis] == [["100818"]]


def test_eval_reads_the_plugin(cfg: KituneConfig, fixture_dir: Path) -> None:
    from kitune.service.pipelines.evaluation import run_eval
    from kitune.testing.chat import ScriptedChatModel

    shelf_name = production_setting(cfg).store_cfg.store.collection
    store = kitune.retrieval.create_store(production_setting(cfg).store_cfg)
    store.upsert([make_ki("LaHave River", "Lunenburg County", docid="100818", predicate="located_in")])
    model = ScriptedChatModel(
        [
            json.dumps({"tool": "get_context", "args": {"query": "LaHave River"}}),
            json.dumps({"answer": {"explanation": "", "exact_answer": "Lunenburg", "confidence": 60}}),
        ]
    )

    class NoCorpus:
        def count(self) -> int:
            return 0

    res = run_eval(
        cfg,
        skill="in-context",
        data_dir=fixture_dir,
        limit=1,
        progress=False,
        use_judge=False,
        chat_model=model,
        corpus_store=NoCorpus(),
    )
    assert res.traces[0].doc_ids_seen == ["100818"]  # the KI came from the plug-in's shelf
    assert res.prompt_versions["store"] == shelf_name
    assert list(SHELVES) == [shelf_name]
