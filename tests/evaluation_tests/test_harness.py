from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from kitune.data.loaders import Question
from kitune.errors import DataError
from kitune.evaluation.agent import Agent
from kitune.evaluation.harness import TraceWriter, evaluate, read_traces
from kitune.evaluation.tools import closed_book_toolbox
from kitune.testing.chat import ScriptedChatModel


@dataclass(frozen=True)
class Verdict:
    correct: bool | None
    status: str


QS = [
    Question(query_id=f"q{i}", query=f"What is {i}?", answer=str(i), evidence_docids=("d1",))
    for i in range(5)
]


def factory(built: list[str]):
    def make(q: Question) -> Agent:
        built.append(q.query_id)
        if q.query_id == "q3":
            raise RuntimeError("store exploded")
        reply = json.dumps({"answer": {"explanation": "", "exact_answer": q.answer, "confidence": 90}})
        return Agent(ScriptedChatModel([reply], usage=(10, 1)), closed_book_toolbox())

    return make


def judge(*, question, response, gold, aliases):
    return Verdict(f"Exact Answer: {gold}\n" in response, "graded")


def test_evaluate_runs_all_in_order_and_failures_become_traces(tmp_path: Path) -> None:
    built: list[str] = []
    path = tmp_path / "run" / "traces.jsonl"
    traces = evaluate(
        QS, factory(built), skill="closed-book", concurrency=3, traces_path=path, judge=judge, progress=True
    )
    assert [t.query_id for t in traces] == [q.query_id for q in QS]
    assert sorted(built) == [q.query_id for q in QS]
    bad = traces[3]
    assert bad.status == "failed" and bad.errors == ["RuntimeError: store exploded"] and not bad.is_graded
    assert all(t.judge_correct for i, t in enumerate(traces) if i != 3)
    assert all(t.input_tokens == 10 for i, t in enumerate(traces) if i != 3)
    on_disk = read_traces(path)
    assert sorted(t.query_id for t in on_disk) == [q.query_id for q in QS]


def test_resume_skips_done_and_tolerates_truncated_last_line(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    first: list[str] = []
    evaluate(QS[:2], factory(first), skill="closed-book", concurrency=1, traces_path=path, progress=False)
    with path.open("a", encoding="utf-8") as fh:
        fh.write('{"query_id": "q2", "skill": "closed-bo')  # crash mid-write
    assert [t.query_id for t in read_traces(path)] == ["q0", "q1"]
    built: list[str] = []
    traces = evaluate(
        QS, factory(built), skill="closed-book", concurrency=2, traces_path=path, progress=False
    )
    assert sorted(built) == ["q2", "q3", "q4"]
    assert [t.query_id for t in traces] == ["q0", "q1", "q2", "q3", "q4"]
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 5 and all(json.loads(line) for line in lines)
    # other skill in the same file is not "done"
    other: list[str] = []
    evaluate(QS[:1], factory(other), skill="baseline", traces_path=path, progress=False)
    assert other == ["q0"]


def test_corrupt_middle_line_raises(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"query_id": "a", "skill": "x", "question": "?", "gold_answer": "g"}\nnot json\n{}\n')
    with pytest.raises(DataError, match=r"t.jsonl:2: not a trace record"):
        read_traces(path)


def test_argument_checks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="concurrency"):
        evaluate(QS, factory([]), skill="x", concurrency=0, progress=False)
    with pytest.raises(ValueError, match="unique"):
        evaluate(QS + QS[:1], factory([]), skill="x", progress=False)
    TraceWriter(tmp_path / "deep" / "t.jsonl")
    assert (tmp_path / "deep").is_dir()
