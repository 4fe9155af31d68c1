"""Agent episodes as MLflow traces (``Tracker.log_episodes``) and explicit run nesting (issue 12, item 8)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kitune.evaluation.agent import Step
from kitune.evaluation.metrics import Trace
from kitune.testing.tracking import RecordingTracker
from kitune.tracking.trackers import MlflowTracker, NullTracker, episode_record


def _trace(qid: str, *, correct: bool | None, status: str = "answered") -> Trace:
    steps = [
        Step(
            1,
            "tool",
            "search",
            {"query": "twin towns of Kobe"},
            900,
            ("d1", "d2"),
            None,
            1200,
            40,
            latency_s=0.5,
            reply='{"tool": "search"}',
        ),
        Step(2, "tool", "get_by_doc_id", {"doc_id": "d2"}, 3000, ("d2",), None, 2500, 30, latency_s=0.25),
        Step(3, "lm_error", None, {}, 0, (), "LMTimeoutError: timed out", 0, 0, latency_s=1.0),
        Step(4, "answer", None, {}, 0, (), None, 4100, 60, latency_s=0.75, reply="Exact Answer: Seattle"),
    ]
    return Trace(
        query_id=qid,
        skill="in-context",
        question=f"Which city ... ({qid})?",
        gold_answer="Seattle",
        status=status,
        exact_answer="Seattle" if correct else "Portland",
        judge_correct=correct,
        judge_status="graded" if correct is not None else "grader_error",
        input_tokens=sum(s.input_tokens for s in steps),
        output_tokens=sum(s.output_tokens for s in steps),
        steps=[s.to_dict() for s in steps],
        n_steps=len(steps),
        wall_time_s=3.0,
        failure="LMAuthError: 401 invalid key" if status == "failed" else None,
    )


TRACES = [
    _trace("q1", correct=True),
    _trace("q2", correct=False),
    _trace("q3", correct=None, status="failed"),
]


def test_episode_record_lays_steps_out_with_their_tokens() -> None:
    rec = episode_record(TRACES[1], name="iteration-0/tune", start_ns=10**18, failure_kind="wrong_entity")
    assert rec.name == "iteration-0/tune/q2" and rec.ok is True
    assert [s.name for s in rec.steps] == [
        "step 1: search",
        "step 2: get_by_doc_id",
        "step 3: lm_error",
        "step 4: answer",
    ]
    assert [s.span_type for s in rec.steps] == ["TOOL", "TOOL", "LLM", "LLM"]
    assert [s.attributes["kitune.input_tokens"] for s in rec.steps] == [1200, 2500, 0, 4100]
    assert rec.input_tokens == TRACES[1].input_tokens == 7800
    # back to back from start_ns, each lasting its latency; the root covers the 3 s wall time
    assert [(s.start_ns - 10**18, s.end_ns - 10**18) for s in rec.steps] == [
        (0, 500_000_000),
        (500_000_000, 750_000_000),
        (750_000_000, 1_750_000_000),
        (1_750_000_000, 2_500_000_000),
    ]
    assert rec.end_ns - rec.start_ns == 3_000_000_000
    assert rec.steps[2].error == "LMTimeoutError: timed out" and rec.steps[0].error is None
    assert rec.steps[0].inputs == {"query": "twin towns of Kobe"}
    assert rec.steps[0].attributes["kitune.doc_ids"] == ["d1", "d2"]
    assert rec.tags == {
        "kitune.query_id": "q2",
        "kitune.skill": "in-context",
        "kitune.status": "answered",
        "kitune.correct": "false",
        "kitune.failure_kind": "wrong_entity",
    }


def test_long_tool_args_are_cut() -> None:
    t = _trace("q1", correct=True)
    steps = [dict(t.steps[0], args={"query": "x" * 5000})]
    rec = episode_record(Trace(**{**t.to_dict(), "steps": steps}), name="n", start_ns=0)
    assert len(rec.steps[0].inputs["query"]) == 2000 and rec.steps[0].inputs["query"].endswith("…")


def test_recording_and_null_trackers_log_episodes_to_the_run() -> None:
    tracker = RecordingTracker()
    with tracker.run("iteration-0") as h:
        ids = tracker.log_episodes(TRACES, name="iteration-0/tune", failure_kinds={"q2": "wrong_number"})
    run = tracker.by_name("iteration-0")
    assert ids == [f"{h.run_id}-trace-1", f"{h.run_id}-trace-2", f"{h.run_id}-trace-3"]
    assert [e.query_id for e in run.episodes] == ["q1", "q2", "q3"]
    assert [e.ok for e in run.episodes] == [True, True, False]
    assert run.episodes[1].tags["kitune.failure_kind"] == "wrong_number"
    # episodes of one call do not overlap and keep their order
    assert all(a.end_ns < b.start_ns for a, b in zip(run.episodes, run.episodes[1:], strict=False))
    # without failure_kinds each trace is classified (kitune.evaluation.failures)
    with tracker.run("iteration-1"):
        tracker.log_episodes(TRACES, name="it1")
    tags = [e.tags.get("kitune.failure_kind") for e in tracker.by_name("iteration-1").episodes]
    assert tags == [None, "wrong_entity", "failed"]
    null = NullTracker()
    with null.run("x"):
        assert null.log_episodes(TRACES[:2]) == ["null-trace-1", "null-trace-2"]
    assert null.failures == ()


def test_log_episodes_without_a_run_or_with_a_failing_backend_never_raises() -> None:
    tracker = RecordingTracker()
    assert tracker.log_episodes(TRACES) == []
    assert tracker.failures[0].operation == "log_episodes"
    failing = RecordingTracker(fail_on=("log_episode",))
    with failing.run("r"):
        assert failing.log_episodes(TRACES[:2], name="val") == []
    assert [f.target for f in failing.failures] == ["val/q1", "val/q2"]
    assert failing.by_name("r").metrics["kitune.tracking_failures"] == 2.0


def test_nested_false_opens_a_top_level_run() -> None:
    tracker = RecordingTracker()
    with tracker.run("optimize") as parent:
        with tracker.run("iteration-0") as child:
            pass
        with tracker.run("unrelated", nested=False) as top:
            pass
    assert child.parent_run_id == parent.run_id and top.parent_run_id is None
    assert tracker.by_name("unrelated").parent_run_id is None


# --- against MLflow on SQLite ------------------------------------------------------------


@pytest.fixture(scope="module")
def mlflow_tracker(tmp_path_factory: pytest.TempPathFactory) -> MlflowTracker:
    root = tmp_path_factory.mktemp("mlflow-episodes")
    tracker = MlflowTracker(f"sqlite:///{root / 'mlflow.db'}", experiment="kitune-episodes")
    tracker.check()
    return tracker


def test_mlflow_parent_run_with_nested_iteration_runs(mlflow_tracker: MlflowTracker) -> None:
    client = mlflow_tracker.client
    with mlflow_tracker.run("optimize", {"iterations": 2}, tags={"kitune.kind": "optimize"}) as parent:
        children = []
        for i in range(2):
            with mlflow_tracker.run(f"iteration-{i}", tags={"kitune.kind": "iteration"}) as it:
                mlflow_tracker.log_metrics({"tune_accuracy": 0.5 + i / 10}, step=i)
                children.append(it.run_id)
    assert parent.run_id and all(children)
    found = client.search_runs(
        [mlflow_tracker.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.run_id}'"
    )
    assert sorted(r.info.run_id for r in found) == sorted(children)
    assert sorted(r.info.run_name for r in found) == ["iteration-0", "iteration-1"]
    assert client.get_run(children[1]).data.metrics == {"tune_accuracy": 0.6}
    assert "mlflow.parentRunId" not in client.get_run(parent.run_id).data.tags
    assert client.get_run(parent.run_id).data.tags["kitune.kind"] == "optimize"
    assert mlflow_tracker.failures == ()


def test_mlflow_episodes_are_traces_with_a_span_per_step(mlflow_tracker: MlflowTracker) -> None:
    client = mlflow_tracker.client
    with mlflow_tracker.run("iteration-0") as h:
        ids = mlflow_tracker.log_episodes(
            TRACES, name="iteration-0/validation", failure_kinds={"q2": "wrong_entity"}
        )
    assert h.run_id and len(ids) == 3 and mlflow_tracker.failures == ()
    linked = client.search_traces(locations=[mlflow_tracker.experiment_id], run_id=h.run_id)
    assert sorted(t.info.trace_id for t in linked) == sorted(ids)

    trace = client.get_trace(ids[1])
    assert trace.info.trace_metadata["mlflow.sourceRun"] == h.run_id
    assert trace.info.tags["mlflow.traceName"] == "iteration-0/validation/q2"
    assert trace.info.tags["kitune.failure_kind"] == "wrong_entity"
    assert trace.info.tags["kitune.correct"] == "false"
    assert trace.info.request_preview == "Which city ... (q2)?" and trace.info.response_preview == "Portland"
    assert trace.info.state.value == "OK"
    spans = trace.data.spans
    root = next(s for s in spans if s.parent_id is None)
    steps = sorted((s for s in spans if s.parent_id is not None), key=lambda s: s.start_time_ns)
    assert root.span_type == "AGENT" and root.inputs == {"question": "Which city ... (q2)?"}
    assert root.attributes["kitune.input_tokens"] == 7800
    assert all(s.parent_id == root.span_id for s in steps)
    assert [s.name for s in steps] == [
        "step 1: search",
        "step 2: get_by_doc_id",
        "step 3: lm_error",
        "step 4: answer",
    ]
    assert [s.attributes["kitune.input_tokens"] for s in steps] == [1200, 2500, 0, 4100]
    assert [s.attributes["kitune.output_tokens"] for s in steps] == [40, 30, 0, 60]
    assert steps[0].attributes["kitune.tool"] == "search"
    assert steps[0].inputs == {"query": "twin towns of Kobe"}
    assert steps[0].attributes["mlflow.chat.tokenUsage"] == {
        "input_tokens": 1200,
        "output_tokens": 40,
        "total_tokens": 1240,
    }
    assert steps[2].status.status_code.value == "ERROR"
    assert steps[2].attributes["kitune.error"] == "LMTimeoutError: timed out"
    # MLflow sums the per-step usage into the trace's token usage
    assert trace.info.token_usage["input_tokens"] == 7800

    failed = client.get_trace(ids[2])
    assert failed.info.state.value == "ERROR" and failed.info.tags["kitune.correct"] == "ungraded"
    failed_root = next(s for s in failed.data.spans if s.parent_id is None)
    assert failed_root.status.description == "LMAuthError: 401 invalid key"
    assert failed.info.tags["kitune.failure_kind"] == "failed"  # classified when not given


def test_mlflow_episodes_of_a_broken_store_are_recorded_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    tracker = MlflowTracker(f"sqlite:///{blocker / 'sub' / 'mlflow.db'}")
    with tracker.run("r"):
        assert tracker.log_episodes(TRACES[:1]) == []
    assert "create_run" in [f.operation for f in tracker.failures]


def test_log_comparison_logs_flip_counts_and_token_deltas() -> None:
    from kitune.evaluation.comparison import compare_runs
    from kitune.tracking.trackers import log_comparison

    before = [_trace("q1", correct=False), _trace("q2", correct=True), _trace("q3", correct=True)]
    t3 = _trace("q3", correct=True)
    after = [
        _trace("q1", correct=True),
        _trace("q2", correct=False),
        Trace(**{**t3.to_dict(), "input_tokens": t3.input_tokens + 500}),
    ]
    tracker = RecordingTracker()
    with tracker.run("iteration-1"):
        metrics = log_comparison(tracker, compare_runs("it0", before, "it1", after), "tune", step=1)
    run = tracker.by_name("iteration-1")
    assert metrics["flips_fixed"] == 1.0 and metrics["flips_broken"] == 1.0 and metrics["flips_net"] == 0.0
    assert run.history("tune_flips_fixed") == [(1, 1.0)]
    assert run.metrics["tune_more_expensive"] == 1.0 and run.metrics["tune_token_delta"] == 500.0
    data = json.loads(str(run.artifacts["tune/comparison.json"]))
    assert data["flips"]["fixed"] == ["q1"] and data["flips"]["broken"] == ["q2"]
    assert data["token_deltas"][0]["query_id"] == "q3" and data["token_deltas"][0]["reasons"] == [
        "longer prompts per step"
    ]
