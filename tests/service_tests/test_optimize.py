"""kitune optimize end to end with scripted models, MemoryStore and MLflow on SQLite."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "optimizers_tests"))

from loop_fakes import (
    QUESTIONS,
    disambiguator_rule,
    extractor_rule,
    make_deps,
    reflection_rule,
    task_rule,
    tiny_config,
    write_dataset,
)
from opt_fakes import RuleLM

from kitune.service.tuning.optimize import run_optimize
from kitune.service.tuning.options import OptimizeOptions
from kitune.service.tuning.slicing import select_documents
from kitune.tracking.prompts import PromptRegistry, prompt_name
from kitune.tracking.trackers import MlflowTracker


def test_optimize_extractor_accepts_a_better_prompt_and_registers_it(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data")
    cfg = tiny_config(tmp_path, iterations=2)
    extractions: list[str] = []

    def counting_rule(system: str, user: str) -> dict[str, object]:
        if "[[ ## text ## ]]" in user:
            extractions.append(user)
        return task_rule(system, user)

    deps = make_deps(RuleLM(counting_rule), RuleLM(reflection_rule, json=True))
    tracker = MlflowTracker(cfg.mlflow_uri, experiment="opt")
    registry = PromptRegistry(cfg.mlflow_uri)
    opts = OptimizeOptions(
        data_dir=data,
        iterations=2,
        programs=("extractor",),
        max_metric_calls=6,
        distractors=1,
        progress=False,
        knob_trials=2,
    )
    lines: list[str] = []
    res = run_optimize(cfg, opts, deps=deps, tracker=tracker, registry=registry, log=lines.append)
    hist = res.loop.history
    assert len(hist) == 2
    assert hist[0].accepted and hist[0].changed == ("extractor",)
    assert not hist[1].accepted  # nothing left to gain
    assert hist[0].candidate_val_score > hist[0].val_score
    assert "DATES" in res.loop.setting.prompts["extractor"]
    name = prompt_name("tiny", "extractor")
    staged = registry.get(name, "candidate")
    assert "DATES" in staged.text and staged.version == 2  # version 1 is the packaged prompt
    # issue 37: accepted is staged, not served, until `kitune prompts promote`
    assert res.staged == {name: 2} and res.promoted == {}
    assert registry.get(name, "production").version == 1
    runs = {r.info.run_name: r for r in tracker.client.search_runs([tracker.experiment_id])}
    m0 = runs["iteration-0"].data.metrics
    assert m0["accepted"] == 1.0
    assert m0["candidate_val_accuracy"] > m0["val_accuracy"]
    assert m0["improve_extractor_best_score"] > m0["improve_extractor_baseline_score"]
    assert "tune_extract_answer_coverage" in m0 and "improve_knob_trials" in m0
    assert m0["improve_extractor_proposals"] == 1.0
    # GEPA scored the extractor on document coverage: tuning q2 (d2, "1889") and q4 (d4, "Quito");
    # only d2 misses its answer without DATES, so it alone is reflected on; the Pareto set is both
    assert set(res.tune_ids) == {"q2", "q4"}
    assert m0["improve_extractor_examples"] == 2.0 and m0["improve_extractor_imperfect"] == 1.0
    assert m0["improve_extractor_baseline_score"] == 0.5 and m0["improve_extractor_best_score"] == 1.0
    # stage metrics on both splits (q1, q4 answered by a first sentence; q2, q3 need the years)
    assert m0["tune_stage_extractor_answer_coverage"] == 0.5
    assert m0["val_stage_extractor_answer_coverage"] == 0.5
    assert m0["candidate_val_stage_extractor_answer_coverage"] == 1.0  # the accepted extractor on validation
    assert m0["tune_stage_extractor_answer_coverage_n"] == 2.0
    assert m0["tune_stage_rewriter_recall_at_k"] == 1.0
    # nothing extracted twice with one instruction: every extraction call is one cache entry,
    # GEPA's seed evaluation read the loop's own extractions, and iteration 1's tuning run read GEPA's
    cached = [
        line
        for f in (res.state_dir / "extractions").glob("*.jsonl")
        for line in f.read_text(encoding="utf-8").splitlines()
    ]
    keyed = {(json.loads(x)["docid"], json.loads(x)["hash"]) for x in cached}
    # the 5 documents (4 evidence + 1 distractor) once per instruction; GEPA's 2 child extractions
    # (d2, d4) were reused by the accepted extractor's runs, which extracted the other 3
    assert len(extractions) == len(cached) == 5 + 5 and len(keyed) == 5
    assert len(list((res.state_dir / "extractions").glob("*.jsonl"))) == 2  # two instructions
    state = json.loads((res.state_dir / "loop_state.json").read_text(encoding="utf-8"))
    assert [m["value"] for m in state["history"][0]["stages"]["candidate_validation"][:1]] == [1.0]
    curves = (res.state_dir / "curves.md").read_text(encoding="utf-8")
    assert "| 0 tune | 1/2 = 50.0% [9.5%–90.5%]" in curves
    proposal = (res.state_dir / "proposals" / "iteration-0.md").read_text(encoding="utf-8")
    assert proposal.startswith("# Iteration 0: accepted") and "## Diff: extractor" in proposal
    assert "+Extract every fact of the document, with the DATES of every event." in proposal
    # iteration 1 starts from the accepted prompt: nothing to reflect on, and the run says why
    assert runs["iteration-1"].data.metrics["improve_extractor_proposals"] == 0.0
    assert "extractor: no proposal: every minibatch already scored perfectly (2 of 2 iterations)" in lines
    assert (res.state_dir / "curves.md").is_file() and (res.state_dir / "knobs.journal").is_file()
    assert set(res.tune_ids).isdisjoint(res.validation_ids)

    # rerun with one more iteration: resumes, starts from the accepted prompt, nothing re-extracted
    calls_before = deps.lms["extract"].calls
    opts3 = OptimizeOptions(
        data_dir=data,
        iterations=3,
        programs=("extractor",),
        max_metric_calls=6,
        distractors=1,
        progress=False,
    )
    res3 = run_optimize(cfg, opts3, deps=deps, tracker=tracker, registry=registry)
    assert len(res3.loop.history) == 3 and res3.loop.history[:2] == hist
    assert deps.lms["extract"].calls - calls_before < 20  # only GEPA's metric calls, no re-extraction


def test_select_documents_is_seeded() -> None:
    from kitune.data.loaders import Question
    from kitune.schema import Document

    corpus = [Document(docid=f"d{i}", text="t") for i in range(10)]
    qs = [Question("1", "q", "a", evidence_docids=("d3", "d1"), gold_docids=("d1",))]
    ev, dis = select_documents(qs, corpus, distractors=3, seed=1)
    assert [d.docid for d in ev] == ["d3", "d1"]
    assert len(dis) == 3 and not {"d1", "d3"} & {d.docid for d in dis}
    assert [d.docid for d in dis] == [d.docid for d in select_documents(qs, corpus, distractors=3, seed=1)[1]]


def test_unknown_program_is_a_config_error(tmp_path: Path) -> None:
    from kitune.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown program"):
        run_optimize(
            tiny_config(tmp_path, iterations=2), OptimizeOptions(data_dir=tmp_path, programs=("nope",))
        )


def test_kitune_optimize_and_drift_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import kitune.service.tuning.optimize as optimize_service
    from kitune.cli import _register, app

    data = write_dataset(tmp_path / "data")
    cfg_path = tmp_path / "k.yaml"
    cfg_path.write_text(
        f"workdir: {tmp_path / 'w'}\ncorpus_name: tiny\nembedder: {{type: hash}}\n"
        "agent: {max_steps: 4, concurrency: 1}\nextraction: {concurrency: 1}\n"
        "optimize: {seed: 0, decision_rule: permissive}\n"
    )
    deps = make_deps(RuleLM(task_rule), RuleLM(reflection_rule, json=True))
    monkeypatch.setattr(optimize_service, "default_deps", lambda cfg, ledger, corpus_store=None: deps)
    _register()
    runner = CliRunner()
    args = ["optimize", "--data", str(data), "-c", str(cfg_path), "--iterations", "1"]
    result = runner.invoke(
        app, [*args, "--programs", "extractor", "--max-metric-calls", "6", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    assert "kitune optimize (optimize)" in result.output and "accepted" in result.output
    assert "mlflow ui --backend-store-uri sqlite:///" in result.output
    bad = runner.invoke(app, [*args, "--programs", "extractor,nope"])
    assert bad.exit_code == 2 and "choose a comma-separated subset" in bad.output

    check = runner.invoke(app, ["drift", "check", "--data", str(data), "-c", str(cfg_path), "--no-progress"])
    assert check.exit_code == 0, check.output
    assert "affected questions" in check.output and "documents unchanged" in check.output
    assert "nothing changed since the run" in check.output
    run = runner.invoke(app, ["drift", "run", "--data", str(data), "-c", str(cfg_path)])
    assert run.exit_code == 0, run.output
    assert "nothing staged (pass --force to re-extract anyway)" in run.output


def test_optimize_rewriter_and_disambiguator_run_their_tasks(tmp_path: Path) -> None:
    """The rewriter's GEPA metric calls are look-ups (recall@k); the disambiguator's guardrail checks."""
    import json as _json
    import re as _re

    def rule(system: str, user: str) -> dict[str, object]:
        if "[[ ## correct_answer ## ]]" in user:
            return disambiguator_rule(system, user)
        if "[[ ## question ## ]]" in user:
            q = _re.search(r"\[\[ ## question ## \]\]\n(.*?)\n", user)
            text = q.group(1) if q else "x"
            return {
                "plan_json": _json.dumps(
                    {"entity_tags": [], "lexical": text, "semantic": text, "filters": {}}
                )
            }
        return extractor_rule(system, user)

    data = write_dataset(tmp_path / "data")
    cfg = tiny_config(tmp_path, iterations=2)
    task_lm = RuleLM(rule)
    deps = make_deps(task_lm, RuleLM(reflection_rule, json=True))
    opts = OptimizeOptions(
        data_dir=data,
        iterations=1,
        programs=("rewriter", "disambiguator"),
        max_metric_calls=3,
        distractors=0,
        progress=False,
    )
    from kitune.testing.tracking import RecordingTracker

    tracker = RecordingTracker()
    res = run_optimize(cfg, opts, deps=deps, tracker=tracker)
    metrics = tracker.by_name("iteration-0").metrics
    assert metrics["improve_rewriter_metric_calls"] >= 2  # rewrites + get_context, scored on recall@k
    assert metrics["improve_disambiguator_metric_calls"] >= 1
    assert metrics["improve_feedback_attempted"] == 1.0  # q2 failed on the tuning split
    assert metrics["improve_feedback_written"] == 1.0
    assert metrics["improve_flips_fixed"] == 1.0
    assert len(res.loop.history) == 1


def test_failed_documents_are_tried_once_per_process(tmp_path: Path) -> None:
    from kitune.optimizers.loop import Setting
    from kitune.service.tuning.loop_env import ServiceLoopEnv
    from kitune.service.tuning.slicing import load_slice

    data = write_dataset(tmp_path / "data")
    cfg = tiny_config(tmp_path, iterations=2)
    broken = RuleLM(lambda system, user: {"facts_json": "not json at all"})
    deps = make_deps(broken, RuleLM(reflection_rule, json=True))
    opts = OptimizeOptions(data_dir=data, programs=("extractor",), distractors=0, progress=False)
    questions, docs = load_slice(cfg, opts)
    env = ServiceLoopEnv(cfg, opts, deps, questions=questions, documents=docs, state_dir=tmp_path / "s")
    setting = Setting({"extractor": "Extract facts."})
    first = env.ensure_extracted(setting, questions)
    assert first["extract_docs_failed"] == 4.0
    calls = broken.calls
    assert env.ensure_extracted(setting, questions[:2]) == {
        "extract_docs_done": 0.0,
        "extract_docs_failed": 0.0,
        "extract_docs_skipped": 0.0,
        "extract_kis_written": 0.0,
        "extract_facts_dropped": 0.0,
        "extract_parse_failures": 0.0,
    }
    assert broken.calls == calls  # no second attempt in this process
    env2 = ServiceLoopEnv(cfg, opts, deps, questions=questions, documents=docs, state_dir=tmp_path / "s")
    assert env2.ensure_extracted(setting, questions)["extract_docs_failed"] == 4.0  # a new run retries


@pytest.mark.parametrize("split", ["random", "stratified"])
def test_optimize_runs_on_one_question_and_says_what_it_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: str
) -> None:
    """Issue 37: any question count ≥ 1; a split too small for a step names the step and why."""
    from typer.testing import CliRunner

    import kitune.service.tuning.optimize as optimize_service
    from kitune.cli import _register, app

    data = write_dataset(tmp_path / "data", [QUESTIONS[1]])  # q2: the seed extractor misses its year
    cfg_path = tmp_path / "k.yaml"
    cfg_path.write_text(
        f"workdir: {tmp_path / 'w'}\ncorpus_name: tiny\nembedder: {{type: hash}}\n"
        "agent: {max_steps: 4, concurrency: 1}\nextraction: {concurrency: 1}\noptimize: {seed: 0}\n"
    )
    deps = make_deps(RuleLM(task_rule), RuleLM(reflection_rule, json=True))
    monkeypatch.setattr(optimize_service, "default_deps", lambda cfg, ledger, corpus_store=None: deps)
    _register()
    args = ["optimize", "--data", str(data), "-c", str(cfg_path), "--iterations", "1", "--questions", "1"]
    r = CliRunner().invoke(
        app,
        [*args, "--programs", "extractor", "--max-metric-calls", "6", "--split", split, "--final-eval"],
    )
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "skipped the validation decision: 0 validation questions (1 question(s), all tuning)" in out
    assert "skipped the final evaluation (--final-eval): 0 validation questions" in out
    assert "tune questions: q2; validation: none" in out
    assert "# Final evaluation" not in out
    # GEPA proposed the DATES extractor; with nothing to validate on it is kept out, not staged
    state = tmp_path / "w" / "optimize" / "optimize"
    history = json.loads((state / "loop_state.json").read_text(encoding="utf-8"))["history"]
    assert [(h["decision"], h["changed"]) for h in history] == [("not_enough_evidence", ["extractor"])]
    assert "kitune prompts promote" not in out and (state / "fingerprint.json").is_file()
