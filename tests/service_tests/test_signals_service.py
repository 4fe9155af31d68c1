"""``kitune signals`` service: every kind of source, the store's facts, MLflow logging, the report section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kitune.config import KituneConfig
from kitune.errors import DataError
from kitune.evaluation.harness import TraceWriter
from kitune.evaluation.metrics import Trace
from kitune.evaluation.report import write_report
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryStore
from kitune.service.workflows.signals import load_signal_traces, log_signals, signal_report, store_facts
from kitune.service.workflows.traces import read_trace_file, to_trace
from kitune.testing.review import scenario
from kitune.testing.tracking import RecordingTracker


def kitune_run(root: Path, name: str) -> Path:
    """A run folder whose traces are the scenario's chats converted to kitune traces (same query id twice)."""
    src = root / "chats.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in scenario().chats[:2]), encoding="utf-8")
    pts, _ = read_trace_file(src)
    run = root / name
    run.mkdir(parents=True)
    w = TraceWriter(run / "traces.jsonl")
    for pt in pts:
        t = to_trace(pt)
        w.write(Trace.from_dict({**t.to_dict(), "skill": "in-context"}))
    return run


def test_sources_of_every_kind_and_their_trace_ids(tmp_path: Path) -> None:
    run = kitune_run(tmp_path, "in-context-fixture")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.jsonl").write_text("".join(json.dumps(c) + "\n" for c in scenario().chats[2:]) + "not json\n")
    loaded = load_signal_traces([run, inbox])
    assert [tid for tid, _ in loaded.traces] == [
        f"in-context-fixture:{loaded.traces[0][1].query_id}",
        f"in-context-fixture:{loaded.traces[1][1].query_id}",
        "conv-3",
        "conv-4",
        "conv-5",
    ]
    assert loaded.sources == [str(run / "traces.jsonl"), str(inbox / "a.jsonl")]
    assert [(s.line, s.reason.split(":")[0]) for s in loaded.skipped] == [(4, "invalid JSON")]
    with pytest.raises(DataError, match="no traces at"):
        load_signal_traces([tmp_path / "missing"])


def test_store_facts_give_coverage_and_the_floor(tmp_path: Path) -> None:
    store = MemoryStore(HashEmbedder())
    sc = scenario()
    store.upsert(
        [
            *sc.kis,
            *(
                k.model_copy(update={"payload": k.payload.model_copy(update={"status": "expired"})})
                for k in sc.drafts["d7"]
            ),
        ]
    )
    facts = store_facts(store)
    assert facts.entities == {"paris", "france"}  # the expired Red Cross KIs do not count
    assert facts.confidence == {sc.kis[0].id: 90}
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in sc.chats), encoding="utf-8")
    cfg = KituneConfig(workdir=tmp_path / "w", retrieval={"confidence_floor": 95})
    report = signal_report(cfg, load_signal_traces([path]).traces, facts=facts)
    # under a floor of 95 the Paris KI (90) shown in conv-4/conv-5 counts as nothing found
    assert report.by_kind["empty_retrieval"] == 5 and report.by_kind["coverage_gap"] == 3
    assert report.coverage_computed
    tracker = RecordingTracker()
    run_id = log_signals(tracker, report, name="prod", params={"signals.traces": 5})
    run = tracker.by_name("signals-prod")
    assert run.run_id == run_id and run.tags["kitune.kind"] == "signals"
    assert run.metrics["signals_empty_retrieval"] == 5.0 and run.metrics["signals_traces"] == 5.0
    assert json.loads(run.artifacts["signals/report.json"])["by_kind"]["coverage_gap"] == 3


def test_report_has_a_signals_section_and_file(tmp_path: Path) -> None:
    run = kitune_run(tmp_path, "run-a")
    from kitune.evaluation.harness import read_traces

    files = write_report({"run-a": read_traces(run / "traces.jsonl")}, tmp_path / "report")
    md = files.markdown.read_text(encoding="utf-8")
    assert "## Failure signals (no gold answer needed)" in md
    assert "| fell back to raw | 2/2 (100%) |" in md and "| looped | 1/2 (50%) |" in md
    assert "coverage gap" not in md.split("## Failure signals")[1].split("Coverage gaps")[0]
    data = json.loads((tmp_path / "report" / "signals.json").read_text())
    assert data["run-a"]["by_kind"]["empty_retrieval"] == 2 and files.signals is not None
