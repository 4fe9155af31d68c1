"""Tests for kitune.tracking.trackers (cases M1, M2) and the RecordingTracker double."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dspy
import pytest

from kitune.errors import TrackingError
from kitune.optimizers.artifacts import log_candidate, log_program_state
from kitune.optimizers.protocols import Tracker
from kitune.testing.tracking import RecordingTracker
from kitune.tracking.trackers import (
    MAX_PARAM_CHARS,
    MlflowTracker,
    NullTracker,
    prepare_params,
    sanitize_name,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("recall@10", "recall_at_10"),
        ("judge:model", "judge_model"),
        ("acc[k=5]", "acc_k_5"),
        ("plain_name-1.0 /x", "plain_name-1.0 /x"),
        ("é", "_"),
    ],
)
def test_sanitize_name(raw: str, expected: str) -> None:
    assert sanitize_name(raw) == expected


def test_sanitize_name_long_is_cut_with_hash() -> None:
    a, b = sanitize_name("x" * 300), sanitize_name("x" * 301)
    assert len(a) == 250 and len(b) == 250 and a != b


def test_prepare_params_moves_long_value_to_artifact() -> None:
    prepared = prepare_params({"optimized_instruction": "x" * 7000, "judge:model": "m-large", "max_iters": 8})
    value = prepared.params["optimized_instruction"]
    assert len(value) <= MAX_PARAM_CHARS and "…[sha256:" in value
    assert prepared.params["optimized_instruction.artifact"] == "params/optimized_instruction.txt"
    assert prepared.long_values == {"params/optimized_instruction.txt": "x" * 7000}
    assert prepared.params["judge_model"] == "m-large"
    assert prepared.params["max_iters"] == "8"
    assert prepared.renamed == {"judge:model": "judge_model"}


def test_recording_tracker_m1_rules_and_name_map_once() -> None:
    tracker = RecordingTracker()
    assert isinstance(tracker, Tracker)
    with tracker.run("r", {"optimized_instruction": "y" * 7000}) as handle:
        tracker.log_metrics({"recall@10": 0.41, "acc[k=5]": 0.7}, step=1)
        tracker.log_metrics({"recall@10": 0.5}, step=2)
    run = tracker.by_name("r")
    assert run.run_id == handle.run_id and run.status == "FINISHED"
    assert run.artifacts["params/optimized_instruction.txt"] == "y" * 7000
    assert run.history("recall_at_10") == [(1, 0.41), (2, 0.5)]
    assert run.metrics["acc_k_5"] == 0.7
    assert json.loads(run.artifacts["tracking/name_map.json"]) == {
        "acc[k=5]": "acc_k_5",
        "recall@10": "recall_at_10",
    }
    assert tracker.failures == ()


def test_failures_are_counted_never_raised() -> None:
    tracker = RecordingTracker(fail_on=("log_text",))
    with tracker.run("r"):
        tracker.log_metrics({"ok": 1.0, "bad": float("nan"), "worse": "high"})  # type: ignore[dict-item]
        tracker.log_text("hello", "notes.txt")
        tracker.log_artifact("/definitely/not/here.txt")
    run = tracker.by_name("r")
    assert run.metrics["ok"] == 1.0 and "bad" not in run.metrics
    ops = sorted(f.operation for f in tracker.failures)
    assert ops == ["log_artifact", "log_metrics", "log_metrics", "log_text"]
    assert run.metrics["kitune.tracking_failures"] == 4.0


def test_no_open_run_is_a_failure_not_a_new_run() -> None:
    tracker = RecordingTracker()
    tracker.log_metrics({"m": 1.0})
    assert tracker.runs == []
    assert len(tracker.failures) == 1 and "pass run_id" in tracker.failures[0].error


def test_failed_block_marks_run_failed_and_propagates() -> None:
    tracker = RecordingTracker()
    with pytest.raises(ZeroDivisionError), tracker.run("boom"):
        1 / 0  # noqa: B018
    assert tracker.by_name("boom").status == "FAILED"


def test_create_run_failure_does_not_abort() -> None:
    tracker = RecordingTracker(fail_on=("create_run",))
    with tracker.run("r", {"a": 1}) as handle:
        tracker.log_metrics({"m": 1.0})
    assert handle.run_id is None
    assert next(f.operation for f in tracker.failures) == "create_run"


def test_nested_runs_and_null_tracker() -> None:
    tracker = RecordingTracker()
    with tracker.run("outer") as outer, tracker.run("inner") as inner:
        tracker.log_metrics({"m": 2.0})
    assert inner.parent_run_id == outer.run_id
    assert tracker.by_name("inner").metrics == {"m": 2.0} and tracker.by_name("outer").metrics == {}
    null = NullTracker()
    with null.run("x", {"p": "v"}) as h:
        null.log_metrics({"m": 1.0})
    assert h.run_id == "null-1" and null.failures == ()


def test_two_trackers_do_not_hide_each_others_run() -> None:
    a, b = RecordingTracker(), RecordingTracker()
    with a.run("a"), b.run("b"):
        a.log_metrics({"m": 1.0})
        b.log_metrics({"m": 2.0})
    assert a.by_name("a").metrics == {"m": 1.0} and b.by_name("b").metrics == {"m": 2.0}


# --- the real MlflowTracker against one SQLite DB per module -----------------------------


@pytest.fixture(scope="module")
def mlflow_tracker(tmp_path_factory: pytest.TempPathFactory) -> MlflowTracker:
    root = tmp_path_factory.mktemp("mlflow")
    tracker = MlflowTracker(f"sqlite:///{root / 'mlflow.db'}", experiment="kitune-test")
    tracker.check()
    return tracker


def test_mlflow_m1_long_params_and_odd_names(mlflow_tracker: MlflowTracker) -> None:
    with mlflow_tracker.run(
        "m1", {"optimized_instruction": "x" * 7000, "judge:model": "m-large", "max_iters": 8}
    ) as h:
        mlflow_tracker.log_metrics({"recall@10": 0.41, "acc[k=5]": 0.70}, step=0)
    assert h.run_id is not None
    client = mlflow_tracker.client
    run = client.get_run(h.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["judge_model"] == "m-large" and run.data.params["max_iters"] == "8"
    assert len(run.data.params["optimized_instruction"]) <= 500
    assert run.data.params["optimized_instruction.artifact"] == "params/optimized_instruction.txt"
    assert run.data.metrics == {"recall_at_10": 0.41, "acc_k_5": 0.70}
    art = Path(run.info.artifact_uri.removeprefix("file://"))
    assert (art / "params" / "optimized_instruction.txt").read_text() == "x" * 7000
    assert json.loads((art / "tracking" / "name_map.json").read_text())["recall@10"] == "recall_at_10"
    assert mlflow_tracker.failures == ()


def test_mlflow_m2_async_tasks_and_worker_thread(mlflow_tracker: MlflowTracker) -> None:
    client = mlflow_tracker.client
    before = len(client.search_runs([mlflow_tracker.experiment_id]))

    async def trial(name: str, delay: float) -> str | None:
        with mlflow_tracker.run(name) as handle:
            mlflow_tracker.log_params({"name": name})
            await asyncio.sleep(delay)
            mlflow_tracker.log_metrics({"m": delay})
        return handle.run_id

    async def both() -> list[str | None]:
        return list(await asyncio.gather(trial("run1", 0.3), trial("run2", 0.1)))

    id1, id2 = asyncio.run(both())
    assert id1 and id2
    r1, r2 = client.get_run(id1), client.get_run(id2)
    assert (r1.data.params["name"], r1.data.metrics["m"]) == ("run1", 0.3)
    assert (r2.data.params["name"], r2.data.metrics["m"]) == ("run2", 0.1)

    with mlflow_tracker.run("parent") as parent:
        with ThreadPoolExecutor(max_workers=2) as pool:
            # No context in the worker: it resolves to the only open run.
            pool.submit(mlflow_tracker.log_metrics, {"judge_latency": 1.3}).result()
            pool.submit(mlflow_tracker.log_metrics, {"by_id": 2.0}, run_id=parent.run_id).result()
    assert parent.run_id
    assert client.get_run(parent.run_id).data.metrics == {"judge_latency": 1.3, "by_id": 2.0}
    after = client.search_runs([mlflow_tracker.experiment_id])
    assert len(after) == before + 3  # run1, run2, parent: no stray auto-created runs
    assert mlflow_tracker.failures == ()


def test_mlflow_program_state_is_json(mlflow_tracker: MlflowTracker) -> None:
    program = dspy.Predict("question -> answer")
    program.signature = program.signature.with_instructions("Answer in one word.")
    with mlflow_tracker.run("prog") as h:
        log_program_state(mlflow_tracker, program, "program/extractor.json")
    assert h.run_id
    run = mlflow_tracker.client.get_run(h.run_id)
    data = json.loads(
        (Path(run.info.artifact_uri.removeprefix("file://")) / "program" / "extractor.json").read_text()
    )
    assert data["signature"]["instructions"] == "Answer in one word."
    with pytest.raises(ValueError, match="json"):
        log_program_state(mlflow_tracker, program, "program/extractor.pkl")


def test_mlflow_bad_uri_fails_fast_on_check_but_never_in_run(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    tracker = MlflowTracker(f"sqlite:///{blocker / 'sub' / 'mlflow.db'}")
    with pytest.raises(TrackingError, match="tracking"):
        tracker.check()
    with tracker.run("r") as h:
        tracker.log_metrics({"m": 1.0})
    assert h.run_id is None
    assert [f.operation for f in tracker.failures][:1] == ["create_run"]
    with pytest.raises(TrackingError, match="tracking_uri"):
        MlflowTracker("")


def test_telemetry_is_off_even_if_mlflow_was_imported_first(monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow  # noqa: F401 - imported before kitune turns telemetry off
    from mlflow.telemetry import get_telemetry_client

    from kitune.tracking.trackers import disable_mlflow_telemetry

    monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY", raising=False)
    monkeypatch.delenv("DO_NOT_TRACK", raising=False)
    disable_mlflow_telemetry()
    import os

    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true" and os.environ["DO_NOT_TRACK"] == "true"
    assert get_telemetry_client() is None


def test_log_candidate_writes_one_file_per_predictor() -> None:

    tracker = RecordingTracker()
    with tracker.run("iter-1"):
        files = log_candidate(tracker, {"extract.predict": "Extract facts.", "rewrite/plan": "Plan."})
    run = tracker.by_name("iter-1")
    assert files == {
        "extract.predict": "prompts/extract.predict.txt",
        "rewrite/plan": "prompts/rewrite_plan.txt",
    }
    assert run.artifacts["prompts/rewrite_plan.txt"] == "Plan."
    assert json.loads(run.artifacts["prompts/candidate.json"])["extract.predict"] == "Extract facts."


def test_mlflow_missing_is_a_tracking_error_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if mlflow were not installed
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(TrackingError, match="pip install"):
        tracker.check()
    with tracker.run("r") as handle:
        tracker.log_metrics({"m": 1.0})
    assert handle.run_id is None and tracker.failures[0].operation == "create_run"


def test_create_tracker_from_config(tmp_path: Path) -> None:
    from kitune.config import load_config
    from kitune.tracking.trackers import create_tracker

    cfg = load_config(None, {"workdir": str(tmp_path), "tracking.experiment": "exp-a"})
    tracker = create_tracker(cfg)
    assert isinstance(tracker, MlflowTracker)
    assert tracker.tracking_uri == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert tracker.experiment == "exp-a"
    assert isinstance(create_tracker(cfg, enabled=False), NullTracker)


def test_worker_thread_resolves_innermost_of_one_chain_but_not_siblings() -> None:
    tracker = RecordingTracker()
    with tracker.run("loop") as loop_run, tracker.run("iteration-1") as it:
        with ThreadPoolExecutor(max_workers=1) as pool:
            pool.submit(tracker.log_metrics, {"q_latency": 0.5}).result()

            def child_from_worker() -> str | None:
                with tracker.run("question-1", parent_run_id=it.run_id) as q:
                    tracker.log_metrics({"steps": 3.0})
                return q.parent_run_id

            assert pool.submit(child_from_worker).result() == it.run_id
    assert tracker.by_name("iteration-1").metrics == {"q_latency": 0.5}
    assert tracker.by_name("question-1").metrics == {"steps": 3.0}
    assert tracker.by_name("loop").metrics == {} and loop_run.run_id

    # A worker thread started while two sibling runs are open cannot guess: recorded, not misfiled.
    started = []

    async def siblings_with_worker() -> None:
        async def one(name: str) -> None:
            with tracker.run(name):
                started.append(name)
                await asyncio.sleep(0.1)

        async def worker() -> None:
            while len(started) < 2:
                await asyncio.sleep(0.01)
            # run_in_executor does not carry the task's context into the thread.
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, lambda: tracker.log_metrics({"orphan": 1.0}))

        await asyncio.gather(one("s3"), one("s4"), worker())

    asyncio.run(siblings_with_worker())
    assert "orphan" not in tracker.by_name("s3").metrics and "orphan" not in tracker.by_name("s4").metrics
    assert "2 sibling runs are open" in tracker.failures[-1].error


# -- issue 25: an unreachable tracking server costs seconds, not ~250 s per call ----------------------

UNREACHABLE_RUN = """
import json, os, socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()  # a closed port
uri = f"http://127.0.0.1:{port}"
from kitune.tracking.prompts import PromptRegistry
from kitune.tracking.trackers import MlflowTracker
t0 = time.monotonic()
tracker = MlflowTracker(uri, "probe")
with tracker.run("eval", {"skill": "baseline"}):
    tracker.log_metrics({"accuracy": 0.5})
t1 = time.monotonic()
tracker.log_metrics({"accuracy": 0.5}, run_id="0123abcd")  # a run id from elsewhere: nothing is sent
tracker.log_text("notes", "notes.txt", run_id="0123abcd")
t2 = time.monotonic()
try:
    PromptRegistry(uri).get("kitune-corpus-extractor", "production")
    registry = "read"
except Exception as e:
    registry = type(e).__name__
t3 = time.monotonic()
print(json.dumps({
    "failures": [[f.operation, f.error] for f in tracker.failures],
    "registry": registry,
    "seconds": [t1 - t0, t2 - t1, t3 - t2],
    "env": {k: os.environ[k] for k in sorted(os.environ) if k.startswith("MLFLOW_HTTP_REQUEST_")},
    "uri": uri,
}))
"""


def test_an_unreachable_tracking_server_lets_the_process_exit_within_seconds(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    src = Path(__file__).resolve().parents[2] / "src"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST_")}
    env["PYTHONPATH"] = str(src)
    # MLflow's defaults retry each call for ~250 s. The bound below is a correctness bound, not a
    # benchmark: it is taken on the tracking calls alone (the child's own clock), not on the
    # child's start-up, whose imports take anywhere from 3 to 30 s on a loaded 2-core machine.
    done = subprocess.run(
        [sys.executable, "-c", UNREACHABLE_RUN],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["seconds"][0] + out["seconds"][2] < 60, out["seconds"]  # bounded retries: ~3 s each
    assert out["env"] == {
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
    }
    ops = [op for op, _ in out["failures"]]
    assert ops == ["create_run", "log_params", "log_metrics", "log_metrics", "log_text"]
    first = out["failures"][0][1]
    assert first.startswith(f"TrackingError: cannot open MLflow experiment 'probe' at '{out['uri']}'")
    assert "Connection refused" in first
    assert [e for _, e in out["failures"][1:3]] == ["TrackingError: the run could not be created"] * 2
    for _, error in out["failures"][3:]:  # sent nothing: the server was found unreachable
        assert error.startswith(
            f"TrackingError: not sent: the MLflow tracking server at {out['uri']} could not be reached "
            f"earlier in this run (ConnectionError: HTTPConnectionPool(host='127.0.0.1', "
            f"port={out['uri'].rsplit(':', 1)[1]}): Max retries exceeded"
        )
    assert out["seconds"][1] < 2.0  # the two skipped calls made no request (one retry alone backs off 1 s)
    # the prompt registry's calls are bounded by the same settings (it fails with MLflow's own error)
    assert out["registry"] != "read" and out["seconds"][2] < 10


def test_user_set_mlflow_http_settings_win_and_answers_are_not_unreachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    import requests
    from mlflow.exceptions import MlflowException

    from kitune.tracking.mlflow_tracker import is_unreachable, prepare_mlflow_env

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "7")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    prepare_mlflow_env()
    assert (os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"], os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"]) == (
        "7",
        "15",
    )
    try:
        try:
            raise requests.exceptions.ConnectionError("refused")
        except Exception as e:
            raise MlflowException(f"API request failed with exception {e}")  # noqa: B904 - as MLflow does
    except MlflowException as wrapped:
        assert is_unreachable(wrapped)
    assert not is_unreachable(MlflowException("RESOURCE_DOES_NOT_EXIST: no such run"))  # the server answered
    assert not is_unreachable(TrackingError("no cause"))
