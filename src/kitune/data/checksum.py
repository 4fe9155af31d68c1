"""The dataset checksum recorded with every run: SHA-256 of exactly the files the loaders read.

Two runs can only be compared when they ran on the same data, and a dataset path says nothing
about its content (files are re-exported, subsets re-cut, errata edited). So each run record
(``run.json`` and ``summary.json`` of ``kitune eval``, ``kitune demo``'s ``summary.json``, the
optimisation run's parameters) holds ``data_sha256``: a SHA-256 over the files
:mod:`kitune.data.loaders` reads for that data path —
the corpus, the question files, the qrels, the LoCoMo JSON, and the errata overlay when one is
applied — plus each file's own SHA-256.

The combined digest is the SHA-256 of one line per file, ``<file sha256>  <file name>`` ending
in a newline, sorted by file name: exactly what ``sha256sum corpus.jsonl ground_truth.jsonl … |
sha256sum`` prints for the same files listed in name order, so it can be checked by hand. File
names, not paths, enter it, so the same files give the same digest wherever they live.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from kitune.data.errata import ERRATA_FILE, LOCOMO_ERRATA, errata_path_for
from kitune.data.locomo import is_locomo_path, locomo_files
from kitune.errors import DataError
from kitune.schema import Document

__all__ = [
    "DATASET_FILES",
    "DatasetChecksum",
    "dataset_checksum",
    "dataset_files",
    "document_hash",
    "file_sha256",
]

DATASET_FILES: tuple[str, ...] = (
    "corpus.jsonl",
    "documents.jsonl",
    "queries.tsv",
    "ground_truth.jsonl",
    "qrel_evidence.txt",
    "qrel_golds.txt",
    "questions.jsonl",
    ERRATA_FILE,
)
"""The file names the loaders read inside a dataset directory (those present are checksummed)."""


@dataclass(frozen=True)
class DatasetChecksum:
    """The checksum of one dataset as read."""

    sha256: str
    """The combined digest (64 hex chars; see the module docstring)."""
    files: dict[str, str]
    """File name → its SHA-256, sorted by name."""

    def to_dict(self) -> dict[str, object]:
        """``{"sha256": …, "files": {name: sha256}}``."""
        return {"sha256": self.sha256, "files": dict(self.files)}


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes (read in 1 MiB blocks), as 64 hex characters."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def document_hash(doc: Document) -> str:
    """32 hex characters of SHA-256 over the title, a ``0x1f`` separator and the text.

    What "unchanged" means for one document: the extraction resume file
    (:mod:`kitune.service.pipelines.extraction`) and the extraction cache
    (:mod:`kitune.optimizers.extraction_cache`) both key on it, so they agree on an edit.
    """
    h = hashlib.sha256()
    h.update((doc.title or "").encode("utf-8"))
    h.update(b"\x1f")
    h.update(doc.text.encode("utf-8"))
    return h.hexdigest()[:32]


def _read_files(p: Path) -> list[Path]:
    if is_locomo_path(p):
        return locomo_files(p)
    if p.is_dir():
        return [p / name for name in DATASET_FILES if name != ERRATA_FILE and (p / name).is_file()]
    return [p]


def dataset_files(
    path: Path | str, *, questions_path: Path | str | None = None, errata: Path | str | None = None
) -> list[Path]:
    """The files a load of ``path`` (and ``questions_path``, ``errata``) reads, without duplicates.

    Mirrors :func:`kitune.data.loaders.load_dataset`: the data files of ``path``, those of
    ``questions_path`` when given, and the errata overlay that load applies (``errata`` when
    given, else the one beside the questions by convention).

    Args:
        path: a dataset directory, a corpus or questions JSONL file, or LoCoMo as published.
        questions_path: a questions file read instead of the directory's.
        errata: an explicit errata overlay.

    Raises:
        DataError: ``path`` or ``questions_path`` does not exist.
    """
    p = Path(path)
    q = Path(questions_path) if questions_path is not None else p
    for must in (p, q):
        if not must.exists():
            raise DataError(f"data path {must} does not exist: nothing to checksum", path=str(must))
    files = _read_files(p) + (_read_files(q) if q != p else [])
    overlay = Path(errata) if errata is not None else errata_path_for(q)
    if overlay is None and errata is None and _is_locomo_data(q):
        overlay = LOCOMO_ERRATA  # the overlay the load applies to LoCoMo questions (kitune.data.errata)
    if overlay is not None:
        files.append(overlay)
    return list(dict.fromkeys(f.resolve() for f in files))


def _is_locomo_data(path: Path) -> bool:
    """LoCoMo as published, or a directory/JSONL whose first question record says ``dataset: locomo``."""
    if is_locomo_path(path):
        return True
    first = path / "ground_truth.jsonl" if path.is_dir() else path
    if not first.is_file() or first.suffix != ".jsonl":
        return False
    with first.open(encoding="utf-8", errors="replace") as fh:
        line = fh.readline()
    return '"dataset": "locomo"' in line


def dataset_checksum(
    path: Path | str, *, questions_path: Path | str | None = None, errata: Path | str | None = None
) -> DatasetChecksum:
    """SHA-256 of the files :func:`dataset_files` names (see the module docstring for the formula).

    Raises:
        DataError: ``path`` does not exist, or two files read share a name.
    """
    files = dataset_files(path, questions_path=questions_path, errata=errata)
    digests: dict[str, str] = {}
    for f in files:
        if f.name in digests:
            raise DataError(
                f"two dataset files are both named {f.name!r}: rename one so the checksum names each once",
                path=str(f),
            )
        digests[f.name] = file_sha256(f)
    ordered = dict(sorted(digests.items()))
    listing = "".join(f"{digest}  {name}\n" for name, digest in ordered.items())
    return DatasetChecksum(sha256=hashlib.sha256(listing.encode("utf-8")).hexdigest(), files=ordered)
