"""The loop's curves: ``curves.md`` (tables) and ``curves.png`` (tuning vs validation per iteration).

Written by :func:`~kitune.optimizers.loop.run_loop` at the end of every run from the
:class:`~kitune.optimizers.loop_state.IterationRecord` history, so over-fitting to the tuning
questions shows: accuracy with its 95% Wilson interval and the loop score for both splits, flips
against the previous iteration, failure kinds, and each decision with its reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kitune.optimizers.loop_state import IterationRecord

__all__ = ["write_curves"]


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
    lines += ["", "## Decisions", ""]
    for r in history:
        after = (
            ""
            if r.val_after_score is None
            else f"; current re-measured after improve {r.val_after_score:+.3f}"
        )
        lines.append(
            f"- iteration {r.iteration}: {_decision(r)} — "
            f"{r.reason or '-'} (candidate validation score {r.candidate_val_score:+.3f}{after}"
            + (f"; {r.tokens_used:,} LLM tokens" if r.tokens_used is not None else "")
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
        lo = [y - (getattr(r, ci) or (y, y))[0] for r, y in zip(history, ys, strict=True)]
        hi = [(getattr(r, ci) or (y, y))[1] - y for r, y in zip(history, ys, strict=True)]
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
