"""Store commands: ``kitune index``, ``kitune expire``, ``kitune stats``, ``kitune reindex``.

Load KIs into the configured store, run the lifecycle sweep, count what the store holds, and
move an Elasticsearch store to the current mapping.

``kitune index`` is a command group with two sub-commands, ``load`` and ``create``; ``load`` is
the default, so ``kitune index FILE`` is ``kitune index load FILE`` (:class:`_IndexGroup`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from kitune.cli.common import ConfigOption, console, fail, get_config
from kitune.cli.export_cmds import index_create
from kitune.errors import KituneError

if TYPE_CHECKING:
    from kitune.config import KituneConfig
    from kitune.retrieval.base import Store

__all__ = ["register"]


def _store_cfg(cfg: KituneConfig) -> KituneConfig:
    """The KI table the serving commands use: the production extractor's (``kis-<sha8>``)."""
    from kitune.service.serving.prompts import production_setting

    try:
        return production_setting(cfg, programs=("extractor",)).store_cfg
    except KituneError as e:
        fail(str(e))


def _open_store(config: Path | None, *, read_only: bool = False) -> tuple[KituneConfig, Store | None]:
    """Open the production extractor's KI table; with ``read_only``, None when it does not exist yet.

    A read-only command (``stats``) must not create an empty table as a side effect.
    """
    from kitune.service.serving.setting import open_store

    cfg = _store_cfg(get_config(config))
    try:
        return cfg, open_store(cfg, read_only=read_only)
    except KituneError as e:
        fail(str(e))


def index(
    file: Annotated[
        Path,
        typer.Argument(
            help="JSONL file, one KI per line: `kitune export` output, or the Elastic AI-index shape "
            "(`kitune export --format elastic-ai-index`, read back losslessly).",
            show_default=False,
        ),
    ],
    config: ConfigOption = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="KIs per store write.")] = 512,
    show_bad: Annotated[int, typer.Option("--show-bad", min=0, help="How many bad lines to list.")] = 20,
    # `kitune index create`'s options, hidden: given with a FILE they get an error naming the fix
    mapping: Annotated[str | None, typer.Option("--mapping", hidden=True)] = None,
    index_name: Annotated[str | None, typer.Option("--index", hidden=True)] = None,
    print_mapping: Annotated[bool, typer.Option("--print", hidden=True)] = False,
) -> None:
    """Load KIs from a JSONL file into the configured store (upsert by KI id).

    Re-indexing the same file is safe: a KI with an existing id replaces the stored one and
    refreshes its last_seen. Lines that are not valid KIs are skipped and listed with their line
    numbers; the exit code is 1 when any line or KI failed, 0 otherwise. `kitune index FILE` is
    the same command.

    Example: kitune index kis.jsonl --config kitune.yaml
    """
    if mapping is not None or index_name is not None or print_mapping:
        fail(
            "--mapping, --index and --print belong to `kitune index create --mapping ai-index` (create an "
            "Elasticsearch index); `kitune index FILE` loads KIs from FILE"
        )
    from kitune.service.serving.stores import check_ki_file, index_jsonl

    try:
        check_ki_file(file)  # before the store opens: a wrong path must not create a table
    except KituneError as e:
        fail(str(e))
    _cfg, store = _open_store(config)
    assert store is not None  # not read-only: created when missing
    try:
        report = index_jsonl(store, file, batch_size=batch_size)
    except KituneError as e:
        fail(str(e))
    finally:
        store.close()
    w = report.write
    typer.echo(
        f"{report.path}: {report.lines} lines, {len(report.bad_lines)} bad, "
        f"{w.submitted} submitted, {w.indexed} indexed, {len(w.failed)} failed "
        f"({store.backend} store)"
    )
    for bad in report.bad_lines[:show_bad]:
        console.print(f"[yellow]line {bad.line}:[/] {bad.message}")
    if len(report.bad_lines) > show_bad:
        console.print(f"… and {len(report.bad_lines) - show_bad} more bad lines")
    for f in w.failed[:show_bad]:
        console.print(f"[red]failed {f.id}:[/] {f.reason}")
    if not report.ok:
        raise typer.Exit(1)


def _parse_now(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        fail(f"--at {value!r} is not an ISO date/time: use e.g. 2026-11-30 or 2026-11-30T12:00:00Z")
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def expire(
    config: ConfigOption = None,
    now_flag: Annotated[
        bool,
        typer.Option(
            "--now",
            help="Sweep as of the current time (the default): only KIs past their retention change.",
        ),
    ] = False,
    at: Annotated[
        str | None,
        typer.Option(
            "--at", help="Sweep as of this time instead, ISO 8601 (replay or preview).", show_default=False
        ),
    ] = None,
    expire_everything: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Expire EVERY active and stale KI of the served table now, whatever its age (status "
            "reason expired_by_hand); nothing is deleted.",
        ),
    ] = False,
    stale_after_days: Annotated[
        float | None,
        typer.Option(
            "--stale-after-days", min=0.0, help="Override lifecycle.stale_after_days.", show_default=False
        ),
    ] = None,
) -> None:
    """Run the KI lifecycle sweep on the served KI table.

    KIs unseen (not re-extracted, and their document not seen unchanged by `kitune extract`) for
    lifecycle.stale_after_days (default 7) become stale; unseen for twice that, or past their
    expires_at, they become expired. Disambiguation and source-description KIs use
    lifecycle.derived_stale_after_days. Only active KIs are served unless a filter asks for more.
    Status only moves forward and nothing is deleted; re-seeing a KI makes it active again. Running
    it twice changes nothing the second time. --at replays the sweep at another time; --all is the
    separate, explicit way to expire everything.

    Examples:
    kitune expire --now
    kitune expire --at 2026-12-31
    """
    from kitune.service.serving.stores import expire_all, expire_kis, retention_from, stale_after_from

    if expire_everything and (at is not None or now_flag):
        fail("--all expires every KI whatever its age: give it without --now / --at")
    if now_flag and at is not None:
        fail("--now and --at each name the sweep time: give one")
    when = _parse_now(at)  # before the store opens: a bad --at must not create a table
    cfg, store = _open_store(config, read_only=True)  # nothing to sweep must not create a table
    if store is None:
        typer.echo(
            f"no KI table yet ({_table_name(cfg)}): nothing to expire; run `kitune extract --data DIR` first"
        )
        return
    if expire_everything:
        try:
            n = expire_all(store)
        except KituneError as e:
            fail(str(e))
        finally:
            store.close()
        typer.echo(
            f"expired all {n} active/stale KI(s) of {_table_name(cfg)} (status reason expired_by_hand)"
        )
        return
    window = timedelta(days=stale_after_days) if stale_after_days is not None else stale_after_from(cfg)
    try:
        result = expire_kis(store, now=when, stale_after=window, retention=retention_from(cfg))
    except KituneError as e:
        fail(str(e))
    finally:
        store.close()
    typer.echo(
        f"sweep at {(when or datetime.now(UTC)).isoformat(timespec='seconds')} "
        f"(stale after {window.total_seconds() / 86400:g} days): "
        f"{result.stale} became stale, {result.expired} became expired"
    )


def _table_name(cfg: KituneConfig) -> str:
    return cfg.store.collection


def _credit_ledgers(cfg: KituneConfig, run_name: str | None) -> dict[str, Path]:
    """Run name → ``<workdir>/optimize/<run>/ki_credit.json`` that exist (one run, or every run)."""
    root = Path(cfg.workdir) / "optimize"
    if run_name is not None:
        path = root / run_name / "ki_credit.json"
        return {run_name: path} if path.is_file() else {}
    return {p.parent.name: p for p in sorted(root.glob("*/ki_credit.json"))}


def _credit(cfg: KituneConfig, run_name: str | None, top: int) -> dict[str, tuple[str, dict[str, object]]]:
    """Run name → (the credit table as Markdown, the JSON form) of each loop run's KI credit ledger."""
    from kitune.optimizers.credit import CreditLedger

    out: dict[str, tuple[str, dict[str, object]]] = {}
    for run, path in _credit_ledgers(cfg, run_name).items():
        try:
            ledger = CreditLedger(path)
        except ValueError as e:
            fail(str(e))
        verdicts = ledger.verdicts()
        harmful = {k: {**c, "verdict": verdicts[k]} for k, c in ledger.kis.items() if c["harmful"] > 0}
        out[run] = (ledger.to_markdown(limit=top), {"summary": ledger.summary(), "harmful": harmful})
    return out


def stats(
    config: ConfigOption = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Rows per table (tags, docs, entities).")] = 15,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    run_name: Annotated[
        str | None,
        typer.Option(
            "--run-name", help="Credit table of this loop run only (default: every run that has one)."
        ),
    ] = None,
) -> None:
    """Count the KIs in the configured store.

    Count the KIs in the configured store: by lifecycle status, top tags, top source
    documents and top entities. Then, for each `kitune optimize` run with a KI credit ledger
    (<workdir>/optimize/<run>/ki_credit.json), the KIs with a harmful record: shown right /
    shown wrong / harmful counts and the verdict (retire at harmful >= 2, demote at harmful >= 1
    with more wrong than right; see docs/loop-stages.md).

    Example: kitune stats --top 10
    """
    from rich.console import Console
    from rich.table import Table

    from kitune.service.serving.stores import store_stats

    cfg, store = _open_store(config, read_only=True)
    credit = _credit(cfg, run_name, top)
    if store is None:
        name = getattr(cfg.store, "table", "")
        msg = f"no KIs yet: table {name} does not exist (fill it with `kitune extract` or `kitune index`)"
        if as_json:
            empty = {"total": 0, "by_status": {}, "by_tag": {}, "by_doc": {}, "by_entity": {}}
            typer.echo(json.dumps({**empty, "credit": {r: c[1] for r, c in credit.items()}}))
        else:
            typer.echo(msg)
            _print_credit(credit)
        return
    try:
        s = store_stats(store, top=top)
    except KituneError as e:
        fail(str(e))
    finally:
        store.close()
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "total": s.total,
                    "by_status": s.by_status,
                    "by_tag": s.by_tag,
                    "by_doc": s.by_doc,
                    "by_entity": s.by_entity,
                    "credit": {r: c[1] for r, c in credit.items()},
                },
                indent=2,
            )
        )
        return
    out = Console()
    out.print(f"[bold]{s.total}[/] KIs in the {store.backend} store")
    for title, counts, key in (
        ("Status", s.by_status, "status"),
        ("Top tags", s.by_tag, "tag"),
        ("Top documents", s.by_doc, "doc id"),
        ("Top entities", s.by_entity, "entity"),
    ):
        table = Table(title=title)
        table.add_column(key)
        table.add_column("KIs", justify="right")
        for k, v in counts.items():
            table.add_row(k, str(v))
        out.print(table)
    _print_credit(credit)


def _print_credit(credit: dict[str, tuple[str, dict[str, object]]]) -> None:
    for run, (md, _) in credit.items():
        typer.echo(f"\nKI credit of loop run {run}:\n{md}", nl=False)


def reindex(
    source: Annotated[
        str, typer.Option("--from", help="The old Elasticsearch index to copy KIs from.", show_default=False)
    ],
    config: ConfigOption = None,
) -> None:
    """Create the configured Elasticsearch index with the current mapping and copy every KI into it.

    Use it after an upgrade changes the published mapping: set store.index to a NEW name in the
    config, run this with --from the old index, check the counts, then delete the old index.
    The old index is only read; KIs keep their status and last_seen. Exit code 1 when any KI
    failed to copy.

    Example: kitune reindex --from kitune-kis --config kitune.yaml   (store.index: kitune-kis-v2)
    """
    from kitune.service.serving.stores import reindex_elasticsearch

    cfg = get_config(config)
    try:
        result = reindex_elasticsearch(cfg, source)
    except KituneError as e:
        fail(str(e))
    typer.echo(
        f"reindex {source} → {getattr(cfg.store, 'index', '?')}: {result.submitted} read, "
        f"{result.indexed} indexed, {len(result.failed)} failed"
    )
    for f in result.failed[:20]:
        console.print(f"[red]failed {f.id}:[/] {f.reason}")
    if not result.ok:
        raise typer.Exit(1)


def _help(func: object) -> str:
    """The docstring with each paragraph joined into one line, so Typer reflows it to the terminal."""
    import inspect

    doc = inspect.getdoc(func) or ""
    return "\n\n".join(" ".join(p.split()) for p in doc.split("\n\n"))


_INDEX_DEFAULT = "load"
"""The ``kitune index`` sub-command that runs when the first argument names none (a FILE, an option)."""


class _IndexGroup(TyperGroup):
    """``kitune index``: a group whose default sub-command is ``load``, so ``kitune index FILE`` works.

    A first argument that is not a sub-command name (``create``, ``load``) nor ``--help`` starts
    ``load`` with all the arguments: ``kitune index kis.jsonl -c k.yaml`` is ``kitune index load
    kis.jsonl -c k.yaml``. A file literally named ``create`` is loaded with ``kitune index load
    create`` (or ``./create``).
    """

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # ctx: typer's vendored click Context
        """Route arguments that name no sub-command to ``load``."""
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = [_INDEX_DEFAULT, *args]
        return super().parse_args(ctx, args)


INDEX_HELP = (
    "Load KIs into the store, or create an Elasticsearch index with a chosen mapping.\n\n"
    "kitune index FILE (the same as kitune index load FILE) loads the KIs of a JSONL file into the "
    "configured store.\n\n"
    "kitune index create --mapping ai-index creates the configured Elasticsearch index with Elastic's "
    "published ai-index@mappings shape (--mapping kitune: kitune's own layout; --index NAME: another "
    "index name; --print: print the mapping, no cluster needed)."
)


def register(app: typer.Typer) -> None:
    """Add ``kitune index`` (``load``, the default, and ``create``), ``expire``, ``stats``, ``reindex``."""
    index_app = typer.Typer(
        cls=_IndexGroup,
        help=INDEX_HELP,
        no_args_is_help=True,
        subcommand_metavar="FILE | COMMAND [ARGS]...",
    )
    index_app.command(_INDEX_DEFAULT, help=_help(index))(index)
    index_app.command("create", help=_help(index_create))(index_create)
    app.add_typer(index_app, name="index")
    app.command("expire", help=_help(expire))(expire)
    app.command("stats", help=_help(stats))(stats)
    app.command("reindex", help=_help(reindex))(reindex)
