"""Write the experiment's report from its run folders (no LLM): four arms by category, tokens, cache, loop.

Reads ``<workdir>/runs/<arm run>/traces.jsonl`` for the arms, ``<workdir>/optimize/<loop>/`` for
the loop curves, the data folder for the tune/validation split (``optimize.seed`` and
``validation_fraction`` of the config) and writes into ``--out``:

* ``report/`` — :func:`kitune.evaluation.report.write_report` over the arms on all sampled
  questions (``report.md`` / ``.png`` / ``.html`` / ``summary.json``);
* ``results.md`` — the four-arm table by category on the validation questions (the only ones
  the loop's disambiguation KIs were not written from), the three loop-free arms by category on
  the whole sample, input tokens per question against the full-context arm, and the
  full-context prompt-cache effect (first vs later questions);
* ``per_question.csv`` — query id, category, split, and per arm: judged correct, input tokens
  (ids and numbers only: the LoCoMo text stays at its shared path);
* ``curves.md`` / ``curves.png`` — copied from the loop's state folder when present.

Arms that have not run yet are left out and listed as missing. When the in-context arms were not
run as separate ``kitune eval`` runs, they are read from the loop's own evaluations
(``<loop-dir>/evals/<setting>-<store>.jsonl``, in the order the loop first logged them in
``evals/observations.jsonl``): the first is in-context over the bootstrap extractor's KIs before
any feedback (iteration 0), the last is the same questions after the loop's disambiguation KIs
(and any accepted prompt) — the in-context + disambiguation arm.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
from pathlib import Path

from kitune.config import load_config
from kitune.data.examples import split_questions
from kitune.data.loaders import load_questions
from kitune.evaluation.categories import category_markdown
from kitune.evaluation.full_context import cache_effect
from kitune.evaluation.metrics import Trace
from kitune.evaluation.report import load_run, summarize, write_report

ARMS = {
    "full-context": "full-context",
    "baseline": "baseline",
    "in-context": "in-context",
    "in-context + disambiguation": "in-context-disamb",
}


def _cache_lines(traces: list[Trace]) -> list[str]:
    eff = cache_effect(traces)
    lines = ["", "## Full-context prompt cache (first vs later questions, concurrency 1)", ""]
    if eff is None:
        return [*lines, "No timed answer calls."]
    later = (
        f"later {eff.later_n} questions: median {eff.later_median_latency_s} s, mean "
        f"{eff.later_mean_latency_s} s, {eff.later_mean_input_tokens:.0f} input tokens each "
        f"(speed-up {eff.speedup}x)"
        if eff.later_n
        else "no later questions yet"
    )
    return [
        *lines,
        f"First question {eff.first_query_id}: {eff.first_latency_s:.1f} s for "
        f"{eff.first_input_tokens} input tokens; {later}. Usage counts every input token "
        "either way: the cache saves time, not tokens.",
    ]


def loop_evaluations(loop_dir: Path) -> list[Path]:
    """The loop's evaluation files in the order it first logged an observation for each."""
    evals = loop_dir / "evals"
    order: list[str] = []
    obs = evals / "observations.jsonl"
    if obs.is_file():
        for line in obs.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                key = f"{rec['setting']}-{rec['store']}"
                if key not in order:
                    order.append(key)
    return [evals / f"{k}.jsonl" for k in order if (evals / f"{k}.jsonl").is_file()]


def feedback_kis_written(loop_dir: Path) -> int:
    """How many disambiguation KIs the loop wrote (its ``failure_ledger.json``); 0 when none."""
    ledger = loop_dir / "failure_ledger.json"
    if not ledger.is_file():
        return 0
    questions = json.loads(ledger.read_text(encoding="utf-8")).get("questions", {})
    return sum(len(f.get("ki_ids") or []) for q in questions.values() for f in q.get("feedback", []))


def loop_arms(files: list[Path]) -> tuple[list[Trace], list[Trace]]:
    """``(in-context, in-context + disambiguation)`` from the loop's evaluation files.

    In-context: each question's first measurement (iteration 0, before any feedback KI). The
    second arm: each question's last measurement, only for questions measured again after the
    store changed (a later file holds them: re-run or reused); empty when none was.
    """
    seen: dict[str, list[Trace]] = {}
    for f in files:
        for t in load_run(f)[1]:
            seen.setdefault(t.query_id, []).append(t)
    first = [ts[0] for ts in seen.values()]
    last = [ts[-1] for ts in seen.values() if len(ts) > 1]
    return first, last


def _paired_lines(runs: dict[str, list[Trace]]) -> list[str]:
    """Every arm on the questions all of them answered (a paired comparison), with token F1."""
    common = set.intersection(*({t.query_id for t in v} for v in runs.values())) if runs else set()
    lines = [
        "",
        f"## Paired: the {len(common)} questions every arm answered",
        "",
        "| arm | judge-correct (95% CI) | mean token F1 | input tokens / question | timeouts |",
        "|---|---|---|---|---|",
    ]
    for label, traces in runs.items():
        mine = [t for t in traces if t.query_id in common]
        if not mine:
            continue
        s = summarize(mine, label)
        ci = f"({100 * s.ci_low:.0f}–{100 * s.ci_high:.0f})"
        acc = "–" if s.accuracy is None else f"{s.n_correct}/{s.n_graded} = {100 * s.accuracy:.0f}% {ci}"
        tok = (s.input_tokens + s.tool_input_tokens) / max(1, s.n_total)
        lines.append(f"| {label} | {acc} | {s.f1:.2f} | {tok:.0f} | {s.timeouts} |")
    return [
        *lines,
        "",
        "Token F1 is LoCoMo's own answer metric; the match grader needs the whole gold phrase.",
    ]


def _token_lines(runs: dict[str, list[Trace]]) -> list[str]:
    ref = summarize(runs["full-context"]) if "full-context" in runs else None
    ref_tok = (
        None if ref is None or not ref.n_total else (ref.input_tokens + ref.tool_input_tokens) / ref.n_total
    )
    lines = [
        "",
        "## Input tokens per question against the full-context arm",
        "",
        "| arm | questions | judge-correct (95% CI) | input tokens / question | vs full-context |",
        "|---|---|---|---|---|",
    ]
    for label, traces in runs.items():
        s = summarize(traces, label)
        tok = (s.input_tokens + s.tool_input_tokens) / max(1, s.n_total)
        ratio = "–" if not ref_tok else f"{tok / ref_tok:.2f}x"
        acc = (
            "–"
            if s.accuracy is None
            else f"{100 * s.accuracy:.1f}% ({100 * s.ci_low:.0f}–{100 * s.ci_high:.0f})"
        )
        lines.append(f"| {label} | {s.n_total} | {acc} | {tok:.0f} | {ratio} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--runs", type=Path, required=True, help="<workdir>/runs")
    p.add_argument("--prefix", default="conv26-", help="Run-name prefix of the arms.")
    p.add_argument("--loop-dir", type=Path, help="<workdir>/optimize/<loop run name>")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    cfg = load_config(a.config)
    questions = load_questions(a.data)
    _, validation = split_questions(
        questions, validation_fraction=cfg.optimize.validation_fraction, seed=cfg.optimize.seed
    )
    val_ids = {q.query_id for q in validation}
    runs: dict[str, list[Trace]] = {}
    missing = []
    for label, suffix in ARMS.items():
        d = a.runs / f"{a.prefix}{suffix}"
        if (d / "traces.jsonl").is_file():
            runs[label] = load_run(d)[1]
        else:
            missing.append(f"{label} ({d})")
    first, last = loop_arms(loop_evaluations(a.loop_dir) if a.loop_dir is not None else [])
    if first and "in-context" not in runs:
        runs["in-context"] = first
        missing = [m for m in missing if not m.startswith("in-context (")]
    written = feedback_kis_written(a.loop_dir) if a.loop_dir is not None else 0
    if last and not written:  # re-measured only because the store changed (e.g. re-extraction)
        missing = [m for m in missing if not m.startswith("in-context + disambiguation")]
        missing.append("in-context + disambiguation (the loop wrote no disambiguation KI)")
        last = []
    if last and "in-context + disambiguation" not in runs:
        runs["in-context + disambiguation"] = last
        missing = [m for m in missing if not m.startswith("in-context + disambiguation")]
    a.out.mkdir(parents=True, exist_ok=True)
    lines = ["# LoCoMo conversation 26: results", ""]
    if missing:
        lines += ["Missing (not run yet): " + "; ".join(missing), ""]
    if not runs:
        (a.out / "results.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return 1
    loop_free = {k: v for k, v in runs.items() if k != "in-context + disambiguation"}
    write_report(loop_free or runs, a.out / "report")
    val_runs = {k: [t for t in v if t.query_id in val_ids] for k, v in runs.items()}
    lines += category_markdown(val_runs, title=f"All arms on the {len(val_ids)} validation questions")
    lines += [
        "",
        *category_markdown(loop_free, title=f"Loop-free arms on all {len(questions)} sampled questions"),
    ]
    lines += _paired_lines(runs)
    lines += _token_lines(runs)
    if "full-context" in runs:
        lines += _cache_lines(runs["full-context"])
    (a.out / "results.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with (a.out / "per_question.csv").open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(
            [
                "query_id",
                "category",
                "split",
                *(f"{k}: {c}" for k in runs for c in ("correct", "input_tokens")),
            ]
        )
        by = {k: {t.query_id: t for t in v} for k, v in runs.items()}
        for q in questions:
            row: list[object] = [q.query_id, q.category, "validation" if q.query_id in val_ids else "tune"]
            for k in runs:
                t = by[k].get(q.query_id)
                row += ["", ""] if t is None else [t.judge_correct, t.input_tokens + t.tool_input_tokens]
            w.writerow(row)
    if a.loop_dir is not None:
        for name in ("curves.md", "curves.png"):
            if (a.loop_dir / name).is_file():
                shutil.copy(a.loop_dir / name, a.out / name)
    print((a.out / "results.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
