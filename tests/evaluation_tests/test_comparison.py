"""Flips and per-question token deltas between runs (issue 12, item 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kitune.errors import DataError
from kitune.evaluation.comparison import compare_flips, compare_runs, cost_reasons, outcome, token_deltas
from kitune.evaluation.metrics import Trace
from kitune.evaluation.report import write_report


def step(
    i: int,
    tool: str | None,
    tokens: int,
    *,
    docs: tuple[str, ...] = (),
    error: str | None = None,
    chars: int = 1000,
) -> dict:
    return {
        "index": i,
        "kind": "tool" if tool else "answer",
        "tool": tool,
        "args": {"query": "q"} if tool else {},
        "observation_chars": chars if tool else 0,
        "doc_ids": list(docs),
        "error": error,
        "input_tokens": tokens,
        "output_tokens": 10,
    }


def tr(qid: str, skill: str, correct: bool | None, steps: list[dict], **kw) -> Trace:
    base = dict(
        query_id=qid,
        skill=skill,
        question="?",
        gold_answer="g",
        exact_answer="Portland",
        status="answered",
        judge_correct=correct,
        judge_status="graded" if correct is not None else "grader_error",
        steps=steps,
        n_steps=len(steps),
        input_tokens=sum(s["input_tokens"] for s in steps),
    )
    return Trace(**{**base, **kw})


BASELINE = [
    tr("a", "baseline", False, [step(1, "search", 1000), step(2, None, 2000)]),
    tr("b", "baseline", True, [step(1, "search", 1000), step(2, None, 2000)]),
    tr("c", "baseline", True, [step(1, "search", 1000), step(2, None, 2000)]),
    tr("d", "baseline", False, [step(1, "search", 1000), step(2, None, 2000)]),
    tr("e", "baseline", None, [step(1, None, 500)]),
]
IN_CONTEXT = [
    # fixed, cheaper: one KI look-up answered it
    tr("a", "in-context", True, [step(1, "get_context", 400, docs=("d1",)), step(2, None, 900)]),
    # broken, and more expensive: no KI covered it, two empty look-ups, then raw search
    tr(
        "b",
        "in-context",
        False,
        [
            step(1, "get_context", 400),
            step(2, "get_context", 800),
            step(3, "search", 1500, chars=5000),
            step(4, "search", 3000, chars=5000),
            step(5, None, 4000),
        ],
        gold_answer="1889",
        exact_answer="1887",
    ),
    # still correct; KIs found but did not answer → search; timed out
    tr(
        "c",
        "in-context",
        True,
        [
            step(1, "get_context", 400, docs=("d3",)),
            step(2, "get_context", 900, docs=("d4",)),
            step(3, "search", 2500),
        ],
        timed_out=True,
        exhausted_by="input_tokens",
        status="budget_exhausted",
    ),
    # still wrong, same steps but longer prompts
    tr("d", "in-context", False, [step(1, "search", 1200), step(2, None, 2300)]),
    # ungraded before: not compared
    tr("e", "in-context", True, [step(1, None, 500)]),
    # only in this run: not compared, no delta
    tr("f", "in-context", True, [step(1, None, 100)]),
]


def test_outcome_uses_judge_then_exact_match_and_never_grades_failures() -> None:
    assert outcome(BASELINE[1]) == "correct" and outcome(BASELINE[0]) == "wrong"
    assert outcome(BASELINE[4]) == "ungraded"
    no_judge = tr("x", "baseline", None, [], judge_status="not_run", em=True)
    assert outcome(no_judge) == "correct"
    assert (
        outcome(tr("x", "baseline", None, [], judge_status="not_run", status="failed", em=True)) == "ungraded"
    )


def test_flips_by_question() -> None:
    f = compare_flips(BASELINE, IN_CONTEXT, before_name="baseline", after_name="in-context")
    assert (f.fixed, f.broken, f.still_correct, f.still_wrong) == (("a",), ("b",), ("c",), ("d",))
    assert f.not_compared == ("e", "f")
    assert f.counts == {"fixed": 1, "broken": 1, "still_correct": 1, "still_wrong": 1, "not_compared": 2}
    assert f.net == 0
    # a question missing from the later run is not compared either
    assert compare_flips(BASELINE, IN_CONTEXT[:1]).not_compared == ("b", "c", "d", "e")


def test_token_deltas_and_reasons() -> None:
    deltas = {d.query_id: d for d in token_deltas(BASELINE, IN_CONTEXT)}
    assert set(deltas) == {"a", "b", "c", "d", "e"}
    b = deltas["b"]
    assert (b.before, b.after, b.delta) == (3000, 9700, 6700) and b.ratio == pytest.approx(9700 / 3000)
    assert b.reasons == (
        "no KI covered it → fell back to raw search (2 searches)",
        "more steps (2 → 5)",
        "longer observations (+11000 chars)",
    )
    c = deltas["c"]
    assert c.delta == 800 and c.reasons == (
        "budget ran out (input_tokens)",
        "KIs did not answer → fell back to raw search (1 search)",
        "more steps (2 → 3)",
        "longer observations (+2000 chars)",
    )
    assert deltas["d"].reasons == ("longer prompts per step",) and deltas["d"].delta == 500
    assert deltas["a"].delta == -1700 and deltas["a"].reasons == ()
    assert deltas["e"].delta == 0 and deltas["e"].ratio == 1.0
    # largest increase first
    assert [d.query_id for d in token_deltas(BASELINE, IN_CONTEXT)][:3] == ["b", "c", "d"]


def test_rewrite_tokens_count_and_are_named() -> None:
    before = tr("q", "in-context", True, [step(1, "get_context", 400, docs=("x",))])
    after = tr("q", "in-context", True, [step(1, "get_context", 400, docs=("x",))], tool_input_tokens=250)
    assert cost_reasons(before, after) == ["query rewrites +250 tokens"]
    assert token_deltas([before], [after])[0].delta == 250
    failed = tr(
        "q", "in-context", None, [step(1, "get_context", 900)], status="failed", errors=["AuthError: 401"]
    )
    assert cost_reasons(before, failed)[0] == "run failed: AuthError: 401"


def test_duplicate_question_is_a_data_error() -> None:
    with pytest.raises(DataError, match="twice"):
        compare_runs("a", BASELINE + BASELINE[:1], "b", IN_CONTEXT)


def test_report_shows_flips_and_more_expensive_questions(tmp_path: Path) -> None:
    later = [tr("a", "in-context", False, [step(1, None, 900)]), *IN_CONTEXT[1:]]
    files = write_report(
        {"baseline": BASELINE, "in-context": IN_CONTEXT, "iteration-1": later}, tmp_path / "r"
    )
    md = files.markdown.read_text(encoding="utf-8")
    assert "| baseline → in-context | 1 | 1 | +0 | 1 | 1 | 2 |" in md
    assert "| in-context → iteration-1 | 0 | 1 | -1 | 3 | 2 | 0 |" in md
    assert "- baseline → in-context: fixed a (was wrong entity); broken b (now wrong number)" in md
    assert "- in-context → iteration-1: fixed –; broken a (now wrong entity)" in md
    rows = {
        line.split(" | ")[0].lstrip("| "): line.strip("| \n").split(" | ")[1:] for line in md.splitlines()
    }
    # baseline: a, d wrong (wrong entity), e a grader error; in-context: b wrong number, d wrong entity
    assert rows["failure kind: wrong entity"] == ["2", "1", "2"]
    assert rows["failure kind: wrong number"] == ["0", "1", "1"]
    assert rows["failure kind: grader error"] == ["1", "0", "0"]
    assert rows["failure kind: no candidate"] == ["0", "0", "0"]
    assert files.summaries[1].failure_kinds == {
        "wrong_entity": 1,
        "wrong_number": 1,
        "no_candidate": 0,
        "out_of_budget": 0,
        "malformed_calls": 0,
        "grader_error": 0,
        "failed": 0,
    }
    assert "### baseline → in-context: 3 of 5 questions cost more (net +6,300 tokens)" in md
    assert (
        "| b | 3,000 | 9,700 | +6,700 | +223% | no KI covered it → fell back to raw search (2 searches); "
        "more steps (2 → 5); longer observations (+11000 chars) |"
    ) in md
    assert "### in-context → iteration-1: 0 of 6 questions cost more (net -400 tokens)" in md
    data = json.loads(files.comparisons_json.read_text())  # type: ignore[union-attr]
    assert [(c["before"], c["after"]) for c in data] == [
        ("baseline", "in-context"),
        ("in-context", "iteration-1"),
    ]
    assert data[0]["flips"]["fixed"] == ["a"] and data[0]["flips"]["counts"]["not_compared"] == 2
    assert data[0]["flips"]["fixed_kinds"] == {"a": "wrong_entity"}
    assert data[0]["flips"]["broken_kinds"] == {"b": "wrong_number"}
    assert data[0]["token_deltas"][0] == {
        "query_id": "b",
        "before": 3000,
        "after": 9700,
        "delta": 6700,
        "ratio": pytest.approx(9700 / 3000),
        "reasons": [
            "no KI covered it → fell back to raw search (2 searches)",
            "more steps (2 → 5)",
            "longer observations (+11000 chars)",
        ],
    }
    assert "<td>baseline → in-context</td><td>1</td><td>1</td>" in files.html.read_text(encoding="utf-8")
    # explicit pairs: baseline against the last run only
    files2 = write_report(
        {"baseline": BASELINE, "in-context": IN_CONTEXT, "iteration-1": later},
        tmp_path / "r2",
        pairs=[("baseline", "iteration-1")],
    )
    assert [c.flips.after for c in files2.comparisons or []] == ["iteration-1"]
    with pytest.raises(ValueError, match="names a run"):
        write_report({"baseline": BASELINE}, tmp_path / "r3", pairs=[("baseline", "nope")])
    single = write_report({"baseline": BASELINE}, tmp_path / "r4")
    assert single.comparisons == [] and single.comparisons_json is None
    assert "## Flips" not in single.markdown.read_text(encoding="utf-8")
