"""Failure signals from traces without gold answers: kitune episodes, chat JSONL, MLflow traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eval_fakes import DOCS, FakeCorpusStore

from kitune.data.loaders import Question
from kitune.data.trace_formats import parse_openai_record
from kitune.evaluation.agent import Agent
from kitune.evaluation.budget import Budget
from kitune.evaluation.metrics import Trace, build_trace
from kitune.evaluation.signals import (
    SIGNAL_KINDS,
    SignalRules,
    aggregate_signals,
    compute_signals,
    normalise_query,
    question_entities,
    signals_markdown,
)
from kitune.evaluation.tools import ContextObservation, in_context_toolbox
from kitune.service.workflows.traces import read_trace_file, to_trace
from kitune.testing.chat import ScriptedChatModel
from kitune.testing.store_contract import make_ki

PARIS = make_ki("Paris", "France", docid="d1", predicate="capital_of", confidence=90)
LYON = make_ki("Lyon", "France", docid="d3", predicate="located_in", confidence=30)


def tool(name: str, **args: str) -> str:
    return json.dumps({"tool": name, "args": args})


def answer(text: str) -> str:
    return json.dumps({"answer": {"explanation": "x", "exact_answer": text, "confidence": 50}})


def context_fn(table: dict[str, list]):
    def get_context(query: str) -> ContextObservation:
        kis = table.get(query, [])
        text = (
            "\n".join(f"{i}. {k.text_for_context()}" for i, k in enumerate(kis, 1))
            or f"no KIs found for: {query}"
        )
        docs = tuple(dict.fromkeys(d for k in kis for d in k.evidence_doc_ids))
        return ContextObservation(text=text, doc_ids=docs, n_results=len(kis))

    return get_context


def episode(script: list[str], question: str, table: dict[str, list], max_steps: int = 43) -> Trace:
    box = in_context_toolbox(context_fn(table), corpus_store=FakeCorpusStore(DOCS))
    ep = Agent(ScriptedChatModel(script), box, budget=Budget(max_steps=max_steps)).run(question)
    return build_trace(Question("q1", question, "unused"), "in-context", ep)


def test_kitune_episode_gives_every_signal_with_its_steps() -> None:
    trace = episode(
        [
            tool("get_context", query="Who founded Lyon?"),  # 1: nothing
            tool("get_context", query="lyon founder"),  # 2: a KI that does not answer
            tool("get_context", query="Lyon  founder!"),  # 3: the same look-up again
            tool("search", query="Lyon city"),  # 4: the fallback reads d3
            tool("get_by_doc_id", docid="d9"),  # 5: unknown doc: a query error
            answer("Munatius Plancus"),  # in nothing the agent was shown
        ],
        "Who founded Lyon?",
        {"lyon founder": [PARIS], "Lyon  founder!": [PARIS]},
    )
    # the episode records what each tool showed
    assert trace.steps[0]["n_results"] == 0 and trace.steps[1]["n_results"] == 1
    assert PARIS.id in trace.steps[1]["observation"]
    sig = compute_signals(trace, trace_id="run:q1", known_entities={"paris", "france"})
    assert [(h.kind, h.steps) for h in sig.hits] == [
        ("empty_retrieval", (1,)),
        ("fell_back_to_raw", (4,)),
        ("looped", (2, 3)),
        ("answer_unsupported", ()),
        ("coverage_gap", ()),
        ("query_error", (5,)),
    ]
    by = {h.kind: h.detail for h in sig.hits}
    assert by["empty_retrieval"] == "Who founded Lyon?"
    assert by["fell_back_to_raw"] == "read d3" and sig.fallback_docs == ("d3",)
    assert by["looped"] == "get_context:lyon founder ×2"
    assert by["coverage_gap"] == "no KI for lyon"
    assert by["query_error"].startswith("get_by_doc_id: ")
    assert sig.kis_shown == (PARIS.id,) and sig.supported is False
    assert sig.empty_lookups == ("Who founded Lyon?",) and sig.missing_entities == ("lyon",)
    assert sig.correct is None and sig.trace_id == "run:q1"


def test_force_committed_supported_answer_and_the_confidence_floor() -> None:
    trace = episode(
        [tool("get_context", query="lyon"), tool("get_context", query="lyon region"), answer("France")],
        "Where is Lyon?",
        {"lyon": [LYON], "lyon region": [LYON]},
        max_steps=2,
    )
    assert trace.status == "budget_exhausted" and trace.force_committed
    sig = compute_signals(trace, known_entities={"lyon", "france"})
    assert [(h.kind, h.steps) for h in sig.hits] == [("budget_exhausted", (3,))]
    assert sig.supported is True
    # LYON's confidence is 30: under a floor of 50 both look-ups showed nothing usable
    floored = compute_signals(trace, rules=SignalRules(confidence_floor=50), ki_confidence={LYON.id: 30})
    assert [(h.kind, h.steps) for h in floored.hits] == [
        ("empty_retrieval", (1, 2)),
        ("budget_exhausted", (3,)),
    ]


def test_gate_refusals_and_blocked_repeats_are_not_query_errors() -> None:
    trace = episode(
        [tool("search", query="Paris"), *[tool("get_context", query="paris")] * 3, answer("Paris")],
        "Capital of France?",
        {"paris": [PARIS]},
    )
    assert trace.steps[0]["error"] and trace.steps[3]["blocked"]
    sig = compute_signals(trace)
    assert [(h.kind, h.steps) for h in sig.hits] == [("looped", (2, 3, 4))]
    assert sig.supported is True


def test_normalise_query_and_question_entities() -> None:
    assert normalise_query("Marie  Curie?") == "marie curie" == normalise_query("MARIE curie")
    assert normalise_query("Zürich—Bern") == "zürich bern"
    assert question_entities('Which Nobel laureate was born in Warsaw and wrote "Pierre Curie"?') == (
        "pierre-curie",
        "nobel",
        "warsaw",
    )
    steps = [
        {"kind": "tool", "tool": "get_context", "args": {"query": "x", "entity_tags": ["entity:acme-corp"]}}
    ]
    assert question_entities("What did The Acme Corp sell?", steps) == ("acme-corp",)


# -- imported production traces -------------------------------------------------------------------


def call(cid: str, name: str, **args: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def chat(i: int, question: str, turns: list[tuple[dict, str]], final: str, **extra: object) -> dict:
    msgs: list[dict] = [{"role": "user", "content": question}]
    for c, result in turns:
        msgs.append({"role": "assistant", "content": None, "tool_calls": [c]})
        msgs.append({"role": "tool", "tool_call_id": c["id"], "content": result})
    msgs.append({"role": "assistant", "content": f"Exact Answer: {final}"})
    return {"id": f"conv-{i}", "messages": msgs, **extra}


def production_chats() -> list[dict]:
    ki_line = f"1. [{PARIS.id}] {PARIS.title} — {PARIS.description} (docs: d1)"
    return [
        # empty look-up twice (a loop), then a raw search that finds the answer
        chat(
            1,
            "Who founded the Red Cross?",
            [
                (call("a", "get_context", query="Red Cross founder"), "[]"),
                (call("b", "get_context", query="red cross founder"), "[]"),
                (
                    call("c", "search", query="Red Cross founded"),
                    "1. [d7] Henry Dunant founded the Red Cross.",
                ),
            ],
            "Henry Dunant",
            doc_ids_seen=["d7"],
        ),
        # a KI was shown, but the answer is in nothing shown
        chat(
            2,
            "What is the capital of France?",
            [(call("a", "get_context", query="capital France"), ki_line)],
            "Lyon",
        ),
        # supported answer, a failing tool call recorded as the tool's text
        chat(
            3,
            "What is the capital of France?",
            [(call("a", "get_context", query="France capital"), ki_line)],
            "Paris",
        ),
    ]


def test_openai_chat_jsonl_signals_are_exact(tmp_path: Path) -> None:
    path = tmp_path / "prod.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in production_chats()), encoding="utf-8")
    pts, skipped = read_trace_file(path)
    assert skipped == [] and pts[0].steps[0]["observation"] == "[]"
    sigs = [
        compute_signals(to_trace(pt), trace_id=pt.trace_id, known_entities={"paris", "france"}) for pt in pts
    ]
    assert [[(h.kind, h.steps) for h in s.hits] for s in sigs] == [
        [("empty_retrieval", (1, 2)), ("fell_back_to_raw", (3,)), ("looped", (1, 2)), ("coverage_gap", ())],
        [("answer_unsupported", ())],
        [],
    ]
    assert sigs[0].fallback_docs == ("d7",) and sigs[0].supported is True
    assert sigs[0].missing_entities == ("red-cross",)
    assert sigs[1].kis_shown == (PARIS.id,) and sigs[2].supported is True
    report = aggregate_signals(sigs, coverage_computed=True)
    assert report.by_kind == {
        "empty_retrieval": 1,
        "fell_back_to_raw": 1,
        "looped": 1,
        "budget_exhausted": 0,
        "answer_unsupported": 1,
        "coverage_gap": 1,
        "query_error": 0,
    }
    assert report.by_ki == {PARIS.id: {"answer_unsupported": 1, "shown": 2}}
    assert report.by_doc == {
        "d7": {
            "coverage_gap": 1,
            "empty_retrieval": 1,
            "fallback": 1,
            "fell_back_to_raw": 1,
            "looped": 1,
            "shown": 1,
        }
    }
    assert report.by_entity["red-cross"]["missing"] == 1 and report.by_entity["france"] == {
        "answer_unsupported": 1,
        "questions": 2,
    }
    assert report.metrics()["signals_looped_rate"] == pytest.approx(1 / 3)
    md = "\n".join(signals_markdown(report))
    assert "| answer unsupported | 1 | 33.3% |" in md and PARIS.id in md


def test_old_traces_without_observations_are_not_assessed() -> None:
    pt = parse_openai_record(production_chats()[1])
    trace = to_trace(pt)
    old = Trace.from_dict(
        {
            **trace.to_dict(),
            "steps": [{k: v for k, v in s.items() if k != "observation"} for s in trace.steps],
        }
    )
    sig = compute_signals(old)
    assert sig.supported is None and sig.hits == ()
    assert aggregate_signals([sig]).unassessed == 1


def test_mlflow_traces_with_retriever_spans(tmp_path: Path) -> None:
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'prod.db'}")
    try:
        mlflow.set_experiment("prod")
        with mlflow.start_span("agent", span_type="AGENT") as root:
            root.set_inputs({"question": "Who designed the Eiffel Tower?"})
            with mlflow.start_span("get_context", span_type="RETRIEVER") as s:
                s.set_inputs({"query": "Eiffel Tower designer"})
                s.set_outputs([])
            with mlflow.start_span("get_context", span_type="RETRIEVER") as s:
                s.set_inputs({"query": "eiffel tower designer"})
                s.set_outputs([])
            with mlflow.start_span("search", span_type="RETRIEVER") as s:
                s.set_inputs({"query": "Eiffel Tower engineer"})
                s.set_outputs(
                    [{"page_content": "Gustave Eiffel's company built it.", "metadata": {"doc_uri": "d2"}}]
                )
            root.set_outputs({"answer": "Stephen Sauvestre"})
        mlflow.flush_trace_async_logging()  # spans are exported in a background thread
        trace_id = mlflow.get_last_active_trace_id()
        full = mlflow.get_trace(trace_id).to_json()
    finally:
        mlflow.set_tracking_uri(None)
    path = tmp_path / "trace.json"
    path.write_text(full, encoding="utf-8")
    (pt,), skipped = read_trace_file(path)
    assert skipped == [] and [s["n_results"] for s in pt.steps] == [0, 0, 1]
    sig = compute_signals(to_trace(pt), trace_id=pt.trace_id, known_entities={"eiffel-tower"})
    assert [(h.kind, h.steps) for h in sig.hits] == [
        ("empty_retrieval", (1, 2)),
        ("fell_back_to_raw", (3,)),
        ("looped", (1, 2)),
        ("answer_unsupported", ()),
    ]
    assert sig.fallback_docs == ("d2",) and sig.empty_lookups == (
        "Eiffel Tower designer",
        "eiffel tower designer",
    )


def test_every_kind_is_reported_even_at_zero() -> None:
    assert list(aggregate_signals([]).by_kind) == list(SIGNAL_KINDS)
    assert aggregate_signals([]).metrics()["signals_traces"] == 0.0


def test_a_kitune_episode_exported_as_chat_keeps_its_signals() -> None:
    from kitune.service.workflows.signals import to_chat_record

    trace = episode(
        [
            tool("search", query="Lyon"),  # refused by the fallback gate: not a query error
            tool("get_context", query="Who founded Lyon?"),
            tool("get_context", query="lyon founder"),
            tool("get_context", query="Lyon  founder!"),
            tool("search", query="Lyon city"),
            tool("get_by_doc_id", docid="d9"),
            *[tool("get_by_doc_id", docid="d3")] * 3,  # the third is blocked: a loop, not an error
            answer("Munatius Plancus"),
        ],
        "Who founded Lyon?",
        {"lyon founder": [PARIS], "Lyon  founder!": [PARIS]},
    )
    original = compute_signals(trace, trace_id="t", known_entities={"paris"})
    record = to_chat_record(trace, trace_id="t")
    assert "gold_answer" not in record and "correct" not in record
    back = compute_signals(to_trace(parse_openai_record(record)), trace_id="t", known_entities={"paris"})
    assert [(h.kind, h.steps) for h in back.hits] == [(h.kind, h.steps) for h in original.hits]
    assert [h.kind for h in original.hits] == [
        "empty_retrieval",
        "fell_back_to_raw",
        "looped",
        "answer_unsupported",
        "coverage_gap",
        "query_error",
    ]
    assert back.fallback_docs == original.fallback_docs == ("d3",)
    assert back.kis_shown == original.kis_shown == (PARIS.id,)
