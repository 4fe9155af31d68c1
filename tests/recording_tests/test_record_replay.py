"""--record DIR / --replay DIR: a run recorded against a scripted provider replays offline, identically."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kitune.cli import _register, app
from kitune.lm import reset_format_memory
from kitune.recording import reset_recorders
from kitune.testing.openai_stub import RecordedRequest, Reply, StubServer


def _responder(req: RecordedRequest) -> Reply:
    msgs = req.body.get("messages", [])
    system = msgs[0]["content"] if msgs and isinstance(msgs[0].get("content"), str) else ""
    if system.startswith("You answer a question"):  # the eval agent (JSON protocol)
        question = msgs[1]["content"]
        if not any("Observation from search" in str(m.get("content")) for m in msgs):
            return Reply.ok(
                json.dumps({"tool": "search", "args": {"query": question[10:60]}}), usage=(300, 20)
            )
        return Reply.ok(
            json.dumps({"answer": {"explanation": "see [d]", "exact_answer": "Lunenburg", "confidence": 60}}),
            usage=(900 + len(msgs), 25),
        )
    text = json.dumps(msgs)
    if "correct_answer" in text:  # the judge (DSPy ChatAdapter)
        verdict = "yes" if "Lunenburg" in text.split("correct_answer", 1)[-1][:400] else "no"
        body = (
            f"[[ ## grading ## ]]\nextracted_final_answer: Lunenburg\nreasoning: r\ncorrect: {verdict}\n"
            "confidence: 70\n\n[[ ## completed ## ]]"
        )
        return Reply.ok(body, usage=(200, 30))
    return Reply.ok('{"facts": []}', usage=(500, 5))


@pytest.fixture
def fresh() -> Iterator[None]:
    reset_recorders()
    reset_format_memory()
    yield
    reset_recorders()
    reset_format_memory()


def _config(root: Path, name: str) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(
        f"workdir: {root / name}\n"
        "embedder: {type: hash, dim: 64}\n"
        "lm:\n  gateway: {base_url_env: KI_GW_URL, api_key_env: KI_GW_KEY, default_model: stub-small}\n",
        encoding="utf-8",
    )
    return path


def _run_dir(root: Path, name: str) -> Path:
    (run,) = (root / name / "runs").iterdir()
    return run


def _traces(run: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run / "traces.jsonl").read_text(encoding="utf-8").splitlines()]
    for r in rows:  # wall time includes real tool time, which is not replayed
        r.pop("wall_time_s")
    return sorted(rows, key=lambda r: r["query_id"])


def test_eval_recorded_then_replayed_offline_is_identical(
    tmp_path: Path, fixture_dir: Path, monkeypatch: pytest.MonkeyPatch, fresh: None
) -> None:
    _register()
    rec_dir = tmp_path / "rec"
    args = ["eval", "--skill", "baseline", "--data", str(fixture_dir), "--limit", "2", "--concurrency", "1"]
    with StubServer(responder=_responder) as stub:
        monkeypatch.setenv("KI_GW_URL", stub.base_url)
        monkeypatch.setenv("KI_GW_KEY", "sk-stub-0000")
        r1 = CliRunner().invoke(
            app, [*args, "--config", str(_config(tmp_path, "a")), "--record", str(rec_dir)]
        )
        assert r1.exit_code == 0, r1.output
        provider_calls = len(stub.chat_requests)
    calls = [json.loads(x) for x in (rec_dir / "calls.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(calls) == provider_calls == 6  # 2 questions x (search + answer + judge)
    assert sorted({c["role"] for c in calls}) == ["agent", "judge"]
    first = calls[0]
    assert len(first["hash"]) == 64 and first["finish_reason"] == "stop" and first["error"] is None
    assert first["usage"]["input_tokens"] == 300 and first["ledger"][0]["output_tokens"] == 20
    assert f"recorded 6 LLM call(s) to {rec_dir / 'calls.jsonl'}" in r1.output.replace("\n", "")

    # Replay: the provider is gone, its env vars too, and the work folder is new.
    monkeypatch.delenv("KI_GW_URL")
    monkeypatch.delenv("KI_GW_KEY")
    reset_format_memory()
    r2 = CliRunner().invoke(app, [*args, "--config", str(_config(tmp_path, "b")), "--replay", str(rec_dir)])
    assert r2.exit_code == 0, r2.output
    assert "replayed 6 LLM call(s)" in r2.output.replace("\n", "")
    a, b = _run_dir(tmp_path, "a"), _run_dir(tmp_path, "b")
    assert _traces(a) == _traces(b)
    ta = _traces(a)
    assert [t["input_tokens"] for t in ta] == [300 + 904, 300 + 904] and ta[0]["judge_status"] == "graded"
    assert json.loads((a / "usage.json").read_text()) == json.loads((b / "usage.json").read_text())
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    timing = {k for k in sa if "wall" in k or "time" in k}
    assert {k: v for k, v in sa.items() if k not in timing} == {
        k: v for k, v in sb.items() if k not in timing
    }

    def table(out: str) -> list[str]:  # every row but wall time (real tool time is not replayed)
        rows = out[out.index("metric") : out.index("traces:")].splitlines()
        return [r for r in rows if "wall time" not in r]

    assert table(r1.output) == table(r2.output) and any("correct (" in r for r in table(r2.output))


def test_replay_fails_clearly_on_an_unrecorded_call(
    tmp_path: Path, fixture_dir: Path, monkeypatch: pytest.MonkeyPatch, fresh: None
) -> None:
    _register()
    rec_dir = tmp_path / "rec"
    base = ["eval", "--skill", "closed-book", "--data", str(fixture_dir), "--no-judge", "--concurrency", "1"]
    with StubServer(responder=_responder) as stub:
        monkeypatch.setenv("KI_GW_URL", stub.base_url)
        monkeypatch.setenv("KI_GW_KEY", "sk-stub-0000")
        r1 = CliRunner().invoke(
            app, [*base, "--limit", "1", "--config", str(_config(tmp_path, "a")), "--record", str(rec_dir)]
        )
        assert r1.exit_code == 0, r1.output
    monkeypatch.delenv("KI_GW_URL")
    monkeypatch.delenv("KI_GW_KEY")
    r2 = CliRunner().invoke(
        app, [*base, "--limit", "3", "--config", str(_config(tmp_path, "b")), "--replay", str(rec_dir)]
    )
    assert r2.exit_code == 1
    out = " ".join(r2.output.split())
    assert "no recording for the agent call to openai/stub-small in stage 'eval:closed-book'" in out
    assert "The recording holds 2 agent call(s)" in out
    # the hint names the config stored next to the recording (newcomer check, issue 25)
    assert f"Replay with the config stored next to the recording (--config {tmp_path / 'a.yaml'})" in out
    assert "or re-record with --record DIR" in out
    # the miss stops the run: said once, no traceback, not a "failed question" to rerun
    assert out.count("no recording for the agent call") == 1
    assert "Traceback" not in r2.output and "RecordingMissError" not in r2.output
    assert "failed" not in out and "Rerun the same command" not in out
    # question 1 was replayed and kept; question 2 missed; question 3 was never started
    traces = (_run_dir(tmp_path, "b") / "traces.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(traces) == 1 and json.loads(traces[0])["status"] != "failed"


def test_record_and_replay_together_or_missing_dir_exit_2(tmp_path: Path) -> None:
    _register()
    both = CliRunner().invoke(
        app,
        [
            "eval",
            "--skill",
            "closed-book",
            "--data",
            str(tmp_path),
            "--record",
            str(tmp_path / "r"),
            "--replay",
            str(tmp_path / "r"),
        ],
    )
    assert both.exit_code == 2 and "not both" in both.output
    missing = CliRunner().invoke(
        app, ["extract", "--data", str(tmp_path), "--replay", str(tmp_path / "nope")]
    )
    assert missing.exit_code == 2 and "calls.jsonl" in missing.output
