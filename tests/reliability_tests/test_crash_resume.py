"""Crash and resume (issue 8 item 2): SIGKILL extraction and eval children at seeded random points.

The children (``crash_worker.py``) use deterministic in-process LMs (DSPy's DummyLM keyed on each
document, a scripted chat model per question), so every run sees the same "replayed" LM; the
soak script repeats this through the real LM layer and the stub server. After a few kills an
uninterrupted resume finishes the work; the result must equal a clean run's, with no lost and
no duplicated KIs or traces.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

from reliability_helpers import run_with_kills, store_snapshot, trace_rows, worker_cmd

from kitune.data.loaders import load_corpus
from kitune.service.pipelines.extraction import read_state

N_DOCS = 16
N_QUESTIONS = 12


def test_extraction_killed_and_resumed_equals_a_clean_run(fixture_dir: Path, tmp_path: Path) -> None:
    docs = {d.docid for d in load_corpus(fixture_dir)[:N_DOCS]}
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    log = tmp_path / "worker.log"
    rc = run_with_kills(
        worker_cmd("extract", clean, N_DOCS, fixture_dir, pace=0.0),
        kills=0,
        rng=random.Random(0),
        max_delay_s=0,
        log=log,
    )
    assert rc == ["final exit 0"], log.read_text()
    outcomes = run_with_kills(
        worker_cmd("extract", crashed, N_DOCS, fixture_dir, pace=0.1),
        kills=3,
        rng=random.Random(8),
        max_delay_s=1.2,
        log=log,
    )
    assert outcomes[-1] == "final exit 0", log.read_text()
    assert sum(o.startswith("killed") for o in outcomes) >= 2, outcomes
    want, got = store_snapshot(clean / "lance"), store_snapshot(crashed / "lance")
    assert len(want) >= N_DOCS + N_DOCS // 2  # one or two verified facts per document
    assert got == want  # nothing lost, nothing extra, every field equal
    # each document marked ok exactly once across all the interrupted runs (no double counting)
    lines = [json.loads(x) for x in (crashed / "state.jsonl").read_text().splitlines() if x.strip()]
    ok_lines = Counter(rec["docid"] for rec in lines if rec.get("status") == "ok")
    assert ok_lines == Counter(docs)
    assert set(read_state(crashed / "state.jsonl").values()) == {"ok"}


def test_eval_killed_and_resumed_equals_a_clean_run(tmp_path: Path) -> None:
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    log = tmp_path / "worker.log"
    rc = run_with_kills(
        worker_cmd("eval", clean, N_QUESTIONS, pace=0.0),
        kills=0,
        rng=random.Random(0),
        max_delay_s=0,
        log=log,
    )
    assert rc == ["final exit 0"], log.read_text()
    outcomes = run_with_kills(
        worker_cmd("eval", crashed, N_QUESTIONS, pace=0.15),
        kills=3,
        rng=random.Random(3),
        max_delay_s=0.8,
        log=log,
    )
    assert outcomes[-1] == "final exit 0", log.read_text()
    assert sum(o.startswith("killed") for o in outcomes) >= 2, outcomes
    want, got = trace_rows(clean / "traces.jsonl"), trace_rows(crashed / "traces.jsonl")
    assert len(want) == N_QUESTIONS
    assert got == want  # exactly one line per question, same answers and token counts
    assert all(row[2] == f"Town {int(row[0][1:])}" for row in got)
