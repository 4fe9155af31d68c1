"""Run summaries and side-by-side reports (Markdown + PNG plot + HTML + JSON).

Every number in a report is computed by :func:`summarize` from the traces, so the report
equals the traces (tested). Accuracy is correct over *graded* questions: grader errors
and failed runs are excluded from the denominator and reported as counts (case J3).

Beside the table, a report compares runs question by question
(:mod:`kitune.evaluation.comparison`): for each pair — by default each run against the one
before it, so ``baseline, in-context, iteration-1, …`` gives baseline → in-context and
iteration → iteration — the flips (fixed / broken question ids, with the failure kind each
had before / has after) and the questions that got more expensive in input tokens, with the
reasons read off their traces. Each run's column counts its failures by kind
(:mod:`kitune.evaluation.failures`: wrong entity, wrong number, no candidate, out of budget,
grader error, failed).

Beside the end-to-end table, optional stage-metric rows (:func:`stage_markdown`: each program
on its own signal, :mod:`kitune.evaluation.stage_metrics`) and extra sections (the KI credit
table) are shown when the caller passes them. A last section counts each run's failure signals
(:mod:`kitune.evaluation.signals`: empty retrieval, fall-back to raw search, loops, budget,
unsupported answer, query error — read off the traces, no gold answer needed), also written to
``signals.json``. A token-cost section (:mod:`kitune.evaluation.token_cost`) gives each run's
input tokens per question and per correct answer with bootstrap intervals, its ratio to the
reference run (``baseline`` when present), and the tokens by component; also written to
``token_costs.json``.
"""

from __future__ import annotations

import html
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kitune.errors import DataError
from kitune.evaluation.categories import category_markdown
from kitune.evaluation.comparison import RunComparison, compare_runs
from kitune.evaluation.failures import FAILURE_KINDS
from kitune.evaluation.harness import read_traces
from kitune.evaluation.metrics import Trace
from kitune.evaluation.signals import SIGNAL_KINDS, SignalReport, aggregate_signals, compute_signals
from kitune.evaluation.stage_metrics import StageReport
from kitune.evaluation.summary import GRADER_ERROR_THRESHOLD, RunSummary, summarize, wilson_interval
from kitune.evaluation.token_cost import TokenCost, token_cost_markdown, token_costs

__all__ = [
    "GRADER_ERROR_THRESHOLD",
    "ROWS",
    "ReportFiles",
    "RunSummary",
    "accuracy_label",
    "format_cell",
    "load_run",
    "run_grader",
    "stage_markdown",
    "summarize",
    "wilson_interval",
    "write_report",
]


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


ROWS: list[tuple[str, str]] = [
    ("correct", "judge"),
    ("95% CI", "ci"),
    ("graded / grader errors / failed", "counts"),
    *((f"failure kind: {kind.replace('_', ' ')}", f"failure:{kind}") for kind in FAILURE_KINDS),
    ("EM", "em"),
    ("F1", "f1"),
    ("input tokens", "input_tokens"),
    ("input tokens / question", "input_tokens_per_question"),
    ("output tokens", "output_tokens"),
    ("tool (rewrite) input tokens", "tool_input_tokens"),
    ("timeouts", "timeouts"),
    ("force-commits (rescued)", "fc"),
    ("context overflows", "context_overflows"),
    ("evidence recall", "evidence_recall"),
    ("search calls", "search_calls"),
    ("tool calls", "tool_calls"),
    ("blocked repeats", "repeated_call_blocked"),
    ("wall time (s)", "wall_time_s"),
]


def format_cell(s: RunSummary, key: str) -> str:
    """Format one report cell: ``key`` is the second item of a :data:`ROWS` entry."""
    if key == "judge":
        acc = "–" if s.accuracy is None else f"{s.n_correct}/{s.n_graded} ({_pct(s.accuracy)})"
        return acc + (" ⚠ incomplete" if s.incomplete else "")
    if key == "ci":
        return "–" if s.accuracy is None else f"{_pct(s.ci_low)}–{_pct(s.ci_high)}"
    if key == "counts":
        return f"{s.n_graded}/{s.n_total} / {s.n_grader_errors} / {s.n_failed}"
    if key in ("em",):
        return f"{s.em:.3f}"
    if key == "f1":
        return f"{s.f1:.3f}"
    if key == "evidence_recall":
        return "–" if s.evidence_recall is None else f"{s.evidence_recall:.3f}"
    if key == "fc":
        return f"{s.force_committed} ({s.force_commit_rescues})"
    if key == "input_tokens_per_question":
        return f"{s.input_tokens_per_question:.1f}"
    if key == "wall_time_s":
        return f"{s.wall_time_s:.1f}"
    if key.startswith("failure:"):
        return str(s.failure_kinds.get(key.removeprefix("failure:"), 0))
    return str(getattr(s, key))


def _table(summaries: Sequence[RunSummary]) -> list[list[str]]:
    return [[label, *(format_cell(s, key) for s in summaries)] for label, key in ROWS]


@dataclass(frozen=True)
class ReportFiles:
    """Paths written by :func:`write_report`."""

    markdown: Path
    plot: Path | None
    html: Path
    summary_json: Path
    summaries: list[RunSummary]
    comparisons_json: Path | None = None
    """``comparisons.json``: flips and per-question token deltas of each compared pair."""
    comparisons: list[RunComparison] | None = None
    signals_json: Path | None = None
    """``signals.json``: each run's failure signals (:mod:`kitune.evaluation.signals`)."""
    signals: dict[str, SignalReport] | None = None
    token_costs_json: Path | None = None
    """``token_costs.json``: each run's input tokens per question / per correct answer with
    intervals, against the reference run, and by component (:mod:`kitune.evaluation.token_cost`)."""
    token_costs: list[TokenCost] | None = None


def _plot(summaries: Sequence[RunSummary], path: Path) -> Path | None:
    points = [s for s in summaries if s.accuracy is not None]
    if not points:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # The object API with an Agg canvas: no pyplot, no global backend switch, thread-safe.
    fig = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = [(s.input_tokens + s.tool_input_tokens) / max(1, s.n_total) for s in points]
    top = max(xs) if xs else 1.0
    for s, x in zip(points, xs, strict=True):  # a legend names the runs: labels never overlap
        acc = 100 * (s.accuracy or 0.0)
        err = [[acc - 100 * s.ci_low], [100 * s.ci_high - acc]]
        ax.errorbar([x], [acc], yerr=err, fmt="o", capsize=4, label=s.name)
    ax.set_xlabel("input tokens per question (agent + tools)")
    ax.set_ylabel("accuracy (%) of graded questions, 95% CI")
    ax.set_ylim(-5, 105)
    ax.set_xlim(0, top * 1.15 if top > 0 else 1.0)  # every point (and its error bar) inside the axes
    ax.set_title("Accuracy vs input tokens")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


MAX_DELTA_ROWS = 15
"""Questions listed per pair in the "more expensive" section (all are in comparisons.json)."""


def _ids(ids: Sequence[str], limit: int = 40) -> str:
    shown = ", ".join(ids[:limit])
    return (shown + f", … (+{len(ids) - limit})") if len(ids) > limit else (shown or "–")


def _comparison_md(comparisons: Sequence[RunComparison]) -> list[str]:
    if not comparisons:
        return []
    md = ["", "## Flips", ""]
    md += ["| before → after | fixed | broken | net | still correct | still wrong | not compared |"]
    md += ["|---|---|---|---|---|---|---|"]
    for c in comparisons:
        f, n = c.flips, c.flips.counts
        md.append(
            f"| {f.before} → {f.after} | {n['fixed']} | {n['broken']} | {f.net:+d} | "
            f"{n['still_correct']} | {n['still_wrong']} | {n['not_compared']} |"
        )
    md.append("")
    for c in comparisons:
        f = c.flips
        fixed = _ids([f"{q} (was {f.fixed_kinds[q].replace('_', ' ')})" for q in f.fixed])
        broken = _ids([f"{q} (now {f.broken_kinds[q].replace('_', ' ')})" for q in f.broken])
        md.append(f"- {f.before} → {f.after}: fixed {fixed}; broken {broken}")
    md += ["", "## Questions that got more expensive (input tokens, agent + tools)"]
    for c in comparisons:
        more = c.more_expensive
        total = sum(d.delta for d in c.deltas)
        md += [
            "",
            f"### {c.flips.before} → {c.flips.after}: {len(more)} of {len(c.deltas)} questions cost more "
            f"(net {total:+,} tokens)",
        ]
        if not more:
            continue
        md += ["", "| question | before | after | Δ | Δ % | why |", "|---|---|---|---|---|---|"]
        for d in more[:MAX_DELTA_ROWS]:
            ratio = "–" if d.ratio is None else f"{100 * (d.ratio - 1):+.0f}%"
            md.append(
                f"| {d.query_id} | {d.before:,} | {d.after:,} | {d.delta:+,} | {ratio} "
                f"| {'; '.join(d.reasons)} |"
            )
        if len(more) > MAX_DELTA_ROWS:
            md.append(f"\n… {len(more) - MAX_DELTA_ROWS} more in comparisons.json")
    return md


def _comparison_html(comparisons: Sequence[RunComparison]) -> str:
    if not comparisons:
        return ""
    esc = html.escape
    rows = "".join(
        f"<tr><td>{esc(c.flips.before)} → {esc(c.flips.after)}</td>"
        + "".join(f"<td>{v}</td>" for v in c.flips.counts.values())
        + f"<td>{esc(_ids(c.flips.fixed))}</td><td>{esc(_ids(c.flips.broken))}</td></tr>"
        for c in comparisons
    )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "before → after",
            "fixed",
            "broken",
            "still correct",
            "still wrong",
            "not compared",
            "fixed ids",
            "broken ids",
        )
    )
    out = f"<h2>Flips</h2><table><tr>{head}</tr>{rows}</table><h2>Questions that got more expensive</h2>"
    for c in comparisons:
        more = c.more_expensive[:MAX_DELTA_ROWS]
        out += f"<h3>{esc(c.flips.before)} → {esc(c.flips.after)}: {len(c.more_expensive)} cost more</h3>"
        if more:
            out += "<table><tr><th>question</th><th>before</th><th>after</th><th>Δ</th><th>why</th></tr>"
            out += "".join(
                f"<tr><td>{esc(d.query_id)}</td><td>{d.before}</td><td>{d.after}</td><td>{d.delta:+}</td>"
                f"<td>{esc('; '.join(d.reasons))}</td></tr>"
                for d in more
            )
            out += "</table>"
    return out


def _run_signals(runs: Mapping[str, Sequence[Trace]]) -> dict[str, SignalReport]:
    """Each run's failure signals (no KI store here: the coverage gap is not computed)."""
    return {
        name: aggregate_signals([compute_signals(t, trace_id=f"{name}:{t.query_id}") for t in traces])
        for name, traces in runs.items()
    }


def _signals_md(signals: Mapping[str, SignalReport]) -> list[str]:
    """The "Failure signals" section: traces per signal, one column per run."""
    names = list(signals)
    md = ["", "## Failure signals (no gold answer needed)", ""]
    md += ["| signal | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for kind in SIGNAL_KINDS:
        if kind == "coverage_gap":
            continue  # needs the KI store: `kitune signals`
        cells = []
        for rep in signals.values():
            n, c = rep.n_traces, rep.by_kind.get(kind, 0)
            cells.append(f"{c}/{n} ({100 * c / n:.0f}%)" if n else "–")
        md.append(f"| {kind.replace('_', ' ')} | " + " | ".join(cells) + " |")
    unassessed = {k: r.unassessed for k, r in signals.items() if r.unassessed}
    if unassessed:
        md += [
            "",
            "Answer support not assessed (no recorded tool output): "
            + ", ".join(f"{k} {v}" for k, v in unassessed.items()),
        ]
    md += ["", "Coverage gaps need the KI store: run `kitune signals <run folder>`."]
    return md


def stage_markdown(reports: Sequence[StageReport], *, title: str | None = "Stage metrics") -> list[str]:
    """The stage-metric table, one row per report (split), one column per metric seen in any of them.

    Columns are ``<program> <label>`` in first-seen order; a metric a row did not measure shows
    ``–``. Cells are :meth:`~kitune.evaluation.stage_metrics.StageMetric.cell` (value with its 95%
    interval and sample size). Returns ``[]`` for no reports.

    Args:
        reports: the rows (e.g. tuning and validation of one run).
        title: a ``## title`` heading and a one-line legend first; None: the table only.
    """
    if not reports:
        return []
    cols: dict[tuple[str, str], str] = {}
    for r in reports:
        for m in r.metrics:
            cols.setdefault((m.stage, m.name), f"{m.stage} {m.label}")
    lines: list[str] = []
    if title:
        lines += [
            f"## {title}",
            "",
            "Each program on its own signal (kitune.evaluation.stage_metrics): shares with their 95% Wilson "
            "interval, means with a normal-approximation interval; the end-to-end score decides acceptance.",
            "",
        ]
    lines += ["| run | " + " | ".join(cols.values()) + " |", "|" + "---|" * (len(cols) + 1)]
    for r in reports:
        cells = []
        for key in cols:
            got = r.get(*key)
            cells.append(got.cell() if got is not None else "–")
        lines.append(f"| {r.split} | " + " | ".join(cells) + " |")
    return lines


def write_report(
    runs: Mapping[str, Sequence[Trace]],
    out_dir: Path | str,
    *,
    pairs: Sequence[tuple[str, str]] | None = None,
    stages: Sequence[StageReport] = (),
    sections: Sequence[str] = (),
    data_sha256: str = "",
    graders: Mapping[str, str | None] | None = None,
) -> ReportFiles:
    """Write ``report.md``/``.png``/``.html``, ``summary.json``, ``comparisons.json`` and ``signals.json``.

    Args:
        runs: run name → traces, in display order (columns).
        out_dir: created if missing.
        pairs: ``(before, after)`` run names to compare question by question; None: each run
            against the one before it (none for a single run).
        stages: stage-metric rows shown beside the end-to-end table (:func:`stage_markdown`).
        sections: extra Markdown appended as given (e.g. the KI credit table).
        data_sha256: the checksum of the dataset every run read
            (:func:`kitune.data.checksum.dataset_checksum`), recorded in each summary; "" when
            not known.
        graders: run name → what graded its answers (``match`` or ``judge``, from the run's
            ``run.json``); names the accuracy row "correct (match)" / "correct (judge)" (see
            :func:`accuracy_label`). None or unknown: "correct".

    Returns:
        The written paths, the summaries, the comparisons and each run's signals; ``plot`` is None
        when no run was judged, ``comparisons_json`` when nothing was compared.

    Raises:
        ValueError: ``runs`` is empty, or a pair names an unknown run.
        DataError: a compared run holds the same question twice.
    """
    if not runs:
        raise ValueError("write_report needs at least one run")
    names = list(runs)
    pairs = list(pairs) if pairs is not None else list(itertools.pairwise(names))
    for a, b in pairs:
        if a not in runs or b not in runs:
            raise ValueError(f"pair ({a!r}, {b!r}) names a run not in {names}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries = [summarize(traces, name, data_sha256=data_sha256) for name, traces in runs.items()]
    comparisons = [compare_runs(a, runs[a], b, runs[b]) for a, b in pairs]
    label = accuracy_label(graders.get(n) for n in names) if graders else "correct"
    rows = _table(summaries)
    rows = [[label, *r[1:]] if r and r[0] == ROWS[0][0] else r for r in rows]  # names the grader
    header = ["metric", *(s.name for s in summaries)]
    md = ["# kitune eval report", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    plot = _plot(summaries, out / "report.png")
    md += ["", f"Accuracy = {label} / graded; grader errors and failed runs are excluded and counted."]
    if plot is not None:
        md += ["", "![accuracy vs input tokens](report.png)"]
    if stages:
        md += ["", *stage_markdown(stages)]
    md += _comparison_md(comparisons)
    costs = token_costs(runs)
    md += ["", *token_cost_markdown(costs)]
    by_category = category_markdown(runs, accuracy=label)
    if by_category:
        md += ["", *by_category]
    signals = _run_signals(runs)
    md += _signals_md(signals)
    for section in sections:
        md += ["", section.rstrip("\n")]
    md_path = out / "report.md"
    md_path.write_text("\n".join(md) + "\n", encoding="utf-8")
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    img = '<p><img src="report.png" alt="accuracy vs input tokens"></p>' if plot else ""
    html_path = out / "report.html"
    html_path.write_text(
        "<!doctype html><meta charset='utf-8'><title>kitune eval report</title>"
        "<style>td,th{border:1px solid #ccc;padding:4px 8px}table{border-collapse:collapse}</style>"
        f"<h1>kitune eval report</h1><table><tr>{head}</tr>{cells}</table>{img}"
        + _comparison_html(comparisons),
        encoding="utf-8",
    )
    json_path = out / "summary.json"
    json_path.write_text(json.dumps([s.to_dict() for s in summaries], indent=2), encoding="utf-8")
    cmp_path: Path | None = None
    if comparisons:
        cmp_path = out / "comparisons.json"
        cmp_path.write_text(json.dumps([c.to_dict() for c in comparisons], indent=2), encoding="utf-8")
    sig_path = out / "signals.json"
    sig_path.write_text(json.dumps({k: v.to_dict() for k, v in signals.items()}, indent=2), encoding="utf-8")
    cost_path = out / "token_costs.json"
    cost_path.write_text(json.dumps([c.to_dict() for c in costs], indent=2), encoding="utf-8")
    return ReportFiles(
        md_path,
        plot,
        html_path,
        json_path,
        summaries,
        cmp_path,
        comparisons,
        sig_path,
        signals,
        cost_path,
        costs,
    )


def accuracy_label(graders: Iterable[str | None]) -> str:
    """The accuracy row's name for runs graded by ``graders`` (one entry per run, in order).

    "correct (match)" when every run was graded by the deterministic ``match`` rule, "correct
    (judge)" when every run was graded by the judge LLM (``grading.grader: llm``, written
    ``llm`` or ``judge``), "correct (match / judge)" when the runs differ, and "correct" when
    any run's grader is not known (e.g. a bare traces file).
    """
    order = ("match", "judge")
    seen = ["judge" if g == "llm" else g for g in graders]
    known = [g for g in seen if g in order]
    if not seen or len(known) < len(seen):
        return "correct"
    kinds = sorted(set(known), key=order.index)
    return f"correct ({' / '.join(kinds)})"


def run_grader(path: Path | str) -> str | None:
    """What graded a run directory's answers, from its ``run.json``.

    Returns:
        ``match``, ``judge`` (the judge LLM: ``kitune eval`` writes ``llm``), or None (no
        ``run.json``, an ungraded run, or an unreadable file).
    """
    meta = Path(path) / "run.json"
    if not meta.is_file():
        return None
    try:
        grader = json.loads(meta.read_text(encoding="utf-8")).get("grader")
    except (json.JSONDecodeError, AttributeError):
        return None
    if grader == "llm":
        return "judge"
    return grader if grader in ("match", "judge") else None


def load_run(path: Path | str) -> tuple[str, list[Trace]]:
    """Read a run: a run directory holding ``traces.jsonl``, or a traces JSONL file.

    Returns:
        ``(name, traces)``; the name is the directory name (or the file stem).

    Raises:
        DataError: no traces file, or it is empty.
    """
    p = Path(path)
    file = p / "traces.jsonl" if p.is_dir() else p
    if not file.is_file():
        raise DataError(f"no traces at {file}: pass a run directory from `kitune eval`", path=str(file))
    traces = read_traces(file)
    if not traces:
        raise DataError(f"{file} holds no traces", path=str(file))
    return (p.name if p.is_dir() else p.stem), traces
