"""``kitune drift check|run``: what changed in the data since the last optimisation run, and a staged refresh.

What the last optimisation run saw is stored beside its loop state as
``<workdir>/optimize/<run name>/fingerprint.json`` (:mod:`kitune.service.tuning.slice_fingerprint`):
a hash per question (text, answer, aliases, evidence ids) and per corpus document
(:func:`kitune.data.checksum.document_hash`, the hash the extraction resume file uses), for the
whole data folder.

:func:`drift_check` is **read-only**: it compares the data folder with the fingerprint — added,
removed and changed documents, new, removed and changed questions, each by name — and evaluates
the *served* setting (the production prompts on the served KI table, opened for reading) on the
affected questions: new and changed ones plus those whose evidence documents changed, were added
or were removed. Its accuracy is compared with the last accepted validation accuracy
(``drop = reference − accuracy``, in accuracy points 0.0–1.0; positive is worse). Nothing is
extracted, swept, expired or written to any KI table.

:func:`drift_run` stages the new data without serving it: it copies the served KI table into a
new table (``<table>-drift-<fingerprint>``), re-extracts there the changed and added documents
(a changed document's old facts expire with reason ``source_changed`` once its new ones are
stored; unchanged documents cost no LLM call), expires the facts of removed documents the same
way, and registers the production extractor prompt again as a new version tagged with that table
and aliased ``candidate``. ``kitune prompts promote`` switches to it (refused while the table is
empty); ``rollback`` switches back. It runs when the check found a change, or with ``force``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import dspy

import kitune.retrieval
from kitune.config import KituneConfig
from kitune.data.checksum import document_hash
from kitune.data.loaders import Question, load_corpus, load_questions
from kitune.errors import DataError
from kitune.evaluation.report import summarize
from kitune.ki import utcnow
from kitune.optimizers.loop import Setting
from kitune.optimizers.program_task import served_programs, store_program
from kitune.programs.fact_extractor import FactExtractor
from kitune.programs.instructions import instruction_version
from kitune.retrieval.base import Store
from kitune.schema import Document, Filter
from kitune.service.pipelines.extraction import extract_corpus
from kitune.service.serving.prompts import (
    TABLE_TAG,
    open_registry,
    production_setting,
    served_table,
    state_path_for,
    table_store_cfg,
    versioned_store_cfg,
)
from kitune.service.serving.stores import expire_documents
from kitune.service.tuning import optimize as optimize_service
from kitune.service.tuning.loop_env import LoopDeps, ServiceLoopEnv
from kitune.service.tuning.options import OptimizeOptions
from kitune.service.tuning.slice_fingerprint import (
    HASH_SCHEME,
    _sha,
    archive_fingerprint,
    fingerprint,
    legacy_document_hash,
    question_hash,
    read_fingerprint,
)
from kitune.tracking.prompts import prompt_name
from kitune.usage import TokenLedger

__all__ = ["DriftReport", "DriftRun", "drift_check", "drift_run"]


@dataclass(frozen=True)
class DriftReport:
    """What :func:`drift_check` found (every list names ids, sorted)."""

    new_questions: tuple[str, ...]
    removed_questions: tuple[str, ...]
    changed_questions: tuple[str, ...]
    new_documents: tuple[str, ...]
    """Documents added to the corpus since the run."""
    removed_documents: tuple[str, ...]
    changed_documents: tuple[str, ...]
    """Documents whose title or text changed (their content hash)."""
    unchanged_documents: int
    affected_questions: tuple[str, ...]
    """New/changed questions plus those whose evidence documents were added, changed or removed."""
    reference_score: float | None
    """Accuracy of the last accepted run on its validation split (None: no iteration yet)."""
    score: float | None
    """Accuracy of the served setting on the affected questions (None: nothing evaluated)."""
    accuracy: float | None
    served_table: str = ""
    """The KI table the served setting reads (opened read-only)."""
    kis_by_status: dict[str, int] = field(default_factory=dict)
    """``active``/``stale``/``expired`` counts of the served table (read, never swept)."""
    traces_path: Path | None = None
    note: str = ""
    """Why the affected questions were not evaluated, when they were not."""

    @property
    def drop(self) -> float:
        """``reference − score`` (positive: worse); 0.0 when either is unknown."""
        if self.reference_score is None or self.score is None:
            return 0.0
        return self.reference_score - self.score

    @property
    def has_changes(self) -> bool:
        """True when any question or document is new, changed or removed."""
        return bool(
            self.new_questions
            or self.removed_questions
            or self.changed_questions
            or self.new_documents
            or self.changed_documents
            or self.removed_documents
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        out = asdict(self)
        out["traces_path"] = str(self.traces_path) if self.traces_path else None
        out["drop"] = self.drop
        return out


@dataclass(frozen=True)
class DriftRun:
    """What :func:`drift_run` did."""

    report: DriftReport
    ran: bool
    """False: nothing drifted and ``force`` was not given (nothing staged)."""
    prompt: str = ""
    """The staged prompt's name (``kitune-<corpus>-extractor``)."""
    version: int | None = None
    """Its new version (alias ``candidate``), tagged with :attr:`table`."""
    table: str = ""
    """The staged KI table."""
    kis_active: int = 0
    """Active KIs in the staged table."""
    extracted: int = 0
    """Documents (re-)extracted into it."""
    failed: tuple[str, ...] = ()
    """Documents whose extraction failed (a rerun of ``drift run`` retries them)."""
    expired_changed: int = 0
    """Old KIs of changed documents expired (``source_changed``)."""
    expired_removed: int = 0
    """KIs of removed documents expired (``source_changed``)."""


def _reference_score(state_dir: Path) -> float | None:
    path = state_dir / "loop_state.json"
    if not path.is_file():
        raise DataError(f"no loop state in {state_dir}: run `kitune optimize` first", path=str(state_dir))
    data = json.loads(path.read_text(encoding="utf-8"))
    history = data.get("history", [])
    accepted = [h for h in history if h.get("accepted")]
    # loop scores are relative to each run's own reference, so drift compares absolute accuracy
    if accepted and accepted[-1].get("candidate_val_accuracy") is not None:
        return float(accepted[-1]["candidate_val_accuracy"])
    if history and history[-1].get("val_accuracy") is not None:
        return float(history[-1]["val_accuracy"])
    return None


def _diff(
    old: dict[str, str], new: dict[str, str]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """``(added, removed, changed)`` ids, each sorted."""
    added = tuple(sorted(k for k in new if k not in old))
    removed = tuple(sorted(k for k in old if k not in new))
    changed = tuple(sorted(k for k in new if k in old and old[k] != new[k]))
    return added, removed, changed


def _load(data_dir: Path) -> tuple[list[Question], list[Document]]:
    if not Path(data_dir).exists():
        raise DataError(f"data path {data_dir} does not exist: pass --data DIR", path=str(data_dir))
    return load_questions(data_dir), load_corpus(data_dir)


def _served_env(
    cfg: KituneConfig,
    data_dir: Path,
    state_dir: Path,
    deps: LoopDeps,
    questions: Sequence[Question],
    documents: Sequence[Document],
    store_cfg: KituneConfig,
    progress: bool,
    log: Callable[[str], None],
) -> ServiceLoopEnv:
    """A loop environment whose every KI store is the served table (the check only reads it)."""
    opener = deps.store_factory
    read_deps = LoopDeps(
        lms=deps.lms,
        chat_model=deps.chat_model,
        judge=deps.judge,
        store_factory=lambda _cfg: opener(store_cfg),
        corpus_store=deps.corpus_store,
        ledger=deps.ledger,
    )
    opts = OptimizeOptions(data_dir=Path(data_dir), progress=progress, feedback=False)
    return ServiceLoopEnv(
        cfg, opts, read_deps, questions=questions, documents=documents, state_dir=state_dir, log=log
    )


def drift_check(
    cfg: KituneConfig,
    data_dir: Path,
    *,
    run_name: str = "optimize",
    deps: LoopDeps | None = None,
    progress: bool = True,
    log: Callable[[str], None] = lambda _m: None,
) -> DriftReport:
    """Compare ``data_dir`` with what run ``run_name`` saw and evaluate the served setting on what changed.

    Read-only (see the module docstring): the served KI table, the resume files and the
    registry are only read; the affected questions' traces go to
    ``<workdir>/optimize/<run>/evals/drift-<hash>.jsonl``.

    Raises:
        DataError: no fingerprint/loop state for ``run_name`` or bad data.
    """
    state_dir = Path(cfg.workdir) / "optimize" / run_name
    old = read_fingerprint(state_dir)
    reference = _reference_score(state_dir)
    questions, documents = _load(data_dir)
    legacy = old.get("hash") != HASH_SCHEME
    hash_doc = legacy_document_hash if legacy else document_hash
    nq = {q.query_id: question_hash(q) for q in questions}
    nd = {d.docid: hash_doc(d) for d in documents}
    oq: dict[str, str] = old.get("all_questions") or old.get("questions", {})
    od: dict[str, str] = old.get("corpus") or old.get("documents", {})
    new_q, removed_q, changed_q = _diff(oq, nq)
    new_d, removed_d, changed_d = _diff(od, nd)
    touched = {*new_d, *removed_d, *changed_d}
    affected = tuple(
        q.query_id
        for q in questions
        if q.query_id in new_q or q.query_id in changed_q or touched & {*q.evidence_docids, *q.gold_docids}
    )
    served = production_setting(cfg, programs=served_programs())
    table = served_table(served.store_cfg)
    store = deps.store_factory(served.store_cfg) if deps is not None else _open_read_only(served.store_cfg)
    by_status: dict[str, int] = {}
    if store is not None:
        try:
            by_status = {s: store.count(Filter(statuses=(s,))) for s in ("active", "stale", "expired")}
        finally:
            store.close()
    score = accuracy = None
    traces_path = None
    note = ""
    if affected and not by_status.get("active"):
        note = f"the served table {table} holds no active KI: the affected questions were not evaluated"
    elif affected:
        if deps is None:
            deps = optimize_service.default_deps(cfg, TokenLedger())
        subset = [q for q in questions if q.query_id in affected]
        env = _served_env(cfg, data_dir, state_dir, deps, subset, documents, served.store_cfg, progress, log)
        try:
            traces_path = state_dir / "evals" / f"drift-{_sha(sorted(nq.items()), sorted(nd.items()))}.jsonl"
            log(f"drift: evaluating the served setting on {len(subset)} affected question(s)")
            traces = env.run_agent(Setting(dict(served.prompts)), subset, traces_path=traces_path)
            summary = summarize(traces, "drift")
            score = accuracy = summary.accuracy
        finally:
            env.close()
    return DriftReport(
        new_questions=new_q,
        removed_questions=removed_q,
        changed_questions=changed_q,
        new_documents=new_d,
        removed_documents=removed_d,
        changed_documents=changed_d,
        unchanged_documents=len(nd) - len(new_d) - len(changed_d),
        affected_questions=affected,
        reference_score=reference,
        score=score,
        accuracy=accuracy,
        served_table=table,
        kis_by_status=by_status,
        traces_path=traces_path,
        note=note,
    )


def _open_read_only(store_cfg: KituneConfig) -> Store | None:
    """The store ``store_cfg`` names, or None when its table does not exist (none is created)."""
    if not kitune.retrieval.store_exists(store_cfg):
        return None
    return kitune.retrieval.create_store(store_cfg)


def _copy_kis(source: Store | None, target: Store, *, batch: int = 512) -> int:
    """Copy every KI (all statuses) of ``source`` into an empty ``target``; returns how many."""
    if source is None or target.count(Filter(statuses=())):
        return 0
    n = 0
    chunk: list[Any] = []
    for ki in source.iter_kis(Filter(statuses=())):
        chunk.append(ki)
        if len(chunk) >= batch:
            n += target.upsert(chunk).indexed
            chunk.clear()
    if chunk:
        n += target.upsert(chunk).indexed
    return n


def drift_run(
    cfg: KituneConfig,
    data_dir: Path,
    *,
    force: bool = False,
    run_name: str = "optimize",
    deps: LoopDeps | None = None,
    progress: bool = True,
    log: Callable[[str], None] = lambda _m: None,
) -> DriftRun:
    """Check drift and, when something changed (or ``force``), stage the new data (module docstring).

    Returns:
        A :class:`DriftRun`; ``ran`` False when nothing drifted and ``force`` is off.

    Raises:
        DataError: no fingerprint/loop state, or bad data.
        TrackingError: the staged version could not be registered.
    """
    report = drift_check(cfg, data_dir, run_name=run_name, deps=deps, progress=progress, log=log)
    if not report.has_changes and not force:
        log("drift: nothing changed since the run; nothing staged (pass --force to re-extract anyway)")
        return DriftRun(report=report, ran=False)
    given = deps is not None
    if deps is None:
        deps = optimize_service.default_deps(cfg, TokenLedger())
    questions, documents = _load(data_dir)
    program = store_program()
    served = production_setting(cfg, programs=served_programs())
    text = served.prompts[program]
    version = instruction_version(program, text)
    nd = {d.docid: document_hash(d) for d in documents}
    stamp = _sha(sorted(nd.items()))[:8]
    staged = f"{served_table(versioned_store_cfg(cfg, version))}-drift-{stamp}"
    staged_cfg = table_store_cfg(cfg, staged)
    source = deps.store_factory(served.store_cfg) if given else _open_read_only(served.store_cfg)
    target = deps.store_factory(staged_cfg)
    try:
        copied = _copy_kis(source, target)
        if copied:
            log(f"drift: copied {copied} KIs of {report.served_table} into the staged table {staged}")
        served_state = state_path_for(served.store_cfg, version)
        staged_state = state_path_for(staged_cfg, version)
        if served_state.is_file() and not staged_state.exists():
            staged_state.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(served_state, staged_state)
        extractor = FactExtractor.from_config(cfg, text)
        with dspy.context(lm=deps.lms["extract"]):
            extraction = extract_corpus(
                documents,
                target,
                extractor,
                cfg=cfg,
                ledger=deps.ledger,
                state_path=staged_state,
                progress=progress,
            )
        removed = expire_documents(target, report.removed_documents)
        kis_active = target.count(Filter(statuses=("active",)))
    finally:
        target.close()
        if source is not None:
            source.close()
    name = prompt_name(cfg.corpus_name, program)
    registry = open_registry(cfg)
    pv = registry.register(
        name,
        text,
        tags={TABLE_TAG: staged},
        commit_message=(
            f"kitune drift run: {len(report.changed_documents)} changed, {len(report.new_documents)} added, "
            f"{len(report.removed_documents)} removed document(s), staged in {staged}"
        ),
    )
    registry.set_alias(name, "candidate", pv.version)
    state_dir = Path(cfg.workdir) / "optimize" / run_name
    _record_staged(state_dir, report, name, pv.version, staged)
    # the staged table holds the data as it is now: its fingerprint is served once it is promoted
    now = fingerprint(questions, documents)
    archive_fingerprint(
        state_dir,
        name,
        pv.version,
        {
            **read_fingerprint(state_dir),
            **now,
            "hash": HASH_SCHEME,
            "all_questions": now["questions"],
            "corpus": now["documents"],
            "at": utcnow().isoformat(),
            "staged_by": f"kitune drift run (table {staged})",
        },
    )
    return DriftRun(
        report=report,
        ran=True,
        prompt=name,
        version=pv.version,
        table=staged,
        kis_active=kis_active,
        extracted=extraction.docs_done,
        failed=tuple(sorted(extraction.failed)),
        expired_changed=extraction.kis_source_changed,
        expired_removed=removed,
    )


def _record_staged(state_dir: Path, report: DriftReport, name: str, version: int, table: str) -> Path:
    """Append what was staged to ``<state>/drift.jsonl`` (the fingerprint still names the served data)."""
    path = state_dir / "drift.jsonl"
    with path.open("a", encoding="utf-8") as fh:
        fh.write(
            json.dumps(
                {
                    "prompt": name,
                    "version": version,
                    "table": table,
                    **{k: v for k, v in report.to_dict().items() if k.endswith(("questions", "documents"))},
                }
            )
            + "\n"
        )
    return path
