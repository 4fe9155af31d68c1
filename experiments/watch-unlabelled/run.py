"""The watch loop over the embedded model's own episodes with their labels removed (issue 23).

signals → proposals → one approved change → its measured effect, all through kitune's own paths:

1. ``--episodes``: a ``kitune eval`` run (its ``traces.jsonl``: the embedded model's in-context
   episodes, with the tool output each step showed). Each episode is written to
   ``<out>/inbox/episodes.jsonl`` as an OpenAI-style chat record with no gold answer, no
   verdict and no evidence ids (:func:`kitune.service.workflows.signals.to_chat_record`) — what an
   unlabelled production log holds. The gold answers are kept aside in
   ``<out>/labelled/questions.jsonl``, used only to measure the approved change.
2. :func:`kitune.service.workflows.watch.watch` polls the inbox once (``kitune loop --watch`` with
   ``max_polls=1``, trace source ``unlabelled``): import, signals, proposals in the review queue
   (drafting with the production extractor on the embedded model). No optimisation round runs:
   nothing is labelled. ``review.auto_approve`` is empty: nothing is applied by the loop.
3. The script then plays the reviewer: it takes one pending proposal (``--approve ID``, else the
   first of add_ki, re_extract, retire_ki, rewriter_feedback), measures its effect on the
   labelled questions (:func:`kitune.service.workflows.review.measure_effect`: the in-context agent on the
   current KIs and on a copy with the change, same questions, paired acceptance rule) and
   approves it through :class:`kitune.service.workflows.review.ReviewService` (the store upsert / status /
   prompt registry, logged to MLflow).
4. ``<out>/signals.json``, ``mined.json`` (what the poll mined), ``proposals.json``,
   ``approved.json``, ``results.md``, ``watch.log`` and ``timings.tsv``.

Run from the repository root (see README.md for the full command sequence)::

    .venv/bin/python experiments/watch-unlabelled/run.py \\
        --episodes kitune-work/watch-unlabelled/runs/embedded-episodes \\
        --corpus ../shared/data/fixture -c experiments/watch-unlabelled/config.yaml
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from kitune.config import load_config
from kitune.data.loaders import Question
from kitune.evaluation.signals import signals_markdown
from kitune.service.workflows.review import default_evaluator, measure_effect, open_review
from kitune.service.workflows.signals import load_signal_traces, signal_report, store_facts, to_chat_record
from kitune.service.workflows.watch import LoopOptions, WatchOptions, watch
from kitune.tracking.trackers import create_tracker

PREFERENCE = ("add_ki", "re_extract", "retire_ki", "rewriter_feedback")
HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--episodes", type=Path, required=True, help="a kitune eval run folder (traces.jsonl)")
    ap.add_argument("--corpus", type=Path, required=True, help="the corpus file or dataset folder")
    ap.add_argument("-c", "--config", type=Path, default=HERE / "config.yaml")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--approve", default=None, help="the proposal to approve (default: by kind preference)")
    args = ap.parse_args()

    cfg = load_config(args.config)
    out: Path = args.out
    timings: list[tuple[str, float]] = []
    t0 = time.monotonic()

    # 1. the episodes, unlabelled, into an inbox; the labels aside
    episodes = load_signal_traces([args.episodes]).traces
    if not episodes:
        raise SystemExit(f"no episodes in {args.episodes}")
    inbox = out / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    with (inbox / "episodes.jsonl").open("w", encoding="utf-8") as fh:
        for _, t in episodes:
            fh.write(
                json.dumps(to_chat_record(t, trace_id=f"episode-{t.query_id}"), ensure_ascii=False) + "\n"
            )
    labelled = [
        Question(t.query_id, t.question, t.gold_answer, tuple(t.aliases), tuple(t.evidence_docids))
        for _, t in episodes
        if t.gold_answer
    ]
    (out / "labelled").mkdir(exist_ok=True)
    (out / "labelled" / "questions.jsonl").write_text(
        "".join(json.dumps(q.to_dict(), ensure_ascii=False) + "\n" for q in labelled), encoding="utf-8"
    )
    timings.append(("unlabel episodes", time.monotonic() - t0))

    # 2. one poll of the watch loop
    t1 = time.monotonic()
    lines: list[str] = []
    mined = watch(
        cfg,
        LoopOptions(corpus=args.corpus, name="unlabelled", progress=False),
        WatchOptions(directory=inbox, interval_s=0, max_polls=1),
        log=lambda m: (lines.append(m), print(m, flush=True)),
    )
    timings.append(("watch poll (import, signals, proposals with KI drafting)", time.monotonic() - t1))
    (out / "mined.json").write_text(json.dumps(mined.mined, indent=2), encoding="utf-8")
    (out / "watch.log").write_text("\n".join(lines) + "\n", encoding="utf-8")

    tracker = create_tracker(cfg)
    svc = open_review(cfg, tracker=tracker)
    report = signal_report(
        cfg, [(f"episode-{t.query_id}", t) for _, t in episodes], facts=store_facts(svc.kis())
    )
    (out / "signals.json").write_text(
        json.dumps(report.to_dict(), indent=2, ensure_ascii=False), encoding="utf-8"
    )
    proposals = svc.list()
    (out / "proposals.json").write_text(
        json.dumps([p.to_dict() for p in proposals], indent=2, ensure_ascii=False), encoding="utf-8"
    )

    # 3. the reviewer: one proposal, its effect on the labelled questions, approved
    pending = [p for p in proposals if p.status == "pending"]
    chosen = None
    if args.approve:
        chosen = next((p for p in pending if p.id == args.approve), None)
    else:
        chosen = next((p for k in PREFERENCE for p in pending if p.kind == k), None)
    approved: dict[str, Any] = {}
    if chosen is not None and labelled:
        t2 = time.monotonic()
        questions = labelled[-cfg.review.effect_questions :]
        effect = measure_effect(
            cfg, chosen, questions, store=svc.kis(), evaluate=default_evaluator(cfg, args.corpus)
        )
        svc.record_effect(chosen.id, effect, actor="experiment")
        timings.append(("effect: 2 agent runs on the labelled questions", time.monotonic() - t2))
        done = svc.approve(
            chosen.id, actor="experiment", reason="approved by experiments/watch-unlabelled/run.py"
        )
        approved = done.to_dict()
    (out / "approved.json").write_text(json.dumps(approved, indent=2, ensure_ascii=False), encoding="utf-8")
    svc.close()
    timings.append(("total", time.monotonic() - t0))
    (out / "timings.tsv").write_text("".join(f"{k}\t{v:.1f}\n" for k, v in timings), encoding="utf-8")

    # 4. the summary
    md = [
        "# watch-unlabelled: results",
        "",
        f"Episodes: {len(episodes)} from `{args.episodes}` (labels removed); labelled questions kept "
        f"aside: {len(labelled)}.",
        "",
        *signals_markdown(report, title="Signals of the unlabelled episodes"),
        "",
        "## Proposals filed by the watch poll",
        "",
        "| id | kind | status | title |",
        "|---|---|---|---|",
        *(f"| {p.id} | {p.kind} | {p.status} | {p.title} |" for p in svc.list()),
    ]
    if approved:
        c = (approved.get("effect") or {}).get("comparison", {})
        d = (approved.get("effect") or {}).get("decision", {})
        md += [
            "",
            f"## Approved: {approved['id']} ({approved['kind']})",
            "",
            approved["title"],
            "",
            "```diff",
            approved["diff"],
            "```",
            "",
            f"Effect on {approved['effect']['questions']} labelled questions (paired): accuracy "
            f"{c.get('current_accuracy', 0):.2f} → {c.get('candidate_accuracy', 0):.2f}, "
            f"fixed {c.get('fixed')}, "
            f"broken {c.get('broken')}, tokens ×{c.get('token_ratio', 1):.2f}; gate decision "
            f"{d.get('outcome')} ({d.get('reason')}).",
        ]
    else:
        md += ["", "No proposal was approved (none pending, or no labelled questions)."]
    md += [
        "",
        "## Wall time",
        "",
        "| step | seconds |",
        "|---|---|",
        *(f"| {k} | {v:.1f} |" for k, v in timings),
    ]
    (out / "results.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))


if __name__ == "__main__":
    main()
