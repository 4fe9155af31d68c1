"""Sentence-indexed evidence mode: the extractor cites sentence numbers; kitune copies the text.

In this mode (``FactExtractor(evidence_mode="sentences")``) each chunk is shown to the model as
numbered sentences, ``[1] …`` one per line, and every fact cites the number(s) of the sentence(s)
that state it (:class:`kitune.programs.records.SentenceFactRecord`). :func:`cited_evidence`
turns the citation into the verbatim text before the record is validated: the span from the
first to the last cited sentence when they are consecutive, otherwise the sentence the model cited
first (counted ``evidence_sentences_trimmed``). The evidence is therefore an exact substring of
the chunk by construction, and the model spends a few tokens on numbers instead of a quote.

Sentence boundaries (:func:`sentence_spans`): a run of text ends at ``.``, ``!`` or ``?`` (plus
closing quotes or brackets) followed by whitespace, or at a line break. Abbreviations such as
``Dr.`` split a sentence in two; citing both numbers restores it.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

__all__ = ["CITATION_KEYS", "cited_evidence", "numbered_text", "sentence_spans"]

_SENTENCE = re.compile(r"\S[^\n]*?(?:[.!?]+[\"'\u2019\u201d)\]]*(?=\s)|(?=\n)|$)", re.MULTILINE)

CITATION_KEYS: tuple[str, ...] = (
    "evidence_sentences",
    "evidence_sentence",
    "sentences",
    "sentence_ids",
    "sentence_numbers",
    "evidence",
)
"""Keys read for the cited sentence numbers (first present wins)."""


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` offsets of each sentence of ``text`` (see the module docstring); in order."""
    return [(m.start(), m.end()) for m in _SENTENCE.finditer(text) if m.group(0).strip()]


def numbered_text(text: str, spans: list[tuple[int, int]]) -> str:
    """The chunk as the model sees it in this mode: ``[n] sentence`` lines, numbered from 1."""
    return "\n".join(f"[{i}] {text[s:e]}" for i, (s, e) in enumerate(spans, 1))


def _numbers(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, float) and value.is_integer():
        return [int(value)]
    if isinstance(value, str):
        return [int(n) for n in re.findall(r"\d+", value)]
    if isinstance(value, list | tuple):
        return [n for v in value for n in _numbers(v)]
    return []


def cited_evidence(
    record: dict[str, Any], text: str, spans: list[tuple[int, int]], counts: Counter[str]
) -> dict[str, Any]:
    """Replace a record's sentence citation with the verbatim ``evidence_span``.

    Args:
        record: one fact record as the model wrote it.
        text: the chunk the sentences were numbered from.
        spans: its :func:`sentence_spans`.
        counts: incremented with ``evidence_sentences_trimmed`` (non-consecutive citation) and
            ``bad_sentence_number`` (no valid number cited: the record then lacks evidence and
            is rejected with ``missing_fields``).

    Returns:
        A copy of ``record`` with ``evidence_span`` set (or removed when nothing valid was cited).
    """
    out = {k: v for k, v in record.items() if k not in CITATION_KEYS and k != "evidence_span"}
    raw = next((record[k] for k in CITATION_KEYS if k in record), None)
    in_order = list(dict.fromkeys(n for n in _numbers(raw) if 1 <= n <= len(spans)))
    if not in_order:
        counts["bad_sentence_number"] += 1
        return out
    cited = sorted(in_order)
    if cited != list(range(cited[0], cited[-1] + 1)):
        counts["evidence_sentences_trimmed"] += 1
        cited = in_order[:1]
    out["evidence_span"] = text[spans[cited[0] - 1][0] : spans[cited[-1] - 1][1]]
    return out
