"""Evidence modes compared: the model quotes its evidence vs. cites numbered sentences.

Runs :class:`kitune.programs.fact_extractor.FactExtractor` over the first ``--docs`` documents of
the fixture corpus twice, once per evidence mode (``quote``: the model copies a verbatim quote,
kitune checks and repairs it; ``sentences``: the model sees ``[n] sentence`` lines and cites
numbers, kitune copies the sentences), with whatever LM the config gives the ``extract`` role
(:func:`kitune.lm.build_lm`: the embedded local model when none is configured). Per mode it
reports KIs kept per document, guardrail drops by reason, parse counters, output tokens per
document (from the token ledger; estimated when the server reports none) and wall time. The
response cache is turned off so the two modes are timed on fresh calls.

Usage::

    python benchmarks/evidence_modes.py                      # 10 fixture documents, default config
    python benchmarks/evidence_modes.py --docs 40 --config kitune.yaml

Writes ``benchmarks/results/evidence_modes.{json,md}`` (``--name`` changes the stem).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dspy
from _common import machine_info, markdown_table, write_results

FIXTURE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "fixture"
MODES: tuple[str, ...] = ("quote", "sentences")


def run_mode(
    docs: Sequence[Any], lm: Any, mode: str, *, cfg: Any, ledger: Any | None = None
) -> dict[str, Any]:
    """Extract ``docs`` with ``lm`` in evidence ``mode`` and measure it.

    Args:
        docs: :class:`kitune.schema.Document` objects.
        lm: the ``dspy.LM`` to call (a KituneLM in real runs, a scripted LM in tests).
        mode: ``"quote"`` or ``"sentences"``.
        cfg: the kitune config (extraction limits, corpus name).
        ledger: the :class:`kitune.usage.TokenLedger` the LM records into (None: tokens are 0).

    Returns:
        ``{"mode", "docs", "kis_total", "kis_per_doc" (list), "kis_per_doc_mean", "status" (Counter as
        dict), "drops" (reason → n), "counters", "output_tokens", "output_tokens_per_doc",
        "input_tokens", "lm_calls", "wall_s"}``.
    """
    from kitune.programs.fact_extractor import FactExtractor

    extractor = FactExtractor.from_config(cfg)
    extractor = FactExtractor(
        extractor.extract.signature.instructions,
        max_facts=extractor.max_facts,
        chunk_chars=extractor.chunk_chars,
        corpus=extractor.corpus,
        evidence_mode=mode,
    )
    marker = ledger.snapshot() if ledger is not None else 0
    kis: list[int] = []
    status: Counter[str] = Counter()
    drops: Counter[str] = Counter()
    counters: Counter[str] = Counter()
    errors: dict[str, str] = {}
    started = time.monotonic()
    with dspy.context(lm=lm):
        for doc in docs:
            try:
                res = extractor.extract_document(doc)
            except Exception as e:  # one document's LM failure is reported, the run goes on
                status["error"] += 1
                errors[doc.docid] = f"{type(e).__name__}: {e}"[:300]
                kis.append(0)
                continue
            status[res.status] += 1
            kis.append(len(res.kis))
            drops.update(res.drops)
            counters.update(res.counters)
            if res.error:
                errors[doc.docid] = res.error[:300]
    wall = time.monotonic() - started
    records = ledger.since(marker) if ledger is not None else []
    out_tokens = sum(r.output_tokens for r in records)
    in_tokens = sum(r.input_tokens for r in records)
    n = max(len(docs), 1)
    return {
        "mode": mode,
        "docs": len(docs),
        "kis_total": sum(kis),
        "kis_per_doc": kis,
        "kis_per_doc_mean": sum(kis) / n,
        "kis_per_doc_median": statistics.median(kis) if kis else 0.0,
        "status": dict(status),
        "drops": dict(sorted(drops.items())),
        "counters": dict(sorted(counters.items())),
        "output_tokens": out_tokens,
        "output_tokens_per_doc": out_tokens / n,
        "input_tokens": in_tokens,
        "estimated_calls": sum(1 for r in records if r.estimated),
        "lm_calls": counters.get("lm_calls", 0),
        "wall_s": wall,
        "wall_s_per_doc": wall / n,
        "errors": errors,
    }


def summary(results: dict[str, dict[str, Any]]) -> str:
    """The Markdown table comparing the modes, plus drops by reason."""
    rows = []
    for mode, r in results.items():
        rows.append(
            [
                mode,
                str(r["docs"]),
                f"{r['kis_per_doc_mean']:.2f}",
                str(r["kis_total"]),
                ", ".join(f"{k} {v}" for k, v in sorted(r["status"].items())),
                f"{r['output_tokens_per_doc']:.0f}",
                f"{r['wall_s']:.1f}",
            ]
        )
    table = markdown_table(["mode", "docs", "KIs/doc", "KIs", "status", "output tokens/doc", "wall s"], rows)
    reasons = sorted({k for r in results.values() for k in r["drops"]})
    rows = [[k, *(str(r["drops"].get(k, 0)) for r in results.values())] for k in reasons]
    drops = markdown_table(["drop reason", *results], rows) if reasons else "No facts dropped."
    return f"{table}\n\nDrops by reason:\n\n{drops}\n"


def main(
    argv: Sequence[str] | None = None, *, lm: Any = None, ledger: Any = None
) -> dict[str, dict[str, Any]]:
    """Parse arguments, run both modes, write the result files; returns the per-mode results.

    ``lm`` replaces the configured LM and ``ledger`` the token ledger it records into (tests pass
    a scripted LM; without a ledger its tokens count as 0).
    """
    from kitune.config import load_config
    from kitune.service.pipelines.extraction import load_documents
    from kitune.usage import TokenLedger

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=10, help="fixture documents to extract (first N)")
    p.add_argument("--config", type=Path, default=None, help="kitune config file (default: env/defaults)")
    p.add_argument("--data", type=Path, default=FIXTURE, help="corpus folder or JSONL")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated modes to run")
    p.add_argument("--name", default="evidence_modes", help="result file stem")
    p.add_argument("--out-dir", type=Path, default=None, help="result folder (default benchmarks/results)")
    args = p.parse_args(argv)
    machine = machine_info()
    cfg = load_config(args.config, overrides={"lm.cache": False})
    docs = load_documents(args.data, limit=args.docs)
    ledger = ledger if ledger is not None else TokenLedger()
    if lm is None:
        from kitune.lm import build_lm

        lm = build_lm(cfg, "extract", ledger=ledger)
    model = getattr(getattr(lm, "resolved", None), "model", type(lm).__name__)
    results = {
        mode: run_mode(docs, lm, mode, cfg=cfg, ledger=ledger) for mode in args.modes.split(",") if mode
    }
    write_results(
        args.name,
        machine=machine,
        params={"docs": len(docs), "data": str(args.data), "model": model, "modes": list(results)},
        results=results,
        summary_md=summary(results),
        notes=[
            "quote: the model writes each evidence span; sentences: it cites [n] numbers and kitune "
            "copies the sentences (verbatim by construction).",
            "Output tokens come from the server's usage (estimated from characters when it reports none).",
        ],
        out_dir=args.out_dir,
    )
    return results


if __name__ == "__main__":
    main()
