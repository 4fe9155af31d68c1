"""The resumable ``kitune loop`` over imported production traces, once and with ``--watch``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "optimizers_tests"))

from loop_fakes import DOCS, QUESTIONS, extractor_rule, make_deps, reflection_rule
from opt_fakes import RuleLM

from kitune.config import KituneConfig
from kitune.data.loaders import load_dataset
from kitune.errors import KituneError
from kitune.service.workflows.traces import TraceFolder, import_traces
from kitune.service.workflows.watch import LoopOptions, WatchOptions, loop_once, watch
from kitune.testing.tracking import RecordingTracker


def corpus(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "corpus.jsonl"
    path.write_text("".join(json.dumps({"docid": d, "title": t, "text": x}) + "\n" for d, t, x in DOCS))
    return path


def conv(
    qid: str, question: str, answer: str, doc: str, *, final: str | None = None, correct: bool | None = None
) -> dict[str, Any]:
    labelled = {} if correct is None else {"correct": correct}
    return {
        **labelled,
        "id": f"trace-{qid}-{final or answer}",
        "query_id": qid,
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": final or answer},
        ],
        "gold_answer": answer,
        "evidence_docids": [doc, "not-in-corpus"],
    }


def drop(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


class FakeOptimize:
    """Stands in for run_optimize: records each call; can be told to fail once (an interruption)."""

    def __init__(self, fail_once: BaseException | None = None) -> None:
        self.calls: list[Any] = []
        self.trackers: list[Any] = []
        self.fail_once = fail_once

    def __call__(self, cfg: KituneConfig, opts: Any, **kw: Any) -> str:
        ds = load_dataset(opts.data_dir)  # the snapshot loads like any dataset
        self.calls.append(
            (opts, [q.query_id for q in ds.questions], [q.evidence_docids for q in ds.questions])
        )
        if self.fail_once is not None:
            err, self.fail_once = self.fail_once, None
            raise err
        return f"result-{opts.run_name}"


@pytest.fixture
def setup(tmp_path: Path) -> tuple[KituneConfig, LoopOptions, Path]:
    cfg = KituneConfig(workdir=tmp_path / "w")
    return cfg, LoopOptions(corpus=corpus(tmp_path / "data"), min_new=2, progress=False), tmp_path


def test_round_runs_on_what_is_new_and_resumes_after_an_interruption(setup: tuple) -> None:
    cfg, opts, tmp = setup
    fake = FakeOptimize(fail_once=KeyboardInterrupt())
    tracker = RecordingTracker()
    assert (
        loop_once(cfg, opts, optimize=fake, tracker=tracker).skipped_reason
        == "0 new trace(s), fewer than min_new=2"
    )
    import_traces(cfg, [drop(tmp / "in" / "a.jsonl", [conv(*QUESTIONS[0])])])
    assert "fewer than min_new=2" in str(loop_once(cfg, opts, optimize=fake).skipped_reason)
    import_traces(cfg, [drop(tmp / "in" / "b.jsonl", [conv(*QUESTIONS[1])])])

    with pytest.raises(KeyboardInterrupt):
        loop_once(cfg, opts, optimize=fake, tracker=tracker)  # interrupted mid-round: the round stays pending
    folder = TraceFolder.of(cfg, "default")
    state = folder.read_state()
    assert state["pending"]["round"] == 1 and state["consumed"] == []
    # new traces arriving meanwhile do not change the pending round's questions
    import_traces(cfg, [drop(tmp / "in" / "c.jsonl", [conv(*QUESTIONS[2]), conv(*QUESTIONS[3])])])
    res = loop_once(cfg, opts, optimize=fake, tracker=tracker)
    assert res.resumed and res.round == 1 and res.run_name == "loop-default-001" and res.n_questions == 2
    assert res.result == "result-loop-default-001"
    (o1, ids1, ev1), (o2, ids2, _ev2) = fake.calls
    assert o1.run_name == o2.run_name == "loop-default-001" and ids1 == ids2 == ["q1", "q2"]
    assert ev1 == [("d1",), ("d2",)]  # evidence ids outside the corpus are dropped from the snapshot

    # round 2: the two traces that arrived during round 1, on all four questions
    res2 = loop_once(cfg, opts, optimize=fake, tracker=tracker)
    assert (res2.round, res2.resumed, res2.n_new_traces, res2.n_questions) == (2, False, 2, 4)
    assert fake.calls[-1][0].run_name == "loop-default-002" and fake.calls[-1][1] == ["q1", "q2", "q3", "q4"]
    state = folder.read_state()
    assert state["pending"] is None and len(state["consumed"]) == 4
    assert [r["round"] for r in state["rounds"]] == [1, 2]
    assert "fewer than min_new" in str(loop_once(cfg, opts, optimize=fake, tracker=tracker).skipped_reason)
    assert len(fake.calls) == 3
    # one top-level tracking run per round attempt (the interrupted one ends FAILED)
    assert [(r.name, r.status, r.parent_run_id) for r in tracker.runs] == [
        ("loop-default-001", "FAILED", None),
        ("loop-default-001", "FINISHED", None),
        ("loop-default-002", "FINISHED", None),
    ]
    r2 = tracker.runs[1]
    assert (
        r2.params["loop.resumed"] == "True"
        and r2.params["loop.questions"] == "2"
        and r2.params["loop.trace_source"] == "default"
    )
    assert r2.metrics == {"questions": 2.0, "new_traces": 2.0}  # no labels in these traces
    assert r2.artifacts["dataset/questions.jsonl"].decode().count("\n") == 2
    assert all(kw_tracker is tracker for kw_tracker in fake.trackers)


def test_max_questions_keeps_the_newest_and_a_second_loop_is_refused(setup: tuple) -> None:
    cfg, opts, tmp = setup
    import_traces(cfg, [drop(tmp / "in" / "a.jsonl", [conv(*q) for q in QUESTIONS])])
    fake = FakeOptimize()
    folder = TraceFolder.of(cfg, "default")
    with folder.lock("loop"), pytest.raises(KituneError, match="another kitune loop"):
        loop_once(cfg, opts, optimize=fake, tracker=RecordingTracker())
    res = loop_once(
        cfg,
        LoopOptions(corpus=opts.corpus, max_questions=3, progress=False),
        optimize=fake,
        tracker=RecordingTracker(),
    )
    assert res.n_questions == 3 and fake.calls[0][1] == ["q2", "q3", "q4"]


def test_watch_imports_new_files_between_polls_and_stops_when_bounded(setup: tuple) -> None:
    cfg, opts, tmp = setup
    inbox = tmp / "inbox"
    drop(inbox / "a.jsonl", [conv(*QUESTIONS[0])])
    fake = FakeOptimize()
    polls: list[float] = []

    def sleep(seconds: float) -> None:  # the production agent drops a file between polls
        polls.append(seconds)
        if len(polls) == 1:
            drop(inbox / "b.json", [conv(*QUESTIONS[1]), conv(*QUESTIONS[2])])

    tracker = RecordingTracker()
    summary = watch(
        cfg, opts, WatchOptions(inbox, interval_s=5, max_polls=3), optimize=fake, sleep=sleep, tracker=tracker
    )
    assert (summary.polls, summary.stop_reason, summary.interrupted) == (3, "max_polls=3 reached", False)
    assert polls == [5, 5]
    assert [r.new for r in summary.imported] == [1, 2]  # unchanged files are not re-imported
    assert [(r.round, r.n_new_traces, r.n_questions) for r in summary.rounds] == [(1, 3, 3)]

    def interrupt(_s: float) -> None:
        raise KeyboardInterrupt

    drop(
        inbox / "c.jsonl",
        [conv(*QUESTIONS[3]), conv("q9", "What is the capital city of Egypt?", "Cairo", "d6")],
    )
    s2 = watch(
        cfg,
        opts,
        WatchOptions(inbox, max_polls=None, max_rounds=5),
        optimize=fake,
        sleep=interrupt,
        tracker=tracker,
    )
    assert s2.interrupted and s2.polls == 1 and [r.round for r in s2.rounds] == [2]
    assert "rerun to resume" in s2.stop_reason


def test_loop_round_runs_the_real_optimize_on_imported_traces(tmp_path: Path) -> None:
    """Production traces → questions → run_optimize with scripted models: the loop tunes on them."""
    cfg = KituneConfig(
        workdir=tmp_path / "w",
        corpus_name="prod",
        agent={"max_steps": 4, "concurrency": 1},
        optimize={"validation_fraction": 0.5, "seed": 0},
        extraction={"concurrency": 1},
    )
    # the production agent got two questions wrong ("Lyon"); the labels and gold answers say so
    records = [conv(*q, final="Lyon" if i % 2 else None, correct=not i % 2) for i, q in enumerate(QUESTIONS)]
    rep = import_traces(cfg, [drop(tmp_path / "in" / "prod.jsonl", records)])
    assert rep.questions_added == 4
    deps = make_deps(RuleLM(extractor_rule), RuleLM(reflection_rule, json=True))
    tracker = RecordingTracker()
    opts = LoopOptions(
        corpus=corpus(tmp_path / "data"),
        programs=("extractor",),
        max_metric_calls=4,
        distractors=1,
        progress=False,
    )
    res = loop_once(cfg, opts, deps=deps, tracker=tracker, registry=None)
    assert res.round == 1 and res.n_questions == 4
    loop = res.result.loop
    assert len(loop.history) == 1
    assert sorted((*res.result.tune_ids, *res.result.validation_ids)) == ["q1", "q2", "q3", "q4"]
    loop_run = tracker.by_name("loop-default-001")
    assert loop_run.parent_run_id is None and loop_run.status == "FINISHED"
    assert loop_run.metrics["production_accuracy_new"] == 0.5  # two of four answered "Lyon"
    assert tracker.by_name("iteration-0").parent_run_id == loop_run.run_id  # nested under the round
    assert "tune_accuracy" in tracker.by_name("iteration-0").metrics
    # run_optimize logged its invocation params on the round's run, without clashing with the loop's
    assert loop_run.params["programs"] == "extractor" and loop_run.params["loop.questions"] == "4"
    assert tracker.failures == ()
    assert (cfg.workdir / "optimize" / "loop-default-001" / "loop_state.json").is_file()
