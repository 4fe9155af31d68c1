"""LanceCorpusStore: chunked BM25 + vector document search, snippets, get, replace, reopen."""

from __future__ import annotations

from pathlib import Path

import pytest

from kitune.errors import DocumentNotFoundError
from kitune.retrieval.base import CorpusStore
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.lance_corpus import LanceCorpusStore
from kitune.schema import Document


def _docs() -> list[Document]:
    long_text = (
        "Filler sentence about nothing in particular. " * 30
        + "The lighthouse of Alexandria was one of the Seven Wonders. "
        + "More filler text follows here. " * 30
    )
    return [
        Document(docid="100", title="Lighthouse", text=long_text, url="http://x/100", metadata={"k": "v"}),
        Document(
            docid="200", title="Gardens", text="The Hanging Gardens of Babylon are a wonder of the world."
        ),
        Document(docid="300", title="Cooking", text="Boil pasta in salted water for ten minutes."),
    ]


def test_search_snippets_get_and_count(tmp_path: Path) -> None:
    cs = LanceCorpusStore(tmp_path, HashEmbedder(dim=32), chunk_chars=300)
    assert isinstance(cs, CorpusStore)
    result = cs.add_documents(_docs())
    assert (result.submitted, result.indexed, result.failed) == (3, 3, [])
    assert cs.count() == 3
    hits = cs.search("lighthouse Alexandria wonder", k=2, snippets_per_hit=3, snippet_chars=120)
    assert hits[0].docid == "100" and hits[0].title == "Lighthouse"
    assert len(hits) == 2 and hits[0].score >= hits[1].score
    assert all(len(s) <= 120 for h in hits for s in h.snippets)
    assert 1 <= len(hits[0].snippets) <= 3
    assert any("Alexandria" in s for s in hits[0].snippets)
    doc = cs.get("100")
    assert doc.url == "http://x/100" and doc.metadata == {"k": "v"} and "Alexandria" in doc.text
    with pytest.raises(DocumentNotFoundError):
        cs.get("999")
    assert cs.search("  ") == []


def test_replace_reopen_and_bad_docid(tmp_path: Path) -> None:
    cs = LanceCorpusStore(tmp_path, HashEmbedder(dim=32))
    cs.add_documents(_docs())
    result = cs.add_documents(
        [
            Document(docid="300", title="Cooking", text="Bake bread at 220 degrees."),
            Document(docid="bad id'", text="x"),
        ]
    )
    assert result.indexed == 1 and [f.id for f in result.failed] == ["bad id'"]
    cs.close()
    again = LanceCorpusStore(tmp_path, HashEmbedder(dim=32))
    assert again.count() == 3
    assert again.search("bake bread degrees", k=1)[0].docid == "300"
    assert all("pasta" not in s for h in again.search("pasta salted water", k=3) for s in h.snippets)


def test_real_fixture_corpus_finds_its_documents(tmp_path: Path, fixture_dir: Path) -> None:
    from kitune.data.loaders import load_corpus

    docs = load_corpus(fixture_dir)[:40]
    cs = LanceCorpusStore(tmp_path, HashEmbedder(dim=64))
    assert cs.add_documents(docs).ok
    target = docs[17]
    query = " ".join(target.text.split()[:12])
    hits = cs.search(query, k=10, snippets_per_hit=3, snippet_chars=700)
    assert target.docid in [h.docid for h in hits][:3]
    assert len(hits) == 10 and all(1 <= len(h.snippets) <= 3 for h in hits)
    assert cs.get(target.docid).text == target.text


def test_lexical_finds_cyrillic_and_chinese(tmp_path: Path) -> None:
    from lancedb.query import MatchQuery

    from kitune.retrieval.lance_search import fts_state

    cs = LanceCorpusStore(tmp_path, HashEmbedder(dim=32), chunk_chars=300)
    cs.add_documents(
        [
            Document(docid="ru", title="Москва", text="Москва — столица России."),
            Document(docid="zh", title="北京", text="北京是中国的首都。"),
            Document(docid="en", title="Paris", text="Paris is the capital of France."),
        ]
    )
    assert fts_state(cs._chunks, "text") == "current"
    for query, docid in [("столица", "ru"), ("中国的首都", "zh"), ("首都", "zh")]:
        rows = cs._chunks.search(MatchQuery(query, "text"), query_type="fts").select(["docid"]).to_list()
        assert [r["docid"] for r in rows] == [docid]  # the lexical branch alone
        assert cs.search(query, k=1)[0].docid == docid
