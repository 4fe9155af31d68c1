"""Issue 37 (1, 2): a changed document's old facts expire (source_changed); promotions are checked."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dspy
import pytest
from dspy.utils import DummyLM

from kitune.config import KituneConfig, load_config
from kitune.errors import PromotionRefusedError
from kitune.ki import KI
from kitune.programs.fact_extractor import FactExtractor
from kitune.programs.instructions import instruction_version, load_instruction
from kitune.retrieval import create_store
from kitune.retrieval.memory import MemoryStore
from kitune.schema import Document, Filter
from kitune.service.pipelines.extraction import extract_corpus
from kitune.service.serving.prompts import (
    TABLE_TAG,
    production_setting,
    promote_prompt,
    rollback_prompt,
    state_path_for,
    versioned_store_cfg,
)
from kitune.service.serving.stores import SOURCE_CHANGED, expire_all, expire_documents, expire_kis
from kitune.tracking.prompts import PromptRegistry, prompt_name

NOW = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def _fact(subject: str, predicate: str, obj: str, evidence: str) -> dict[str, object]:
    return {
        "title": f"{subject} {predicate.replace('_', ' ')} {obj}",
        "description": f"{subject} {predicate.replace('_', ' ')} {obj}.",
        "subject": subject,
        "predicate": predicate,
        "object": obj,
        "evidence_span": evidence,
        "confidence": 0.9,
        "tags": ["org"],
    }


def _answers(year: int) -> dict[str, dict[str, str]]:
    facts = {
        "Acme was founded": [
            _fact("Acme", "founded_in", str(year), f"Acme was founded in {year}"),
            _fact("Acme", "located_in", "Springfield", f"founded in {year} in Springfield"),
        ],
        "Globex makes": [_fact("Globex", "product", "lamps", "Globex makes lamps")],
    }
    return {k: {"facts_json": json.dumps({"facts": v})} for k, v in facts.items()}


def _docs(year: int) -> list[Document]:
    return [
        Document(docid="acme", text=f"Acme was founded in {year} in Springfield. Acme makes anvils."),
        Document(docid="globex", text="Globex makes lamps. It is big."),
    ]


def _extract(store: MemoryStore, year: int, state: Path, now: datetime) -> object:
    cfg = load_config(overrides={"extraction.concurrency": 1})
    with dspy.context(lm=DummyLM(_answers(year))):
        return extract_corpus(
            _docs(year),
            store,
            FactExtractor.from_config(cfg),
            cfg=cfg,
            state_path=state,
            progress=False,
            now=now,
        )


def test_a_changed_document_expires_its_old_facts_when_the_new_ones_are_stored(tmp_path: Path) -> None:
    store = MemoryStore()
    state = tmp_path / "state.jsonl"
    first = _extract(store, 1999, state, NOW)
    assert first.kis_written == 3  # type: ignore[attr-defined]
    second = _extract(store, 2001, state, NOW + timedelta(hours=1))
    assert second.docs_changed == 1 and second.kis_source_changed == 1  # type: ignore[attr-defined]
    by_object = {k.payload.properties.object: k for k in store.iter_kis(Filter(statuses=()))}
    old, new = by_object["1999"], by_object["2001"]
    assert old.payload.status == "expired" and old.payload.status_reason == SOURCE_CHANGED
    assert old.payload.expires_at == NOW + timedelta(hours=1)
    assert new.payload.status == "active" and new.payload.status_reason is None
    # the fact the new text states again keeps its id and stays active; the other document is untouched
    assert by_object["Springfield"].payload.status == "active"
    assert by_object["lamps"].payload.status == "active"
    assert store.count(Filter(statuses=("active",))) == 3


def test_expire_documents_of_a_removed_document_is_idempotent() -> None:
    store = MemoryStore()
    kis = [
        KI.from_fact(
            docid=d,
            title=f"{d} has x {i}",
            description=f"{d} has x {i}.",
            subject=d,
            predicate="has_x",
            obj=str(i),
            evidence=[f"{d} has x {i}"],
            confidence=80,
        )
        for d in ("a", "b")
        for i in range(2)
    ]
    store.upsert(kis)
    assert expire_documents(store, ["a"], now=NOW) == 2
    assert expire_documents(store, ["a"], now=NOW) == 0
    assert {k.payload.properties.docid for k in store.iter_kis(Filter(statuses=("active",)))} == {"b"}
    assert {k.payload.status_reason for k in store.iter_kis(Filter(statuses=("expired",)))} == {
        SOURCE_CHANGED
    }


def test_sweep_now_changes_only_what_is_past_retention_and_all_is_explicit() -> None:
    store = MemoryStore()
    fresh = KI.from_fact(
        docid="a",
        title="a has x 1",
        description="a has x 1.",
        subject="a",
        predicate="has_x",
        obj="1",
        evidence=["a has x 1"],
        confidence=80,
    )
    old = fresh.model_copy(
        update={
            "id": "old",
            "payload": fresh.payload.model_copy(update={"last_seen": NOW - timedelta(days=30)}),
        }
    )
    fresh = fresh.model_copy(update={"payload": fresh.payload.model_copy(update={"last_seen": NOW})})
    store.upsert([fresh, old])
    swept = expire_kis(store, now=NOW, stale_after=timedelta(days=7))
    assert (swept.stale, swept.expired) == (0, 1)  # only the one unseen for 30 days (> 2 × 7)
    assert store.get(fresh.id).payload.status == "active"
    assert expire_all(store, now=NOW) == 1
    assert store.get(fresh.id).payload.status_reason == "expired_by_hand"


# -- checked promotion ----------------------------------------------------------------------------


@pytest.fixture
def cfg(tmp_path: Path) -> KituneConfig:
    return load_config(
        overrides={
            "workdir": str(tmp_path / "work"),
            "corpus_name": "deb",
            "embedder.type": "hash",
            "embedder.dim": 32,
        }
    )


def _fill(cfg: KituneConfig, store_cfg: KituneConfig, n: int) -> None:
    store = create_store(store_cfg)
    try:
        store.upsert(
            [
                KI.from_fact(
                    docid="d",
                    title=f"d has x {i}",
                    description=f"d has x {i}.",
                    subject="d",
                    predicate="has_x",
                    obj=str(i),
                    evidence=[f"d has x {i}"],
                    confidence=80,
                )
                for i in range(n)
            ]
        )
    finally:
        store.close()


def test_promotion_refuses_an_empty_table_and_too_many_failures(cfg: KituneConfig) -> None:
    name = prompt_name("deb", "extractor")
    reg = PromptRegistry(cfg.mlflow_uri)
    packaged = load_instruction("extractor").text
    v1 = reg.register(name, packaged)
    reg.promote(name, v1.version)
    _fill(cfg, versioned_store_cfg(cfg, instruction_version("extractor", packaged)), 3)
    empty = reg.register(name, packaged + "\nBe brief.")
    with pytest.raises(PromotionRefusedError, match=r"holds 0 active KIs.*--force") as err:
        promote_prompt(cfg, name, empty.version)
    assert err.value.kis == 0
    assert reg.get(name, "production").version == v1.version  # nothing moved
    # a staged version (its own table) whose extraction failed on 2 of 4 documents
    staged_cfg = versioned_store_cfg(cfg, "extractor@staged00")
    staged = reg.register(name, packaged + "\nStaged.", tags={TABLE_TAG: staged_cfg.store.table})
    _fill(cfg, staged_cfg, 2)
    state = state_path_for(staged_cfg, instruction_version("extractor", staged.text))
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(
        "".join(
            json.dumps({"docid": f"d{i}", "status": "failed" if i < 2 else "ok"}) + "\n" for i in range(4)
        ),
        encoding="utf-8",
    )
    with pytest.raises(
        PromotionRefusedError, match=r"failed on 2 of 4 documents \(50% > --max-failed-share 20%"
    ):
        promote_prompt(cfg, name, staged.version)
    assert promote_prompt(cfg, name, staged.version, max_failed_share=0.5).version == staged.version
    assert production_setting(cfg).store_cfg.store.table == staged_cfg.store.table  # the pinned table serves
    # rollback is checked the same way, and switches back to the first table
    back = rollback_prompt(cfg, name)
    assert back.version == v1.version
    assert production_setting(cfg).store_cfg.store.table.endswith(
        instruction_version("extractor", packaged)[-8:]
    )
    forced = promote_prompt(cfg, name, empty.version, force=True)
    assert forced.version == empty.version
