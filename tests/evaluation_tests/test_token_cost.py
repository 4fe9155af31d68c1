from __future__ import annotations

import json
from pathlib import Path

import pytest

from kitune.evaluation.metrics import Trace
from kitune.evaluation.report import write_report
from kitune.evaluation.token_cost import token_cost_markdown, token_costs


def tr(
    qid: str, tokens: int, correct: bool, split: dict[str, int] | None = None, skill: str = "baseline"
) -> Trace:
    return Trace(
        query_id=qid,
        skill=skill,
        question="?",
        gold_answer="g",
        judge_correct=correct,
        judge_status="graded",
        input_tokens=tokens,
        input_split=split or {},
        status="answered",
    )


BASE = [tr(str(i), 1000 * (i + 1), i % 2 == 0) for i in range(6)]  # 1k..6k, correct: 0, 2, 4
CTX = [
    tr(
        str(i),
        500 * (i + 1),
        i < 4,
        {"system": 300 * (i + 1), "observation:get_context": 200 * (i + 1)},
        "in-context",
    )
    for i in range(6)
]


def test_per_question_per_correct_and_ratio_against_the_baseline() -> None:
    ctx, base = token_costs({"in-context": CTX, "baseline": BASE}, resamples=500)  # runs order
    assert base.name == "baseline" and base.reference is None and base.ratio is None
    assert base.per_question == 3500 and base.n_correct == 3 and base.per_correct == 7000
    lo, hi = base.per_question_ci
    assert 1000 <= lo < 3500 < hi <= 6000
    assert ctx.reference == "baseline" and ctx.n_paired == 6
    assert ctx.ratio == pytest.approx(0.5)  # every question costs half: the paired ratio is exact
    assert ctx.ratio_ci == pytest.approx((0.5, 0.5))
    assert ctx.per_correct == pytest.approx(10500 / 4)
    assert ctx.components == {"observation:get_context": 700.0, "system": 1050.0} and ctx.n_split == 6
    assert sum(ctx.components.values()) == ctx.per_question
    # seeded: the same intervals every time
    again = token_costs({"in-context": CTX, "baseline": BASE}, resamples=500)
    assert again[0].per_question_ci == ctx.per_question_ci and again[1].per_correct_ci == base.per_correct_ci


def test_no_correct_answer_and_bad_arguments() -> None:
    (c,) = token_costs({"r": [tr("1", 10, False)]}, resamples=100)
    assert c.per_correct is None and c.per_correct_ci is None
    assert "| r | 1 | 0 | 10 [10, 10] | – | reference |" in token_cost_markdown([c])
    with pytest.raises(ValueError, match="reference run 'x'"):
        token_costs({"r": [tr("1", 10, False)]}, "x")
    with pytest.raises(ValueError, match="resamples"):
        token_costs({"r": [tr("1", 10, False)]}, resamples=10)


def test_the_report_shows_and_writes_the_token_cost(tmp_path: Path) -> None:
    files = write_report({"baseline": BASE, "in-context": CTX}, tmp_path)
    md = files.markdown.read_text()
    assert "## Input tokens per question and per correct answer" in md
    assert "| in-context | 6 | 4 | 1,750 [" in md and "0.50 [0.50, 0.50] × baseline (n=6)" in md
    assert "| observation:get_context | – | 700 |" in md
    written = json.loads((tmp_path / "token_costs.json").read_text())
    assert [c["name"] for c in written] == ["baseline", "in-context"] and written[1]["ratio"] == 0.5


def test_summary_episode_spans_and_loop_metrics_carry_the_split() -> None:
    from kitune.evaluation.summary import summarize
    from kitune.optimizers.loop import _summary_metrics
    from kitune.tracking.episodes import episode_record

    s = summarize(CTX, "in-context")
    assert s.input_split_per_question == {"observation:get_context": 700.0, "system": 1050.0}
    metrics = _summary_metrics("val", s, 0.5)
    assert metrics["val_input_tokens_system"] == 1050.0
    assert metrics["val_input_tokens_observation.get_context"] == 700.0
    step = {
        "index": 1,
        "kind": "tool",
        "tool": "get_context",
        "input_tokens": 5,
        "input_split": {"system": 5},
    }
    trace = Trace(**{**CTX[0].to_dict(), "steps": [step]})
    rec = episode_record(trace, name="run", start_ns=0)
    assert rec.attributes["kitune.input_split"] == {"system": 300, "observation:get_context": 200}
    assert rec.steps[0].attributes["kitune.input_split"] == {"system": 5}
