"""Shared ranking pieces: weighted RRF, facets, BM25, chunking, snippets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kitune.ki import KI
from kitune.retrieval.fusion import BM25, aggregate, chunk_text, rrf_fuse, trim_snippet


def test_rrf_weighted_scores_and_branch_ranks() -> None:
    fused = rrf_fuse({"tag": ["a", "b"], "lexical": ["b", "c"]}, {"tag": 2.0, "lexical": 1.0}, k=10)
    scores = {f.id: f.score for f in fused}
    assert scores["a"] == pytest.approx(2 / 11)
    assert scores["b"] == pytest.approx(2 / 12 + 1 / 11)
    assert scores["c"] == pytest.approx(1 / 12)
    assert [f.id for f in fused] == ["b", "a", "c"]
    assert fused[0].branches == {"tag": 2, "lexical": 1}


def test_rrf_ties_break_by_id_and_duplicates_ignored() -> None:
    fused = rrf_fuse({"x": ["z", "z", "y"], "w": ["y", "z"]}, {}, k=60)
    assert [f.id for f in fused] == ["y", "z"]  # equal score → id ascending
    assert fused[1].branches == {"x": 1, "w": 2}


@given(
    st.dictionaries(
        st.sampled_from(["tag", "lexical", "semantic"]),
        st.lists(st.sampled_from(list("abcdefg")), max_size=7),
        max_size=3,
    )
)
def test_rrf_is_sorted_and_deterministic(rankings: dict[str, list[str]]) -> None:
    fused = rrf_fuse(rankings, {}, k=60)
    keys = [(-f.score, f.id) for f in fused]
    assert keys == sorted(keys)
    assert fused == rrf_fuse(dict(reversed(list(rankings.items()))), {}, k=60) or len(rankings) > 1
    assert {f.id for f in fused} == {i for ids in rankings.values() for i in ids}


def _ki(subject: str, obj: str, docid: str, tags: list[str]) -> KI:
    return KI.from_fact(
        docid=docid,
        title=f"{subject} relates to {obj}.",
        description=f"{subject} and {obj}.",
        subject=subject,
        predicate="related_to",
        obj=obj,
        evidence=[],
        confidence=80,
        tags=tags,
    )


def test_aggregate_counts_tags_docs_entities() -> None:
    kis = [_ki("Acme", "Paris", "d1", ["org"]), _ki("Acme", "Lyon", "d2", ["org", "city"])]
    aggs = aggregate(kis)
    assert aggs.by_tag == {"org": 2, "city": 1}
    assert aggs.by_doc == {"d1": 1, "d2": 1}
    assert next(iter(aggs.by_entity.items())) == ("acme", 2)
    assert aggs.by_entity["lyon"] == 1


def test_bm25_ranks_matching_titles_first() -> None:
    bm = BM25({"1": "Marie Curie born in Warsaw", "2": "Paris is a city", "3": "Curie Curie institute"})
    ranked = bm.rank("Curie Warsaw")
    assert [i for i, _ in ranked] == ["1", "3"]
    assert bm.rank("nothing-matches") == []
    assert bm.rank("curie", candidates=["2", "3"]) == [("3", pytest.approx(ranked[1][1], rel=2))]


def test_chunk_text_respects_size_and_boundaries() -> None:
    text = "First sentence here. " * 40 + "\n\nSecond paragraph."
    chunks = chunk_text(text, 100)
    assert all(len(c) <= 100 for c in chunks)
    assert chunks[0].endswith(".")
    assert "".join(chunks).replace(" ", "") == text.replace(" ", "").replace("\n", "")
    assert chunk_text("   ", 100) == []
    with pytest.raises(ValueError, match="at least 20"):
        chunk_text("x", 5)


def test_trim_snippet_centres_on_query_term() -> None:
    passage = "a " * 200 + "Warsaw is here " + "b " * 200
    snip = trim_snippet(passage, "warsaw", 60)
    assert len(snip) == 60 and "Warsaw" in snip
    assert trim_snippet("short", "x", 60) == "short"
