"""Read an extractor reply into fact records (pure functions, no I/O).

The extractor itself never calls these: its adapter reads each reply per record
(:func:`kitune.lm.parse_leniently`) and the program reads the typed ``facts`` field. These
functions apply the very same reading to a reply text or one record, for tools and tests:

* :func:`parse_facts` — a reply → :class:`ParsedFacts`: :func:`kitune.lm.read_records` with
  :class:`kitune.programs.records.FactRecord`, so it survives every shape of
  ``shared/cases/failure-cases.md`` (P1 reasoning, prose, fences and no-JSON replies with their
  reason; P2 a bare list and drifting keys; P3 one envelope level; G1 the confidence policy;
  broken arrays whose well-formed records are kept and whose repaired ones are reported, never
  kept);
* :func:`coerce_record` — one record → :class:`~kitune.programs.records.FactRecord`, or a
  :class:`kitune.errors.ParseError` naming the fault.

One bad record never aborts its siblings: :func:`parse_facts` returns every valid record plus a
per-record error list and counters.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from kitune.errors import ParseError
from kitune.lm import RecordError, read_records, record_error
from kitune.programs.records import FactRecord

__all__ = ["ParsedFacts", "coerce_record", "parse_facts"]


@dataclass(frozen=True)
class ParsedFacts:
    """Result of :func:`parse_facts`: valid records, per-record errors and counters."""

    records: tuple[FactRecord, ...]
    errors: tuple[RecordError, ...] = ()
    counters: dict[str, int] = field(default_factory=dict)
    """Event counts: ``think_stripped``, ``fence_stripped``, ``truncated_salvaged``,
    ``records_malformed``, ``bare_list``, ``envelope_unwrapped``, ``aliased_keys``,
    ``confidence_defaulted``, ``records_rejected``."""

    @property
    def is_malformed(self) -> bool:
        """True when records were offered but none survived (worth a retry)."""
        return not self.records and bool(self.errors)


def parse_facts(raw: str) -> ParsedFacts:
    """Parse a model reply into fact records.

    Args:
        raw: the raw completion text (may hold reasoning, prose, fences).

    Returns:
        :class:`ParsedFacts` with the valid records in reply order, one
        :class:`kitune.lm.RecordError` per rejected record, and counters. An empty list (``[]``)
        yields no records and no errors.

    Raises:
        ParseError: the reply holds no usable JSON; the message starts with one of
            :data:`kitune.lm.REPLY_FAILURES` (``"no JSON object found"``, ``"JSON cut off"``,
            ``"malformed JSON"``) and ``raw`` is kept.
    """
    records = read_records(raw, FactRecord, keys=("facts",))
    return ParsedFacts(records=tuple(records), errors=records.errors, counters=records.counters)


def coerce_record(record: Any, counters: Counter[str] | None = None) -> FactRecord:
    """Validate one record (aliases, one envelope level, the G1 confidence policy).

    Args:
        record: one element of the facts array.
        counters: optional counter updated with ``envelope_unwrapped``, ``aliased_keys``,
            ``confidence_defaulted``.

    Returns:
        The :class:`~kitune.programs.records.FactRecord`.

    Raises:
        ParseError: the record is not an object, a required field is missing or empty
            (``missing_fields`` lists them all), a text field holds a non-scalar, or the
            confidence breaks the policy.
    """
    counts: Counter[str] = counters if counters is not None else Counter()
    try:
        return FactRecord.model_validate(record, context={"counts": counts})
    except ValidationError as e:
        err = record_error(0, e)
        raise ParseError(
            err.message, raw=json.dumps(record, default=str), missing_fields=err.missing_fields
        ) from None
