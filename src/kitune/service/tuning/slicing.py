"""The dataset slice a loop runs on: N questions (first N or a seeded sample), their documents, distractors.

:func:`load_slice` reads ``OptimizeOptions.data_dir`` and keeps ``questions`` questions — the
first N, or with ``sample_seed`` a seeded random sample (:func:`sample_questions`);
:func:`select_documents` picks the documents they need plus seeded distractors;
:func:`write_question_ids` records which questions a run uses (and its tune/validation split).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kitune.data.loaders import Question, load_corpus, load_questions
from kitune.errors import DataError
from kitune.schema import Document

if TYPE_CHECKING:
    from kitune.config import KituneConfig
    from kitune.service.tuning.options import OptimizeOptions

__all__ = ["load_slice", "sample_questions", "select_documents", "write_question_ids"]


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


def sample_questions(questions: Sequence[Question], n: int | None, seed: int | None) -> list[Question]:
    """``n`` questions: the first ``n`` (``seed`` None), else ``random.Random(seed).sample`` in dataset order.

    Args:
        questions: the dataset's questions, in file order.
        n: how many (None: all of them).
        seed: None for the first ``n``; an int for a seeded sample (same seed, same questions).

    Returns:
        At most ``n`` questions, in the dataset's order.
    """
    if n is None or n >= len(questions):
        return list(questions)
    if seed is None:
        return list(questions[:n])
    picked = set(random.Random(seed).sample(range(len(questions)), n))
    return [q for i, q in enumerate(questions) if i in picked]


def write_question_ids(
    state_dir: Path,
    *,
    data_dir: Path,
    n_total: int,
    sample_seed: int | None,
    tune: Sequence[Question],
    validation: Sequence[Question],
    split_seed: int,
) -> Path:
    """Record the questions a loop run uses as ``<state_dir>/questions.json``.

    Keys: ``data``, ``questions_in_dataset``, ``sample_seed`` (None: the first N), ``split_seed``
    (``optimize.seed``), ``tune`` and ``validation`` (query ids in split order). Rewritten on every
    start (the same options give the same file).
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "questions.json"
    data = {
        "data": str(Path(data_dir).resolve()),
        "questions_in_dataset": n_total,
        "sample_seed": sample_seed,
        "split_seed": split_seed,
        "n": len(tune) + len(validation),
        "tune": [q.query_id for q in tune],
        "validation": [q.query_id for q in validation],
    }
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return path


def load_slice(cfg: KituneConfig, opts: OptimizeOptions) -> tuple[list[Question], list[Document]]:
    """``opts.questions`` questions (the first N, or a sample seeded by ``opts.sample_seed``) + documents.

    The documents are every evidence/gold document of the questions plus ``opts.distractors``
    seeded distractors (:func:`select_documents`).

    Raises:
        DataError: the data folder is missing or has no questions.
    """
    data = Path(opts.data_dir)
    if not data.exists():
        raise DataError(f"data path {data} does not exist: pass --data DIR", path=str(data))
    questions = sample_questions(load_questions(data), opts.questions, opts.sample_seed)
    if len(questions) < 2:
        raise DataError(
            f"{data} gives {len(questions)} question(s); the loop needs at least 2 (tune + validation)",
            path=str(data),
        )
    evidence, distractors = select_documents(
        questions, load_corpus(data), distractors=opts.distractors, seed=cfg.optimize.seed
    )
    return questions, [*evidence, *distractors]
