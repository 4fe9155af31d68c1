"""``kitune traces import``: production traces (OpenAI chat JSONL, MLflow traces) as tuning material."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kitune.config import KituneConfig
from kitune.data.loaders import load_questions
from kitune.data.trace_formats import parse_label, parse_openai_record
from kitune.evaluation.agent import Step
from kitune.evaluation.harness import read_traces
from kitune.evaluation.metrics import Trace
from kitune.service.workflows.traces import TraceFolder, changed_files, import_traces, read_trace_file
from kitune.tracking.trackers import MlflowTracker


def conversation(i: int, question: str, final: str, **extra: object) -> dict:
    return {
        "id": f"conv-{i}",
        "messages": [
            {"role": "system", "content": "You are a research agent."},
            {"role": "user", "content": question},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "search", "arguments": json.dumps({"query": question[:20]})},
                    }
                ],
                "usage": {"prompt_tokens": 1000, "completion_tokens": 20},
            },
            {"role": "tool", "tool_call_id": "c1", "content": "x" * 1234},
            {
                "role": "assistant",
                "content": f"Explanation: found it\nExact Answer: {final}\nConfidence: 80%",
                "usage": {"prompt_tokens": 2500, "completion_tokens": 40},
            },
        ],
        **extra,
    }


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def cfg_for(tmp_path: Path) -> KituneConfig:
    return KituneConfig(workdir=tmp_path / "w")


def test_openai_conversation_gives_question_answer_steps_and_tokens() -> None:
    pt = parse_openai_record(
        conversation(1, "Which city hosts the Nobel Peace Prize?", "Oslo", gold_answer="Oslo", correct="yes")
    )
    assert pt.trace_id == "conv-1" and pt.fmt == "openai"
    assert pt.question == "Which city hosts the Nobel Peace Prize?"
    assert pt.final_answer == "Oslo" and pt.gold_answer == "Oslo" and pt.correct is True
    assert [(s["kind"], s["tool"], s["input_tokens"]) for s in pt.steps] == [
        ("tool", "search", 1000),
        ("answer", None, 2500),
    ]
    assert (
        pt.steps[0]["args"] == {"query": "Which city hosts the"} and pt.steps[0]["observation_chars"] == 1234
    )
    assert (pt.input_tokens, pt.output_tokens) == (3500, 60)


def test_openai_batch_shape_metadata_keys_and_record_usage() -> None:
    record = {
        "custom_id": "x",
        "request": {
            "body": None,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Capital of Peru?"}]}],
        },
        "response": {
            "body": {
                "choices": [{"message": {"role": "assistant", "content": "Lima"}}],
                "usage": {"prompt_tokens": 77, "completion_tokens": 3},
            }
        },
        "metadata": {"expected_answer": ["Lima", "Lima, Peru"], "label": "incorrect", "query_id": "p7"},
    }
    pt = parse_openai_record(record)
    assert pt.question == "Capital of Peru?" and pt.final_answer == "Lima"
    assert pt.gold_answer == "Lima" and pt.aliases == ("Lima, Peru",) and pt.correct is False
    assert pt.query_id == "p7" and pt.trace_id.startswith("sha256:") and pt.input_tokens == 77
    with pytest.raises(ValueError, match="no question"):
        parse_openai_record({"messages": [{"role": "assistant", "content": "hi"}]})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        ("Incorrect", False),
        ("pass", True),
        (0, False),
        (1.0, True),
        ("maybe", None),
        (None, None),
    ],
)
def test_parse_label(value: object, expected: bool | None) -> None:
    assert parse_label(value) is expected


def test_import_writes_loader_questions_and_kitune_traces_and_is_idempotent(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path)
    src = write_jsonl(
        tmp_path / "prod.jsonl",
        [
            conversation(
                1,
                "Which city hosts the Nobel Peace Prize?",
                "Oslo",
                gold_answer="Oslo",
                evidence_docids=["d5"],
            ),
            # labelled correct, no gold: the agent's answer becomes the gold answer
            conversation(
                2, "What is the capital city of Ecuador?", "Quito", correct=True, doc_ids_seen=["d4", "d9"]
            ),
            # labelled incorrect, no gold: kept as a trace, not a question
            conversation(3, "In which year was Lima founded?", "1540", correct=False),
            # same question again, different gold: the first is kept and the conflict reported
            conversation(4, "which city hosts  the Nobel Peace Prize?", "Stockholm", gold_answer="Stockholm"),
        ],
    )
    rep = import_traces(cfg, [src])
    assert (rep.read, rep.new, rep.duplicates, rep.questions_added, rep.without_gold) == (4, 4, 0, 2, 1)
    assert len(rep.conflicts) == 1 and rep.skipped == []
    folder = TraceFolder.of(cfg, "default")
    qs = load_questions(folder.questions)
    assert [(q.query, q.answer, q.evidence_docids) for q in qs] == [
        ("Which city hosts the Nobel Peace Prize?", "Oslo", ("d5",)),
        ("What is the capital city of Ecuador?", "Quito", ("d4", "d9")),
    ]
    assert qs[0].query_id == rep.conflicts[0] and qs[0].query_id.startswith("q-")
    traces = read_traces(folder.traces, latest_only=False)
    assert [t.skill for t in traces] == ["production"] * 4
    # kitune report reads the latest episode per question
    assert [t.exact_answer for t in read_traces(folder.traces)] == ["Stockholm", "Quito", "1540"]
    assert [t.judge_correct for t in traces] == [None, True, False, None]
    assert [t.judge_status for t in traces] == ["not_run", "graded", "graded", "not_run"]
    assert traces[0].em is True and traces[3].em is True  # exact match against their own gold
    assert [t.f1 for t in traces] == [1.0, 1.0, 0.0, 1.0]
    assert traces[0].input_tokens == 3500 and traces[0].tool_calls == {"search": 1}

    again = import_traces(cfg, [src])
    assert (again.new, again.duplicates, again.questions_added) == (0, 4, 0)
    assert (
        len(read_traces(folder.traces, latest_only=False)) == 4 and len(load_questions(folder.questions)) == 2
    )
    assert changed_files(folder, [src]) == []
    with src.open("a") as fh:
        fh.write(json.dumps(conversation(5, "Where is Cairo?", "Egypt", gold_answer="Egypt")) + "\n")
    assert changed_files(folder, [src]) == [src]


def test_bad_and_half_written_lines_are_skipped_and_retried(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path)
    good = json.dumps(conversation(1, "Capital of Norway?", "Oslo", gold_answer="Oslo"))
    src = tmp_path / "prod.jsonl"
    src.write_text('not json\n{"foo": 1}\n' + good + '\n{"id": "conv-2", "mess', encoding="utf-8")
    traces, skipped = read_trace_file(src)
    assert len(traces) == 1
    assert [(s.line, s.reason.split(":")[0]) for s in skipped] == [
        (1, "invalid JSON"),
        (2, "neither chat messages nor an MLflow trace"),
        (4, "incomplete last line (read again when the file changes)"),
    ]
    import_traces(cfg, [src])
    folder = TraceFolder.of(cfg, "default")
    assert changed_files(folder, [src]) == [src]  # the half-written file is read again next time
    # a complete last line that is not JSON is bad input, not a line still being written
    src.write_text(good + "\nnot json\n", encoding="utf-8")
    _traces, skipped = read_trace_file(src)
    assert [(s.line, s.reason) for s in skipped] == [(2, "invalid JSON: Expecting value")]


# --- MLflow traces ------------------------------------------------------------------------


def _episode(qid: str, correct: bool) -> Trace:
    steps = [
        Step(
            1,
            "tool",
            "get_context",
            {"query": "capital of Ecuador"},
            800,
            ("d4",),
            None,
            1500,
            30,
            latency_s=0.2,
        ),
        Step(2, "answer", None, {}, 0, (), None, 2600, 50, latency_s=0.3),
    ]
    return Trace(
        query_id=qid,
        skill="in-context",
        question="What is the capital city of Ecuador?",
        gold_answer="Quito",
        status="answered",
        exact_answer="Quito" if correct else "Guayaquil",
        judge_correct=correct,
        judge_status="graded",
        input_tokens=4100,
        output_tokens=80,
        steps=[s.to_dict() for s in steps],
        n_steps=2,
        wall_time_s=1.0,
    )


def test_mlflow_traces_round_trip_from_search_traces_rows_and_trace_json(tmp_path: Path) -> None:
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'prod' / 'mlflow.db'}", experiment="prod-agent")
    with tracker.run("production") as h:
        ids = tracker.log_episodes([_episode("e1", True), _episode("e2", False)], name="prod")
    assert len(ids) == 2 and h.run_id
    import mlflow

    mlflow.set_tracking_uri(tracker.tracking_uri)
    try:
        df = mlflow.search_traces(locations=[tracker.experiment_id])
    finally:
        mlflow.set_tracking_uri(None)
    rows = tmp_path / "rows.jsonl"
    df.to_json(rows, orient="records", lines=True)
    traces, skipped = read_trace_file(rows)
    assert skipped == [] and sorted(t.trace_id for t in traces) == sorted(ids)
    by_q = {t.query_id: t for t in traces}
    e1, e2 = by_q["e1"], by_q["e2"]
    assert e1.fmt == "mlflow" and e1.question == "What is the capital city of Ecuador?"
    assert (e1.final_answer, e1.correct, e2.final_answer, e2.correct) == ("Quito", True, "Guayaquil", False)
    assert e1.input_tokens == 4100 and [s["input_tokens"] for s in e1.steps] == [1500, 2600]
    assert [(s["kind"], s["tool"]) for s in e1.steps] == [("tool", "get_context"), ("answer", None)]
    assert e1.doc_ids_seen == ("d4",)

    # Trace.to_json() with assessments: gold from an expectation, label from a feedback
    from mlflow.entities import Expectation, Feedback

    full = json.loads(tracker.client.get_trace(ids[1]).to_json())
    full["info"]["assessments"] = [
        Expectation(name="expected_response", value="Quito", trace_id=ids[1]).to_dictionary(),
        Feedback(name="correctness", value=False, trace_id=ids[1]).to_dictionary(),
    ]
    full["info"]["tags"].pop("kitune.correct")
    one = tmp_path / "one.json"
    one.write_text(json.dumps(full), encoding="utf-8")
    (pt,), _ = read_trace_file(one)
    assert (pt.gold_answer, pt.correct, pt.final_answer) == ("Quito", False, "Guayaquil")
    rep = import_traces(cfg_for(tmp_path), [one, rows])
    # e2 (gold from its expectation) and e1 (labelled correct: its answer is the gold)
    assert (rep.new, rep.duplicates, rep.questions_added, rep.without_gold) == (2, 1, 2, 0)
