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


def test_complete_bad_last_line_is_not_called_truncated(tmp_path: Path) -> None:
    # `{}` + newline is a whole line that is not a trace, not a crash mid-write.
    path = tmp_path / "t.jsonl"
    path.write_text('{"query_id": "a", "skill": "x", "question": "?", "gold_answer": "g"}\n{}\n')
    with pytest.raises(DataError, match=r"t.jsonl:2: not a trace record"):
        read_traces(path)


def test_argument_checks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="concurrency"):
        evaluate(QS, factory([]), skill="x", concurrency=0, progress=False)
    with pytest.raises(ValueError, match="unique"):
        evaluate(QS + QS[:1], factory([]), skill="x", progress=False)
    TraceWriter(tmp_path / "deep" / "t.jsonl")
    assert (tmp_path / "deep").is_dir()


# -- failures are failures (issue 12 item 11) -----------------------------------------------------
KEY_MSG = (
    "HTTP 401 from https://gw.example/v1 for model m-small: the key in $KI_GW_KEY (sk-…9876) was "
    "rejected. Check the key and that https://gw.example/v1 is the host you meant. Not retried."
)


def _answer(q: Question, value: str | None = None) -> str:
    return json.dumps({"answer": {"explanation": "", "exact_answer": value or q.answer, "confidence": 90}})


def scripted_factory(script: dict[str, list], built: list[str]):
    """One ScriptedChatModel per question; its turns may raise LM errors mid-run."""

    def make(q: Question) -> Agent:
        built.append(q.query_id)
        return Agent(ScriptedChatModel(script[q.query_id], usage=(10, 1)), closed_book_toolbox())

    return make


class CountingJudge:
    def __init__(self) -> None:
        self.graded: list[str] = []

    def __call__(self, *, question, response, gold, aliases):
        self.graded.append(question)
        return Verdict(f"Exact Answer: {gold}\n" in response, "graded")


def test_questions_whose_lm_calls_failed_are_failed_not_graded(tmp_path: Path) -> None:
    from kitune.errors import EmptyCompletionError, LMConnectionError, LMTimeoutError
    from kitune.evaluation.report import summarize

    qs = QS[:5]
    script = {
        "q0": [_answer(qs[0])],
        "q1": [LMTimeoutError("call to m-small timed out after 30 s (3 attempts)", timeout_s=30.0)],
        "q2": [_answer(qs[2], "wrong")],
        "q3": [LMConnectionError("could not reach https://gw.example/v1: connection refused")],
        "q4": [EmptyCompletionError("no choices in the reply", reason="no_choices")],
    }
    built: list[str] = []
    judge_ = CountingJudge()
    path = tmp_path / "traces.jsonl"
    traces = evaluate(
        qs,
        scripted_factory(script, built),
        skill="closed-book",
        concurrency=1,
        traces_path=path,
        judge=judge_,
        progress=False,
    )
    by_id = {t.query_id: t for t in traces}
    assert [by_id[q].status for q in ("q1", "q3", "q4")] == ["failed"] * 3
    assert by_id["q1"].failure == "LMTimeoutError: call to m-small timed out after 30 s (3 attempts)"
    assert by_id["q3"].failure.startswith("LMConnectionError: could not reach")
    assert by_id["q4"].failure == "EmptyCompletionError: no choices in the reply"
    assert all(
        by_id[q].judge_status == "not_run" and by_id[q].judge_correct is None for q in ("q1", "q3", "q4")
    )
    assert judge_.graded == ["What is 0?", "What is 2?"]  # the judge never saw a failed question
    s = summarize(traces)
    # before: "0/5 graded 5/5": empty answers graded wrong. Now: 1/2 graded, 3 failed beside it
    assert (s.n_correct, s.n_graded, s.n_failed, s.accuracy) == (1, 2, 3, 0.5)
    assert by_id["q0"].failure is None and by_id["q2"].status == "answered"
    # the failure survives the JSONL round trip, and a rerun retries exactly the failed ones
    assert {t.query_id: t.failure for t in read_traces(path)} == {t.query_id: t.failure for t in traces}
    again: list[str] = []
    fixed = {q.query_id: [_answer(q)] for q in qs}
    evaluate(
        qs,
        scripted_factory(fixed, again),
        skill="closed-book",
        concurrency=1,
        traces_path=path,
        judge=judge_,
        progress=False,
    )
    assert sorted(again) == ["q1", "q3", "q4"]


def test_failed_force_commit_is_a_failure_but_a_context_overflow_is_not() -> None:
    from kitune.errors import LMContextWindowError, LMRateLimitError
    from kitune.evaluation.budget import Budget

    q = QS[1]
    tool_call = json.dumps({"tool": "search", "args": {"query": "x"}})  # no tools: a wasted step

    def run(turns: list) -> object:
        agent = Agent(
            ScriptedChatModel(turns, usage=(10, 1)), closed_book_toolbox(), budget=Budget(max_steps=1)
        )
        return evaluate([q], lambda _q: agent, skill="closed-book", judge=CountingJudge(), progress=False)[0]

    limited = run([tool_call, LMRateLimitError("429 after 3 retries", retry_after_s=2.0)])
    assert limited.status == "failed" and limited.failure == "LMRateLimitError: 429 after 3 retries"
    assert limited.judge_status == "not_run"
    # a context overflow is the agent's own business (status context_overflow, graded)
    overflow = run([LMContextWindowError("prompt too long"), _answer(q)])
    assert overflow.status == "context_overflow" and overflow.failure is None
    assert overflow.judge_status == "graded" and overflow.judge_correct is True


def test_an_auth_failure_stops_the_run_at_once(tmp_path: Path) -> None:
    from kitune.errors import LMAuthError

    script = {q.query_id: [_answer(q)] for q in QS}
    script["q1"] = [LMAuthError(KEY_MSG)]
    built: list[str] = []
    path = tmp_path / "traces.jsonl"
    with pytest.raises(LMAuthError) as err:
        evaluate(
            QS,
            scripted_factory(script, built),
            skill="closed-book",
            concurrency=1,
            traces_path=path,
            judge=judge,
            progress=False,
        )
    msg = str(err.value)
    assert "on question q1" in msg and "$KI_GW_KEY" in msg and "3 of 5 question(s) not run" in msg
    assert built == ["q0", "q1"]  # q2..q4 never started
    on_disk = {t.query_id: t for t in read_traces(path)}
    assert sorted(on_disk) == ["q0", "q1"] and on_disk["q1"].status == "failed"
    # fixed key: the rerun resumes (q0 kept) and runs the rest
    resumed: list[str] = []
    fixed = {q.query_id: [_answer(q)] for q in QS}
    traces = evaluate(
        QS,
        scripted_factory(fixed, resumed),
        skill="closed-book",
        concurrency=2,
        traces_path=path,
        judge=judge,
        progress=False,
    )
    assert sorted(resumed) == ["q1", "q2", "q3", "q4"] and all(t.judge_correct for t in traces)


def test_a_judge_auth_failure_stops_the_run_too() -> None:
    from kitune.errors import LMAuthError

    def refusing(*, question, response, gold, aliases):
        return type(
            "V", (), {"correct": None, "status": "grader_error", "error": f"LMAuthError: {KEY_MSG}"}
        )()

    built: list[str] = []
    script = {q.query_id: [_answer(q)] for q in QS}
    with pytest.raises(LMAuthError, match=r"for the judge on question q0: .*\$KI_GW_KEY"):
        evaluate(
            QS,
            scripted_factory(script, built),
            skill="closed-book",
            concurrency=1,
            judge=refusing,
            progress=False,
        )
    assert built == ["q0"]


def test_progress_to_a_file_is_a_plain_line_per_question(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import sys

    from kitune.data.loaders import Question
    from kitune.evaluation.agent import Episode
    from kitune.evaluation.harness import evaluate

    class Runner:
        def run(self, question: str) -> Episode:
            return Episode(status="answered", exact_answer="Paris")

    out = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", out)
    qs = [Question(str(i), f"q{i}?", "Paris") for i in range(3)]
    evaluate(qs, lambda q: Runner(), skill="baseline", concurrency=1, progress=True)
    lines = out.getvalue().splitlines()
    assert [line.split(" · ")[0] for line in lines] == [
        "eval baseline 1/3",
        "eval baseline 2/3",
        "eval baseline 3/3",
    ]
    assert "\x1b" not in out.getvalue()


def test_progress_names_the_run_by_its_label_and_counts_correct_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The demo's third arm runs with skill "in-context" but is labelled as its own arm; the count
    # says "correct" because the grader may be deterministic matching, not a judge.
    import io
    import sys

    from kitune.data.loaders import Question
    from kitune.evaluation.agent import Episode
    from kitune.evaluation.grading import match_judge

    class Runner:
        def __init__(self, answer: str) -> None:
            self.answer = answer

        def run(self, question: str) -> Episode:
            return Episode(question, status="answered", exact_answer=self.answer)

    out = io.StringIO()  # not a terminal: one plain line per question
    monkeypatch.setattr(sys, "stderr", out)
    qs = [Question("0", "q0?", "Paris"), Question("1", "q1?", "Rome")]
    traces = evaluate(
        qs,
        lambda q: Runner("Paris"),
        skill="in-context",
        concurrency=1,
        judge=match_judge,
        progress=True,
        label="in-context + disambiguation",
    )
    assert [t.skill for t in traces] == ["in-context", "in-context"]
    lines = [line.rsplit(" · ", 1)[0] for line in out.getvalue().splitlines()]
    assert lines == [
        "eval in-context + disambiguation 1/2 · correct 1/1",
        "eval in-context + disambiguation 2/2 · correct 1/2",
    ]
