"""kitune drift: detect changed questions/documents, re-evaluate, re-run on a drop."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "optimizers_tests"))

from loop_fakes import QUESTIONS, extractor_rule, make_deps, reflection_rule, tiny_config, write_dataset
from opt_fakes import RuleLM

from kitune.errors import DataError
from kitune.service.tuning.optimize import run_optimize
from kitune.service.tuning.options import OptimizeOptions
from kitune.service.workflows.drift import drift_check, drift_run
from kitune.testing.tracking import RecordingTracker


def test_drift_check_detects_changed_question_set_and_reruns(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path)
    data = write_dataset(tmp_path / "data")
    deps = make_deps(RuleLM(extractor_rule), RuleLM(reflection_rule, json=True))
    opts = OptimizeOptions(
        data_dir=data,
        iterations=1,
        programs=("extractor",),
        max_metric_calls=3,  # the minimum that pays for one GEPA proposal on 2 validation documents
        distractors=1,
        progress=False,
    )
    first = run_optimize(cfg, opts, deps=deps, tracker=RecordingTracker())
    assert (first.state_dir / "fingerprint.json").is_file()

    # unchanged data: nothing affected, nothing evaluated
    same = drift_check(cfg, data, deps=deps, progress=False)
    assert not same.has_changes and same.affected_questions == () and same.score is None
    assert same.kis_by_status["active"] > 0 and same.kis_by_status["expired"] == 0

    # change one question's answer and one question's text: both affected, production re-evaluated
    changed = [list(q) for q in QUESTIONS]
    changed[0][2] = "Krakow"  # q1's gold changes: the agent will now be wrong
    changed[3][1] = "What is the capital city of Ecuador? Name the city."
    changed[3][2] = "Guayaquil"  # and q4's gold: wrong too
    write_dataset(tmp_path / "data", [tuple(q) for q in changed])  # type: ignore[misc]
    report = drift_check(cfg, data, deps=deps, progress=False)
    assert report.changed_questions == ("q1", "q4") and report.new_questions == ()
    assert report.affected_questions == ("q1", "q4")
    assert report.accuracy == 0.0
    assert report.reference_score is not None and report.score is not None
    assert report.drop == pytest.approx(report.reference_score - report.score)
    assert json.loads(json.dumps(report.to_dict()))["changed_questions"] == ["q1", "q4"]

    # a threshold above the drop does not re-run; below it runs one more iteration
    assert report.drop > 0.4  # both affected questions are now wrong
    _, none = drift_run(cfg, data, threshold=report.drop + 1, deps=deps, progress=False)
    assert none is None
    _, rerun = drift_run(cfg, data, threshold=0.0, deps=deps, progress=False, max_metric_calls=3)
    assert rerun is not None and len(rerun.loop.history) == 2


def test_drift_without_a_run_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="kitune optimize"):
        drift_check(tiny_config(tmp_path), write_dataset(tmp_path / "data"), deps=None)
