"""The extractor program: one document → 0–15 verified KIs.

:class:`FactExtractor` is a DSPy module with one named predictor, ``extract``, whose
``signature.instructions`` is the text optimisers rewrite (it starts from the packaged
``prompts/extractor.txt``, which describes only the task). The output is typed,
``facts: list[FactRecord]`` (:mod:`kitune.programs.records`), so the format reaches the model
through the adapter (:func:`kitune.lm.default_adapter`: the JSON schema in the prompt, or as
``response_format`` for a :class:`kitune.lm.KituneLM`), not through the instruction. The adapter
reads the reply per record (:func:`kitune.lm.parse_leniently`), so reasoning blocks, fences,
envelopes, a broken record and confidence drift cost only the records at fault, and the program
reads the typed ``facts`` field directly (:func:`kitune.programs.predict.predict_typed`): the
valid records plus the dropped ones and the parse counters.

No ``dspy.Refine``/``BestOfN``: both resample the *whole* reply until a reward passes, which on
the embedded model multiplies the extractor's cost (its largest) per document; the failures that
matter here are handled more cheaply and deterministically — a cut reply is retried once with
more room, a malformed one once with the cache bypassed, and bad records are dropped one by one.

Per document:

1. the text is split into chunks of at most ``chunk_chars`` characters at paragraph, then
   sentence, then word boundaries (:func:`split_text`), so nothing past the model's context is
   silently dropped;
2. each chunk gets one call (with ``call_unit="sentence"``, one call per numbered sentence of a
   prose chunk, asking for that sentence's facts with the chunk as context), and its
   ``finish_reason`` is read
   (:func:`kitune.lm.track_calls`; a reply whose JSON array was cut off counts too).
   Malformed output (no JSON, or records offered but none valid) is retried once with the cache
   bypassed (``cache=False``, a new ``rollout_id``, temperature 0.7); a chunk still malformed
   marks the *document* failed (its partial KIs are not returned);
3. a reply cut at its token limit (``finish_reason="length"``) is retried once **with more
   room**, never at the same size: ``max_tokens`` doubled (up to ``max_retry_tokens``), or, when
   the LM's ``max_tokens`` is unknown or already at that cap, the chunk split in two halves that
   are extracted separately. When the retry is cut again, the complete records read from it
   are kept only with ``keep_truncated=True`` (``extraction.keep_truncated_records``; counted
   ``kept_from_truncated``, the document's status ``partial``, not ``ok``); by default they are
   counted ``truncated_records_dropped`` and the document is ``failed`` with a
   :class:`ParseFailure` (``status="cut_off"``), so a rerun with more room tries it again;
4. the guardrails (:mod:`kitune.programs.guardrails`) check each fact against its chunk's original
   text and keep at most ``max_facts`` KIs for the whole document.

A reply that cannot be used (no JSON, cut off, every record rejected) is a structured
:class:`ParseFailure` on the failed :class:`DocExtraction` (status, reason, adapter, exception
class, detail, the whole raw reply), not only a message.

Counters (``DocExtraction.counters``): ``lm_calls``, ``retries``, ``parse_failures``,
``truncated_replies`` (replies cut at the token limit), ``truncation_retries`` (retries with a
larger ``max_tokens``), ``truncation_splits`` (retries as two halves), ``kept_from_truncated``,
``truncated_records_dropped`` (complete records of a cut reply not kept), plus the parser's and
the guardrails' counters.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import dspy

from kitune.data.dialogue import (
    chunk_session,
    dialogue_tags,
    numbered_turn_view,
    parse_session,
    turn_indexed_view,
)
from kitune.ki import DESCRIPTION_MAX_CHARS, KI, TITLE_MAX_CHARS
from kitune.lm import KituneLM, LocalJSONAdapter, Records, default_adapter, finish_reason_of
from kitune.programs.guardrails import apply_guardrails
from kitune.programs.instructions import instruction_version, load_instruction
from kitune.programs.predict import TypedReply, predict_typed
from kitune.programs.records import FactRecord, SentenceFactRecord
from kitune.programs.sentences import numbered_text, resolve_citations, sentence_spans
from kitune.schema import Document

if TYPE_CHECKING:
    from kitune.config import KituneConfig

__all__ = ["DocExtraction", "ExtractFacts", "FactExtractor", "ParseFailure", "split_text"]

GRAMMAR_LIMITS: dict[str, dict[str, int]] = {
    "title": {"maxLength": TITLE_MAX_CHARS},
    "description": {"maxLength": DESCRIPTION_MAX_CHARS},
    "evidence_sentences": {"minItems": 1, "maxItems": 3},
}
"""JSON-schema keywords for ``extraction.grammar_limits``: the guardrails' title and description
lengths and 1–3 cited sentences, compiled into llama.cpp's grammar so no fact is written too long
to keep. Measured on the embedded 1.5B model (benchmarks/results/extraction_variants.q12.md, 12
fixture questions): 3.25 KIs/document and answer coverage 9/12 at 544 output tokens and 32.6 s per
document, against 2.00, 7/12, 778 and 113.1 s without them."""

RETRY_TEMPERATURE = 0.7
"""Temperature of the retry call, so a cache-bypassing retry can produce different text."""

MAX_RETRY_TOKENS = 8192
"""Default cap on the ``max_tokens`` of a retry after a reply was cut at its token limit."""


class ExtractFacts(dspy.Signature):  # type: ignore[misc]
    """Extract self-contained, evidence-backed facts from one document."""

    docid: str = dspy.InputField(desc="Identifier of the document.")
    url: str = dspy.InputField(desc="Where the document comes from (may be empty).")
    title: str = dspy.InputField(desc="Title of the document (may be empty).")
    text: str = dspy.InputField(desc="The document text, or one part of a long document.")
    facts: list[FactRecord] = dspy.OutputField(
        # Not "an empty list when the text states none": with that cue the embedded 1.5B model
        # answered {"facts": []} for every LoCoMo chat session (the instruction keeps the rule for
        # pages that state no fact; experiments/locomo-conv1/README.md).
        desc="Every fact the text states, most important first."
    )


class ExtractFactsBySentence(dspy.Signature):  # type: ignore[misc]
    """Extract self-contained facts from one document, citing the numbered sentences that state them."""

    docid: str = dspy.InputField(desc="Identifier of the document.")
    url: str = dspy.InputField(desc="Where the document comes from (may be empty).")
    title: str = dspy.InputField(desc="Title of the document (may be empty).")
    text: str = dspy.InputField(
        desc="The document (or one part of it) as numbered sentences, '[n] ...' per line."
    )
    facts: list[SentenceFactRecord] = dspy.OutputField(
        # Not "an empty list when the text states none": with that cue the embedded 1.5B model
        # answered {"facts": []} for every LoCoMo chat session (the instruction keeps the rule for
        # pages that state no fact; experiments/locomo-conv1/README.md).
        desc="Every fact the text states, most important first."
    )


class ExtractFactsFromSentence(dspy.Signature):  # type: ignore[misc]
    """Extract the self-contained facts one numbered sentence of a document states, citing the sentences."""

    docid: str = dspy.InputField(desc="Identifier of the document.")
    url: str = dspy.InputField(desc="Where the document comes from (may be empty).")
    title: str = dspy.InputField(desc="Title of the document (may be empty).")
    text: str = dspy.InputField(
        desc="The document (or one part of it) as numbered sentences, '[n] ...' per line."
    )
    sentence: int = dspy.InputField(
        desc="The number of the sentence to extract facts from now; the other sentences are context "
        "(who 'he' or 'it' is, the date or place a fact needs)."
    )
    facts: list[SentenceFactRecord] = dspy.OutputField(
        desc="Every fact this sentence states, most important first."
    )


EVIDENCE_MODES: tuple[str, ...] = ("quote", "sentences")
"""``quote``: the model quotes its evidence (checked verbatim, repaired when near); ``sentences``:
the model cites numbered sentences and kitune copies them (:mod:`kitune.programs.sentences`)."""

CALL_UNITS: tuple[str, ...] = ("chunk", "sentence")
"""What one extractor call covers: ``chunk`` (the whole chunk) or ``sentence`` (one call per
numbered sentence of a prose chunk, the chunk shown as context; ``sentences`` evidence mode only)."""


@dataclass(frozen=True)
class ParseFailure:
    """Why a model reply could not be used, as a record (stored in the extraction state file).

    Attributes:
        status: ``unparseable`` (no usable JSON or no valid output field), ``records_rejected``
            (records offered, every one invalid) or ``cut_off`` (cut at its token limit after the
            retry with more room; its complete records not kept, see ``keep_truncated``).
        reason: the parser's reason: ``no_json``, ``cut_off``, ``malformed_json``,
            ``invalid_fields``, ``records_rejected`` or ``length`` (the provider's finish reason).
        adapter: the adapter class that read the reply (``KituneJSONAdapter`` …).
        exception: the exception class the reading raised (``ReplyParseError``), or for rejected
            records ``RecordError``; for a cut reply whose complete records were dropped, ``""``.
        detail: what was wrong, naming the field or the records.
        raw: the model's whole reply.
        finish_reason: how the call ended (``stop``, ``length`` …), None when unknown.
        records_dropped: complete records read from a cut reply and not kept (``cut_off`` only).
    """

    status: Literal["unparseable", "records_rejected", "cut_off"]
    reason: str
    adapter: str
    exception: str
    detail: str
    raw: str
    finish_reason: str | None = None
    records_dropped: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON object (every attribute, ``raw`` whole)."""
        return {
            "status": self.status,
            "reason": self.reason,
            "adapter": self.adapter,
            "exception": self.exception,
            "detail": self.detail,
            "raw": self.raw,
            "finish_reason": self.finish_reason,
            "records_dropped": self.records_dropped,
        }


@dataclass(frozen=True)
class DocExtraction:
    """What extracting one document produced."""

    docid: str
    status: Literal["ok", "partial", "failed"]
    """``partial``: a reply was still cut at its token limit after the retry with more room and
    ``keep_truncated`` is on: the complete records before the cut were kept (the document may be
    missing facts). ``failed``: a chunk stayed malformed after its retry, a reply stayed cut (its
    records not kept), or the LM call raised."""
    kis: tuple[KI, ...] = ()
    """Verified KIs (empty when failed), at most ``max_facts``."""
    drops: dict[str, int] = field(default_factory=dict)
    """Guardrail drop reason → count."""
    counters: dict[str, int] = field(default_factory=dict)
    """Parse counters summed over chunks (``envelope_unwrapped``, ``records_rejected`` …) plus
    ``parse_failures`` (malformed replies), ``retries`` and ``lm_calls``."""
    chunks: int = 1
    """How many chunks the text was split into."""
    error: str = ""
    """Why the document failed (empty when ok)."""
    raw: str = ""
    """The last malformed reply, kept for debugging (empty when ok)."""
    parse_failure: ParseFailure | None = None
    """The structured record of the reply that made the document fail (None when ok, partial,
    or failed for another reason: the LM raised, too large)."""


_SENTENCE_END = re.compile(
    r"[.!?][\"')\]]*\s+|[\u3002\uff01\uff1f\uff61][\u300d\u300f\uff09\u201d\u2019]*\s*"
)
"""A sentence end where a chunk may be cut: ``.!?`` then whitespace, or the CJK ``。！？`` (no space
follows them in CJK text)."""


def split_text(text: str, chunk_chars: int) -> list[tuple[int, str]]:
    """Split ``text`` into consecutive slices of at most ``chunk_chars`` characters.

    Cuts prefer a paragraph break (blank line), then a sentence end, then whitespace, each in
    the second half of the window; a hard cut is the last resort.

    Args:
        text: the original document text.
        chunk_chars: maximum characters per chunk (≥ 1).

    Returns:
        ``(offset, chunk)`` pairs with ``text[offset:offset + len(chunk)] == chunk``; the chunks
        concatenate back to ``text`` exactly. ``[(0, text)]`` when it fits.

    Raises:
        ValueError: ``chunk_chars`` < 1.
    """
    if chunk_chars < 1:
        raise ValueError(f"chunk_chars must be >= 1, got {chunk_chars}")
    if len(text) <= chunk_chars:
        return [(0, text)]
    chunks: list[tuple[int, str]] = []
    start = 0
    while start < len(text):
        end = min(start + chunk_chars, len(text))
        if end < len(text):
            window = text[start:end]
            floor = chunk_chars // 2
            cut = window.rfind("\n\n", floor)
            if cut >= 0:
                cut += 2
            else:
                ends = [m.end() for m in _SENTENCE_END.finditer(window) if m.end() > floor]
                if ends:
                    cut = ends[-1]
                else:
                    spaces = [m.end() for m in re.finditer(r"\s+", window) if m.end() > floor]
                    cut = spaces[-1] if spaces else len(window)
            end = start + cut
        chunks.append((start, text[start:end]))
        start = end
    return chunks


def _sent(entry: dict[str, Any], view: str) -> bool:
    """True when a ``dspy.LM`` history record's request messages contain ``view``."""
    messages = entry.get("messages") or []
    return any(isinstance(m, dict) and view in str(m.get("content") or "") for m in messages)


def _halve(chunk: str) -> tuple[str, str] | None:
    """Split ``chunk`` in two at the boundary nearest its middle (paragraph, sentence, space).

    Returns None when the chunk has no boundary to cut at (a single long word).
    """
    middle = len(chunk) // 2
    for pattern in (r"\n\s*\n", _SENTENCE_END.pattern, r"\s+"):
        cuts = [m.end() for m in re.finditer(pattern, chunk) if 0 < m.end() < len(chunk)]
        if cuts:
            cut = min(cuts, key=lambda c: abs(c - middle))
            if chunk[:cut].strip() and chunk[cut:].strip():
                return chunk[:cut], chunk[cut:]
    return None


class FactExtractor(dspy.Module):  # type: ignore[misc]
    """Extract verified KIs from documents (see the module docstring for the steps).

    Args:
        instructions: the extraction instruction; None loads ``prompts/extractor.txt``.
        max_facts: cap on KIs per document (0–50).
        chunk_chars: split documents longer than this many characters (≥ 1).
        corpus: corpus name for KI references (``index://<corpus>``).
        retries: extra calls for a chunk whose reply is malformed (default 1).
        max_retry_tokens: cap on ``max_tokens`` when a reply cut at its token limit is retried.
        split_cut_chunks: at that cap, re-extract a cut chunk as two halves (two more calls);
            False makes no more calls.
        keep_truncated: keep the complete records of a reply still cut at its token limit
            (status ``partial``, counted ``kept_from_truncated``). False (default): they are
            counted ``truncated_records_dropped`` and the document fails with a ``cut_off``
            :class:`ParseFailure`.
        evidence_mode: ``"quote"`` (default) or ``"sentences"`` (see :data:`EVIDENCE_MODES`); the
            predictor keeps its name ``extract`` in both modes.
        call_unit: ``"chunk"`` (default: one call per chunk) or ``"sentence"`` (one call per
            numbered sentence of a prose chunk, asking for the facts that sentence states, with
            the chunk as context; dialogue chunks keep one call; needs ``evidence_mode="sentences"``).
            See :data:`CALL_UNITS`.

    Raises:
        ValueError: an unknown ``evidence_mode`` or ``call_unit``, or ``call_unit="sentence"``
            without ``evidence_mode="sentences"``.

    The one named predictor is ``extract``; its ``signature.instructions`` is the prompt text and
    :attr:`prompt_version` is ``extractor@<sha8>`` of that text.
    """

    def __init__(
        self,
        instructions: str | None = None,
        *,
        max_facts: int = 15,
        chunk_chars: int = 6000,
        corpus: str = "corpus",
        retries: int = 1,
        max_retry_tokens: int = MAX_RETRY_TOKENS,
        split_cut_chunks: bool = True,
        keep_truncated: bool = False,
        evidence_mode: str = "quote",
        call_unit: str = "chunk",
        grammar_limits: bool = False,
    ) -> None:
        super().__init__()
        if evidence_mode not in EVIDENCE_MODES:
            raise ValueError(f"evidence_mode={evidence_mode!r}: use one of {', '.join(EVIDENCE_MODES)}")
        if call_unit not in CALL_UNITS:
            raise ValueError(f"call_unit={call_unit!r}: use one of {', '.join(CALL_UNITS)}")
        if call_unit == "sentence" and evidence_mode != "sentences":
            raise ValueError(
                "call_unit='sentence' asks about numbered sentences: set evidence_mode='sentences' "
                "(extraction.evidence_mode: sentences) or use call_unit='chunk'"
            )
        if instructions is None:
            instructions = load_instruction("extractor").text
        signature: type[dspy.Signature] = ExtractFacts
        if call_unit == "sentence":
            signature = ExtractFactsFromSentence
        elif evidence_mode == "sentences":
            signature = ExtractFactsBySentence
        self.extract = dspy.Predict(signature.with_instructions(instructions))
        self.evidence_mode = evidence_mode
        self.call_unit = call_unit
        self.max_facts = max_facts
        self.chunk_chars = chunk_chars
        self.corpus = corpus
        self.retries = retries
        self.max_retry_tokens = max_retry_tokens
        self.split_cut_chunks = split_cut_chunks
        self.keep_truncated = keep_truncated
        self.grammar_limits = grammar_limits

    @classmethod
    def from_config(cls, cfg: KituneConfig, instructions: str | None = None) -> FactExtractor:
        """An extractor from ``cfg.extraction`` (limits, evidence mode, call unit) and ``cfg.corpus_name``.

        Raises:
            ValueError: ``call_unit`` is ``sentence`` but ``evidence_mode`` is not ``sentences``.
        """
        return cls(
            instructions,
            max_facts=cfg.extraction.max_facts_per_doc,
            chunk_chars=cfg.extraction.chunk_chars,
            corpus=cfg.corpus_name,
            max_retry_tokens=cfg.extraction.max_retry_tokens,
            split_cut_chunks=cfg.extraction.split_cut_chunks,
            keep_truncated=cfg.extraction.keep_truncated_records,
            evidence_mode=cfg.extraction.evidence_mode,
            call_unit=cfg.extraction.call_unit,
            grammar_limits=cfg.extraction.grammar_limits,
        )

    @property
    def prompt_version(self) -> str:
        """``extractor@<sha8>`` of the current instruction text (changes when optimisers rewrite it)."""
        return instruction_version("extractor", self.extract.signature.instructions)

    def _lm(self) -> Any:
        return self.extract.lm or dspy.settings.lm

    def _adapter(self, lm: Any) -> dspy.Adapter:
        """The adapter for ``lm`` (the extractor's calls).

        With :attr:`grammar_limits` and a local llama.cpp model the JSON schema carries the
        guardrails' length limits (:data:`GRAMMAR_LIMITS`); else :func:`kitune.lm.default_adapter`.
        """
        if self.grammar_limits and isinstance(lm, KituneLM) and lm.resolved.is_local:
            return LocalJSONAdapter(field_limits=GRAMMAR_LIMITS)
        return default_adapter(lm)

    def _view(self, doc: Document, chunk: str) -> tuple[str, list[tuple[int, int]] | None]:
        """How the model sees ``chunk``, and in sentence mode the spans its cited numbers name.

        A dialogue: turns verbatim with resolved dates — numbered (sentence mode) or by id (quote
        mode). Prose: numbered sentences in sentence mode, else the chunk as is. The spans are
        offsets in ``chunk`` (None in quote mode), so cited numbers become verbatim evidence.
        """
        date = doc.metadata.get("date", "")
        if parse_session(chunk).turns:
            if self.evidence_mode == "sentences":
                return numbered_turn_view(chunk, date_text=date)
            return turn_indexed_view(chunk, date_text=date), None
        if self.evidence_mode == "sentences":
            spans = sentence_spans(chunk)
            return numbered_text(chunk, spans), spans
        return chunk, None

    def _complete(
        self, doc: Document, view: str, attempt: int, max_tokens: int | None = None, focus: int | None = None
    ) -> tuple[TypedReply, str | None]:
        """One call on the chunk's :meth:`_view` (about sentence ``focus`` when given).

        Returns ``(reply, finish_reason or None)``.
        """
        config: dict[str, Any] = {}
        if attempt > 0:
            config = {"cache": False, "rollout_id": attempt, "temperature": RETRY_TEMPERATURE}
        if max_tokens is not None:
            config["max_tokens"] = max_tokens
        lm = self._lm()
        seen = len(getattr(lm, "history", None) or [])
        inputs: dict[str, Any] = {"docid": doc.docid, "url": doc.url, "title": doc.title, "text": view}
        if focus is not None:
            inputs["sentence"] = focus
        reply = predict_typed(self.extract, adapter=self._adapter, config=config, **inputs)
        if reply.calls:
            return reply, reply.finish_reason
        # Another dspy.LM: read its history record of this call. Documents are extracted in
        # several threads on one LM, so the last record may be another document's: take the
        # newest one whose request holds this chunk's view.
        history = list(getattr(lm, "history", None) or [])
        if len(history) > seen:
            for entry in reversed(history):
                if isinstance(entry, dict) and _sent(entry, view):
                    return reply, finish_reason_of(entry.get("response"))
        return reply, None

    @staticmethod
    def _facts(
        reply: TypedReply, chunk: str, spans: list[tuple[int, int]] | None
    ) -> Records[FactRecord] | None:
        """The reply's fact records, with the dropped ones and the counters; None when it held no JSON.

        In sentence mode (``spans`` given) each record's citation becomes its verbatim
        ``evidence_span``, copied from ``chunk`` (for a dialogue the cited numbers are turns,
        copied as ``Speaker: text``).
        """
        if reply.prediction is None:
            return None
        facts = reply.prediction.facts
        records = facts if isinstance(facts, Records) else Records(facts or ())
        if spans is not None:
            return resolve_citations(records, chunk, spans)
        return records

    @property
    def partial_is_final(self) -> bool:
        """True when running this extractor again cannot complete a ``partial`` document.

        That is when a cut reply gets neither a bigger retry (``max_retry_tokens`` at or below
        the LM's ``max_tokens``) nor a split into halves (``split_cut_chunks`` off): the same
        request would be cut the same way. Extraction runs then record the document as done
        instead of re-extracting it on every resume.
        """
        return not self.split_cut_chunks and self._more_tokens() is None

    def _more_tokens(self) -> int | None:
        """The ``max_tokens`` for a retry after a cut-off reply: double, capped; None if not larger."""
        current = (getattr(self._lm(), "kwargs", None) or {}).get("max_tokens")
        if not isinstance(current, int) or current < 1:
            return None
        bigger = min(current * 2, self.max_retry_tokens)
        return bigger if bigger > current else None

    def _failure(
        self,
        status: Literal["unparseable", "records_rejected", "cut_off"],
        reply: TypedReply,
        finish: str | None,
        detail: str,
        *,
        dropped: int = 0,
    ) -> ParseFailure:
        """The structured record of ``reply``, which could not be used."""
        err = reply.error
        if err is not None:
            adapter, exception, reason = err.adapter_name, type(err).__name__, err.reason
        else:
            used = dspy.settings.adapter or self._adapter(self._lm())
            adapter = type(used).__name__
            exception = "RecordError" if status == "records_rejected" else ""
            reason = "records_rejected" if status == "records_rejected" else "length"
        if status == "cut_off" and finish == "length":
            reason = "length"
        return ParseFailure(
            status=status,
            reason=reason,
            adapter=adapter,
            exception=exception,
            detail=detail,
            raw=reply.raw,
            finish_reason=finish,
            records_dropped=dropped,
        )

    def _extract_chunk(
        self,
        doc: Document,
        chunk: str,
        counts: Counter[str],
        *,
        may_grow: bool = True,
        focus: int | None = None,
    ) -> tuple[list[FactRecord] | None, bool, ParseFailure | None]:
        """Return ``(records, partial, failure)``; records is None when the chunk could not be used.

        ``partial`` is True when the records come from a reply still cut at its token limit (only
        with :attr:`keep_truncated`). ``failure`` says why records is None. ``focus``: the
        sentence number one call asks about (``call_unit="sentence"``); a reply cut at the token
        cap then falls back to extracting the chunk's halves whole.
        """
        error = ""
        salvage: Records[FactRecord] | None = None
        salvage_reply: tuple[TypedReply, str | None] | None = None
        room: int | None = None
        attempt = 0
        malformed_retries = 0
        view, spans = self._view(doc, chunk)
        while True:
            if attempt:
                counts["retries"] += 1
            counts["lm_calls"] += 1
            reply, finish = self._complete(doc, view, attempt, room, focus)
            attempt += 1
            parsed = self._facts(reply, chunk, spans)
            if reply.error is not None:
                error = reply.error.detail
            cut = finish == "length" or bool(parsed is not None and parsed.counters.get("truncated_salvaged"))
            if parsed is not None:
                counts.update(parsed.counters)
            if cut:
                counts["truncated_replies"] += 1
                if parsed:
                    salvage, salvage_reply = parsed, (reply, finish)
                if may_grow:
                    may_grow = False
                    room = self._more_tokens()
                    if room is not None:
                        counts["truncation_retries"] += 1
                        continue
                    # at the token cap: split the chunk in halves (two more calls), unless
                    # split_cut_chunks is off and the cut reply has complete facts (kept or
                    # dropped by keep_truncated, no more calls either way)
                    stop = salvage is not None and not self.split_cut_chunks
                    halves = None if stop else _halve(chunk)
                    if halves is not None:
                        counts["truncation_splits"] += 1
                        return self._extract_halves(doc, halves, counts)
                if salvage is not None:
                    return self._salvaged(salvage, salvage_reply, counts)
                counts["parse_failures"] += 1
                detail = error or "the reply was cut at its token limit before one record ended"
                return None, False, self._failure("cut_off", reply, finish, detail)
            if parsed is None or parsed.is_malformed:
                counts["parse_failures"] += 1
                status: Literal["unparseable", "records_rejected"] = "unparseable"
                if parsed is not None:
                    status = "records_rejected"
                    error = "every record was rejected: " + "; ".join(
                        err.message for err in parsed.errors[:3]
                    )
                if malformed_retries < self.retries:
                    malformed_retries += 1
                    continue
                if salvage is not None:  # the bigger retry was malformed: the cut reply's records
                    return self._salvaged(salvage, salvage_reply, counts)
                return None, False, self._failure(status, reply, finish, error)
            return list(parsed), False, None

    def _salvaged(
        self,
        salvage: Records[FactRecord],
        origin: tuple[TypedReply, str | None] | None,
        counts: Counter[str],
    ) -> tuple[list[FactRecord] | None, bool, ParseFailure | None]:
        """The complete records of a cut reply: kept (partial) with :attr:`keep_truncated`, else dropped.

        Either way they are counted: ``kept_from_truncated`` or ``truncated_records_dropped``.
        """
        if self.keep_truncated:
            counts["kept_from_truncated"] += len(salvage)
            return list(salvage), True, None
        counts["truncated_records_dropped"] += len(salvage)
        counts["parse_failures"] += 1
        assert origin is not None  # set with salvage
        reply, finish = origin
        detail = (
            f"the reply was cut at its token limit after {len(salvage)} complete record(s), which "
            "are not kept: raise lm.extract.max_tokens or lower extraction.chunk_chars and "
            "re-extract, or set extraction.keep_truncated_records to keep them (status partial)"
        )
        return None, False, self._failure("cut_off", reply, finish, detail, dropped=len(salvage))

    def _extract_halves(
        self, doc: Document, halves: tuple[str, str], counts: Counter[str]
    ) -> tuple[list[FactRecord] | None, bool, ParseFailure | None]:
        records: list[FactRecord] = []
        partial = False
        for half in halves:
            got, cut, failure = self._extract_chunk(doc, half, counts, may_grow=False)
            if got is None:
                return None, False, failure
            records.extend(got)
            partial = partial or cut
        return records, partial, None

    def extract_document(self, doc: Document, *, now: datetime | None = None) -> DocExtraction:
        """Extract one document.

        Args:
            doc: the document (its ``text`` may be empty: no call is made, status ok).
            now: ``last_seen`` for the KIs (UTC); None: now.

        Returns:
            :class:`DocExtraction`. Malformed output never raises; LM errors
            (:class:`kitune.errors.LMError` and DSPy's own) propagate to the caller.
        """
        counts: Counter[str] = Counter()
        date = doc.metadata.get("date", "")
        dialogue = bool(parse_session(doc.text, date_text=date).turns)
        if dialogue:  # chunk on turn boundaries, the header (and its date) repeated in each chunk
            chunks = [(0, c) for c in chunk_session(doc.text, self.chunk_chars) if c.strip()]
        else:
            chunks = [(off, c) for off, c in split_text(doc.text, self.chunk_chars) if c.strip()]
        facts: list[tuple[FactRecord, str]] = []
        partial = False
        for _offset, chunk in chunks:
            # one call per chunk, or per numbered sentence of a prose chunk (call_unit="sentence")
            focuses: list[int | None] = [None]
            if self.call_unit == "sentence" and not dialogue:
                focuses = list(range(1, len(sentence_spans(chunk)) + 1)) or [None]
            for focus in focuses:
                records, cut, failure = self._extract_chunk(doc, chunk, counts, focus=focus)
                if records is None:
                    return DocExtraction(
                        docid=doc.docid,
                        status="failed",
                        counters=dict(counts),
                        chunks=len(chunks),
                        error=failure.detail if failure is not None else "",
                        raw=failure.raw if failure is not None else "",
                        parse_failure=failure,
                    )
                partial = partial or cut
                facts.extend((fact, chunk) for fact in records)
        result = apply_guardrails(
            facts,
            docid=doc.docid,
            max_facts=self.max_facts,
            prompt_version=self.prompt_version,
            corpus=self.corpus,
            now=now,
        )
        counts.update(result.counters)
        kis = list(result.kis)
        if dialogue:  # the evidence turns (d3-5) and the session date travel with each KI as tags
            kis = [
                ki.model_copy(
                    update={
                        "tags": list(
                            dict.fromkeys(
                                [*ki.tags, *dialogue_tags(doc.text, ki.payload.evidence, date_text=date)]
                            )
                        )
                    }
                )
                for ki in kis
            ]
        return DocExtraction(
            docid=doc.docid,
            status="partial" if partial else "ok",
            kis=tuple(kis),
            drops=result.drop_counts,
            counters=dict(counts),
            chunks=len(chunks),
        )

    def forward(self, docid: str, text: str, url: str = "", title: str = "") -> dspy.Prediction:
        """Extract one document given as fields (the form optimisers and metrics call).

        Returns:
            ``dspy.Prediction`` with ``kis`` (list of :class:`KI`), ``status``, ``drops`` and
            ``result`` (the full :class:`DocExtraction`).
        """
        result = self.extract_document(Document(docid=docid, text=text, url=url, title=title))
        return dspy.Prediction(kis=list(result.kis), status=result.status, drops=result.drops, result=result)
