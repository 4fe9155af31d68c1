"""Per-category breakdown of eval runs: accuracy with its Wilson CI and input tokens per question.

Datasets such as LoCoMo label each question with a category (single-hop, multi-hop, temporal,
open-domain); a run's headline accuracy hides that a skill may win on one category and lose on
another. Every number here is :func:`kitune.evaluation.report.summarize` applied to the traces
of one category, so a category row means exactly what the run's column in ``report.md`` means
(accuracy = correct / graded, correct by the run's grader — ``correct (match)`` or ``correct
(judge)`` as the report names it; grader errors and failed runs are excluded and counted).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from kitune.evaluation.metrics import Trace
from kitune.evaluation.summary import RunSummary, summarize

__all__ = [
    "ALL",
    "NO_CATEGORY",
    "by_category",
    "category_json",
    "category_markdown",
]

ALL = "all"
"""Label of the row over every trace."""
NO_CATEGORY = "(none)"
"""Label of traces without a category."""


def _label(trace: Trace, categories: Mapping[str, str] | None) -> str:
    cat = trace.category or (categories or {}).get(trace.query_id, "")
    return cat or NO_CATEGORY


def by_category(
    traces: Sequence[Trace],
    *,
    categories: Mapping[str, str] | None = None,
    include_all: bool = True,
    include_adversarial: bool = False,
) -> dict[str, RunSummary]:
    """Summarise ``traces`` per question category.

    Args:
        traces: one run's traces (one per question).
        categories: query id → category, used for traces that carry none (traces written before
            ``Trace.category`` existed); e.g. ``{q.query_id: q.category for q in questions}``.
        include_all: append a row over all traces, labelled :data:`ALL`.
        include_adversarial: count the adversarial (abstention) questions in the :data:`ALL` row
            too, like a run's headline (:func:`~kitune.evaluation.summary.summarize`); their own
            category row is always there.

    Returns:
        Category → :class:`RunSummary` (``name`` is the category), categories in alphabetical
        order, :data:`NO_CATEGORY` for traces without one, then :data:`ALL`. Empty dict for no
        traces. ``sum(s.n_total for non-ALL rows) == len(traces)``.
    """
    groups: dict[str, list[Trace]] = {}
    for t in traces:
        groups.setdefault(_label(t, categories), []).append(t)
    out = {
        cat: summarize(groups[cat], cat, include_adversarial=True)  # one category: its own row
        for cat in sorted(groups, key=lambda c: (c == NO_CATEGORY, c))
    }
    if include_all and traces:
        out[ALL] = summarize(traces, ALL, include_adversarial=include_adversarial)
    return out


def _acc(s: RunSummary) -> str:
    if s.accuracy is None:
        return "–"
    ci = f"{100 * s.ci_low:.0f}–{100 * s.ci_high:.0f}"
    return f"{s.n_correct}/{s.n_graded} = {100 * s.accuracy:.1f}% ({ci})"


def category_markdown(
    runs: Mapping[str, Sequence[Trace]],
    *,
    categories: Mapping[str, str] | None = None,
    title: str = "By question category",
    accuracy: str = "correct",
) -> list[str]:
    """A Markdown section comparing runs per category: accuracy (95% Wilson CI) and tokens/question.

    One row per category (union over runs, alphabetical, then ``all``) with ``n``, the questions
    in that category (the distinct per-run counts joined by ``/`` when runs differ); per run two columns:
    ``k/n = acc% (low–high)`` and input tokens per question (the agent's, plus tool tokens such
    as query rewrites after a ``+``, when there are any).

    Args:
        runs: run name → traces, in column order.
        categories: query id → category fallback (see :func:`by_category`).
        title: the section heading.
        accuracy: what counts as correct, as the report's accuracy row names it (``correct
            (match)``, ``correct (judge)``; plain ``correct`` when the grader is not known:
            :func:`kitune.evaluation.report.accuracy_label`).

    Returns:
        Lines without trailing newlines; ``[]`` when no trace has a category (nothing to break
        down), so callers can append it unconditionally.
    """
    per_run = {name: by_category(ts, categories=categories) for name, ts in runs.items()}
    cats = sorted(
        {c for rows in per_run.values() for c in rows if c != ALL},
        key=lambda c: (c == NO_CATEGORY, c),
    )
    if not cats or cats == [NO_CATEGORY]:
        return []
    header = ["category", "n"]
    for name in runs:
        header += [f"{name}: {accuracy} (95% CI)", f"{name}: input tokens / question"]
    lines = [f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cat in [*cats, ALL]:
        ns = {rows[cat].n_total for rows in per_run.values() if cat in rows}
        row = [cat, "/".join(str(n) for n in sorted(ns)) or "0"]
        for name in runs:
            s = per_run[name].get(cat)
            if s is None:
                row += ["–", "–"]
                continue
            tok = f"{s.input_tokens_per_question:.0f}"
            if s.tool_input_tokens:
                tok += f" + {s.tool_input_tokens / max(1, s.n_total):.0f}"
            row += [_acc(s), tok]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        f"Accuracy = {accuracy} / graded with its 95% Wilson interval; tokens are the answering "
        "model's input tokens per question (+ tool tokens such as query rewrites).",
    ]
    return lines


def category_json(runs: Mapping[str, Sequence[Trace]], *, categories: Mapping[str, str] | None = None) -> str:
    """The same breakdown as JSON: ``{run: {category: RunSummary.to_dict()}}``, indented."""
    data = {
        name: {cat: s.to_dict() for cat, s in by_category(ts, categories=categories).items()}
        for name, ts in runs.items()
    }
    return json.dumps(data, indent=2)
