from __future__ import annotations

import json

from eval_fakes import DOCS, FakeCorpusStore

from kitune.errors import LMContextWindowError, LMRateLimitError
from kitune.evaluation.agent import MALFORMED_IN_A_ROW, NOT_RUN, Agent
from kitune.evaluation.budget import Budget
from kitune.evaluation.tools import baseline_toolbox, closed_book_toolbox
from kitune.testing.chat import ScriptedChatModel


def tool(name: str, **args: str) -> str:
    return json.dumps({"tool": name, "args": args})


def answer(text: str, conf: int = 80, expl: str = "see [d1]") -> str:
    return json.dumps({"answer": {"explanation": expl, "exact_answer": text, "confidence": conf}})


def _agent(model: ScriptedChatModel, max_steps: int = 43, max_chars: int = 8000) -> Agent:
    return Agent(
        model,
        baseline_toolbox(FakeCorpusStore(DOCS), max_chars=max_chars),
        budget=Budget(max_steps=max_steps),
    )


def test_answers_after_search_and_fetch() -> None:
    model = ScriptedChatModel(
        [
            tool("search", query="capital France"),
            tool("get_by_doc_id", docid="d1"),
            "Sure! ```json\n" + answer("Paris") + "\n```",
        ],
        usage=(120, 15),
    )
    ep = _agent(model).run("What is the capital of France?")
    assert ep.status == "answered" and ep.exact_answer == "Paris" and ep.confidence == 80
    assert ep.tool_calls == {"search": 1, "get_by_doc_id": 1}
    assert [s.kind for s in ep.steps] == ["tool", "tool", "answer"]
    assert ep.doc_ids_seen[:2] == ("d2", "d1") and len(ep.doc_ids_seen) == 2
    assert not ep.force_committed and not ep.timed_out
    assert all(c.json_mode for c in model.calls)
    assert "Observation from search" in model.calls[1].messages[-1]["content"]
    assert "[d1] Paris" in model.calls[1].messages[-1]["content"]


def test_token_totals_equal_sum_of_per_call_usage() -> None:
    model = ScriptedChatModel([tool("search", query="Lyon"), "not json", answer("Lyon")], usage=(321, 17))
    ep = _agent(model).run("q")
    assert len(model.calls) == 3
    assert [s.input_tokens for s in ep.steps] == [321, 321, 321]
    assert ep.input_tokens == 3 * 321 and ep.output_tokens == 3 * 17


def test_budget_exhaustion_makes_exactly_one_force_commit_call() -> None:
    turns = (
        [tool("search", query=f"q{i}") for i in range(3)]
        + [answer("Paris", 40)]
        + [tool("search", query="x")] * 5
    )
    model = ScriptedChatModel(turns)
    ep = _agent(model, max_steps=3).run("q")
    assert len(model.calls) == 4  # 3 budgeted steps + one force-commit
    assert model.remaining == 5
    last = model.calls[-1].messages[-1]["content"]
    assert "budget is spent" in last and "no more tools" in last
    assert ep.status == "budget_exhausted" and ep.force_committed and ep.timed_out
    assert ep.exhausted_by == "steps"
    assert ep.exact_answer == "Paris" and ep.confidence == 40
    assert [s.kind for s in ep.steps] == ["tool", "tool", "tool", "force_commit"]


def test_token_budget_exhausts() -> None:
    model = ScriptedChatModel(
        [tool("search", query="a"), tool("search", query="b"), answer("x")], usage=(600, 5)
    )
    ep = Agent(model, baseline_toolbox(FakeCorpusStore(DOCS)), budget=Budget(max_tokens=1800)).run("q")
    assert ep.exhausted_by == "tokens" and ep.force_committed and len(model.calls) == 3
    assert ep.input_tokens == 1800  # two loop calls, then the force-commit


def test_token_budget_stops_before_a_call_that_would_cross_it() -> None:
    # The first call bills 600 tokens; the second would send more characters (the observation is
    # added), so 600 + >600 > 1000: it is not made, the force-commit runs on the trimmed trace.
    model = ScriptedChatModel([tool("search", query="a"), answer("x")], usage=(600, 5))
    ep = Agent(model, baseline_toolbox(FakeCorpusStore(DOCS)), budget=Budget(max_tokens=1000)).run("q")
    assert ep.status == "budget_exhausted" and ep.exhausted_by == "tokens" and ep.force_committed
    assert [s.kind for s in ep.steps] == ["tool", "force_commit"] and len(model.calls) == 2
    assert model.calls[1].messages[2]["content"].startswith("Observations so far (trimmed):")


def test_force_commit_unparseable_is_recorded_not_raised() -> None:
    model = ScriptedChatModel([tool("search", query="a"), "I don't know"])
    ep = _agent(model, max_steps=1).run("q")
    assert ep.status == "budget_exhausted" and not ep.force_committed and ep.exact_answer == ""
    assert ep.steps[-1].kind == "force_commit" and "unparseable" in (ep.steps[-1].error or "")


def test_malformed_tool_call_recorded_and_loop_continues() -> None:
    model = ScriptedChatModel(
        [
            "no json here",
            json.dumps({"tool": "search", "args": {"q": "x"}}),
            tool("fly", query="x"),
            json.dumps({"foo": 1}),
            answer("Paris"),
        ]
    )
    ep = _agent(model).run("q")
    assert ep.status == "answered" and ep.exact_answer == "Paris"
    kinds_errors = [(s.kind, (s.error or "")[:30]) for s in ep.steps]
    assert kinds_errors[0][0] == "invalid" and "no JSON object" in ep.steps[0].error
    assert ep.steps[1].kind == "tool" and "missing ['query']" in ep.steps[1].error
    assert "unknown tool 'fly'" in ep.steps[2].error
    assert ep.steps[3].kind == "invalid"
    assert len(ep.errors) == 4 and ep.tool_calls == {"search": 1}
    # a failed call goes back as a JSON error object (issue 40)
    fed = model.calls[3].messages[-1]["content"]
    assert fed.startswith("Observation from fly:\n") and fed.endswith("\n\n[40 step(s) left]")
    assert json.loads(fed.split("\n")[1]) == {
        "error": {
            "type": "unknown_tool",
            "tool": "fly",
            "message": "unknown tool 'fly'; available tools: search, get_by_doc_id",
        }
    }
    assert [s.error_code for s in ep.steps[:4]] == [
        "unparseable",
        "invalid_arguments",
        "unknown_tool",
        "unparseable",
    ]
    assert [s.source for s in ep.steps] == ["json"] * 5


def test_a2_identical_calls_answered_from_trace_then_blocked() -> None:
    store = FakeCorpusStore(DOCS)
    call = tool("search", query="nothing matches zzz")
    model = ScriptedChatModel([call] * 8)
    ep = Agent(model, baseline_toolbox(store), budget=Budget(max_steps=7)).run("q")
    assert store.searches == ["nothing matches zzz"]  # executed once
    assert ep.tool_calls == {"search": 1}
    # 2nd: a pointer to step 1 (the result is not sent again); 3rd: blocked, a refusal; 4th: the
    # same call refused again ends the loop with a force-commit (issue 39.4)
    assert [s.repeated for s in ep.steps[:4]] == [False, True, True, True]
    assert [s.blocked for s in ep.steps[:4]] == [False, False, True, True]
    assert ep.repeated_call_blocked == 2 and ep.repeated_calls == 3 and ep.refused_calls == 2
    pointer = model.calls[2].messages[-1]["content"]
    assert "identical to the call at step 1" in pointer and "No documents matched" not in pointer
    blocked_msg = model.calls[3].messages[-1]["content"]
    assert "identical call already returned 0 result(s)" in blocked_msg
    assert "change the query or finish" in blocked_msg
    assert ep.status == "budget_exhausted" and ep.exhausted_by == "refused" and len(model.calls) == 5
    assert ep.steps[-1].kind == "force_commit" and not ep.force_committed
    assert "search refused twice for the same call" in ep.errors[-2]


def test_a2_identical_calls_count_across_the_episode_not_only_in_a_row() -> None:
    store = FakeCorpusStore(DOCS)
    a, b = tool("search", query="Paris"), tool("search", query="Lyon")
    model = ScriptedChatModel([a, a, b, a, answer("x")])
    ep = Agent(model, baseline_toolbox(store)).run("q")
    assert store.searches == ["Paris", "Lyon"]
    assert [s.repeated for s in ep.steps[:4]] == [False, True, False, True]
    assert [s.blocked for s in ep.steps[:4]] == [False, False, False, True]  # the 3rd "Paris"
    assert ep.repeated_call_blocked == 1 and ep.status == "answered"


def test_a1_observation_capped_with_marker() -> None:
    big = [*DOCS, type(DOCS[0])(docid="big", title="Big", text="Paris " * 5000)]
    model = ScriptedChatModel([tool("get_by_doc_id", docid="big"), answer("x")])
    ep = Agent(model, baseline_toolbox(FakeCorpusStore(big), max_chars=500)).run("q")
    obs = model.calls[1].messages[-1]["content"]
    assert ep.steps[0].truncated and ep.steps[0].observation_chars <= 500
    assert "[truncated: showed" in obs and "of 30010 characters" in obs


def test_a1_context_overflow_ends_episode_and_commits_from_trimmed_trace() -> None:
    model = ScriptedChatModel(
        [tool("search", query="capital"), LMContextWindowError("too long", model="m"), answer("Paris", 30)],
        usage=(50, 5),
    )
    ep = _agent(model).run("What is the capital?")
    assert ep.status == "context_overflow" and ep.force_committed and ep.exact_answer == "Paris"
    assert [s.kind for s in ep.steps] == ["tool", "lm_error", "force_commit"]
    assert "context window exceeded" in ep.errors[0]
    trimmed = model.calls[2].messages
    assert len(trimmed) == 4 and trimmed[2]["content"].startswith("Observations so far (trimmed)")
    assert ep.input_tokens == 100  # the failed call reports no usage


def test_a1_overflow_twice_is_a_status_not_a_crash() -> None:
    err = LMContextWindowError("too long")
    model = ScriptedChatModel([err, err])
    ep = _agent(model).run("q")
    assert ep.status == "context_overflow" and ep.exact_answer == "" and len(ep.errors) == 2


def test_transport_error_fails_episode() -> None:
    model = ScriptedChatModel([LMRateLimitError("429", retry_after_s=3.0)])
    ep = _agent(model).run("q")
    assert ep.status == "failed" and "LMRateLimitError" in ep.errors[0]


def test_closed_book_and_timeout() -> None:
    now = [0.0]

    def slow(text: str):
        def turn(_messages):
            now[0] += 10.0  # each model call takes 10 s
            return text

        return turn

    model = ScriptedChatModel(
        [
            slow(tool("search", query="x")),
            slow(tool("search", query="y")),
            slow(tool("search", query="z")),
            slow(answer("Rome", 10)),
        ]
    )
    ep = Agent(model, closed_book_toolbox(), budget=Budget(timeout_s=25), clock=lambda: now[0]).run("q")
    assert "You have no tools" in model.calls[0].messages[0]["content"]
    assert "unknown tool 'search'; available tools: none" in ep.steps[0].error
    assert len(model.calls) == 4  # 3 calls reach 30 s > 25 s, then the force-commit
    assert ep.exhausted_by == "timeout" and ep.force_committed and ep.exact_answer == "Rome"
    assert ep.wall_time_s == 40.0


def test_steps_keep_the_raw_reply_capped() -> None:
    model = ScriptedChatModel(["x" * 900, answer("Paris")])
    ep = _agent(model).run("q")
    assert ep.steps[0].reply == "x" * 500 and ep.steps[1].reply.startswith('{"answer"')
    assert ep.steps[0].to_dict()["reply"] == "x" * 500


# -- native tool calling (issue 16) ---------------------------------------------------------------

from kitune.chat import ChatResponse, ToolCall  # noqa: E402
from kitune.evaluation.metrics import build_trace  # noqa: E402
from kitune.testing.chat import native_turn  # noqa: E402


class _Ticks:
    """A clock that advances 0.5 s per reading, so latencies and wall time are exact."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.5
        return self.t


def _both_modes(script: list[str], *, max_steps: int = 43, usage: tuple[int, int] = (150, 12)):
    from kitune.data.loaders import Question

    q = Question(
        query_id="q1", query="What is the capital of France?", answer="Paris", evidence_docids=("d1",)
    )
    out = {}
    for mode in ("json", "native"):
        turns = (
            script
            if mode == "json"
            else [native_turn(t, call_id=f"c{i}", usage=usage) for i, t in enumerate(script)]
        )
        model = ScriptedChatModel(turns, usage=usage, tool_mode=mode)
        agent = Agent(
            model, baseline_toolbox(FakeCorpusStore(DOCS)), budget=Budget(max_steps=max_steps), clock=_Ticks()
        )
        ep = agent.run(q.query)
        out[mode] = (ep, build_trace(q, "baseline", ep).to_dict(), model)
    return out


MODE_KEYS = ("call_id", "finish_reason", "source", "error_code", "input_split")
"""Step fields that differ between the modes by nature (native call ids, ``tool_calls`` endings,
where the call was read, and the token split: native mode sends tool schemas)."""


def _neutral(trace: dict) -> dict:
    """``trace`` without the tool mode and the per-mode step fields."""
    steps = [{k: v for k, v in s.items() if k not in MODE_KEYS} for s in trace["steps"]]
    return {**trace, "tool_mode": "", "steps": steps, "input_split": {}}


def test_same_scripted_episode_gives_equal_traces_in_both_modes() -> None:
    script = [
        tool("search", query="capital France"),
        "hmm, let me think",  # invalid in both modes
        tool("search", query="capital France"),  # identical call: answered from the trace
        tool("get_by_doc_id", docid="d1"),
        answer("Paris", 90, "Document [d1] says so."),
    ]
    runs = _both_modes(script)
    (ej, tj, mj), (en, tn, mn) = runs["json"], runs["native"]
    assert ej.tool_mode == "json" and en.tool_mode == "native"
    assert tj["tool_mode"] == "json" and tn["tool_mode"] == "native"  # the mode is on the trace
    # steps (kinds, args, observation sizes, doc ids, errors, tokens, latency, reply), totals
    assert _neutral(tj) == _neutral(tn)
    assert [(s["call_id"], s["finish_reason"]) for s in tj["steps"]] == [(None, "stop")] * 5
    assert [(s["call_id"], s["finish_reason"]) for s in tn["steps"]] == [
        ("c0", "tool_calls"),
        (None, "stop"),  # the text reply
        ("c2", "tool_calls"),
        ("c3", "tool_calls"),
        ("c4", "tool_calls"),
    ]
    assert [s["kind"] for s in tn["steps"]] == ["tool", "invalid", "tool", "tool", "answer"]
    assert tn["steps"][2]["repeated"] is True and tn["tool_calls"] == {"search": 1, "get_by_doc_id": 1}
    assert (tn["input_tokens"], tn["output_tokens"]) == (5 * 150, 5 * 12)
    assert tn["exact_answer"] == "Paris" and tn["confidence"] == 90
    assert tn["steps"][-1]["reply"] == script[-1]  # the answer call rendered as the JSON protocol
    # JSON mode sends no tools; native mode sends the toolbox's schemas plus `answer`, never json_mode.
    assert all(c.tools is None and c.json_mode for c in mj.calls)
    assert all(not c.json_mode for c in mn.calls)
    names = [t["function"]["name"] for t in mn.calls[0].tools]
    assert names == ["search", "get_by_doc_id", "answer"]
    assert mn.calls[0].tools[0]["function"]["parameters"]["required"] == ["query"]
    # Native observations go back as tool messages answering the call id.
    msgs = mn.calls[1].messages
    assert msgs[-2]["tool_calls"][0]["id"] == "c0" and msgs[-1]["role"] == "tool"
    assert msgs[-1]["tool_call_id"] == "c0" and "[d1] Paris" in msgs[-1]["content"]
    assert "Call one of the tools, or call answer" in mn.calls[2].messages[-1]["content"]


def test_force_commit_is_equal_in_both_modes_and_native_forces_the_answer_function() -> None:
    script = [tool("search", query=f"q{i}") for i in range(3)] + [answer("Paris", 40)]
    runs = _both_modes(script, max_steps=3)
    (_, tj, _), (en, tn, mn) = runs["json"], runs["native"]
    assert tj["tool_mode"] == "json" and tn["tool_mode"] == "native"  # the mode is on the trace
    assert _neutral(tj) == _neutral(tn)
    assert en.status == "budget_exhausted" and en.force_committed and en.exhausted_by == "steps"
    assert en.exact_answer == "Paris" and [s.kind for s in en.steps][-1] == "force_commit"
    last = mn.calls[-1]
    assert [t["function"]["name"] for t in last.tools] == ["answer"]
    assert last.tool_choice == {"type": "function", "function": {"name": "answer"}}
    assert "budget is spent" in last.messages[-1]["content"] and len(mn.calls) == 4


def _calls(*calls: ToolCall, finish: str = "tool_calls", usage: tuple[int, int] = (50, 5)) -> ChatResponse:
    return ChatResponse(
        text="", input_tokens=usage[0], output_tokens=usage[1], finish_reason=finish, tool_calls=calls
    )


TRUNCATED = '{"city": "Par'
"""The arguments of a call cut at the output-token limit (issue 25)."""


def test_truncated_arguments_are_a_named_error_shown_to_the_model_never_repaired() -> None:
    cut = _calls(ToolCall("call_1", "search", TRUNCATED), finish="length")
    model = ScriptedChatModel([cut, native_turn(answer("Paris"), call_id="call_2")], tool_mode="native")
    store = FakeCorpusStore(DOCS)
    ep = Agent(model, baseline_toolbox(store)).run("q")
    assert store.searches == []  # not run with a "repaired" {"city": "Par"}
    error = (
        "truncated_arguments: the arguments of search are not valid JSON (the reply was cut at the "
        'output-token limit (finish_reason=length)): \'{"city": "Par\'. The call was not run; call search '
        "again with complete JSON arguments."
    )
    first = ep.steps[0]
    assert (first.kind, first.tool, first.args, first.error) == ("invalid", None, {}, error)
    assert (first.reply, first.call_id, first.finish_reason) == ('search({"city": "Par)', "call_1", "length")
    assert first.to_dict()["finish_reason"] == "length" and ep.errors == (f"step 1: {error}",)
    # the model sees the error in the tool message answering its call, the raw arguments as sent
    sent = model.calls[1].messages[-2:]
    assert sent == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": TRUNCATED}}
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            # a JSON error object the model can read as data (issue 40), the raw arguments kept
            "content": json.dumps(
                {
                    "error": {
                        "type": "truncated_arguments",
                        "tool": "search",
                        "message": error,
                        "raw": TRUNCATED,
                    }
                }
            )
            + "\n\n[42 step(s) left]",
        },
    ]
    assert first.error_code == "truncated_arguments" and first.source == "tool_calls"
    assert ep.status == "answered" and ep.exact_answer == "Paris"


def test_invalid_and_non_object_arguments_are_named_errors() -> None:
    bad = _calls(
        ToolCall("x", "search", '{"query": Paris}'), ToolCall("y", "search", '["not", "an", "object"]')
    )
    model = ScriptedChatModel([bad, native_turn(answer("Paris"), call_id="z")], tool_mode="native")
    ep = Agent(model, baseline_toolbox(FakeCorpusStore(DOCS))).run("q")
    assert [(s.kind, s.error) for s in ep.steps[:2]] == [
        (
            "invalid",
            "invalid_arguments: the arguments of search are not valid JSON (Expecting value at character "
            "10): '{\"query\": Paris}'. The call was not run; call search again with complete JSON "
            "arguments.",
        ),
        (
            "invalid",
            'invalid_arguments: the arguments of search are not a JSON object: \'["not", "an", "object"]\'. '
            "The call was not run; call search again with a JSON object of arguments.",
        ),
    ]
    assert ep.status == "answered"


def test_eight_cut_calls_in_a_row_end_as_invalid_tool_arguments_not_budget_exhausted() -> None:
    cut = _calls(ToolCall("c", "search", TRUNCATED), finish="length")
    model = ScriptedChatModel([cut] * 8, tool_mode="native")
    ep = Agent(model, baseline_toolbox(FakeCorpusStore(DOCS)), budget=Budget(max_steps=8)).run("q")
    assert ep.status == "invalid_tool_arguments" and MALFORMED_IN_A_ROW == 5
    assert [s.kind for s in ep.steps] == ["invalid"] * 5 and model.remaining == 3  # no force-commit either
    assert [s.call_id for s in ep.steps] == ["c", "c_1", "c_2", "c_3", "c_4"]  # the reused id renamed
    assert (ep.exact_answer, ep.confidence, ep.force_committed, ep.timed_out, ep.exhausted_by) == (
        "",
        None,
        False,
        False,
        None,
    )
    assert ep.errors[-1] == (
        "5 tool calls with invalid or cut arguments in a row: the episode ends as invalid_tool_arguments "
        "(no call could be run; see the step errors)"
    )
    # the same in JSON mode with unusable text, and unknown tools / wrong argument names count too
    json_model = ScriptedChatModel(
        ["not json", tool("fly", query="x"), json.dumps({"tool": "search", "args": {}})] * 3
    )
    ep2 = _agent(json_model, max_steps=8).run("q")
    assert ep2.status == "malformed_calls"
    assert [s.kind for s in ep2.steps] == ["invalid", "tool", "tool", "invalid", "tool"]
    # a call that runs resets the count
    mixed = ScriptedChatModel(
        ["not json"] * 4 + [tool("search", query="Paris")] + ["not json"] * 4 + [answer("Paris")]
    )
    assert _agent(mixed).run("q").status == "answered"


def test_parallel_calls_run_in_order_with_their_own_ids_and_results() -> None:
    first = _calls(
        ToolCall("a", "search", '{"query": "Paris"}'),
        ToolCall("a", "search", '{"query": "Lyon"}'),  # duplicate id in one reply
        ToolCall("", "get_by_doc_id", '{"docid": "d3"}'),  # missing id
    )
    again = _calls(ToolCall("a", "get_by_doc_id", '{"docid": "d1"}'))  # the same id as in an earlier reply
    done = native_turn(answer("Paris"), call_id="a")
    model = ScriptedChatModel([first, again, done], tool_mode="native")
    store = FakeCorpusStore(DOCS)
    ep = Agent(model, baseline_toolbox(store)).run("q")
    assert store.searches == ["Paris", "Lyon"] and ep.status == "answered" and ep.exact_answer == "Paris"
    assert [(s.kind, s.tool, s.args, s.call_id) for s in ep.steps] == [
        ("tool", "search", {"query": "Paris"}, "a"),
        ("tool", "search", {"query": "Lyon"}, "a_1"),
        ("tool", "get_by_doc_id", {"docid": "d3"}, "call_1"),
        ("tool", "get_by_doc_id", {"docid": "d1"}, "a_2"),
        ("answer", None, {}, "a_3"),
    ]
    # each call is one step; the reply's tokens are booked once, on its first step
    assert [(s.input_tokens, s.output_tokens) for s in ep.steps] == [
        (50, 5),
        (0, 0),
        (0, 0),
        (50, 5),
        (100, 10),
    ]
    assert ep.tool_calls == {"search": 2, "get_by_doc_id": 2}
    sent = model.calls[1].messages[2:]
    assert [c["id"] for c in sent[0]["tool_calls"]] == ["a", "a_1", "call_1"]
    assert [(m["role"], m["tool_call_id"]) for m in sent[1:]] == [
        ("tool", "a"),
        ("tool", "a_1"),
        ("tool", "call_1"),
    ]
    assert sent[1]["content"].startswith("1. [d1] Paris") and "Lyon" in sent[2]["content"]
    assert sent[3]["content"] == "[d3] Lyon\nLyon is a city in France.\n\n[40 step(s) left]"  # 3 steps spent
    history = model.calls[2].messages
    ids = [c["id"] for m in history for c in m.get("tool_calls", [])]
    answered = [m["tool_call_id"] for m in history if m["role"] == "tool"]
    assert ids == answered == ["a", "a_1", "call_1", "a_2"]  # unique, each answered once


def test_parallel_calls_past_the_budget_are_answered_not_run_then_force_commit() -> None:
    three = _calls(
        *(
            ToolCall(f"k{i}", "search", json.dumps({"query": q}))
            for i, q in enumerate(["Paris", "Lyon", "France"])
        )
    )
    model = ScriptedChatModel([three, native_turn(answer("Paris", 40), call_id="f")], tool_mode="native")
    store = FakeCorpusStore(DOCS)
    ep = Agent(model, baseline_toolbox(store), budget=Budget(max_steps=2)).run("q")
    assert store.searches == ["Paris", "Lyon"]
    assert [s.kind for s in ep.steps] == ["tool", "tool", "force_commit"]
    assert ep.status == "budget_exhausted" and ep.force_committed and ep.exact_answer == "Paris"
    tool_msgs = [m for m in model.calls[1].messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["k0", "k1", "k2"]
    assert tool_msgs[2]["content"] == f"{NOT_RUN}\n\n[0 step(s) left]"


def test_an_answer_among_parallel_calls_ends_the_episode_where_it_stands() -> None:
    reply = _calls(
        ToolCall("s", "search", '{"query": "Paris"}'),
        ToolCall("t", "answer", '{"explanation": "[d1]", "exact_answer": "Paris", "confidence": 70}'),
        ToolCall("u", "search", '{"query": "Lyon"}'),
    )
    model = ScriptedChatModel([reply], tool_mode="native")
    store = FakeCorpusStore(DOCS)
    ep = Agent(model, baseline_toolbox(store)).run("q")
    assert store.searches == ["Paris"] and [s.kind for s in ep.steps] == ["tool", "answer"]
    assert ep.status == "answered" and ep.exact_answer == "Paris" and ep.confidence == 70


PROSE_TWO_CALLS = (
    'I could search {"tool": "search", "args": {"query": "Paris"}} or fetch '
    '{"tool": "get_by_doc_id", "args": {"docid": "d1"}} next.'
)


def test_prose_holding_two_calls_runs_neither_in_both_modes() -> None:
    for mode in ("json", "native"):
        model = ScriptedChatModel([PROSE_TWO_CALLS, answer("Paris")], tool_mode=mode)
        store = FakeCorpusStore(DOCS)
        ep = Agent(model, baseline_toolbox(store)).run("q")
        assert store.searches == [] and ep.tool_calls == {}, mode
        assert ep.steps[0].kind == "invalid" and ep.steps[0].error == (
            "reply held 2 different actions (search, get_by_doc_id): reply with exactly ONE JSON object; "
            "nothing was run"
        ), mode
        assert ep.status == "answered", mode


def test_native_text_answer_is_accepted_and_mode_override_wins() -> None:
    model = ScriptedChatModel([answer("Lyon")], tool_mode="native")
    ep = Agent(model, closed_book_toolbox()).run("q")
    assert ep.tool_mode == "native" and ep.exact_answer == "Lyon"
    assert [t["function"]["name"] for t in model.calls[0].tools] == ["answer"]
    forced_json = ScriptedChatModel([answer("Lyon")], tool_mode="native")
    ep2 = Agent(forced_json, closed_book_toolbox(), tool_mode="json").run("q")
    assert ep2.tool_mode == "json" and forced_json.calls[0].tools is None
