"""Shared ranking pieces: weighted RRF, facets, BM25, chunking, snippets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kitune.ki import KI
from kitune.retrieval.fusion import BM25, aggregate, chunk_text, rrf_fuse, tokenize, trim_snippet


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


def test_rrf_equal_fractions_tie_exactly_then_by_id() -> None:
    # Ranks (10, 10) and (4, 25) at k=10: 1/20 + 1/20 = 1/14 + 1/35 = 1/10 exactly, but the float
    # sums differ by one ulp (0.1 vs 0.09999999999999999), which used to decide the order.
    assert 1 / 20 + 1 / 20 != 1 / 14 + 1 / 35
    fill_a = [f"a{i:02d}" for i in range(1, 26)]
    fill_b = [f"b{i:02d}" for i in range(1, 26)]
    # "zeta" at (10, 10) has the larger float sum; "alpha" at (4, 25) the smaller but the lower id.
    lexical = [*fill_a[:3], "alpha", *fill_a[4:9], "zeta", *fill_a[10:24]]
    semantic = [*fill_b[:9], "zeta", *fill_b[10:24], "alpha"]
    fused = rrf_fuse({"lexical": lexical, "semantic": semantic}, {}, k=10)
    by_id = {f.id: f for f in fused}
    assert by_id["zeta"].branches == {"lexical": 10, "semantic": 10}
    assert by_id["alpha"].branches == {"lexical": 4, "semantic": 25}
    assert by_id["alpha"].score == by_id["zeta"].score == 0.1
    order = [f.id for f in fused]
    assert order.index("alpha") + 1 == order.index("zeta")  # exact tie → id ascending


def test_rrf_decimal_weights_are_exact() -> None:
    # 0.1 + 0.2 != 0.3 in floats; weights are taken as written, so these two tie and go by id.
    fused = rrf_fuse({"x": ["b"], "y": ["b"], "z": ["a"]}, {"x": 0.1, "y": 0.2, "z": 0.3}, k=0)
    assert [f.id for f in fused] == ["a", "b"]
    assert fused[0].score == fused[1].score == pytest.approx(0.3)


@pytest.mark.parametrize("weight", [-1.0, float("nan"), float("inf")])
def test_rrf_rejects_bad_weights(weight: float) -> None:
    with pytest.raises(ValueError, match="branch 'lexical'"):
        rrf_fuse({"lexical": ["a"]}, {"lexical": weight})


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("Zürich", ["zürich"]),
        ("ZÜRICH zurich", ["zürich", "zurich"]),
        ("Москва — столица России", ["москва", "столица", "россии"]),
        ("Ελλάδα", ["ελλάδα"]),
        ("القاهرة", ["القاهرة"]),
        ("हिन्दी भाषा", ["हिन्दी", "भाषा"]),  # combining vowel signs stay inside the word
        ("北京大学", ["北京", "京大", "大学"]),
        ("北", ["北"]),
        ("東京2020年", ["東京", "2020", "年"]),
        ("ラーメン", ["ラー", "ーメ", "メン"]),
        ("한국어 사전", ["한국", "국어", "사전"]),
        ("Straße ＡＢＣ ﬁne", ["strasse", "abc", "fine"]),
        ("don’t stop—now", ["don", "t", "stop", "now"]),
        ("snake_case x²", ["snake", "case", "x2"]),
        ("Acme-42 signed", ["acme", "42", "signed"]),
        ("", []),
    ],
)
def test_tokenize_is_unicode_aware(text: str, tokens: list[str]) -> None:
    assert tokenize(text) == tokens


def test_bm25_finds_cyrillic_and_chinese() -> None:
    bm = BM25({"ru": "Москва — столица России.", "zh": "北京是中国的首都。", "en": "Paris is in France."})
    assert [i for i, _ in bm.rank("столица")] == ["ru"]
    assert [i for i, _ in bm.rank("中国首都")] == ["zh"]
    assert [i for i, _ in bm.rank("Zürich Москва")] == ["ru"]


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
