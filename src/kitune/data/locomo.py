"""LoCoMo as published: the conversations and QA of ``locomo10.json`` read directly.

LoCoMo (Maharana et al., ACL 2024; ``snap-research/locomo``) ships each conversation as one JSON
object::

    {"sample_id": "conv-26",
     "conversation": {"speaker_a": "Caroline", "speaker_b": "Melanie",
                      "session_1_date_time": "1:56 pm on 8 May, 2023",
                      "session_1": [{"speaker": "Caroline", "dia_id": "D1:1", "text": "...",
                                     "img_url": [...], "blip_caption": "a photo of ..."}, ...], ...},
     "qa": [{"question": "...", "answer": "7 May 2023", "evidence": ["D1:3"], "category": 2},
            {"question": "...", "adversarial_answer": "...", "evidence": ["D2:3"], "category": 5}],
     "observation": {...}, "session_summary": {...}, "event_summary": {...}}

``locomo10.json`` is a list of ten such objects; the repository's ``data/locomo10.zip`` holds one
file per conversation (``26.json`` …) with the conversation keys at the top level instead of under
``"conversation"``. Both shapes are read (:func:`read_locomo`), from a file or from a directory of
per-conversation files.

They map to the BrowseComp-Plus layout exactly as ``shared/data/locomo`` does (its README):

* one document per session: ``docid`` = conversation × 1000 + session (``"26001"``), title
  ``"Caroline and Melanie — session 1"``, source ``"locomo-26"``, ``metadata["date"]`` the
  session's ``date_time``, and text = a header line ``Conversation between Caroline and Melanie,
  session 1 (1:56 pm on 8 May, 2023)`` then one ``[D1:3] Speaker: text`` line per turn, with
  `` [shares a photo: <caption>]`` appended when the turn shared an image;
* one question per QA item, in file order: ``query_id`` = ``"26-001"``, the conversation and
  the item's 1-based position among the conversation's category 1–4 items (so ids and
  ``orig_id`` = ``"locomo10/26/1"`` are the ones ``shared/data/locomo`` uses, which leaves category
  5 out), and ``"26-a001"`` (``orig_id`` ``"locomo10/26/adversarial/1"``) … for category 5 items,
  numbered apart; ``category`` from :data:`LOCOMO_CATEGORIES` (1 multi-hop, 2 temporal,
  3 open-domain, 4 single-hop, 5 adversarial), numeric answers as text (``2022`` → ``"2022"``),
  ``evidence_turns`` the ``evidence`` strings as given and ``evidence_docids`` the sessions they
  name, in session order (``"D8:6; D9:17"`` → 26008, 26009; the malformed ``"D:11:26"`` →
  26011; ``"D"`` → none).

Category 5 (adversarial: the conversation never says; items carry ``adversarial_answer``, the
tempting wrong answer, and usually no ``answer``) is kept as an **abstention question**
(``Question.abstention``): its gold answer is :data:`ABSTENTION_ANSWER` with the aliases
:data:`ABSTENTION_ALIASES` (the phrases LoCoMo's own scorer accepts for category 5), whatever
``answer`` the item has. Published memory-system evaluations leave category 5 out, and so does a
run's headline score by default: :func:`kitune.evaluation.summary.summarize` scores these
questions apart (``abstention_*`` fields) and counts them in the headline only with
``include_adversarial=True`` (``grading.include_adversarial``). The JSONL layout
(``shared/data/locomo``) is read the same way (:mod:`kitune.data.questions`).

**The load report** (:attr:`LocomoData.report`, logged): conversations, sessions kept, and every
session *dropped* — a session with a date (``session_N_date_time``) but no turns (the key missing,
or an empty list), or with turns of which none is a turn object — named with its conversation,
number, date and reason; questions per category.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kitune.errors import DataError
from kitune.schema import Document

__all__ = [
    "ABSTENTION_ALIASES",
    "ABSTENTION_ANSWER",
    "LOCOMO_CATEGORIES",
    "DroppedSession",
    "LocomoData",
    "LocomoLoadReport",
    "is_locomo_path",
    "locomo_files",
    "read_locomo",
]

LOCOMO_CATEGORIES: dict[int, str] = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}
"""LoCoMo's integer ``category`` → the name ``shared/data/locomo`` uses."""

ABSTENTION_ANSWER = "Not mentioned in the conversation"
"""The gold answer of an abstention question: the conversation does not say."""

ABSTENTION_ALIASES: tuple[str, ...] = ("No information available", "Not mentioned")
"""Other accepted abstentions: the phrases LoCoMo's scorer (``task_eval/evaluation.py``) accepts."""

logger = logging.getLogger(__name__)

_SESSION_KEY = re.compile(r"^session_(\d+)$")
_DATE_KEY = re.compile(r"^session_(\d+)_date_time$")
_EVIDENCE_SESSION = re.compile(r"D:?(\d+):\d+")
_SAMPLE_NUMBER = re.compile(r"(\d+)$")


@dataclass(frozen=True)
class DroppedSession:
    """A session that became no document."""

    conversation: str
    session: int
    date: str
    """Its ``session_N_date_time`` ("" when it has none)."""
    reason: str
    """``no turns`` (the session key is missing or an empty list) or ``no turn objects``."""


@dataclass(frozen=True)
class LocomoLoadReport:
    """What a LoCoMo load kept and dropped."""

    conversations: int = 0
    sessions: int = 0
    """Sessions kept (one document each)."""
    dropped_sessions: tuple[DroppedSession, ...] = ()
    """Every session dropped, in conversation and session order."""
    questions: dict[str, int] = field(default_factory=dict)
    """Category → questions read (``adversarial`` included)."""

    def summary(self) -> str:
        """One line: conversations, sessions kept and dropped, questions per category."""
        dropped = ", ".join(f"{d.conversation}/{d.session} ({d.reason})" for d in self.dropped_sessions)
        cats = ", ".join(f"{c} {n}" for c, n in sorted(self.questions.items()))
        return (
            f"{self.conversations} conversation(s), {self.sessions} session(s) kept, "
            f"{len(self.dropped_sessions)} dropped{f' [{dropped}]' if dropped else ''}; questions: {cats}"
        )


@dataclass(frozen=True)
class LocomoData:
    """What :func:`read_locomo` read."""

    documents: list[Document]
    """One per non-empty session, conversation by conversation, sessions in number order."""
    records: list[dict[str, Any]]
    """One question record per QA item, in the plain-JSONL question shape
    (:mod:`kitune.data.loaders`); adversarial items have ``"abstention": true``."""
    files: list[Path] = field(default_factory=list)
    """The files read, in order (what the dataset checksum covers)."""
    report: LocomoLoadReport = field(default_factory=LocomoLoadReport)
    """Sessions kept and dropped, questions per category (see the module docstring)."""


def _load_json(path: Path) -> Any:
    try:
        with path.open(encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(
            f"{path}: cannot read it as JSON ({e}): is it LoCoMo's locomo10.json?", path=str(path)
        ) from e


def _is_sample(value: Any) -> bool:
    if not isinstance(value, dict) or "qa" not in value:
        return False
    conv = value.get("conversation", value)
    return isinstance(conv, dict) and "speaker_a" in conv


def _looks_like_locomo_file(path: Path) -> bool:
    """Cheap sniff: a ``.json`` file whose first 64 KiB mention ``speaker_a`` and ``"qa"``."""
    if path.suffix.lower() != ".json" or not path.is_file():
        return False
    with path.open("rb") as fh:
        head = fh.read(65536)
    return b'"speaker_a"' in head or (b'"qa"' in head and b'"conversation"' in head)


def locomo_files(path: Path | str) -> list[Path]:
    """The LoCoMo JSON files ``path`` names: itself, or a directory's ``locomo10.json`` or ``*.json`` samples.

    Returns:
        Files in name order; ``[]`` when ``path`` holds no LoCoMo file.
    """
    p = Path(path)
    if p.is_file():
        return [p] if _looks_like_locomo_file(p) else []
    if not p.is_dir():
        return []
    if (p / "locomo10.json").is_file():
        return [p / "locomo10.json"]
    return sorted(f for f in p.glob("*.json") if _looks_like_locomo_file(f))


def is_locomo_path(path: Path | str) -> bool:
    """True when ``path`` is a LoCoMo JSON file, or a directory of them with no ``corpus.jsonl``."""
    p = Path(path)
    if p.is_dir() and any((p / n).is_file() for n in ("corpus.jsonl", "documents.jsonl")):
        return False
    return bool(locomo_files(p))


def _samples(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(conversation id, sample)`` for each conversation in one file."""
    data = _load_json(path)
    items = data if isinstance(data, list) else [data]
    for i, sample in enumerate(items):
        if not _is_sample(sample):
            raise DataError(
                f"{path}: item {i} is not a LoCoMo conversation (needs 'qa' and 'speaker_a', at the top "
                "or under 'conversation')",
                path=str(path),
            )
        sample_id = str(sample.get("sample_id") or (path.stem if len(items) == 1 else i))
        m = _SAMPLE_NUMBER.search(sample_id)
        yield (m.group(1) if m else sample_id), sample


def _docid(conv: str, session: int) -> str:
    return str(int(conv) * 1000 + session) if conv.isdigit() else f"{conv}-{session}"


def _turn_line(turn: dict[str, Any]) -> str:
    text = str(turn.get("text") or "")  # verbatim, spaces included: evidence is quoted from it
    caption = str(turn.get("blip_caption") or "")
    if caption:
        text = f"{text} [shares a photo: {caption}]"
    return f"[{turn.get('dia_id', '')}] {turn.get('speaker', '')}: {text}"


def _documents(conv: str, sample: dict[str, Any]) -> tuple[list[Document], list[DroppedSession]]:
    c = sample.get("conversation", sample)
    a, b = str(c.get("speaker_a", "")), str(c.get("speaker_b", ""))
    bodies = {int(m.group(1)): v for k, v in c.items() if (m := _SESSION_KEY.match(k))}
    dated = {int(m.group(1)) for k in c if (m := _DATE_KEY.match(k))}
    docs = []
    dropped: list[DroppedSession] = []
    for n in sorted(set(bodies) | dated):
        turns = bodies.get(n)
        when = str(c.get(f"session_{n}_date_time") or "")
        if not isinstance(turns, list) or not turns:
            dropped.append(DroppedSession(conv, n, when, "no turns"))
            continue
        if not any(isinstance(t, dict) for t in turns):
            dropped.append(DroppedSession(conv, n, when, "no turn objects"))
            continue
        header = f"Conversation between {a} and {b}, session {n}" + (f" ({when})" if when else "")
        lines = [header, *(_turn_line(t) for t in turns if isinstance(t, dict))]
        docs.append(
            Document(
                docid=_docid(conv, n),
                title=f"{a} and {b} — session {n}",
                text="\n".join(lines),
                source=f"locomo-{conv}",
                metadata={"date": when} if when else {},
            )
        )
    return docs, dropped


def _category(item: dict[str, Any]) -> str:
    raw = item.get("category")
    try:
        return LOCOMO_CATEGORIES[int(str(raw))]
    except (ValueError, KeyError):
        return str(raw or "").strip()


def _question(conv: str, number: int, item: dict[str, Any], path: Path, position: int) -> dict[str, Any]:
    """One question record; ``number``: 1-based position among items of its kind (module docstring)."""
    if not str(item.get("question") or "").strip():
        raise DataError(
            f"{path}: conversation {conv}, qa item {position} has no question text: fix or remove the item",
            path=str(path),
        )
    category = _category(item)
    evidence = [str(e) for e in item.get("evidence") or [] if e is not None]
    sessions = sorted({int(s) for e in evidence for s in _EVIDENCE_SESSION.findall(e)})
    record: dict[str, Any] = {
        "query_id": f"{conv}-a{number:03d}" if category == "adversarial" else f"{conv}-{number:03d}",
        "orig_id": f"locomo10/{conv}/{'adversarial/' if category == 'adversarial' else ''}{number}",
        "query": str(item["question"]).strip(),
        "dataset": "locomo",
        "category": category,
        "evidence_dia_ids": evidence,
        "evidence_docids": [_docid(conv, s) for s in sessions],
    }
    if category == "adversarial":
        record["abstention"] = True  # the gold is "not mentioned", whatever 'answer' says
        if item.get("adversarial_answer") is not None:
            record["adversarial_answer"] = str(item["adversarial_answer"])
    elif item.get("answer") is not None:
        record["answer"] = str(item["answer"])
    return record


def read_locomo(path: Path | str) -> LocomoData:
    """Read LoCoMo as published (see the module docstring for the shapes and the mapping).

    Args:
        path: ``locomo10.json`` (a list of conversations), one conversation's ``.json``, or a
            directory holding ``locomo10.json`` or per-conversation ``.json`` files.

    Returns:
        :class:`LocomoData`: documents, question records (``evidence_docids`` name only sessions
        that exist), the files read and the load report (every dropped session counted; logged).

    Raises:
        DataError: no LoCoMo file at ``path``, a file that is not JSON or not LoCoMo-shaped, a QA
            item without question text, or a conversation id used twice.
    """
    files = locomo_files(path)
    if not files:
        raise DataError(
            f"{path} holds no LoCoMo JSON (locomo10.json, or one .json per conversation with 'qa' and "
            "'speaker_a'): point at the published file",
            path=str(path),
        )
    documents: list[Document] = []
    records: list[dict[str, Any]] = []
    dropped: list[DroppedSession] = []
    seen: set[str] = set()
    for file in files:
        for conv, sample in _samples(file):
            if conv in seen:
                raise DataError(f"{file}: conversation {conv!r} appears twice", path=str(file))
            seen.add(conv)
            docs, lost = _documents(conv, sample)
            dropped += lost
            have = {d.docid for d in docs}
            documents += docs
            answerable = adversarial = 0
            for position, item in enumerate(sample.get("qa") or [], start=1):
                if not isinstance(item, dict):
                    raise DataError(
                        f"{file}: conversation {conv}, qa item {position} is not an object", path=str(file)
                    )
                if _category(item) == "adversarial":
                    adversarial += 1
                    number = adversarial
                else:
                    answerable += 1
                    number = answerable
                record = _question(conv, number, item, file, position)
                record["evidence_docids"] = [d for d in record["evidence_docids"] if d in have]
                records.append(record)
    report = LocomoLoadReport(
        conversations=len(seen),
        sessions=len(documents),
        dropped_sessions=tuple(dropped),
        questions=dict(Counter(str(r["category"]) for r in records)),
    )
    logger.info("LoCoMo %s: %s", path, report.summary())
    return LocomoData(documents=documents, records=records, files=files, report=report)
