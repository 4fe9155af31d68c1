from __future__ import annotations

import json

import pytest
from eval_fakes import DOCS, FakeCorpusStore, fake_context

from kitune.config import KituneConfig
from kitune.data.loaders import Question
from kitune.errors import HarnessError
from kitune.evaluation.agent import Agent
from kitune.evaluation.metrics import build_trace
from kitune.evaluation.tools import (
    ContextObservation,
    Observation,
    ObservationPart,
    baseline_toolbox,
    build_toolbox,
    canonical_call,
    cap_observation,
    cap_text,
    in_context_toolbox,
)
from kitune.retrieval.base import CorpusHit
from kitune.schema import Document
from kitune.testing.chat import ScriptedChatModel


def test_cap_text_marker_and_bound() -> None:
    text, cut = cap_text("x" * 1000, 200)
    assert cut and len(text) <= 200 and text.endswith("narrow the query or fetch less]")
    assert "of 1000 characters" in text
    assert cap_text("short", 200) == ("short", False)


def test_baseline_search_limits_and_get() -> None:
    docs = [*DOCS, *(type(DOCS[0])(docid=f"p{i}", title=f"P{i}", text="paris " * 300) for i in range(20))]
    box = baseline_toolbox(FakeCorpusStore(docs), search_hits=4, snippets_per_hit=3, snippet_chars=50)
    obs = box.call("search", {"query": "paris"})
    assert obs.error is None and len(obs.doc_ids) == 4 and obs.n_results == 4
    assert all(len(line) <= 50 + 4 for line in obs.text.splitlines() if line.startswith("  …"))
    got = box.call("get_by_doc_id", {"docid": "[d1]"})
    assert got.doc_ids == ("d1",) and "Paris is the capital of France." in got.text
    missing = box.call("get_by_doc_id", {"docid": "nope"})
    assert missing.doc_ids == () and "no document or KI with id 'nope'" in missing.error
    assert "ERROR:" in missing.text


def test_backend_failure_becomes_error_observation() -> None:
    store = FakeCorpusStore(DOCS)
    store.search = lambda *a, **k: (_ for _ in ()).throw(ConnectionError("down"))  # type: ignore[method-assign]
    obs = baseline_toolbox(store).call("search", {"query": "x"})
    assert obs.error == "search failed: ConnectionError: down"


def test_a_recording_miss_inside_a_tool_stops_the_run() -> None:
    """A replay without the rewriter's call (made inside get_context) is a configuration error:
    it propagates like the agent's own miss instead of becoming an ERROR observation."""
    from kitune.recording import RecordingMissError

    def lookup(query: str) -> ContextObservation:
        raise RecordingMissError(f"no recorded reply for rewrite of {query!r}", hash="h1", role="rewrite")

    box = in_context_toolbox(lookup)
    with pytest.raises(RecordingMissError, match="no recorded reply for rewrite of 'x'"):
        box.call("get_context", {"query": "x"})


def test_in_context_search_gated_until_two_failed_lookups() -> None:
    hit = ContextObservation(text="KI: Paris is the capital of France [d1]", doc_ids=("d1",), n_results=1)
    gc = fake_context({"capital of France": hit})
    box = in_context_toolbox(gc, corpus_store=FakeCorpusStore(DOCS))
    early = box.call("search", {"query": "Paris"})
    assert early.error and "opens after 2 get_context look-ups" in early.text and "2 more to go" in early.text
    ok = box.call("get_context", {"query": "capital of France"})
    assert ok.doc_ids == ("d1",) and box.failed_lookups == 0
    # turning to search after KIs came back means they did not answer: one failed look-up
    assert "1 more to go" in box.call("search", {"query": "Paris"}).text
    assert "1 more to go" in box.call("search", {"query": "Paris"}).text  # not counted twice
    miss = box.call("get_context", {"query": "other thing"})
    assert miss.n_results == 0 and "No knowledge indicators matched" in miss.text
    assert box.failed_lookups == 2  # the unanswered hit + the miss
    opened = box.call("search", {"query": "Paris"})
    assert opened.error is None and "d1" in opened.doc_ids
    assert gc.calls == ["capital of France", "other thing"]


def test_two_lookups_that_did_not_answer_open_search() -> None:
    hit = ContextObservation(text="KI: Paris is the capital of France [d1]", doc_ids=("d1",), n_results=1)
    box = in_context_toolbox(fake_context({"a": hit, "b": hit}), corpus_store=FakeCorpusStore(DOCS))
    box.call("get_context", {"query": "a"})
    box.call("get_context", {"query": "b"})  # looked up again: "a" did not answer
    assert box.failed_lookups == 1 and box.pending_lookup
    assert box.call("search", {"query": "Paris"}).error is None  # searching: "b" did not answer


def test_in_context_without_store_has_no_search() -> None:
    box = in_context_toolbox(fake_context({}))
    assert list(box.tools) == ["get_context"]
    assert 'Call as {"tool": "get_context", "args": {"query":' in box.describe()


def test_build_toolbox_uses_config_and_checks_deps() -> None:
    cfg = KituneConfig()
    cfg.retrieval.search_hits = 2
    box = build_toolbox("baseline", cfg, corpus_store=FakeCorpusStore(DOCS))
    assert box.max_chars == cfg.agent.observation_max_chars
    assert len(box.call("search", {"query": "France Paris capital"}).doc_ids) == 2
    with pytest.raises(HarnessError, match="needs a corpus store"):
        build_toolbox("baseline", cfg)
    with pytest.raises(HarnessError, match="needs a get_context"):
        build_toolbox("in-context", cfg)
    with pytest.raises(HarnessError, match="unknown skill"):
        build_toolbox("oracle", cfg)  # type: ignore[arg-type]
    assert build_toolbox("closed-book", cfg).tools == {}


def test_canonical_call_sorts_args() -> None:
    assert canonical_call("search", {"b": 1, "a": "x"}) == canonical_call("search ", {"a": "x", "b": 1})
    assert canonical_call("search", {"a": "x"}) != canonical_call("search", {"a": "y"})


def test_placeholder_arguments_are_refused() -> None:
    store = FakeCorpusStore(DOCS)
    obs = baseline_toolbox(store).call("search", {"query": "<keywords>"})
    assert obs.error and "placeholder" in obs.error and store.searches == []


# --- the published baseline and the cap: only what is shown in full counts as seen ----------------


class ThreeSnippetStore(FakeCorpusStore):
    """Every document matches; each hit has 3 snippets of ``snippet_chars`` and a falling score."""

    def search(self, query, *, k=10, snippets_per_hit=3, snippet_chars=700):
        self.searches.append(query)
        ids = sorted(self.docs)[:k]
        return [
            CorpusHit(
                docid=d,
                title=f"Title {d}",
                snippets=[(f"{d}-{j} " * 400)[:snippet_chars] for j in range(snippets_per_hit)],
                score=1.0 / (i + 1),
            )
            for i, d in enumerate(ids)
        ]


STORE_DOCS = [
    Document(docid=f"p{i:02d}", title=f"Title p{i:02d}", text=f"text {i} " * 400) for i in range(12)
]


def test_published_baseline_search_shows_ten_hits_with_scores_uncapped() -> None:
    box = baseline_toolbox(ThreeSnippetStore(STORE_DOCS))  # defaults: 10 hits, 3 x 700 chars, no cap
    assert box.max_chars is None
    obs = box.call("search", {"query": "anything"})
    assert obs.doc_ids == tuple(f"p{i:02d}" for i in range(10)) and obs.n_results == 10
    assert not obs.truncated and len(obs.text) > 21_000
    assert obs.text.startswith("1. [p00] Title p00 (score 1)\n  … p00-0 ")
    assert "\n10. [p09] Title p09 (score 0.1)\n" in obs.text
    snippet_lines = [line for line in obs.text.splitlines() if line.startswith("  … ")]
    assert len(snippet_lines) == 30 and all(len(line) == 4 + 700 for line in snippet_lines)


def test_cap_keeps_whole_hits_and_counts_only_those_as_seen() -> None:
    box = baseline_toolbox(ThreeSnippetStore(STORE_DOCS), max_chars=8000)
    obs = box.call("search", {"query": "anything"})
    # each hit is ~2,140 characters: 3 fit under 8,000 with the marker, the 4th does not
    assert obs.doc_ids == ("p00", "p01", "p02") and obs.truncated and len(obs.text) <= 8000
    assert obs.n_results == 10  # found, not shown
    assert "…[truncated: showed 3 of 10 results (" in obs.text and "[p03]" not in obs.text
    assert obs.text.count("\n  … ") == 9  # the 3 hits kept are whole


def test_agent_seen_and_evidence_recall_follow_the_cap() -> None:
    q = Question(query_id="q", query="?", answer="x", evidence_docids=("p01", "p05"))

    def run(max_chars: int | None):
        model = ScriptedChatModel(
            [tool_call("search", query="anything"), '{"answer": {"exact_answer": "x", "confidence": 50}}']
        )
        ep = Agent(model, baseline_toolbox(ThreeSnippetStore(STORE_DOCS), max_chars=max_chars)).run("?")
        return build_trace(q, "baseline", ep)

    capped, uncapped = run(8000), run(None)
    assert capped.doc_ids_seen == ["p00", "p01", "p02"] and capped.evidence_recall == 0.5
    assert capped.steps[0]["truncated"] is True
    assert uncapped.doc_ids_seen == [f"p{i:02d}" for i in range(10)] and uncapped.evidence_recall == 1.0


def test_first_hit_too_long_shows_its_head_and_counts_nothing() -> None:
    obs = baseline_toolbox(ThreeSnippetStore(STORE_DOCS), max_chars=500).call("search", {"query": "a"})
    assert obs.doc_ids == () and obs.truncated and len(obs.text) <= 500
    assert obs.text.startswith("1. [p00] Title p00")


def test_fetched_document_cut_is_not_counted_as_seen() -> None:
    big = Document(docid="big", title="Big", text="Paris " * 200)
    box = baseline_toolbox(FakeCorpusStore([*DOCS, big]), max_chars=500)
    cut = box.call("get_by_doc_id", {"docid": "big"})
    assert cut.truncated and cut.doc_ids == () and cut.text.startswith("[big] Big\nParis")
    whole = box.call("get_by_doc_id", {"docid": "d1"})
    assert not whole.truncated and whole.doc_ids == ("d1",)


def test_cut_ki_text_keeps_ids_cited_in_complete_lines_only() -> None:
    lines = [f"{i}. [ki-{i}] fact {i} (docs: d{i})".ljust(99, ".") for i in range(1, 6)]
    lines[4] = lines[4].replace("(docs: d5)", "(docs: d5, d1)")
    text = "\n".join(lines)
    obs = Observation(text=text, doc_ids=("d1", "d2", "d3", "d4", "d5"), n_results=5)
    cut = cap_observation(obs, 300)
    # 300 characters minus the ~80-character marker: lines 1-2 whole, line 3 partly shown
    assert cut.text.startswith(lines[0] + "\n" + lines[1] + "\n" + lines[2][:10])
    assert cut.doc_ids == ("d1", "d2") and cut.truncated and len(cut.text) <= 300
    assert cap_observation(obs, None) is obs and cap_observation(obs, 10_000) is obs


def test_cap_observation_parts_prefix() -> None:
    parts = tuple(ObservationPart(text="x" * 100, doc_ids=(f"d{i}", "shared")) for i in range(5))
    obs = Observation(text="\n".join(p.text for p in parts), doc_ids=(), parts=parts)
    cut = cap_observation(obs, 350)  # 100 + 1 + 100 = 201 plus a ~110-character marker
    assert cut.doc_ids == ("d0", "shared", "d1") and len(cut.parts) == 2
    assert "showed 2 of 5 results (201 of 504 characters)" in cut.text and len(cut.text) <= 350


def test_both_skills_get_the_same_cap_and_the_same_cut() -> None:
    cfg = KituneConfig()
    cfg.agent.observation_max_chars = 8000
    store = ThreeSnippetStore(STORE_DOCS)
    base = build_toolbox("baseline", cfg, corpus_store=store)
    ctx = build_toolbox("in-context", cfg, corpus_store=store, get_context=fake_context({}))
    assert base.max_chars == ctx.max_chars == 8000
    ctx.call("get_context", {"query": "a"})
    ctx.call("get_context", {"query": "b"})  # two failed look-ups open the fallback search
    a, b = base.call("search", {"query": "anything"}), ctx.call("search", {"query": "anything"})
    assert a.text == b.text and a.doc_ids == b.doc_ids == ("p00", "p01", "p02")


def tool_call(name: str, **args: str) -> str:
    return json.dumps({"tool": name, "args": args})


def _items_ctx(*ids: str) -> ContextObservation:
    from kitune.evaluation.tools import ContextItem

    items = tuple(
        ContextItem(
            id=i, line=f"[{i}] T{i} — D{i} (docs: d{i})", compact=f"[{i}] D{i} [d{i}]", doc_ids=(f"d{i}",)
        )
        for i in ids
    )
    text = "\n".join(f"{n}. {it.line}" for n, it in enumerate(items, 1)) + "\nfacets: x"
    return ContextObservation(
        text=text, doc_ids=tuple(f"d{i}" for i in ids), n_results=len(ids), items=items, facets="facets: x"
    )


def test_dedupe_drops_kis_already_shown_and_keeps_order() -> None:
    table = {"a": _items_ctx("1", "2", "3"), "b": _items_ctx("4", "2", "5", "1"), "c": _items_ctx("2", "4")}
    box = in_context_toolbox(fake_context(table), ki_render="compact", dedupe_kis=True)
    first = box.call("get_context", {"query": "a"})
    assert first.text == "1. [1] D1 [d1]\n2. [2] D2 [d2]\n3. [3] D3 [d3]" and first.n_results == 3
    second = box.call("get_context", {"query": "b"})
    assert second.text == (
        "1. [4] D4 [d4]\n2. [5] D5 [d5]\n"
        "(2 more matching KI(s) already shown earlier in this episode; not repeated)"
    )
    assert second.doc_ids == ("d4", "d5") and second.n_results == 2
    assert list(box.shown_kis) == ["1", "2", "3", "4", "5"]
    third = box.call("get_context", {"query": "c"})  # nothing new: a look-up that did not answer
    assert third.text == "(all 2 matching KI(s) were already shown earlier in this episode; not repeated)"
    assert (
        third.n_results == 0 and box.failed_lookups == 3
    )  # a, b each failed by looking again; c had nothing


def test_full_render_without_dedupe_is_the_text_as_given() -> None:
    ctx = _items_ctx("1", "2")
    box = in_context_toolbox(fake_context({"a": ctx}), ki_render="full", dedupe_kis=False)
    assert box.call("get_context", {"query": "a"}).text == ctx.text
    box2 = in_context_toolbox(fake_context({"a": ctx, "b": ctx}), ki_render="full", dedupe_kis=True)
    box2.call("get_context", {"query": "a"})
    again = box2.call("get_context", {"query": "b"})
    assert again.text.startswith("(all 2 matching KI(s)") and "facets" not in again.text
