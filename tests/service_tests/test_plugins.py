"""Plug-ins added by one file each are picked up by the loop and the CLI (issue 24 item 1)."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "optimizers_tests"))

from loop_fakes import make_deps, reflection_rule, task_rule, tiny_config, write_dataset
from opt_fakes import RuleLM

from kitune.errors import ConfigError
from kitune.optimizers.improver import IMPROVERS, register_improver, unregister_improver
from kitune.optimizers.program_task import PROGRAM_TASKS, register_program_task, unregister_program_task
from kitune.optimizers.registry import OPTIMIZERS, register_optimizer, unregister_optimizer
from kitune.service.tuning.optimize import run_optimize
from kitune.service.tuning.options import OptimizeOptions
from kitune.testing.tracking import RecordingTracker
from kitune.usage import CallRecord


def _task_rule(system: str, user: str) -> dict[str, object]:
    toy = importlib.import_module("toy_program").toy_rule(system, user)
    if toy is not None:
        return toy  # type: ignore[no-any-return]
    return task_rule(system, user)


@pytest.fixture
def toy() -> Iterator[ModuleType]:
    module = importlib.import_module("toy_optimizer")  # the one file that adds the optimiser
    if "toy" not in OPTIMIZERS:  # imported (and cleaned up) by an earlier test
        register_optimizer("toy", module.make_toy)
    module.BUILT.clear()
    module.COUNTERS.clear()
    yield module
    unregister_optimizer("toy")


@pytest.fixture
def toy_program() -> Iterator[ModuleType]:
    module = importlib.import_module("toy_program")  # the one file that adds the program task
    if "toy" not in PROGRAM_TASKS:
        register_program_task(module.TOY)
    yield module
    unregister_program_task("toy")


def test_a_toy_program_task_in_one_file_is_tuned_by_gepa_and_accepted(
    tmp_path: Path, toy_program: ModuleType
) -> None:
    data = write_dataset(tmp_path / "data")
    task_lm = RuleLM(_task_rule)
    deps = make_deps(task_lm, RuleLM(reflection_rule, json=True))
    opts = OptimizeOptions(
        data_dir=data, iterations=1, programs=("toy",), feedback=False, distractors=1, progress=False
    )
    tracker = RecordingTracker()
    res = run_optimize(tiny_config(tmp_path, iterations=1), opts, deps=deps, tracker=tracker)
    rec = res.loop.history[0]
    # write-only: judged by its own stage metric (validation cannot see it), then registered
    assert rec.accepted and rec.changed == ("toy",) and rec.registered == {"toy": 1}
    assert rec.reason.startswith("task metric improved (toy 0.0 → 1.0)")
    assert (
        res.loop.setting.prompts["toy"]
        == "Extract every fact of the document, with the DATES of every event."
    )
    metrics = tracker.by_name("iteration-0").metrics
    assert metrics["improve_toy_proposals"] == 1.0 and metrics["improve_toy_best_score"] == 1.0


def test_a_toy_optimizer_in_one_file_runs_in_the_loop(tmp_path: Path, toy: ModuleType) -> None:
    data = write_dataset(tmp_path / "data")
    deps = make_deps(RuleLM(_task_rule), RuleLM(reflection_rule, json=True))
    opts = OptimizeOptions(
        data_dir=data,
        iterations=1,
        optimizer="toy",
        programs=("extractor",),
        max_metric_calls=5,
        distractors=1,
        progress=False,
    )
    tracker = RecordingTracker()
    res = run_optimize(tiny_config(tmp_path, iterations=1), opts, deps=deps, tracker=tracker)
    rec = res.loop.history[0]
    assert rec.accepted and rec.changed == ("extractor",)
    assert res.loop.setting.prompts["extractor"] == toy.TOY_INSTRUCTION
    assert [b.max_metric_calls for b in toy.BUILT] == [5]
    # token caps count the loop's ledger: the counter handed to the factory reads it
    (counter,) = toy.COUNTERS
    assert counter is not None and deps.ledger is not None
    before = counter()
    deps.ledger.record(
        CallRecord(role="reflection", stage="optimize", model="m", input_tokens=123, output_tokens=4)
    )
    assert counter() == before + 123 == deps.ledger.totals()["input_tokens"]
    notes = json.loads(str(tracker.by_name("iteration-0").artifacts["improve.json"]))
    assert notes["extractor_stop_reason"] == "toy: one fixed proposal"
    # no lm.reflection.model: the documented fallback is noted, not silent
    assert notes["reflection_model"] == (
        "no reflection model configured (lm.reflection.model): the optimisers reflect with "
        "local:qwen2.5-coder-1.5b, the same model as the extract and rewrite task(s); set "
        "lm.reflection.model to a stronger model for better proposals"
    )


@pytest.fixture
def cli_runs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """``kitune optimize`` stopped before the loop: each run's options are appended to the list."""
    import kitune.service.tuning.optimize as optimize_service
    from kitune.cli import _register

    seen: list[Any] = []

    def fake_run(cfg: Any, opts: Any, **_: Any) -> Any:
        seen.append(opts)
        raise ConfigError("stop here")

    monkeypatch.setattr(optimize_service, "run_optimize", fake_run)
    _register()
    return seen


def test_the_cli_validates_optimizer_names_against_the_registry(
    tmp_path: Path, toy: ModuleType, cli_runs: list[Any]
) -> None:
    from typer.testing import CliRunner

    from kitune.cli import app

    runner = CliRunner()
    args = ["optimize", "--data", str(tmp_path), "--programs", "extractor"]
    bad = runner.invoke(app, [*args, "--optimizer", "adam"])
    assert bad.exit_code == 2
    out = " ".join(bad.output.split())
    assert "unknown optimizer 'adam'" in out and "registered optimizers are gepa, mipro, toy" in out
    assert cli_runs == []
    ok = runner.invoke(app, [*args, "--optimizer", "toy"])
    assert "stop here" in " ".join(ok.output.split())
    assert [o.optimizer for o in cli_runs] == ["toy"]
    bad_program = runner.invoke(app, ["optimize", "--data", str(tmp_path), "--programs", "extractor,toy"])
    assert bad_program.exit_code == 2
    assert "choose a comma-separated subset of extractor, rewriter, disambiguator" in bad_program.output
    watch = runner.invoke(app, ["loop", "--corpus", str(tmp_path), "--optimizer", "adam"])
    assert watch.exit_code == 2 and "registered optimizers are gepa, mipro, toy" in " ".join(
        watch.output.split()
    )


def test_the_cli_accepts_a_registered_toy_program(
    tmp_path: Path, toy_program: ModuleType, cli_runs: list[Any]
) -> None:
    from typer.testing import CliRunner

    from kitune.cli import app

    CliRunner().invoke(app, ["optimize", "--data", str(tmp_path), "--programs", "extractor,toy"])
    CliRunner().invoke(app, ["optimize", "--data", str(tmp_path)])
    assert [o.programs for o in cli_runs] == [
        ("extractor", "toy"),
        ("extractor", "rewriter", "disambiguator", "toy"),  # the default: every registered program
    ]


@pytest.fixture
def toy_improver() -> Iterator[ModuleType]:
    module = importlib.import_module("toy_improver")  # the one file that adds the improver
    if "toy-knob" not in IMPROVERS:
        register_improver(module.TOY)
    module.TOY.calls = 0
    yield module
    unregister_improver("toy-knob")


def test_a_toy_improver_in_one_file_is_folded_into_the_improve_step(
    tmp_path: Path, toy_improver: ModuleType
) -> None:
    data = write_dataset(tmp_path / "data")
    deps = make_deps(RuleLM(_task_rule), RuleLM(reflection_rule, json=True))
    cfg = tiny_config(tmp_path, iterations=1).model_copy(deep=True)
    cfg.optimize.improvers = ["prompts", "knobs", "disambiguation", "toy-knob"]
    opts = OptimizeOptions(
        data_dir=data, iterations=1, programs=("extractor",), feedback=False, distractors=1, progress=False
    )
    tracker = RecordingTracker()
    res = run_optimize(cfg, opts, deps=deps, tracker=tracker)
    rec = res.loop.history[0]
    run = tracker.by_name("iteration-0")
    assert run.metrics["improve_toy_calls"] == 1.0 and toy_improver.TOY.calls == 1
    assert run.metrics["improve_extractor_proposals"] == 1.0  # the built-in rooms ran too
    notes = json.loads(str(run.artifacts["improve.json"]))
    assert notes["toy"] == "saw iteration 0 with 1 failure(s)"
    assert rec.changed == ("extractor",) and rec.accepted
    assert dict(res.loop.setting.knobs) == {"retrieval.rrf_k": 7}  # the toy's knob rode along


def test_an_unknown_improver_in_the_config_stops_the_loop_before_any_work(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data")
    cfg = tiny_config(tmp_path, iterations=1).model_copy(deep=True)
    cfg.optimize.improvers = ["prompts", "signals"]
    deps = make_deps(RuleLM(_task_rule), RuleLM(reflection_rule, json=True))
    with pytest.raises(ConfigError, match=r"unknown improver\(s\) \['signals'\] \(optimize.improvers\)"):
        run_optimize(
            cfg, OptimizeOptions(data_dir=data, progress=False), deps=deps, tracker=RecordingTracker()
        )
    assert deps.lms["extract"].calls == 0
