"""``kitune eval`` and ``kitune report``: thin wrappers over :mod:`kitune.service.pipelines.evaluation`.

``kitune eval`` prints the prompt versions and KI table an in-context run uses, one line per
finished question (correct / wrong / not graded / failed with its reason), and, after the
summary table, the failed questions: they are not graded and not in the accuracy. An
authentication failure stops the run and exits 2 with the message naming the key variable.
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer
from rich.console import Console
from rich.table import Table

from kitune.cli.common import (
    PROGRESS_HELP,
    ConfigOption,
    console,
    fail,
    fail_with,
    get_config,
    quiet_progress,
)
from kitune.cli.context_cmds import PackagedOption, PromptAliasOption, PromptVersionOption, prompt_specs
from kitune.cli.recording_opts import RecordOption, ReplayOption, record_overrides, with_recording
from kitune.errors import KituneError

if TYPE_CHECKING:
    from kitune.config import KituneConfig
    from kitune.data.examples import Split
    from kitune.evaluation.metrics import Trace
    from kitune.evaluation.report import RunSummary
    from kitune.evaluation.tools import Skill

__all__ = ["EVAL_SKILL_CHOICES", "register"]


class SkillChoice(str, Enum):  # noqa: UP042 - typer parses str-valued Enum choices
    """The skills ``--skill`` accepts.

    Kept equal to ``kitune.evaluation.full_context.EVAL_SKILLS`` by a test; spelled out here so
    ``kitune --help`` does not import the evaluation stack.
    """

    baseline = "baseline"
    in_context = "in-context"
    closed_book = "closed-book"
    full_context = "full-context"


class SplitChoice(str, Enum):  # noqa: UP042 - as SkillChoice
    """The question splits ``--split`` accepts."""

    all = "all"
    tune = "tune"
    validation = "validation"


EVAL_SKILL_CHOICES: tuple[str, ...] = tuple(c.value for c in SkillChoice)

_out = Console()


def _summary_table(title: str, rows: list[list[str]], header: list[str]) -> Table:
    table = Table(title=title)
    for h in header:
        table.add_column(h)
    for r in rows:
        table.add_row(*r)
    return table


@with_recording
def eval_command(
    skill_choice: Annotated[
        SkillChoice,
        typer.Option(
            "--skill",
            metavar="SKILL",
            help="What the agent gets: baseline (search + fetch), in-context (the KI store), closed-book "
            "(nothing), full-context (the whole conversation in the prompt).",
        ),
    ],
    data: Annotated[
        Path, typer.Option("--data", help="Dataset directory (BrowseComp-Plus layout or JSONL).")
    ],
    split_choice: Annotated[
        SplitChoice,
        typer.Option("--split", help="Which questions; tune/validation are seeded by optimize.seed."),
    ] = SplitChoice.all,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Only the first N questions.")] = None,
    run_name: Annotated[
        str | None, typer.Option("--run-name", help="Run folder under <workdir>/runs.")
    ] = None,
    disambiguation: Annotated[
        bool, typer.Option("--disambiguation", help="in-context: keep disambiguation KIs in results.")
    ] = False,
    questions: Annotated[
        Path | None,
        typer.Option(
            "--questions",
            metavar="FILE",
            help="Questions overriding --data's: a JSONL file, one question per line with query_id, "
            'query, answer and optional aliases, evidence_docids, gold_docids, e.g. {"query_id": "q1", '
            '"query": "Which license does curl use?", "answer": "MIT", "evidence_docids": ["curl"]}; '
            "or a folder holding questions.jsonl, a BrowseComp-Plus folder (ground_truth.jsonl), or "
            "LoCoMo as published.",
        ),
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", min=1, help="Questions in parallel.")
    ] = None,
    rewrite: Annotated[
        bool,
        typer.Option(
            "--rewrite", help="in-context: rewrite look-ups with the query rewriter (costs tokens)."
        ),
    ] = False,
    no_judge: Annotated[bool, typer.Option("--no-judge", help="Skip the LLM judge (EM/F1 only).")] = False,
    prompt_version: PromptVersionOption = None,
    prompt_alias: PromptAliasOption = None,
    packaged: PackagedOption = False,
    no_cache: Annotated[
        bool,
        typer.Option(
            "--no-cache",
            help="Ask every question again: the run folder's earlier traces.jsonl is moved aside "
            "(traces.replaced-<time>.jsonl), not reused.",
        ),
    ] = False,
    fail_under: Annotated[
        float | None,
        typer.Option(
            "--fail-under",
            min=0.0,
            max=1.0,
            metavar="ACC",
            help="Exit 1 when the accuracy (correct / graded, 0–1) is below ACC.",
            show_default=False,
        ),
    ] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help=PROGRESS_HELP)] = True,
    config: ConfigOption = None,
    record: RecordOption = None,
    replay: ReplayOption = None,
) -> None:
    """Run the budgeted agent on a dataset slice; traces go to <workdir>/runs/<run-name>/ (resumable).

    in-context uses the KI table of the production extractor and, with --rewrite, the production
    rewriter prompt (printed first; --prompt-version / --prompt-alias / --packaged choose others).
    Questions whose LLM calls failed are reported as failed, never graded. A rerun of the same
    command reuses the answers already in its run folder and says how many (--no-cache asks again).
    Exit 1 when no question was answered or the accuracy is below --fail-under, 2 on bad input or
    an authentication failure.

    Examples:
    kitune eval --skill baseline --data "$(kitune demo --print-fixture)" --limit 4
    kitune eval --skill in-context --data "$(kitune demo --print-fixture)" --limit 4 --no-judge
    """
    quiet_progress(progress)
    from kitune.evaluation.report import ROWS, format_cell
    from kitune.service.pipelines.evaluation import run_eval
    from kitune.service.serving.prompts import parse_prompt_selection

    skill, split = skill_choice.value, split_choice.value
    cfg = get_config(config, record_overrides(record, replay) or None)
    try:
        select = parse_prompt_selection(prompt_specs(prompt_version, prompt_alias))
    except KituneError as e:
        fail(str(e))
    if not data.exists():  # named before the KI table, which an empty work dir also lacks
        from kitune.data.bundled import missing_data_message

        fail(missing_data_message(data))
    if skill == "in-context":
        _refuse_empty_ki_store(cfg, select, packaged)
    lines = _Progress(cfg.grading.grader) if progress else None
    try:
        result = run_eval(
            cfg,
            skill=cast("Skill", skill),
            data_dir=data,
            split=cast("Split", split),
            limit=limit,
            run_name=run_name,
            disambiguation=disambiguation,
            questions_path=questions,
            concurrency=concurrency,
            use_judge=not no_judge,
            rewrite=rewrite,
            prompt_select=select,
            packaged=packaged,
            on_trace=lines,
            on_setting=_print_setting,
            progress=progress,
            no_cache=no_cache,
        )
    except KituneError as e:  # bad input and a refused key exit 2, run-time failures 1
        fail_with(e)
    s = result.summary
    # what graded the answers: the deterministic match rule or the judge LLM (never "judge-correct" for both)
    graded_by = "match" if cfg.grading.grader == "match" else "judge"
    rows = [
        [f"correct ({graded_by})" if key == "judge" else label, format_cell(s, key)] for label, key in ROWS
    ]
    _out.print(_summary_table(f"eval {skill}: {s.name}", rows, ["metric", s.name]))
    _print_failures(result.traces, s)
    _out.print(f"traces: {result.traces_path}")
    if result.replaced is not None:
        _out.print(f"--no-cache: the earlier answers were moved to {result.replaced}", soft_wrap=True)
    if result.reused:
        _out.print(
            f"reused {result.reused} cached answer(s) of {len(result.traces)} from an earlier run in "
            f"{result.run_dir} (not asked again; --no-cache asks every question again)",
            soft_wrap=True,
        )
    if result.answered == 0:
        fail(f"no question was answered: all {len(result.traces)} failed (see above)", code=1)
    if fail_under is not None and (s.accuracy is None or s.accuracy < fail_under):
        shown = "nothing graded" if s.accuracy is None else f"{s.accuracy:.1%} ({s.n_correct}/{s.n_graded})"
        fail(f"accuracy {shown} is below --fail-under {fail_under:.1%}", code=1)


def _refuse_empty_ki_store(cfg: KituneConfig, select: dict[str, str], packaged: bool) -> None:
    """Exit 2 before any LLM call when the KI table an in-context run would use holds no KI."""
    from kitune.retrieval import create_store, store_exists
    from kitune.service.serving.prompts import production_setting, setting_summary

    try:
        setting = production_setting(cfg, select=select, packaged=packaged)
        if not store_exists(setting.store_cfg):  # a check must not create the table it looks for
            fail(
                f"--skill in-context: no KI table yet ({setting_summary(setting)['store']}): run `kitune "
                "extract --data DIR` first (same --config), or pick another table with --prompt-version / "
                "--prompt-alias / --packaged"
            )
        store = create_store(setting.store_cfg)
        try:
            n = store.count()
        finally:
            store.close()
    except KituneError as e:
        fail_with(e)
    if n == 0:
        fail(
            f"--skill in-context: the KI store {setting_summary(setting)['store']} holds no KIs, so every "
            "look-up would come back empty: run `kitune extract --data DIR` first (same --config), or pick "
            "another table with --prompt-version / --prompt-alias / --packaged"
        )


def _print_setting(versions: dict[str, str]) -> None:
    """Print the prompt versions and KI table an in-context run uses (stderr)."""
    for program, label in versions.items():
        text = f"KI store table: {label}" if program == "store" else f"{program} prompt: {label}"
        console.print(text, highlight=False, markup=False)


class _Progress:
    """``on_trace``: one stderr line per finished question (``correct (match)`` / ``correct (judge)``)."""

    def __init__(self, grader: str = "llm") -> None:
        self.n = 0
        self.how = "match" if grader == "match" else "judge"

    def __call__(self, trace: Trace) -> None:
        self.n += 1
        if trace.status == "failed":
            verdict = f"FAILED ({(trace.failure or 'unknown reason')[:200]})"
        elif trace.is_graded:
            verdict = f"{'correct' if trace.judge_correct else 'wrong'} ({self.how})"
        elif trace.judge_status == "grader_error":
            verdict = f"grader error ({(trace.judge_error or '')[:120]})"
        else:
            verdict = "not graded"
        tokens = trace.input_tokens + trace.tool_input_tokens
        console.print(
            f"[{self.n}] {trace.query_id}: {verdict} · {trace.n_steps} step(s), {tokens:,} input tokens",
            highlight=False,
            markup=False,
        )


def _print_failures(traces: list[Trace], s: RunSummary) -> None:
    """After the table: the failed questions and that accuracy excludes them."""
    failed = [t for t in traces if t.status == "failed"]
    if not failed:
        return
    _out.print(
        f"[yellow]{len(failed)} of {s.n_total} question(s) failed[/] (LLM calls failed; not graded, not in "
        f"the accuracy: {s.n_correct}/{s.n_graded} graded). Rerun the same command to retry them."
    )
    for t in failed[:10]:
        _out.print(f"  {t.query_id}: {(t.failure or '')[:300]}", highlight=False, markup=False)
    if len(failed) > 10:
        _out.print(f"  … and {len(failed) - 10} more")


def report_command(
    runs: Annotated[list[Path], typer.Argument(help="Run directories (or traces.jsonl files) to compare.")],
    out: Annotated[
        Path | None, typer.Option("--out", help="Output folder (default: <first run>/../report).")
    ] = None,
) -> None:
    """Compare runs side by side: Markdown table + PNG plot + HTML + summary.json.

    Folders without a traces.jsonl (such as the report folder a previous `kitune report
    <workdir>/runs/*` wrote next to the runs) are skipped with a note, so the same command can
    be run again.

    Examples:
    kitune report kitune-work/runs/*
    kitune report kitune-work/runs/* --out kitune-work/report
    """
    from kitune.service.pipelines.evaluation import report_runs

    missing = [p for p in runs if not p.exists()]
    if missing:
        fail(f"run {missing[0]} does not exist: pass run folders from `kitune eval` (<workdir>/runs/<name>)")
    run_paths = _run_folders(runs)
    if not run_paths:
        fail(
            f"none of {', '.join(str(p) for p in runs)} holds a traces.jsonl: pass run folders from "
            "`kitune eval` (<workdir>/runs/<name>)"
        )
    out_dir = out or (run_paths[0].resolve().parent / "report")
    try:
        files = report_runs(run_paths, out_dir)
    except KituneError as e:
        fail(str(e))
    # Plain echo, not rich: a Markdown table or a path must not be re-wrapped at 80 columns.
    typer.echo(_console_markdown(files.markdown.read_text(encoding="utf-8")))
    typer.echo(f"written: {files.markdown}, {files.html}" + (f", {files.plot}" if files.plot else ""))


def _run_folders(paths: list[Path]) -> list[Path]:
    """``paths`` without the folders that hold no ``traces.jsonl`` (each skipped with a note on stderr)."""
    kept: list[Path] = []
    for p in paths:
        if p.is_dir() and not (p / "traces.jsonl").is_file():
            typer.echo(f"skipped {p}: no traces.jsonl, not a run folder", err=True)
            continue
        kept.append(p)
    return kept


def _console_markdown(markdown: str) -> str:
    """The report Markdown for a terminal: image links (``![…](report.png)``) dropped."""
    lines = [line for line in markdown.splitlines() if not re.fullmatch(r"\s*!\[[^\]]*\]\([^)]*\)\s*", line)]
    return "\n".join(lines).strip("\n")


def register(app: typer.Typer) -> None:
    """Add ``eval`` and ``report`` to ``app``."""
    app.command("eval")(eval_command)
    app.command("report")(report_command)
