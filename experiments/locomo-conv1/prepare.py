"""Build the experiment's data folder: one LoCoMo conversation and a seeded random sample of its questions.

Writes, under ``--out`` (a work folder, never the repository: the data stays at its shared path):
``corpus.jsonl`` (the conversation's sessions, lines copied verbatim), ``ground_truth.jsonl``,
``queries.tsv`` and ``qrel_evidence.txt`` restricted to the sampled questions, in query-id order
(the first one is the full-context arm's cold question). ``--sample-out`` gets the documented
sample: conversation, seed, population size, the sampled ids and their categories (ids only).

The sample is ``random.Random(seed).sample(sorted ids, n)``, re-sorted by id; question ids are
LoCoMo's ``<conversation>-<n>``. Re-running with the same arguments writes the same files.

Usage::

    python experiments/locomo-conv1/prepare.py --conversation 26 --n 40 --seed 17 \
        --out kitune-work/locomo-conv26/data --sample-out experiments/locomo-conv1/sample.json
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path

LOCOMO = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "locomo"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=LOCOMO)
    p.add_argument("--conversation", required=True, help="LoCoMo conversation id, e.g. 26.")
    p.add_argument(
        "--n", type=int, default=40, help="Questions in the sample (0: all of the conversation's)."
    )
    p.add_argument("--seed", type=int, default=17)
    p.add_argument(
        "--sessions",
        type=int,
        default=0,
        help="Keep only the conversation's first K sessions and the questions whose evidence turns all "
        "lie in them (0: all). Every arm then reads the same K sessions.",
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sample-out", type=Path, required=True)
    a = p.parse_args(argv)
    source = f"locomo-{a.conversation}"
    corpus = [ln for ln in (a.data / "corpus.jsonl").read_text(encoding="utf-8").splitlines() if ln.strip()]
    docs = [ln for ln in corpus if json.loads(ln).get("source") == source]
    if a.sessions > 0:  # docid = conversation x 1000 + session (as in benchmarks/locomo_coverage.py)
        docs = [ln for ln in docs if int(json.loads(ln)["docid"]) % 1000 <= a.sessions]
    if not docs:
        raise SystemExit(f"no sessions with source {source!r} in {a.data / 'corpus.jsonl'}")
    truth = [
        ln for ln in (a.data / "ground_truth.jsonl").read_text(encoding="utf-8").splitlines() if ln.strip()
    ]
    mine = {
        json.loads(ln)["query_id"]: ln
        for ln in truth
        if json.loads(ln)["query_id"].startswith(f"{a.conversation}-")
    }
    if a.sessions > 0:
        mine = {
            q: ln
            for q, ln in mine.items()
            if json.loads(ln).get("evidence_dia_ids")
            and all(int(t[1:].split(":")[0]) <= a.sessions for t in json.loads(ln)["evidence_dia_ids"])
        }
    population = sorted(mine)
    n = len(population) if a.n <= 0 else min(a.n, len(population))
    sample = sorted(random.Random(a.seed).sample(population, n))
    keep = set(sample)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "corpus.jsonl").write_text("\n".join(docs) + "\n", encoding="utf-8")
    (a.out / "ground_truth.jsonl").write_text("\n".join(mine[q] for q in sample) + "\n", encoding="utf-8")
    queries = [
        ln
        for ln in (a.data / "queries.tsv").read_text(encoding="utf-8").splitlines()
        if ln.split("\t", 1)[0] in keep
    ]
    (a.out / "queries.tsv").write_text("\n".join(queries) + "\n", encoding="utf-8")
    qrels = [
        ln
        for ln in (a.data / "qrel_evidence.txt").read_text(encoding="utf-8").splitlines()
        if ln.split()[:1] and ln.split()[0] in keep
    ]
    (a.out / "qrel_evidence.txt").write_text("\n".join(qrels) + "\n", encoding="utf-8")
    cats = {q: json.loads(mine[q]).get("category", "") for q in sample}
    record = {
        "data": str(a.data),
        "conversation": a.conversation,
        "sessions": len(docs),
        "population": len(population),
        "seed": a.seed,
        "first_sessions": a.sessions or None,
        "n": n,
        "method": "random.Random(seed).sample(sorted query ids, n), re-sorted by id",
        "query_ids": sample,
        "categories": dict(sorted(Counter(cats.values()).items())),
        "population_categories": dict(
            sorted(Counter(json.loads(mine[q]).get("category", "") for q in population).items())
        ),
    }
    a.sample_out.parent.mkdir(parents=True, exist_ok=True)
    a.sample_out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"{source}: {len(docs)} sessions, {n} of {len(population)} questions {record['categories']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
