"""What a loop run saw: content hashes of its questions and documents (``<state>/fingerprint.json``).

``kitune optimize`` writes it when a run ends; ``kitune drift`` reads it to find the questions and
documents that are new or changed since. Its own module so the loop and drift both use it
without importing each other.

The fingerprint follows what is served. Every extractor version a run stages (an accepted one of
``kitune optimize``, a ``kitune drift run``) gets the fingerprint of the data its KI table was
extracted from, archived as ``<state>/fingerprints/<prompt>-v<version>.json``
(:func:`archive_fingerprint`); ``kitune prompts promote`` and ``rollback`` then put the archive of
the version they switch to in place (:func:`follow_served_version`), after archiving the one they
replace, so ``drift check`` after a promotion compares with the data now served, and after a
rollback with the data served again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kitune.data.checksum import document_hash
from kitune.data.loaders import Question, load_corpus, load_questions
from kitune.errors import DataError
from kitune.ki import utcnow
from kitune.schema import Document

if TYPE_CHECKING:
    from kitune.service.tuning.options import OptimizeOptions

__all__ = [
    "FINGERPRINT",
    "HASH_SCHEME",
    "archive_fingerprint",
    "fingerprint",
    "follow_served_version",
    "legacy_document_hash",
    "question_hash",
    "read_fingerprint",
    "write_fingerprint",
    "write_fingerprint_data",
]


def _sha(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False, sort_keys=True).encode("utf-8")).hexdigest()[
        :16
    ]


FINGERPRINT = "fingerprint.json"


HASH_SCHEME = "document_hash"
"""Which document hash a fingerprint holds: :func:`kitune.data.checksum.document_hash` (the one the
extraction resume file and the extraction cache use). Fingerprints without the marker hold the
older ``_sha(title, text)``; :func:`legacy_document_hash` recomputes that for a comparison."""


def question_hash(q: Question) -> str:
    """16 hex characters over a question's text, answer, aliases and evidence/gold document ids."""
    return _sha(q.query, q.answer, list(q.aliases), list(q.evidence_docids), list(q.gold_docids))


def legacy_document_hash(d: Document) -> str:
    """The document hash of fingerprints written before :data:`HASH_SCHEME`."""
    return _sha(d.title, d.text)


def fingerprint(questions: Sequence[Question], documents: Sequence[Document]) -> dict[str, dict[str, str]]:
    """``{"questions": {id: hash}, "documents": {id: document_hash}}`` (deterministic content hashes)."""
    return {
        "questions": {q.query_id: question_hash(q) for q in questions},
        "documents": {d.docid: document_hash(d) for d in documents},
    }


def write_fingerprint(
    state_dir: Path, questions: Sequence[Question], documents: Sequence[Document], opts: OptimizeOptions
) -> Path:
    """Store what a run saw (and its slice options) as ``<state_dir>/fingerprint.json``.

    Besides the slice (``questions``, ``documents``) it records every question and every corpus
    document of ``opts.data_dir`` (``all_questions``, ``corpus``): ``kitune drift check`` compares
    the whole data folder with them, so a question or document added outside the slice counts.
    """
    everything = fingerprint(load_questions(opts.data_dir), load_corpus(opts.data_dir))
    data = {
        **fingerprint(questions, documents),
        "hash": HASH_SCHEME,
        "all_questions": everything["questions"],
        "corpus": everything["documents"],
        "options": {
            "questions": opts.questions,
            "sample_seed": opts.sample_seed,
            "distractors": opts.distractors,
            "programs": list(opts.programs),
        },
        "at": utcnow().isoformat(),
    }
    return write_fingerprint_data(state_dir, data)


def write_fingerprint_data(state_dir: Path, data: dict[str, Any]) -> Path:
    """Write an already built fingerprint ``data`` as ``<state_dir>/fingerprint.json``; returns its path."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / FINGERPRINT
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def _archive_path(state_dir: Path, name: str, version: int) -> Path:
    return state_dir / "fingerprints" / f"{name}-v{int(version)}.json"


def archive_fingerprint(state_dir: Path, name: str, version: int, data: dict[str, Any] | None = None) -> Path:
    """Keep the fingerprint of the data prompt ``name`` version ``version`` was extracted from.

    Args:
        state_dir: the run's state folder (``<workdir>/optimize/<run name>``).
        name: the extractor's registered prompt name.
        version: its version (≥ 1).
        data: the fingerprint; None: the run's current ``fingerprint.json``.

    Returns:
        The archive's path, ``<state_dir>/fingerprints/<name>-v<version>.json``.

    Raises:
        DataError: ``data`` is None and the run has no fingerprint yet.
    """
    if data is None:
        data = read_fingerprint(state_dir)
    path = _archive_path(state_dir, name, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def follow_served_version(workdir: Path, name: str, *, previous: int | None, current: int) -> list[Path]:
    """After production of ``name`` moved from ``previous`` to ``current``: the fingerprint follows.

    In every run folder under ``<workdir>/optimize`` that archived a fingerprint for ``current``
    (:func:`archive_fingerprint`), the run's ``fingerprint.json`` is first archived for
    ``previous`` (when that version has no archive yet: the data it was served on) and then
    replaced by ``current``'s archive. Run folders without an archive for ``current`` (a version
    no run staged, or another program's prompt) are left as they are.

    Args:
        workdir: the work directory (``cfg.workdir``).
        name: the prompt promoted or rolled back.
        previous: the production version before the switch (None: there was none).
        current: the production version after it.

    Returns:
        The ``fingerprint.json`` files rewritten (empty: none followed).
    """
    root = Path(workdir) / "optimize"
    if not root.is_dir():
        return []
    changed: list[Path] = []
    for state_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        source = _archive_path(state_dir, name, current)
        if not source.is_file():
            continue
        served = state_dir / FINGERPRINT
        if previous is not None and previous != current and served.is_file():
            kept = _archive_path(state_dir, name, previous)
            if not kept.exists():
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_bytes(served.read_bytes())
        served.write_bytes(source.read_bytes())
        changed.append(served)
    return changed


def read_fingerprint(state_dir: Path) -> dict[str, Any]:
    """The stored fingerprint.

    Raises:
        DataError: no fingerprint (run ``kitune optimize`` first) or it is unreadable.
    """
    path = state_dir / FINGERPRINT
    if not path.is_file():
        raise DataError(
            f"no {FINGERPRINT} in {state_dir}: run `kitune optimize` (same --run-name) before `kitune drift`",
            path=str(path),
        )
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path} is not valid JSON ({e}); rerun `kitune optimize`", path=str(path)) from e
    return data
