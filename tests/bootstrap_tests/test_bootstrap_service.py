"""The bootstrap end to end with a stand-in LM: determinism, pins, registry, KIs, report, tokens."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kitune.config import KituneConfig, load_config
from kitune.ki import KI
from kitune.programs.domain_describer import DomainDescription
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryStore
from kitune.schema import Filter, QueryPlan
from kitune.service.workflows.bootstrap import bootstrap_corpus
from kitune.service.workflows.bootstrap_kis import source_description_kis
from kitune.service.workflows.bootstrap_report import BootstrapResult
from kitune.testing.lm import mock_usage_lm
from kitune.testing.tracking import RecordingTracker
from kitune.tracking.prompts import PromptRegistry
from kitune.usage import TokenLedger

NOW = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
REPLY = {
    "domain": "Encyclopedia paragraphs about films, rivers and chemists",
    "summary": "Short reference paragraphs.",
    "document_kinds": ["encyclopedia paragraph"],
    "entity_types": ["film", "river", "person"],
    "predicates": ["directed_by", "flows_through", "born_in"],
    "query_patterns": ["Who directed the film X?"],
    "date_range": "1810-1919",
    "disambiguating_details": ["release year"],
}


@pytest.fixture
def cfg(tmp_path: Path) -> KituneConfig:
    return load_config(
        None, {"workdir": str(tmp_path / "work"), "corpus_name": "toy", "embedder.type": "hash"}
    )


def _run(
    cfg: KituneConfig, corpus: Path, reply: dict[str, object] = REPLY, **kw: object
) -> tuple[BootstrapResult, MemoryStore, RecordingTracker]:
    ledger = TokenLedger()
    store = MemoryStore(embedder=HashEmbedder(dim=64))
    tracker = RecordingTracker()
    args: dict[str, object] = {"seed": 3, "sample_size": 4, "pin_types": ["award"], **kw}
    res = bootstrap_corpus(
        cfg,
        corpus,
        lm=mock_usage_lm(json.dumps(reply), ledger=ledger),
        ledger=ledger,
        embedder=HashEmbedder(dim=64),
        store=store,
        tracker=tracker,
        now=NOW,
        **args,  # type: ignore[arg-type]
    )
    return res, store, tracker


def test_same_seed_same_sample_and_draft_and_pins_survive(cfg: KituneConfig, prose_corpus: Path) -> None:
    a, _, _ = _run(cfg, prose_corpus)
    b, _, _ = _run(cfg, prose_corpus)
    assert a.sample == b.sample and len(a.sample) == 4
    assert [s.reason for s in a.sample] == ["question", "question", "cluster", "cluster"]
    assert a.draft.text == b.draft.text and a.draft.version == b.draft.version
    assert "each with its own facts: award, film, river, person." in a.draft.text
    assert a.draft.pins_restored == ("award",)  # the description never named it
    assert a.description.status == "ok" and a.errors == {}
    # the second run found the same text registered and reused that version
    assert (a.prompt_version, a.prompt_reused) == (1, False)
    assert (b.prompt_version, b.prompt_reused) == (1, True)


def test_draft_is_registered_as_candidate_and_production(cfg: KituneConfig, prose_corpus: Path) -> None:
    res, _, tracker = _run(cfg, prose_corpus)
    reg = PromptRegistry(cfg.mlflow_uri)
    prod = reg.get("kitune-toy-extractor", "production")
    assert prod.text == res.draft.text and prod.version == 1
    assert set(prod.aliases) == {"candidate", "production"}
    assert prod.tags["kitune.source"] == "bootstrap" and prod.tags["kitune.run_id"] == res.run_id
    assert res.prompt_aliases == ("candidate", "production")
    run = tracker.by_name("bootstrap-toy")
    assert json.loads(str(run.artifacts["bootstrap/description.json"]))["domain"] == REPLY["domain"]
    assert run.artifacts["prompts/extractor.txt"] == res.draft.text
    assert "+Domain focus (toy)" in str(run.artifacts["bootstrap/extractor.diff"])
    assert "bootstrap/report.md" in run.artifacts
    assert run.metrics["lm_calls"] == 1.0 and run.metrics["source_kis_written"] == 4.0
    assert run.params["seed"] == "3" and run.params["pin_types"] == "award"


def test_existing_production_is_left_alone(cfg: KituneConfig, prose_corpus: Path) -> None:
    reg = PromptRegistry(cfg.mlflow_uri)
    v = reg.register("kitune-toy-extractor", "A tuned extractor.")
    reg.promote("kitune-toy-extractor", v.version)
    res, _, _ = _run(cfg, prose_corpus)
    assert res.prompt_version == 2 and res.prompt_aliases == ("candidate",)
    assert reg.get("kitune-toy-extractor", "production").text == "A tuned extractor."
    assert reg.get("kitune-toy-extractor", "candidate").text == res.draft.text


def test_source_description_kis_are_stored_and_found(cfg: KituneConfig, prose_corpus: Path) -> None:
    res, store, _ = _run(cfg, prose_corpus, register=False)
    assert res.prompt_version is None and res.errors == {}
    kis = list(store.iter_kis(Filter(subtypes=("source_description",))))
    assert len(kis) == res.kis_written == 4
    preds = [k.payload.properties.predicate for k in res.kis]
    assert preds == ["holds_documents_about", "covers_entity_types", "spans_dates", "is_queried_by"]
    first = store.get(res.kis[0].id)
    assert first.title == (
        "The toy collection holds encyclopedia paragraph about "
        "Encyclopedia paragraphs about films, rivers and chemists"
    )
    assert first.description == (
        "Short reference paragraphs. It has 30 documents. Main entity types: film, river, person."
    )
    assert {"source-description", "entity:toy", "entity:film", "film", "doc:source-toy"} <= set(first.tags)
    assert first.payload.type == "domain_description" and first.payload.confidence == 70
    assert first.payload.evidence == [f"description.domain: {REPLY['domain']}"]
    assert first.evidence_doc_ids == ["source-toy"] and first.references == ["index://toy"]
    dates = store.get(res.kis[2].id)
    assert dates.title == "The toy collection covers dates 1810 – 1919"
    hits = store.search(QueryPlan(entity_tags=("entity:toy",), size=10)).hits
    assert {h.ki.id for h in hits} == {k.id for k in res.kis}


def test_records_corpus_gets_a_fields_ki(cfg: KituneConfig, records_file: Path) -> None:
    reply = {
        "domain": "Web shop payments",
        "entity_types": ["customer", "payment"],
        "fields": {"amount_eur": "amount paid in euros", "status": "settled or refunded"},
    }
    res, _store, _ = _run(cfg, records_file, reply, register=False, pin_types=[])
    assert res.kind == "records" and res.n_documents == 12 and res.questions_path == ""
    assert [s.reason for s in res.sample] == ["cluster"] * 4
    fields_ki = next(k for k in res.kis if k.payload.properties.predicate == "has_fields")
    assert fields_ki.title == "The toy records have the fields amount_eur, status"
    assert (
        fields_ki.description == "Each toy record has these fields: amount_eur = amount paid in euros; "
        "status = settled or refunded."
    )
    assert "amount_eur = amount paid in euros" in res.draft.text


def test_unusable_description_falls_back_and_is_recorded(cfg: KituneConfig, records_file: Path) -> None:
    ledger = TokenLedger()
    store = MemoryStore(embedder=HashEmbedder(dim=64))
    res = bootstrap_corpus(
        cfg,
        records_file,
        lm=mock_usage_lm("I cannot tell.", ledger=ledger),
        ledger=ledger,
        embedder=HashEmbedder(dim=64),
        store=store,
        tracker=RecordingTracker(),
        register=False,
        pin_types=["invoice"],
        sample_size=3,
        now=NOW,
    )
    assert res.description.status == "fallback" and res.description.lm_calls == 2
    assert "no JSON object found" in res.errors["description"]
    assert res.description.description.fields.keys() >= {"payment_id", "amount_eur", "status"}
    assert "invoice" in res.draft.entity_types
    assert res.kis[0].payload.confidence == 30
    assert res.tokens[0]["calls"] == 2 and res.tokens[0]["stage"] == "bootstrap:describe"


def test_report_files(cfg: KituneConfig, prose_corpus: Path, tmp_path: Path) -> None:
    res, _, _ = _run(cfg, prose_corpus, register=False, out_dir=tmp_path / "rep")
    files = sorted(p.name for p in (tmp_path / "rep").iterdir())
    assert files == ["description.json", "extractor.diff", "extractor.txt", "report.json", "report.md"]
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert [s["docid"] for s in data["sample"]] == [s.docid for s in res.sample]
    assert data["sample"][0]["why"].startswith("retrieved by question ")
    assert data["draft"]["pins_restored"] == ["award"]
    assert data["tokens"][0]["input_tokens"] == 10 and data["tokens"][0]["output_tokens"] == 20
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Sample" in md and "cluster 0 (" in md and "+Domain focus (toy)" in md
    assert "| extract | bootstrap:describe | 1 | 10 | 20 |" in md
    assert (tmp_path / "rep" / "extractor.txt").read_text() == res.draft.text + "\n"


def test_source_description_kis_reject_bad_ones_without_raising() -> None:
    d = DomainDescription(domain="x", entity_types=["t"])
    kis, rejected = source_description_kis(d, corpus_name="Bad Name!", kind="prose", n_documents=1, now=NOW)
    assert [k.payload.properties.predicate for k in kis] == ["holds_documents_about", "covers_entity_types"]
    assert all(isinstance(k, KI) and "entity:bad-name" in k.tags for k in kis) and rejected == {}
    kis, rejected = source_description_kis(d, corpus_name="c", kind="prose", n_documents=1, confidence=500)
    assert kis == [] and set(rejected) == {"holds_documents_about", "covers_entity_types"}


def test_description_kis_land_in_the_served_table(cfg: KituneConfig, prose_corpus: Path) -> None:
    # issue 37 (4): they went to the base table `kis`; serving (context, serve, the MCP resource)
    # reads the production extractor's `kis-<sha8>`
    from kitune.retrieval import create_store
    from kitune.service.serving.prompts import production_setting

    ledger = TokenLedger()
    res = bootstrap_corpus(
        cfg,
        prose_corpus,
        lm=mock_usage_lm(json.dumps(REPLY), ledger=ledger),
        ledger=ledger,
        embedder=HashEmbedder(dim=64),
        tracker=RecordingTracker(),
        now=NOW,
        seed=3,
        sample_size=4,
    )
    served = production_setting(cfg).store_cfg
    assert served.store.collection.startswith("kis-") and served.store.collection.endswith(
        res.draft.version[-8:]
    )
    store = create_store(served, embedder=HashEmbedder(dim=64))
    try:
        kis = list(store.iter_kis(Filter(subtypes=("source_description",))))
    finally:
        store.close()
    assert len(kis) == res.kis_written == 4
    assert not (Path(cfg.workdir) / "lancedb" / "kis.lance").exists()
