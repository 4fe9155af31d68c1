"""Write a small BrowseComp-layout slice of a dataset folder: N questions, their documents, distractors.

The watch example runs on 12 fixture questions instead of 24 so that it fits in about an hour of
the embedded model on a 2-core CPU (extracting all 144 fixture documents alone takes ~80 min at
~33 s per document). The slice is chosen with kitune's own loop slicing
(:func:`kitune.service.tuning.slicing.sample_questions`: the first N questions, or a seeded
sample; :func:`~kitune.service.tuning.slicing.select_documents`: every evidence/gold document of
those questions plus seeded distractors), and every kept line is copied byte for byte from the
source files, so the slice holds the published data unchanged. It is written into the work folder
(not committed): the data stays read from ``../shared/data`` at run time.

    python experiments/watch-unlabelled/slice.py --data ../shared/data/fixture \\
        --questions 12 --distractors 4 --out kitune-work/watch-unlabelled/fixture-12
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kitune.data.loaders import load_corpus, load_questions
from kitune.service.tuning.slicing import sample_questions, select_documents

FILES = ("corpus.jsonl", "queries.tsv", "ground_truth.jsonl", "qrel_evidence.txt", "qrel_golds.txt")


def _keep(line: str, name: str, qids: set[str], docids: set[str]) -> bool:
    if name == "corpus.jsonl":
        return str(json.loads(line)["docid"]) in docids
    if name == "ground_truth.jsonl":
        return str(json.loads(line)["query_id"]) in qids
    return line.split(maxsplit=1)[0] in qids  # queries.tsv (tab) and TREC qrels (space)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--data", type=Path, required=True, help="a dataset folder (BrowseComp-Plus layout)")
    ap.add_argument("--questions", type=int, default=12, help="how many questions (the first N)")
    ap.add_argument("--sample-seed", type=int, default=None, help="a seeded sample instead of the first N")
    ap.add_argument("--distractors", type=int, default=4, help="seeded distractor documents added")
    ap.add_argument("--seed", type=int, default=0, help="seed of the distractor draw")
    ap.add_argument("--out", type=Path, required=True, help="the slice folder to write")
    args = ap.parse_args()
    if args.questions < 1 or args.distractors < 0:
        raise SystemExit("--questions must be >= 1 and --distractors >= 0")

    questions = sample_questions(load_questions(args.data), args.questions, args.sample_seed)
    evidence, distractors = select_documents(
        questions, load_corpus(args.data), distractors=args.distractors, seed=args.seed
    )
    qids = {q.query_id for q in questions}
    docids = {d.docid for d in (*evidence, *distractors)}
    args.out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        src = args.data / name
        if not src.is_file():
            continue
        lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [ln for ln in lines if ln.strip() and _keep(ln, name, qids, docids)]
        (args.out / name).write_text("".join(kept), encoding="utf-8")
    print(
        f"{args.out}: {len(questions)} questions, {len(evidence)} evidence/gold + "
        f"{len(distractors)} distractor documents from {args.data}"
    )


if __name__ == "__main__":
    main()
