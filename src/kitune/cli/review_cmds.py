"""``kitune review``: the queue of proposals made from failure signals (thin over the service)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kitune.cli.common import (
    ConfigOption,
    TraceSourceNameOption,
    TraceSourcesArgument,
    fail,
    fail_with,
    get_config,
)
from kitune.errors import KituneError, ReviewError

if TYPE_CHECKING:
    from kitune.config import KituneConfig
    from kitune.service.workflows.review import ReviewService

__all__ = ["register", "review_app"]

review_app = typer.Typer(
    help="Review proposals made from failure signals: list, show (diff + evidence), approve, reject, revert.",
    no_args_is_help=True,
)

_out = Console()

IdArg = Annotated[
    str, typer.Argument(help="Proposal id (p-…), from `kitune review list`.", show_default=False)
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]
TrackOption = Annotated[bool, typer.Option("--track/--no-track", help="Log the action to MLflow.")]


def _service(cfg: KituneConfig, track: bool) -> ReviewService:
    from kitune.service.workflows.review import open_review
    from kitune.tracking.trackers import create_tracker

    return open_review(cfg, tracker=create_tracker(cfg) if track else None)


def _fail(e: Exception) -> NoReturn:
    if isinstance(e, ReviewError | ValueError):
        fail(str(e), code=2)
    fail_with(e)


@review_app.command("list")
def list_cmd(
    status: Annotated[
        str | None, typer.Option("--status", help="pending, applying, approved, rejected or reverted.")
    ] = None,
    kind: Annotated[
        str | None, typer.Option("--kind", help="re_extract, add_ki, retire_ki or rewriter_feedback.")
    ] = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """List proposals in filing order (all statuses unless --status)."""
    cfg = get_config(config)
    try:
        items = _service(cfg, False).list(status=status, kind=kind)
    except (KituneError, ValueError) as e:
        _fail(e)
    if as_json:
        typer.echo(json.dumps([p.summary() for p in items], indent=2, ensure_ascii=False))
        return
    if not items:
        _out.print("no proposals" + (f" with status {status}" if status else ""))
        return
    table = Table(title=f"{len(items)} proposal(s)")
    for col in ("id", "kind", "status", "effect", "title"):
        table.add_column(col)
    for p in items:
        s = p.summary()
        table.add_row(p.id, p.kind, p.status, str(s["effect"] or "–"), escape(p.title))
    _out.print(table)


@review_app.command("show")
def show_cmd(pid: IdArg, as_json: JsonOption = False, config: ConfigOption = None) -> None:
    """Show one proposal: the diff, the evidence (traces, signals, steps), the effect and the history."""
    cfg = get_config(config)
    try:
        p, events = _service(cfg, False).show(pid)
    except (KituneError, ValueError) as e:
        _fail(e)
    if as_json:
        typer.echo(json.dumps({"proposal": p.to_dict(), "events": events}, indent=2, ensure_ascii=False))
        return
    _out.print(f"[bold]{p.id}[/] {p.kind} — {p.status}", highlight=False)
    _out.print(escape(p.title), highlight=False)
    if p.reason:
        _out.print(f"reason: {escape(p.reason)}", highlight=False)
    _out.print("\n[bold]diff[/]")
    _out.print(escape(p.diff) or "(empty)", highlight=False, soft_wrap=True)
    _out.print(f"\n[bold]evidence[/] ({len(p.evidence)} trace(s))")
    for ev in p.evidence:
        sigs = "; ".join(f"{s['kind']} {s['steps'] or ''}".strip() for s in ev.get("signals", []))
        what = f"{escape(str(ev['question']))} → {escape(repr(ev['answer']))}"
        _out.print(f"- {escape(str(ev['trace_id']))}: {what} [{sigs}]")
    if p.effect:
        d = p.effect.get("decision", {})
        c = p.effect.get("comparison", {})
        _out.print(
            f"\n[bold]effect[/] on {p.effect.get('questions')} labelled question(s): {d.get('outcome')} — "
            f"{escape(str(d.get('reason', '')))} (fixed {c.get('fixed')}, broken {c.get('broken')})",
            highlight=False,
        )
    _out.print("\n[bold]history[/]")
    for event in events:
        why = f" — {escape(event['reason'])}" if event["reason"] else ""
        _out.print(f"- {event['at']} {event['action']} by {event['actor']}{why}", highlight=False)


def _act(action: str, pid: str, reason: str, track: bool, config: Path | None) -> None:
    cfg = get_config(config)
    svc = _service(cfg, track)
    try:
        if action == "approve":
            p = svc.approve(pid, actor="cli", reason=reason)
        elif action == "reject":
            p = svc.reject(pid, reason=reason, actor="cli")
        else:
            p = svc.revert(pid, reason=reason, actor="cli")
    except (KituneError, ValueError) as e:
        _fail(e)
    finally:
        svc.close()
    _out.print(f"{p.id} {p.kind}: {p.status}", highlight=False)


@review_app.command("approve")
def approve_cmd(
    pid: IdArg,
    reason: Annotated[str, typer.Option("--reason", help="Why (kept in the history).")] = "",
    track: TrackOption = True,
    config: ConfigOption = None,
) -> None:
    """Approve a pending proposal: its change is applied (KI upsert or status, or a new prompt version)."""
    _act("approve", pid, reason, track, config)


@review_app.command("reject")
def reject_cmd(
    pid: IdArg,
    reason: Annotated[str, typer.Option("--reason", help="Why (required; kept in the history).")] = "",
    track: TrackOption = True,
    config: ConfigOption = None,
) -> None:
    """Reject a pending proposal; the change is remembered and not proposed again."""
    _act("reject", pid, reason, track, config)


@review_app.command("revert")
def revert_cmd(
    pid: IdArg,
    reason: Annotated[str, typer.Option("--reason", help="Why (kept in the history).")] = "",
    track: TrackOption = True,
    config: ConfigOption = None,
) -> None:
    """Undo an approved proposal softly: new KIs expire, old KIs and statuses return, the prompt goes back."""
    _act("revert", pid, reason, track, config)


@review_app.command("propose")
def propose_cmd(
    sources: TraceSourcesArgument = None,
    name: TraceSourceNameOption = None,
    corpus: Annotated[
        Path | None,
        typer.Option(
            "--corpus", help="Corpus file or folder: lets the production extractor draft KIs (LLM calls)."
        ),
    ] = None,
    questions: Annotated[
        Path | None,
        typer.Option("--questions", help="Labelled questions: measure each proposal's effect (agent runs)."),
    ] = None,
    track: TrackOption = True,
    config: ConfigOption = None,
) -> None:
    """File proposals from the failure signals of traces; none is applied unless an auto_approve gate passes.

    Without --corpus no KI is drafted (re_extract / add_ki need the documents and the extractor);
    without --questions no effect is measured and nothing is auto-approved.
    """
    from kitune.data.loaders import load_questions
    from kitune.service.workflows.review import (
        corpus_documents,
        default_drafter,
        default_evaluator,
        file_proposals,
        production_rewriter,
    )
    from kitune.service.workflows.signals import load_signal_traces, signal_report, store_facts, trace_sources

    cfg = get_config(config)
    svc = _service(cfg, track)
    try:
        loaded = load_signal_traces(trace_sources(cfg, sources, name))
        report = signal_report(cfg, loaded.traces, facts=store_facts(svc.kis()))
        draft, version = default_drafter(cfg) if corpus is not None else (None, "")
        labelled = load_questions(questions) if questions is not None else []
        rep = file_proposals(
            svc,
            report,
            documents=corpus_documents(corpus) if corpus is not None else None,
            draft=draft,
            extractor_version=version,
            rewriter=production_rewriter(cfg),
            questions=labelled,
            evaluate=default_evaluator(cfg, corpus) if corpus is not None and labelled else None,
            actor="cli",
        )
    except (KituneError, ValueError) as e:
        _fail(e)
    finally:
        svc.close()
    _out.print(f"{report.n_traces} trace(s) → {len(rep.filed)} new proposal(s)", highlight=False)
    for p in rep.filed:
        _out.print(f"- {p.id} {p.kind}: {escape(p.title)}", highlight=False)
    for why, n in rep.proposed.skipped.items():
        _out.print(f"  skipped {n}: {why}", highlight=False)
    for pid in rep.auto_approved:
        _out.print(f"auto-approved {pid} (validation gate passed)", highlight=False)
    for pid, why in rep.gate_refused.items():
        _out.print(f"left pending {pid}: {escape(why)}", highlight=False)
    for err in rep.proposed.errors + rep.errors:
        _out.print(f"[yellow]error:[/] {escape(err)}")


def register(app: typer.Typer) -> None:
    """Add ``kitune review`` to ``app``."""
    app.add_typer(review_app, name="review")
