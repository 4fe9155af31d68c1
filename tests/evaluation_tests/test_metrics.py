from __future__ import annotations

import json
from dataclasses import dataclass

from eval_fakes import DOCS, FakeCorpusStore

from kitune.data.loaders import Question
from kitune.evaluation.agent import Agent
from kitune.evaluation.budget import Budget
from kitune.evaluation.metrics import Trace, build_trace, evidence_recall, failed_trace, format_response
from kitune.evaluation.tools import baseline_toolbox
from kitune.testing.chat import ScriptedChatModel


@dataclass(frozen=True)
class Verdict:
    correct: bool | None
    status: str
    error: str | None = None


Q = Question(
    query_id="q1",
    query="Capital of France?",
    answer="Paris",
    aliases=("City of Paris",),
    evidence_docids=("d1", "d2", "d9"),
)


def _episode(final: str):
    model = ScriptedChatModel(
        [
            json.dumps({"tool": "search", "args": {"query": "capital France"}}),
            json.dumps({"tool": "get_by_doc_id", "args": {"docid": "d3"}}),
            final,
        ],
        usage=(200, 20),
    )
    return Agent(model, baseline_toolbox(FakeCorpusStore(DOCS))).run(Q.query)


def test_evidence_recall_hand_computed() -> None:
    assert evidence_recall(["d1", "d3", "d1"], ["d1", "d2", "d9"]) == 1 / 3
    assert evidence_recall(["d1"], []) is None
    # search shows d2, d1; fetch shows d3 -> seen ∩ evidence = {d1, d2} of 3
    ep = _episode(
        json.dumps({"answer": {"explanation": "[d1]", "exact_answer": "the Paris", "confidence": 90}})
    )
    t = build_trace(Q, "baseline", ep)
    assert set(t.doc_ids_seen) == {"d1", "d2", "d3"}
    assert t.evidence_recall == 2 / 3


def test_trace_fields_tokens_em_f1_and_json_roundtrip() -> None:
    calls = []

    def judge(*, question, response, gold, aliases):
        calls.append((question, response, gold, aliases))
        return Verdict(True, "graded")

    ep = _episode(
        json.dumps({"answer": {"explanation": "see [d1]", "exact_answer": "Paris, France", "confidence": 70}})
    )
    t = build_trace(Q, "baseline", ep, judge=judge)
    assert t.judge_correct is True and t.judge_status == "graded" and t.is_graded
    assert calls == [
        (
            Q.query,
            "Explanation: see [d1]\nExact Answer: Paris, France\nConfidence: 70%",
            "Paris",
            ["City of Paris"],
        )
    ]
    assert t.em is False and abs(t.f1 - 2 / 3) < 1e-9
    assert t.input_tokens == 600 == sum(s["input_tokens"] for s in t.steps)
    assert t.output_tokens == 60 and t.n_steps == 3
    assert t.tool_calls == {"search": 1, "get_by_doc_id": 1}
    assert Trace.from_dict(json.loads(t.to_json())) == t


def test_grader_error_and_raising_judge_are_not_incorrect() -> None:
    ep = _episode(json.dumps({"answer": {"explanation": "", "exact_answer": "Paris", "confidence": 70}}))
    t = build_trace(
        Q, "baseline", ep, judge=lambda **kw: Verdict(None, "grader_error", "no parsable verdict")
    )
    assert (t.judge_correct, t.judge_status, t.judge_error) == (None, "grader_error", "no parsable verdict")
    assert t.em is True and t.f1 == 1.0

    def boom(**kw):
        raise RuntimeError("rate limited")

    t2 = build_trace(Q, "baseline", ep, judge=boom)
    assert t2.judge_status == "grader_error" and "rate limited" in t2.judge_error and not t2.is_graded


def test_empty_answer_is_graded_wrong_without_calling_judge() -> None:
    ep = Agent(
        ScriptedChatModel(["x", "y"]), baseline_toolbox(FakeCorpusStore(DOCS)), budget=Budget(max_steps=1)
    ).run("q")
    t = build_trace(Q, "baseline", ep, judge=lambda **kw: (_ for _ in ()).throw(AssertionError("called")))
    assert t.judge_correct is False and t.judge_status == "graded" and t.f1 == 0.0
    assert format_response(ep).startswith("Explanation: \nExact Answer: \n")


def test_failed_trace() -> None:
    t = failed_trace(Q, "in-context", "ValueError: x", wall_time_s=1.5)
    assert (
        t.status == "failed"
        and t.errors == ["ValueError: x"]
        and t.evidence_recall == 0.0
        and not t.is_graded
    )
