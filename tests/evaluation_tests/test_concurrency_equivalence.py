"""Concurrent evaluation and judging equal the sequential run; a hung slot is a counted failure (issue 22).

The scripted models answer from the request alone (which question, what the tools returned)
and delay each question by its own amount, the first questions longest, so answers arrive
out of submission order: a result that depended on arrival order (a queue of scripted turns
shared by the questions, a trace written to the wrong question) would differ between runs.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from eval_fakes import FakeCorpusStore

from kitune.chat import ChatMessage
from kitune.config import KituneConfig, load_config
from kitune.data.loaders import Question, load_questions
from kitune.errors import LMTimeoutError
from kitune.evaluation.agent import Agent
from kitune.evaluation.budget import Budget
from kitune.evaluation.grading import match_judge
from kitune.evaluation.harness import evaluate, read_traces
from kitune.evaluation.judging import judge_pending
from kitune.evaluation.metrics import Trace
from kitune.evaluation.summary import summarize
from kitune.evaluation.tools import ContextObservation, closed_book_toolbox
from kitune.lm import LiteLLMChatModel, build_lm, reset_format_memory
from kitune.service.pipelines.evaluation import run_eval
from kitune.testing.chat import ScriptedChatModel
from kitune.testing.openai_stub import RecordedRequest, Reply, StubServer

SLOTS = 4
N_QUESTIONS = 8


class InFlight:
    """Counts calls running at once (the maximum is what the pool really ran in parallel)."""

    def __init__(self) -> None:
        self.now = self.max = 0
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            self.now += 1
            self.max = max(self.max, self.now)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.now -= 1


def _stable(trace: Trace) -> dict[str, Any]:
    """A trace without its wall-clock fields (the only ones that may differ between runs)."""
    data = trace.to_dict()
    data.pop("wall_time_s")
    data["steps"] = [{k: v for k, v in s.items() if k not in ("latency_s", "wall_s")} for s in data["steps"]]
    return data


def _agent_model(questions: list[Question], seen: InFlight, failing: str) -> ScriptedChatModel:
    """Every turn is the same function of the messages, so which question gets which turn cannot matter.

    First call of a question: look it up with ``get_context``; second: answer — the gold answer
    for even positions, a wrong one for odd ones. Question ``failing`` times out at its answer.
    """
    index = {q.query: i for i, q in enumerate(questions)}

    def reply(messages: list[ChatMessage]) -> str:
        question = next(q for q in index if q in str(messages[1]["content"]))
        i = index[question]
        with seen:
            time.sleep(0.02 * (len(questions) - i))
        looked_up = any(
            m["role"] != "system" and "no KIs found" not in str(m["content"]) and "KI-" in str(m["content"])
            for m in messages[2:]
        )
        if not looked_up:
            return json.dumps({"tool": "get_context", "args": {"query": question}})
        if questions[i].query_id == failing:
            raise LMTimeoutError("timed out after 0.4 s (scripted)", model="scripted", retryable=True)
        answer = questions[i].answer if i % 2 == 0 else "Atlantis"
        return json.dumps({"answer": {"explanation": "[KI-1]", "exact_answer": answer, "confidence": 60}})

    return ScriptedChatModel([reply] * (3 * len(questions)), usage=(120, 12))


def _context(query: str) -> ContextObservation:
    return ContextObservation(
        text=f"1. [KI-1] {query[:60]} — a fact about it (docs: d1)", doc_ids=("d1",), n_results=1
    )


def test_in_context_eval_at_the_servers_slots_equals_the_sequential_run(
    tmp_path: Path, fixture_dir: Path
) -> None:
    questions = load_questions(fixture_dir)[:N_QUESTIONS]
    failing = questions[5].query_id
    runs: dict[str, Any] = {}
    # no agent.concurrency set: the embedded model's slots decide (lm.local.parallel)
    parallel = KituneConfig(workdir=tmp_path / "par", lm={"local": {"parallel": SLOTS}})
    sequential = KituneConfig(
        workdir=tmp_path / "seq", lm={"local": {"parallel": SLOTS}}, agent={"concurrency": 1}
    )
    assert parallel.concurrency_for("agent") == SLOTS and sequential.concurrency_for("agent") == 1
    for name, cfg in (("seq", sequential), ("par", parallel)):
        seen = InFlight()
        order: list[str] = []
        res = run_eval(
            cfg,
            skill="in-context",
            data_dir=fixture_dir,
            limit=N_QUESTIONS,
            progress=False,
            chat_model=_agent_model(questions, seen, failing),
            judge=match_judge,
            corpus_store=FakeCorpusStore([]),
            context_fn=_context,
            on_trace=lambda t, order=order: order.append(t.query_id),  # type: ignore[misc]
        )
        runs[name] = (res, seen.max, order)
    (seq, seq_max, seq_order), (par, par_max, par_order) = runs["seq"], runs["par"]
    ids = [q.query_id for q in questions]
    assert (seq_max, par_max) == (1, SLOTS)
    assert seq_order == ids and par_order != ids  # the concurrent answers arrived out of order
    assert [_stable(t) for t in par.traces] == [_stable(t) for t in seq.traces]
    assert [t.query_id for t in par.traces] == ids
    # the same answers and grades: gold for even positions, wrong for odd ones, one failed
    by_id = {t.query_id: t for t in par.traces}
    assert by_id[failing].status == "failed" and "LMTimeoutError" in (by_id[failing].failure or "")
    graded = [(t.query_id, t.exact_answer, t.judge_correct) for t in par.traces if t.status != "failed"]
    assert graded == [
        (q.query_id, q.answer if i % 2 == 0 else "Atlantis", i % 2 == 0)
        for i, q in enumerate(questions)
        if q.query_id != failing
    ]
    s, p = seq.summary.to_dict(), par.summary.to_dict()
    for key in ("n_total", "n_correct", "n_failed", "em", "f1", "input_tokens", "output_tokens", "timeouts"):
        assert p[key] == s[key], key
    assert (p["n_total"], p["n_correct"], p["n_failed"]) == (8, 4, 1)


def _stub_agent_reply(
    questions: list[Question], hang: str, seen: InFlight
) -> Callable[[RecordedRequest], Reply]:
    gold = {q.query: q.answer for q in questions}

    def respond(request: RecordedRequest) -> Reply:
        text = "\n".join(str(m.get("content") or "") for m in request.body.get("messages", []))
        question = next((q for q in gold if q in text), None)
        if question is None:  # the warm-up call
            return Reply.ok("ok")
        body = {"answer": {"explanation": "[none]", "exact_answer": gold[question], "confidence": 70}}
        if question == hang:  # this slot answers after 60 s: long after the client's timeout
            return Reply.slow(60.0, Reply.ok(json.dumps(body), usage=(90, 9)))
        with seen:
            time.sleep(0.2)
        return Reply.ok(json.dumps(body), usage=(90, 9))

    return respond


def test_a_hung_server_slot_fails_one_question_and_the_run_does_not_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reset_format_memory()
    questions = [
        Question(query_id=f"q{i}", query=f"Which town has number {i}?", answer=f"Town {i}") for i in range(6)
    ]
    seen = InFlight()
    monkeypatch.setenv("KI_GW_KEY", "sk-test-secret-9876")
    with StubServer(responder=_stub_agent_reply(questions, questions[2].query, seen)) as stub:
        monkeypatch.setenv("KI_GW_URL", stub.base_url)
        cfg = load_config(
            overrides={
                "lm.gateway.base_url_env": "KI_GW_URL",
                "lm.gateway.api_key_env": "KI_GW_KEY",
                "lm.gateway.default_model": "m-small",
                "lm.agent.timeout_s": 0.5,
                "lm.agent.num_retries": 1,
                "agent.concurrency": SLOTS,
            }
        )
        lm = build_lm(cfg, "agent", backoff_base_s=0.01, max_wait_s=0.05)
        lm("warm up")  # LiteLLM's first call in a process is slow: keep it out of the timing

        def factory(q: Question) -> Agent:
            return Agent(LiteLLMChatModel(lm=lm), closed_book_toolbox(), budget=Budget(max_steps=3))

        started = time.monotonic()
        traces = evaluate(
            questions,
            factory,
            skill="closed-book",
            concurrency=cfg.concurrency_for("agent"),
            traces_path=tmp_path / "traces.jsonl",
            judge=match_judge,
            progress=False,
        )
        wall = time.monotonic() - started
        hung_requests = sum(questions[2].query in json.dumps(r.body) for r in stub.chat_requests)
    assert seen.max == SLOTS - 1  # three answering slots at once beside the hung one
    assert [t.status for t in traces] == [
        "answered",
        "answered",
        "failed",
        "answered",
        "answered",
        "answered",
    ]
    assert "LMTimeoutError" in (traces[2].failure or "") and not traces[2].is_graded
    assert all(t.judge_correct for i, t in enumerate(traces) if i != 2)
    assert hung_requests == 2  # the call and its one retry, each cut off after timeout_s
    # bounded by the timeout (two 0.5 s attempts; generous for a loaded machine), not by the 60 s hang
    assert traces[2].wall_time_s < 15 and wall < 20
    summary = summarize(traces, "hung-slot")
    assert (summary.n_total, summary.n_correct, summary.n_failed) == (6, 5, 1)
    assert len(read_traces(tmp_path / "traces.jsonl")) == 6


def _answered(i: int, answer: str) -> Trace:
    return Trace(
        query_id=f"q{i}",
        skill="full-context",
        question=f"Question {i}?",
        gold_answer=f"Gold {i}",
        status="answered",
        exact_answer=answer,
        explanation="[1001]",
    )


def test_judge_pending_concurrently_gives_the_sequential_verdicts_in_input_order(tmp_path: Path) -> None:
    questions = [Question(query_id=f"q{i}", query=f"Question {i}?", answer=f"Gold {i}") for i in range(8)]
    traces = [_answered(i, f"Gold {i}" if i % 3 else "wrong") for i in range(8)]
    traces[4] = Trace(
        query_id="q4",
        skill="full-context",
        question="Question 4?",
        gold_answer="Gold 4",
        status="failed",
        failure="LMTimeoutError: x",
    )
    traces[6] = _answered(6, "")  # no answer: wrong without a judge call
    results: dict[int, Any] = {}
    for n in (1, SLOTS):
        seen = InFlight()
        finished: list[str] = []

        def judge(
            *,
            question: str,
            response: str,
            gold: str,
            aliases: list[str],
            seen: InFlight = seen,
            finished: list[str] = finished,
        ) -> Any:
            i = int(gold.split()[1])
            with seen:
                time.sleep(0.03 * (8 - i))
            if i == 5:
                raise TimeoutError("judge slot timed out")
            finished.append(f"q{i}")
            return match_judge(question=question, response=response, gold=gold, aliases=aliases)

        path = tmp_path / f"traces-{n}.jsonl"
        out = judge_pending(questions, traces, judge, traces_path=path, concurrency=n)
        results[n] = (out, seen.max, finished, read_traces(path, latest_only=False))
    (seq, seq_max, seq_done, seq_lines), (par, par_max, par_done, par_lines) = results[1], results[SLOTS]
    assert (seq_max, par_max) == (1, SLOTS)
    assert par_done != seq_done and sorted(par_done) == sorted(seq_done)  # verdicts finished out of order
    assert [t.to_dict() for t in par] == [t.to_dict() for t in seq]
    assert [(t.query_id, t.judge_status, t.judge_correct) for t in par] == [
        ("q0", "graded", False),
        ("q1", "graded", True),
        ("q2", "graded", True),
        ("q3", "graded", False),
        ("q4", "not_run", None),  # failed: never judged
        ("q5", "grader_error", None),  # the judge raised: counted as a grader error, not "incorrect"
        ("q6", "graded", False),
        ("q7", "graded", True),
    ]
    assert "TimeoutError: judge slot timed out" in (par[5].judge_error or "")
    assert (
        sorted(t.query_id for t in par_lines)
        == sorted(t.query_id for t in seq_lines)
        == [f"q{i}" for i in range(8) if i != 4]
    )


def test_judge_pending_refuses_unknown_questions_before_judging_and_bad_concurrency() -> None:
    calls: list[str] = []

    def judge(**kw: Any) -> Any:
        calls.append(kw["gold"])
        return match_judge(**kw)

    with pytest.raises(KeyError, match="q9"):
        judge_pending(
            [Question("q0", "?", "Gold 0")], [_answered(0, "Gold 0"), _answered(9, "x")], judge, concurrency=2
        )
    assert calls == []
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        judge_pending([], [], judge, concurrency=0)


def test_full_context_run_judges_at_the_judge_concurrency(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    docs = [
        {
            "docid": f"{c}001",
            "title": f"conversation {c}",
            "text": f"[D1:1] A: I live in Town{c}.",
            "source": f"conv-{c}",
        }
        for c in range(1, 7)
    ]
    (data / "documents.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n", encoding="utf-8")
    rows = [
        {
            "id": f"q{c}",
            "question": f"Where does A live ({c})?",
            "answer": f"Town{c}",
            "evidence_docids": [f"{c}001"],
        }
        for c in range(1, 7)
    ]
    (data / "questions.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")

    def reply(messages: list[ChatMessage]) -> str:
        c = int(str(messages[-1]["content"]).split("(")[1][0])
        answer = f"Town{c}" if c != 3 else "Town9"
        return json.dumps({"answer": {"explanation": "[1]", "exact_answer": answer, "confidence": 70}})

    out: dict[str, Any] = {}
    for name, agent in (("seq", {"concurrency": 1}), ("par", {})):
        seen = InFlight()

        def judge(*, seen: InFlight = seen, **kw: Any) -> Any:
            with seen:
                time.sleep(0.05)
            return match_judge(**kw)

        cfg = KituneConfig(workdir=tmp_path / name, lm={"local": {"parallel": SLOTS}}, agent=agent)
        res = run_eval(
            cfg,
            skill="full-context",  # type: ignore[arg-type]
            data_dir=data,
            progress=False,
            chat_model=ScriptedChatModel([reply] * 6, usage=(500, 5)),
            judge=judge,
        )
        out[name] = ([(t.query_id, t.judge_correct) for t in res.traces], seen.max)
    assert out["seq"][1] == 1 and out["par"][1] == SLOTS  # concurrency_for("judge"): the slots
    assert out["par"][0] == out["seq"][0] == [(f"q{c}", c != 3) for c in range(1, 7)]
