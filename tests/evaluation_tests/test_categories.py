"""Per-category breakdown: counts, Wilson intervals and tokens per question, per run."""

from __future__ import annotations

import json

import pytest

from kitune.data.loaders import Question
from kitune.evaluation.agent import Episode, Step
from kitune.evaluation.categories import ALL, NO_CATEGORY, by_category, category_json, category_markdown
from kitune.evaluation.metrics import Trace, build_trace, failed_trace
from kitune.evaluation.report import wilson_interval


def tr(qid: str, cat: str, correct: bool | None, tokens: int, **kw) -> Trace:
    status = "graded" if correct is not None else "grader_error"
    return Trace(
        query_id=qid,
        skill="baseline",
        question="?",
        gold_answer="g",
        judge_correct=correct,
        judge_status=status,
        input_tokens=tokens,
        category=cat,
        status="answered",
        **kw,
    )


RUN = [
    tr("1", "temporal", True, 1000),
    tr("2", "temporal", False, 3000),
    tr("3", "temporal", True, 2000),
    tr("4", "single-hop", True, 500, tool_input_tokens=100),
    tr("5", "single-hop", None, 700),  # grader error: excluded from the denominator
]


def test_by_category_counts_ci_and_tokens() -> None:
    rows = by_category(RUN)
    assert list(rows) == ["single-hop", "temporal", ALL]
    t = rows["temporal"]
    assert (t.n_total, t.n_graded, t.n_correct) == (3, 3, 2)
    assert t.accuracy == pytest.approx(2 / 3)
    assert (t.ci_low, t.ci_high) == pytest.approx(wilson_interval(2, 3))
    assert t.input_tokens_per_question == pytest.approx(2000.0)
    s = rows["single-hop"]
    assert (s.n_total, s.n_graded, s.n_correct, s.n_grader_errors) == (2, 1, 1, 1)
    assert s.input_tokens_per_question == pytest.approx(600.0) and s.tool_input_tokens == 100
    a = rows[ALL]
    assert (a.n_total, a.n_graded, a.n_correct) == (5, 4, 3)
    assert a.input_tokens_per_question == pytest.approx(7200 / 5)
    assert sum(r.n_total for c, r in rows.items() if c != ALL) == len(RUN)


def test_missing_category_uses_fallback_map_then_none() -> None:
    traces = [tr("1", "", True, 10), tr("2", "", False, 20)]
    rows = by_category(traces, categories={"1": "multi-hop"}, include_all=False)
    assert list(rows) == ["multi-hop", NO_CATEGORY]
    assert rows["multi-hop"].n_correct == 1 and rows[NO_CATEGORY].n_correct == 0
    assert by_category([]) == {}


def test_category_markdown_two_runs() -> None:
    other = [tr("1", "temporal", False, 50), tr("4", "single-hop", True, 40)]
    lines = category_markdown({"baseline": RUN, "in-context": other}, accuracy="correct (match)")
    assert lines[0] == "## By question category"
    assert lines[2] == (  # named as the report's accuracy row names it (issue 37: no "judge-correct")
        "| category | n | baseline: correct (match) (95% CI) | baseline: input tokens / question "
        "| in-context: correct (match) (95% CI) | in-context: input tokens / question |"
    )
    assert lines[-1].startswith("Accuracy = correct (match) / graded")
    assert "judge-correct" not in "\n".join(category_markdown({"baseline": RUN}))
    lo, hi = wilson_interval(2, 3)
    temporal = next(line for line in lines if line.startswith("| temporal"))
    assert temporal == (
        f"| temporal | 1/3 | 2/3 = 66.7% ({100 * lo:.0f}–{100 * hi:.0f}) | 2000 | 0/1 = 0.0% (0–79) | 50 |"
    )
    single = next(line for line in lines if line.startswith("| single-hop"))
    assert "| 600 + 50 |" in single  # 100 tool tokens over 2 questions
    assert lines[-3].startswith("| all | 2/5 |")
    assert category_markdown({"x": [tr("1", "", True, 1)]}) == []  # nothing to break down


def test_category_json_round_trips() -> None:
    data = json.loads(category_json({"b": RUN}))
    assert data["b"]["temporal"]["n_correct"] == 2 and data["b"][ALL]["n_total"] == 5


def test_build_and_failed_trace_carry_category() -> None:
    q = Question(
        query_id="q", query="When?", answer="7 May 2023", category="temporal", evidence_turns=("D1:3",)
    )
    ep = Episode(question="When?", status="answered", exact_answer="7 May 2023", steps=(Step(1, "answer"),))
    t = build_trace(q, "baseline", ep)
    assert t.category == "temporal" and Trace.from_dict(t.to_dict()).category == "temporal"
    assert failed_trace(q, "baseline", "boom").category == "temporal"
    assert (
        Trace.from_dict({"query_id": "x", "skill": "s", "question": "?", "gold_answer": "g"}).category == ""
    )
