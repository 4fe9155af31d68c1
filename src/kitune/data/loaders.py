"""Dataset loaders: corpora and questions from the BrowseComp-Plus layout, plain JSONL or LoCoMo.

Three layouts are read:

* **BrowseComp-Plus layout** (a directory, as in ``shared/data/fixture``): ``corpus.jsonl``
  (``{"docid", "title", "text", "source"?, "url"?}``), ``queries.tsv`` (``query_id<TAB>query``),
  ``ground_truth.jsonl`` (``{"query_id", "query"?, "answer", "answer_aliases"?, "dataset"?,
  "hops"?}``), ``qrel_evidence.txt`` and ``qrel_golds.txt`` (TREC qrels ``qid Q0 docid rel``).
* **Plain JSONL**: a documents file (one document per line; ``docid``/``id``/``doc_id`` and
  ``text``/``contents``) and a questions file (one question per line with ``query_id``/``id``,
  ``query``/``question``, ``answer`` and optionally ``aliases``/``answer_aliases``,
  ``evidence_docids``, ``gold_docids``, ``dataset``, ``hops``, ``category``,
  ``evidence_turns``/``evidence_dia_ids``). A directory holding
  ``documents.jsonl`` + ``questions.jsonl`` is read the same way. Record fields:
  :mod:`kitune.data.questions` (an answerless adversarial record is an abstention question).
* **LoCoMo as published**: ``locomo10.json``, one conversation's ``.json``, or a directory of
  them (no ``corpus.jsonl`` beside), mapped to the same documents and questions as
  ``shared/data/locomo`` by :mod:`kitune.data.locomo` (category 5 kept as abstention questions).

Questions get an errata overlay applied when one is given or sits beside the data
(:mod:`kitune.data.errata`; counted and logged).

Errors: a missing file, an invalid question line, a duplicate id, a qrel naming an unknown
document or question, or a question without an answer raises :class:`kitune.errors.DataError`
naming the file and 1-based line. An invalid *corpus* line is skipped and reported in a
:class:`LoadReport` instead (one bad page should not sink a 100k-document corpus).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from kitune.data.bundled import missing_data_message
from kitune.data.errata import ErrataReport, apply_errata, errata_path_for, load_errata, packaged_errata_for
from kitune.data.locomo import is_locomo_path, read_locomo
from kitune.data.questions import Question, first_field, question_from_record
from kitune.errors import DataError
from kitune.schema import Document

__all__ = [
    "CORPUS_FILE",
    "Dataset",
    "LoadReport",
    "Question",
    "SkippedLine",
    "iter_lines",
    "load_corpus",
    "load_corpus_with_report",
    "load_dataset",
    "load_questions",
    "load_questions_and_errata",
    "load_questions_with_errata",
]

logger = logging.getLogger(__name__)

CORPUS_FILE = "corpus.jsonl"
_QUERIES = "queries.tsv"
_GROUND_TRUTH = "ground_truth.jsonl"
_QREL_EVIDENCE = "qrel_evidence.txt"
_QREL_GOLDS = "qrel_golds.txt"
_PLAIN_DOCS = "documents.jsonl"
_PLAIN_QUESTIONS = "questions.jsonl"

_ID_KEYS = ("docid", "doc_id", "id")
_TEXT_KEYS = ("text", "contents", "content")


@dataclass(frozen=True)
class SkippedLine:
    """One input line that was skipped."""

    path: str
    line: int
    """1-based line number."""
    reason: str


@dataclass(frozen=True)
class LoadReport:
    """What a corpus load read and skipped."""

    path: str
    loaded: int
    """Documents returned."""
    skipped: tuple[SkippedLine, ...] = ()

    @property
    def n_skipped(self) -> int:
        """Number of skipped lines."""
        return len(self.skipped)


@dataclass(frozen=True)
class Dataset:
    """A corpus plus its questions, qrels validated against the corpus."""

    documents: list[Document]
    questions: list[Question]
    report: LoadReport
    root: Path = field(default_factory=Path)


def json_error_text(e: json.JSONDecodeError) -> str:
    """``e`` as "<what> at column <n>" (json's own messages may end in "at": no "at at column")."""
    what = e.msg[: -len(" at")] if e.msg.endswith(" at") else e.msg
    return f"{what} at column {e.colno}"


def _require_file(path: Path, what: str, fix: str) -> None:
    if not path.is_file():
        raise DataError(f"{what} {path} does not exist: {fix}", path=str(path))


def iter_lines(path: Path, skipped: list[SkippedLine] | None = None) -> Iterator[tuple[int, str]]:
    """Yield ``(1-based line number, stripped line)`` for each non-blank line.

    Lines are decoded one by one, so one line of non-UTF-8 bytes is reported with its number:
    appended to ``skipped`` when given, else raised as :class:`DataError`.
    """
    with path.open("rb") as fh:
        for lineno, raw_bytes in enumerate(fh, start=1):
            try:
                raw = raw_bytes.decode("utf-8")
            except UnicodeDecodeError as e:
                reason = f"not valid UTF-8 ({e.reason} at byte {e.start})"
                if skipped is None:
                    raise DataError(
                        f"{path}:{lineno}: {reason}: re-encode the file as UTF-8", path=str(path), line=lineno
                    ) from e
                skipped.append(SkippedLine(str(path), lineno, reason))
                continue
            line = raw.strip()
            if line:
                yield lineno, line


def _resolve_corpus_path(path: Path) -> Path:
    if path.is_dir():
        for name in (CORPUS_FILE, _PLAIN_DOCS):
            if (path / name).is_file():
                return path / name
        raise DataError(
            f"directory {path} has no {CORPUS_FILE} or {_PLAIN_DOCS}: point at a corpus JSONL file "
            "or a directory in the BrowseComp-Plus layout",
            path=str(path),
        )
    if not path.exists():  # e.g. ../shared/data/dev in a clone that has no ../shared beside it
        raise DataError(missing_data_message(path), path=str(path))
    _require_file(path, "corpus file", "check the --data path")
    return path


def load_corpus_with_report(path: Path | str) -> tuple[list[Document], LoadReport]:
    """Read a corpus and report skipped lines.

    Args:
        path: a JSONL file (one document per line), a directory holding ``corpus.jsonl`` or
            ``documents.jsonl``, or LoCoMo as published (:mod:`kitune.data.locomo`).

    Returns:
        ``(documents, report)``: documents in file order; ``report.loaded == len(documents)``.
        Lines that are not UTF-8, not JSON objects, lack an id/text, or whose text is empty or
        whitespace are skipped and listed in ``report.skipped`` with their 1-based line numbers;
        for LoCoMo as published, every session dropped (a date but no turns) is listed there
        with line 0 and the conversation, session and date in its reason.

    Raises:
        DataError: the file is missing, or two lines share a doc id (names both lines).
    """
    if is_locomo_path(path):
        data = read_locomo(path)
        dropped = tuple(  # a session with a date but no turns is counted, never silently lost
            SkippedLine(
                str(data.files[0]),
                0,
                f"conversation {d.conversation} session {d.session}"
                f"{f' ({d.date})' if d.date else ''}: {d.reason}",
            )
            for d in data.report.dropped_sessions
        )
        return data.documents, LoadReport(
            path=str(data.files[0]), loaded=len(data.documents), skipped=dropped
        )
    file = _resolve_corpus_path(Path(path))
    docs: list[Document] = []
    skipped: list[SkippedLine] = []
    seen: dict[str, int] = {}
    for lineno, line in iter_lines(file, skipped):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            skipped.append(SkippedLine(str(file), lineno, f"invalid JSON: {json_error_text(e)}"))
            continue
        if not isinstance(record, dict):
            skipped.append(SkippedLine(str(file), lineno, f"expected an object, got {type(record).__name__}"))
            continue
        docid = first_field(record, _ID_KEYS)
        text = first_field(record, _TEXT_KEYS)
        if docid is None or str(docid).strip() == "":
            skipped.append(SkippedLine(str(file), lineno, "no docid/id field"))
            continue
        if not isinstance(text, str):
            skipped.append(SkippedLine(str(file), lineno, "no text/contents string field"))
            continue
        if not text.strip():
            skipped.append(SkippedLine(str(file), lineno, f"empty text (docid {str(docid).strip()!r})"))
            continue
        docid = str(docid).strip()
        if docid in seen:
            raise DataError(
                f"{file}:{lineno}: duplicate docid {docid!r} (first on line {seen[docid]}): "
                "doc ids must be unique; remove or renumber one of them",
                path=str(file),
                line=lineno,
            )
        seen[docid] = lineno
        known = set(_ID_KEYS) | set(_TEXT_KEYS) | {"title", "url", "source"}
        metadata = {
            k: str(v) for k, v in record.items() if k not in known and isinstance(v, str | int | float)
        }
        docs.append(
            Document(
                docid=docid,
                text=text,
                title=str(record.get("title") or ""),
                url=str(record.get("url") or ""),
                source=str(record.get("source") or ""),
                metadata=metadata,
            )
        )
    # Not logged here: the caller reports report.skipped (the CLI lists them once); load_corpus,
    # which drops the report, logs them.
    return docs, LoadReport(path=str(file), loaded=len(docs), skipped=tuple(skipped))


def load_corpus(path: Path | str) -> list[Document]:
    """Read a corpus (see :func:`load_corpus_with_report`); skipped lines are logged (warning).

    Raises:
        DataError: the file is missing or holds duplicate doc ids.
    """
    docs, report = load_corpus_with_report(path)
    for s in report.skipped:
        logger.warning("skipped %s:%d: %s", s.path, s.line, s.reason)
    return docs


def _read_qrels(
    path: Path, known_qids: Collection[str], known_docids: Collection[str] | None
) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for lineno, line in iter_lines(path):
        parts = line.split()
        if len(parts) != 4:
            raise DataError(
                f"{path}:{lineno}: expected a TREC qrel 'qid Q0 docid relevance', got {line!r}",
                path=str(path),
                line=lineno,
            )
        qid, _, docid, rel = parts
        if qid not in known_qids:
            raise DataError(
                f"{path}:{lineno}: qrel names unknown query id {qid!r}: "
                f"it is not in {_QUERIES}/{_GROUND_TRUTH}",
                path=str(path),
                line=lineno,
            )
        if known_docids is not None and docid not in known_docids:
            raise DataError(
                f"{path}:{lineno}: qrel names doc id {docid!r}, which is not in the corpus: "
                "add the document to the corpus or drop the qrel line",
                path=str(path),
                line=lineno,
            )
        try:
            relevant = float(rel) > 0
        except ValueError as e:
            raise DataError(
                f"{path}:{lineno}: relevance {rel!r} is not a number", path=str(path), line=lineno
            ) from e
        if relevant and docid not in out.setdefault(qid, []):
            out[qid].append(docid)
    return out


def _read_question_records(path: Path, *, require_query: bool = True) -> list[Question]:
    # require_query=False only for BrowseComp's ground_truth.jsonl, whose text may come from queries.tsv.
    questions: list[Question] = []
    seen: dict[str, int] = {}
    for lineno, line in iter_lines(path):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(
                f"{path}:{lineno}: invalid JSON ({json_error_text(e)}): fix or remove the line",
                path=str(path),
                line=lineno,
            ) from e
        if not isinstance(record, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object", path=str(path), line=lineno)
        q = question_from_record(record, path, lineno)
        if require_query and not q.query.strip():
            # A blank question would still be sent to the agent and the judge: tokens for nothing.
            raise DataError(
                f"{path}:{lineno}: question {q.query_id!r} has no question text: give it a non-empty "
                "'query' (or 'question') field, or remove the line",
                path=str(path),
                line=lineno,
            )
        if q.query_id in seen:
            raise DataError(
                f"{path}:{lineno}: duplicate query_id {q.query_id!r} (first on line {seen[q.query_id]})",
                path=str(path),
                line=lineno,
            )
        seen[q.query_id] = lineno
        questions.append(q)
    return questions


def _read_corpus_ids(path: Path) -> set[str] | None:
    try:
        file = _resolve_corpus_path(path)
    except DataError:
        return None
    docs, _ = load_corpus_with_report(file)
    return {d.docid for d in docs}


def _load_browsecomp(root: Path, doc_ids: Collection[str] | None) -> list[Question]:
    gt_path = root / _GROUND_TRUTH
    _require_file(gt_path, "ground-truth file", f"a BrowseComp-Plus directory needs {_GROUND_TRUTH}")
    truth = {q.query_id: q for q in _read_question_records(gt_path, require_query=False)}
    queries_path = root / _QUERIES
    order: list[str]
    texts: dict[str, str] = {}
    if queries_path.is_file():
        order = []
        for lineno, line in iter_lines(queries_path):
            qid, sep, text = line.partition("\t")
            if not sep:
                raise DataError(
                    f"{queries_path}:{lineno}: expected 'query_id<TAB>query'",
                    path=str(queries_path),
                    line=lineno,
                )
            qid = qid.strip()
            if qid in texts:
                raise DataError(
                    f"{queries_path}:{lineno}: duplicate query_id {qid!r}",
                    path=str(queries_path),
                    line=lineno,
                )
            if qid not in truth:
                raise DataError(
                    f"{queries_path}:{lineno}: question {qid!r} has no answer in {gt_path}: add its "
                    "ground-truth line or drop the query",
                    path=str(queries_path),
                    line=lineno,
                )
            texts[qid] = text.strip()
            order.append(qid)
    else:
        order = list(truth)
    known = set(order)
    evidence: dict[str, list[str]] = {}
    golds: dict[str, list[str]] = {}
    if (root / _QREL_EVIDENCE).is_file():
        evidence = _read_qrels(root / _QREL_EVIDENCE, known, doc_ids)
    if (root / _QREL_GOLDS).is_file():
        golds = _read_qrels(root / _QREL_GOLDS, known, doc_ids)
    out: list[Question] = []
    for qid in order:
        q = truth[qid]
        query = texts.get(qid) or q.query
        if not query.strip():
            raise DataError(
                f"question {qid!r} has no query text in {queries_path} or {gt_path}", path=str(gt_path)
            )
        out.append(
            replace(
                q,
                query=query,
                evidence_docids=tuple(evidence.get(qid, q.evidence_docids)),
                gold_docids=tuple(golds.get(qid, q.gold_docids)),
            )
        )
    return out


def _check_doc_refs(questions: list[Question], doc_ids: Collection[str] | None, path: Path) -> None:
    if doc_ids is None:
        return
    for q in questions:
        for d in (*q.evidence_docids, *q.gold_docids):
            if d not in doc_ids:
                raise DataError(
                    f"{path}: question {q.query_id!r} cites doc id {d!r}, which is not in the corpus",
                    path=str(path),
                )


def load_questions(
    path: Path | str,
    *,
    doc_ids: Collection[str] | None = None,
    errata: Path | str | None = None,
) -> list[Question]:
    """Read evaluation questions, with an errata overlay applied when there is one.

    Args:
        path: a BrowseComp-Plus directory (``ground_truth.jsonl`` [+ ``queries.tsv`` + qrels]),
            a directory with ``questions.jsonl``, a questions JSONL file, or LoCoMo as published.
        doc_ids: known corpus doc ids to validate qrels against. None: read them from the
            directory's corpus file when there is one, else skip the check.
        errata: an overlay file (:mod:`kitune.data.errata`); None: the one beside ``path`` by
            convention (:func:`kitune.data.errata.errata_path_for`), else for LoCoMo questions
            the shipped overlay (:data:`kitune.data.errata.LOCOMO_ERRATA`).

    Returns:
        Questions in file order (``queries.tsv`` order when present); query ids unique.

    Raises:
        DataError: missing file, invalid JSON line, duplicate query id, a question without an
            answer (an answerless adversarial one is an abstention question) or without question
            text, a qrel/evidence doc id not in the corpus (message names file and line), or an
            invalid errata file.
    """
    return load_questions_and_errata(path, doc_ids=doc_ids, errata=errata)[0]


def load_questions_and_errata(
    path: Path | str,
    *,
    doc_ids: Collection[str] | None = None,
    errata: Path | str | None = None,
) -> tuple[list[Question], ErrataReport | None]:
    """:func:`load_questions`, plus what the errata overlay changed (None when there is none).

    The report's ``published`` holds the corrected questions as published, so a run can score
    both labels (``kitune eval`` writes both to ``scores.json``).

    Raises:
        DataError: as :func:`load_questions`.
    """
    questions = _load_questions(Path(path), doc_ids)
    return load_questions_with_errata(questions, path, errata)


def load_questions_with_errata(
    questions: list[Question], path: Path | str, errata: Path | str | None = None
) -> tuple[list[Question], ErrataReport | None]:
    """Apply the errata overlay for ``path`` (``errata`` when given) to ``questions``.

    Returns:
        ``(questions, report)``; ``report`` is None when there is no overlay.

    Raises:
        DataError: the overlay file is invalid (:func:`kitune.data.errata.load_errata`).
    """
    overlay = Path(errata) if errata is not None else errata_path_for(path) or packaged_errata_for(questions)
    if overlay is None:
        return questions, None
    return apply_errata(questions, load_errata(overlay), path=overlay)


def _read_locomo_questions(path: Path) -> list[Question]:
    data = read_locomo(path)
    out: list[Question] = []
    seen: set[str] = set()
    for n, record in enumerate(data.records, start=1):
        q = question_from_record(record, data.files[0], n)
        if q.query_id in seen:  # pragma: no cover - read_locomo refuses a conversation twice
            raise DataError(f"{path}: duplicate query_id {q.query_id!r}", path=str(path))
        seen.add(q.query_id)
        out.append(q)
    return out


def _load_questions(p: Path, doc_ids: Collection[str] | None) -> list[Question]:
    if is_locomo_path(p):
        return _read_locomo_questions(p)
    if p.is_dir():
        if doc_ids is None:
            doc_ids = _read_corpus_ids(p)
        if (p / _GROUND_TRUTH).is_file() or (p / _QUERIES).is_file():
            return _load_browsecomp(p, doc_ids)
        if (p / _PLAIN_QUESTIONS).is_file():
            qs = _read_question_records(p / _PLAIN_QUESTIONS)
            _check_doc_refs(qs, doc_ids, p / _PLAIN_QUESTIONS)
            return qs
        raise DataError(
            f"directory {p} has neither {_GROUND_TRUTH} (BrowseComp-Plus layout) nor {_PLAIN_QUESTIONS}: "
            "point --data at a dataset directory",
            path=str(p),
        )
    _require_file(p, "questions file", "check the path")
    qs = _read_question_records(p)
    _check_doc_refs(qs, doc_ids, p)
    return qs


def load_dataset(
    path: Path | str, *, questions_path: Path | str | None = None, errata: Path | str | None = None
) -> Dataset:
    """Read a corpus and its questions together, validating qrels against the corpus.

    Args:
        path: a dataset directory, LoCoMo as published, or a documents JSONL file (then
            ``questions_path`` is required).
        questions_path: a questions JSONL file overriding the directory's questions.
        errata: an errata overlay (None: the one beside the questions by convention, if any).

    Returns:
        A :class:`Dataset`; ``report`` lists skipped corpus lines.

    Raises:
        DataError: as :func:`load_corpus_with_report` and :func:`load_questions`.
    """
    p = Path(path)
    docs, report = load_corpus_with_report(p)
    ids = {d.docid for d in docs}
    if questions_path is None:
        if not p.is_dir() and not is_locomo_path(p):
            raise DataError(f"{p} is a documents file: pass the questions file too", path=str(p))
        questions = load_questions(p, doc_ids=ids, errata=errata)
    else:
        questions = load_questions(questions_path, doc_ids=ids, errata=errata)
    return Dataset(documents=docs, questions=questions, report=report, root=p if p.is_dir() else p.parent)
