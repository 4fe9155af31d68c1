"""Sentence-indexed evidence mode: the extractor cites sentence numbers; kitune copies the text.

In this mode (``FactExtractor(evidence_mode="sentences")``) each chunk is shown to the model as
numbered sentences, ``[1] …`` one per line, and every fact cites the number(s) of the sentence(s)
that state it (:class:`kitune.programs.records.SentenceFactRecord`, whose validator reads the
citation under any of its keys). :func:`resolve_citations` turns each citation into the verbatim
text: the span from the first to the last cited sentence when they are consecutive, otherwise the
sentence the model cited first (counted ``evidence_sentences_trimmed``). The evidence is therefore
an exact substring of the chunk by construction, and the model spends a few tokens on numbers
instead of a quote.

Sentence boundaries (:func:`sentence_spans`): a run of text ends at ``.``, ``!`` or ``?`` (plus
closing quotes or brackets) followed by whitespace, at the CJK ``。``, ``！`` or ``？`` (plus a
closing corner bracket or quote; CJK text puts no space after them), or at a line break. Abbreviations such as
``Dr.`` split a sentence in two; citing both numbers restores it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from pydantic import ValidationError

from kitune.lm import RecordError, Records, record_error
from kitune.programs.records import FactRecord, SentenceFactRecord

__all__ = ["cited_span", "numbered_text", "resolve_citations", "sentence_spans"]

_SENTENCE = re.compile(
    r"\S[^\n]*?(?:[.!?]+[\"'\u2019\u201d)\]]*(?=\s)"
    r"|[\u3002\uff01\uff1f\uff61]+[\u300d\u300f\uff09\u201d\u2019]*|(?=\n)|$)",
    re.MULTILINE,
)


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` offsets of each sentence of ``text`` (see the module docstring); in order."""
    return [(m.start(), m.end()) for m in _SENTENCE.finditer(text) if m.group(0).strip()]


def numbered_text(text: str, spans: list[tuple[int, int]]) -> str:
    """The chunk as the model sees it in this mode: ``[n] sentence`` lines, numbered from 1."""
    return "\n".join(f"[{i}] {text[s:e]}" for i, (s, e) in enumerate(spans, 1))


def cited_span(
    cited: Sequence[int], text: str, spans: list[tuple[int, int]], counts: Counter[str]
) -> str | None:
    """The verbatim text a citation names.

    Args:
        cited: the cited sentence numbers, in the model's order.
        text: the chunk the sentences were numbered from.
        spans: its :func:`sentence_spans`.
        counts: incremented with ``evidence_sentences_trimmed`` (non-consecutive citation: the
            sentence cited first is kept) and ``bad_sentence_number`` (no valid number cited).

    Returns:
        ``text`` from the first to the last cited sentence; None when no valid number was cited.
    """
    in_order = list(dict.fromkeys(n for n in cited if 1 <= n <= len(spans)))
    if not in_order:
        counts["bad_sentence_number"] += 1
        return None
    numbers = sorted(in_order)
    if numbers != list(range(numbers[0], numbers[-1] + 1)):
        counts["evidence_sentences_trimmed"] += 1
        numbers = in_order[:1]
    return text[spans[numbers[0] - 1][0] : spans[numbers[-1] - 1][1]]


def resolve_citations(
    records: Sequence[SentenceFactRecord], text: str, spans: list[tuple[int, int]]
) -> Records[FactRecord]:
    """Fact records with their cited sentences copied in as the verbatim ``evidence_span``.

    Args:
        records: the reply's sentence-citing records (a :class:`kitune.lm.Records` keeps its
            errors and counters).
        text: the chunk the sentences were numbered from.
        spans: its :func:`sentence_spans`.

    Returns:
        The records that cite a valid sentence, as :class:`~kitune.programs.records.FactRecord`;
        a record citing none is rejected (``missing_fields``: ``evidence_span``), counted
        ``bad_sentence_number`` and ``records_rejected``, its error at its place in the reply.
    """
    errors = list(getattr(records, "errors", ()))
    counts: Counter[str] = Counter(getattr(records, "counters", {}))
    taken = {e.index for e in errors}
    places = (i for i in range(len(records) + len(errors)) if i not in taken)
    out: list[FactRecord] = []
    for place, record in zip(places, records, strict=False):
        span = cited_span(record.evidence_sentences, text, spans, counts)
        if span is None:
            cited = record.evidence_sentences
            errors.append(
                RecordError(
                    place,
                    "missing_fields",
                    f"fact record is missing required field(s) evidence_span: it cites {cited}, and the "
                    f"text has sentences 1-{len(spans)}",
                    ("evidence_span",),
                )
            )
            counts["records_rejected"] += 1
            continue
        values = record.model_dump(exclude={"evidence_sentences"})
        try:
            out.append(
                FactRecord.model_validate({**values, "evidence_span": span}, context={"counts": counts})
            )
        except ValidationError as e:
            errors.append(record_error(place, e))
            counts["records_rejected"] += 1
    errors.sort(key=lambda e: e.index)
    return Records(out, errors=errors, counters=dict(counts))
