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
                           no repair below finds a verbatim span that supports the fact
``duplicate``              same KI id as an earlier fact from this document
``invalid_ki``             the KI model still rejects the fact (reported with the message)
``over_cap``               beyond ``max_facts`` valid facts for the document
=========================  ===================================================================

Evidence repair (policy; the stored span is always a verbatim slice of the source): when the
model's quote is not found, (1) edge punctuation and quote marks are trimmed and the search
repeated (``evidence_trimmed``: small models end a clause with an invented full stop); then
(2) the first sentence of the source that contains both the object and the subject (folded,
case-insensitive; for the subject, its full name or, failing that, every one of its words of
four or more letters) is used instead (``evidence_repaired``). A fact whose object appears in
no sentence with its subject is still dropped as ``evidence_not_found``.

Tags are normalised rather than dropped: each is slugified to lowercase ``a-z0-9-``; tags that
end empty are removed. The stored evidence span is cut from the *original* text, with its
typographic characters.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import ValidationError

from kitune.ki import DESCRIPTION_MAX_CHARS, KI, PREDICATE_MAX_CHARS, TITLE_MAX_CHARS, ki_id, slugify
from kitune.programs.parsing import FactCandidate
from kitune.text import find_span, fold_text

__all__ = [
    "DROP_REASONS",
    "FORBIDDEN_PHRASES",
    "Drop",
    "GuardrailResult",
    "apply_guardrails",
    "check_fact",
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


_SENTENCE_RE = re.compile(r"[^.!?\n]+(?:[.!?]+|$)")
_EDGE_CHARS = " \t.,;:!?\"'\u2026\u201c\u201d\u2018\u2019()[]"


def _contains(haystack: str, needle: str) -> bool:
    return bool(needle) and fold_text(needle).casefold() in fold_text(haystack).casefold()


def _subject_in(sentence: str, subject: str) -> bool:
    if _contains(sentence, subject):
        return True
    words = [w for w in re.findall(r"\w+", fold_text(subject)) if len(w) >= 4]
    return bool(words) and all(_contains(sentence, w) for w in words)


def locate_evidence(
    text: str, quote: str, *, subject: str, obj: str, counters: Counter[str] | None = None
) -> tuple[int, int] | None:
    """Find the evidence for a fact in ``text``, repairing near-miss quotes (see module docstring).

    Args:
        text: the original source text.
        quote: the model's evidence span.
        subject: the fact's subject.
        obj: the fact's object (value).
        counters: incremented with ``evidence_trimmed`` / ``evidence_repaired`` when a repair is used.

    Returns:
        ``(start, end)`` offsets into ``text`` of a verbatim span, or None when no span supports the fact.
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
    if len(fold_text(obj)) < 2:
        return None
    for m in _SENTENCE_RE.finditer(text):
        sentence = m.group(0)
        if _contains(sentence, obj) and _subject_in(sentence, subject):
            lead = len(sentence) - len(sentence.lstrip())
            counts["evidence_repaired"] += 1
            return m.start() + lead, m.end() - (len(sentence) - len(sentence.rstrip()))
    return None


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
    fact: FactCandidate,
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
    span = locate_evidence(text, fact.evidence_span, subject=fact.subject, obj=fact.object, counters=counts)
    if span is None:
        return Drop(
            "evidence_not_found", fact.title, f"evidence {fact.evidence_span[:80]!r} is not in the text"
        )
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
    facts: Sequence[tuple[FactCandidate, str]],
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
