"""Retrieval quality on the real dev split: evidence recall@k and nDCG@10 over documents.

For each question (the question text is the query) and each embedder (WordLlama, the default,
and HashEmbedder, the dependency-free fallback), the dev corpus is indexed in a
:class:`kitune.retrieval.lance_corpus.LanceCorpusStore` and documents are ranked three ways:

* ``bm25`` — the store's BM25 (LanceDB native FTS) over passages, best passage per document;
* ``vector`` — cosine over passage embeddings, best passage per document;
* ``hybrid`` — ``store.search`` (both fused with RRF), what the baseline agent's ``search`` runs.

(``bm25``/``vector`` query the store's passage table directly with the same settings its
``search`` uses, since the store only exposes the fused ranking.) A document is relevant when it
is one of the question's evidence documents (``qrel_evidence``).

With ``--kis PATH`` (a JSONL file of KIs, or a LanceDB folder holding a ``kis`` table) the same
metrics are measured through KIs: the KI store is searched with the plain plan (no LLM rewrite)
and each branch alone, and a KI counts for its evidence documents (ranked by first appearance).

Usage::

    python benchmarks/retrieval_quality.py                      # dev split, both embedders
    python benchmarks/retrieval_quality.py --quick              # 30 questions, WordLlama only
    python benchmarks/retrieval_quality.py --kis kitune-work/lancedb
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _common import Timer, machine_info, markdown_table, ndcg_at_k, recall_at_k, write_results

from kitune.data.loaders import Question, load_dataset
from kitune.ki import KI
from kitune.retrieval.embedders import Embedder, HashEmbedder, WordLlamaEmbedder

DEV_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "dev"
KS = (1, 5, 10, 20)
DEPTH = 20


def dedupe(ids: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def score(rankings: dict[str, list[str]], questions: Sequence[Question]) -> dict[str, float]:
    """Mean recall@k for each k and nDCG@10 over questions (rankings keyed by query_id)."""
    out: dict[str, float] = {}
    for k in KS:
        vals = [recall_at_k(rankings[q.query_id], q.evidence_docids, k) for q in questions]
        out[f"recall@{k}"] = round(sum(vals) / len(vals), 4)
    vals = [ndcg_at_k(rankings[q.query_id], q.evidence_docids, 10) for q in questions]
    out["ndcg@10"] = round(sum(vals) / len(vals), 4)
    full = [float(set(q.evidence_docids) <= set(rankings[q.query_id][:10])) for q in questions]
    out["all_evidence@10"] = round(sum(full) / len(full), 4)
    return out


def corpus_rankings(store: Any, query: str, depth: int) -> dict[str, list[str]]:
    """bm25 / vector / hybrid document rankings (best first, at most ``depth``) for one query."""
    from lancedb.query import MatchQuery

    n = max(50, depth * 10)
    chunks = store._chunks  # the store's passage table: it only exposes the fused ranking
    rows = (
        chunks.search(MatchQuery(query, "text"), query_type="fts")  # type: ignore[call-arg]
        .select(["chunk_id", "docid", "_score"])
        .limit(n)
        .to_list()
    )
    rows.sort(key=lambda r: (-float(r["_score"]), r["chunk_id"]))
    bm25 = dedupe([r["docid"] for r in rows])[:depth]
    vec = store.embedder.embed([query])[0]
    rows = (
        chunks.search(vec, vector_column_name="vector", query_type="vector")
        .distance_type("cosine")
        .select(["chunk_id", "docid", "_distance"])
        .limit(n)
        .to_list()
    )
    rows.sort(key=lambda r: (round(float(r["_distance"]), 6), r["chunk_id"]))
    vector = dedupe([r["docid"] for r in rows])[:depth]
    hybrid = [h.docid for h in store.search(query, k=depth, snippets_per_hit=1, snippet_chars=50)]
    return {"bm25": bm25, "vector": vector, "hybrid": hybrid}


def eval_corpus(
    name: str, embedder: Embedder, docs: Sequence[Any], questions: Sequence[Question], base: Path
) -> dict[str, Any]:
    from kitune.retrieval.fusion import chunk_text
    from kitune.retrieval.lance_corpus import LanceCorpusStore

    passages = [p for d in docs for p in (chunk_text(f"{d.title}\n\n{d.text}", 700) or [d.title])]
    with Timer() as te:
        for i in range(0, len(passages), 512):
            embedder.embed(passages[i : i + 512])
    store = LanceCorpusStore(base / name, embedder)
    with Timer() as ti:
        for i in range(0, len(docs), 2000):
            store.add_documents(docs[i : i + 2000])
    per_q = {q.query_id: corpus_rankings(store, q.query, DEPTH) for q in questions}
    store.close()
    out: dict[str, Any] = {
        "embed_docs_per_s": round(len(docs) / te.wall_s, 1),
        "embed_passages": len(passages),
        "index_wall_s": round(ti.wall_s, 1),
        "methods": {},
    }
    for method in ("bm25", "vector", "hybrid"):
        out["methods"][method] = score({q: r[method] for q, r in per_q.items()}, questions)
    return out


def load_kis(path: Path, embedder: Embedder) -> Any:
    """A searchable KI store from a JSONL file (loaded into a MemoryStore) or a LanceDB folder."""
    if path.is_file():
        from kitune.retrieval.memory import MemoryStore

        store = MemoryStore(embedder)
        kis = [
            KI.model_validate_json(line)
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        store.upsert(kis)
        return store
    from kitune.retrieval.lance import LanceStore

    return LanceStore(path, embedder, read_consistency=None)


def eval_kis(path: Path, embedder: Embedder, questions: Sequence[Question]) -> dict[str, Any]:
    from kitune.schema import QueryPlan

    store = load_kis(path, embedder)
    plans: dict[str, Callable[[str], QueryPlan | None]] = {
        "hybrid": lambda q: QueryPlan.plain(q, size=50),
        "tag": lambda q: (
            QueryPlan(entity_tags=p.entity_tags, size=50) if (p := QueryPlan.plain(q)).entity_tags else None
        ),
        "bm25": lambda q: QueryPlan(lexical=q[:500], size=50),
        "vector": lambda q: QueryPlan(semantic=q[:1000], size=50),
    }
    out: dict[str, Any] = {"kis": store.count(), "methods": {}}
    for method, make in plans.items():
        rankings = {}
        for q in questions:
            plan = make(q.query)
            hits = store.search(plan).hits if plan is not None else []
            rankings[q.query_id] = dedupe([d for h in hits for d in h.ki.evidence_doc_ids])[:DEPTH]
        out["methods"][method] = score(rankings, questions)
    store.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEV_DATA, help="dataset folder (BrowseComp-Plus layout)")
    ap.add_argument("--embedders", default="wordllama,hash", help="comma-separated: wordllama, hash")
    ap.add_argument(
        "--kis", type=Path, default=None, help="KIs for the dev corpus: JSONL file or LanceDB folder"
    )
    ap.add_argument("--limit", type=int, default=None, help="first N questions only")
    ap.add_argument("--quick", action="store_true", help="30 questions, WordLlama only")
    ap.add_argument("--name", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.limit, args.embedders = args.limit or 30, "wordllama"
    name = args.name or ("retrieval_quality.quick" if args.quick else "retrieval_quality")
    machine = machine_info()
    ds = load_dataset(args.data.resolve())
    questions = list(ds.questions[: args.limit] if args.limit else ds.questions)
    makers: dict[str, Callable[[], Embedder]] = {
        "wordllama": lambda: WordLlamaEmbedder(256),
        "hash": lambda: HashEmbedder(256),
    }
    base = Path(tempfile.mkdtemp(prefix="kitune-bench-quality-"))
    results: dict[str, Any] = {"questions": len(questions), "corpus_docs": len(ds.documents), "corpus": {}}
    notes = [
        "Query = the question text as written (no rewrite, no decomposition): a single-shot lower bound "
        "for multi-hop questions, whose second-hop documents are often not named in the question.",
        "Relevant = qrel_evidence documents; recall@k averages per-question recall; all_evidence@10 = share "
        "of questions with every evidence document in the top 10.",
    ]
    try:
        for emb_name in [e.strip() for e in args.embedders.split(",") if e.strip()]:
            print(f"indexing {len(ds.documents)} docs with {emb_name} …", flush=True)
            res = eval_corpus(emb_name, makers[emb_name](), ds.documents, questions, base)
            results["corpus"][emb_name] = res
            print(f"  {json.dumps(res)}", flush=True)
        if args.kis is not None:
            print(f"KIs from {args.kis} …", flush=True)
            results["kis"] = eval_kis(args.kis, makers["wordllama"](), questions)
            print(f"  {json.dumps(results['kis'])}", flush=True)
        else:
            results["kis"] = None
            notes.append(
                "No KI store for the dev corpus was given (--kis): the through-KIs measurement was not run."
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)

    metric_cols = [f"recall@{k}" for k in KS] + ["ndcg@10", "all_evidence@10"]
    results["ratios_over_bm25"] = {
        emb: {
            m: {
                c: round(v[c] / res["methods"]["bm25"][c], 3) if res["methods"]["bm25"][c] else None
                for c in metric_cols
            }
            for m, v in res["methods"].items()
            if m != "bm25"
        }
        for emb, res in results["corpus"].items()
    }
    rows = [
        [f"corpus / {emb}", m, *[v[c] for c in metric_cols]]
        for emb, res in results["corpus"].items()
        for m, v in res["methods"].items()
    ]
    if results["kis"]:
        rows += [
            [f"KIs ({results['kis']['kis']}) / wordllama", m, *[v[c] for c in metric_cols]]
            for m, v in results["kis"]["methods"].items()
        ]
    cost = markdown_table(
        ["embedder", "docs/s embedded", "passages", "index wall s (embed + write)"],
        [
            [e, r["embed_docs_per_s"], r["embed_passages"], r["index_wall_s"]]
            for e, r in results["corpus"].items()
        ],
    )
    md = "## Evidence retrieval (question as query)\n\n" + markdown_table(
        ["index / embedder", "method", *metric_cols], rows
    )
    md += "\n\n## Embedding cost\n\n" + cost
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
