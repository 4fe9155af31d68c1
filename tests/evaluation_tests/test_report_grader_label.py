"""The report names what graded its accuracy row: "correct (match)" or "correct (judge)" (issue 37)."""

from __future__ import annotations

import json
from pathlib import Path

from kitune.evaluation.metrics import Trace
from kitune.evaluation.report import accuracy_label, run_grader, write_report
from kitune.service.pipelines.evaluation import report_runs


def _trace(qid: str, correct: bool) -> Trace:
    return Trace(
        query_id=qid,
        skill="in-context",
        question="q?",
        gold_answer="a",
        status="answered",
        exact_answer="a" if correct else "b",
        judge_correct=correct,
        judge_status="graded",
    )


def test_accuracy_label_names_the_grader_and_never_calls_match_judge() -> None:
    assert accuracy_label(["match", "match"]) == "correct (match)"
    assert accuracy_label(["judge"]) == accuracy_label(["llm"]) == "correct (judge)"
    assert accuracy_label(["judge", "match"]) == "correct (match / judge)"
    assert accuracy_label(["match", None]) == "correct"
    assert accuracy_label([]) == "correct"


def test_report_runs_reads_each_runs_grader_from_run_json(tmp_path: Path) -> None:
    run = tmp_path / "in-context"
    run.mkdir()
    (run / "traces.jsonl").write_text(
        "\n".join(json.dumps(t.to_dict()) for t in (_trace("1", True), _trace("2", False))) + "\n",
        encoding="utf-8",
    )
    (run / "run.json").write_text(json.dumps({"grader": "llm"}), encoding="utf-8")
    assert run_grader(run) == "judge"
    (run / "run.json").write_text(json.dumps({"grader": "match"}), encoding="utf-8")
    assert run_grader(run) == "match"
    files = report_runs([run], tmp_path / "out")
    md = files.markdown.read_text(encoding="utf-8")
    assert "| correct (match) |" in md and "judge-correct" not in md
    assert "Accuracy = correct (match) / graded" in md
    # the per-category section names the same grader
    categorised = [Trace(**{**_trace("3", True).to_dict(), "category": "multi-hop"})]
    (run / "traces.jsonl").write_text(json.dumps(categorised[0].to_dict()) + "\n", encoding="utf-8")
    md = report_runs([run], tmp_path / "out2").markdown.read_text(encoding="utf-8")
    assert "in-context: correct (match) (95% CI)" in md and "judge-correct" not in md


def test_write_report_without_graders_says_correct(tmp_path: Path) -> None:
    files = write_report({"a": [_trace("1", True)]}, tmp_path)
    md = files.markdown.read_text(encoding="utf-8")
    assert "| correct |" in md and "judge-correct" not in md
