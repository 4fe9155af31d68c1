"""What the old 8,000-character tool-result cap did to the baseline's search on LoCoMo (no LLM).

For every question of one conversation, its text is sent once through the baseline ``search``
(the real corpus store: LanceDB BM25 + wordllama vectors fused with RRF, passages of 700
characters; 10 hits x 3 snippets x <= 700 characters, as published) and the result is capped
three ways: no cap (the published baseline), 8,000 characters cutting whole hits (the cap as
it is now: what is cut is not counted as seen) and the old accounting (text cut at 8,000 but
all 10 hits counted as seen). Reported per variant: hits shown, characters and estimated tokens
per search, and the share of the question's evidence sessions counted as seen (evidence recall
of one search).

Usage::

    python experiments/locomo-conv1/search_cap.py --conversation 26 \
        --out experiments/locomo-conv1/search_cap.md
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from kitune.config import KituneConfig
from kitune.data.loaders import load_dataset
from kitune.evaluation.metrics import evidence_recall
from kitune.evaluation.tools import baseline_toolbox, cap_text
from kitune.retrieval import create_corpus_store
from kitune.usage import estimate_tokens

LOCOMO = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "locomo"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=LOCOMO)
    p.add_argument("--conversation", default="26")
    p.add_argument("--cap", type=int, default=8000)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    ds = load_dataset(a.data)
    docs = [d for d in ds.documents if d.source == f"locomo-{a.conversation}"]
    ids = {d.docid for d in docs}
    qs = [q for q in ds.questions if q.evidence_docids and set(q.evidence_docids) <= ids]
    # variant -> per question (hits counted as seen, characters shown, estimated tokens, evidence recall)
    rows: dict[str, list[tuple[int, int, int, float]]] = {"uncapped": [], "capped": [], "old": []}
    with tempfile.TemporaryDirectory() as tmp:
        store = create_corpus_store(KituneConfig(workdir=Path(tmp)))
        store.add_documents(docs)
        full, capped = baseline_toolbox(store), baseline_toolbox(store, max_chars=a.cap)
        for q in qs:
            o_full = full.call("search", {"query": q.query})
            o_cap = capped.call("search", {"query": q.query})
            old_text, _ = cap_text(o_full.text, a.cap)
            for name, text, seen in (
                ("uncapped", o_full.text, o_full.doc_ids),
                ("capped", o_cap.text, o_cap.doc_ids),
                ("old", old_text, o_full.doc_ids),
            ):
                recall = evidence_recall(seen, q.evidence_docids) or 0.0
                rows[name].append((len(seen), len(text), estimate_tokens(text), recall))
    labels = {
        "uncapped": "no cap (published baseline)",
        "capped": f"cap {a.cap:,}: whole hits, only shown ones seen (now)",
        "old": f"cap {a.cap:,}: text cut, all hits counted (before)",
    }
    lines = [
        f"# Baseline search on LoCoMo conversation {a.conversation}: the {a.cap:,}-character cap",
        "",
        f"{len(qs)} questions (those with evidence sessions), {len(docs)} sessions; one `search` per "
        "question with its own text; 10 hits x 3 snippets x <= 700 characters; LanceDB corpus store "
        "(BM25 + wordllama vectors, RRF). No LLM.",
        "",
        "| variant | hits counted as seen (mean) | characters (median) | est. tokens (median) "
        "| evidence recall of one search (mean) |",
        "|---|---|---|---|---|",
    ]
    for name, label in labels.items():
        r = rows[name]
        seen = statistics.fmean(x[0] for x in r)
        chars = statistics.median(x[1] for x in r)
        toks = statistics.median(x[2] for x in r)
        rec = statistics.fmean(x[3] for x in r)
        lines.append(f"| {label} | {seen:.2f} | {chars:,.0f} | {toks:,.0f} | {rec:.3f} |")
    shown = [x[0] for x in rows["capped"]]
    lines += [
        "",
        f"Hits shown whole under the cap: median {statistics.median(shown):.0f} "
        f"(min {min(shown)}, max {max(shown)}) of 10.",
    ]
    a.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
