"""``kitune loop --watch`` on unlabelled traces: signals → proposals → only gated changes applied."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kitune.config import KituneConfig
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryStore
from kitune.service.workflows.proposals import ProposalStore, RewriterPrompt
from kitune.service.workflows.review import ReviewService
from kitune.service.workflows.traces import TraceFolder
from kitune.service.workflows.watch import LoopOptions, ReviewHooks, WatchOptions, watch
from kitune.testing.review import TableDrafter, chat_record, gold_evaluator, scenario
from kitune.testing.tracking import RecordingTracker


def test_watch_mines_unlabelled_traces_and_applies_only_what_the_gate_accepts(tmp_path: Path) -> None:
    # the scenario has 2 labelled questions, on which the default stage rule can show nothing
    # (tests/service_tests/test_review_decision.py); the watch's mechanics are tested on the old rule
    cfg = KituneConfig(
        workdir=tmp_path / "w",
        review={"auto_approve": ["add_ki", "retire_ki"]},
        optimize={"decision_rule": "permissive"},
    )
    sc = scenario()
    store = MemoryStore(HashEmbedder())
    store.upsert(sc.kis)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"docid": d.docid, "text": d.text}) + "\n" for d in sc.docs))
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    labelled = [
        chat_record(f"lab-{q.query_id}", q.query, [], q.answer, gold_answer=q.answer, query_id=q.query_id)
        for q in sc.questions
    ]
    (inbox / "day1.jsonl").write_text("".join(json.dumps(c) + "\n" for c in [*sc.chats, *labelled]))
    tracker = RecordingTracker()
    svc = ReviewService(cfg, ProposalStore.of(cfg), store, None, tracker)
    arms: list[str] = []
    hooks = ReviewHooks(
        service=svc,
        documents={d.docid: d for d in sc.docs}.get,
        draft=TableDrafter(sc.drafts),
        extractor_version="extractor@test",
        rewriter=RewriterPrompt("kitune-corpus-rewriter", "Plan the search query for the question.", None),
        evaluate=gold_evaluator(arms),
        tracker=tracker,
    )
    rounds: list[Any] = []
    lines: list[str] = []
    summary = watch(
        cfg,
        LoopOptions(corpus=corpus, progress=False),
        WatchOptions(directory=inbox, interval_s=0, max_polls=1),
        review=hooks,
        optimize=lambda cfg, opts, **kw: rounds.append(opts),
        log=lines.append,
    )
    (mined,) = summary.mined
    assert mined["traces"] == 7 and mined["signals"]["fell_back_to_raw"] == 3
    kinds = {p.kind: p for p in svc.list()}
    assert sorted(kinds) == ["add_ki", "re_extract", "retire_ki", "rewriter_feedback"]
    # add_ki fixes the labelled Eiffel question: applied; retiring the Paris KI breaks the other: refused
    assert mined["auto_approved"] == [kinds["add_ki"].id]
    assert store.get(sc.drafts["d8"][0].id).payload.status == "active"
    assert kinds["retire_ki"].status == "pending" and mined["gate_refused"][kinds["retire_ki"].id].startswith(
        "rejected"
    )
    assert (
        kinds["re_extract"].status == "pending" and kinds["re_extract"].effect is None
    )  # not auto: not measured
    assert sorted(arms) == sorted(
        f"{kinds[k].id}-{arm}" for k in ("add_ki", "retire_ki") for arm in ("current", "proposal")
    )
    assert tracker.by_name("signals-default-poll1").metrics["signals_fell_back_to_raw"] == 3.0
    assert any("4 proposal(s) filed, 1 auto-approved" in line for line in lines)
    # the labelled traces still drive the optimiser
    assert len(rounds) == 1 and len(summary.rounds) == 1
    state = TraceFolder.of(cfg, "default").read_state()
    assert len(state["signalled"]) == 7
    # the same traces again (a rewritten file): nothing new to mine, nothing re-proposed
    (inbox / "day1.jsonl").write_text((inbox / "day1.jsonl").read_text() + "\n")
    again = watch(
        cfg,
        LoopOptions(corpus=corpus, progress=False),
        WatchOptions(directory=inbox, interval_s=0, max_polls=1),
        review=hooks,
        optimize=lambda cfg, opts, **kw: rounds.append(opts),
    )
    assert again.mined == [
        {"traces": 0, "signals": {}, "filed": [], "auto_approved": [], "gate_refused": {}, "errors": []}
    ]
    assert len(svc.list()) == 4


def test_traces_without_actionable_signals_open_no_store(tmp_path: Path, monkeypatch: Any) -> None:
    import kitune.service.workflows.watch as watch_mod

    def no_wiring(*args: Any) -> ReviewHooks:
        raise AssertionError("no store or LM should be opened for traces without actionable signals")

    monkeypatch.setattr(watch_mod, "production_hooks", no_wiring)
    cfg = KituneConfig(workdir=tmp_path / "w")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    ok = chat_record(
        "c1", "What is 2+2?", [("get_context", {"query": "2+2"}, "1. [ki-x] 2+2 is 4.")], "4", correct=True
    )
    (inbox / "a.jsonl").write_text(json.dumps(ok) + "\n")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"docid": "d1", "text": "x"}) + "\n")
    summary = watch(
        cfg,
        LoopOptions(corpus=corpus, progress=False),
        WatchOptions(directory=inbox, interval_s=0, max_polls=1),
        optimize=lambda *a, **k: None,
    )
    assert summary.mined[0]["traces"] == 1 and summary.mined[0]["filed"] == []
    assert all(v == 0 for v in summary.mined[0]["signals"].values())
    empty = chat_record("c2", "Who is Zed?", [("get_context", {"query": "Zed"}, "[]")], "nobody")
    (inbox / "b.jsonl").write_text(json.dumps(empty) + "\n")  # actionable, but mining is off
    off = watch(
        cfg,
        LoopOptions(corpus=corpus, progress=False),
        WatchOptions(directory=inbox, interval_s=0, max_polls=1, propose=False),
        optimize=lambda *a, **k: None,
    )
    assert off.mined == [] and off.imported[0].new == 1
