"""Fact rules applied after generation (DESIGN part 2): verified candidates become KIs.

Every rule either passes a fact, normalises a harmless formatting slip (counted, not dropped),
or drops the fact with one reason from :data:`DROP_REASONS`:

=========================  ===================================================================
reason                     rule
=========================  ===================================================================
``empty_field``            subject, object, title, description or evidence is empty
``title_too_long``         title over 140 characters
``description_too_long``   description over 350 characters even after keeping only its
                           leading whole sentences that fit (``description_trimmed``)
``bad_predicate``          predicate not snake_case ≤ 32 chars after normalising case,
                           spaces, hyphens and camelCase (``"Founded In"`` → ``founded_in``)
``mentions_source``        title/description/subject/object talks about the document, passage,
                           text, article, dataset, question or task
``benchmark_marker``       any field names a benchmark (BrowseComp, MuSiQue, HotpotQA,
                           2WikiMultihopQA), a canary string, or holds a GUID
``forbidden_phrase``       any field holds one of the published forbidden strings
                           (:data:`FORBIDDEN_PHRASES`: ``qid:``, ``use this fact``, ``anchor a
                           criterion``, ``without re-reading``): instructions to a reader or
                           task bookkeeping leaked into a fact
``evidence_not_found``     the evidence span is not a verbatim substring of the source text
                           after :func:`kitune.text.fold_text` on both sides (case E1), and
                           no sentence of the source names both the fact's subject and object
``evidence_mismatch``      the quote is not found, and every sentence naming the subject and
                           object lacks a number or date the fact's title, description or
                           quoted span states: a repair would store evidence that
                           contradicts the fact or the model's own quote
``duplicate``              same KI id as an earlier fact from this document
``invalid_ki``             the KI model still rejects the fact (reported with the message)
``over_cap``               beyond ``max_facts`` valid facts for the document
=========================  ===================================================================

Evidence repair (policy; the stored span is always a verbatim slice of the source): when the
model's quote is not found, (1) edge punctuation and quote marks are trimmed and the search
repeated (``evidence_trimmed``: small models end a clause with an invented full stop); then
(2) the first sentence of the source that contains the object, the subject (folded,
case-insensitive; for the subject, its full name or, failing that, every one of its words of
four or more letters) **and every number and date the fact's title, its description and the
model's quoted span state** is used instead (``evidence_repaired``). A repair never changes a
fact's value: title "Acme signed the agreement on 1 June 2023" is not stored with "Acme signed
the agreement on 1 May 2023." as its evidence, and neither is the numberless title "Acme signed
the agreement" when the model quoted "… on 1 May 2023" and the document says 1 June (issue 40).
A fact whose object appears in no sentence with its subject is dropped as
``evidence_not_found``; one whose subject-and-object sentences all lack one of its numbers or
dates is dropped as ``evidence_mismatch`` (the detail names the missing values). Sentences end at
``.!?``, a line break, or the CJK ``。！？``.

Numbers and dates (:func:`fact_values`), read after :func:`kitune.text.fold_text` on both sides:
a full date in any form :func:`kitune.text.parse_date` reads (``1 June 2023``, ``June 1,
2023``, ``2023-06-01``), a month and year (``June 2023``), a day and month (``1 June``), and
every other digit run as a number (``1,500`` = ``1500``; ``4th`` is 4; ``B-52`` holds 52). A
sentence supplies what it states and what its dates imply: ``1 June 2023`` supplies that date,
``June 2023``, ``1 June`` and the numbers 2023 and 1, so a title saying only "in 2023" is
supported by it, but a title saying ``1 June 2023`` is not supported by ``1 May 2023``.

Tags are normalised rather than dropped: each is slugified to lowercase ``a-z0-9-``; tags that
end empty are removed. The stored evidence span is cut from the *original* text, with its
typographic characters.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal

from pydantic import ValidationError

from kitune.ki import DESCRIPTION_MAX_CHARS, KI, PREDICATE_MAX_CHARS, TITLE_MAX_CHARS, ki_id, slugify
from kitune.programs.records import FactRecord
from kitune.text import find_span, fold_text, parse_date

__all__ = [
    "DROP_REASONS",
    "FORBIDDEN_PHRASES",
    "Drop",
    "EvidenceMiss",
    "GuardrailResult",
    "StatedValues",
    "apply_guardrails",
    "check_fact",
    "fact_values",
    "fit_description",
    "locate_evidence",
    "normalize_predicate",
    "normalize_tags",
]

DROP_REASONS: tuple[str, ...] = (
    "empty_field",
    "title_too_long",
    "description_too_long",
    "bad_predicate",
    "mentions_source",
    "benchmark_marker",
    "forbidden_phrase",
    "evidence_not_found",
    "evidence_mismatch",
    "duplicate",
    "invalid_ki",
    "over_cap",
)
"""Every reason a fact can be dropped for, in the order the rules run."""

_PREDICATE_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_SOURCE_RE = re.compile(
    r"\b(?:this|the|that|above|given|provided)\s+(?:document|passage|text|article|excerpt|paragraph|"
    r"snippet|dataset|corpus|web\s?page|question|task)\b"
    r"|\baccording\s+to\s+(?:the|this)\s+(?:source|page|author)\b"
    r"|\b(?:document|passage)\s+(?:states|says|mentions|describes|notes)\b",
    re.IGNORECASE,
)
_MARKER_RE = re.compile(
    r"browse\s?comp|musique|hotpot\s?qa|2wiki|wikimultihop|\bcanary\b"
    r"|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    re.IGNORECASE,
)

FORBIDDEN_PHRASES: tuple[str, ...] = ("qid:", "use this fact", "anchor a criterion", "without re-reading")
"""Published strings a fact must never hold (matched case-insensitively after fold_text)."""
_FORBIDDEN_RE = re.compile(
    "|".join(re.escape(p).replace(r"\ ", r"\s+") for p in FORBIDDEN_PHRASES), re.IGNORECASE
)
VAGUE_PREDICATES: frozenset[str] = frozenset({"affiliated_with", "associated_with", "related_to"})
"""Predicates the prompt discourages; kept, but counted as ``vague_predicate``."""


@dataclass(frozen=True)
class Drop:
    """One dropped fact."""

    reason: str
    """One of :data:`DROP_REASONS`."""
    title: str
    """The fact's title, for reports."""
    detail: str = ""
    """What exactly broke the rule."""


@dataclass(frozen=True)
class GuardrailResult:
    """Facts that passed, as KIs, plus the drops."""

    kis: tuple[KI, ...]
    """At most ``max_facts``, in the model's order."""
    drops: tuple[Drop, ...] = ()
    counters: dict[str, int] = field(default_factory=dict)
    """``predicate_normalised``, ``tags_normalised`` counts."""

    @property
    def drop_counts(self) -> dict[str, int]:
        """Reason → number of facts dropped for it (reasons with no drop are absent)."""
        return dict(Counter(d.reason for d in self.drops))


def normalize_predicate(predicate: str) -> str:
    """Return ``predicate`` as snake_case: camelCase split, spaces/hyphens → ``_``, lower-cased.

    The result may still be invalid (e.g. starts with a digit); callers check it.
    """
    p = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", predicate.strip())
    p = re.sub(r"[\s\-/.]+", "_", p.lower())
    return re.sub(r"_+", "_", p).strip("_")


def normalize_tags(tags: Sequence[str]) -> list[str]:
    """Slugify each tag to lowercase ``a-z0-9-``; drop tags that end empty; keep first-seen order."""
    out = [slugify(t, max_chars=48) for t in tags]
    return list(dict.fromkeys(t for t in out if t))


_SENTENCE_RE = re.compile(
    r"[^.!?\u3002\uff01\uff1f\uff61\n]+"
    r"(?:[.!?]+|[\u3002\uff01\uff1f\uff61]+[\u300d\u300f\uff09\u201d\u2019]*|$)"
)
"""A sentence for evidence repair: up to ``.``, ``!``, ``?``, a line break, or the CJK full stop,
exclamation and question marks (``。！？｡``, with a closing corner bracket or quote after them);
CJK text has no space after its full stop, so without them a whole paragraph was one sentence."""
_EDGE_CHARS = " \t.,;:!?\"'\u2026\u201c\u201d\u2018\u2019()[]"


def _contains(haystack: str, needle: str) -> bool:
    return bool(needle) and fold_text(needle).casefold() in fold_text(haystack).casefold()


def _subject_in(sentence: str, subject: str) -> bool:
    if _contains(sentence, subject):
        return True
    words = [w for w in re.findall(r"\w+", fold_text(subject)) if len(w) >= 4]
    return bool(words) and all(_contains(sentence, w) for w in words)


_MONTH_WORD = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_ORDINAL = r"(?:st|nd|rd|th)?"
_DATE_MENTION = re.compile(
    r"(?P<iso>\b\d{4}-\d{2}-\d{2}\b)"
    rf"|\b(?:the\s+)?(?P<d1>\d{{1,2}}){_ORDINAL}\s+(?:of\s+)?(?P<m1>{_MONTH_WORD})\b\.?(?:,?\s+(?P<y1>\d{{4}})\b)?"
    rf"|\b(?P<m2>{_MONTH_WORD})\b\.?\s+(?:(?P<d2>\d{{1,2}}){_ORDINAL}\b(?:,?\s+(?P<y2>\d{{4}})\b)?|(?P<y3>\d{{4}})\b)",
    re.IGNORECASE,
)
_NUMBER_RUN = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")

Value = tuple[str, str]
"""One stated value: ``("date", "2023-06-01")``, ``("month", "2023-06")``, ``("day", "06-01")`` or
``("number", "1999")``."""


@dataclass(frozen=True)
class StatedValues:
    """The numbers and dates a text states (see the module docstring for what counts)."""

    required: frozenset[Value]
    """What the text states, each at its own precision (a full date as a date, not its parts):
    what a fact's evidence must hold."""
    supplied: frozenset[Value]
    """What the text supports: ``required`` plus what its dates imply (the month, day, year and
    day number of a full date)."""


def _month_number(word: str) -> int:
    parsed = parse_date(f"1 {word} 2000")  # kitune.text's month table, the one grading uses
    assert parsed is not None, word  # _MONTH_WORD admits only month names parse_date reads
    return parsed.month


def _number_key(digits: str) -> Value:
    return "number", format(Decimal(digits.replace(",", "")).normalize(), "f")


def _date_values(m: re.Match[str]) -> tuple[Value, set[Value]] | None:
    """``(required, supplied)`` for one date mention; None when it names no real day."""
    g = m.groupdict()
    if g["iso"]:
        full = parse_date(g["iso"])
        if full is None:
            return None
        day, month, year = full.day, full.month, full.year
    else:
        day_text, month_word, year_text = (
            (g["d1"], g["m1"], g["y1"]) if g["m1"] else (g["d2"], g["m2"], g["y2"] or g["y3"])
        )
        month = _month_number(month_word)
        day = int(day_text) if day_text else 0
        year = int(year_text) if year_text else 0
        try:  # a leap year when no year is given, so "29 February" stays a day
            date(year or 2000, month, day or 1)
        except ValueError:
            return None
    month_key: Value = ("month", f"{year:04d}-{month:02d}")
    day_key: Value = ("day", f"{month:02d}-{day:02d}")
    if day and year:
        date_key: Value = ("date", f"{year:04d}-{month:02d}-{day:02d}")
        return date_key, {date_key, month_key, day_key, _number_key(str(year)), _number_key(str(day))}
    if year:
        return month_key, {month_key, _number_key(str(year))}
    return day_key, {day_key, _number_key(str(day))}


def fact_values(text: str) -> StatedValues:
    """The numbers and dates ``text`` states, after :func:`kitune.text.fold_text`.

    Dates are read first (the forms in the module docstring) and their characters are not read
    again as numbers; every remaining digit run is a number (thousands separators dropped,
    trailing decimal zeros ignored: ``1,500.0`` is 1500).

    Returns:
        :class:`StatedValues`; both sets empty when ``text`` has no digit.
    """
    folded = fold_text(text)
    required: set[Value] = set()
    supplied: set[Value] = set()
    rest = list(folded)
    for m in _DATE_MENTION.finditer(folded):
        values = _date_values(m)
        if values is None:
            continue
        required.add(values[0])
        supplied |= values[1]
        rest[m.start() : m.end()] = " " * (m.end() - m.start())
    for m in _NUMBER_RUN.finditer("".join(rest)):
        key = _number_key(m.group(0))
        required.add(key)
        supplied.add(key)
    return StatedValues(required=frozenset(required), supplied=frozenset(supplied))


def _show(values: Sequence[Value]) -> str:
    return ", ".join(f"{kind} {value}" for kind, value in sorted(values))


@dataclass(frozen=True)
class EvidenceMiss:
    """Why no evidence span was kept for a fact."""

    reason: str
    """``evidence_not_found`` or ``evidence_mismatch`` (see :data:`DROP_REASONS`)."""
    detail: str
    """What was looked for and what was missing."""


def locate_evidence(
    text: str,
    quote: str,
    *,
    subject: str,
    obj: str,
    claims: Sequence[str] = (),
    counters: Counter[str] | None = None,
) -> tuple[int, int] | EvidenceMiss:
    """Find the evidence for a fact in ``text``, repairing near-miss quotes (see module docstring).

    Args:
        text: the original source text.
        quote: the model's evidence span.
        subject: the fact's subject.
        obj: the fact's object (value).
        claims: the fact's title and description: a repaired span must state every number and
            date they state (:func:`fact_values`), and every one ``quote`` states.
        counters: incremented with ``evidence_trimmed`` / ``evidence_repaired`` when a repair is used.

    Returns:
        ``(start, end)`` offsets into ``text`` of a verbatim span, or an :class:`EvidenceMiss`
        (``evidence_not_found``: no sentence names both subject and object; ``evidence_mismatch``:
        each one that does lacks a number or date of the fact or of the model's quote).
    """
    counts: Counter[str] = counters if counters is not None else Counter()
    span = find_span(text, quote)
    if span is not None:
        return span
    trimmed = quote.strip(_EDGE_CHARS)
    if trimmed and trimmed != quote and len(trimmed) >= 12:
        span = find_span(text, trimmed)
        if span is not None:
            counts["evidence_trimmed"] += 1
            return span
    not_found = EvidenceMiss("evidence_not_found", f"evidence {quote[:80]!r} is not in the text")
    if len(fold_text(obj)) < 2:
        return not_found
    claimed = fact_values(" ".join(claims)).required
    quoted = fact_values(quote).required
    wanted = claimed | quoted
    first_missing: tuple[str, list[Value], list[Value]] | None = None
    for m in _SENTENCE_RE.finditer(text):
        sentence = m.group(0)
        if not (_contains(sentence, obj) and _subject_in(sentence, subject)):
            continue
        supplied = fact_values(sentence).supplied
        if wanted - supplied:
            first_missing = first_missing or (
                sentence.strip(),
                sorted(claimed - supplied),
                sorted(quoted - claimed - supplied),
            )
            continue
        lead = len(sentence) - len(sentence.lstrip())
        counts["evidence_repaired"] += 1
        return m.start() + lead, m.end() - (len(sentence) - len(sentence.rstrip()))
    if first_missing is None:
        return not_found
    sentence, missing, unquoted = first_missing
    lacks = [
        *([f"the fact's {_show(missing)}"] if missing else []),
        *([f"the quote's {_show(unquoted)}"] if unquoted else []),
    ]
    return EvidenceMiss(
        "evidence_mismatch",
        f"evidence {quote[:80]!r} is not in the text, and {sentence[:80]!r} (which names the subject "
        f"and object) does not state {' or '.join(lacks)}",
    )


def fit_description(text: str) -> tuple[str, bool]:
    """``text`` cut to its leading whole sentences that fit ``DESCRIPTION_MAX_CHARS`` (350).

    Returns:
        ``(description, trimmed)``; unchanged (``trimmed`` False) when it already fits or when not
        even its first sentence fits (the caller then rejects it).
    """
    description = text.strip()
    if len(description) <= DESCRIPTION_MAX_CHARS:
        return description, False
    kept = ""
    for m in _SENTENCE_RE.finditer(description):
        candidate = description[: m.end()].strip()
        if len(candidate) > DESCRIPTION_MAX_CHARS:
            break
        kept = candidate
    return (kept, True) if kept else (description, False)


def check_fact(
    fact: FactRecord,
    text: str,
    *,
    docid: str,
    prompt_version: str = "",
    corpus: str = "corpus",
    now: datetime | None = None,
    counters: Counter[str] | None = None,
) -> KI | Drop:
    """Apply every rule to one fact.

    Args:
        fact: the parsed candidate.
        text: the original source text the evidence must come from (a document or a chunk).
        docid: the source document id.
        prompt_version: the extractor's prompt version, stored on the KI.
        corpus: corpus name for the ``index://<corpus>`` reference.
        now: the ``last_seen`` timestamp (UTC); None: now.
        counters: optional counter for normalisations.

    Returns:
        The :class:`KI` (evidence cut from ``text``), or a :class:`Drop` saying why not.
    """
    counts: Counter[str] = counters if counters is not None else Counter()
    empty = [
        n
        for n in ("title", "description", "subject", "object", "evidence_span")
        if not getattr(fact, n).strip()
    ]
    if empty:
        return Drop("empty_field", fact.title, f"empty {', '.join(empty)}")
    if len(fact.title) > TITLE_MAX_CHARS:
        return Drop("title_too_long", fact.title, f"{len(fact.title)} > {TITLE_MAX_CHARS} chars")
    description, trimmed = fit_description(fact.description)
    if trimmed:
        counts["description_trimmed"] += 1
    if len(description) > DESCRIPTION_MAX_CHARS:
        return Drop(
            "description_too_long", fact.title, f"{len(fact.description)} > {DESCRIPTION_MAX_CHARS} chars"
        )
    predicate = normalize_predicate(fact.predicate)
    if not _PREDICATE_RE.match(predicate) or len(predicate) > PREDICATE_MAX_CHARS:
        return Drop(
            "bad_predicate", fact.title, f"predicate {fact.predicate!r} is not snake_case <= 32 chars"
        )
    if predicate != fact.predicate:
        counts["predicate_normalised"] += 1
    if predicate in VAGUE_PREDICATES:
        counts["vague_predicate"] += 1
    for name in ("title", "description", "subject", "object"):
        source = _SOURCE_RE.search(getattr(fact, name))
        if source:
            return Drop("mentions_source", fact.title, f"{name} mentions {source.group(0)!r}")
    for name in ("title", "description", "subject", "object", "evidence_span", "predicate"):
        marker = _MARKER_RE.search(getattr(fact, name))
        if marker:
            return Drop("benchmark_marker", fact.title, f"{name} holds {marker.group(0)!r}")
    for name in ("title", "description", "subject", "object", "evidence_span"):
        hit = _FORBIDDEN_RE.search(fold_text(getattr(fact, name)))
        if hit:
            return Drop("forbidden_phrase", fact.title, f"{name} holds {hit.group(0)!r}")
    tags = normalize_tags(fact.tags)
    if any(_MARKER_RE.search(t) for t in tags):
        return Drop("benchmark_marker", fact.title, "a tag names a benchmark")
    if tags != list(fact.tags):
        counts["tags_normalised"] += 1
    span = locate_evidence(
        text,
        fact.evidence_span,
        subject=fact.subject,
        obj=fact.object,
        claims=(fact.title, description),
        counters=counts,
    )
    if isinstance(span, EvidenceMiss):
        return Drop(span.reason, fact.title, span.detail)
    evidence = text[span[0] : span[1]]
    try:
        return KI.from_fact(
            docid=docid,
            title=fact.title,
            description=description,
            subject=fact.subject,
            predicate=predicate,
            obj=fact.object,
            evidence=[evidence],
            confidence=fact.confidence,
            tags=tags,
            corpus=corpus,
            prompt_version=prompt_version,
            now=now,
        )
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        return Drop("invalid_ki", fact.title, problems)


def apply_guardrails(
    facts: Sequence[tuple[FactRecord, str]],
    *,
    docid: str,
    max_facts: int,
    prompt_version: str = "",
    corpus: str = "corpus",
    now: datetime | None = None,
) -> GuardrailResult:
    """Check every fact of one document and keep at most ``max_facts`` KIs.

    Args:
        facts: ``(candidate, source_text)`` pairs in model order; ``source_text`` is the original
            text the candidate was extracted from (the whole document or its chunk).
        docid: the document id.
        max_facts: cap on KIs kept (≥ 0); valid facts beyond it are dropped as ``over_cap``.
        prompt_version: stored on each KI.
        corpus: corpus name for references.
        now: ``last_seen`` for every KI (UTC); None: now.

    Returns:
        :class:`GuardrailResult`; ``len(kis) + len(drops) == len(facts)``.
    """
    counts: Counter[str] = Counter()
    kis: list[KI] = []
    drops: list[Drop] = []
    seen: set[str] = set()
    for fact, text in facts:
        if ki_id(docid, fact.subject, normalize_predicate(fact.predicate), fact.object) in seen:
            drops.append(Drop("duplicate", fact.title, "same subject/predicate/object as an earlier fact"))
            continue
        outcome = check_fact(
            fact, text, docid=docid, prompt_version=prompt_version, corpus=corpus, now=now, counters=counts
        )
        if isinstance(outcome, Drop):
            drops.append(outcome)
        elif len(kis) >= max_facts:
            drops.append(Drop("over_cap", fact.title, f"more than {max_facts} facts for document {docid}"))
        else:
            seen.add(outcome.id)
            kis.append(outcome)
    return GuardrailResult(kis=tuple(kis), drops=tuple(drops), counters=dict(counts))
