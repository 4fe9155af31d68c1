"""``kitune bootstrap``: describe a new corpus, draft its extractor, write source-description KIs.

Thin: load config → build the extract-role LM, the embedder and the store →
:func:`kitune.service.workflows.bootstrap.bootstrap_corpus` → print the sample, the draft's registry
version, the KIs written and the token ledger.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from kitune.cli.common import ConfigOption, fail_with, get_config
from kitune.cli.recording_opts import RecordOption, ReplayOption, record_overrides, with_recording
from kitune.errors import KituneError

__all__ = ["bootstrap", "register"]

out = Console()


@with_recording
def bootstrap(
    corpus: Annotated[
        Path,
        typer.Option(
            "--corpus",
            help="A corpus: a folder (corpus.jsonl / documents.jsonl / records.jsonl) or a JSONL file of "
            "documents (docid + text) or of structured records (any fields).",
            show_default=False,
        ),
    ],
    config: ConfigOption = None,
    questions: Annotated[
        Path | None,
        typer.Option(
            help="Example questions (JSONL or a BrowseComp-Plus folder). Default: the corpus folder's own.",
            show_default=False,
        ),
    ] = None,
    pin_types: Annotated[
        list[str] | None,
        typer.Option(
            "--pin-types",
            metavar="TYPES",
            help="Entity types the draft must always cover (repeat, or comma-separate: person,invoice).",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[
        int,
        # min=0: random.Random(-n) draws as random.Random(n), so a negative seed would silently repeat one
        typer.Option(min=0, help="Seeds the sample: same seed, same sample and draft."),
    ] = 0,
    sample_size: Annotated[
        int, typer.Option("--sample-size", min=1, max=64, help="Documents shown to the LM.")
    ] = 8,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            help="Corpus name (sets corpus_name: prompt kitune-<name>-extractor, index://<name>).",
            show_default=False,
        ),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Report folder. Default: <workdir>/bootstrap/<corpus name>.", show_default=False
        ),
    ] = None,
    register_prompt: Annotated[
        bool, typer.Option("--register/--no-register", help="Register the draft in the prompt registry.")
    ] = True,
    track: Annotated[bool, typer.Option("--track/--no-track", help="Log the run to MLflow.")] = True,
    record: RecordOption = None,
    replay: ReplayOption = None,
) -> None:
    """Look at a new corpus and start it off: sample, describe, draft the extractor, describe the source.

    One LM call (the extract role: the embedded local model when no gateway is configured)
    writes a typed description of the corpus from a seeded, diverse sample. The extractor draft
    is the packaged instruction plus a domain section built from that description (no second LM
    call, so the same seed and replies give the same draft); pinned types are always kept. The
    draft is registered as kitune-<corpus>-extractor (alias candidate, and production when none
    is set), a few source-description KIs go to the configured store, and a report (sample,
    description, diff, tokens) is written. Exit 0 on success, 1 when a step failed partially
    (see the report), 2 on a configuration or data error.
    """
    from kitune.lm import build_lm
    from kitune.service.workflows.bootstrap import bootstrap_corpus
    from kitune.tracking.trackers import create_tracker
    from kitune.usage import TokenLedger

    overrides: dict[str, object] = record_overrides(record, replay)
    if name:
        overrides["corpus_name"] = name
    cfg = get_config(config, overrides or None)
    pins = [p.strip() for raw in (pin_types or []) for p in raw.split(",") if p.strip()]
    ledger = TokenLedger()
    try:
        lm = build_lm(cfg, "extract", ledger=ledger)
        result = bootstrap_corpus(
            cfg,
            corpus,
            lm=lm,
            ledger=ledger,
            questions_path=questions,
            pin_types=pins,
            seed=seed,
            sample_size=sample_size,
            tracker=create_tracker(cfg, enabled=track),
            register=register_prompt,
            out_dir=out_dir,
        )
    except (KituneError, ValueError) as e:
        fail_with(e)

    table = Table(title=f"bootstrap sample of {corpus} (seed {seed})")
    table.add_column("docid")
    table.add_column("why")
    for s in result.sample:
        table.add_row(s.docid, s.why()[:100])
    out.print(table)
    d = result.description.description
    out.print(f"domain: [bold]{d.domain}[/] ({result.description.status})")
    out.print(f"entity types: {', '.join(result.draft.entity_types) or '-'}")
    if result.draft.pins_restored:
        out.print(f"pinned types restored: {', '.join(result.draft.pins_restored)}")
    if result.prompt_version is not None:
        out.print(
            f"draft {result.draft.version} → {result.prompt_name} v{result.prompt_version} "
            f"({', '.join(result.prompt_aliases)})"
            + (" (same text already registered)" if result.prompt_reused else "")
        )
    out.print(f"source-description KIs written: {result.kis_written}/{len(result.kis)}")
    for row in result.tokens:
        out.print(
            f"tokens {row['role']}/{row['stage']}: {row['calls']} call(s), "
            f"{row['input_tokens']} in, {row['output_tokens']} out"
        )
    out.print(f"report: {Path(result.out_dir) / 'report.md'}")
    if result.errors:
        for key, reason in sorted(result.errors.items())[:5]:
            out.print(f"[yellow]{key}[/]: {reason[:200]}")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``kitune bootstrap`` to ``app``."""
    app.command("bootstrap")(bootstrap)
