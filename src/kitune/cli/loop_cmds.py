"""``kitune prompts list|show|diff|promote|rollback``: the prompt registry from the shell.

Thin: parse arguments → :mod:`kitune.service.serving.prompts` → print Rich tables. ``optimize``,
``drift`` and ``demo`` are added here by the optimisation loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kitune.cli.common import (
    PROGRESS_HELP,
    ConfigOption,
    fail,
    fail_with,
    get_config,
    positive,
    quiet_progress,
)
from kitune.cli.recording_opts import RecordOption, ReplayOption, record_overrides, with_recording
from kitune.errors import KituneError

if TYPE_CHECKING:
    from kitune.config import KituneConfig

__all__ = ["demo_cmd", "drift_app", "optimize_cmd", "prompts_app", "register", "register_loop"]

prompts_app = typer.Typer(
    help="Versioned prompts in the MLflow prompt registry (aliases: candidate, production).",
    no_args_is_help=True,
)

out = Console()

_T = TypeVar("_T")


def _or_fail(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)``; a KituneError exits 2 with its message (the prompts commands)."""
    try:
        return fn(*args, **kwargs)
    except KituneError as e:
        fail(str(e))


def _or_exit_1(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)``; a KituneError exits with its message (the loop commands).

    Exit 1 for a run-time failure (an LLM call, the store), 2 for bad input (see ``fail_with``).
    """
    try:
        return fn(*args, **kwargs)
    except KituneError as e:
        fail_with(e)


def _when(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M")


def _no_registry(cfg: KituneConfig) -> bool:
    """True when the registry is a SQLite file that does not exist yet (nothing registered).

    The prompts commands check this first: opening the registry would create the file (and
    take seconds to set up MLflow's schema) only to report that the prompt does not exist.
    """
    uri = cfg.mlflow_uri
    return uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file()


def _fail_if_no_registry(cfg: KituneConfig, name: str) -> None:
    if _no_registry(cfg):
        fail(
            f"no prompt named {name!r}: nothing is registered yet in {cfg.mlflow_uri} (run `kitune "
            "bootstrap` or `kitune optimize` first, with the same --config)"
        )


@prompts_app.command("list")
def list_cmd(config: ConfigOption = None) -> None:
    """List registered prompts with their latest version and aliases."""
    from kitune.service.serving.prompts import list_prompts

    cfg = get_config(config)
    rows = [] if _no_registry(cfg) else _or_fail(list_prompts, cfg)
    if not rows:
        out.print(
            f"No prompts registered yet in {cfg.mlflow_uri} (run `kitune bootstrap` or `kitune optimize` "
            "first, with the same --config).",
            soft_wrap=True,
        )
        return
    table = Table(title=f"Prompts in {cfg.mlflow_uri}")
    table.add_column("name")
    table.add_column("latest", justify="right")
    table.add_column("production", justify="right")
    table.add_column("candidate", justify="right")
    for row in rows:
        table.add_row(
            row.name,
            str(row.latest_version),
            str(row.aliases.get("production", "-")),
            str(row.aliases.get("candidate", "-")),
        )
    out.print(table)
    # the same forms as the commands themselves: NAME then VERSION (a number or an alias)
    row = next((r for r in rows if "candidate" in r.aliases), rows[0])
    target = "candidate" if "candidate" in row.aliases else str(row.latest_version)
    base = "production" if "production" in row.aliases else "1"
    lines = [f"kitune prompts show {row.name} {target}       # one version's text (--versions: all of them)"]
    if str(row.aliases.get(base, base)) != str(row.aliases.get(target, target)):
        lines.append(f"kitune prompts diff {row.name} {base} {target}")
    lines += [
        f"kitune prompts promote {row.name} {target}    # checked first; a running serve follows",
        f"kitune prompts rollback {row.name}",
    ]
    for line in lines:
        out.print(line, highlight=False, markup=False, soft_wrap=True)


@prompts_app.command("show")
def show_cmd(
    name: Annotated[str, typer.Argument(help="Prompt name, e.g. kitune-fixture-extractor.")],
    which: Annotated[
        str | None,
        typer.Argument(
            metavar="[VERSION]",
            help="Version (or alias, e.g. candidate), as `kitune prompts promote` takes it. Default: "
            "production, else latest.",
            show_default=False,
        ),
    ] = None,
    version: Annotated[str | None, typer.Option("--version", "-v", help="Version number.")] = None,
    alias: Annotated[
        str | None, typer.Option("--alias", "-a", help="Alias: production or candidate.")
    ] = None,
    history: Annotated[
        bool, typer.Option("--versions", help="List every version instead of one text.")
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Print one version's text (default: production, else latest), or --versions for all.

    Example: kitune prompts show kitune-fixture-extractor candidate
    """
    from kitune.service.serving.prompts import prompt_versions, show_prompt

    cfg = get_config(config)
    if which is not None:
        if version is not None or alias is not None:
            fail(f"VERSION {which!r} and --version/--alias each choose the version: give one of them")
        version = which
    _fail_if_no_registry(cfg, name)
    try:
        if history:
            table = Table(title=name)
            for col in ("version", "aliases", "created (UTC)", "commit message", "chars"):
                table.add_column(col)
            for v in prompt_versions(cfg, name):
                table.add_row(
                    str(v.version),
                    ", ".join(v.aliases) or "-",
                    _when(v.created_ms),
                    v.commit_message or "-",
                    str(len(v.text)),
                )
            out.print(table)
            return
        pv = show_prompt(cfg, name, version=version, alias=alias)
    except (KituneError, ValueError) as e:
        fail(str(e))
    aliases = escape(f" [{', '.join(pv.aliases)}]") if pv.aliases else ""
    out.print(f"[bold]{escape(pv.name)}[/] version {pv.version}{aliases}", highlight=False)
    if pv.commit_message:
        out.print(f"commit: {pv.commit_message}", highlight=False, markup=False)
    user_tags = {k: v for k, v in pv.tags.items() if not k.startswith("kitune.")}
    if user_tags:
        out.print("tags: " + ", ".join(f"{k}={v}" for k, v in sorted(user_tags.items())), markup=False)
    out.rule()
    out.print(pv.text, markup=False, highlight=False)


@prompts_app.command("diff")
def diff_cmd(
    name: Annotated[str, typer.Argument(help="Prompt name.")],
    v1: Annotated[str, typer.Argument(help="From version (or alias).")],
    v2: Annotated[str, typer.Argument(help="To version (or alias).")],
    config: ConfigOption = None,
) -> None:
    """Unified diff between two versions of a prompt."""
    from kitune.service.serving.prompts import diff_prompt_versions

    cfg = get_config(config)
    _fail_if_no_registry(cfg, name)
    text = _or_fail(diff_prompt_versions, cfg, name, v1, v2)
    if not text:
        out.print(f"{name}: versions {v1} and {v2} are identical.", highlight=False)
        return
    for line in text.splitlines():
        style = "green" if line.startswith("+") else "red" if line.startswith("-") else None
        out.print(line, style=style, markup=False, highlight=False)


ForceOption = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Switch even when the KI table the version serves is empty or its extraction failed on "
        "more than --max-failed-share of its documents.",
    ),
]
MaxFailedOption = Annotated[
    float,
    typer.Option(
        "--max-failed-share",
        min=0.0,
        max=1.0,
        help="Refuse a version whose extraction failed on more than this share of its documents.",
    ),
]


def _switch_or_fail(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """A promote/rollback: a refusal exits 1 (nothing switched), bad input 2."""
    from kitune.errors import PromotionRefusedError

    try:
        return fn(*args, **kwargs)
    except PromotionRefusedError as e:
        fail(str(e), code=1)
    except KituneError as e:
        fail(str(e))


@prompts_app.command("promote")
def promote_cmd(
    name: Annotated[str, typer.Argument(help="Prompt name.")],
    version: Annotated[str, typer.Argument(help="Version (or alias, e.g. candidate) to put in production.")],
    force: ForceOption = False,
    max_failed_share: MaxFailedOption = 0.2,
    config: ConfigOption = None,
) -> None:
    """Point the production alias at VERSION (recorded so rollback can undo it).

    An extractor version is checked first: one whose KI table holds no active KI, or whose
    extraction failed on more than --max-failed-share of its documents, is refused (exit 1,
    production unchanged) unless --force. A running `kitune serve` / `kitune mcp` switches on
    its next refresh and never to an empty table.

    Example: kitune prompts promote kitune-fixture-extractor candidate
    """
    from kitune.service.serving.prompts import promote_prompt

    cfg = get_config(config)
    _fail_if_no_registry(cfg, name)  # opening an empty registry would create mlflow.db
    previous = _production_version(cfg, name)
    pv = _switch_or_fail(promote_prompt, cfg, name, version, force=force, max_failed_share=max_failed_share)
    out.print(f"{pv.name}: production → version {pv.version}", highlight=False)
    _now_used(cfg, name)
    _follow_fingerprint(cfg, name, previous, pv.version)


@prompts_app.command("rollback")
def rollback_cmd(
    name: Annotated[str, typer.Argument(help="Prompt name.")],
    force: ForceOption = False,
    max_failed_share: MaxFailedOption = 0.2,
    config: ConfigOption = None,
) -> None:
    """Move production back to the previous production version (checked as a promotion is)."""
    from kitune.service.serving.prompts import rollback_prompt

    cfg = get_config(config)
    _fail_if_no_registry(cfg, name)
    previous = _production_version(cfg, name)
    pv = _switch_or_fail(rollback_prompt, cfg, name, force=force, max_failed_share=max_failed_share)
    out.print(f"{pv.name}: production rolled back to version {pv.version}", highlight=False)
    _now_used(cfg, name)
    _follow_fingerprint(cfg, name, previous, pv.version)


def _production_version(cfg: Any, name: str) -> int | None:
    """The version ``production`` points at now (None: none, or an unknown name)."""
    from kitune.service.serving.prompts import open_registry

    try:
        return open_registry(cfg).get(name, "production").version
    except KituneError:
        return None


def _follow_fingerprint(cfg: Any, name: str, previous: int | None, current: int) -> None:
    """Put the drift fingerprint of the version now served in place and say where (nothing else moves)."""
    from kitune.service.tuning.slice_fingerprint import follow_served_version

    for path in follow_served_version(Path(cfg.workdir), name, previous=previous, current=current):
        out.print(
            f"drift fingerprint {path}: now the data version {current} was extracted from "
            "(`kitune drift check` compares with it)",
            highlight=False,
            soft_wrap=True,
        )


def _now_used(cfg: Any, name: str) -> None:
    """Say what ``serve``/``context``/``extract``/``eval`` use after a promote or rollback of ``name``."""
    from kitune.optimizers.program_task import served_programs
    from kitune.service.serving.prompts import describe_setting, production_setting
    from kitune.tracking.prompts import prompt_name

    programs = tuple(p for p in served_programs() if prompt_name(cfg.corpus_name, p) == name)
    if not programs:
        out.print(
            f"(serve/context/extract/eval read the prompts of corpus {cfg.corpus_name!r}, "
            f"kitune-{cfg.corpus_name}-<program>; {name} is not one of them)",
            highlight=False,
        )
        return
    for line in describe_setting(_or_fail(production_setting, cfg), programs):
        out.print(f"now used by serve/context/extract/eval: {line}", highlight=False, markup=False)
    if "extractor" in programs:
        out.print("(each extractor version has its own KI table: `kitune extract` fills it if it is new)")


def register(app: typer.Typer) -> None:
    """Add ``kitune prompts`` (and the loop commands, see :func:`register_loop`) to ``app``."""
    app.add_typer(prompts_app, name="prompts")
    register_loop(app)


# -- kitune optimize / drift / demo ---------------------------------------------------------------

drift_app = typer.Typer(
    help="Re-evaluate the production prompts on new or changed questions/documents.", no_args_is_help=True
)

DataOption = Annotated[
    Path,
    typer.Option(
        "--data", "-d", help="Dataset folder (BrowseComp-Plus layout or JSONL).", show_default=False
    ),
]
RunNameOption = Annotated[
    str, typer.Option("--run-name", help="Loop state folder under <workdir>/optimize (rerun to resume).")
]


def _programs(value: str | None) -> tuple[str, ...]:
    """``--programs a,b``: registered program names (None: every registered program)."""
    from kitune.optimizers.program_task import program_names

    known = program_names()
    if value is None:
        return known
    names = tuple(p.strip() for p in value.split(",") if p.strip())
    bad = [p for p in names if p not in known]
    if bad or not names:
        fail(f"--programs {value!r}: choose a comma-separated subset of {', '.join(known)}")
    return names


def _optimizer(value: str) -> str:
    """``--optimizer``: a name from the optimiser registry (exit 2 listing the registered ones)."""
    from kitune.optimizers.registry import check_optimizer

    try:
        return check_optimizer(value)
    except KituneError as e:
        fail(str(e))


def _log(message: str) -> None:
    out.print(f"[dim]{datetime.now(UTC).strftime('%H:%M:%S')}[/] {message}", soft_wrap=True, highlight=False)


def _history_table(history: Sequence[Any], title: str) -> Table:
    # short two-line headers explained in the caption, one changed program per line: an 80-column
    # terminal shows every value whole (long headers were cut to "valid…")
    table = Table(
        title=title,
        caption="#: iteration; acc: accuracy; val: validation split; cand val: the candidate "
        "setting's validation score; flips: tune questions fixed/broken",
        show_edge=False,
        pad_edge=False,
    )
    cols = (
        "#",
        "tune\nacc",
        "val\nacc",
        "tune\nscore",
        "val\nscore",
        "cand\nval",
        "flips",
        "decision",
        "changed",
    )
    for col in cols:
        table.add_column(
            col,
            justify="left" if col in ("decision", "changed") else "right",
            overflow="fold",
            min_width=len("disambiguator") if col == "changed" else None,
        )
    for r in history:
        f = (getattr(r, "flips", None) or {}).get("tune") or {}
        decision = getattr(r, "decision", "") or ("accepted" if r.accepted else "rejected")
        table.add_row(
            str(r.iteration),
            "-" if r.tune_accuracy is None else f"{r.tune_accuracy:.0%}",
            "-" if r.val_accuracy is None else f"{r.val_accuracy:.0%}",
            f"{r.tune_score:+.3f}",
            f"{r.val_score:+.3f}",
            f"{r.candidate_val_score:+.3f}",
            f"+{len(f.get('fixed', []))}/-{len(f.get('broken', []))}" if r.iteration else "-",
            {
                "accepted": "[green]accepted[/]",
                "undecided": "[yellow]undecided[/]",
                "not_enough_evidence": "[yellow]not enough evidence[/]",
            }.get(decision, decision),
            "\n".join(r.changed) or "-",
        )
    return table


def _mlflow_hint(uri: str) -> str:
    return f"MLflow runs: mlflow ui --backend-store-uri {uri}"


@with_recording
def optimize_cmd(
    data: DataOption,
    config: ConfigOption = None,
    questions: Annotated[
        int | None,
        typer.Option(
            "--questions", "-n", min=1, help="N questions: the first N, or a sample with --sample-seed."
        ),
    ] = None,
    sample_seed: Annotated[
        int | None,
        typer.Option(
            "--sample-seed",
            min=0,
            help="Take a seeded random sample of --questions questions instead of the first N (the ids go to "
            "<state>/questions.json).",
        ),
    ] = None,
    iterations: Annotated[
        int | None, typer.Option(min=1, help="Total iterations (default optimize.iterations).")
    ] = None,
    optimizer: Annotated[
        str | None,
        typer.Option(
            help="A registered optimiser: gepa or mipro, or a plug-in (default optimize.optimizer)."
        ),
    ] = None,
    programs: Annotated[
        str | None,
        typer.Option(help="Programs to tune, comma-separated (default: every registered program)."),
    ] = None,
    knob_trials: Annotated[int, typer.Option(min=0, help="Optuna trials per iteration (0: none).")] = 0,
    max_metric_calls: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="GEPA metric calls (MIPROv2 trials) per program (default optimize.max_metric_calls; unset: "
            "the smallest budget that makes optimize.min_proposals proposals).",
        ),
    ] = None,
    distractors: Annotated[int, typer.Option(min=0, help="Extra non-evidence documents indexed.")] = 4,
    budget_minutes: Annotated[
        float | None,
        typer.Option(callback=positive, help="Wall-clock cap per program optimisation, in minutes (> 0)."),
    ] = None,
    feedback: Annotated[
        bool, typer.Option("--feedback/--no-feedback", help="Disambiguation KIs from failures.")
    ] = True,
    run_name: RunNameOption = "optimize",
    extract_only: Annotated[
        bool,
        typer.Option(
            "--extract-only",
            help="Only extract the slice's documents with the extractor the loop starts from (resumable), "
            "then stop; the loop run with the same --run-name finds them done.",
        ),
    ] = False,
    promote: Annotated[
        bool,
        typer.Option(
            "--promote",
            help="Promote what the run accepts to production at the end (checked as `kitune prompts "
            "promote` is). Default: staged as candidate, not served.",
        ),
    ] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help=PROGRESS_HELP)] = True,
    split: Annotated[
        str,
        typer.Option(
            "--split",
            help="How questions are split into tuning and validation: random (default: a seeded shuffle, as "
            "earlier runs) or stratified (per source dataset, no evidence document in both splits; the moved "
            "questions are listed in <state>/questions.json).",
        ),
    ] = "random",
    measure: Annotated[
        str,
        typer.Option(
            "--measure",
            help="full (default): the agent on every tuning and validation question each iteration; stage: "
            "the stage metrics on every question, the agent only on --e2e-sample validation questions "
            "(and the tuning ones with --tune-agent).",
        ),
    ] = "full",
    tune_agent: Annotated[
        bool,
        typer.Option(
            "--tune-agent/--no-tune-agent",
            help="With --measure stage: also run the agent on the tuning questions (their failures feed the "
            "feedback KIs; off: no feedback KIs are written).",
        ),
    ] = False,
    e2e_sample: Annotated[
        str,
        typer.Option(
            "--e2e-sample",
            help="With --measure stage: validation questions (a seeded subset, the same each iteration) the "
            "agent runs on per measurement: a number (0, the default: none) or auto (as many as the "
            "end-to-end non-inferiority check needs for optimize.power at optimize.noninferiority_margin, "
            "at most the split).",
        ),
    ] = "0",
    final_eval: Annotated[
        bool,
        typer.Option(
            "--final-eval",
            help="After the last iteration, run the start setting (feedback KIs hidden) and the final one on "
            "every validation question and pair them (<state>/final_eval.md|json); on a finished run it "
            "runs only this step.",
        ),
    ] = False,
    record: RecordOption = None,
    replay: ReplayOption = None,
) -> None:
    """Run (or resume) the self-improvement loop: extract → evaluate → improve → validate → accept → log.

    Each iteration is an MLflow run; accepted prompts become new versions in the prompt registry
    (aliases candidate, production). Rerunning the same command continues where it stopped.

    Examples:
    kitune optimize --data ../shared/data/dev
    kitune optimize --data "$(kitune demo --print-fixture)" --questions 8 --iterations 1 --budget-minutes 20
    """
    quiet_progress(progress)
    from kitune.service.tuning.optimize import extract_slice, run_optimize
    from kitune.service.tuning.options import E2E_AUTO, OptimizeOptions
    from kitune.service.tuning.slicing import SPLIT_METHODS

    if sample_seed is not None and questions is None:
        raise typer.BadParameter(
            "needs --questions N, the size of the sample (without --questions every question is used, "
            "so there is nothing to sample)",
            param_hint="'--sample-seed'",
        )
    if split not in SPLIT_METHODS:
        raise typer.BadParameter(f"use one of {', '.join(SPLIT_METHODS)}", param_hint="'--split'")
    if measure not in ("full", "stage"):
        raise typer.BadParameter("use full or stage", param_hint="'--measure'")
    if e2e_sample != "auto" and not (e2e_sample.isdigit()):
        raise typer.BadParameter(f"{e2e_sample!r}: use a number ≥ 0 or auto", param_hint="'--e2e-sample'")
    sample = E2E_AUTO if e2e_sample == "auto" else int(e2e_sample)
    if measure == "full" and (tune_agent or sample):
        raise typer.BadParameter(
            "--tune-agent and --e2e-sample choose the agent's questions under --measure stage; "
            "--measure full runs it on every question",
            param_hint="'--measure'",
        )
    cfg = get_config(config, record_overrides(record, replay) or None)
    choice = _optimizer(optimizer or cfg.optimize.optimizer)
    opts = OptimizeOptions(
        data_dir=data,
        questions=questions,
        sample_seed=sample_seed,
        iterations=iterations or cfg.optimize.iterations,
        optimizer=choice,
        programs=_programs(programs),
        knob_trials=knob_trials,
        max_metric_calls=max_metric_calls,
        budget_minutes=budget_minutes,
        distractors=distractors,
        feedback=feedback,
        run_name=run_name,
        progress=progress,
        split=split,
        measure=measure,
        tune_agent=tune_agent,
        e2e_sample=sample,
        final_eval=final_eval,
        promote=promote,
    )
    if extract_only:
        ext = _or_exit_1(extract_slice, cfg, opts, log=_log)
        m = ext.metrics
        out.print(
            f"extracted with {ext.prompt_version} (setting {ext.setting_key}) for {ext.documents} documents: "
            f"{int(m.get('extract_docs_done', 0))} done, {int(m.get('extract_docs_failed', 0))} failed, "
            f"{int(m.get('extract_docs_skipped', 0))} skipped, "
            f"{int(m.get('extract_kis_written', 0))} KIs written (nothing to do when all are 0); "
            f"questions: {ext.state_dir / 'questions.json'}",
            highlight=False,
            soft_wrap=True,
        )
        return
    res = _or_exit_1(run_optimize, cfg, opts, log=_log)
    out.print(_history_table(res.loop.history, f"kitune optimize ({run_name})"))
    out.print(
        f"tune questions: {', '.join(res.tune_ids) or 'none'}; "
        f"validation: {', '.join(res.validation_ids) or 'none'}"
    )
    if res.final is not None:
        out.print(res.final.md_path.read_text(encoding="utf-8"), highlight=False, soft_wrap=True)
    if res.loop.curves_md is not None:
        out.print(
            f"curves: {res.loop.curves_md}" + (f", {res.loop.curves_png}" if res.loop.curves_png else "")
        )
    out.print(_mlflow_hint(res.mlflow_uri), soft_wrap=True, highlight=False)
    for pname, version in res.staged.items():
        if pname in res.promoted:
            out.print(f"promoted {pname} v{version} to production", highlight=False)
        else:
            out.print(
                f"staged {pname} v{version} (alias candidate, not served): "
                f"kitune prompts promote {pname} {version}",
                highlight=False,
                soft_wrap=True,
            )
    if res.promotion_refused:
        fail(res.promotion_refused, code=1)


def _names(ids: Sequence[str], limit: int = 8) -> str:
    if not ids:
        return "0"
    shown = ", ".join(ids[:limit]) + (f", … {len(ids) - limit} more" if len(ids) > limit else "")
    return f"{len(ids)}: {shown}"


def _drift_table(report: Any) -> Table:
    table = Table(title=f"kitune drift (served table {report.served_table})")
    table.add_column("item")
    table.add_column("value", overflow="fold")
    rows = [
        ("documents added", _names(report.new_documents)),
        ("documents removed", _names(report.removed_documents)),
        ("documents changed", _names(report.changed_documents)),
        ("documents unchanged", str(report.unchanged_documents)),
        ("questions new", _names(report.new_questions)),
        ("questions removed", _names(report.removed_questions)),
        ("questions changed", _names(report.changed_questions)),
        ("affected questions", _names(report.affected_questions)),
        (
            "reference accuracy (last accepted)",
            "-" if report.reference_score is None else f"{report.reference_score:.3f}",
        ),
        ("accuracy on affected questions", "-" if report.accuracy is None else f"{report.accuracy:.1%}"),
        ("drop", f"{report.drop:.3f}"),
    ]
    rows += [(f"served KIs {status}", str(n)) for status, n in report.kis_by_status.items()]
    for label, value in rows:
        table.add_row(label, value)
    return table


def _require_data(data: Path) -> None:
    """Exit 2 naming --data when it does not exist (before any fingerprint is looked for)."""
    if not data.exists():
        fail(
            f"--data {data} does not exist: pass a dataset folder (BrowseComp-Plus layout) or a JSONL "
            'file, e.g. --data "$(kitune demo --print-fixture)" (the fixture that ships with kitune)'
        )


@drift_app.command("check")
def drift_check_cmd(
    data: DataOption,
    config: ConfigOption = None,
    run_name: RunNameOption = "optimize",
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help=PROGRESS_HELP)] = True,
) -> None:
    """Compare the data with what the last optimisation run saw; evaluate the served setting on what changed.

    Read-only: names the added / removed / changed documents and new / removed / changed
    questions, and runs the agent with the served prompts and KI table on the affected
    questions. Nothing is extracted, swept or written to any KI table.

    Example: kitune drift check --data my-corpus
    """
    quiet_progress(progress)
    from kitune.service.workflows.drift import drift_check

    _require_data(data)
    cfg = get_config(config)
    report = _or_exit_1(drift_check, cfg, data, run_name=run_name, progress=progress, log=_log)
    out.print(_drift_table(report))
    if report.note:
        out.print(f"[yellow]{escape(report.note)}[/]")
    if not report.has_changes:
        out.print("nothing changed since the run")


@drift_app.command("run")
def drift_run_cmd(
    data: DataOption,
    force: Annotated[
        bool, typer.Option("--force", help="Stage a re-extraction even when the check finds no change.")
    ] = False,
    config: ConfigOption = None,
    run_name: RunNameOption = "optimize",
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help=PROGRESS_HELP)] = True,
) -> None:
    """Stage the changed data in a new KI table and prompt version (not served until promoted).

    Copies the served KI table, re-extracts the changed and added documents there (their old
    facts expire, reason source_changed), expires the removed documents' facts, and registers the
    production extractor prompt again as a version tagged with that table, alias candidate.
    `kitune prompts promote <name> candidate` serves it; `rollback` switches back.

    Example: kitune drift run --data my-corpus
    """
    quiet_progress(progress)
    from kitune.service.workflows.drift import drift_run

    _require_data(data)
    cfg = get_config(config)
    res = _or_exit_1(drift_run, cfg, data, force=force, run_name=run_name, progress=progress, log=_log)
    out.print(_drift_table(res.report))
    if not res.ran:
        out.print(
            "nothing changed since the run: nothing staged (--force re-extracts anyway)", soft_wrap=True
        )
        return
    out.print(
        f"staged {res.prompt} v{res.version} (alias candidate, NOT served): table {res.table} with "
        f"{res.kis_active} active KIs; {res.extracted} document(s) extracted, "
        f"{res.expired_changed} old KI(s) of changed and {res.expired_removed} of removed documents expired",
        highlight=False,
        soft_wrap=True,
    )
    if res.failed:
        out.print(f"[yellow]extraction failed for {len(res.failed)}: {', '.join(res.failed[:10])}[/] (rerun)")
    out.print(f"serve it: kitune prompts promote {res.prompt} {res.version}", highlight=False, soft_wrap=True)
    if res.failed:
        raise typer.Exit(1)


def _demo_table(summaries: Sequence[Any], grader: str) -> Table:
    table = Table(title="kitune demo: baseline vs in-context vs in-context + disambiguation")
    table.add_column("metric")
    for s in summaries:
        table.add_column(s.name, justify="right")

    def acc(s: Any) -> str:
        return "-" if s.accuracy is None else f"{s.n_correct}/{s.n_graded} ({s.accuracy:.0%})"

    rows: list[tuple[str, Callable[[Any], str]]] = [
        (f"accuracy ({'LLM judge' if grader == 'llm' else grader})", acc),
        ("exact match", lambda s: f"{s.em:.0%}"),
        ("token F1", lambda s: f"{s.f1:.2f}"),
        (
            "input tokens / question",
            lambda s: f"{(s.input_tokens + s.tool_input_tokens) / max(s.n_total, 1):,.0f}",
        ),
        ("output tokens", lambda s: f"{s.output_tokens:,}"),
        ("timeouts", lambda s: str(s.timeouts)),
        ("grader errors", lambda s: str(s.n_grader_errors)),
    ]
    for label, fn in rows:
        table.add_row(label, *(fn(s) for s in summaries))
    return table


@with_recording
def demo_cmd(
    data: Annotated[
        Path | None,
        typer.Option("--data", "-d", help="Dataset folder (default: the fixture packaged with kitune)."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Config file (default: the demo.yaml packaged with kitune)."),
    ] = None,
    questions: Annotated[int, typer.Option("--questions", "-n", min=1, help="Questions in the slice.")] = 4,
    distractors: Annotated[int, typer.Option(min=0, help="Extra non-evidence documents.")] = 2,
    iterations: Annotated[int, typer.Option(min=1, help="Optimisation iterations.")] = 1,
    programs: Annotated[str, typer.Option(help="Programs the optimisation round tunes.")] = "extractor",
    optimizer: Annotated[
        str, typer.Option(help="A registered optimiser: gepa or mipro, or a plug-in.")
    ] = "gepa",
    max_metric_calls: Annotated[
        int | None,
        typer.Option(min=1, help="GEPA metric calls per program (default: enough for one proposal)."),
    ] = None,
    knob_trials: Annotated[int, typer.Option(min=0, help="Optuna trials (LLM-free objective).")] = 5,
    budget_minutes: Annotated[
        float | None,
        typer.Option(callback=positive, help="Wall-clock cap of the prompt optimisation, in minutes (> 0)."),
    ] = None,
    workdir: Annotated[Path | None, typer.Option(help="Work folder (the demo uses <workdir>/demo).")] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help=PROGRESS_HELP)] = True,
    record: RecordOption = None,
    replay: ReplayOption = None,
    print_fixture: Annotated[
        bool, typer.Option("--print-fixture", help="Print the packaged fixture's folder and exit.")
    ] = False,
    print_config: Annotated[
        bool, typer.Option("--print-config", help="Print the packaged demo.yaml's path and exit.")
    ] = False,
) -> None:
    """The main job: extract KIs, compare baseline / in-context / in-context + disambiguation, optimise once.

    Uses the embedded local model and the embedded store unless the config names others.
    Everything lands in <workdir>/demo; rerunning the command resumes.

    The data (24 fixture questions, MuSiQue CC BY 4.0 / HotpotQA CC BY-SA 4.0) and the config ship
    inside the package: nothing beside the checkout is needed. Other commands reach them with
    --data "$(kitune demo --print-fixture)" -c "$(kitune demo --print-config)".

    Examples:
    kitune demo
    kitune demo --record runs/demo-rec   (then: kitune demo --replay runs/demo-rec)
    """
    quiet_progress(progress)
    import time

    from kitune.service.workflows.demo import (
        DemoOptions,
        default_demo_config,
        default_fixture,
        failed_documents_line,
        run_demo,
    )

    if print_fixture or print_config:
        for wanted, where in ((print_config, default_demo_config()), (print_fixture, default_fixture())):
            if wanted:
                typer.echo(str(where))
        return

    started = time.monotonic()
    path = config if config is not None else default_demo_config()
    overrides: dict[str, object] = {"workdir": str(workdir)} if workdir is not None else {}
    overrides.update(record_overrides(record, replay))
    cfg = get_config(path if path.is_file() or config is not None else None, overrides or None)
    _optimizer(optimizer)
    opts = DemoOptions(
        data_dir=data,
        questions=questions,
        distractors=distractors,
        iterations=iterations,
        programs=_programs(programs),
        optimizer=optimizer,
        max_metric_calls=max_metric_calls,
        knob_trials=knob_trials,
        budget_minutes=budget_minutes,
        progress=progress,
    )
    _log(f"kitune demo: config {path}, workdir {cfg.workdir / 'demo'}")
    res = _or_exit_1(run_demo, cfg, opts, log=_log)
    out.print(_demo_table(res.summaries, cfg.grading.grader))
    f = res.flips
    out.print(
        f"disambiguation KIs written: {res.feedback.written}/{res.feedback.attempted}; flips: "
        f"{len(f.fixed)} fixed, {len(f.still_wrong)} still wrong, {len(f.newly_wrong)} newly wrong"
    )
    out.print(_history_table(res.loop.history, "optimisation"))
    if res.extract_failed:
        out.print(f"[yellow]extraction: {failed_documents_line(res.extract_failed)}[/]", soft_wrap=True)
    report = f"report: {res.report.markdown}" + (f", {res.report.plot}" if res.report.plot else "")
    out.print(report, soft_wrap=True, highlight=False)
    out.print(_mlflow_hint(res.mlflow_uri), soft_wrap=True, highlight=False)
    out.print(f"wall time: {(time.monotonic() - started) / 60:.1f} min")


def register_loop(app: typer.Typer) -> None:
    """Add ``kitune optimize``, ``kitune drift`` and ``kitune demo`` to ``app``."""
    app.command("optimize")(optimize_cmd)
    app.add_typer(drift_app, name="drift")
    app.command("demo")(demo_cmd)
