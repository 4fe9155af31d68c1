from __future__ import annotations

import pytest
from eval_fakes import DOCS, FakeCorpusStore, fake_context

from kitune.config import KituneConfig
from kitune.errors import HarnessError
from kitune.evaluation.tools import (
    ContextObservation,
    baseline_toolbox,
    build_toolbox,
    canonical_call,
    cap_text,
    in_context_toolbox,
)


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
