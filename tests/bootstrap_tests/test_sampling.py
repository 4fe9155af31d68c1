"""Corpus loading for the bootstrap (prose and records) and the seeded, diverse sample."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kitune.data.loaders import Question, load_questions
from kitune.data.sampling import kmeans, load_bootstrap_corpus, record_to_document, sample_documents
from kitune.errors import DataError
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryCorpusStore


def test_prose_corpus_is_read_through_the_loader(prose_corpus: Path) -> None:
    loaded = load_bootstrap_corpus(prose_corpus)
    assert loaded.kind == "prose"
    assert len(loaded.documents) == 30
    assert loaded.fields == ()
    assert loaded.documents[0].docid == "100" and loaded.documents[0].title == "Film0"


def test_records_become_field_value_documents(records_file: Path) -> None:
    loaded = load_bootstrap_corpus(records_file)
    assert loaded.kind == "records"
    assert len(loaded.documents) == 12
    assert [(s.line, s.reason[:12]) for s in loaded.skipped] == [(13, "invalid JSON"), (14, "not valid UT")]
    first = loaded.documents[0]
    assert first.docid == "payments-1"  # no docid/id field: file stem + line
    assert first.text.splitlines() == [
        "payment_id: p0",
        "payer: Customer 0",
        "amount_eur: 10.5",
        "status: refunded",
        "created: 2024-01-10",
        'meta: {"channel": "web"}',
    ]
    assert first.metadata["amount_eur"] == "10.5" and first.source == "records"
    names = [f.name for f in loaded.fields]
    assert names == ["payment_id", "payer", "amount_eur", "status", "created", "meta"]
    status = next(f for f in loaded.fields if f.name == "status")
    assert status.count == 12 and status.examples == ("refunded", "settled")
    assert next(f for f in loaded.fields if f.name == "meta").count == 1


def test_record_ids_and_titles() -> None:
    doc = record_to_document({"id": 7, "name": "Widget", "price": None, "tags": ["a", "b"]}, "x-1")
    assert doc.docid == "7" and doc.title == "Widget"
    assert doc.text == 'id: 7\nname: Widget\ntags: ["a", "b"]'  # null fields are left out


def test_duplicate_record_ids_raise_naming_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"id": "a", "v": 1}) + "\n" + json.dumps({"id": "a", "v": 2}) + "\n")
    with pytest.raises(DataError, match=r"r.jsonl:2: duplicate id 'a' \(first on line 1\)"):
        load_bootstrap_corpus(path)


def test_missing_corpus_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_bootstrap_corpus(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match=r"no corpus\.jsonl"):
        load_bootstrap_corpus(tmp_path)


def test_kmeans_is_seeded_and_separates_clear_groups() -> None:
    rng = np.random.default_rng(1)
    centres = np.array([[10.0, 0.0], [0.0, 10.0], [-10.0, -10.0]])
    x = np.concatenate([c + rng.normal(0, 0.1, (20, 2)) for c in centres])
    labels, cents = kmeans(x, 3, seed=4)
    labels2, cents2 = kmeans(x, 3, seed=4)
    assert np.array_equal(labels, labels2) and np.allclose(cents, cents2)
    assert cents.shape == (3, 2)
    groups = [set(labels[i * 20 : (i + 1) * 20].tolist()) for i in range(3)]
    assert all(len(g) == 1 for g in groups) and len(set.union(*groups)) == 3


def test_kmeans_caps_k_at_distinct_rows() -> None:
    labels, cents = kmeans(np.ones((5, 3)), 4, seed=0)
    assert cents.shape == (1, 3) and labels.tolist() == [0] * 5
    with pytest.raises(ValueError, match="k must be >= 1"):
        kmeans(np.ones((2, 2)), 0, seed=0)


def test_same_seed_same_sample_and_clusters_cover_topics(prose_corpus: Path) -> None:
    docs = load_bootstrap_corpus(prose_corpus).documents
    emb = HashEmbedder(dim=128)
    a = sample_documents(docs, emb, sample_size=3, seed=7)
    b = sample_documents(docs, emb, sample_size=3, seed=7)
    assert a == b
    assert [s.reason for s in a] == ["cluster"] * 3
    assert [s.cluster for s in a] == [0, 1, 2]
    assert sum(s.cluster_size for s in a) == 30
    topics = {next(d.title for d in docs if d.docid == s.docid).rstrip("0123456789") for s in a}
    assert topics == {"Film", "River", "Chemist"}


def test_different_seed_changes_the_pool(prose_corpus: Path) -> None:
    docs = load_bootstrap_corpus(prose_corpus).documents
    emb = HashEmbedder(dim=128)
    samples = {
        tuple(s.docid for s in sample_documents(docs, emb, sample_size=4, seed=s, pool_size=10))
        for s in range(4)
    }
    assert len(samples) > 1


def test_question_picks_come_first_and_take_at_most_half(prose_corpus: Path) -> None:
    docs = load_bootstrap_corpus(prose_corpus).documents
    questions = load_questions(prose_corpus)
    emb = HashEmbedder(dim=128)
    store = MemoryCorpusStore(emb)
    store.add_documents(docs)
    picks = sample_documents(docs, emb, sample_size=4, seed=0, questions=questions, corpus_store=store)
    assert [p.reason for p in picks] == ["question", "question", "cluster", "cluster"]
    by_id = {d.docid: d for d in docs}
    for p in picks[:2]:
        q = next(q for q in questions if q.query_id == p.query_id)
        assert by_id[p.docid].title in q.query  # the question names its document's entity
    assert len({p.docid for p in picks}) == 4
    assert picks == sample_documents(
        docs, emb, sample_size=4, seed=0, questions=questions, corpus_store=store
    )


def test_small_corpus_and_fill(prose_corpus: Path) -> None:
    docs = load_bootstrap_corpus(prose_corpus).documents[:3]
    picks = sample_documents(docs, HashEmbedder(dim=64), sample_size=10, seed=0)
    assert sorted(p.docid for p in picks) == ["100", "101", "102"]
    same = [docs[0]] + [
        type(docs[0])(docid=f"dup{i}", text=docs[0].text, title=docs[0].title) for i in range(3)
    ]
    picks = sample_documents(same, HashEmbedder(dim=64), sample_size=3, seed=0)
    assert [p.reason for p in picks] == ["cluster", "fill", "fill"]  # identical vectors: one cluster
    assert sample_documents([], HashEmbedder(), sample_size=3) == []
    with pytest.raises(ValueError, match="sample_size"):
        sample_documents(docs, HashEmbedder(), sample_size=0)


def test_question_type_is_the_loader_record() -> None:
    q = Question(query_id="1", query="q", answer="a")
    assert q.golds == ("a",)


def test_a_corpus_of_chat_sessions_is_read_as_dialogue(tmp_path: Path) -> None:
    # issue 17: most documents hold "[D1:2] Speaker: ..." turn lines → kind dialogue (the
    # bootstrap then drafts the dialogue extractor); one prose page among them does not change it
    lines = [
        {
            "docid": f"s{n}",
            "text": f"Session {n} (8 May, 2023)\n[D{n}:1] Ann: Hi Bo!\n[D{n}:2] Bo: I ran a race.",
        }
        for n in (1, 2)
    ]
    lines.append({"docid": "p", "text": "A plain page. It has two sentences."})
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    assert load_bootstrap_corpus(tmp_path).kind == "dialogue"
    (tmp_path / "corpus.jsonl").write_text(
        json.dumps(lines[0]) + "\n" + json.dumps(lines[2]) + "\n", encoding="utf-8"
    )
    assert load_bootstrap_corpus(tmp_path).kind == "prose"  # half is not most
