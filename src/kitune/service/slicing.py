"""The dataset slice a loop runs on: the first N questions, their evidence documents, distractors.

:func:`load_slice` reads ``OptimizeOptions.data_dir`` and keeps ``questions`` questions;
:func:`select_documents` picks the documents they need plus seeded distractors.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kitune.data.loaders import Question
from kitune.errors import DataError
from kitune.schema import Document

if TYPE_CHECKING:
    from kitune.config import KituneConfig
    from kitune.service.optimize import OptimizeOptions

__all__ = ["load_slice", "select_documents"]


def select_documents(
    questions: Sequence[Question], corpus: Sequence[Document], *, distractors: int, seed: int
) -> tuple[list[Document], list[Document]]:
    """The documents a slice needs: every evidence/gold doc of ``questions`` plus distractors.

    Distractors are drawn with ``random.Random(seed)`` from the other documents (sorted by id
    first, so the draw depends only on the corpus and the seed).

    Returns:
        ``(evidence documents in question order, distractors)``; ids unknown to the corpus are
        skipped.
    """
    by_id = {d.docid: d for d in corpus}
    wanted = dict.fromkeys(d for q in questions for d in (*q.evidence_docids, *q.gold_docids))
    evidence = [by_id[d] for d in wanted if d in by_id]
    others = sorted((d for d in corpus if d.docid not in wanted), key=lambda d: d.docid)
    picked = random.Random(seed).sample(others, min(max(distractors, 0), len(others)))
    return evidence, picked


def load_slice(cfg: KituneConfig, opts: OptimizeOptions) -> tuple[list[Question], list[Document]]:
    """The first ``opts.questions`` questions and the documents they need plus distractors.

    Raises:
        DataError: the data folder is missing or has no questions.
    """
    from kitune.data.loaders import load_corpus, load_questions

    data = Path(opts.data_dir)
    if not data.exists():
        raise DataError(f"data path {data} does not exist: pass --data DIR", path=str(data))
    questions = load_questions(data)
    if opts.questions is not None:
        questions = questions[: opts.questions]
    if len(questions) < 2:
        raise DataError(
            f"{data} gives {len(questions)} question(s); the loop needs at least 2 (tune + validation)",
            path=str(data),
        )
    evidence, distractors = select_documents(
        questions, load_corpus(data), distractors=opts.distractors, seed=cfg.optimize.seed
    )
    return questions, [*evidence, *distractors]
