"""kitune.tracking.runner: optimiser factory and run_experiment wiring (tracker, registry, start)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "optimizers_tests"))

from test_loop import FakeEnv, _p

from kitune.config import KituneConfig
from kitune.errors import ConfigError
from kitune.optimizers.budget import OptimizerBudget
from kitune.optimizers.gepa import GepaOptimizer
from kitune.optimizers.loop import start_prompts
from kitune.optimizers.mipro import MiproOptimizer
from kitune.optimizers.registry import make_optimizer
from kitune.optimizers.stopping import TimeoutStopCondition
from kitune.programs.instructions import load_instruction
from kitune.testing.tracking import RecordingTracker
from kitune.tracking.prompts import PromptRegistry, prompt_name
from kitune.tracking.runner import run_experiment


def _metric(
    gold: object, pred: object, trace: object = None, pred_name: object = None, pred_trace: object = None
) -> float:
    return 0.0


def test_make_optimizer_selects_from_the_registry_and_sizes() -> None:
    g = make_optimizer(
        "gepa",
        _metric,
        reflection_lm=object(),
        budget=OptimizerBudget(max_metric_calls=7, minutes=2),
        rng=random.Random(0),
    )
    assert isinstance(g, GepaOptimizer) and g.max_metric_calls == 7
    assert len(g.stoppers) == 1 and isinstance(g.stoppers[0], TimeoutStopCondition)
    assert g.stoppers[0].timeout_seconds == 120
    m = make_optimizer(
        "mipro",
        _metric,
        reflection_lm=object(),
        budget=OptimizerBudget(max_metric_calls=5),
        rng=random.Random(0),
    )
    assert isinstance(m, MiproOptimizer) and m.num_trials == 5
    with pytest.raises(ConfigError, match="registered optimizers are gepa, mipro"):
        make_optimizer(
            "adam", _metric, reflection_lm=object(), budget=OptimizerBudget(), rng=random.Random(0)
        )


def test_run_experiment_starts_from_production_and_uses_config_weights(tmp_path: Path) -> None:
    cfg = KituneConfig(
        workdir=tmp_path / "w",
        corpus_name="fx",
        optimize={"accept_margin": 0.0, "token_weight": 0.0, "decision_rule": "permissive"},
    )
    registry = PromptRegistry(cfg.mlflow_uri)
    name = prompt_name("fx", "rewriter")
    registry.promote(name, registry.register(name, _p("Production plan. 2")).version)
    tracker = RecordingTracker()
    lines: list[str] = []
    env = FakeEnv([_p("Better plan. 4")])
    res = run_experiment(
        cfg,
        env,
        programs=["rewriter"],
        iterations=1,
        state_dir=tmp_path / "s",
        tracker=tracker,
        log=lines.append,
    )
    rec = res.history[0]
    # scores are relative to the start setting's own first measurement (2/4 → 4/4: +0.5)
    assert (
        rec.accepted and rec.val_score == pytest.approx(0.0) and rec.candidate_val_score == pytest.approx(0.5)
    )
    assert registry.get(name, "production").text == _p("Better plan. 4")
    assert registry.get(name, "production").version == 2
    assert tracker.by_name("iteration-0").metrics["accepted"] == 1.0
    # one parent run per invocation with the weights, models and prompt versions; iterations nest in it
    parent = tracker.by_name("s")
    assert parent.params["weights.tokens_per_doubling"] == "0.0"
    assert str(parent.params["prompt_version.rewriter"]).startswith("rewriter@")
    assert tracker.by_name("iteration-0").parent_run_id == parent.run_id
    assert any("accepted" in line for line in lines) and lines[0].startswith("starting from")


def test_a_fixed_programs_production_prompt_is_in_the_start_setting(tmp_path: Path) -> None:
    # a loop tuning only the disambiguator must still extract with the extractor bootstrap drafted
    # (registered as production), not with the packaged one; unregistered programs stay out
    cfg = KituneConfig(workdir=tmp_path / "w", corpus_name="fx")
    registry = PromptRegistry(cfg.mlflow_uri)
    name = prompt_name("fx", "extractor")
    draft = load_instruction("extractor").text + "\n\nDomain focus (fx): chats."
    registry.promote(name, registry.register(name, draft).version)
    assert start_prompts(["rewriter"], corpus="fx", registry=registry) == {
        "rewriter": load_instruction("rewriter").text,
        "extractor": draft,
    }
    lines: list[str] = []
    run_experiment(
        cfg,
        FakeEnv([_p("Plan. 3")]),
        programs=["rewriter"],
        iterations=1,
        state_dir=tmp_path / "s",
        tracker=RecordingTracker(),
        registry=registry,
        log=lines.append,
    )
    assert "extractor (" in lines[0] and "disambiguator" not in lines[0]
    assert start_prompts(["rewriter"], corpus="fx", registry=None) == {
        "rewriter": load_instruction("rewriter").text
    }


def test_run_experiment_without_a_registry_for_file_uris(tmp_path: Path) -> None:
    cfg = KituneConfig(workdir=tmp_path / "w", tracking={"tracking_uri": f"file:{tmp_path / 'mlruns'}"})
    lines: list[str] = []
    res = run_experiment(
        cfg,
        FakeEnv([_p("Plan. 3")]),
        programs=["rewriter"],
        iterations=1,
        state_dir=tmp_path / "s",
        tracker=RecordingTracker(),
        log=lines.append,
    )
    assert res.history[0].registered == {}
    assert "prompt registry unavailable" in lines[0]
