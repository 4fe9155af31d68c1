"""``kitune optimize --measure stage``: stage metrics on every question, the agent only where asked."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "optimizers_tests"))

from loop_fakes import make_deps, reflection_rule, task_rule, tiny_config, write_dataset
from opt_fakes import RuleLM

from kitune.errors import ConfigError
from kitune.service.tuning.optimize import run_optimize
from kitune.service.tuning.options import OptimizeOptions
from kitune.tracking.trackers import MlflowTracker


def _questions_asked(deps: object) -> set[str]:
    """The questions the scripted agent was asked (its first user message per episode)."""
    calls = deps.chat_model.calls  # type: ignore[attr-defined]
    return {c.messages[1]["content"] for c in calls if len(c.messages) == 2}


def test_stage_measurement_runs_no_agent_and_still_measures_every_question(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data")
    cfg = tiny_config(tmp_path, iterations=1)
    deps = make_deps(RuleLM(task_rule), RuleLM(reflection_rule, json=True))
    tracker = MlflowTracker(cfg.mlflow_uri, experiment="stage")
    opts = OptimizeOptions(
        data_dir=data,
        iterations=1,
        programs=("extractor",),
        max_metric_calls=6,
        distractors=1,
        progress=False,
        split="stratified",
        measure="stage",
    )
    res = run_optimize(cfg, opts, deps=deps, tracker=tracker)
    assert deps.chat_model.calls == []  # no end-to-end episode at all
    runs = {r.info.run_name: r for r in tracker.client.search_runs([tracker.experiment_id])}
    m0 = runs["iteration-0"].data.metrics
    # the stage metrics cover both whole splits (2 + 2 questions) although the agent ran on none
    assert m0["tune_stage_extractor_answer_coverage_n"] == 2.0
    assert m0["val_stage_rewriter_recall_at_k_n"] == 2.0
    assert m0["tune_eval_agent_questions"] == 0.0 and m0["val_eval_agent_questions"] == 0.0
    assert m0["candidate_val_stage_extractor_answer_coverage"] == 1.0  # GEPA's DATES extractor
    q = json.loads((res.state_dir / "questions.json").read_text(encoding="utf-8"))
    assert q["split"]["method"] == "stratified" and q["split"]["shared_documents"] == []
    assert q["split"]["by_dataset"] == {"(none)": {"tune": 2, "validation": 2}}
    # every question's own stage values are kept for paired decisions
    saved = [
        json.loads(f.read_text(encoding="utf-8"))
        for f in (res.state_dir / "evals").glob("stages-*-validation.json")
    ]
    assert saved and all(set(s["per_question"]["rewriter_mrr"]) == set(q["validation"]) for s in saved)
    # a finished run keeps its split: other options that change it are refused, nothing rewritten
    with pytest.raises(
        ConfigError, match=r"finished 1 iteration\(s\) on another split \(stratified, 2 tuning"
    ):
        run_optimize(cfg, replace(opts, questions=3), deps=deps, tracker=tracker)
    assert json.loads((res.state_dir / "questions.json").read_text(encoding="utf-8")) == q


def test_e2e_sample_tune_agent_and_final_eval(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data")
    cfg = tiny_config(tmp_path, iterations=1)
    deps = make_deps(RuleLM(task_rule), RuleLM(reflection_rule, json=True))
    tracker = MlflowTracker(cfg.mlflow_uri, experiment="stage-e2e")
    opts = OptimizeOptions(
        data_dir=data,
        iterations=1,
        programs=("extractor",),
        max_metric_calls=6,
        distractors=1,
        progress=False,
        split="stratified",
        measure="stage",
        tune_agent=True,
        e2e_sample=1,
        final_eval=True,
        feedback=False,
    )
    res = run_optimize(cfg, opts, deps=deps, tracker=tracker)
    runs = {r.info.run_name: r for r in tracker.client.search_runs([tracker.experiment_id])}
    m0 = runs["iteration-0"].data.metrics
    assert m0["tune_eval_agent_questions"] == 2.0  # --tune-agent: every tuning question
    assert m0["val_eval_agent_questions"] == 1.0  # --e2e-sample 1
    assert m0["paired_n"] == 1.0  # current and candidate pair on the one sampled question
    asked = " | ".join(_questions_asked(deps))
    for split in ("tune", "validation"):  # --final-eval ran every validation question
        assert all(q.query in asked for q in _load(res.state_dir, split, data))
    assert res.final is not None
    assert res.final.seed.n_total == 2 and res.final.final.n_total == 2
    assert res.final.paired.n_pairs == 2
    # validation q1 (Warsaw, a first sentence) and q3 (1535, needs DATES): the seed extractor answers
    # q1 only, the accepted DATES extractor both — the one sampled question (q3) decided it
    assert res.validation_ids == ("q3", "q1")
    assert res.final.final_key == res.loop.setting.key != res.final.seed_key
    assert (res.final.seed.n_correct, res.final.final.n_correct) == (1, 2)
    assert res.final.paired.fixed == ("q3",) and res.final.paired.broken == ()
    assert res.final.md_path.read_text(encoding="utf-8").startswith("# Final evaluation")
    saved = json.loads(res.final.json_path.read_text(encoding="utf-8"))
    assert saved["paired"]["n_pairs"] == 2 and saved["seed"]["questions"] == 2


def _load(state_dir: Path, split: str, data: Path) -> list:  # type: ignore[type-arg]
    from kitune.data.loaders import load_questions

    ids = set(json.loads((state_dir / "questions.json").read_text(encoding="utf-8"))[split])
    return [q for q in load_questions(data) if q.query_id in ids]


def test_optimize_refuses_unknown_split_and_measure_choices(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kitune.cli import _register, app

    _register()
    for args, option, message in (
        (["--split", "dataset"], "--split", "use one of random, stratified"),
        (["--measure", "cheap"], "--measure", "use full or stage"),
        (["--e2e-sample", "8"], "--measure", "--tune-agent and --e2e-sample choose the agent's questions"),
        (["--measure", "stage", "--e2e-sample", "some"], "--e2e-sample", "'some': use a number ≥ 0 or auto"),
    ):
        r = CliRunner().invoke(app, ["optimize", "--data", str(tmp_path), *args], env={"COLUMNS": "200"})
        out = " ".join(r.output.split())
        assert r.exit_code == 2, out
        assert f"Invalid value for '{option}': {message}" in out


def test_e2e_sample_auto_is_sized_by_the_power_of_the_non_inferiority_check(tmp_path: Path) -> None:
    from kitune.data.loaders import load_corpus, load_questions
    from kitune.optimizers.power import minimum_detectable_effect
    from kitune.service.tuning.loop_env import ServiceLoopEnv, e2e_sample_size
    from kitune.service.tuning.options import E2E_AUTO

    # (z(0.95) + z(0.8)) · 0.5 / √n ≤ 0.10 ⇒ n ≥ 154.6: 155 paired questions; a 0.4 sd needs 99
    assert e2e_sample_size(0.5, alpha=0.05, power=0.8, margin=0.10) == 155
    assert minimum_detectable_effect(154, 0.5) > 0.10 >= minimum_detectable_effect(155, 0.5)
    assert e2e_sample_size(0.4, alpha=0.05, power=0.8, margin=0.10) == 99
    assert e2e_sample_size(0.5, alpha=0.05, power=0.8, margin=0.5) == 7
    with pytest.raises(ValueError, match="margin=0"):
        e2e_sample_size(0.5, alpha=0.05, power=0.8, margin=0.0)
    data = write_dataset(tmp_path / "data")
    cfg = tiny_config(tmp_path)
    deps = make_deps(RuleLM(task_rule), RuleLM(reflection_rule, json=True))
    lines: list[str] = []

    def env(**options: object) -> ServiceLoopEnv:
        opts = OptimizeOptions(data_dir=data, progress=False, measure="stage", **options)  # type: ignore[arg-type]
        return ServiceLoopEnv(
            cfg,
            opts,
            deps,
            questions=load_questions(data),
            documents=load_corpus(data),
            state_dir=tmp_path / "s",
            log=lines.append,
        )

    auto = env(e2e_sample=E2E_AUTO)
    val = auto.questions_for("validation")
    assert auto.agent_questions("validation", val) == val  # 155 wanted, the split has 2: all of them
    assert auto.agent_questions("tune", auto.questions_for("tune")) == []  # no --tune-agent
    assert lines[-1].endswith(
        "running the agent on 2 of 2 validation questions (all: the split is smaller than the power asks)"
    )
    one = env(e2e_sample=1)
    picked = one.agent_questions("validation", val)
    assert len(picked) == 1 and picked == one.agent_questions("validation", list(reversed(val)))  # seeded
    full = ServiceLoopEnv(
        cfg,
        OptimizeOptions(data_dir=data, progress=False),
        deps,
        questions=load_questions(data),
        documents=load_corpus(data),
        state_dir=tmp_path / "s2",
    )
    assert full.agent_questions("tune", full.questions_for("tune")) == full.questions_for("tune")
