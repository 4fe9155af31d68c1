"""The resumable ``kitune loop``: a round of optimisation over what is new, once or polling a folder.

:func:`loop_once` resumes the pending round, or starts a new one when at least ``min_new``
imported traces are not yet consumed: it snapshots every accumulated question (the newest
``max_questions``) with the corpus into ``<workdir>/traces/<name>/rounds/<k>/`` and calls
:func:`kitune.service.tuning.optimize.run_optimize` on it with run name ``loop-<name>-<k>`` — so an
interrupted round resumes on exactly its questions and from its loop state. Only when
``run_optimize`` returns are the round's traces marked consumed.

:func:`watch` polls a folder: each poll imports the ``*.jsonl`` / ``*.json`` files that are new
or changed (size or mtime) since they were imported, then calls :func:`loop_once`, then sleeps
``interval_s``. It is bounded (``max_polls``, ``max_rounds``) and Ctrl-C safe: the state is
written atomically at each step, so an interrupted watch — or a killed process — resumes on
the next start. ``max_polls=1, interval_s=0`` is the one-shot form for cron.

**Unlabelled traces** (``WatchOptions.propose`` and ``review.watch_proposals``, both on by
default; ``review.draft_kis: false`` keeps the extractor out of it): each poll also mines the new
traces of the fresh files — labelled or not — for failure signals
(:mod:`kitune.evaluation.signals`). When any new trace fell back to raw search, found nothing,
looped or answered without support, the signals are computed again with the KI store's facts,
logged to MLflow (run ``signals-<name>-poll<k>``) and turned into proposals in the review queue
(:func:`kitune.service.workflows.review.file_proposals`, actor ``watch``): nothing is applied, except the
kinds in ``review.auto_approve`` whose labelled validation gate accepts them (measured on the
trace source's labelled questions; without any, nothing is auto-approved). Approved proposals
are applied when a person approves them (``kitune review approve``, ``/api/proposals``). Mined
trace ids are recorded in ``state.json`` (``signalled``), so a restart does not mine them twice.
Labelled traces still drive the optimisers as before (:func:`loop_once`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kitune.config import KituneConfig
from kitune.data.loaders import CORPUS_FILE, load_corpus, load_questions
from kitune.errors import DataError
from kitune.evaluation.metrics import Trace
from kitune.evaluation.signals import aggregate_signals, compute_signals
from kitune.ki import utcnow
from kitune.service.tuning import optimize as optimize_service
from kitune.service.tuning.options import OptimizeOptions
from kitune.service.workflows.review import (
    corpus_documents,
    default_drafter,
    default_evaluator,
    file_proposals,
    open_review,
    production_rewriter,
)
from kitune.service.workflows.signals import log_signals, signal_report, store_facts
from kitune.service.workflows.traces import (
    ImportReport,
    TraceFolder,
    changed_files,
    import_traces,
    read_trace_file,
    to_trace,
    write_atomic,
)
from kitune.tracking.trackers import create_tracker

__all__ = [
    "LoopOptions",
    "ReviewHooks",
    "RoundResult",
    "WatchOptions",
    "WatchSummary",
    "corpus_file",
    "loop_once",
    "mine_signals",
    "production_hooks",
    "watch",
]


@dataclass(frozen=True)
class LoopOptions:
    """What one ``kitune loop`` round does (the optimisation knobs are passed to ``run_optimize``)."""

    corpus: Path
    """Corpus file, or a dataset folder holding ``corpus.jsonl`` / ``documents.jsonl``."""
    name: str = "default"
    min_new: int = 1
    """Run a round only when at least this many imported traces are not yet consumed."""
    max_questions: int | None = None
    """Tune on the newest N accumulated questions (None: all)."""
    iterations: int = 1
    optimizer: str = "gepa"
    programs: tuple[str, ...] | None = None
    """None: run_optimize's default programs."""
    max_metric_calls: int | None = None
    """None: ``optimize.max_metric_calls``, else sized to ``optimize.min_proposals`` proposals."""
    knob_trials: int = 0
    distractors: int = 4
    budget_minutes: float | None = None
    progress: bool = True


@dataclass(frozen=True)
class RoundResult:
    """What one call of :func:`loop_once` did."""

    round: int | None
    """Round number, None when no round ran."""
    run_name: str | None
    n_questions: int = 0
    n_new_traces: int = 0
    resumed: bool = False
    skipped_reason: str | None = None
    dataset_dir: Path | None = None
    result: Any = None
    """The :class:`~kitune.service.tuning.optimize.OptimizeResult`."""


_FIXTURE_HINT = (
    'a corpus ships with kitune: --corpus "$(kitune demo --print-fixture)" (the 24-question fixture)'
)


def corpus_file(path: Path) -> Path:
    """The corpus JSONL behind ``--corpus``: the file itself, or a folder's corpus/documents file.

    ``kitune loop`` calls this before looking at traces, so a mistyped ``--corpus`` fails at
    once instead of reading as "no new traces" (exit 0) until traces arrive.

    Raises:
        DataError: nothing usable at ``path``.
    """
    if path.is_dir():
        for fname in (CORPUS_FILE, "documents.jsonl"):
            if (path / fname).is_file():
                return (path / fname).resolve()
        raise DataError(
            f"{path} has no {CORPUS_FILE} or documents.jsonl: pass --corpus FILE; {_FIXTURE_HINT}",
            path=str(path),
        )
    if not path.is_file():
        raise DataError(f"no corpus at {path}: pass --corpus FILE or DIR; {_FIXTURE_HINT}", path=str(path))
    return path.resolve()


def _snapshot(folder: TraceFolder, k: int, corpus: Path, max_questions: int | None) -> tuple[Path, int]:
    """Write round ``k``'s dataset folder; evidence ids not in the corpus are dropped."""
    corpus_path = corpus_file(corpus)
    ids = {d.docid for d in load_corpus(corpus_path)}
    questions = load_questions(folder.questions)
    if max_questions is not None:
        questions = questions[-max_questions:]
    d = folder.round_dir(k)
    d.mkdir(parents=True, exist_ok=True)
    link = d / CORPUS_FILE
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(corpus_path)
    lines = []
    for q in questions:
        row = q.to_dict()
        row["evidence_docids"] = [x for x in q.evidence_docids if x in ids]
        row["gold_docids"] = [x for x in q.gold_docids if x in ids]
        lines.append(json.dumps(row, ensure_ascii=False))
    write_atomic(d / "questions.jsonl", "\n".join(lines) + "\n")
    return d, len(questions)


def loop_once(
    cfg: KituneConfig,
    opts: LoopOptions,
    *,
    optimize: Callable[..., Any] | None = None,
    log: Callable[[str], None] = lambda _m: None,
    **optimize_kwargs: Any,
) -> RoundResult:
    """Resume the pending round, or run a new one when enough new traces arrived.

    Args:
        cfg: the configuration (``workdir`` holds the trace folder and the loop state).
        opts: see :class:`LoopOptions`.
        optimize: ``run_optimize`` (injected in tests).
        log: progress lines.
        **optimize_kwargs: passed to ``optimize`` (``deps``, ``tracker``, ``registry``). The
            round opens a top-level tracking run named after its optimize run (params
            ``loop.round``, ``loop.trace_source``, ``loop.corpus``, ``loop.questions``,
            ``loop.new_traces``, ``loop.resumed``; metrics: ``questions``,
            ``new_traces``, ``production_accuracy_new`` over the labelled new traces; artefact
            ``dataset/questions.jsonl``); the optimisation's iteration runs nest under it.
            ``tracker`` defaults to ``create_tracker(cfg)``.

    Returns:
        The round's result, or one with ``skipped_reason`` when nothing ran.

    Raises:
        DataError: no corpus, corrupt state. KituneError: locked, or the optimisation failed
        (the round stays pending; rerun to resume).
    """
    run = optimize or optimize_service.run_optimize
    corpus_file(opts.corpus)  # a mistyped --corpus fails now, not when traces arrive
    folder = TraceFolder.of(cfg, opts.name)
    with folder.lock("loop"):
        with folder.lock("state"):
            state = folder.read_state()
            pending = state.get("pending")
            resumed = pending is not None
            if pending is None:
                pending_or_skip = _new_round(folder, state, opts)
                if isinstance(pending_or_skip, RoundResult):
                    return pending_or_skip
                pending = pending_or_skip
                state["pending"] = pending
                folder.write_state(state)
        log(
            f"round {pending['round']}{' (resumed)' if resumed else ''}: {pending['questions']} questions, "
            f"{len(pending['trace_ids'])} new traces → optimize run {pending['run_name']}"
        )
        kwargs: dict[str, Any] = {
            "data_dir": Path(pending["dataset"]),
            "iterations": opts.iterations,
            "optimizer": opts.optimizer,
            "max_metric_calls": opts.max_metric_calls,
            "knob_trials": opts.knob_trials,
            "distractors": opts.distractors,
            "budget_minutes": opts.budget_minutes,
            "run_name": pending["run_name"],
            "progress": opts.progress,
        }
        if opts.programs is not None:
            kwargs["programs"] = opts.programs
        tracker = optimize_kwargs.pop("tracker", None) or create_tracker(cfg)
        labels = [state["traces"].get(t, {}).get("correct") for t in pending["trace_ids"]]
        labelled = [c for c in labels if c is not None]
        # "loop." names: run_optimize logs its own params (iterations, programs, …) on this run
        params = {
            "loop.round": pending["round"],
            "loop.trace_source": opts.name,
            "loop.corpus": str(opts.corpus),
            "loop.questions": pending["questions"],
            "loop.new_traces": len(pending["trace_ids"]),
            "loop.resumed": resumed,
        }
        tags = {"kitune.kind": "loop", "kitune.trace_source": opts.name}
        # One parent run per round; run_optimize's iteration runs nest under it.
        with tracker.run(pending["run_name"], params, tags=tags, nested=False) as handle:
            metrics = {"questions": float(pending["questions"]), "new_traces": float(len(labels))}
            if labelled:
                metrics["production_accuracy_new"] = sum(1 for c in labelled if c) / len(labelled)
                metrics["production_labelled_new"] = float(len(labelled))
            tracker.log_metrics(metrics, run_id=handle.run_id)
            tracker.log_artifact(
                Path(pending["dataset"]) / "questions.jsonl", "dataset", run_id=handle.run_id
            )
            result = run(cfg, OptimizeOptions(**kwargs), log=log, tracker=tracker, **optimize_kwargs)
        with folder.lock("state"):
            state = folder.read_state()
            state["consumed"] = sorted(set(state.get("consumed", [])) | set(pending["trace_ids"]))
            state.setdefault("rounds", []).append({**pending, "finished": utcnow().isoformat()})
            state["pending"] = None
            folder.write_state(state)
    return RoundResult(
        pending["round"],
        pending["run_name"],
        n_questions=pending["questions"],
        n_new_traces=len(pending["trace_ids"]),
        resumed=resumed,
        dataset_dir=Path(pending["dataset"]),
        result=result,
    )


def _new_round(folder: TraceFolder, state: dict[str, Any], opts: LoopOptions) -> dict[str, Any] | RoundResult:
    """The pending-round record of a new round, or a skipped :class:`RoundResult`."""
    consumed = set(state.get("consumed", []))
    new_ids = [t for t in state.get("traces", {}) if t not in consumed]
    if len(new_ids) < opts.min_new:
        why = f"{len(new_ids)} new trace(s), fewer than min_new={opts.min_new}"
        return RoundResult(None, None, n_new_traces=len(new_ids), skipped_reason=why)
    if not folder.questions.is_file():
        why = "no imported trace has a gold answer or a correct label"
        return RoundResult(None, None, n_new_traces=len(new_ids), skipped_reason=why)
    k = len(state.get("rounds", [])) + 1
    ddir, n_q = _snapshot(folder, k, opts.corpus, opts.max_questions)
    if n_q < 2:
        why = f"{n_q} question(s) with a gold answer: the loop needs at least 2"
        return RoundResult(None, None, n_questions=n_q, n_new_traces=len(new_ids), skipped_reason=why)
    return {
        "round": k,
        "run_name": f"loop-{opts.name}-{k:03d}",
        "dataset": str(ddir),
        "questions": n_q,
        "trace_ids": new_ids,
        "started": utcnow().isoformat(),
    }


@dataclass(frozen=True)
class WatchOptions:
    """How :func:`watch` polls."""

    directory: Path
    """Folder the production agent drops trace files into (``*.jsonl``, ``*.json``)."""
    interval_s: float = 60.0
    """Seconds between polls."""
    max_polls: int | None = 1440
    """Stop after this many polls (1440 × 60 s = one day); None: until Ctrl-C."""
    max_rounds: int | None = None
    """Stop after this many finished rounds; None: no limit."""
    label_name: str | None = None
    """MLflow feedback name holding the label (see ``kitune traces import``)."""
    propose: bool = True
    """Mine new traces for failure signals and file proposals (see the module docstring)."""
    draft: bool = True
    """Let the production extractor draft KIs for ``re_extract`` / ``add_ki`` proposals (LLM calls)."""


@dataclass
class ReviewHooks:
    """What mining needs: the review service and the proposer's inputs (see :func:`production_hooks`)."""

    service: Any
    """A :class:`kitune.service.workflows.review.ReviewService`."""
    documents: Callable[[str], Any] | None = None
    draft: Callable[[Any], list[Any]] | None = None
    extractor_version: str = ""
    rewriter: Any = None
    evaluate: Any = None
    """An ``Evaluator`` (:mod:`kitune.service.workflows.review`) (None: no effect measured, none approved)."""
    tracker: Any = None
    """Where the signals are logged (None: not logged)."""


def production_hooks(cfg: KituneConfig, opts: LoopOptions, wopts: WatchOptions) -> ReviewHooks:
    """The production wiring of :func:`mine_signals`.

    The review queue, the corpus, the production extractor (when ``wopts.draft``), the production
    rewriter, the in-context agent as evaluator (only when ``review.auto_approve`` is set: effects
    cost agent runs) and the MLflow tracker.
    """
    tracker = create_tracker(cfg)
    draft, version = default_drafter(cfg) if wopts.draft and cfg.review.draft_kis else (None, "")
    return ReviewHooks(
        service=open_review(cfg, tracker=tracker),
        documents=corpus_documents(corpus_file(opts.corpus)),
        draft=draft,
        extractor_version=version,
        rewriter=production_rewriter(cfg),
        evaluate=default_evaluator(cfg, corpus_file(opts.corpus)) if cfg.review.auto_approve else None,
        tracker=tracker,
    )


_MINED_KINDS = frozenset({"fell_back_to_raw", "empty_retrieval", "looped", "answer_unsupported"})
"""Signals a proposal can come from; a batch without any of them opens no store."""


def mine_signals(
    cfg: KituneConfig,
    folder: TraceFolder,
    files: list[Path],
    hooks: Callable[[], ReviewHooks],
    *,
    label: str,
    label_name: str | None = None,
) -> dict[str, Any]:
    """Signals and proposals from the traces of ``files`` not mined before (module docstring).

    Args:
        cfg: the configuration.
        folder: the trace source (its ``state.json`` records the mined ids).
        files: the trace files imported this poll.
        hooks: builds the review wiring on first need (no store is opened without signals).
        label: names the tracking run (``signals-<label>``).
        label_name: the MLflow label feedback name.

    Returns:
        ``{"traces", "signals": by-kind counts, "filed", "auto_approved", "gate_refused", "errors"}``.
    """
    with folder.lock("state"):
        done = set(folder.read_state().get("signalled", []))
    new: list[tuple[str, Trace]] = []
    for path in files:
        pts, _skipped = read_trace_file(path, label_name=label_name)
        new.extend((pt.trace_id, to_trace(pt)) for pt in pts if pt.trace_id not in done)
    out: dict[str, Any] = {
        "traces": len(new),
        "signals": {},
        "filed": [],
        "auto_approved": [],
        "gate_refused": {},
    }
    out["errors"] = []
    if new:
        quick = aggregate_signals([compute_signals(t, trace_id=tid) for tid, t in new])
        out["signals"] = dict(quick.by_kind)
        if any(quick.by_kind.get(k, 0) for k in _MINED_KINDS):
            h = hooks()
            report = signal_report(cfg, new, facts=store_facts(h.service.kis()))
            out["signals"] = dict(report.by_kind)
            if h.tracker is not None:
                log_signals(h.tracker, report, name=label, params={"signals.traces": len(new)})
            questions = []
            if folder.questions.is_file():
                questions = load_questions(folder.questions)
            rep = file_proposals(
                h.service,
                report,
                documents=h.documents,
                draft=h.draft,
                extractor_version=h.extractor_version,
                rewriter=h.rewriter,
                questions=questions,
                evaluate=h.evaluate,
                measure_kinds=cfg.review.auto_approve,
                actor="watch",
            )
            out.update(
                filed=[p.id for p in rep.filed],
                auto_approved=list(rep.auto_approved),
                gate_refused=dict(rep.gate_refused),
                errors=[*rep.proposed.errors, *rep.errors],
            )
    with folder.lock("state"):
        state = folder.read_state()
        state["signalled"] = sorted(set(state.get("signalled", [])) | {tid for tid, _ in new})
        folder.write_state(state)
    return out


@dataclass
class WatchSummary:
    """What a watch did."""

    polls: int = 0
    imported: list[ImportReport] = field(default_factory=list)
    rounds: list[RoundResult] = field(default_factory=list)
    """Rounds that ran (skipped polls are not listed)."""
    mined: list[dict[str, Any]] = field(default_factory=list)
    """One :func:`mine_signals` result per poll that imported files (with ``propose``)."""
    last_skip: str | None = None
    """Why the last poll ran no round (None when it ran one)."""
    interrupted: bool = False
    """Stopped by Ctrl-C (state is consistent; rerun to resume)."""
    stop_reason: str = ""


def watch(
    cfg: KituneConfig,
    opts: LoopOptions,
    wopts: WatchOptions,
    *,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = lambda _m: None,
    review: ReviewHooks | None = None,
    **loop_kwargs: Any,
) -> WatchSummary:
    """Poll ``wopts.directory``: import new or changed trace files, mine them, run :func:`loop_once`, sleep.

    Args:
        cfg: the configuration.
        opts: the loop round's options.
        wopts: polling bounds.
        sleep: ``time.sleep`` (injected in tests).
        log: progress lines.
        review: the review wiring for mining (None: :func:`production_hooks`, built the first
            time a poll finds signals a proposal can come from).
        **loop_kwargs: passed to :func:`loop_once` (``optimize``, ``deps``, ``tracker``, ``registry``).

    Returns:
        What happened; ``interrupted`` when Ctrl-C stopped it.

    Raises:
        DataError: the folder does not exist (or as :func:`import_traces` / :func:`loop_once`).
        KituneError: another loop holds the folder; an optimisation failed (the round stays
        pending and resumes on the next start).
    """
    if not wopts.directory.is_dir():
        raise DataError(f"--watch {wopts.directory}: not a folder", path=str(wopts.directory))
    corpus_file(opts.corpus)
    if wopts.max_polls is not None and wopts.max_polls < 1:
        raise DataError(f"max_polls={wopts.max_polls}: use 1 or more (or no limit)")
    folder = TraceFolder.of(cfg, opts.name)
    summary = WatchSummary()
    hooks: dict[str, ReviewHooks] = {}

    def wiring() -> ReviewHooks:
        if "h" not in hooks:
            hooks["h"] = review if review is not None else production_hooks(cfg, opts, wopts)
        return hooks["h"]

    try:
        while True:
            summary.polls += 1
            files = sorted(
                p for pattern in ("*.jsonl", "*.json") for p in wopts.directory.glob(pattern) if p.is_file()
            )
            fresh = changed_files(folder, files)
            if fresh:
                rep = import_traces(cfg, fresh, name=opts.name, label_name=wopts.label_name)
                summary.imported.append(rep)
                log(
                    f"poll {summary.polls}: {len(fresh)} file(s), {rep.new} new trace(s), "
                    f"{rep.questions_added} new question(s), {len(rep.skipped)} skipped record(s)"
                )
                if wopts.propose and cfg.review.watch_proposals:
                    mined = mine_signals(
                        cfg,
                        folder,
                        fresh,
                        wiring,
                        label=f"{opts.name}-poll{summary.polls}",
                        label_name=wopts.label_name,
                    )
                    summary.mined.append(mined)
                    shown = ", ".join(f"{k} {v}" for k, v in mined["signals"].items() if v) or "none"
                    log(
                        f"poll {summary.polls}: signals over {mined['traces']} new trace(s): {shown}; "
                        f"{len(mined['filed'])} proposal(s) filed, "
                        f"{len(mined['auto_approved'])} auto-approved"
                    )
            res = loop_once(cfg, opts, log=log, **loop_kwargs)
            summary.last_skip = res.skipped_reason
            if res.round is not None:
                summary.rounds.append(res)
            if wopts.max_rounds is not None and len(summary.rounds) >= wopts.max_rounds:
                summary.stop_reason = f"max_rounds={wopts.max_rounds} reached"
                break
            if wopts.max_polls is not None and summary.polls >= wopts.max_polls:
                summary.stop_reason = f"max_polls={wopts.max_polls} reached"
                break
            sleep(wopts.interval_s)
    except KeyboardInterrupt:
        summary.interrupted = True
        summary.stop_reason = "interrupted (Ctrl-C); rerun to resume"
    return summary
