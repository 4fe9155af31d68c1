"""``kitune drift check|run``: re-evaluate the production prompts on new or changed data.

What the last optimisation run saw is stored beside its loop state as
``<workdir>/optimize/<run name>/fingerprint.json``: one SHA-256 per question (text, answer,
aliases, evidence ids) and per document (title + text), written by
:func:`kitune.service.tuning.optimize.run_optimize`. :func:`drift_check` compares the data folder with it:

* questions that are new or changed, plus questions whose evidence documents changed, are the
  *affected* questions; changed documents are re-extracted (their resume entries are reset);
* the production setting (the loop's current one) is evaluated on the affected questions and
  its judge accuracy is compared with the last accepted validation accuracy (``drop =
  reference − score``, in accuracy points 0.0–1.0; positive is worse). Accuracy, not the loop
  score: loop scores are relative to each run's own reference run, so they do not compare
  across question sets;
* the KI store's lifecycle sweep runs and the active/stale/expired counts are reported.

:func:`drift_run` re-runs the loop (one more iteration) on the new data when ``drop >
threshold``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kitune.config import KituneConfig
from kitune.errors import DataError
from kitune.evaluation.report import summarize
from kitune.ki import utcnow
from kitune.optimizers.loop import Setting
from kitune.optimizers.program_task import program_names
from kitune.schema import Filter
from kitune.service.pipelines.extraction import default_state_path
from kitune.service.serving.stores import expire_kis, retention_from, stale_after_from
from kitune.service.tuning import optimize as optimize_service
from kitune.service.tuning.loop_env import LoopDeps, ServiceLoopEnv
from kitune.service.tuning.options import OptimizeOptions
from kitune.service.tuning.slice_fingerprint import (
    _sha,
    fingerprint,
    read_fingerprint,
)
from kitune.service.tuning.slicing import load_slice
from kitune.usage import TokenLedger

__all__ = ["DriftReport", "drift_check", "drift_run"]


@dataclass(frozen=True)
class DriftReport:
    """What :func:`drift_check` found."""

    new_questions: tuple[str, ...]
    changed_questions: tuple[str, ...]
    new_documents: tuple[str, ...]
    changed_documents: tuple[str, ...]
    removed_documents: tuple[str, ...]
    affected_questions: tuple[str, ...]
    """New/changed questions plus those whose evidence documents changed."""
    reference_score: float | None
    """Loop score of the last accepted run on its validation split (None: no iteration yet)."""
    score: float | None
    """Loop score of the production setting on the affected questions (None: nothing affected)."""
    accuracy: float | None
    kis_by_status: Mapping[str, int] = field(default_factory=dict)
    """``active``/``stale``/``expired`` counts after the lifecycle sweep."""
    swept: Mapping[str, int] = field(default_factory=dict)
    """KIs the sweep just moved to ``stale``/``expired``."""
    traces_path: Path | None = None

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


def _reference_score(state_dir: Path) -> tuple[float | None, Setting | None]:
    path = state_dir / "loop_state.json"
    if not path.is_file():
        return None, None
    data = json.loads(path.read_text(encoding="utf-8"))
    history = data.get("history", [])
    current = Setting.from_dict(data["current"]) if "current" in data else None
    accepted = [h for h in history if h.get("accepted")]
    # loop scores are relative to each run's own reference, so drift compares absolute accuracy
    if accepted and accepted[-1].get("candidate_val_accuracy") is not None:
        return float(accepted[-1]["candidate_val_accuracy"]), current
    if history and history[-1].get("val_accuracy") is not None:
        return float(history[-1]["val_accuracy"]), current
    return None, current


def _reset_extraction(env: ServiceLoopEnv, setting: Setting, docids: Sequence[str]) -> None:
    """Mark changed documents not-done in the extractor version's resume file."""
    if not docids:
        return

    path = default_state_path(env.setting_cfg(setting), env.extractor(setting).prompt_version)
    if not path.is_file():
        return
    with path.open("a", encoding="utf-8") as fh:
        for d in docids:
            fh.write(json.dumps({"docid": d, "status": "changed", "at": utcnow().isoformat()}) + "\n")


def drift_check(
    cfg: KituneConfig,
    data_dir: Path,
    *,
    run_name: str = "optimize",
    deps: LoopDeps | None = None,
    progress: bool = True,
    log: Callable[[str], None] = lambda _m: None,
) -> DriftReport:
    """Compare ``data_dir`` with what run ``run_name`` saw and re-evaluate the affected questions.

    Raises:
        DataError: no fingerprint/loop state for ``run_name`` or bad data.
    """
    state_dir = Path(cfg.workdir) / "optimize" / run_name
    old = read_fingerprint(state_dir)
    reference, setting = _reference_score(state_dir)
    if setting is None:
        raise DataError(f"no loop state in {state_dir}: run `kitune optimize` first", path=str(state_dir))
    saved = old.get("options", {})
    opts = OptimizeOptions(
        data_dir=Path(data_dir),
        questions=saved.get("questions"),
        sample_seed=saved.get("sample_seed"),
        distractors=int(saved.get("distractors", 0)),
        programs=tuple(saved.get("programs", ())) or tuple(setting.prompts),
        run_name=run_name,
        progress=progress,
        feedback=False,
    )
    questions, documents = load_slice(cfg, opts)
    new = fingerprint(questions, documents)
    oq, od = old.get("questions", {}), old.get("documents", {})
    nq, nd = new["questions"], new["documents"]
    new_q = tuple(q for q in nq if q not in oq)
    changed_q = tuple(q for q in nq if q in oq and oq[q] != nq[q])
    new_d = tuple(d for d in nd if d not in od)
    changed_d = tuple(d for d in nd if d in od and od[d] != nd[d])
    removed_d = tuple(d for d in od if d not in nd)
    touched = set(changed_d) | set(new_d)
    affected = tuple(
        q.query_id
        for q in questions
        if q.query_id in new_q or q.query_id in changed_q or touched & {*q.evidence_docids, *q.gold_docids}
    )
    if deps is None:
        deps = optimize_service.default_deps(cfg, TokenLedger())
    env = ServiceLoopEnv(
        cfg, opts, deps, questions=questions, documents=documents, state_dir=state_dir, log=log
    )
    score = accuracy = None
    traces_path = None
    try:
        _reset_extraction(env, setting, changed_d)
        if affected:
            subset = [q for q in questions if q.query_id in affected]
            env.ensure_extracted(setting, subset)
            traces_path = state_dir / "evals" / f"drift-{_sha(sorted(nq.items()), sorted(nd.items()))}.jsonl"
            log(f"drift: evaluating the production setting on {len(subset)} affected question(s)")
            traces = env.run_agent(setting, subset, traces_path=traces_path)
            summary = summarize(traces, "drift")
            score, accuracy = summary.accuracy, summary.accuracy
        store = env.store_for(setting)

        # derived KIs (disambiguation, source descriptions) keep their own window
        swept = expire_kis(store, stale_after=stale_after_from(cfg), retention=retention_from(cfg))
        by_status = {s: store.count(Filter(statuses=(s,))) for s in ("active", "stale", "expired")}
    finally:
        env.close()
    return DriftReport(
        new_questions=new_q,
        changed_questions=changed_q,
        new_documents=new_d,
        changed_documents=changed_d,
        removed_documents=removed_d,
        affected_questions=affected,
        reference_score=reference,
        score=score,
        accuracy=accuracy,
        kis_by_status=by_status,
        swept={"stale": swept.stale, "expired": swept.expired},
        traces_path=traces_path,
    )


def drift_run(
    cfg: KituneConfig,
    data_dir: Path,
    *,
    threshold: float,
    run_name: str = "optimize",
    deps: LoopDeps | None = None,
    progress: bool = True,
    log: Callable[[str], None] = lambda _m: None,
    **optimize_kwargs: Any,
) -> tuple[DriftReport, Any]:
    """Check drift and, when ``drop > threshold``, run one more loop iteration on the new data.

    Returns:
        ``(report, OptimizeResult or None)``.

    Raises:
        ValueError: ``threshold`` < 0.
    """
    if threshold < 0:
        raise ValueError(f"threshold={threshold}: use 0 or more (a loop-score drop)")
    report = drift_check(cfg, data_dir, run_name=run_name, deps=deps, progress=progress, log=log)
    if report.drop <= threshold:
        log(f"drift: drop {report.drop:.3f} ≤ threshold {threshold:.3f}; the loop is not re-run")
        return report, None

    state_dir = Path(cfg.workdir) / "optimize" / run_name
    done = len(json.loads((state_dir / "loop_state.json").read_text(encoding="utf-8")).get("history", []))
    saved = read_fingerprint(state_dir).get("options", {})
    opts = OptimizeOptions(
        data_dir=Path(data_dir),
        questions=saved.get("questions"),
        sample_seed=saved.get("sample_seed"),
        distractors=int(saved.get("distractors", 0)),
        programs=tuple(saved.get("programs", ())) or program_names(),
        iterations=done + 1,
        run_name=run_name,
        progress=progress,
        **optimize_kwargs,
    )
    log(f"drift: drop {report.drop:.3f} > threshold {threshold:.3f}; running iteration {done}")
    return report, optimize_service.run_optimize(cfg, opts, deps=deps, log=log)
