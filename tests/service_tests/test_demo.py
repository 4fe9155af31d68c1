"""kitune demo end to end on a 2-question slice with scripted models (marked slow)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "optimizers_tests"))
sys.path.insert(0, str(Path(__file__).parents[1] / "evaluation_tests"))

from eval_fakes import FakeCorpusStore
from loop_fakes import DOCS, make_deps, reflection_rule, task_rule, tiny_config, write_dataset
from opt_fakes import RuleLM

from kitune.data.checksum import dataset_checksum
from kitune.schema import Document
from kitune.service.workflows.demo import DemoOptions, default_demo_config, default_fixture, run_demo
from kitune.tracking.trackers import MlflowTracker


def _two_questions(tmp_path: Path) -> Path:
    """The loop fakes' dataset cut to q1 (answer in the first sentence) and q2 (a date: missed by
    the packaged extractor)."""
    data = write_dataset(tmp_path / "data")
    lines = (data / "questions.jsonl").read_text().splitlines()[:2]
    (data / "questions.jsonl").write_text("\n".join(lines) + "\n")
    return data


@pytest.mark.slow
def test_demo_end_to_end_on_two_questions(tmp_path: Path) -> None:
    data = _two_questions(tmp_path)
    cfg = tiny_config(tmp_path)
    corpus = FakeCorpusStore([Document(docid=d, title=t, text=x) for d, t, x in DOCS])
    task_lm = RuleLM(task_rule)
    deps = make_deps(task_lm, RuleLM(reflection_rule, json=True), corpus_store=corpus)
    dcfg_uri = f"sqlite:///{tmp_path / 'w' / 'demo' / 'mlflow.db'}"
    tracker = MlflowTracker(dcfg_uri, experiment="demo")
    lines: list[str] = []
    opts = DemoOptions(
        data_dir=data, questions=2, distractors=1, max_metric_calls=4, knob_trials=2, progress=False
    )
    res = run_demo(cfg, opts, deps=deps, tracker=tracker, log=lines.append)
    names = [s.name for s in res.summaries]
    assert names == ["baseline", "in-context", "in-context + disambiguation"]
    by = {s.name: s for s in res.summaries}
    assert by["in-context"].n_correct == 1  # q1 right, q2's year is not in any KI
    assert res.feedback.written == 1  # q2's failure → one disambiguation KI, retrieved for q2
    assert res.flips.fixed == ("q2",) and res.flips.newly_wrong == ()
    assert by["in-context + disambiguation"].n_correct == 2
    assert len(res.loop.history) == 1
    assert res.report.markdown.is_file() and "in-context + disambiguation" in res.report.markdown.read_text()
    assert res.mlflow_uri == dcfg_uri
    assert (res.demo_dir / "optimize" / "demo" / "fingerprint.json").is_file()
    assert any(line.startswith("step 5/5") for line in lines)
    # every arm records the dataset's checksum, as kitune eval's summary.json does
    sha = dataset_checksum(data).sha256
    assert len(sha) == 64 and [s.data_sha256 for s in res.summaries] == [sha, sha, sha]
    written = json.loads((res.demo_dir / "report" / "summary.json").read_text())
    assert [s["data_sha256"] for s in written] == [sha, sha, sha]

    # rerun: resumes; no new extraction or agent calls for the finished runs
    calls = task_lm.calls
    agent_calls = len(deps.chat_model.calls)  # type: ignore[attr-defined]
    res2 = run_demo(cfg, opts, deps=deps, tracker=tracker)
    assert [s.n_correct for s in res2.summaries] == [s.n_correct for s in res.summaries]
    assert task_lm.calls == calls and len(deps.chat_model.calls) == agent_calls  # type: ignore[attr-defined]


@pytest.mark.slow
def test_demo_names_the_documents_that_failed_to_extract(tmp_path: Path) -> None:
    # newcomer check: a document that timed out was only a "· 1 failed ·" in a progress line
    data = _two_questions(tmp_path)

    def eiffel_times_out(system: str, user: str) -> dict[str, Any]:
        if "Eiffel Tower" in user and "[[ ## correct_answer ## ]]" not in user:
            raise TimeoutError("did not answer within timeout_s=120")
        return task_rule(system, user)

    deps = make_deps(
        RuleLM(eiffel_times_out),
        RuleLM(reflection_rule, json=True),
        corpus_store=FakeCorpusStore([Document(docid=d, title=t, text=x) for d, t, x in DOCS]),
    )
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'w' / 'demo' / 'mlflow.db'}", experiment="demo")
    lines: list[str] = []
    opts = DemoOptions(data_dir=data, questions=2, distractors=1, max_metric_calls=4, progress=False)
    res = run_demo(tiny_config(tmp_path), opts, deps=deps, tracker=tracker, log=lines.append)
    assert res.extract_failed == ("d2",)
    assert (
        "extraction: 1 document(s) failed to extract (d2), so their KIs are missing from every arm; "
        "the errors are in <workdir>/demo/extraction/*.state.jsonl; rerun kitune demo to retry them "
        "(raise lm.extract.timeout_s if they timed out)"
    ) in lines
    state = next((tmp_path / "w" / "demo" / "extraction").glob("*.state.jsonl")).read_text()
    assert '"docid": "d2", "status": "failed"' in state and "did not answer within timeout_s=120" in state


def test_demo_defaults_point_into_the_package() -> None:
    assert (
        default_demo_config().parts[-3:] == ("kitune", "resources", "demo.yaml")
        and default_demo_config().is_file()
    )
    assert default_fixture().parts[-3:] == ("kitune", "resources", "fixture")


@pytest.mark.slow
def test_kitune_demo_cli_prints_the_side_by_side_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    import kitune.service.tuning.optimize as optimize_service
    from kitune.cli import _register, app

    data = _two_questions(tmp_path)
    cfg_path = tmp_path / "demo.yaml"
    cfg_path.write_text(
        f"workdir: {tmp_path / 'w'}\ncorpus_name: tiny\nembedder: {{type: hash}}\n"
        "agent: {max_steps: 4, concurrency: 1}\nextraction: {concurrency: 1}\noptimize: {seed: 0}\n"
    )
    monkeypatch.setattr(
        optimize_service,
        "default_deps",
        lambda cfg, ledger, corpus_store=None: make_deps(
            RuleLM(task_rule), RuleLM(reflection_rule, json=True), corpus_store=corpus_store
        ),
    )
    _register()
    result = CliRunner().invoke(
        app,
        [
            "demo",
            "--data",
            str(data),
            "--config",
            str(cfg_path),
            "--questions",
            "2",
            "--distractors",
            "1",
            "--knob-trials",
            "0",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "in-context + disambiguation" in out and "accuracy (LLM judge)" in out  # grading.grader: llm
    assert "2/2 (100%)" in out  # in-context + disambiguation answers both
    assert "flips: 1 fixed, 0 still wrong, 0 newly wrong" in out
    assert f"mlflow ui --backend-store-uri sqlite:///{tmp_path / 'w' / 'demo' / 'mlflow.db'}" in out
    assert (tmp_path / "w" / "demo" / "report" / "report.md").is_file()


def test_demo_table_names_accuracy_after_the_grader() -> None:
    # the demo grades with grading.grader: match, where no judge runs
    from kitune.cli.loop_cmds import _demo_table
    from kitune.evaluation.summary import summarize

    table = _demo_table([summarize([], "baseline")], "match")
    assert next(iter(table.columns[0].cells)) == "accuracy (match)"
    table = _demo_table([summarize([], "baseline")], "llm")
    assert next(iter(table.columns[0].cells)) == "accuracy (LLM judge)"
