"""The review queue's actions, shared by ``kitune review``, ``/api/proposals`` and the MCP tools.

* :class:`ReviewService` — list / show / approve / reject / revert over a
  :class:`~kitune.service.workflows.proposals.ProposalStore`. Approving applies the change through the
  normal paths (:func:`apply_change`): KIs by ``Store.upsert``; a retirement by writing the KI
  back with status ``expired`` (soft, not served, nothing deleted); rewriter feedback as a new
  version of the rewriter prompt in the registry, promoted to ``production``. Reverting undoes it
  (:func:`revert_change`): a KI that did not exist before becomes ``expired`` (never deleted), an
  overwritten KI gets its previous record back, a retired KI its previous status, the prompt
  its previous production version. Every action is one event in the queue and one MLflow run
  ``review-<id>-<action>`` (params: kind, action, actor, status; the effect's metrics; the
  proposal as ``review/proposal.json``).
* :func:`measure_effect` — a proposal's measured effect on labelled questions: the current
  setting and the proposal are evaluated on the same questions, paired
  (:func:`kitune.optimizers.acceptance.compare_paired`) and decided by the configured rule
  (``optimize.decision_rule``): ``stage`` (the default, the loop's rule) gives **accepted**,
  **rejected** or **kept the incumbent: not enough evidence**, with n, effect, interval and p —
  a rewriter instruction by a one-sided sign test on end-to-end accuracy
  (:func:`~kitune.optimizers.acceptance.decide_stage`), a KI change as a KI batch: not worse by
  ``optimize.noninferiority_margin`` on the labelled questions' gold reciprocal ranks and end to
  end (:func:`~kitune.optimizers.acceptance.decide_noninferior`; on end-to-end accuracy alone
  when no labelled question names a gold document), the proposals one filing
  measures sharing ``optimize.alpha`` (Bonferroni); ``permissive`` the old ``decide`` (margin,
  failed-share limit, significance switch). KI changes are
  measured on an in-memory copy of the KI table (:func:`scratch_copy`: same KIs and statuses,
  same RRF and weights, the embedded store's BM25 and vectors), so production never serves a
  change under test; rewriter feedback runs the two instructions on the table itself (read only).
  A KI change (re-extraction, added or retired KIs) is also checked on retrieval, with no LLM
  call: each labelled question with gold documents is looked up (plain plan,
  ``retrieval.default_size`` KIs) on the copy before and after the change, and a question whose
  gold recall@k is lost or whose gold reciprocal rank falls by more than
  ``optimize.gate_rank_tolerance`` makes the decision ``rejected`` (reason ``retrieval: …``),
  whatever the answers or the test said (the rule of :mod:`kitune.optimizers.gate`: the first filter);
* :func:`file_proposals` — propose from a signal report, file what is new, measure effects when
  labelled questions and an evaluator are given, and approve automatically only the kinds in
  ``review.auto_approve`` whose gate decision is ``accepted``.
"""

from __future__ import annotations

import builtins
import json
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dspy

import kitune.lm
import kitune.retrieval
from kitune.config import KituneConfig
from kitune.data.loaders import load_corpus
from kitune.errors import (
    ConfigError,
    DocumentNotFoundError,
    PromptNotFoundError,
    ProposalStateError,
    StoreError,
)
from kitune.evaluation.metrics import Trace
from kitune.evaluation.signals import SignalReport
from kitune.evaluation.stage_metrics import gold_documents, reciprocal_rank
from kitune.ki import KI, utcnow
from kitune.optimizers.acceptance import (
    Decision,
    PairedComparison,
    batch_tests,
    check_instruction,
    compare_paired,
    decide,
    decide_noninferior,
    decide_stage,
    trace_values,
)
from kitune.optimizers.credit import KICredit, load_run_credit
from kitune.optimizers.gate import RankChange, rank_changes
from kitune.optimizers.objective import LoopWeights
from kitune.optimizers.routes import kinds_for_proposal
from kitune.programs.fact_extractor import FactExtractor
from kitune.retrieval.memory import MemoryStore
from kitune.schema import Document, Filter
from kitune.service.pipelines.evaluation import make_context_fn, run_eval
from kitune.service.serving.context import get_context
from kitune.service.serving.prompts import open_registry, production_setting
from kitune.service.serving.setting import open_serving_store, rewriter_for
from kitune.service.workflows.proposals import (
    Drafter,
    Proposal,
    ProposalStore,
    ProposeResult,
    RewriterPrompt,
    propose,
)
from kitune.tracking.prompts import prompt_name, register_packaged
from kitune.tracking.trackers import create_tracker

if TYPE_CHECKING:
    from kitune.data.loaders import Question
    from kitune.optimizers.protocols import Tracker
    from kitune.retrieval.base import Store
    from kitune.tracking.prompts import PromptRegistry

__all__ = [
    "Evaluator",
    "FileReport",
    "ReviewService",
    "apply_change",
    "corpus_documents",
    "default_drafter",
    "default_evaluator",
    "file_proposals",
    "measure_effect",
    "open_review",
    "production_rewriter",
    "revert_change",
    "review_opener",
    "scratch_copy",
    "snapshot",
]

Evaluator = Callable[["Sequence[Question]", "Store", "str | None", str], list[Trace]]
"""``(questions, KI store, rewriter instruction or None for plain plans, run label) → traces``."""


# -- applying and reverting ------------------------------------------------------------------


def _get(store: Store, ki_id: str) -> KI | None:
    try:
        return store.get(ki_id)
    except DocumentNotFoundError:
        return None


def _write(store: Store, kis: Sequence[KI], what: str) -> None:
    if not kis:
        return
    result = store.upsert(list(kis))
    if not result.ok:
        reasons = "; ".join(f"{f.id}: {f.reason}" for f in result.failed[:3])
        raise StoreError(f"{what}: {len(result.failed)} of {result.submitted} KI(s) not written ({reasons})")


def _with_status(ki: KI, status: str) -> KI:
    return ki.model_copy(update={"payload": ki.payload.model_copy(update={"status": status})})


def snapshot(p: Proposal, store: Store) -> dict[str, Any]:
    """The revert record of a KI proposal, taken before it is applied (see :func:`apply_change`)."""
    if p.kind == "retire_ki":
        found = {i: _get(store, i) for i in p.change.get("ki_ids", [])}
        return {"before_status": {i: k.payload.status for i, k in found.items() if k is not None}}
    return {"before": {k.id: _dump(_get(store, k.id)) for k in p.kis()}}


def apply_change(p: Proposal, *, store: Store, registry: PromptRegistry | None = None) -> dict[str, Any]:
    """Apply a proposal's change (see the module docstring); idempotent when repeated after a crash.

    Returns:
        What is needed to revert it: ``{"before": {ki id: previous KI JSON or None}}`` for KI
        writes, ``{"before_status": {ki id: status}}`` for a retirement, ``{"prompt", "from_version",
        "to_version"}`` for rewriter feedback.

    Raises:
        StoreError: a KI could not be written. ProposalStateError: the production rewriter
        changed since the proposal was made (reject it; the next signals propose afresh).
        ConfigError: rewriter feedback without a prompt registry.
    """
    if p.kind in ("re_extract", "add_ki"):
        kis = p.kis()
        previous = (p.applied or {}).get("before")
        before = previous if previous is not None else {k.id: _dump(_get(store, k.id)) for k in kis}
        _write(store, kis, f"applying {p.id}")
        return {"before": before}
    if p.kind == "retire_ki":
        previous = (p.applied or {}).get("before_status")
        before_status: dict[str, str] = dict(previous or {})
        retired = []
        for ki_id in p.change.get("ki_ids", []):
            ki = _get(store, ki_id)
            if ki is None:
                continue
            before_status.setdefault(ki_id, ki.payload.status)
            if ki.payload.status != "expired":
                retired.append(_with_status(ki, "expired"))
        _write(store, retired, f"retiring for {p.id}")
        return {"before_status": before_status}
    if p.kind == "rewriter_feedback":
        return _apply_prompt(p, registry)
    raise ProposalStateError(f"proposal {p.id}: unknown kind {p.kind!r}", proposal_id=p.id)


def _dump(ki: KI | None) -> dict[str, Any] | None:
    return ki.model_dump(mode="json") if ki is not None else None


def _apply_prompt(p: Proposal, registry: PromptRegistry | None) -> dict[str, Any]:
    if registry is None:
        raise ConfigError(
            "rewriter feedback needs the prompt registry: set tracking.tracking_uri to sqlite:///…"
        )
    name = str(p.change["prompt"])
    done = p.applied or {}
    if done.get("to_version") is not None:  # resumed after the version was registered
        registry.promote(name, int(done["to_version"]))
        return dict(done)
    corpus_program = name.removeprefix("kitune-").rsplit("-", 1)
    try:
        current = registry.get(name, "production")
    except PromptNotFoundError:
        register_packaged(registry, corpus_program[0], [corpus_program[-1]])
        current = registry.get(name, "production")
    if current.text != p.change["base_text"]:
        raise ProposalStateError(
            f"proposal {p.id}: the production rewriter changed since it was proposed (now "
            f"v{current.version}); reject it — the next signals propose feedback on the current prompt",
            proposal_id=p.id,
            status=p.status,
        )
    new = registry.register(
        name,
        str(p.change["new_text"]),
        tags={"kitune.review": p.id},
        commit_message=f"kitune review {p.id}: feedback on {len(p.change.get('queries', []))} empty look-ups",
    )
    registry.promote(name, new.version)
    return {"prompt": name, "from_version": current.version, "to_version": new.version}


def revert_change(p: Proposal, *, store: Store, registry: PromptRegistry | None = None) -> dict[str, Any]:
    """Undo an applied proposal, softly (see the module docstring).

    Returns:
        What the revert did (``{"expired": [...], "restored": [...]}`` or the prompt versions).

    Raises:
        StoreError: a KI could not be written. ConfigError: no registry for a prompt revert.
    """
    applied = p.applied or {}
    if p.kind in ("re_extract", "add_ki"):
        expired, restored = [], []
        for ki_id, old in sorted(applied.get("before", {}).items()):
            if old is None:
                ki = _get(store, ki_id)
                if ki is not None and ki.payload.status != "expired":
                    expired.append(_with_status(ki, "expired"))
            else:
                restored.append(KI.model_validate(old))
        _write(store, [*expired, *restored], f"reverting {p.id}")
        return {"expired": [k.id for k in expired], "restored": [k.id for k in restored]}
    if p.kind == "retire_ki":
        back = []
        for ki_id, status in sorted(applied.get("before_status", {}).items()):
            ki = _get(store, ki_id)
            if ki is not None and ki.payload.status != status:
                back.append(_with_status(ki, status))
        _write(store, back, f"reverting {p.id}")
        return {"restored_status": {k.id: k.payload.status for k in back}}
    if p.kind == "rewriter_feedback":
        if registry is None:
            raise ConfigError("reverting rewriter feedback needs the prompt registry")
        registry.promote(str(applied["prompt"]), int(applied["from_version"]))
        return {"prompt": applied["prompt"], "production_version": applied["from_version"]}
    raise ProposalStateError(f"proposal {p.id}: unknown kind {p.kind!r}", proposal_id=p.id)


# -- measuring the effect ----------------------------------------------------------------------


def scratch_copy(store: Store, cfg: KituneConfig) -> Store:
    """An in-memory copy of every KI (all statuses) with the configured embedder and retrieval knobs."""
    copy = MemoryStore(kitune.retrieval.create_embedder(cfg.embedder), cfg.retrieval)
    kis = list(store.iter_kis(Filter(statuses=("active", "stale", "expired"))))
    _write(copy, kis, "copying the KI table")
    return copy


def measure_effect(
    cfg: KituneConfig,
    p: Proposal,
    questions: Sequence[Question],
    *,
    store: Store,
    evaluate: Evaluator,
    scratch: Callable[[Store], Store] | None = None,
    tests_in_round: int = 1,
) -> dict[str, Any]:
    """Evaluate the current setting and the proposal on the same labelled questions and decide.

    Args:
        cfg: ``optimize`` weights, margin, ``max_failed_share``, ``require_significance``.
        p: the proposal.
        questions: labelled questions (gold answers), ≥ 1.
        store: the production KI table (never written for KI kinds: a scratch copy is).
        evaluate: runs the agent (:data:`Evaluator`).
        scratch: store → a writable copy (default :func:`scratch_copy`).
        tests_in_round: proposals measured together (:func:`file_proposals` passes how many it
            measures), ≥ 1: under the stage rule they share ``optimize.alpha`` (Bonferroni).

    Returns:
        ``{"questions", "targets", "comparison": PairedComparison.to_dict(), "rule", "decision":
        {"outcome", "reason", "changes"}, "measured_at"}``; ``outcome`` is ``accepted``,
        ``rejected``, ``not_enough_evidence`` (the stage rule: nothing shown either way) or
        ``undecided`` (an outage); ``changes`` (stage rule) the test's record — n, effect, interval,
        p, the level it had to reach (:meth:`~kitune.optimizers.acceptance.ChangeDecision.to_dict`);
        ``targets`` are the failure kinds this proposal's kind addresses (the feedback route table,
        :func:`kitune.optimizers.routes.kinds_for_proposal`). KI changes add ``retrieval``:
        ``{"checked", "tolerance", "drops": [{"query_id", "before", "after"}]}`` (see the module
        docstring); a drop makes the outcome ``rejected``.

    Raises:
        ValueError: no questions.
    """
    if not questions:
        raise ValueError("measuring an effect needs labelled questions (gold answers)")
    o = cfg.optimize
    problems: list[str] = []
    changes: list[RankChange] = []
    if p.kind == "rewriter_feedback":
        base_text, new_text = str(p.change["base_text"]), str(p.change["new_text"])
        problems = check_instruction("rewriter", base_text, new_text)
        current = evaluate(questions, store, base_text, f"{p.id}-current")
        candidate = evaluate(questions, store, new_text, f"{p.id}-proposal")
    else:
        copy = (scratch or (lambda s: scratch_copy(s, cfg)))(store)
        current = evaluate(questions, copy, None, f"{p.id}-current")
        before = _gold_ranks(cfg, questions, copy)
        apply_change(p, store=copy)
        candidate = evaluate(questions, copy, None, f"{p.id}-proposal")
        after = _gold_ranks(cfg, questions, copy)
        added = [str(k["id"]) for k in p.change.get("kis", ()) if isinstance(k, dict) and "id" in k]
        changes = rank_changes(before[0], after[0], after[1], added if p.kind != "retire_ki" else ())
    weights = LoopWeights.from_config(cfg)
    comparison = compare_paired(current, candidate, weights, seed=o.seed)
    if o.decision_rule == "stage":
        decision = _decide_stage(cfg, p, comparison, current, candidate, problems, changes, tests_in_round)
    else:
        decision = decide(
            comparison,
            changed_programs=("rewriter",) if p.kind == "rewriter_feedback" else (),
            store_changed=p.kind != "rewriter_feedback",
            margin=o.accept_margin,
            max_failed_share=o.max_failed_share,
            require_significance=o.require_significance,
            sanity_problems=problems,
        )
    outcome, reason = decision.outcome, decision.reason
    out: dict[str, Any] = {
        "questions": len(questions),
        "targets": list(kinds_for_proposal(p.kind)),
        "comparison": comparison.to_dict(),
        "rule": o.decision_rule,
    }
    if p.kind != "rewriter_feedback":
        drops: list[RankChange] = [c for c in changes if c.dropped(o.gate_rank_tolerance)]
        out["retrieval"] = {
            "checked": len(changes),
            "tolerance": o.gate_rank_tolerance,
            "drops": [{"query_id": c.query_id, "before": c.before, "after": c.after} for c in drops],
        }
        if drops:
            outcome = "rejected"
            reason = "retrieval: " + "; ".join(c.describe() for c in drops) + f" (answers: {reason})"
    out["decision"] = {"outcome": outcome, "reason": reason}
    if decision.changes:
        out["decision"]["changes"] = [c.to_dict() for c in decision.changes]
    out["measured_at"] = utcnow().isoformat()
    return out


def _decide_stage(
    cfg: KituneConfig,
    p: Proposal,
    comparison: PairedComparison,
    current: Sequence[Trace],
    candidate: Sequence[Trace],
    problems: Sequence[str],
    ranks: Sequence[RankChange],
    tests_in_round: int,
) -> Decision:
    """The stage rule on a proposal's labelled questions (``optimize.decision_rule: stage``).

    ``rewriter_feedback`` is a prompt change: :func:`~kitune.optimizers.acceptance.decide_stage`
    on end-to-end accuracy (the rewriter's per-question recall would need a rewrite per question
    with each instruction; the agent runs already hold the answers), a one-sided exact sign test.
    A KI change (``re_extract``, ``add_ki``, ``retire_ki``) is a KI batch:
    :func:`~kitune.optimizers.acceptance.decide_noninferior` on every labelled question's gold
    reciprocal rank (plain plan, top ``retrieval.default_size``) before vs after the change, and
    end-to-end accuracy before vs after (when no labelled question has a gold document: the
    non-inferiority test on end-to-end accuracy alone). Both at ``optimize.alpha / tests_in_round``.
    """
    o = cfg.optimize
    if p.kind == "rewriter_feedback":
        return decide_stage(
            comparison,
            {},
            {},
            current,
            candidate,
            changed_programs=("rewriter",),
            sanity_problems=problems,
            alpha=o.alpha,
            min_effect=o.min_effect,
            noninferiority_margin=o.noninferiority_margin,
            max_failed_share=o.max_failed_share,
            seed=o.seed,
            other_tests=tests_in_round - 1,
        )
    # the outage check shared by both rules (decide's first step): too many failed runs decide nothing
    early = decide(comparison, store_changed=True, max_failed_share=o.max_failed_share)
    if early.outcome == "undecided":
        return early
    test, e2e = batch_tests(  # no labelled question with a gold document: the answers alone
        {c.query_id: c.before for c in ranks},
        {c.query_id: c.after for c in ranks},
        trace_values(current),
        trace_values(candidate),
        margin=o.noninferiority_margin,
        alpha=o.alpha,
        seed=o.seed,
    )
    verdict = decide_noninferior(
        p.kind,
        test,
        alpha=o.alpha,
        tests_in_round=tests_in_round,
        end_to_end=e2e,
        noninferiority_margin=o.noninferiority_margin,
    )
    return Decision(verdict.outcome, verdict.reason, (verdict,))


def _gold_ranks(
    cfg: KituneConfig, questions: Sequence[Question], store: Store
) -> tuple[dict[str, float], dict[str, list[str]]]:
    """Per labelled question with gold documents: its gold reciprocal rank in the top ``k`` and those KI ids.

    One plain-plan ``get_context`` per question (no rewriter, no LLM call), ``k =
    retrieval.default_size``.
    """
    k = cfg.retrieval.default_size
    ranks: dict[str, float] = {}
    ids: dict[str, list[str]] = {}
    for q in questions:
        golds = gold_documents(q)
        if not golds:
            continue
        kis = get_context(q.query, store=store, size=k, cfg=cfg).kis
        ranks[q.query_id] = reciprocal_rank(golds, kis, k)
        ids[q.query_id] = [x.id for x in kis[:k]]
    return ranks, ids


# -- the service ---------------------------------------------------------------------------------


@dataclass
class ReviewService:
    """The queue's actions over one KI table and one prompt registry (see the module docstring).

    Args:
        cfg: the configuration (``review``, ``optimize``).
        queue: the proposal store.
        store: the production KI table, or a function opening it on first use.
        registry: the prompt registry, or a function opening it (None: rewriter proposals cannot
            be applied).
        tracker: where actions are logged (None: not logged).
    """

    cfg: KituneConfig
    queue: ProposalStore
    store: Store | Callable[[], Store]
    registry: PromptRegistry | Callable[[], PromptRegistry] | None = None
    tracker: Tracker | None = None
    _opened: dict[str, Any] = field(default_factory=dict, repr=False)

    def kis(self) -> Store:
        """The KI table (opened once)."""
        if "store" not in self._opened:
            self._opened["store"] = self.store() if callable(self.store) else self.store
        return self._opened["store"]  # type: ignore[no-any-return]

    def prompts(self) -> PromptRegistry | None:
        """The prompt registry (opened once), or None."""
        if "registry" not in self._opened:
            reg = self.registry
            self._opened["registry"] = reg() if callable(reg) else reg
        return self._opened["registry"]  # type: ignore[no-any-return]

    def _settle(
        self, pid: str, current: str, status: str, *, actor: str, reason: str, **more: Any
    ) -> Proposal:
        """Move a proposal from ``current`` to its decided ``status`` and log it (approve, reject, revert).

        The event is named after the new status, ``reason`` becomes the proposal's reason, and
        ``more`` goes to :meth:`ProposalStore.transition` as is (``detail``, ``applied``).

        Raises:
            ProposalNotFoundError: unknown id. ProposalStateError: the status is not ``current``.
        """
        p = self.queue.transition(
            pid, (current,), action=status, actor=actor, reason=reason, set_reason=True, status=status, **more
        )
        self._log(p, status, actor)
        return p

    def _log(self, p: Proposal, action: str, actor: str) -> None:
        if self.tracker is None:
            return
        params = {
            "review.kind": p.kind,
            "review.action": action,
            "review.actor": actor,
            "review.status": p.status,
        }
        tags = {"kitune.kind": "review", "kitune.proposal": p.id}
        with self.tracker.run(f"review-{p.id}-{action}", params, tags=tags, nested=False) as h:
            metrics = {f"review_{p.kind}_{action}": 1.0}
            comparison = (p.effect or {}).get("comparison")
            if comparison:
                metrics.update(
                    {
                        "effect_accuracy_diff": float(comparison["accuracy_diff"]),
                        "effect_fixed": float(len(comparison["fixed"])),
                        "effect_broken": float(len(comparison["broken"])),
                        "effect_score_diff": float(comparison["score_diff"]),
                    }
                )
            self.tracker.log_metrics(metrics, run_id=h.run_id)
            self.tracker.log_dict(p.to_dict(), "review/proposal.json", run_id=h.run_id)

    def list(self, *, status: str | None = None, kind: str | None = None) -> list[Proposal]:
        """Proposals in filing order (see :meth:`ProposalStore.list`)."""
        return self.queue.list(status=status, kind=kind)

    def show(self, pid: str) -> tuple[Proposal, builtins.list[dict[str, Any]]]:
        """A proposal and its events.

        Raises:
            ProposalNotFoundError: unknown id.
        """
        return self.queue.get(pid), self.queue.events(pid)

    def file(self, proposals: Sequence[Proposal], *, actor: str = "proposer") -> builtins.list[Proposal]:
        """Put new proposals in the queue (known ids skipped) and log each."""
        filed = self.queue.add(proposals, actor=actor)
        for p in filed:
            self._log(p, "filed", actor)
        return filed

    def record_effect(self, pid: str, effect: dict[str, Any], *, actor: str = "proposer") -> Proposal:
        """Store a measured effect on a pending proposal."""
        decision = effect.get("decision", {})
        p = self.queue.transition(
            pid,
            ("pending",),
            action="effect_measured",
            actor=actor,
            reason=str(decision.get("reason", "")),
            detail={"outcome": decision.get("outcome")},
            effect=effect,
        )
        self._log(p, "effect", actor)
        return p

    def approve(self, pid: str, *, actor: str = "cli", reason: str = "") -> Proposal:
        """Apply a pending proposal (or resume one left ``applying``) and mark it approved.

        Raises:
            ProposalNotFoundError: unknown id. ProposalStateError: not pending/applying, or the
            production rewriter changed since. StoreError: KIs could not be written (the
            proposal stays ``applying``; approve again to retry).
        """
        p = self.queue.transition(
            pid, ("pending", "applying"), action="applying", actor=actor, status="applying"
        )
        try:
            if p.applied is None and p.kind != "rewriter_feedback":
                # what the KIs were before, recorded before anything is written: a crash mid-write
                # and a second approve still revert to the true previous state
                p = self.queue.transition(
                    pid, ("applying",), action="snapshot", actor=actor, applied=snapshot(p, self.kis())
                )
            applied = apply_change(p, store=self.kis(), registry=self.prompts())
        except Exception as e:
            self.queue.transition(
                pid, ("applying",), action="apply_failed", actor=actor, reason=f"{type(e).__name__}: {e}"
            )
            raise
        return self._settle(pid, "applying", "approved", actor=actor, reason=reason, applied=applied)

    def reject(self, pid: str, *, reason: str, actor: str = "cli") -> Proposal:
        """Reject a pending proposal; it stays in the history so the change is not proposed again.

        Raises:
            ValueError: blank reason. ProposalNotFoundError, ProposalStateError.
        """
        if not reason.strip():
            raise ValueError("a rejection needs a reason (--reason TEXT): it is kept in the history")
        return self._settle(pid, "pending", "rejected", actor=actor, reason=reason)

    def revert(self, pid: str, *, reason: str = "", actor: str = "cli") -> Proposal:
        """Undo an approved proposal, softly; it is remembered like a rejection.

        Raises:
            ProposalNotFoundError, ProposalStateError (not approved), StoreError.
        """
        p = self.queue.get(pid)
        if p.status != "approved":
            raise ProposalStateError(
                f"proposal {pid} is {p.status}: only an approved proposal can be reverted", proposal_id=pid
            )
        done = revert_change(p, store=self.kis(), registry=self.prompts())
        return self._settle(pid, "approved", "reverted", actor=actor, reason=reason, detail=done)

    def close(self) -> None:
        """Close the KI table if this service opened it."""
        store = self._opened.pop("store", None)
        if store is not None and callable(self.store):
            store.close()


# -- filing from signals -------------------------------------------------------------------------


@dataclass
class FileReport:
    """What :func:`file_proposals` did."""

    proposed: ProposeResult
    filed: list[Proposal] = field(default_factory=list)
    measured: list[str] = field(default_factory=list)
    """Ids whose effect was measured on labelled questions."""
    auto_approved: list[str] = field(default_factory=list)
    gate_refused: dict[str, str] = field(default_factory=dict)
    """Auto-approvable proposal id → why the gate did not approve it (stays pending)."""
    errors: list[str] = field(default_factory=list)
    """Measurements or applications that failed (``<id>: <error>``); counted, never fatal."""


def file_proposals(
    service: ReviewService,
    report: SignalReport,
    *,
    documents: Callable[[str], Document | None] | None = None,
    draft: Drafter | None = None,
    extractor_version: str = "",
    rewriter: RewriterPrompt | None = None,
    questions: Sequence[Question] = (),
    evaluate: Evaluator | None = None,
    measure_kinds: Collection[str] | None = None,
    actor: str = "proposer",
    credit: Mapping[str, KICredit] | None = None,
) -> FileReport:
    """Propose from ``report``, file the new proposals, measure and gate (see the module docstring).

    Args:
        service: the review service (queue, KI table, registry, tracker).
        report: the signals.
        documents: docid → document (see :func:`kitune.service.workflows.proposals.propose`).
        draft: the production extractor (None: no KI drafting).
        extractor_version: the extractor's version (part of the re-extract key).
        rewriter: the production rewriter instruction (None: no rewriter feedback).
        questions: labelled questions for the effect (the newest ``review.effect_questions`` are used).
        evaluate: the agent run (:data:`Evaluator`); None: effects are not measured.
        measure_kinds: measure only proposals of these kinds (None: every kind); a kind in
            ``review.auto_approve`` that is not measured is not approved.
        actor: who files (``cli``, ``watch``).
        credit: KI id → credit for ``retire_ki`` (see :func:`~kitune.service.workflows.proposals.propose`);
            None: every loop run's ``<workdir>/optimize/*/ki_credit.json`` summed
            (:func:`~kitune.optimizers.credit.load_run_credit`; none there: the signals alone).

    Returns:
        What was proposed, filed, measured and approved; a proposal of a kind in
        ``review.auto_approve`` is approved only when its measured decision is ``accepted``.
    """
    cfg = service.cfg
    proposed = propose(
        report,
        cfg=cfg,
        store=service.kis(),
        held=service.queue.held_keys(),
        documents=documents,
        draft=draft,
        extractor_version=extractor_version,
        rewriter=rewriter,
        credit=credit
        if credit is not None
        else load_run_credit(sorted((Path(cfg.workdir) / "optimize").glob("*/ki_credit.json"))),
    )
    out = FileReport(proposed=proposed, filed=service.file(proposed.proposals, actor=actor))
    labelled = list(questions)[-cfg.review.effect_questions :]
    measured = [p for p in out.filed if measure_kinds is None or p.kind in measure_kinds]
    round_size = max(1, len(measured)) if labelled and evaluate is not None else 1
    for p in out.filed:
        auto = p.kind in cfg.review.auto_approve
        if measure_kinds is not None and p.kind not in measure_kinds:
            continue
        if not labelled or evaluate is None:
            if auto:
                out.gate_refused[p.id] = "no labelled questions to run the validation gate on"
            continue
        try:
            effect = measure_effect(
                cfg, p, labelled, store=service.kis(), evaluate=evaluate, tests_in_round=round_size
            )
        except Exception as e:  # a failed measurement leaves the proposal pending for a person
            out.errors.append(f"{p.id}: {type(e).__name__}: {e}")
            if auto:
                out.gate_refused[p.id] = f"the gate could not run: {type(e).__name__}"
            continue
        service.record_effect(p.id, effect, actor=actor)
        out.measured.append(p.id)
        decision = effect["decision"]
        if not auto:
            continue
        if decision["outcome"] != "accepted":
            out.gate_refused[p.id] = f"{decision['outcome']}: {decision['reason']}"
            continue
        try:
            service.approve(p.id, actor="auto-gate", reason=f"validation gate accepted: {decision['reason']}")
            out.auto_approved.append(p.id)
        except Exception as e:
            out.errors.append(f"{p.id}: {type(e).__name__}: {e}")
    return out


# -- production wiring -----------------------------------------------------------------------------


def open_review(
    cfg: KituneConfig, *, tracker: Tracker | None = None, store: Store | None = None
) -> ReviewService:
    """The review service over ``<workdir>/review``, the production KI table and the prompt registry.

    The KI table and the registry are opened on first use (listing the queue opens neither).
    """

    def kis() -> Store:
        opened = open_serving_store(cfg)
        assert opened is not None  # not read-only: created when missing
        return opened

    return ReviewService(
        cfg, ProposalStore.of(cfg), store if store is not None else kis, lambda: open_registry(cfg), tracker
    )


def review_opener(cfg: KituneConfig, review: ReviewService | None = None) -> Callable[[], ReviewService]:
    """The review service a server's routes or tools share, opened on first use (thread-safe).

    Args:
        cfg: the configuration.
        review: the service to hand out (None: ``open_review(cfg, tracker=create_tracker(cfg))``
            on the first call, the same one after).

    Returns:
        A function returning the one review service (``/api/proposals``, the MCP review tools).
    """
    lock = threading.Lock()
    held: dict[str, ReviewService] = {} if review is None else {"review": review}

    def get() -> ReviewService:
        with lock:
            if "review" not in held:
                held["review"] = open_review(cfg, tracker=create_tracker(cfg))
            return held["review"]

    return get


def production_rewriter(cfg: KituneConfig) -> RewriterPrompt:
    """The rewriter instruction serving now (production version, else the packaged prompt)."""
    setting = production_setting(cfg, programs=("rewriter",))
    label = setting.versions["rewriter"]
    version: int | None = None
    if not label.startswith("packaged"):
        version = int(label.split(" v", 1)[1].split(" ", 1)[0])
    return RewriterPrompt(prompt_name(cfg.corpus_name, "rewriter"), setting.prompts["rewriter"], version)


def default_drafter(cfg: KituneConfig, *, ledger: Any = None) -> tuple[Drafter, str]:
    """The production extractor as a :data:`~kitune.service.workflows.proposals.Drafter`, and its version.

    Each call extracts one document with the extract role's LM (``lm.extract``); a document
    whose extraction failed raises, which the proposer counts.
    """
    setting = production_setting(cfg, programs=("extractor",))
    extractor = FactExtractor.from_config(cfg, setting.prompts["extractor"])
    held: dict[str, Any] = {}

    def draft(doc: Document) -> list[KI]:
        if "lm" not in held:
            held["lm"] = kitune.lm.build_lm(cfg, "extract", ledger=ledger)
        with dspy.context(lm=held["lm"]):
            result = extractor.extract_document(doc)
        if result.status == "failed":
            raise RuntimeError(result.error or "extraction failed")
        return list(result.kis)

    return draft, extractor.prompt_version


def corpus_documents(corpus: Path | str) -> Callable[[str], Document | None]:
    """Doc id → document, from a corpus file or folder (read once, on first use)."""
    held: dict[str, dict[str, Document]] = {}

    def get(docid: str) -> Document | None:
        if "docs" not in held:
            held["docs"] = {d.docid: d for d in load_corpus(corpus)}
        return held["docs"].get(docid)

    return get


def default_evaluator(cfg: KituneConfig, corpus: Path | str) -> Evaluator:
    """The in-context agent on the given store (``kitune eval``'s path), judged by ``grading.grader``.

    Each arm is a run ``review-<label>`` under ``<workdir>/runs`` (resumable); the questions are
    written to ``<workdir>/review/effects/<label>.jsonl``. With a rewriter instruction the
    look-ups are rewritten by the rewrite role's LM; without one they use plain plans.
    """

    def evaluate(
        questions: Sequence[Question], store: Store, rewriter_text: str | None, label: str
    ) -> list[Trace]:
        qfile = Path(cfg.workdir) / "review" / "effects" / f"{label}.jsonl"
        qfile.parent.mkdir(parents=True, exist_ok=True)
        qfile.write_text(
            "".join(json.dumps(q.to_dict(), ensure_ascii=False) + "\n" for q in questions), encoding="utf-8"
        )
        rewriter = None
        if rewriter_text is not None:
            rewriter = rewriter_for(rewriter_text, kitune.lm.build_lm(cfg, "rewrite"))
        context = make_context_fn(cfg, store, disambiguation=True, rewriter=rewriter)
        result = run_eval(
            cfg,
            skill="in-context",
            data_dir=Path(corpus),
            questions_path=qfile,
            run_name=f"review-{label}",
            context_fn=context,
            progress=False,
        )
        return result.traces

    return evaluate
