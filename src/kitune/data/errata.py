"""Errata overlays: corrected gold answers for known label errors, applied at load time, counted and logged.

Public benchmarks carry wrong gold labels (LoCoMo's own issue tracker lists some). Rather than
editing the dataset — which must stay as published, and whose checksum is recorded with every
run — corrections live in a separate JSON file, an *overlay*::

    {
      "26-014": {"answer": "counseling or mental health for transgender people",
                 "aliases": ["mental health counseling"],
                 "note": "gold names a field she said she would not pursue"},
      "30-023": {"aliases": ["June 2023"]}
    }

Keys are query ids. Each value is an object with at least one of ``answer`` (a non-empty string:
replaces the gold answer) and ``aliases`` (a list of strings: replaces the aliases), plus an
optional ``note`` (why; kept in the log) and an optional ``query``: the question text the
correction is for. With ``query`` set, a question whose text differs (after
:func:`kitune.text.fold_text`, case-insensitive) is left as it is and counted as *mismatched*
(logged as a warning): a re-numbered subset or another export can never receive another
question's correction. No other keys are accepted, so a typo cannot silently do nothing. Ids
not in the loaded questions are counted as unmatched and logged, not an error: one overlay for
all ten LoCoMo conversations applies to a five-conversation subset.

Where overlays come from (:func:`errata_path_for`): an explicit path, else ``errata.json`` in the
dataset directory, else ``<name>.errata.json`` beside a questions file or ``locomo10.json``
(``locomo10.errata.json``), else — for LoCoMo questions (published file or the JSONL layout,
``dataset == "locomo"``) — the overlay kitune ships, :data:`LOCOMO_ERRATA`
(:func:`packaged_errata_for`). The overlay file is part of the dataset checksum
(:mod:`kitune.data.checksum`).

**The shipped LoCoMo errata** (``kitune/data/locomo10.errata.json``) hold the published label errors
the project knows of, each with the public report it comes from in its ``note``: ``26-003`` (a
field the conversation never names; snap-research/locomo #27, #28), ``26-006`` (Sunday for
"last Saturday"; #27, #28), ``26-057`` (a symbol no cited turn mentions; #35) and ``26-024`` (an
unnamed book and another speaker's book; BrianV1981/aim #463, already correct in
``shared/data/locomo``). Errors in a question's *text* cannot be fixed by an overlay and are left
out: ``26-095`` and ``26-139`` attribute to one speaker what the other said (#35, #27). A run
reports its score on the published labels beside the corrected one
(:attr:`ErrataReport.published`; ``scores.json`` of ``kitune eval``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kitune.data.questions import Question
from kitune.errors import DataError
from kitune.text import fold_text

__all__ = [
    "ERRATA_FILE",
    "LOCOMO_ERRATA",
    "ErrataReport",
    "Erratum",
    "apply_errata",
    "errata_path_for",
    "load_errata",
    "packaged_errata_for",
]

logger = logging.getLogger(__name__)

ERRATA_FILE = "errata.json"
"""The overlay's name inside a dataset directory."""

LOCOMO_ERRATA = Path(__file__).with_name("locomo10.errata.json")
"""The LoCoMo overlay kitune ships (see the module docstring for what it corrects and why)."""

_KEYS = frozenset({"answer", "aliases", "note", "query"})


@dataclass(frozen=True)
class Erratum:
    """One correction."""

    answer: str | None = None
    """The corrected gold answer; None keeps the dataset's."""
    aliases: tuple[str, ...] | None = None
    """The corrected aliases (replacing the dataset's); None keeps the dataset's."""
    note: str = ""
    """Why the label is wrong (free text, logged)."""
    query: str | None = None
    """The question text this correction is for; None applies it to any question with the id."""


@dataclass(frozen=True)
class ErrataReport:
    """What applying an overlay changed."""

    path: str
    """The overlay file."""
    applied: tuple[str, ...]
    """Query ids whose gold answer or aliases changed, in question order."""
    unmatched: tuple[str, ...]
    """Overlay ids not among the loaded questions, in file order."""
    mismatched: tuple[str, ...] = ()
    """Overlay ids whose question text differs from the erratum's ``query`` (left unchanged)."""
    published: tuple[Question, ...] = ()
    """The questions of :attr:`applied` as the dataset published them (before the overlay), so a
    run can score the published labels beside the corrected ones."""


def errata_path_for(path: Path | str) -> Path | None:
    """The overlay that goes with a dataset path by convention, when it exists (see module docstring)."""
    p = Path(path)
    candidate = p / ERRATA_FILE if p.is_dir() else p.with_name(f"{p.stem}.errata.json")
    return candidate if candidate.is_file() else None


def packaged_errata_for(questions: Sequence[Question]) -> Path | None:
    """:data:`LOCOMO_ERRATA` when every question is a LoCoMo one (``dataset == "locomo"``), else None."""
    if questions and all(q.dataset == "locomo" for q in questions) and LOCOMO_ERRATA.is_file():
        return LOCOMO_ERRATA
    return None


def load_errata(path: Path | str) -> dict[str, Erratum]:
    """Read and validate an overlay file.

    Returns:
        Query id → :class:`Erratum`, in file order.

    Raises:
        DataError: the file is missing or not JSON, its top level is not an object, or an entry
            is not an object, has an unknown key, an empty ``answer``, ``aliases`` that are not a
            list of strings, or neither ``answer`` nor ``aliases`` (the message names the id).
    """
    p = Path(path)
    try:
        data: Any = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise DataError(f"errata file {p} does not exist: check the path", path=str(p)) from e
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"errata file {p} is not valid JSON ({e})", path=str(p)) from e
    if not isinstance(data, dict):
        raise DataError(f"errata file {p}: expected an object mapping query id -> correction", path=str(p))
    out: dict[str, Erratum] = {}
    for qid, entry in data.items():
        where = f"errata file {p}: entry {qid!r}"
        if not isinstance(entry, dict):
            raise DataError(f"{where} must be an object with 'answer' and/or 'aliases'", path=str(p))
        unknown = sorted(set(entry) - _KEYS)
        if unknown:
            raise DataError(
                f"{where} has unknown key(s) {', '.join(unknown)}: use answer, aliases, note, query",
                path=str(p),
            )
        answer = entry.get("answer")
        if answer is not None and (not isinstance(answer, str | int | float) or not str(answer).strip()):
            raise DataError(f"{where}: 'answer' must be a non-empty string", path=str(p))
        aliases = entry.get("aliases")
        if aliases is not None and (
            not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases)
        ):
            raise DataError(f"{where}: 'aliases' must be a list of strings", path=str(p))
        if answer is None and aliases is None:
            raise DataError(f"{where} corrects nothing: give 'answer' and/or 'aliases'", path=str(p))
        query = entry.get("query")
        if query is not None and (not isinstance(query, str) or not query.strip()):
            raise DataError(f"{where}: 'query' must be the question's text", path=str(p))
        out[str(qid)] = Erratum(
            answer=str(answer) if answer is not None else None,
            aliases=tuple(aliases) if aliases is not None else None,
            note=str(entry.get("note") or ""),
            query=query,
        )
    return out


def apply_errata(
    questions: Sequence[Question], errata: dict[str, Erratum], *, path: Path | str = ""
) -> tuple[list[Question], ErrataReport]:
    """Overlay corrections on ``questions``; logs one line per change and a count (INFO).

    Args:
        questions: the loaded questions.
        errata: from :func:`load_errata`.
        path: the overlay file, for the report and the log.

    Returns:
        ``(questions, report)``: the questions in the same order, corrected ones replaced (an
        abstention question corrected with an answer stops being one); the report lists what
        changed and which overlay ids matched no question.
    """
    known = {q.query_id for q in questions}
    out: list[Question] = []
    applied: list[str] = []
    published: list[Question] = []
    mismatched: list[str] = []
    for q in questions:
        fix = errata.get(q.query_id)
        if fix is None:
            out.append(q)
            continue
        if fix.query is not None and fold_text(fix.query).casefold() != fold_text(q.query).casefold():
            mismatched.append(q.query_id)
            logger.warning(
                "errata %s: %s not applied: the erratum is for %r, this question is %r",
                path,
                q.query_id,
                fix.query,
                q.query,
            )
            out.append(q)
            continue
        new = replace(
            q,
            answer=fix.answer if fix.answer is not None else q.answer,
            aliases=fix.aliases if fix.aliases is not None else q.aliases,
            abstention=q.abstention and fix.answer is None,
        )
        if new != q:
            applied.append(q.query_id)
            published.append(q)
            logger.info(
                "errata %s: %s: answer %r -> %r, aliases %s -> %s%s",
                path,
                q.query_id,
                q.answer,
                new.answer,
                list(q.aliases),
                list(new.aliases),
                f" ({fix.note})" if fix.note else "",
            )
        out.append(new)
    unmatched = tuple(qid for qid in errata if qid not in known)
    logger.info(
        "errata %s: applied %d correction(s); %d id(s) not in these questions%s",
        path,
        len(applied),
        len(unmatched),
        f" ({', '.join(unmatched[:5])}{' …' if len(unmatched) > 5 else ''})" if unmatched else "",
    )
    return out, ErrataReport(
        path=str(path),
        applied=tuple(applied),
        unmatched=unmatched,
        mismatched=tuple(mismatched),
        published=tuple(published),
    )
