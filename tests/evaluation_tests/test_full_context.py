"""The full-context arm: prompt layout (cache prefix), one call, token accounting, judge-after."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from kitune.config import KituneConfig
from kitune.data.loaders import Question, load_corpus, load_questions
from kitune.errors import HarnessError, LMContextWindowError, LMRateLimitError
from kitune.evaluation.full_context import (
    EVAL_SKILLS,
    ConversationIndex,
    FullContextRunner,
    cache_effect,
    full_context_factory,
    render_conversation,
)
from kitune.evaluation.harness import read_traces
from kitune.evaluation.judging import judge_pending
from kitune.evaluation.metrics import Trace, build_trace
from kitune.schema import Document
from kitune.service.pipelines.evaluation import run_eval
from kitune.testing.chat import ScriptedChatModel

LOCOMO = (Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "locomo").resolve()

DOCS = [
    Document(
        docid="1001",
        title="A and B — session 1",
        text="Conversation between A and B, session 1 (1:56 pm on 8 May, 2023)\n[D1:1] A: I ran yesterday.",
        source="conv-1",
        metadata={"date": "1:56 pm on 8 May, 2023"},
    ),
    Document(
        docid="2001",
        title="C and D — session 1",
        text="[D1:1] C: Hello.",
        source="conv-2",
        metadata={"date": "9 June 2023"},
    ),
    Document(
        docid="1002",
        title="A and B — session 2",
        text="[D2:1] B: I moved to Oslo.",
        source="conv-1",
        metadata={"date": "10 May 2023"},
    ),
]


def answer(text: str) -> str:
    return json.dumps({"answer": {"explanation": "[1001]", "exact_answer": text, "confidence": 70}})


def test_render_conversation_orders_sessions_and_adds_missing_dates() -> None:
    idx = ConversationIndex(DOCS)
    assert idx.conversations == ["conv-1", "conv-2"]
    assert [d.docid for d in idx.documents("conv-1")] == ["1001", "1002"]
    assert idx.text("conv-1") == (
        "[1001]\nConversation between A and B, session 1 (1:56 pm on 8 May, 2023)\n[D1:1] A: I ran yesterday."
        "\n\n[1002]\ndate: 10 May 2023\n[D2:1] B: I moved to Oslo."
    )
    assert render_conversation([]) == ""


def test_conversation_of_uses_evidence_docs() -> None:
    idx = ConversationIndex(DOCS)
    assert idx.conversation_of(Question("q", "?", "x", evidence_docids=("1002",))) == "conv-1"
    with pytest.raises(HarnessError, match="no evidence doc ids"):
        idx.conversation_of(Question("q", "?", "x"))
    with pytest.raises(HarnessError, match="evidence in \\['conv-1', 'conv-2'\\]"):
        idx.conversation_of(Question("q", "?", "x", evidence_docids=("1001", "2001")))
    with pytest.raises(HarnessError, match="cites \\['9'\\]"):
        idx.conversation_of(Question("q", "?", "x", evidence_docids=("9",)))
    assert ConversationIndex(DOCS[:1]).conversation_of(Question("q", "?", "x")) == "conv-1"


def test_prompt_prefix_is_identical_and_question_is_last() -> None:
    model = ScriptedChatModel([answer("Oslo"), answer("7 May 2023")], usage=(5000, 12))
    factory = full_context_factory(model, DOCS, max_output_tokens=64)
    qs = [
        Question("q1", "Where did B move?", "Oslo", evidence_docids=("1002",)),
        Question("q2", "When did A run?", "7 May 2023", evidence_docids=("1001",)),
    ]
    eps = [factory(q).run(q.query) for q in qs]
    first, second = model.calls
    assert first.messages[0] == second.messages[0]  # the cached prefix: rules + conversation
    assert (
        first.messages[0]["role"] == "system" and "[D2:1] B: I moved to Oslo." in first.messages[0]["content"]
    )
    assert "2001" not in first.messages[0]["content"]  # only the question's conversation
    assert first.messages[-1] == {"role": "user", "content": "Question: Where did B move?"}
    assert second.messages[-1]["content"] == "Question: When did A run?"
    assert first.json_mode and first.max_tokens == 64
    ep = eps[0]
    assert ep.status == "answered" and ep.exact_answer == "Oslo" and ep.confidence == 70
    assert (ep.input_tokens, ep.output_tokens, len(ep.steps)) == (5000, 12, 1)
    assert ep.doc_ids_seen == ("1001", "1002")
    t = build_trace(qs[0], "full-context", ep)
    assert t.input_tokens == 5000 and t.evidence_recall == 1.0 and t.n_steps == 1 and t.em


def test_bad_reply_overflow_and_lm_error_are_episodes_not_raises() -> None:
    conv = render_conversation(DOCS[:1])
    tool = json.dumps({"tool": "search", "args": {"query": "x"}})
    model = ScriptedChatModel(
        [
            "no json here",
            tool,
            LMContextWindowError("too long", model="m"),
            LMRateLimitError("slow", model="m"),
        ]
    )
    runner = FullContextRunner(model, conv, doc_ids=["1001"])
    bad, as_tool, overflow, down = (runner.run("q") for _ in range(4))
    # a bad reply is the model's mistake (graded wrong, no judge call), not an outage
    assert bad.status == "budget_exhausted" and bad.steps[0].kind == "invalid"
    assert "unparseable" in bad.errors[0] and bad.exhausted_by == "steps" and bad.timed_out
    assert bad.exact_answer == "" and bad.input_tokens == 100  # usage still counted
    graded = build_trace(Question("q", "?", "x"), "full-context", bad, judge=lambda **k: 1 / 0)
    assert (graded.judge_status, graded.judge_correct) == ("graded", False)
    assert as_tool.status == "budget_exhausted" and "has no tools" in as_tool.errors[0]
    assert (
        overflow.status == "context_overflow" and overflow.doc_ids_seen == () and overflow.input_tokens == 0
    )
    assert overflow.errors == ("step 1: context window exceeded: too long",)
    assert (
        down.status == "failed" and down.steps[0].kind == "lm_error" and "LMRateLimitError" in down.errors[0]
    )


@dataclass(frozen=True)
class Verdict:
    correct: bool | None
    status: str


def test_run_eval_full_context_judges_after_all_answers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "documents.jsonl").write_text(
        "\n".join(
            json.dumps({"docid": d.docid, "title": d.title, "text": d.text, "source": d.source, **d.metadata})
            for d in DOCS
        )
        + "\n",
        encoding="utf-8",
    )
    rows = [
        {
            "id": "q1",
            "question": "Where did B move?",
            "answer": "Oslo",
            "evidence_docids": ["1002"],
            "category": "single-hop",
        },
        {
            "id": "q2",
            "question": "When did A run?",
            "answer": "7 May 2023",
            "evidence_docids": ["1001"],
            "category": "temporal",
        },
        {
            "id": "q3",
            "question": "Who said hello?",
            "answer": "C",
            "evidence_docids": ["2001"],
            "category": "single-hop",
        },
    ]
    (data / "questions.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    events: list[str] = []

    def reply(messages):
        events.append("answer")
        return answer({"Where": "Oslo", "When": "8 May 2023", "Who": "C"}[messages[-1]["content"].split()[1]])

    def judge(*, question, response, gold, aliases):
        events.append("judge")
        return Verdict(f"Exact Answer: {gold}\n" in response, "graded")

    cfg = KituneConfig(workdir=tmp_path / "w")
    res = run_eval(
        cfg,
        skill="full-context",  # type: ignore[arg-type]
        data_dir=data,
        concurrency=1,
        progress=False,
        chat_model=ScriptedChatModel([reply] * 3, usage=(900, 9)),
        judge=judge,
    )
    assert events == ["answer"] * 3 + ["judge"] * 3  # no judge call between answers
    assert [(t.query_id, t.judge_correct, t.category) for t in res.traces] == [
        ("q1", True, "single-hop"),
        ("q2", False, "temporal"),
        ("q3", True, "single-hop"),
    ]
    assert res.summary.n_correct == 2 and res.summary.input_tokens == 2700
    lines = read_traces(res.traces_path, latest_only=False)
    assert [t.judge_status for t in lines] == ["not_run"] * 3 + ["graded"] * 3
    assert [t.judge_status for t in read_traces(res.traces_path)] == ["graded"] * 3
    # rerun: nothing to answer or judge again
    again = run_eval(
        cfg,
        skill="full-context",
        data_dir=data,
        progress=False,  # type: ignore[arg-type]
        chat_model=ScriptedChatModel([]),
        judge=judge,
    )
    assert again.summary.n_correct == 2 and events.count("judge") == 3
    assert "full-context" in EVAL_SKILLS


def test_judge_pending_rules() -> None:
    q = {x: Question(x, "?", "yes") for x in "abcd"}
    base = dict(skill="full-context", question="?", gold_answer="yes")
    traces = [
        Trace(query_id="a", exact_answer="yes", status="answered", **base),
        Trace(query_id="b", exact_answer="", status="budget_exhausted", **base),
        Trace(
            query_id="c",
            exact_answer="yes",
            status="answered",
            judge_status="graded",
            judge_correct=False,
            **base,
        ),
        Trace(query_id="d", exact_answer="", status="failed", **base),
    ]

    def boom(**kw):
        raise RuntimeError("judge down")

    judged = judge_pending(list(q.values()), traces, lambda **kw: Verdict(True, "graded"))
    assert [(t.judge_status, t.judge_correct) for t in judged] == [
        ("graded", True),
        ("graded", False),  # no answer is wrong, without a judge call
        ("graded", False),  # already judged: untouched
        ("not_run", None),  # failed (its LLM calls failed): never graded
    ]
    errs = judge_pending(list(q.values()), traces[:1], boom)
    assert errs[0].judge_status == "grader_error" and errs[0].judge_error == "RuntimeError: judge down"
    assert errs[0].judge_correct is None


def test_cache_effect_first_vs_later() -> None:
    def t(qid: str, lat: float, tok: int) -> Trace:
        return Trace(
            query_id=qid,
            skill="full-context",
            question="?",
            gold_answer="g",
            input_tokens=tok,
            steps=[{"latency_s": lat}],
        )

    eff = cache_effect([t("1", 300.0, 20000), t("2", 6.0, 20010), t("3", 10.0, 20020), t("4", 4.0, 20030)])
    assert eff is not None
    assert (eff.first_query_id, eff.first_latency_s, eff.later_n, eff.later_median_latency_s) == (
        "1",
        300.0,
        3,
        6.0,
    )
    assert eff.speedup == 50.0 and eff.later_mean_input_tokens == pytest.approx(20020.0)
    assert cache_effect([]) is None


def test_real_locomo_conversation_26(tmp_path: Path) -> None:
    if not LOCOMO.is_dir():
        pytest.skip("shared LoCoMo data not found")
    docs = load_corpus(LOCOMO)
    idx = ConversationIndex(docs)
    assert idx.conversations == ["locomo-26", "locomo-30", "locomo-41", "locomo-42", "locomo-43"]
    qs = load_questions(LOCOMO)
    q = next(x for x in qs if x.query_id == "26-001")
    source = idx.conversation_of(q)
    text = idx.text(source)
    assert source == "locomo-26" and len(idx.documents(source)) == 19
    assert text.startswith(
        "[26001]\nConversation between Caroline and Melanie, session 1 (1:56 pm on 8 May, 2023)"
    )
    assert text.index("[26002]") < text.index("[26019]") and "[30001]" not in text
    assert 75_000 < len(text) < 77_000
    with_evidence = [x for x in qs if x.evidence_docids]
    assert len(qs) - len(with_evidence) == 2  # 26-031 and one more have no evidence turns at all
    assert all(idx.conversation_of(x) == f"locomo-{x.query_id[:2]}" for x in with_evidence)
    # on a one-conversation corpus (the experiment's subset) they still get their conversation
    one = ConversationIndex(idx.documents("locomo-26"))
    q31 = next(x for x in qs if x.query_id == "26-031")
    assert one.conversation_of(q31) == "locomo-26"
