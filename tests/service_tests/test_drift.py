"""kitune drift: exact read-only checks by content hash; a staged refresh served only once promoted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "optimizers_tests"))

from loop_fakes import DOCS, QUESTIONS, extractor_rule, make_deps, reflection_rule, tiny_config, write_dataset
from opt_fakes import RuleLM

from kitune.errors import DataError
from kitune.retrieval.memory import MemoryStore
from kitune.schema import Filter
from kitune.service.serving.prompts import TABLE_TAG, open_registry, production_setting
from kitune.service.serving.stores import SOURCE_CHANGED
from kitune.service.tuning.optimize import run_optimize
from kitune.service.tuning.options import OptimizeOptions
from kitune.service.tuning.slice_fingerprint import follow_served_version
from kitune.service.workflows.drift import drift_check, drift_run
from kitune.testing.tracking import RecordingTracker
from kitune.tracking.prompts import prompt_name


def _snapshot(store: MemoryStore) -> list[str]:
    return sorted(k.model_dump_json() for k in store.iter_kis(Filter(statuses=())))


def _write(root: Path, docs: list[tuple[str, str, str]], questions: list[tuple[str, str, str, str]]) -> None:
    write_dataset(root, questions)
    with (root / "corpus.jsonl").open("w") as fh:
        for docid, title, text in docs:
            fh.write(json.dumps({"docid": docid, "title": title, "text": text}) + "\n")


def test_drift_check_is_exact_and_read_only_and_run_stages(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path)
    data = write_dataset(tmp_path / "data")
    stores: dict[str, MemoryStore] = {}
    deps = make_deps(RuleLM(extractor_rule), RuleLM(reflection_rule, json=True), stores=stores)
    opts = OptimizeOptions(
        data_dir=data,
        iterations=1,
        programs=("extractor",),
        max_metric_calls=3,
        distractors=6,
        progress=False,
    )
    first = run_optimize(cfg, opts, deps=deps, tracker=RecordingTracker())
    fp = json.loads((first.state_dir / "fingerprint.json").read_text())
    assert fp["hash"] == "document_hash" and sorted(fp["corpus"]) == [d[0] for d in DOCS]

    served = production_setting(cfg).store_cfg.store.table
    assert stores[served].count() > 0

    # unchanged data: nothing changed, nothing affected, no agent run
    same = drift_check(cfg, data, deps=deps, progress=False)
    assert not same.has_changes and same.affected_questions == () and same.score is None
    assert same.unchanged_documents == len(DOCS) and same.served_table == served
    assert drift_run(cfg, data, deps=deps, progress=False).ran is False

    # change d1, remove d6, add d7; change q1's answer, add q5 and q6, remove q4
    docs = [list(d) for d in DOCS if d[0] != "d6"]
    docs[0][2] = "Marie Curie was born in the city of Krakow. Marie Curie moved to Lyon in the year 1893."
    docs.append(["d7", "Rome", "Rome is the capital city of Italy. Rome lies on the river Tiber."])
    questions = [list(q) for q in QUESTIONS if q[0] != "q4"]
    questions[0][2] = "Krakow"
    questions += [
        ["q5", "What is the capital city of Italy?", "Rome", "d7"],
        ["q6", "What is the capital city of Norway?", "Oslo", "d5"],
    ]
    _write(tmp_path / "data", [tuple(d) for d in docs], [tuple(q) for q in questions])  # type: ignore[misc]
    before = _snapshot(stores[served])
    report = drift_check(cfg, data, deps=deps, progress=False)
    assert report.changed_documents == ("d1",)
    assert report.new_documents == ("d7",) and report.removed_documents == ("d6",)
    assert report.unchanged_documents == 4
    assert report.new_questions == ("q5", "q6") and report.removed_questions == ("q4",)
    assert report.changed_questions == ("q1",)
    assert report.affected_questions == ("q1", "q5", "q6")  # q1 (changed, its d1 changed), q5, q6
    assert report.accuracy is not None and report.score == report.accuracy
    assert _snapshot(stores[served]) == before  # the check wrote nothing to the served table

    run = drift_run(cfg, data, deps=deps, progress=False)
    assert run.ran and run.table == f"{served}-drift-" + run.table.rsplit("-", 1)[-1]
    assert run.expired_removed > 0 and run.expired_changed > 0
    assert _snapshot(stores[served]) == before  # staged, not served
    name = prompt_name("tiny", "extractor")
    registry = open_registry(cfg)
    staged = registry.get(name, "candidate")
    assert staged.version == run.version and staged.tags[TABLE_TAG] == run.table
    assert production_setting(cfg).store_cfg.store.table == served
    new = stores[run.table]
    gone = [
        k for k in new.iter_kis(Filter(statuses=("expired",))) if k.payload.properties.docid in ("d1", "d6")
    ]
    assert gone and {k.payload.status_reason for k in gone} == {SOURCE_CHANGED}
    assert any("Krakow" in k.title for k in new.iter_kis(Filter(statuses=("active",))))
    assert [k.title for k in gone if k.payload.properties.docid == "d1"] == [
        "Marie Curie was born in Warsaw in Poland."
    ]
    assert not any(k.payload.properties.docid == "d6" for k in new.iter_kis(Filter(statuses=("active",))))

    # issue 37: the fingerprint follows what is served — promoting the staged version puts the
    # drift run's data in place (nothing left to report), rolling back puts the old data back
    state = first.state_dir
    archived = json.loads((state / "fingerprints" / f"{name}-v{run.version}.json").read_text())
    assert sorted(archived["corpus"]) == ["d1", "d2", "d3", "d4", "d5", "d7"]
    assert follow_served_version(Path(cfg.workdir), name, previous=1, current=run.version) == [
        state / "fingerprint.json"
    ]
    after = drift_check(cfg, data, deps=deps, progress=False)
    assert not after.has_changes and after.unchanged_documents == 6 and after.affected_questions == ()
    assert (state / "fingerprints" / f"{name}-v1.json").is_file()  # what version 1 was served on
    assert follow_served_version(Path(cfg.workdir), name, previous=run.version, current=1) == [
        state / "fingerprint.json"
    ]
    back = drift_check(cfg, data, deps=deps, progress=False)
    assert back.changed_documents == ("d1",) and back.new_documents == ("d7",)
    # a version no run staged (another program's prompt) moves nothing
    assert (
        follow_served_version(Path(cfg.workdir), prompt_name("tiny", "rewriter"), previous=1, current=2) == []
    )


def test_drift_without_a_run_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="kitune optimize"):
        drift_check(tiny_config(tmp_path), write_dataset(tmp_path / "data"), deps=None)


def test_force_stages_even_without_a_change(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path)
    data = write_dataset(tmp_path / "data")
    stores: dict[str, MemoryStore] = {}
    deps = make_deps(RuleLM(extractor_rule), RuleLM(reflection_rule, json=True), stores=stores)
    opts = OptimizeOptions(
        data_dir=data,
        iterations=1,
        programs=("extractor",),
        max_metric_calls=3,
        distractors=6,
        progress=False,
    )
    run_optimize(cfg, opts, deps=deps, tracker=RecordingTracker())
    run = drift_run(cfg, data, deps=deps, progress=False, force=True)
    assert run.ran and run.expired_changed == 0 and run.expired_removed == 0
    assert run.kis_active == stores[production_setting(cfg).store_cfg.store.table].count(
        Filter(statuses=("active",))
    )
