"""Production traces as tuning material: ``kitune traces import`` and the resumable ``kitune loop``.

Layout under ``<workdir>/traces/<name>/`` (one folder per trace source, ``name`` defaults to
``default``):

* ``questions.jsonl`` — tuning questions in the plain-JSONL format
  :func:`kitune.data.loaders.load_questions` reads (``query_id``, ``query``, ``answer``,
  ``aliases``, ``evidence_docids``, ``gold_docids``), one per distinct question, first trace wins;
* ``traces.jsonl`` — one kitune :class:`~kitune.evaluation.metrics.Trace` per imported
  production trace (skill ``production``); ``kitune report`` reads the latest per question;
* ``state.json`` — imported trace ids (the source's id, or a content hash) with their question
  id and label, files seen (size, mtime), trace ids consumed by finished loop rounds, the
  rounds and the pending one;
* ``rounds/<k>/`` — round *k*'s dataset snapshot: ``questions.jsonl`` plus ``corpus.jsonl``
  (a symlink to the corpus), so an interrupted round resumes on exactly its questions.

Gold rules: a trace with a gold answer gives a question with that answer; a trace labelled
correct without a gold answer gives a question whose answer is the agent's answer (production
judged it right); a trace labelled incorrect (or unlabelled) without a gold answer gives no
question — there is nothing to grade against — and is counted ``without_gold``. Question ids:
the source's ``query_id`` when it names one, else ``q-`` + 12 hex of the SHA-256 of the
whitespace-normalised, lower-cased question. Evidence documents: those the trace names, else
(``seen_as_evidence``) the corpus documents the production agent retrieved.

The loop that consumes them is :mod:`kitune.service.workflows.watch`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kitune.config import KituneConfig
from kitune.data.loaders import Question, SkippedLine, load_questions
from kitune.data.trace_formats import (
    ProductionTrace,
    detect_format,
    parse_mlflow_trace,
    parse_openai_record,
)
from kitune.errors import DataError, KituneError
from kitune.evaluation.metrics import Trace, evidence_recall
from kitune.ki import utcnow
from kitune.text import exact_match, token_f1

__all__ = [
    "SKILL",
    "ImportReport",
    "TraceFolder",
    "changed_files",
    "import_traces",
    "question_id",
    "read_trace_file",
    "to_question",
    "to_trace",
    "write_atomic",
]

SKILL = "production"
"""The ``skill`` of imported kitune traces."""
STATE_VERSION = 1


@dataclass(frozen=True)
class TraceFolder:
    """Paths of one trace source's folder ``<workdir>/traces/<name>``."""

    root: Path

    @classmethod
    def of(cls, cfg: KituneConfig, name: str) -> TraceFolder:
        """The folder for ``name`` (letters, digits, ``._-``).

        Raises:
            DataError: ``name`` has other characters.
        """
        if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
            raise DataError(f"trace source name {name!r}: use letters, digits, '.', '_' or '-'")
        return cls(Path(cfg.workdir) / "traces" / name)

    @property
    def questions(self) -> Path:
        """``questions.jsonl``: the accumulated tuning questions."""
        return self.root / "questions.jsonl"

    @property
    def traces(self) -> Path:
        """``traces.jsonl``: one kitune trace per imported production trace."""
        return self.root / "traces.jsonl"

    @property
    def state(self) -> Path:
        """``state.json``."""
        return self.root / "state.json"

    def round_dir(self, k: int) -> Path:
        """Round ``k``'s dataset snapshot folder."""
        return self.root / "rounds" / f"{k:03d}"

    def read_state(self) -> dict[str, Any]:
        """The state (an empty one when the folder is new).

        Raises:
            DataError: ``state.json`` is not valid JSON.
        """
        if not self.state.is_file():
            return {
                "version": STATE_VERSION,
                "traces": {},
                "files": {},
                "consumed": [],
                "rounds": [],
                "pending": None,
            }
        try:
            return dict(json.loads(self.state.read_text(encoding="utf-8")))
        except json.JSONDecodeError as e:
            raise DataError(
                f"{self.state} is not valid JSON ({e}): restore or delete it", path=str(self.state)
            ) from e

    def write_state(self, state: dict[str, Any]) -> None:
        """Write ``state.json`` atomically (temp file + rename)."""
        write_atomic(self.state, json.dumps(state, indent=1, sort_keys=True))

    @contextlib.contextmanager
    def lock(self, kind: str = "state") -> Iterator[None]:
        """Hold ``.<kind>.lock`` exclusively.

        ``state`` guards a read-modify-write of the state (waits for the holder); ``loop`` a
        whole loop round (fails at once when another process holds it).

        Raises:
            KituneError: ``kind="loop"`` and another ``kitune loop`` is running on this folder.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f".{kind}.lock", "w", encoding="utf-8") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | (fcntl.LOCK_NB if kind == "loop" else 0))
            except BlockingIOError as e:
                raise KituneError(
                    f"another kitune loop is running on {self.root}: let it finish (or stop it) first"
                ) from e
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file and a rename (never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _records(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    """``(line, record, error)`` per record of a JSON document or a JSON-lines file.

    A file that parses as one JSON document (an object, a list, ``{"traces": [...]}``) is
    that; anything else is read as JSON lines, whatever the suffix.
    """
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None  # JSON lines (or a half-written file): parse line by line below
    if isinstance(data, list | dict):
        items = data if isinstance(data, list) else data.get("traces", [data])
        for i, item in enumerate(items if isinstance(items, list) else [items], start=1):
            yield i, item, None
        return
    lines = text.split("\n")
    last = max((i for i, ln in enumerate(lines) if ln.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            yield i + 1, json.loads(line), None
        except json.JSONDecodeError as e:
            # Only a last line without its newline can still be being written; a complete line
            # that is not JSON is bad input, named as such.
            why = (
                "incomplete last line (read again when the file changes)"
                if i == last == len(lines) - 1
                else f"invalid JSON: {e.msg}"
            )
            yield i + 1, None, why


def read_trace_file(
    path: Path | str, *, label_name: str | None = None
) -> tuple[list[ProductionTrace], list[SkippedLine]]:
    """Parse every record of a trace file; the format is detected per record.

    Args:
        path: ``.jsonl`` (one conversation / trace / search_traces row per line) or ``.json``
            (one MLflow trace, a list of them, or ``{"traces": [...]}``).
        label_name: MLflow feedback name holding the correct/incorrect label (default: see
            :data:`~kitune.data.trace_formats.LABEL_NAMES`).

    Returns:
        ``(traces, skipped)``: records that are not JSON, of no known format or without a
        question are skipped with their 1-based line (item) number and the reason.

    Raises:
        DataError: the file does not exist.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"no trace file at {p}: pass a .jsonl or .json file", path=str(p))
    out: list[ProductionTrace] = []
    skipped: list[SkippedLine] = []
    for line, record, error in _records(p):
        if error is not None or not isinstance(record, dict):
            skipped.append(SkippedLine(str(p), line, error or "not a JSON object"))
            continue
        fmt = detect_format(record)
        try:
            if fmt == "openai":
                out.append(parse_openai_record(record))
            elif fmt == "mlflow":
                out.append(parse_mlflow_trace(record, label_name=label_name))
            else:
                skipped.append(SkippedLine(str(p), line, "neither chat messages nor an MLflow trace"))
        except (ValueError, KeyError, TypeError) as e:
            skipped.append(SkippedLine(str(p), line, f"{fmt} record: {e}"))
    return out, skipped


def question_id(pt: ProductionTrace) -> str:
    """The source's ``query_id``, else ``q-`` + 12 hex of the normalised question's SHA-256."""
    if pt.query_id:
        return pt.query_id
    norm = " ".join(pt.question.lower().split())
    return "q-" + hashlib.sha256(norm.encode("utf-8")).hexdigest()[:12]


def to_question(
    pt: ProductionTrace, *, corpus_ids: set[str] | None = None, seen_as_evidence: bool = True
) -> Question | None:
    """The tuning question a trace gives (module docstring, "Gold rules"), or None.

    Args:
        pt: the production trace.
        corpus_ids: known doc ids; evidence ids outside it are dropped (None: keep all).
        seen_as_evidence: with no evidence ids named, use the documents the agent retrieved.
    """
    if pt.gold_answer:
        answer, aliases = pt.gold_answer, pt.aliases
    elif pt.correct is True and pt.final_answer:
        answer, aliases = pt.final_answer, pt.aliases
    else:
        return None
    evidence = pt.evidence_docids or (pt.doc_ids_seen if seen_as_evidence else ())

    def keep(ids: Sequence[str]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d for d in ids if corpus_ids is None or d in corpus_ids))

    return Question(
        query_id=question_id(pt),
        query=pt.question,
        answer=answer,
        aliases=tuple(a for a in aliases if a != answer),
        evidence_docids=keep(evidence),
        gold_docids=keep(pt.gold_docids),
        dataset=f"production-{pt.fmt}",
    )


def to_trace(pt: ProductionTrace) -> Trace:
    """A kitune trace record (skill ``production``): the label is the verdict, else exact match."""
    golds = [g for g in (pt.gold_answer or (pt.final_answer if pt.correct else None), *pt.aliases) if g]
    graded = pt.correct is not None and pt.status != "failed"
    tool_calls: dict[str, int] = {}
    for s in pt.steps:
        if s.get("tool"):
            tool_calls[s["tool"]] = tool_calls.get(s["tool"], 0) + 1
    return Trace(
        query_id=question_id(pt),
        skill=SKILL,
        question=pt.question,
        gold_answer=pt.gold_answer or "",
        aliases=list(pt.aliases),
        status=pt.status,
        exact_answer=pt.final_answer,
        judge_correct=pt.correct if graded else None,
        judge_status="graded" if graded else "not_run",
        em=bool(golds) and bool(pt.final_answer) and exact_match(pt.final_answer, golds),
        f1=token_f1(pt.final_answer, golds) if golds and pt.final_answer else 0.0,
        input_tokens=pt.input_tokens,
        output_tokens=pt.output_tokens,
        steps=list(pt.steps),
        n_steps=len(pt.steps),
        tool_calls=tool_calls,
        doc_ids_seen=list(pt.doc_ids_seen),
        evidence_docids=list(pt.evidence_docids),
        evidence_recall=evidence_recall(pt.doc_ids_seen, pt.evidence_docids),
        errors=list(pt.errors),
        failure=(pt.errors[0] if pt.errors else "the production run failed")
        if pt.status == "failed"
        else None,
    )


@dataclass
class ImportReport:
    """What one import did."""

    files: list[str] = field(default_factory=list)
    read: int = 0
    """Records parsed."""
    new: int = 0
    """Traces not imported before (by trace id)."""
    duplicates: int = 0
    questions_added: int = 0
    without_gold: int = 0
    """New traces that gave no question (incorrect or unlabelled, and no gold answer)."""
    conflicts: list[str] = field(default_factory=list)
    """Question ids that arrived again with a different gold answer (the first is kept)."""
    skipped: list[SkippedLine] = field(default_factory=list)


def _file_key(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def changed_files(folder: TraceFolder, paths: Sequence[Path]) -> list[Path]:
    """The ``paths`` whose size or mtime differ from what ``state.json`` recorded at import."""
    seen = folder.read_state().get("files", {})
    return [p for p in paths if seen.get(str(p.resolve())) != _file_key(p)]


def import_traces(
    cfg: KituneConfig,
    paths: Sequence[Path | str],
    *,
    name: str = "default",
    label_name: str | None = None,
    seen_as_evidence: bool = True,
) -> ImportReport:
    """Import trace files into ``<workdir>/traces/<name>`` (module docstring); idempotent.

    Raises:
        DataError: a file is missing or the state is corrupt.
    """
    folder = TraceFolder.of(cfg, name)
    with folder.lock("state"):
        state = folder.read_state()
        known: dict[str, Any] = state.setdefault("traces", {})
        questions = (
            {q.query_id: q for q in load_questions(folder.questions)} if folder.questions.is_file() else {}
        )
        report = ImportReport()
        new_q: list[Question] = []
        new_t: list[Trace] = []
        for raw in paths:
            path = Path(raw)
            traces, skipped = read_trace_file(path, label_name=label_name)
            report.files.append(str(path))
            report.read += len(traces)
            report.skipped.extend(skipped)
            for pt in traces:
                if pt.trace_id in known:
                    report.duplicates += 1
                    continue
                report.new += 1
                q = to_question(pt, seen_as_evidence=seen_as_evidence)
                known[pt.trace_id] = {
                    "query_id": question_id(pt),
                    "file": str(path),
                    "imported_at": utcnow().isoformat(),
                    "correct": pt.correct,
                }
                new_t.append(to_trace(pt))
                if q is None:
                    report.without_gold += 1
                elif q.query_id in questions:
                    if questions[q.query_id].answer != q.answer:
                        report.conflicts.append(q.query_id)
                else:
                    questions[q.query_id] = q
                    new_q.append(q)
            if not any(s.reason.startswith("incomplete last line") for s in skipped):
                state.setdefault("files", {})[str(path.resolve())] = _file_key(path)
        report.questions_added = len(new_q)
        folder.root.mkdir(parents=True, exist_ok=True)
        with folder.traces.open("a", encoding="utf-8") as fh:
            fh.writelines(t.to_json() + "\n" for t in new_t)
        with folder.questions.open("a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(q.to_dict(), ensure_ascii=False) + "\n" for q in new_q)
        folder.write_state(state)
        return report
