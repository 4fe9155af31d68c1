"""Context cost: tokens the agent's context receives per retrieval call, baseline vs KIs.

For each question, the question text is sent once through each skill's retrieval tool, built
exactly as the eval harness builds it (:func:`kitune.evaluation.tools.build_toolbox` with the
configured sizes):

* **baseline** — ``search`` over the corpus store: up to ``retrieval.search_hits`` documents ×
  ``retrieval.snippets_per_hit`` snippets of ``retrieval.snippet_chars`` characters;
* **in-context** — ``get_context`` over the KI store: ``retrieval.default_size`` KIs rendered by
  :func:`kitune.service.serving.context.render_context` (plain plan, no LLM rewrite).

Reported per skill: input tokens per call (median / p95 / mean, :func:`kitune.usage.estimate_tokens`),
the share of calls whose context contains the gold answer (answer-bearing rate, after
:func:`kitune.text.normalize_answer` on both sides), tokens until the first answer-bearing result
in rank order (the prefix an agent must read), answer-bearing rate per 1k tokens, and the ratios
in-context / baseline. A skill without a store is reported as missing, never invented.

Usage::

    python benchmarks/context_cost.py --kis kitune-work/lancedb            # dev split + its KIs
    python benchmarks/context_cost.py --data ../shared/data/fixture --kis PATH
    python benchmarks/context_cost.py                                       # baseline side only
"""

from __future__ import annotations

import argparse
import itertools
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _common import enable_tiktoken, machine_info, markdown_table, summarize, write_results

from kitune.data.loaders import Question, load_dataset
from kitune.text import normalize_answer

DEV_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "dev"
_ITEM_RE = re.compile(r"^\d+\. ", re.MULTILINE)


def contains_answer(text: str, golds: Sequence[str]) -> bool:
    """True when any normalised gold appears as a whole-word run in the normalised ``text``."""
    hay = f" {normalize_answer(text)} "
    return any(g and f" {g} " in hay for g in (normalize_answer(x) for x in golds))


def split_items(text: str) -> list[str]:
    """Split a rendered result list (``1. …`` / ``2. …``) into its items, in rank order.

    Text before the first item and a trailing ``facets:`` line stay with the neighbouring item,
    so the items concatenate back to ``text`` minus nothing but the joins.
    """
    starts = [m.start() for m in _ITEM_RE.finditer(text)]
    if not starts:
        return [text] if text else []
    starts[0] = 0
    bounds = [*starts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def tokens_to_answer(items: Sequence[str], golds: Sequence[str], count: Callable[[str], int]) -> int | None:
    """Tokens of the shortest prefix of ``items`` whose last item holds the answer (None: never)."""
    total = 0
    for item in items:
        total += count(item)
        if contains_answer(item, golds):
            return total
    return None


def measure(
    skill_call: Callable[[str], Any], questions: Sequence[Question], count: Callable[[str], int]
) -> dict[str, Any]:
    per_call: list[int] = []
    to_answer: list[int] = []
    bearing = 0
    docs_hit = 0
    for q in questions:
        obs = skill_call(q.query)
        per_call.append(count(obs.text))
        if contains_answer(obs.text, q.golds):
            bearing += 1
        t = tokens_to_answer(split_items(obs.text), q.golds, count)
        if t is not None:
            to_answer.append(t)
        docs_hit += int(bool(set(obs.doc_ids) & set(q.evidence_docids)))
    n = len(questions)
    tok = summarize(per_call)
    rate = bearing / n
    return {
        "tokens_per_call": tok.to_dict(1),
        "answer_bearing_rate": round(rate, 4),
        "evidence_doc_shown_rate": round(docs_hit / n, 4),
        "tokens_to_first_answer": summarize(to_answer).to_dict(1) if to_answer else None,
        "answer_bearing_per_1k_tokens": round(rate / (tok.mean / 1000), 4) if tok.mean else 0.0,
    }


def open_kis(path: Path, embedder: Any) -> Any:
    from kitune.ki import KI

    if path.is_file():
        from kitune.retrieval.memory import MemoryStore

        store = MemoryStore(embedder)
        lines = path.read_text(encoding="utf-8").splitlines()
        store.upsert([KI.model_validate_json(line) for line in lines if line.strip()])
        return store
    from kitune.retrieval.lance import LanceStore

    return LanceStore(path, embedder, read_consistency=None)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEV_DATA, help="dataset folder (BrowseComp-Plus layout)")
    ap.add_argument("--kis", type=Path, default=None, help="KIs: JSONL file or LanceDB folder (kis table)")
    ap.add_argument("--limit", type=int, default=None, help="first N questions only")
    ap.add_argument("--embedder", default="wordllama", choices=("wordllama", "hash"))
    ap.add_argument("--quick", action="store_true", help="first 30 questions")
    ap.add_argument("--name", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.limit = args.limit or 30
    split = args.data.resolve().name
    name = args.name or f"context_cost.{split}" + (".quick" if args.quick else "")
    machine = machine_info()
    tokenizer = enable_tiktoken()

    from kitune.config import load_config
    from kitune.evaluation.tools import build_toolbox
    from kitune.retrieval.embedders import HashEmbedder, WordLlamaEmbedder
    from kitune.retrieval.lance_corpus import LanceCorpusStore
    from kitune.service.pipelines.evaluation import make_context_fn
    from kitune.usage import estimate_tokens

    cfg = load_config()
    r = cfg.retrieval
    ds = load_dataset(args.data.resolve())
    questions = list(ds.questions[: args.limit] if args.limit else ds.questions)
    embedder = WordLlamaEmbedder(256) if args.embedder == "wordllama" else HashEmbedder(256)
    tmp = Path(tempfile.mkdtemp(prefix="kitune-bench-context-"))
    results: dict[str, Any] = {"questions": len(questions), "tokenizer": tokenizer}
    notes = [
        f"Tokens counted with {tokenizer} (kitune.usage.estimate_tokens).",
        "One call per question with the question text as the query; tool observations are built by "
        "the harness's own toolboxes (same rendering and caps the agent sees).",
        f"Baseline sizes: {r.search_hits} hits x {r.snippets_per_hit} snippets x {r.snippet_chars} chars; "
        f"in-context size: {r.default_size} KIs; observation cap {cfg.agent.observation_max_chars} chars.",
    ]
    try:
        corpus = LanceCorpusStore(tmp / "corpus", embedder)
        for i in range(0, len(ds.documents), 2000):
            corpus.add_documents(ds.documents[i : i + 2000])
        box = build_toolbox("baseline", cfg, corpus_store=corpus)
        results["baseline"] = measure(lambda q: box.call("search", {"query": q}), questions, estimate_tokens)
        print(f"baseline: {results['baseline']}", flush=True)
        if args.kis is not None:
            kis = open_kis(args.kis.resolve(), embedder)
            results["kis_in_store"] = kis.count()
            ctx_fn = make_context_fn(cfg, kis, disambiguation=False)

            def in_context(q: str) -> Any:
                return build_toolbox("in-context", cfg, get_context=ctx_fn).call("get_context", {"query": q})

            results["in_context"] = measure(in_context, questions, estimate_tokens)
            kis.close()
            print(f"in-context: {results['in_context']}", flush=True)
        else:
            results["in_context"] = None
            notes.append(
                "No KIs were given (--kis): the in-context side and the ratios were not measured. "
                "Extract KIs for this split, then rerun with --kis."
            )
        corpus.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    b, c = results["baseline"], results["in_context"]
    if c is not None:
        ratio: dict[str, float | None] = {
            "tokens_per_call_mean": round(c["tokens_per_call"]["mean"] / b["tokens_per_call"]["mean"], 3),
            "tokens_per_call_median": round(
                c["tokens_per_call"]["median"] / b["tokens_per_call"]["median"], 3
            ),
            "answer_bearing_rate": round(c["answer_bearing_rate"] / b["answer_bearing_rate"], 3)
            if b["answer_bearing_rate"]
            else None,
            "tokens_to_first_answer_median": round(
                c["tokens_to_first_answer"]["median"] / b["tokens_to_first_answer"]["median"], 3
            )
            if c["tokens_to_first_answer"] and b["tokens_to_first_answer"]
            else None,
        }
        results["ratio_in_context_over_baseline"] = ratio
    rows = []
    for skill, m in (("baseline", b), ("in-context", c)):
        if m is None:
            rows.append([skill, "not measured (no KIs)", "", "", "", "", ""])
            continue
        t, ta = m["tokens_per_call"], m["tokens_to_first_answer"]
        rows.append(
            [
                skill,
                t["median"],
                t["p95"],
                t["mean"],
                m["answer_bearing_rate"],
                ta["median"] if ta else "-",
                m["answer_bearing_per_1k_tokens"],
            ]
        )
    md = markdown_table(
        [
            "skill",
            "tokens/call p50",
            "tokens/call p95",
            "tokens/call mean",
            "answer-bearing rate",
            "tokens to first answer p50",
            "answer-bearing per 1k tokens",
        ],
        rows,
    )
    if c is not None:
        md += "\n\n**in-context / baseline:** " + ", ".join(
            f"{k} {v}" for k, v in results["ratio_in_context_over_baseline"].items()
        )
    write_results(
        name,
        machine=machine,
        params={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        results=results,
        summary_md=md,
        notes=notes,
    )
    print(f"wrote benchmarks/results/{name}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
