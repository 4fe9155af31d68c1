"""Tests for kitune.optimizers.routes: out_of_budget failures → rewriter and extractor feedback."""

from __future__ import annotations

from typing import Any

from kitune.evaluation.metrics import Trace
from kitune.optimizers.routes import (
    ExtractorItem,
    describe_lookups,
    extractor_items,
    rewriter_feedback,
    route_out_of_budget,
    unsurfaced_gold_docs,
)
from kitune.schema import Document
from kitune.testing.store_contract import make_ki

DOCS = {
    "d1": Document(docid="d1", title="Lyon", text="Lyon is a city in France."),
    "d7": Document(
        docid="d7",
        title="Alice Moreau",
        text="Alice Moreau is a pianist. She was born in Paris in 1950. She studied in Lyon.",
    ),
    "d8": Document(docid="d8", title="", text="A concert hall opened in 1950."),
}
KIS = {
    "d7": [
        make_ki("Alice Moreau", "pianist", docid="d7", predicate="occupation"),
        make_ki("Alice Moreau", "Lyon", docid="d7", predicate="studied_in"),
        make_ki("Lyon Conservatoire", "1795", docid="d7", predicate="founded_in"),
    ]
}

STEPS: list[dict[str, Any]] = [
    {
        "kind": "tool",
        "tool": "get_context",
        "args": {"query": "Alice birthplace"},
        "doc_ids": ["d1", "d2"],
        "truncated": True,
    },
    {"kind": "tool", "tool": "get_context", "args": {"query": "Alice Moreau"}, "doc_ids": []},
    {
        "kind": "tool",
        "tool": "search",
        "args": {"query": "Alice born"},
        "error": "not allowed yet: two failed look-ups first",
    },
    {"kind": "invalid", "error": "no JSON"},
    {"kind": "tool", "tool": "get_by_doc_id", "args": {"docid": "d2"}, "doc_ids": ["d2"]},
    {
        "kind": "tool",
        "tool": "get_context",
        "args": {"query": "Alice Moreau"},
        "blocked": True,
        "repeated": True,
    },
]


def _trace(qid: str = "q1", **kw: Any) -> Trace:
    base: dict[str, Any] = {
        "query_id": qid,
        "skill": "in-context",
        "question": "Where was Alice Moreau born?",
        "gold_answer": "Paris",
        "aliases": ["Paris, France"],
        "status": "budget_exhausted",
        "timed_out": True,
        "exact_answer": "",
        "steps": STEPS,
        "n_steps": 6,
        "doc_ids_seen": ["d1", "d2"],
        "evidence_docids": ["d1", "d7"],
    }
    base.update(kw)
    return Trace(**base)


def test_rewriter_feedback_names_every_lookup_and_the_gold_document_that_never_surfaced() -> None:
    text = rewriter_feedback(_trace(), documents=DOCS, gold_docids=["d7"], kis_by_doc=KIS)
    assert text == (
        "The step budget ran out after 6 steps with no answer; gold answer 'Paris'.\n"
        "Searched 'Alice birthplace' (got documents d1, d2; cut at the cap), 'Alice Moreau' (got nothing), "
        "search 'Alice born' (error: not allowed yet: two failed look-ups first), "
        "get_by_doc_id 'd2' (got documents d2), 'Alice Moreau' (blocked: a repeat).\n"
        'Got nothing about "Alice Moreau" (document d7; its facts name Alice Moreau, Lyon Conservatoire): '
        "plan look-ups whose entity tags and text name it."
    )


def test_rewriter_feedback_without_lookups_kis_or_a_known_document() -> None:
    bare = _trace(steps=[], n_steps=3, evidence_docids=["d9"], doc_ids_seen=[])
    assert rewriter_feedback(bare, documents=DOCS, kis_by_doc={}) == (
        "The step budget ran out after 3 steps with no answer; gold answer 'Paris'.\n"
        "No look-ups were issued.\n"
        "Got nothing about document d9 (no KI was extracted from it): "
        "plan look-ups whose entity tags and text name it."
    )
    untitled = _trace(steps=[], n_steps=3, evidence_docids=["d8"], doc_ids_seen=[])
    assert rewriter_feedback(untitled, documents=DOCS).splitlines()[-1] == (
        "Got nothing about document d8: plan look-ups whose entity tags and text name it."
    )
    surfaced = _trace(evidence_docids=["d1"])
    assert rewriter_feedback(surfaced, documents=DOCS).splitlines()[-1] == (
        "Every gold document surfaced (d1) but no answer was committed: answer from them."
    )


def test_extractor_items_quote_the_answer_bearing_sentence_of_unsurfaced_gold_documents() -> None:
    trace = _trace(evidence_docids=["d1", "d7", "d8", "d9"])  # d1 surfaced; d9 not in the slice
    assert unsurfaced_gold_docs(trace) == ["d7", "d8", "d9"]
    items = extractor_items(trace, documents=DOCS)
    assert items == [
        ExtractorItem(
            "d7", "q1", "Where was Alice Moreau born?", "Paris", ("She was born in Paris in 1950.",)
        ),
        ExtractorItem("d8", "q1", "Where was Alice Moreau born?", "Paris", ()),
    ]
    assert items[0].text() == (
        "Document d7 never surfaced for 'Where was Alice Moreau born?'; "
        "extract a fact stating 'Paris' from \"She was born in Paris in 1950.\""
    )
    assert items[1].text() == (
        "Document d8 never surfaced for 'Where was Alice Moreau born?'; "
        "it does not state 'Paris' verbatim: extract its entities and relations."
    )


def test_route_takes_only_out_of_budget_failures() -> None:
    traces = [
        _trace("q1"),
        _trace("q2", exact_answer="Lyon", status="answered", timed_out=False),  # wrong, not out of budget
        _trace("q3", exact_answer="Paris", status="answered", em=True),  # correct
        _trace("q4", status="failed", failure="LMTimeoutError: slow"),  # failed, not a model mistake
        _trace("q5", evidence_docids=["d1"]),  # out of budget, every gold document surfaced
    ]
    route = route_out_of_budget(traces, documents=DOCS, gold_docids={"q1": ("d7",)}, kis_by_doc=KIS)
    assert list(route.rewriter) == ["q1", "q5"]
    assert route.rewriter["q1"] == rewriter_feedback(
        traces[0], documents=DOCS, gold_docids=["d7"], kis_by_doc=KIS
    )
    assert [(i.docid, i.query_id) for i in route.extractor] == [("d7", "q1")]
    assert route.to_metrics() == {
        "route_oob_questions": 2.0,
        "route_oob_extractor_items": 1.0,
        "route_oob_items_with_sentence": 1.0,
    }


def test_describe_lookups_counts_the_ones_left_out() -> None:
    assert describe_lookups(_trace(), limit=2) == (
        "Searched 'Alice birthplace' (got documents d1, d2; cut at the cap), "
        "'Alice Moreau' (got nothing) and 3 more."
    )
    assert describe_lookups(_trace(steps=[])) == ""


def test_every_failure_kind_maps_to_exactly_one_route() -> None:
    from kitune.evaluation.failures import FAILURE_KINDS
    from kitune.optimizers.routes import FAILURE_ROUTES, kinds_for_proposal, kinds_routed_to
    from kitune.service.workflows.proposals import PROPOSAL_KINDS

    assert list(FAILURE_ROUTES) == list(FAILURE_KINDS)  # every kind, once, in report order
    assert all(route.kind == kind for kind, route in FAILURE_ROUTES.items())
    receivers = {"disambiguation", "extractor", "rewriter"}
    for route in FAILURE_ROUTES.values():  # one route: either one improver, the programs, or nothing
        assert set(route.to) <= receivers and not ("disambiguation" in route.to and len(route.to) > 1)
        assert set(route.proposals) <= set(PROPOSAL_KINDS) and route.writes
        assert not route.from_trace or route.to  # a trace-built route writes somewhere
    assert kinds_routed_to("disambiguation") == {"wrong_entity", "wrong_number"}
    assert kinds_routed_to("rewriter") == {"no_candidate", "out_of_budget"}
    assert kinds_routed_to("extractor", from_trace=False) == {"no_candidate"}
    assert {k for k, r in FAILURE_ROUTES.items() if not r.to} == {"malformed_calls", "grader_error", "failed"}
    assert kinds_for_proposal("rewriter_feedback") == ("no_candidate", "out_of_budget")


def test_the_docs_show_the_route_table_the_code_has() -> None:
    from pathlib import Path

    from kitune.optimizers.routes import routes_markdown

    doc = (Path(__file__).resolve().parents[2] / "docs" / "loop-stages.md").read_text(encoding="utf-8")
    shown = doc.split("<!-- routes:begin -->\n", 1)[1].split("<!-- routes:end -->", 1)[0]
    assert shown == routes_markdown()
