from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kitune.errors import DataError
from kitune.evaluation.harness import TraceWriter
from kitune.evaluation.metrics import Trace
from kitune.evaluation.report import load_run, summarize, wilson_interval, write_report


def tr(qid: str, **kw) -> Trace:
    base = dict(query_id=qid, skill="baseline", question="?", gold_answer="g")
    return Trace(**{**base, **kw})


TRACES = [
    tr(
        "1",
        judge_correct=True,
        judge_status="graded",
        em=True,
        f1=1.0,
        input_tokens=1000,
        output_tokens=50,
        tool_calls={"search": 3, "get_by_doc_id": 1},
        evidence_recall=1.0,
        wall_time_s=2.0,
        status="answered",
    ),
    tr(
        "2",
        judge_correct=True,
        judge_status="graded",
        em=False,
        f1=0.5,
        input_tokens=3000,
        output_tokens=70,
        tool_calls={"search": 2},
        timed_out=True,
        force_committed=True,
        evidence_recall=0.5,
        wall_time_s=4.0,
        status="budget_exhausted",
        repeated_call_blocked=2,
    ),
    tr(
        "3",
        judge_correct=False,
        judge_status="graded",
        em=False,
        f1=0.0,
        input_tokens=2000,
        output_tokens=30,
        tool_calls={"search": 1},
        timed_out=True,
        force_committed=True,
        evidence_recall=0.0,
        wall_time_s=3.0,
        status="budget_exhausted",
    ),
    tr(
        "4",
        judge_correct=None,
        judge_status="grader_error",
        em=True,
        f1=1.0,
        input_tokens=500,
        output_tokens=10,
        evidence_recall=None,
        wall_time_s=1.0,
        status="answered",
    ),
]


def test_wilson_known_values() -> None:
    low, high = wilson_interval(60, 96)
    assert math.isclose(low, 0.5253, abs_tol=1e-3) and math.isclose(high, 0.7155, abs_tol=1e-3)
    assert wilson_interval(0, 0) == (0.0, 0.0)
    assert wilson_interval(5, 5)[1] == 1.0


def test_summarize_equals_hand_computed() -> None:
    s = summarize(TRACES, "base")
    assert (s.n_total, s.n_graded, s.n_grader_errors, s.n_correct, s.n_failed) == (4, 3, 1, 2, 0)
    assert s.accuracy == 2 / 3
    assert (s.ci_low, s.ci_high) == wilson_interval(2, 3)
    assert s.em == 0.5 and s.f1 == 2.5 / 4
    assert s.input_tokens == 6500 and s.input_tokens_per_question == 1625.0 and s.output_tokens == 160
    assert s.timeouts == 2 and s.force_committed == 2 and s.force_commit_rescues == 1
    assert s.evidence_recall == 0.5  # mean of 1.0, 0.5, 0.0 (None excluded)
    assert s.search_calls == 6 and s.tool_calls == 7 and s.repeated_call_blocked == 2
    assert s.wall_time_s == 10.0
    assert s.incomplete is True  # 1/4 grader errors > 5%
    # "3" timed out with no answer; "4" could not be graded
    assert s.failure_kinds == {
        "wrong_entity": 0,
        "wrong_number": 0,
        "no_candidate": 0,
        "out_of_budget": 1,
        "malformed_calls": 0,
        "grader_error": 1,
        "failed": 0,
    }


def test_report_numbers_equal_traces(tmp_path: Path) -> None:
    closed = [
        tr(
            "1",
            skill="closed-book",
            judge_correct=False,
            judge_status="graded",
            input_tokens=100,
            status="answered",
        )
    ]
    files = write_report({"base": TRACES, "closed": closed}, tmp_path / "rep")
    md = files.markdown.read_text(encoding="utf-8")
    rows = {
        line.split(" | ")[0].lstrip("| "): line.strip("| \n").split(" | ")[1:]
        for line in md.splitlines()
        if line.startswith("| ")
    }
    assert rows["metric"] == ["base", "closed"]
    assert rows["correct"] == ["2/3 (66.7%) ⚠ incomplete", "0/1 (0.0%)"]
    lo, hi = wilson_interval(2, 3)
    assert rows["95% CI"][0] == f"{100 * lo:.1f}%–{100 * hi:.1f}%"
    assert rows["graded / grader errors / failed"] == ["3/4 / 1 / 0", "1/1 / 0 / 0"]
    assert rows["EM"] == ["0.500", "0.000"] and rows["F1"] == ["0.625", "0.000"]
    assert rows["input tokens"] == [str(sum(t.input_tokens for t in TRACES)), "100"]
    assert rows["input tokens / question"] == ["1625.0", "100.0"]
    assert rows["output tokens"] == ["160", "0"]
    assert rows["timeouts"] == ["2", "0"] and rows["force-commits (rescued)"] == ["2 (1)", "0 (0)"]
    assert rows["evidence recall"] == ["0.500", "–"] and rows["search calls"] == ["6", "0"]
    assert rows["wall time (s)"] == ["10.0", "0.0"]
    # the closed-book answer is blank without running out of budget: no candidate
    assert rows["failure kind: out of budget"] == ["1", "0"] and rows["failure kind: no candidate"] == [
        "0",
        "1",
    ]
    data = json.loads(files.summary_json.read_text())
    assert data[0]["input_tokens"] == 6500 and data[1]["name"] == "closed"
    assert files.plot is not None and files.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<td>2/3 (66.7%) ⚠ incomplete</td>" in files.html.read_text(encoding="utf-8")


def test_load_run(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "base"
    w = TraceWriter(run / "traces.jsonl")
    for t in TRACES:
        w.write(t)
    name, traces = load_run(run)
    assert name == "base" and traces == TRACES
    with pytest.raises(DataError, match="no traces at"):
        load_run(tmp_path / "nope")
    with pytest.raises(ValueError):
        write_report({}, tmp_path)


def test_report_shows_stage_metrics_beside_the_end_to_end_table(tmp_path: Path) -> None:
    from kitune.evaluation.report import stage_markdown
    from kitune.evaluation.stage_metrics import StageMetric, StageReport

    low, high = wilson_interval(3, 4)
    tune = StageReport(
        "tune",
        (
            StageMetric("extractor", "answer_coverage", "answer coverage", 0.75, 4, low, high, 3),
            StageMetric("rewriter", "mrr", "MRR", 0.5, 4, 0.1, 0.9),
        ),
    )
    val = StageReport("validation", (StageMetric("rewriter", "mrr", "MRR", None, 0, None, None),))
    lines = stage_markdown([tune, val], title=None)
    assert lines == [
        "| run | extractor answer coverage | rewriter MRR |",
        "|---|---|---|",
        f"| tune | 3/4 = 75.0% [{low:.1%}–{high:.1%}] | 0.5 [0.1–0.9] (n=4) |",
        "| validation | – | – (n=0) |",
    ]
    files = write_report({"run": TRACES}, tmp_path, stages=[tune, val], sections=["## KI credit\n\nnone\n"])
    md = files.markdown.read_text(encoding="utf-8")
    assert "## Stage metrics" in md and lines[2] in md
    assert md.rstrip().endswith("## KI credit\n\nnone")
    assert stage_markdown([]) == []
