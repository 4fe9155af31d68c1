"""``kitune extract``: turn a corpus into verified KIs in the configured store.

Thin: load config and documents → resolve the extractor prompt
(:func:`kitune.service.serving.prompts.production_setting`: the ``production`` version of
``kitune-<corpus>-extractor``, else the packaged prompt; ``--prompt-version``, ``--prompt-alias``,
``--instructions`` or ``--packaged`` choose another) → build the extract-role LM, the KI table
named after that extractor version (``<store.table>-<sha8>``, the table ``context``/``serve``/``eval``
and the loop read) and the extractor → :func:`kitune.service.pipelines.extraction.extract_corpus` → print
a summary table and the token ledger.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from kitune.cli.common import ConfigOption, fail, fail_with, get_config, quiet_progress
from kitune.cli.context_cmds import PackagedOption, PromptAliasOption, PromptVersionOption, prompt_specs
from kitune.cli.recording_opts import RecordOption, ReplayOption, record_overrides, with_recording
from kitune.config import KituneConfig
from kitune.errors import KituneError

__all__ = ["extract", "register"]

out = Console()


@with_recording
def extract(
    data: Annotated[
        Path,
        typer.Option(
            "--data",
            "-d",
            help="Corpus: a folder in the BrowseComp-Plus layout (corpus.jsonl with docid/title/text/source "
            "per line) or a .jsonl file.",
            show_default=False,
        ),
    ],
    config: ConfigOption = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Only the first N documents.")] = None,
    state: Annotated[
        Path | None,
        typer.Option(
            help="Resume file (JSONL). Default: <workdir>/extraction/<corpus>.<prompt version>.state.jsonl, "
            "so a changed prompt starts afresh.",
            show_default=False,
        ),
    ] = None,
    restart: Annotated[
        bool, typer.Option("--restart", help="Forget the resume file and extract everything.")
    ] = False,
    instructions: Annotated[
        Path | None,
        typer.Option(
            help="Use this extractor instruction text (e.g. an optimised prompt), not the packaged one.",
            show_default=False,
        ),
    ] = None,
    prompt_version: PromptVersionOption = None,
    prompt_alias: PromptAliasOption = None,
    packaged: PackagedOption = False,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="Documents in parallel (default: extraction.concurrency).")
    ] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show the progress bar.")] = True,
    record: RecordOption = None,
    replay: ReplayOption = None,
) -> None:
    """Extract KIs from every document under --data and write them to the configured store.

    Each document is sent to the extract-role LM (the embedded local model when no gateway is
    configured), every fact is checked (length limits, snake_case predicate, no mention of the
    source, no benchmark markers, evidence quoted verbatim from the document) and the survivors
    are upserted by stable id. Re-running resumes: documents already done are skipped and failed
    ones are retried. Exit code 0 when every document succeeded, 1 when some failed (rerun to
    retry them), 2 on a configuration or data error.

    Examples:
    kitune extract --data "$(kitune demo --print-fixture)"
    kitune extract --data "$(kitune demo --print-fixture)" --limit 5 --concurrency 2
    """
    quiet_progress(progress)
    from kitune.programs.fact_extractor import FactExtractor
    from kitune.programs.instructions import instruction_version
    from kitune.service.pipelines.extraction import default_state_path, extract_corpus
    from kitune.service.serving.prompts import versioned_store_cfg
    from kitune.usage import TokenLedger

    overrides: dict[str, object] = record_overrides(record, replay)
    if concurrency is not None:
        overrides["extraction.concurrency"] = concurrency
    cfg = get_config(config, overrides or None)
    from kitune.data.loaders import load_corpus_with_report

    try:
        all_docs, load_report = load_corpus_with_report(data)
    except KituneError as e:
        fail(str(e))
    docs = all_docs[:limit] if limit is not None else all_docs
    for skipped in load_report.skipped[:20]:  # bad corpus lines are skipped, never silently
        typer.echo(f"skipped {skipped.path}:{skipped.line}: {skipped.reason}", err=True)
    if load_report.n_skipped > 20:
        typer.echo(f"… and {load_report.n_skipped - 20} more skipped lines", err=True)
    if not docs:
        fail(f"no documents found in {data}: expected corpus.jsonl lines with docid and text")
    chosen = bool(prompt_alias is not None or prompt_version)
    if sum((instructions is not None, chosen, packaged)) > 1:
        fail(
            "--instructions, --prompt-version/--prompt-alias and --packaged each pick the extractor prompt: "
            "give one of them"
        )
    if instructions is not None:
        if not instructions.is_file():
            fail(f"--instructions {instructions} does not exist: pass a text file holding the instruction")
        text = instructions.read_text(encoding="utf-8").strip()
        if not text:
            fail(f"--instructions {instructions} is empty")
        out.print(
            f"extractor prompt: {instructions} ({instruction_version('extractor', text)})", highlight=False
        )
    else:
        text = _registered_instruction(cfg, prompt_specs(prompt_version, prompt_alias), packaged=packaged)
    extractor = FactExtractor.from_config(cfg, text)
    store_cfg = versioned_store_cfg(cfg, extractor.prompt_version)
    section = store_cfg.store
    out.print(f"KI store: {section.type} {section.collection_kind} {section.collection}", highlight=False)
    state_path = state or default_state_path(cfg, extractor.prompt_version)
    if restart and state_path.exists():
        state_path.unlink()

    import dspy

    from kitune.lm import build_lm
    from kitune.retrieval import create_store

    ledger = TokenLedger()
    store = None
    try:
        lm = build_lm(cfg, "extract", ledger=ledger)
        store = create_store(store_cfg)
        with dspy.context(lm=lm):
            report = extract_corpus(
                docs, store, extractor, cfg=cfg, ledger=ledger, state_path=state_path, progress=progress
            )
    except KituneError as e:
        fail_with(e)
    except KeyboardInterrupt:
        _interrupted(state_path, len(docs))
    finally:
        if store is not None:
            store.close()

    table = Table(title=f"extraction of {data} → {cfg.store.type}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for label, value in report.summary_rows():
        table.add_row(label, value)
    out.print(table)
    rows = ledger.to_rows()
    if rows:
        cols = ("role", "stage", "calls", "input_tokens", "output_tokens", "cache_hits", "failed_calls")
        ledger_table = Table(title="token ledger")
        for col in cols:
            ledger_table.add_column(
                col.replace("_", " "), justify="left" if col in ("role", "stage") else "right"
            )
        for row in rows:
            ledger_table.add_row(*(str(row.get(c, 0)) for c in cols))
        out.print(ledger_table)
    if report.failed:
        shown = list(report.failed.items())[:5]
        for docid, reason in shown:
            out.print(f"[yellow]failed[/] {docid}: {reason[:200]}")
        out.print(f"resume file: {state_path} (rerun to retry {len(report.failed)} failed document(s))")
        raise typer.Exit(1)


def _interrupted(state_path: Path, n_docs: int) -> NoReturn:
    """Ctrl-C: say what was saved (from the resume file, not the progress bar) and exit 130."""
    from kitune.service.pipelines.extraction import read_state

    saved = sum(1 for status in read_state(state_path).values() if status == "ok")
    fail(
        f"interrupted; {saved} of {n_docs} document(s) are saved (resume file {state_path}): rerun the same "
        "command to resume",
        code=130,
    )


def _registered_instruction(cfg: KituneConfig, specs: list[str], *, packaged: bool = False) -> str:
    """The extractor text ``specs`` select (:func:`prompt_specs`; none: production/packaged); prints which.

    Exits 2 on a bad or missing choice, naming the option and the fix.
    """
    from kitune.service.serving.prompts import describe_setting, parse_prompt_selection, production_setting

    try:
        select = parse_prompt_selection(specs)
    except KituneError as e:
        fail(str(e))
    other = sorted(p for p in select if p != "extractor" and not _is_bare(specs, select[p]))
    if other:
        fail(
            f"--prompt-version {other[0]}=…: kitune extract runs the extractor only: use --prompt-version "
            "extractor=VERSION (or --prompt-alias ALIAS)"
        )
    chosen = {"extractor": select["extractor"]} if "extractor" in select else None
    try:
        setting = production_setting(cfg, select=chosen, packaged=packaged, programs=("extractor",))
    except KituneError as e:
        where = f"--prompt-version extractor={chosen['extractor']}" if chosen else "extractor prompt"
        fail(f"{where}: {e} (run `kitune bootstrap` or `kitune optimize` first)")
    out.print(describe_setting(setting, ("extractor",))[0], highlight=False)
    return setting.prompts["extractor"]


def _is_bare(specs: list[str], value: str) -> bool:
    """Whether ``value`` came from a bare alias (applied to every program), not PROGRAM=VERSION."""
    return any("=" not in s and s.strip() == value for s in specs)


def register(app: typer.Typer) -> None:
    """Add ``kitune extract`` to ``app``."""
    app.command("extract")(extract)
