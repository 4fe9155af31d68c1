"""The dataset slice a loop runs on: N questions (first N or a seeded sample), their documents, distractors.

:func:`load_slice` reads ``OptimizeOptions.data_dir`` and keeps ``questions`` questions — the
first N, or with ``sample_seed`` a seeded random sample (:func:`sample_questions`);
:func:`select_documents` picks the documents they need plus seeded distractors;
:func:`split_slice` splits them into tuning and validation questions (``--split``, below);
:func:`write_question_ids` records which questions a run uses, its split and how it was made.

**Splits** (:data:`SPLIT_METHODS`, ``kitune optimize --split``):

* ``random`` (the default, so earlier runs resume with the split they started with):
  :func:`kitune.data.examples.split_questions`, a seeded shuffle of the question ids; two
  questions that share an evidence document may land in different splits;
* ``stratified`` (:func:`stratified_split`): the same number of validation questions
  (``round(n · validation_fraction)``, half up, at least 1 and at most ``n − 1``), allocated to the
  source datasets (``Question.dataset``, ground_truth's ``dataset``) in proportion to their size
  (largest remainder, ties by dataset name), drawn per dataset from a seeded shuffle of its ids;
  then the splits are made **disjoint in evidence documents**. Questions that share an evidence
  or gold document are linked, transitively, into a group; a group that the draw cut across both
  splits goes whole to the split that holds most of its questions (a tie: the split of the member
  drawn first) — those questions are ``moved``; finally each dataset's split sizes are restored
  by moving single questions (sharing no document with any other) from the split that gained to
  the one that lost, last drawn first — ``rebalanced``. When no such question is left a dataset
  stays off its target by what could not be rebalanced (reported in ``questions.json``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kitune.data.bundled import missing_data_message
from kitune.data.examples import split_questions
from kitune.data.loaders import Question, load_corpus, load_questions
from kitune.errors import DataError
from kitune.schema import Document

if TYPE_CHECKING:
    from kitune.config import KituneConfig
    from kitune.service.tuning.options import OptimizeOptions

__all__ = [
    "SPLIT_METHODS",
    "SliceSplit",
    "load_slice",
    "sample_questions",
    "select_documents",
    "split_slice",
    "stratified_split",
    "write_question_ids",
]

SPLIT_METHODS = ("random", "stratified")
"""``kitune optimize --split`` choices (see the module docstring); ``random`` is the default."""


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


def _docs_of(q: Question) -> tuple[str, ...]:
    return tuple(dict.fromkeys((*q.evidence_docids, *q.gold_docids)))


def _dataset(q: Question) -> str:
    return q.dataset or "(none)"


@dataclass(frozen=True)
class SliceSplit:
    """A loop run's tuning and validation questions and how they were drawn (:func:`split_slice`)."""

    tune: tuple[Question, ...]
    validation: tuple[Question, ...]
    method: str
    """``random`` or ``stratified`` (:data:`SPLIT_METHODS`)."""
    seed: int
    validation_fraction: float
    moved: tuple[str, ...] = ()
    """Query ids moved to the other split so that no evidence document is in both (stratified)."""
    rebalanced: tuple[str, ...] = ()
    """Query ids moved back the other way to restore each dataset's split sizes (stratified)."""
    groups: tuple[tuple[str, ...], ...] = ()
    """Groups of two or more questions linked by shared evidence/gold documents, sorted ids."""

    def by_dataset(self) -> dict[str, dict[str, int]]:
        """Dataset → ``{"tune": n, "validation": n}`` (questions without one under ``(none)``), sorted."""
        out: dict[str, dict[str, int]] = {}
        for name, qs in (("tune", self.tune), ("validation", self.validation)):
            for q in qs:
                counts = out.setdefault(_dataset(q), {"tune": 0, "validation": 0})
                counts[name] += 1
        return dict(sorted(out.items()))

    def shared_documents(self) -> tuple[str, ...]:
        """Evidence/gold document ids that questions of both splits need, sorted (empty: disjoint)."""
        tune = {d for q in self.tune for d in _docs_of(q)}
        return tuple(sorted(tune.intersection(d for q in self.validation for d in _docs_of(q))))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary for ``questions.json`` (``method`` … ``shared_documents``)."""
        return {
            "method": self.method,
            "seed": self.seed,
            "validation_fraction": self.validation_fraction,
            "by_dataset": self.by_dataset(),
            "moved": list(self.moved),
            "rebalanced": list(self.rebalanced),
            "groups": [list(g) for g in self.groups],
            "shared_documents": list(self.shared_documents()),
        }


def _groups(questions: Sequence[Question]) -> dict[str, str]:
    """Query id → its group's root id: questions linked by a shared evidence/gold document (union-find)."""
    parent = {q.query_id: q.query_id for q in questions}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    owner: dict[str, str] = {}
    for q in questions:
        for d in _docs_of(q):
            if d in owner:
                a, b = find(owner[d]), find(q.query_id)
                if a != b:
                    parent[max(a, b)] = min(a, b)
            else:
                owner[d] = q.query_id
    return {qid: find(qid) for qid in parent}


def _n_validation(n: int, fraction: float) -> int:
    return min(max(int(n * fraction + 0.5), 1), n - 1)


def stratified_split(questions: Sequence[Question], *, validation_fraction: float, seed: int) -> SliceSplit:
    """Tuning and validation questions, stratified by dataset, disjoint in evidence documents, seeded.

    The rule is the module docstring's (``stratified``). The draw depends only on the set of
    query ids, their datasets and documents, and ``seed``: same input and seed, same split.

    Args:
        questions: the slice's questions; ids must be unique. One question (or none) goes to
            tuning, with no validation question (as :func:`~kitune.data.examples.split_questions`).
        validation_fraction: share held out, in (0, 1).
        seed: RNG seed (``optimize.seed``).

    Returns:
        The :class:`SliceSplit`; ``tune`` and ``validation`` in draw order, disjoint, together
        all questions.

    Raises:
        ValueError: ``validation_fraction`` outside (0, 1) or a duplicate query id.
    """
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    ordered = sorted(questions, key=lambda q: q.query_id)
    if len({q.query_id for q in ordered}) != len(ordered):
        raise ValueError("stratified_split needs unique query ids")
    n = len(ordered)
    if n < 2:  # one question (or none): all to tuning, nothing to validate on (the loop says so)
        return SliceSplit(
            tune=tuple(ordered),
            validation=(),
            method="stratified",
            seed=seed,
            validation_fraction=validation_fraction,
        )
    by_id = {q.query_id: q for q in ordered}
    strata: dict[str, list[str]] = {}
    for q in ordered:
        strata.setdefault(_dataset(q), []).append(q.query_id)
    rng = random.Random(seed)
    for name in sorted(strata):
        rng.shuffle(strata[name])
    # validation places per dataset: floor shares, then the largest remainders (ties by name)
    total = _n_validation(n, validation_fraction)
    exact = {name: len(ids) * total / n for name, ids in strata.items()}
    target = {name: int(x) for name, x in exact.items()}
    for name in sorted(exact, key=lambda m: (-(exact[m] - target[m]), m))[: total - sum(target.values())]:
        target[name] += 1
    rank: dict[str, tuple[int, str]] = {}
    side: dict[str, bool] = {}  # True: validation
    for name, ids in strata.items():
        for i, qid in enumerate(ids):
            rank[qid] = (i, name)
            side[qid] = i < target[name]
    root = _groups(ordered)
    members: dict[str, list[str]] = {}
    for qid in sorted(rank, key=lambda x: rank[x]):
        members.setdefault(root[qid], []).append(qid)
    moved: list[str] = []
    for group in members.values():
        val = sum(side[q] for q in group)
        if 0 < val < len(group):  # cut across both splits: the whole group goes to one side
            to_val = val * 2 > len(group) or (val * 2 == len(group) and side[group[0]])
            for member in group:
                if side[member] != to_val:
                    side[member] = to_val
                    moved.append(member)
    rebalanced: list[str] = []
    for name, ids in sorted(strata.items()):
        have = sum(side[q] for q in ids)
        # singles only (no shared document), last drawn first
        singles = [q for q in reversed(ids) if len(members[root[q]]) == 1]
        while have != target[name]:
            want_val = have < target[name]
            pick = next((q for q in singles if side[q] != want_val), None)
            if pick is None:
                break
            side[pick] = want_val
            rebalanced.append(pick)
            have += 1 if want_val else -1
    order = sorted(rank, key=lambda x: rank[x])
    return SliceSplit(
        tune=tuple(by_id[q] for q in order if not side[q]),
        validation=tuple(by_id[q] for q in order if side[q]),
        method="stratified",
        seed=seed,
        validation_fraction=validation_fraction,
        moved=tuple(moved),
        rebalanced=tuple(rebalanced),
        groups=tuple(sorted(tuple(sorted(g)) for g in members.values() if len(g) > 1)),
    )


def split_slice(
    questions: Sequence[Question], *, method: str, validation_fraction: float, seed: int
) -> SliceSplit:
    """Split a slice's questions with ``method`` (:data:`SPLIT_METHODS`; see the module docstring).

    Raises:
        ValueError: an unknown ``method`` (names the choices), or what the method raises.
    """
    if method == "stratified":
        return stratified_split(questions, validation_fraction=validation_fraction, seed=seed)
    if method != "random":
        raise ValueError(f"unknown split {method!r}: use one of {', '.join(SPLIT_METHODS)}")
    tune, validation = split_questions(questions, validation_fraction=validation_fraction, seed=seed)
    root = _groups(questions)
    members: dict[str, list[str]] = {}
    for q in sorted(questions, key=lambda q: q.query_id):
        members.setdefault(root[q.query_id], []).append(q.query_id)
    return SliceSplit(
        tune=tuple(tune),
        validation=tuple(validation),
        method="random",
        seed=seed,
        validation_fraction=validation_fraction,
        groups=tuple(sorted(tuple(g) for g in members.values() if len(g) > 1)),
    )


def write_question_ids(
    state_dir: Path,
    *,
    data_dir: Path,
    n_total: int,
    sample_seed: int | None,
    tune: Sequence[Question],
    validation: Sequence[Question],
    split_seed: int,
    split: SliceSplit | None = None,
) -> Path:
    """Record the questions a loop run uses as ``<state_dir>/questions.json``.

    Keys: ``data``, ``questions_in_dataset``, ``sample_seed`` (None: the first N), ``split_seed``
    (``optimize.seed``), ``tune`` and ``validation`` (query ids in split order), and with
    ``split`` its :meth:`SliceSplit.to_dict` under ``split`` (method, questions per dataset and
    split, moved, rebalanced, linked groups, documents both splits need). Rewritten on every
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
    if split is not None:
        data["split"] = split.to_dict()
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
        raise DataError(missing_data_message(data), path=str(data))
    questions = sample_questions(load_questions(data), opts.questions, opts.sample_seed)
    if not questions:
        raise DataError(f"{data} gives 0 questions; the loop needs at least 1", path=str(data))
    evidence, distractors = select_documents(
        questions, load_corpus(data), distractors=opts.distractors, seed=cfg.optimize.seed
    )
    return questions, [*evidence, *distractors]
