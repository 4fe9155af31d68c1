"""Issue 39.4 (no episode can loop), 39.1 (input tokens by component) and issue 40's tool-call class."""

from __future__ import annotations

import json
from collections.abc import Sequence

from eval_fakes import DOCS, FakeCorpusStore, fake_context

from kitune.chat import ChatMessage, ChatResponse, ToolCall
from kitune.data.questions import Question
from kitune.evaluation.agent import Agent, split_tokens
from kitune.evaluation.budget import Budget
from kitune.evaluation.metrics import build_trace
from kitune.evaluation.tools import ContextObservation, baseline_toolbox, in_context_toolbox
from kitune.schema import Document
from kitune.testing.chat import ScriptedChatModel

MORSE_DOCS = [
    *DOCS,
    Document(docid="m1", title="David Morse", text="David Morse is an actor born in Beverly, Massachusetts."),
]
KI = ContextObservation(
    text="[ki-1] David Morse is an American actor. (evidence: [m1])", doc_ids=("m1",), n_results=1
)


def _call(name: str, **args: str) -> str:
    return json.dumps({"tool": name, "args": args})


def _counting(reply: str):
    """A scripted turn billing one input token per 4 characters sent (a stand-in tokenizer)."""

    def turn(messages: Sequence[ChatMessage]) -> ChatResponse:
        chars = sum(len(str(m.get("content") or "")) for m in messages)
        return ChatResponse(text=reply, input_tokens=chars // 4, output_tokens=12)

    return turn


def _pair_loop(n: int = 60) -> list:
    """A model that alternates the same two calls forever (the 176k-token episode of issue 39)."""
    gc, search = _call("get_context", query="David Morse"), _call("search", query="David Morse")
    return [_counting(gc if i % 2 == 0 else search) for i in range(n)]


def _in_context(gc=None):
    gc = gc or fake_context({"David Morse": KI})
    store = FakeCorpusStore(MORSE_DOCS)
    return in_context_toolbox(gc, corpus_store=store), gc, store


def test_a_repeated_pair_of_calls_ends_at_step_7_by_refusals_not_at_the_step_budget() -> None:
    box, gc, store = _in_context()
    model = ScriptedChatModel(_pair_loop())
    ep = Agent(model, box, budget=Budget(max_steps=43)).run(
        "What district is LaHave of the place of birth of David Morse located?"
    )
    # 1 get_context runs; 2 search refused (1 failed look-up of 2); 3 get_context again, answered
    # from the trace and booked as a look-up that did not answer; 4 search opens and runs; 5 the
    # 3rd identical get_context is blocked; 6 search again: a pointer; 7 get_context blocked again:
    # the same call refused twice ends the loop; 8 the force-commit.
    assert gc.calls == ["David Morse"] and store.searches == ["David Morse"]
    tools = [(s.tool, s.repeated, s.blocked, s.refused) for s in ep.steps[:7]]
    assert tools == [
        ("get_context", False, False, False),
        ("search", False, False, True),
        ("get_context", True, False, False),
        ("search", False, False, False),
        ("get_context", True, True, True),
        ("search", True, False, False),
        ("get_context", True, True, True),
    ]
    # the repeat moved the fallback count: one failed, one pending (looking again means it failed)
    assert (box.failed_lookups, box.pending_lookup) == (1, True)
    assert ep.steps[-1].kind == "force_commit" and len(ep.steps) == 8 and len(model.calls) == 8
    assert ep.status == "budget_exhausted" and ep.exhausted_by == "refused" and ep.timed_out
    assert ep.refused_calls == 3 and ep.repeated_call_blocked == 2
    assert ep.errors[-2] == (
        "the episode ends with a force-commit: get_context refused twice for the same call (identical call "
        "repeated 4 times; not run (identical call already returned 1 result(s) (57 characters) at step 1 "
        "— change the query or finish with your answer.))"
    )
    # each call re-sends the history but no result twice: the pointers are one line
    assert [s.input_tokens for s in ep.steps] == [324, 365, 423, 473, 520, 604, 653, 848]
    assert ep.input_tokens == 4210
    assert ep.input_split == {
        "force_commit": 111,
        "history": 1188,
        "observation:get_context": 202,
        "observation:search": 113,
        "question": 160,
        "system": 2436,
    }


def test_the_input_token_budget_ends_the_same_loop_before_the_call_that_would_cross_it() -> None:
    box, _, _ = _in_context()
    model = ScriptedChatModel(_pair_loop())
    ep = Agent(model, box, budget=Budget(max_steps=43, max_tokens=1200)).run(
        "What district is LaHave of the place of birth of David Morse located?"
    )
    # calls bill 324, 365, 423 (1,112 in all); the 4th would send ~470 more: 1,112 + 470 > 1,200
    assert [s.kind for s in ep.steps] == ["tool", "tool", "tool", "force_commit"]
    assert ep.status == "budget_exhausted" and ep.exhausted_by == "tokens" and ep.timed_out
    assert ep.input_tokens - ep.steps[-1].input_tokens == 1112
    # the force-commit ran on the trimmed trace: small, whatever the history had grown to
    last = model.calls[-1].messages
    assert len(last) == 4 and last[2]["content"].startswith("Observations so far (trimmed):")


def test_a_refused_call_costs_a_step_and_the_third_refusal_ends_the_episode() -> None:
    box, _, store = _in_context(fake_context({}))  # no KI at all: every look-up fails
    # search is refused until two look-ups failed; the model varies the query, so no call repeats
    script = [_call("search", query=f"q{i}") for i in range(3)] + [_call("get_context", query="x")] * 5
    model = ScriptedChatModel(script)
    ep = Agent(model, box, budget=Budget(max_steps=43)).run("q")
    assert store.searches == []
    assert [s.refused for s in ep.steps[:3]] == [True, True, True] and ep.steps[3].kind == "force_commit"
    assert ep.exhausted_by == "refused" and ep.refused_calls == 3 and len(model.calls) == 4
    assert ep.errors[-2].startswith("the episode ends with a force-commit: 3 refused calls (last: search:")
    fed = json.loads(model.calls[1].messages[-1]["content"].split("\n")[1])
    assert fed["error"]["type"] == "not_allowed_yet" and fed["error"]["tool"] == "search"


def test_split_tokens_is_exact_and_proportional() -> None:
    assert split_tokens(10, {"a": 1, "b": 1, "c": 1}) == {"a": 4, "b": 3, "c": 3}
    assert split_tokens(100, {"system": 300, "question": 100, "history": 0}) == {"question": 25, "system": 75}
    assert split_tokens(0, {"a": 5}) == {} and split_tokens(7, {}) == {}
    assert sum(split_tokens(997, {"x": 13, "y": 7, "z": 911}).values()) == 997


def test_components_add_up_to_the_episode_total_in_both_modes() -> None:
    for mode in ("json", "native"):
        turns = [
            _counting(_call("search", query="capital France")),
            _counting("no json"),
            _counting(_call("get_by_doc_id", docid="d1")),
            _counting(
                json.dumps({"answer": {"explanation": "[d1]", "exact_answer": "Paris", "confidence": 90}})
            ),
        ]
        model = ScriptedChatModel(turns, tool_mode=mode)
        ep = Agent(model, baseline_toolbox(FakeCorpusStore(DOCS)), budget=Budget(max_steps=3)).run("q?")
        for s in ep.steps:
            assert sum(s.input_split.values()) == s.input_tokens, (mode, s.index)
        split = ep.input_split
        assert sum(split.values()) == ep.input_tokens > 0, mode
        assert set(split) == {
            "system",
            "question",
            "observation:search",
            "observation:get_by_doc_id",
            "feedback",
            "history",
            "force_commit",
        }, mode
        # the first call sends only the system prompt and the question
        assert set(ep.steps[0].input_split) == {"system", "question"}
        # the second call: the search result once, the model's reply as history
        assert set(ep.steps[1].input_split) == {"system", "question", "observation:search", "history"}
        trace = build_trace(Question(query_id="1", query="q?", answer="Paris"), "baseline", ep)
        assert trace.input_split == split and sum(trace.input_split.values()) == trace.input_tokens


def test_exact_duplicate_calls_in_one_reply_run_once_and_cost_one_step() -> None:
    dup = ToolCall("call_1", "search", '{"query": "Paris"}')
    other = ToolCall("call_2", "search", '{"query": "Lyon"}')
    reply = ChatResponse(
        text="", input_tokens=50, output_tokens=5, finish_reason="tool_calls", tool_calls=(dup, dup, other)
    )
    answer_call = ToolCall(
        "a", "answer", json.dumps({"explanation": "[d1]", "exact_answer": "Paris", "confidence": 80})
    )
    done = ChatResponse(
        text="", input_tokens=80, output_tokens=5, finish_reason="tool_calls", tool_calls=(answer_call,)
    )
    store = FakeCorpusStore(DOCS)
    model = ScriptedChatModel([reply, done], tool_mode="native")
    ep = Agent(model, baseline_toolbox(store), budget=Budget(max_steps=5)).run("q")
    assert store.searches == ["Paris", "Lyon"] and ep.duplicate_calls == 1
    assert [(s.kind, s.call_id) for s in ep.steps] == [
        ("tool", "call_1"),
        ("tool", "call_2"),
        ("answer", "a"),
    ]
    sent = model.calls[1].messages
    assert [c["id"] for c in sent[2]["tool_calls"]] == ["call_1", "call_2"]  # the copy is not sent back
    assert [m["tool_call_id"] for m in sent[3:]] == ["call_1", "call_2"]
    # the same name and arguments under two ids are two calls (the second is a repeat, from the trace)
    twins = ChatResponse(
        text="",
        input_tokens=50,
        output_tokens=5,
        finish_reason="tool_calls",
        tool_calls=(dup, ToolCall("call_9", "search", '{"query": "Paris"}')),
    )
    ep2 = Agent(
        ScriptedChatModel([twins, done], tool_mode="native"), baseline_toolbox(FakeCorpusStore(DOCS))
    ).run("q")
    assert ep2.duplicate_calls == 0 and [s.repeated for s in ep2.steps[:2]] == [False, True]


def test_a_content_borne_call_is_labelled_and_counts_only_for_an_offered_tool() -> None:
    store = FakeCorpusStore(DOCS)
    script = [
        _call("fly", query="Paris"),  # not an offered tool: plain text, not a failed tool step
        _call("search", q="Paris"),  # an offered tool with the wrong argument names: plain text
        _call("search", query="Paris"),  # offered, exact arguments: runs, labelled as from content
        json.dumps({"answer": {"explanation": "[d1]", "exact_answer": "Paris", "confidence": 80}}),
    ]
    model = ScriptedChatModel(script, tool_mode="native")
    ep = Agent(model, baseline_toolbox(store)).run("q")
    assert store.searches == ["Paris"] and ep.tool_calls == {"search": 1}
    assert [(s.kind, s.source, s.error_code, s.tool) for s in ep.steps] == [
        ("invalid", "content", "plain_text", None),
        ("invalid", "content", "plain_text", None),
        ("tool", "content", None, "search"),
        ("answer", "content", None, None),
    ]
    assert ep.steps[0].error == (
        "plain_text: the reply holds no tool call (the text looks like a call, but it names 'fly', which is "
        "not an offered tool (search, get_by_doc_id))"
    )
    assert "its arguments ['q'] are not search's ['query']" in (ep.steps[1].error or "")
    assert ep.status == "answered" and ep.steps[0].to_dict()["source"] == "content"


def test_invalid_arguments_in_a_row_get_their_own_status_and_json_errors() -> None:
    bad = ChatResponse(
        text="",
        input_tokens=40,
        output_tokens=5,
        finish_reason="tool_calls",
        tool_calls=(ToolCall("x", "search", '{"query": Paris}'),),
    )
    model = ScriptedChatModel([bad] * 6, tool_mode="native")
    ep = Agent(model, baseline_toolbox(FakeCorpusStore(DOCS)), budget=Budget(max_steps=10)).run("q")
    assert ep.status == "invalid_tool_arguments" and len(ep.steps) == 5 and not ep.force_committed
    assert {s.error_code for s in ep.steps} == {"invalid_arguments"}
    error = json.loads(model.calls[1].messages[-1]["content"].split("\n\n")[0])["error"]
    assert error["type"] == "invalid_arguments" and error["tool"] == "search"
    assert error["raw"] == '{"query": Paris}' and error["message"].startswith(
        "invalid_arguments: the arguments"
    )
    # a mixed run (one unknown tool among them) is still malformed_calls
    unknown = ChatResponse(
        text="",
        input_tokens=40,
        output_tokens=5,
        finish_reason="tool_calls",
        tool_calls=(ToolCall("u", "fly", "{}"),),
    )
    model2 = ScriptedChatModel([bad, bad, unknown, bad, bad], tool_mode="native")
    ep2 = Agent(model2, baseline_toolbox(FakeCorpusStore(DOCS)), budget=Budget(max_steps=10)).run("q")
    assert ep2.status == "malformed_calls"
