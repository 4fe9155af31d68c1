"""The loop's curves: ``curves.md`` (tables) and ``curves.png`` (tuning vs validation per iteration).

Written by :func:`~kitune.optimizers.loop.run_loop` at the end of every run from the
:class:`~kitune.optimizers.loop_state.IterationRecord` history, so over-fitting to the tuning
questions shows: accuracy with its 95% Wilson interval and the loop score for both splits, flips
against the previous iteration, failure kinds, the stage metrics per iteration (tuning,
validation and the candidate on validation, with intervals), the feedback KIs and what the gate
rejected, KI credit counts, and each decision with its reason. :func:`write_proposal` writes each
iteration's proposal (diffs, GEPA candidates, the decision and its numbers) to
``<state>/proposals/``.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kitune.evaluation.report import stage_markdown
from kitune.evaluation.stage_metrics import StageMetric, StageReport
from kitune.optimizers.loop_state import IterationRecord
from kitune.optimizers.setting import Proposal, Setting

__all__ = ["stage_reports", "write_curves", "write_proposal"]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _ci(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f" ({ci[0]:.0%}–{ci[1]:.0%})"


def _flips(r: IterationRecord, split: str) -> str:
    f = r.flips.get(split) or {}
    return f"+{len(f.get('fixed', []))}/−{len(f.get('broken', []))}" if r.iteration else "-"


def _kinds(r: IterationRecord, split: str) -> str:
    k = {n: c for n, c in (r.failure_kinds.get(split) or {}).items() if c}
    return ", ".join(f"{n} {c}" for n, c in k.items()) or "-"


def _decision(r: IterationRecord) -> str:
    return r.decision or ("accepted" if r.accepted else "rejected")


_STAGE_RUNS = (
    ("tune", "tune"),
    ("validation", "validation"),
    ("candidate_validation", "candidate validation"),
)


def stage_reports(record: IterationRecord) -> list[StageReport]:
    """The iteration's measured stage-metric rows: tuning, validation, the candidate on validation."""
    out: list[StageReport] = []
    for key, label in _STAGE_RUNS:
        rows = record.stages.get(key)
        if rows:
            out.append(StageReport(f"{record.iteration} {label}", tuple(StageMetric(**r) for r in rows)))
    return out


def _stage_lines(history: Sequence[IterationRecord]) -> list[str]:
    reports = [r for rec in history for r in stage_reports(rec)]
    if not reports:
        return []
    return ["", *stage_markdown(reports, title="Stage metrics per iteration")]


def _gate_lines(history: Sequence[IterationRecord]) -> list[str]:
    lines = [
        "",
        "## Feedback KIs and the gate",
        "",
        "| iteration | written | gate: kept | rejected (reason: broken questions) | re-run | KI credit |",
        "|---|---|---|---|---|---|",
    ]
    for r in history:
        g = r.gate
        written = r.improve.get("feedback_written")
        rejected = "; ".join(
            f"{x['ki_id']} ({x['reason']}: {', '.join(x['query_ids'])})" for x in g.get("rejected", [])
        )
        credit = (
            f"{r.credit.get('harmful', 0)} harmful, {r.credit.get('demoted', 0)} demoted, "
            f"{r.credit.get('retired', 0)} retired of {r.credit.get('kis', 0)}"
            if r.credit
            else "-"
        )
        lines.append(
            f"| {r.iteration} | {'-' if written is None else int(written)} "
            f"| {len(g.get('kept', [])) if g else '-'} | {rejected or ('-' if not g else 'none')} "
            f"| {len(g.get('rerun', [])) if g else '-'} | {credit} |"
        )
    return lines


def write_proposal(state_dir: Path, record: IterationRecord, current: Setting, proposal: Proposal) -> Path:
    """Write ``<state>/proposals/iteration-<i>.md`` and ``.json``: the proposal's diffs, the decision on it.

    The Markdown has the decision with its reason, the paired numbers, each optimised program's
    GEPA summary (proposals, metric calls, baseline → best on its stage metric, stop reason, every
    candidate scored) and a unified diff of every changed instruction; the JSON holds the same
    (both settings' prompts and knobs, the decision, the paired comparison, the improve metrics
    and notes). Written after every iteration, so a run's proposals can be committed as it goes.

    Returns:
        The Markdown path.
    """
    folder = state_dir / "proposals"
    folder.mkdir(parents=True, exist_ok=True)
    changed = proposal.setting.changed_programs(current)
    diffs = {
        p: "".join(
            difflib.unified_diff(
                (current.prompts.get(p, "") + "\n").splitlines(keepends=True),
                (proposal.setting.prompts.get(p, "") + "\n").splitlines(keepends=True),
                fromfile=f"{p} (current {current.key})",
                tofile=f"{p} (proposed {proposal.setting.key})",
            )
        )
        for p in changed
    }
    notes = {k: v for k, v in proposal.notes.items()}
    data = {
        "iteration": record.iteration,
        "decision": _decision(record),
        "reason": record.reason,
        "current": current.to_dict(),
        "proposal": proposal.setting.to_dict(),
        "changed": changed,
        "knobs_changed": dict(proposal.setting.knobs) != dict(current.knobs),
        "diffs": diffs,
        "paired": dict(record.paired),
        "val_after_score": record.val_after_score,
        "candidate_val_score": record.candidate_val_score,
        "val_after_accuracy": record.val_after_accuracy,
        "candidate_val_accuracy": record.candidate_val_accuracy,
        "improve_metrics": dict(proposal.metrics),
        "improve_notes": notes,
    }
    (folder / f"iteration-{record.iteration}.json").write_text(
        json.dumps(data, indent=1, ensure_ascii=False, default=str), encoding="utf-8"
    )
    pr = record.paired
    lines = [
        f"# Iteration {record.iteration}: {_decision(record)}",
        "",
        f"{record.reason or '-'}",
        "",
        f"Current setting {current.key} → proposal {proposal.setting.key}; "
        f"changed: {', '.join(changed) or 'none'}"
        + (f"; knobs {dict(proposal.setting.knobs)}" if data["knobs_changed"] else ""),
        "",
        "| on validation | current (re-measured after improve) | proposal |",
        "|---|---|---|",
        f"| accuracy | {_pct(record.val_after_accuracy)} | {_pct(record.candidate_val_accuracy)} |",
        f"| loop score | {_num(record.val_after_score)} | {record.candidate_val_score:+.3f} |",
        "",
        f"Paired over {pr.get('n_pairs', 0)} questions: fixed {', '.join(pr.get('fixed', [])) or 'none'}; "
        "broken "
        f"{', '.join(pr.get('broken', [])) or 'none'}; accuracy difference {_num(pr.get('accuracy_diff'))} "
        f"(95% bootstrap {_num(pr.get('ci_low'))} to {_num(pr.get('ci_high'))}), McNemar p "
        f"{_num(pr.get('mcnemar_p'), '.3f')}.",
    ]
    reports = stage_reports(record)
    if reports:
        lines += ["", *stage_markdown(reports, title=None)]
    m = proposal.metrics
    for program in sorted({k.split("_", 1)[0] for k in m if k.endswith(("_metric_calls", "_failed"))}):
        lines += [
            "",
            f"## {program}",
            "",
            f"GEPA: {int(m.get(f'{program}_proposals', 0))} proposal(s), "
            f"{int(m.get(f'{program}_metric_calls', 0))} metric calls, stage metric "
            f"{_num(m.get(f'{program}_baseline_score'), '.3f')} (current) → "
            f"{_num(m.get(f'{program}_best_score'), '.3f')} (best); "
            f"{int(m.get(f'{program}_examples', 0))} examples "
            f"({int(m.get(f'{program}_imperfect', 0))} below 1 now). "
            + (f"Stop: {notes.get(f'{program}_stop_reason')}." if notes.get(f"{program}_stop_reason") else "")
            + (f" Error: {notes.get(f'{program}_error')}" if notes.get(f"{program}_error") else ""),
        ]
        cands = notes.get(f"{program}_candidates") or []
        if cands:
            lines += ["", "| candidate | score | metric calls | instruction (start) |", "|---|---|---|---|"]
            for i, c in enumerate(cands):
                text = " ".join(str(c.get("instruction", "")).split())[:100].replace("|", "\\|")
                lines.append(
                    f"| {i} | {float(c.get('score', 0.0)):.3f} | {c.get('metric_calls', 0)} | {text} |"
                )
    for program, diff in diffs.items():
        lines += ["", f"## Diff: {program}", "", "```diff", diff.rstrip("\n"), "```"]
    g = record.gate
    if g:
        lines += [
            "",
            "## Feedback KIs through the gate",
            "",
            f"{len(g.get('candidates', []))} written, {len(g.get('kept', []))} kept; re-run "
            f"{', '.join(g.get('rerun', [])) or 'none'}; broken {', '.join(g.get('broken', [])) or 'none'}; "
            f"fixed {', '.join(g.get('fixed', [])) or 'none'}.",
        ]
        for x in g.get("rejected", []):
            lines.append(f"- rejected {x['ki_id']} ({x['reason']}: {', '.join(x['query_ids'])})")
    md = folder / f"iteration-{record.iteration}.md"
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return md


def _num(x: Any, fmt: str = "+.3f") -> str:
    return "-" if x is None else format(float(x), fmt)


def _error_bars(
    ys: Sequence[float], cis: Sequence[tuple[float, float] | None]
) -> tuple[list[float], list[float]]:
    """Matplotlib ``yerr`` (distances below and above each point) from the stored intervals.

    An interval read back from ``loop_state.json`` (or computed by an older kitune) may sit a
    float's breadth on the wrong side of its point (``5.55e-17`` above an accuracy of 0.0,
    ``0.9999999999999999`` below 1.0); matplotlib refuses a negative ``yerr``. Each distance is
    clamped at 0.0, so an interval never crosses its point. A missing interval draws no bar.
    """
    lo: list[float] = []
    hi: list[float] = []
    for y, ci in zip(ys, cis, strict=True):
        low, high = ci if ci is not None else (y, y)
        lo.append(max(0.0, y - low))
        hi.append(max(0.0, high - y))
    return lo, hi


def write_curves(history: Sequence[IterationRecord], out_dir: Path) -> tuple[Path, Path | None]:
    """Write ``curves.md`` (tables) and ``curves.png`` (tuning vs validation per iteration).

    The Markdown has one row per iteration: accuracy with its 95% Wilson interval and the loop
    score for both splits, flips against the previous iteration, failure kinds, the proposal's
    paired comparison and the decision with its reason.

    Returns:
        ``(markdown path, png path or None when there is nothing to plot)``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        "# kitune optimisation curves",
        "",
        "Accuracy is judge-correct / graded questions with its 95% Wilson interval; scores are loop",
        "scores relative to iteration 0's measurement of the same split (0.0 = no change; see",
        "kitune.optimizers.objective). Flips are against the previous iteration (+fixed/−broken).",
        "",
        "| iteration | tune accuracy | tune score | tune flips | validation accuracy | validation score "
        "| validation flips | changed | decision |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in history:
        lines.append(
            f"| {r.iteration} | {_pct(r.tune_accuracy)}{_ci(r.tune_ci)} of {r.n_tune} | {r.tune_score:+.3f} "
            f"| {_flips(r, 'tune')} | {_pct(r.val_accuracy)}{_ci(r.val_ci)} of {r.n_val} "
            f"| {r.val_score:+.3f} "
            f"| {_flips(r, 'validation')} | {', '.join(r.changed) or '-'} | {_decision(r)} |"
        )
    lines += [
        "",
        "## Failure kinds at the start of each iteration",
        "",
        "| iteration | tune | validation | failed (tune/validation) |",
        "|---|---|---|---|",
    ]
    for r in history:
        lines.append(
            f"| {r.iteration} | {_kinds(r, 'tune')} | {_kinds(r, 'validation')} "
            f"| {r.failed.get('tune', 0)}/{r.failed.get('validation', 0)} |"
        )
    lines += _stage_lines(history)
    lines += _gate_lines(history)
    lines += ["", "## Decisions", ""]
    for r in history:
        after = (
            ""
            if r.val_after_score is None
            else f"; current re-measured after improve {r.val_after_score:+.3f}"
        )
        wall = (
            "; wall " + ", ".join(f"{k.removesuffix('_s')} {v / 60:.1f} min" for k, v in r.timings.items())
            if r.timings
            else ""
        )
        lines.append(
            f"- iteration {r.iteration}: {_decision(r)} — "
            f"{r.reason or '-'} (candidate validation score {r.candidate_val_score:+.3f}{after}"
            + (f"; {r.tokens_used:,} LLM tokens" if r.tokens_used is not None else "")
            + wall
            + ")"
        )
    md = out_dir / "curves.md"
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if not history:
        return md, None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax, ax2 = fig.subplots(1, 2)
    xs = [r.iteration for r in history]
    for split, acc, ci, mark in (
        ("tuning", "tune_accuracy", "tune_ci", "o-"),
        ("validation", "val_accuracy", "val_ci", "s-"),
    ):
        ys = [getattr(r, acc) or 0.0 for r in history]
        lo, hi = _error_bars(ys, [getattr(r, ci) for r in history])
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt=mark, capsize=3, label=split)
    ax.set_xlabel("iteration")
    ax.set_ylabel("accuracy, graded questions (95% CI)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xticks(xs)
    ax.set_title("Accuracy of the current setting")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax2.plot(xs, [r.tune_score for r in history], "o-", label="tuning (current)")
    ax2.plot(xs, [r.val_score for r in history], "s-", label="validation (current)")
    ax2.plot(xs, [r.candidate_val_score for r in history], "x--", label="validation (candidate)")
    ax2.set_xlabel("iteration")
    ax2.set_ylabel("loop score vs iteration 0")
    ax2.set_xticks(xs)
    ax2.set_title("Loop score")
    ax2.grid(alpha=0.3)
    ax2.legend(loc="best")
    fig.tight_layout()
    png = out_dir / "curves.png"
    fig.savefig(png)
    return md, png
