"""Proposals from failure signals, never applied silently: the proposer and the on-disk queue.

**Kinds** (:data:`PROPOSAL_KINDS`), each filed by :func:`propose` from a
:class:`~kitune.evaluation.signals.SignalReport`:

``re_extract``
    A document that fall-backs read in at least ``review.re_extract_min_traces`` traces: its
    KIs did not answer. The production extractor re-extracts it *now* (the drafted KIs are the
    proposal: what you approve is what is written). Diff: KIs added, refreshed (same id), and
    the document's current KIs the draft does not reproduce (left alone; the lifecycle ages them).
``add_ki``
    A document a fall-back read, in fewer traces than ``re_extract`` needs, whose text holds the
    agent's answer: the production extractor drafts its facts and the ones that state the answer
    (title, description or object contain it, :func:`kitune.text.contains_answer`) and are not
    in the store yet are proposed. Never invented: only the extractor's own KIs.
``retire_ki``
    A KI shown in at least ``review.retire_min_episodes`` episodes that were unsupported or
    looped, and in no *good* episode (answer supported and no loop, or graded correct). Removal
    is soft: the KI's status becomes ``expired`` (not served), reversible from the queue.
    **With the credit ledger** (``credit``: the loop runs' ``ki_credit.json`` summed per KI,
    :func:`kitune.optimizers.credit.load_run_credit`; :func:`kitune.service.workflows.review.file_proposals`
    reads ``<workdir>/optimize/*/ki_credit.json``), by :func:`kitune.optimizers.credit.credit_verdict`:
    a KI whose verdict is ``retire`` (blamed for ≥ 2 right → wrong flips and more than it fixed)
    is proposed even when the signals alone would not propose it — its evidence is the flips —
    and a KI the signals would retire but the ledger credits with more wrong → right flips than
    right → wrong ones (``helpful > harmful``) is held back (skipped as ``credit: helpful``).
``rewriter_feedback``
    At least ``review.rewriter_min_empty`` distinct KI look-ups that found nothing: a new
    rewriter instruction = the production one plus a feedback block quoting those look-ups
    (at most ``review.max_feedback_queries``). Diff: the unified diff of the instruction.

**Identity of a change.** Each proposal lists its *change keys*, one per unit of change:
``re_extract:<docid>:<extractor version>``, ``add_ki:<ki id>`` (ids are content-derived),
``retire_ki:<ki id>``, ``rewriter_feedback:<normalised query>``. The proposer never files a
unit that any earlier proposal holds, except one whose proposal *failed*: a pending proposal is
not duplicated, an approved one is done, and a rejected or reverted one is remembered, so
the same change is not proposed again (a new extractor version makes a new re-extract key).
A proposal's id is ``p-`` + 12 hex of the SHA-256 of its kind and sorted keys.

**Queue** (:class:`ProposalStore`): SQLite at ``<workdir>/review/proposals.sqlite`` (WAL,
one transaction per change, safe from several processes): each proposal with its status and
an event log (filed, approved, rejected, reverted, effect measured, apply failed — who, when,
why). Statuses: ``pending`` → ``applying`` → ``approved``; ``pending`` → ``rejected``;
``approved`` → ``reverted``. ``applying`` is written before the change is applied, so a crash
leaves it resumable: approving again re-applies (every apply step is idempotent).
"""

from __future__ import annotations

import builtins
import contextlib
import difflib
import hashlib
import json
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kitune.config import KituneConfig
from kitune.errors import DocumentNotFoundError, ProposalNotFoundError, ProposalStateError
from kitune.evaluation.signals import SignalReport, TraceSignals, normalise_query
from kitune.ki import KI, utcnow
from kitune.optimizers.acceptance import check_instruction
from kitune.optimizers.credit import KICredit, credit_verdict
from kitune.schema import Document, Filter
from kitune.text import contains_answer

if TYPE_CHECKING:
    from kitune.retrieval.base import Store

__all__ = [
    "PROPOSAL_KINDS",
    "Drafter",
    "Proposal",
    "ProposalKind",
    "ProposalStatus",
    "ProposalStore",
    "ProposeResult",
    "RewriterPrompt",
    "feedback_instruction",
    "proposal_id",
    "propose",
]

ProposalKind = Literal["re_extract", "add_ki", "retire_ki", "rewriter_feedback"]
PROPOSAL_KINDS: tuple[ProposalKind, ...] = ("re_extract", "add_ki", "retire_ki", "rewriter_feedback")
ProposalStatus = Literal["pending", "applying", "approved", "rejected", "reverted"]
STATUSES: tuple[ProposalStatus, ...] = ("pending", "applying", "approved", "rejected", "reverted")

Drafter = Callable[[Document], list[KI]]
"""The production extractor as a function: a document → the KIs it extracts (may raise)."""


def proposal_id(kind: str, change_keys: Sequence[str]) -> str:
    """``p-`` + 12 hex of the SHA-256 of ``kind`` and the sorted change keys (same change, same id)."""
    text = kind + "\x1f" + "\x1f".join(sorted(change_keys))
    return "p-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


@dataclass(frozen=True)
class Proposal:
    """One proposed change, its evidence and its fate. JSON round-trips via :meth:`to_dict`."""

    id: str
    kind: ProposalKind
    title: str
    """One line: what changes and why."""
    evidence: list[dict[str, Any]]
    """One entry per trace: ``trace_id``, ``query_id``, ``question``, ``answer`` and its
    ``signals`` (``kind``, ``steps`` — the 1-based step spans — and ``detail``)."""
    change: dict[str, Any]
    """Kind-specific: the KIs to write (``kis``), the KI ids to retire (``ki_ids``), or the
    prompt (``prompt``, ``base_version``, ``base_text``, ``new_text``, ``queries``)."""
    diff: str
    """The KI or prompt diff, as text."""
    change_keys: list[str]
    status: ProposalStatus = "pending"
    effect: dict[str, Any] | None = None
    """Measured on labelled questions, when there are any: the paired comparison and the decision."""
    reason: str = ""
    """Why it was rejected or reverted (or how it was approved)."""
    applied: dict[str, Any] | None = None
    """What applying changed, enough to revert it (previous KI records or statuses, prompt versions)."""
    created_at: str = ""
    updated_at: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Proposal:
        """Rebuild from :meth:`to_dict` output (unknown keys ignored)."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})

    def summary(self, *, times: bool = True) -> dict[str, Any]:
        """The list view of the proposal (``kitune review list``, ``GET /api/proposals``, MCP).

        Keys: ``id``, ``kind``, ``status``, ``title``, ``evidence_traces`` (a count), ``effect``
        (the measured decision's outcome, or None) and, with ``times``, ``created_at`` and
        ``updated_at`` (the MCP tool leaves the times out).
        """
        decision = (self.effect or {}).get("decision") or {}
        out = {
            "id": self.id,
            "kind": self.kind,
            "status": self.status,
            "title": self.title,
            "evidence_traces": len(self.evidence),
            "effect": decision.get("outcome"),
        }
        if times:
            out.update(created_at=self.created_at, updated_at=self.updated_at)
        return out

    def kis(self) -> builtins.list[KI]:
        """The KIs this proposal writes (``re_extract`` / ``add_ki``), validated."""
        return [KI.model_validate(k) for k in self.change.get("kis", [])]


class ProposalStore:
    """The review queue: proposals and their events in one SQLite file (see the module docstring).

    Thread- and process-safe: each call opens its own connection and commits one transaction.

    Args:
        path: the database file (created with its folder on first use).
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")  # outside a transaction: SQLite refuses it inside
        finally:
            db.close()
        with self._tx() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS proposals (id TEXT PRIMARY KEY, seq INTEGER NOT NULL, "
                "kind TEXT NOT NULL, status TEXT NOT NULL, data TEXT NOT NULL)"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
                "proposal_id TEXT NOT NULL, at TEXT NOT NULL, action TEXT NOT NULL, actor TEXT NOT NULL, "
                "reason TEXT NOT NULL, detail TEXT NOT NULL)"
            )

    @classmethod
    def of(cls, cfg: KituneConfig) -> ProposalStore:
        """The queue at ``<workdir>/review/proposals.sqlite``."""
        return cls(Path(cfg.workdir) / "review" / "proposals.sqlite")

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    @staticmethod
    def _event(
        db: sqlite3.Connection, pid: str, action: str, actor: str, reason: str, detail: Mapping[str, Any]
    ) -> None:
        db.execute(
            "INSERT INTO events (proposal_id, at, action, actor, reason, detail) VALUES (?, ?, ?, ?, ?, ?)",
            (pid, utcnow().isoformat(), action, actor, reason, json.dumps(dict(detail), default=str)),
        )

    def add(self, proposals: Sequence[Proposal], *, actor: str = "proposer") -> builtins.list[Proposal]:
        """File new proposals (ids already in the queue are skipped). Returns the ones filed."""
        filed: list[Proposal] = []
        with self._tx() as db:
            (seq,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM proposals").fetchone()
            for p in proposals:
                if db.execute("SELECT 1 FROM proposals WHERE id = ?", (p.id,)).fetchone():
                    continue
                seq += 1
                now = utcnow().isoformat()
                p = replace(p, status="pending", created_at=p.created_at or now, updated_at=now)
                db.execute(
                    "INSERT INTO proposals (id, seq, kind, status, data) VALUES (?, ?, ?, ?, ?)",
                    (p.id, seq, p.kind, p.status, json.dumps(p.to_dict(), default=str)),
                )
                self._event(db, p.id, "filed", actor, "", {"change_keys": p.change_keys})
                filed.append(p)
        return filed

    def get(self, pid: str) -> Proposal:
        """One proposal.

        Raises:
            ProposalNotFoundError: no proposal has this id.
        """
        with self._tx() as db:
            row = db.execute("SELECT data FROM proposals WHERE id = ?", (pid,)).fetchone()
        if row is None:
            raise ProposalNotFoundError(pid)
        return Proposal.from_dict(json.loads(row[0]))

    def list(self, *, status: str | None = None, kind: str | None = None) -> list[Proposal]:
        """Proposals in filing order, optionally of one status and/or kind.

        Raises:
            ValueError: an unknown status or kind.
        """
        if status is not None and status not in STATUSES:
            raise ValueError(f"status {status!r}: use one of {', '.join(STATUSES)}")
        if kind is not None and kind not in PROPOSAL_KINDS:
            raise ValueError(f"kind {kind!r}: use one of {', '.join(PROPOSAL_KINDS)}")
        query, args = "SELECT data FROM proposals WHERE 1=1", builtins.list[str]()
        if status is not None:
            query, args = query + " AND status = ?", [*args, status]
        if kind is not None:
            query, args = query + " AND kind = ?", [*args, kind]
        with self._tx() as db:
            rows = db.execute(query + " ORDER BY seq", args).fetchall()
        return [Proposal.from_dict(json.loads(r[0])) for r in rows]

    def transition(
        self,
        pid: str,
        allowed: Sequence[str],
        *,
        action: str,
        actor: str,
        reason: str = "",
        detail: Mapping[str, Any] | None = None,
        set_reason: bool = False,
        **updates: Any,
    ) -> Proposal:
        """Change a proposal atomically when its status is one of ``allowed``, and log the event.

        Args:
            pid: the proposal id.
            allowed: statuses the change may start from.
            action: the event name (``approved``, ``rejected``, …).
            actor: who did it (``cli``, ``http``, ``mcp``, ``auto-gate``, ``watch``).
            reason: why (the event's reason).
            detail: extra event data.
            set_reason: also make ``reason`` the proposal's ``reason``.
            **updates: proposal fields to set (``status``, ``effect``, ``applied``).

        Raises:
            ProposalNotFoundError: unknown id. ProposalStateError: the status is not allowed.
        """
        with self._tx() as db:
            row = db.execute("SELECT data FROM proposals WHERE id = ?", (pid,)).fetchone()
            if row is None:
                raise ProposalNotFoundError(pid)
            p = Proposal.from_dict(json.loads(row[0]))
            if p.status not in allowed:
                raise ProposalStateError(
                    f"proposal {pid} is {p.status}; the step {action!r} needs it {' or '.join(allowed)}",
                    proposal_id=pid,
                    status=p.status,
                )
            if set_reason:
                updates["reason"] = reason
            p = replace(p, **updates, updated_at=utcnow().isoformat())
            db.execute(
                "UPDATE proposals SET status = ?, data = ? WHERE id = ?",
                (p.status, json.dumps(p.to_dict(), default=str), pid),
            )
            self._event(db, pid, action, actor, reason, detail or {})
        return p

    def events(self, pid: str) -> builtins.list[dict[str, Any]]:
        """The proposal's events, oldest first: ``at``, ``action``, ``actor``, ``reason``, ``detail``."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT at, action, actor, reason, detail FROM events WHERE proposal_id = ? ORDER BY seq",
                (pid,),
            ).fetchall()
        return [
            {"at": a, "action": b, "actor": c, "reason": d, "detail": json.loads(e)} for a, b, c, d, e in rows
        ]

    def held_keys(self) -> set[str]:
        """Change keys of every proposal filed (the history the proposer consults)."""
        return {k for p in self.list() for k in p.change_keys}


# -- the proposer --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RewriterPrompt:
    """The production rewriter instruction a feedback proposal starts from."""

    name: str
    """Registry prompt name (``kitune-<corpus>-rewriter``)."""
    text: str
    version: int | None = None
    """Its registry version; None for the packaged prompt (no production version yet)."""


@dataclass
class ProposeResult:
    """What one :func:`propose` call produced."""

    proposals: list[Proposal] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    """Why candidates were not filed → how many (``already proposed``, ``nothing drafted``, …)."""
    errors: list[str] = field(default_factory=list)
    """Drafting failures (``<docid>: <error>``): counted, never fatal."""

    def skip(self, why: str, n: int = 1) -> None:
        """Count ``n`` candidates not filed for ``why``."""
        self.skipped[why] = self.skipped.get(why, 0) + n


def _evidence(traces: Sequence[TraceSignals]) -> list[dict[str, Any]]:
    return [
        {
            "trace_id": t.trace_id,
            "query_id": t.query_id,
            "question": t.question,
            "answer": t.answer,
            "signals": [h.to_dict() for h in t.hits],
        }
        for t in traces
    ]


def _credit_evidence(c: KICredit) -> list[dict[str, Any]]:
    """The credit ledger's flips in the evidence shape ``kitune review show`` prints (one per flip)."""
    flips = [(f, "right → wrong") for f in c.harmful_in] + [(f, "wrong → right") for f in c.helpful_in]
    return [
        {
            "trace_id": f"credit:{where}",
            "query_id": where.rsplit(":", 1)[-1],
            "question": f"loop run {where.rsplit(':', 1)[0]}",
            "answer": what,
            "signals": [],
        }
        for where, what in flips
    ]


def _ki_line(mark: str, ki: KI | Mapping[str, Any]) -> str:
    if isinstance(ki, KI):
        return f"{mark} [{ki.id}] {ki.title} — {ki.description}"
    return f"{mark} [{ki.get('id')}] {ki.get('title')} — {ki.get('description')}"


def feedback_instruction(base: str, queries: Sequence[str], *, when: datetime | None = None) -> str:
    """The rewriter instruction with a feedback block quoting look-ups that found no KI.

    Deterministic for the same inputs (the date is the only variable part).
    """
    day = (when or utcnow()).date().isoformat()
    lines = [
        "",
        "",
        f"Production feedback ({day}): these look-ups found no knowledge indicator:",
        *(f'- "{q}"' for q in queries),
        "For questions like these, put each named entity in the plan's entity tags and keep the "
        "lexical text to the distinctive words of the question, not its full wording.",
    ]
    return base.rstrip() + "\n".join(lines) + "\n"


def _safe_draft(draft: Drafter, doc: Document, result: ProposeResult) -> list[KI] | None:
    try:
        return list(draft(doc))
    except Exception as e:  # one document's failure is counted, never fatal
        result.errors.append(f"{doc.docid}: {type(e).__name__}: {e}")
        result.skip("drafting failed")
        return None


def _exists(store: Store, ki_id: str) -> KI | None:
    try:
        return store.get(ki_id)
    except DocumentNotFoundError:
        return None


def propose(
    report: SignalReport,
    *,
    cfg: KituneConfig,
    store: Store,
    held: set[str],
    documents: Callable[[str], Document | None] | None = None,
    draft: Drafter | None = None,
    extractor_version: str = "",
    rewriter: RewriterPrompt | None = None,
    when: datetime | None = None,
    credit: Mapping[str, KICredit] | None = None,
) -> ProposeResult:
    """Proposals from a signal report (rules in the module docstring); nothing is applied.

    Args:
        report: the signals (with KI ids shown, fallback documents, empty look-ups).
        cfg: ``review`` thresholds.
        store: the production KI table (read only: existing KIs and statuses).
        held: change keys already held by the queue (:meth:`ProposalStore.held_keys`).
        documents: docid → the document (None when unknown); None: no KI drafting.
        draft: the production extractor; None: no ``re_extract`` / ``add_ki`` proposals.
        extractor_version: ``extractor@<sha8>`` of ``draft`` (part of the re-extract key).
        rewriter: the production rewriter instruction; None: no ``rewriter_feedback``.
        when: the feedback block's date (default: now, UTC).
        credit: KI id → its credit from the loop runs' ledgers (None: the signals alone decide
            ``retire_ki``).

    Returns:
        The new proposals (status ``pending``, not yet in the queue) and what was skipped why.
    """
    r = cfg.review
    out = ProposeResult()
    keys = set(held)
    fell = [t for t in report.traces if t.fallback_docs]
    by_doc: dict[str, list[TraceSignals]] = {}
    for t in fell:
        for d in t.fallback_docs:
            by_doc.setdefault(d, []).append(t)
    drafts: dict[str, list[KI] | None] = {}

    def drafted(docid: str) -> list[KI] | None:
        if docid not in drafts:
            doc = documents(docid) if documents is not None else None
            if doc is None:
                out.skip("document not in the corpus")
                drafts[docid] = None
            else:
                drafts[docid] = _safe_draft(draft, doc, out) if draft is not None else None
        return drafts[docid]

    for docid, traces in sorted(by_doc.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        if draft is None or documents is None:
            out.skip("no extractor to draft KIs")
            continue
        if len(traces) >= r.re_extract_min_traces:
            key = f"re_extract:{docid}:{extractor_version}"
            if key in keys:
                out.skip("already proposed")
                continue
            kis = drafted(docid)
            if kis is None:
                continue
            if not kis:
                out.skip("nothing drafted")
                continue
            every = Filter(statuses=("active", "stale", "expired"), doc_ids=(docid,))
            current = {k.id: k for k in store.iter_kis(every)}
            new_ids = {k.id for k in kis}
            added = [k for k in kis if k.id not in current]
            refreshed = [k for k in kis if k.id in current]
            kept = [k for i, k in sorted(current.items()) if i not in new_ids]
            diff = "\n".join(
                [_ki_line("+", k) for k in added]
                + [_ki_line("=", k) for k in refreshed]
                + [_ki_line(" ", k) + " (not reproduced; left as is)" for k in kept]
            )
            p_keys = [key]
            out.proposals.append(
                Proposal(
                    id=proposal_id("re_extract", p_keys),
                    kind="re_extract",
                    title=f"re-extract {docid}: fall-backs read it in {len(traces)} traces "
                    f"({len(added)} new KIs, {len(refreshed)} refreshed)",
                    evidence=_evidence(traces),
                    change={
                        "docid": docid,
                        "extractor_version": extractor_version,
                        "kis": [k.model_dump(mode="json") for k in kis],
                        "added": [k.id for k in added],
                        "refreshed": [k.id for k in refreshed],
                        "not_reproduced": [k.id for k in kept],
                    },
                    diff=diff,
                    change_keys=p_keys,
                )
            )
            keys.update(p_keys)
            continue
        answered = [t for t in traces if t.answer]
        if not answered:
            out.skip("fall-back without an answer")
            continue
        kis = drafted(docid)
        if kis is None:
            continue
        answers = list(dict.fromkeys(t.answer for t in answered))
        stating = [
            k
            for k in kis
            if contains_answer(f"{k.title}\n{k.description}\n{k.payload.properties.object}", answers)
        ]
        fresh = [k for k in stating if f"add_ki:{k.id}" not in keys and _exists(store, k.id) is None]
        if not fresh:
            out.skip("no new KI states the answer" if not stating else "already proposed or stored")
            continue
        p_keys = [f"add_ki:{k.id}" for k in fresh]
        out.proposals.append(
            Proposal(
                id=proposal_id("add_ki", p_keys),
                kind="add_ki",
                title=f"add {len(fresh)} KI(s) from {docid}, which a fall-back read to answer "
                + ", ".join(repr(a) for a in answers),
                evidence=_evidence(answered),
                change={
                    "docid": docid,
                    "kis": [k.model_dump(mode="json") for k in fresh],
                    "answers": answers,
                },
                diff="\n".join(_ki_line("+", k) for k in fresh),
                change_keys=p_keys,
            )
        )
        keys.update(p_keys)

    credited = credit or {}
    for ki_id, counts in report.by_ki.items():
        shown = [t for t in report.traces if ki_id in t.kis_shown]
        bad = [t for t in shown if {"answer_unsupported", "looped"} & t.kinds]
        good = [t for t in shown if t.correct is True or (t.supported is True and "looped" not in t.kinds)]
        c = credited.get(ki_id)
        if len(bad) < r.retire_min_episodes or good:
            continue
        if c is not None and c.helpful > c.harmful:
            out.skip("credit: helpful")
            continue
        key = f"retire_ki:{ki_id}"
        if key in keys:
            out.skip("already proposed")
            continue
        ki = _exists(store, ki_id)
        if ki is None or ki.payload.status == "expired":
            out.skip("KI gone or already expired")
            continue
        unsupported = sum("answer_unsupported" in t.kinds for t in bad)
        looped = sum("looped" in t.kinds for t in bad)
        out.proposals.append(
            Proposal(
                id=proposal_id("retire_ki", [key]),
                kind="retire_ki",
                title=f"retire {ki_id}: shown in {len(bad)} bad episodes "
                f"({unsupported} unsupported, {looped} looped), in no good one",
                evidence=_evidence(bad),
                change={
                    "ki_ids": [ki_id],
                    "kis": [ki.model_dump(mode="json")],
                    "counts": {"shown": counts.get("shown", 0), "unsupported": unsupported, "looped": looped},
                },
                diff=_ki_line("-", ki) + f" (status {ki.payload.status} → expired; reversible)",
                change_keys=[key],
            )
        )
        keys.add(key)

    for ki_id, c in credited.items():
        if credit_verdict(c) != "retire" or f"retire_ki:{ki_id}" in keys:
            continue
        ki = _exists(store, ki_id)
        if ki is None or ki.payload.status == "expired":
            continue  # another table's KI, or already retired: nothing to propose
        key = f"retire_ki:{ki_id}"
        out.proposals.append(
            Proposal(
                id=proposal_id("retire_ki", [key]),
                kind="retire_ki",
                title=f"retire {ki_id}: the loop's credit ledger blames it for {c.harmful} right → wrong "
                f"flips ({c.helpful} wrong → right)",
                evidence=_credit_evidence(c),
                change={
                    "ki_ids": [ki_id],
                    "kis": [ki.model_dump(mode="json")],
                    "credit": {
                        "shown_right": c.shown_right,
                        "shown_wrong": c.shown_wrong,
                        "harmful": c.harmful,
                        "helpful": c.helpful,
                    },
                },
                diff=_ki_line("-", ki) + f" (status {ki.payload.status} → expired; reversible)",
                change_keys=[key],
            )
        )
        keys.add(key)

    if rewriter is not None:
        queries: dict[str, str] = {}
        sources: dict[str, list[TraceSignals]] = {}
        for t in report.traces:
            for q in t.empty_lookups:
                norm = normalise_query(q)
                if norm and f"rewriter_feedback:{norm}" not in keys:
                    queries.setdefault(norm, q)
                    sources.setdefault(norm, []).append(t)
        if len(queries) >= r.rewriter_min_empty:
            chosen = list(queries)[: r.max_feedback_queries]
            new_text = feedback_instruction(rewriter.text, [queries[n] for n in chosen], when=when)
            problems = check_instruction("rewriter", rewriter.text, new_text)
            p_keys = [f"rewriter_feedback:{n}" for n in chosen]
            traces = list({t.trace_id: t for n in chosen for t in sources[n]}.values())
            diff = "".join(
                difflib.unified_diff(
                    rewriter.text.splitlines(keepends=True),
                    new_text.splitlines(keepends=True),
                    fromfile=f"{rewriter.name}@{rewriter.version or 'packaged'}",
                    tofile=f"{rewriter.name}@proposed",
                )
            )
            if problems:
                out.skip("rewriter feedback failed its sanity check")
            else:
                out.proposals.append(
                    Proposal(
                        id=proposal_id("rewriter_feedback", p_keys),
                        kind="rewriter_feedback",
                        title=f"rewriter feedback: {len(chosen)} look-ups found no KI",
                        evidence=_evidence(traces),
                        change={
                            "prompt": rewriter.name,
                            "base_version": rewriter.version,
                            "base_text": rewriter.text,
                            "new_text": new_text,
                            "queries": [queries[n] for n in chosen],
                        },
                        diff=diff,
                        change_keys=p_keys,
                    )
                )
        elif queries:
            out.skip("too few empty look-ups for rewriter feedback", len(queries))
    return out
