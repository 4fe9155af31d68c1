"""A served program added from this one module (issue 38, done-when 1): serve and eval pick it up.

The plug-in registers a :class:`~kitune.optimizers.program_task.ProgramTask` and nothing else: no
list in serving, eval, drift or the CLI names it, and yet ``production_setting`` resolves its
prompt, ``--prompt-version`` accepts it, a running server reloads when it is promoted, and an
evaluation records its version and names its run after it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kitune.retrieval
from kitune.config import KituneConfig
from kitune.optimizers.program_spec import ProgramTask
from kitune.optimizers.program_task import (
    program_names,
    read_programs,
    register_program_task,
    served_programs,
    store_program,
    unregister_program_task,
)
from kitune.programs.instructions import instruction_version
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryStore
from kitune.service.serving.prompts import parse_prompt_selection, production_setting
from kitune.service.serving.setting import follow_production, served_versions
from kitune.testing.store_contract import make_ki
from kitune.tracking.prompts import PromptRegistry, prompt_name
from kitune.usage import TokenLedger

SUMMARY = "Summarise the retrieved facts in one sentence before answering."
SUMMARY_V2 = "Summarise the retrieved facts in two short sentences, dates first."


@pytest.fixture
def summariser() -> Iterator[ProgramTask]:
    """The plug-in: one registration, served, with its own starting instruction."""
    task = register_program_task(
        ProgramTask(
            "summariser",
            predictor="summarise",
            lm_role="rewrite",
            setup=lambda env, inp: None,  # nothing to tune in this test
            instruction=SUMMARY,
            task_words=("summar",),
            order=40,
        )
    )
    yield task
    unregister_program_task("summariser")


@pytest.fixture(scope="module")
def blank_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("blank") / "mlflow.db"
    assert PromptRegistry(f"sqlite:///{path}").list() == []
    return path


@pytest.fixture
def cfg(tmp_path: Path, blank_db: Path) -> KituneConfig:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copyfile(blank_db, work / "mlflow.db")
    return KituneConfig(workdir=work, corpus_name="fixture", embedder={"type": "hash", "dim": 64})


def _promote(cfg: KituneConfig, text: str) -> None:
    reg = PromptRegistry(cfg.mlflow_uri)
    name = prompt_name(cfg.corpus_name, "summariser")
    reg.promote(name, reg.register(name, text, commit_message="plug-in test").version)


def test_the_registry_is_the_only_list(summariser: ProgramTask) -> None:
    assert program_names() == ("extractor", "rewriter", "disambiguator", "summariser")
    assert served_programs() == program_names()
    assert read_programs() == ("extractor", "rewriter", "summariser")
    assert read_programs(rewrite=False) == ("extractor", "summariser")
    assert store_program() == "extractor"
    assert parse_prompt_selection(["summariser=candidate"]) == {"summariser": "candidate"}


def test_serving_resolves_and_follows_the_plugin(
    summariser: ProgramTask, cfg: KituneConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    packaged = production_setting(cfg)
    assert packaged.prompts["summariser"] == SUMMARY
    assert packaged.versions["summariser"] == (
        f"packaged {instruction_version('summariser', SUMMARY)} "
        "(no production version of kitune-fixture-summariser)"
    )
    opened: list[str] = []
    monkeypatch.setattr(
        kitune.retrieval,
        "create_store",
        lambda c: opened.append(c.store.table) or MemoryStore(embedder=HashEmbedder(dim=8)),
    )
    shown = read_programs(rewrite=False)
    now = served_versions(packaged, shown)
    source = follow_production(cfg, shown, use_rewriter=False, ledger=TokenLedger())
    assert source(now) is None and opened == []  # nothing changed: the server keeps its store
    _promote(cfg, SUMMARY_V2)
    assert production_setting(cfg).prompts["summariser"] == SUMMARY_V2
    new = source(now)  # a promotion of the plug-in alone reloads the served setting
    assert new is not None
    assert new.versions["summariser"] == "kitune-fixture-summariser v1 (production)"
    assert new.versions["store"] == now["store"]  # the extractor names the table, not the plug-in


def test_eval_records_the_plugin_version(
    summariser: ProgramTask, cfg: KituneConfig, fixture_dir: Path
) -> None:
    from kitune.service.pipelines.evaluation import run_eval
    from kitune.testing.chat import ScriptedChatModel

    _promote(cfg, SUMMARY_V2)
    setting = production_setting(cfg)
    store = MemoryStore(embedder=HashEmbedder(dim=64))
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

    opened: list[str] = []

    def create_store(c: KituneConfig, embedder: Any = None) -> MemoryStore:
        opened.append(c.store.table)
        return store

    mp = pytest.MonkeyPatch()
    mp.setattr(kitune.retrieval, "create_store", create_store)
    try:
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
    finally:
        mp.undo()
    assert res.traces[0].doc_ids_seen == ["100818"]
    assert res.prompt_versions == {
        "extractor": setting.versions["extractor"],
        "summariser": "kitune-fixture-summariser v1 (production)",
        "store": setting.store_cfg.store.table,
    }
    sha = instruction_version("summariser", SUMMARY_V2).split("@", 1)[1]
    assert res.run_dir.name.endswith(f"-{sha}")  # the run is named after the plug-in's version too
