"""Seeded splits, slices and ``dspy.Example`` builders over :class:`~kitune.data.loaders.Question`."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import dspy

from kitune.data.loaders import Question

if TYPE_CHECKING:
    import dspy

__all__ = ["Split", "select_split", "slice_questions", "split_questions", "to_dspy_examples"]

Split = Literal["all", "tune", "validation"]


def split_questions(
    questions: Sequence[Question], *, validation_fraction: float, seed: int
) -> tuple[list[Question], list[Question]]:
    """Split questions into tune and validation sets, deterministically.

    Questions are ordered by ``query_id`` first, then shuffled with ``random.Random(seed)``, so
    the split depends only on the set of ids and the seed (same seed ⇒ same split, whatever the
    input order).

    Args:
        questions: the questions; ids must be unique.
        validation_fraction: share held out, in (0, 1). The validation set gets
            ``round(n * validation_fraction)`` questions, at least 1 and at most ``n - 1`` when
            ``n >= 2``.
        seed: RNG seed.

    Returns:
        ``(tune, validation)``: disjoint, together all questions; each in shuffled order.

    Raises:
        ValueError: ``validation_fraction`` outside (0, 1) or duplicate query ids.
    """
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    ordered = sorted(questions, key=lambda q: q.query_id)
    if len({q.query_id for q in ordered}) != len(ordered):
        raise ValueError("split_questions needs unique query ids")
    random.Random(seed).shuffle(ordered)
    n = len(ordered)
    if n < 2:
        return ordered, []
    n_val = min(max(round(n * validation_fraction), 1), n - 1)
    return ordered[n_val:], ordered[:n_val]


def select_split(
    questions: Sequence[Question], split: Split, *, validation_fraction: float, seed: int
) -> list[Question]:
    """Return ``all`` (input order), or the ``tune``/``validation`` part of :func:`split_questions`.

    Raises:
        ValueError: unknown ``split`` (use all, tune or validation).
    """
    if split == "all":
        return list(questions)
    tune, validation = split_questions(questions, validation_fraction=validation_fraction, seed=seed)
    if split == "tune":
        return tune
    if split == "validation":
        return validation
    raise ValueError(f"unknown split {split!r}: use all, tune or validation")


def slice_questions(
    questions: Sequence[Question], limit: int | None = None, offset: int = 0
) -> list[Question]:
    """The ``--limit`` slice: ``questions[offset:offset + limit]`` (all from ``offset`` when None).

    Raises:
        ValueError: negative ``limit`` or ``offset``.
    """
    if offset < 0 or (limit is not None and limit < 0):
        raise ValueError(f"limit and offset must be >= 0, got limit={limit} offset={offset}")
    end = None if limit is None else offset + limit
    return list(questions[offset:end])


def to_dspy_examples(questions: Sequence[Question]) -> list[dspy.Example]:
    """Build ``dspy.Example`` objects with ``question`` as the only input.

    Each example carries ``question``, ``answer``, ``aliases`` (list), ``query_id``,
    ``evidence_docids`` (list), ``gold_docids`` (list), ``category`` (str, may be empty) and
    ``evidence_turns`` (list of turn ids such as ``"D3:5"``, empty for non-dialogue data).
    ``len(result) == len(questions)``.
    """
    return [
        dspy.Example(
            question=q.query,
            answer=q.answer,
            aliases=list(q.aliases),
            query_id=q.query_id,
            evidence_docids=list(q.evidence_docids),
            gold_docids=list(q.gold_docids),
            category=q.category,
            evidence_turns=list(q.evidence_turns),
        ).with_inputs("question")
        for q in questions
    ]
