"""The extractor program: one document → 0–15 verified KIs.

:class:`FactExtractor` is a DSPy module with one named predictor, ``extract``, whose
``signature.instructions`` is the text optimisers rewrite (it starts from the packaged
``prompts/extractor.txt``). The predictor has a single string output, ``facts_json``; our own
parser (:mod:`kitune.programs.parsing`) reads it, so reasoning blocks, fences, bare lists,
envelopes and confidence drift are handled by tested code rather than by adapter luck. When the
adapter cannot even find the field, the raw completion is parsed instead.

Per document:

1. the text is split into chunks of at most ``chunk_chars`` characters at paragraph, then
   sentence, then word boundaries (:func:`split_text`), so nothing past the model's context is
   silently dropped;
2. each chunk gets one call; malformed output (no JSON, or records offered but none valid) is
   retried once with the cache bypassed (``cache=False``, a new ``rollout_id``, temperature 0.7);
   a chunk still malformed marks the *document* failed (its partial KIs are not returned);
3. the guardrails (:mod:`kitune.programs.guardrails`) check each fact against its chunk's original
   text and keep at most ``max_facts`` KIs for the whole document.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import dspy

from kitune.errors import ParseError
from kitune.ki import KI
from kitune.programs.guardrails import apply_guardrails
from kitune.programs.instructions import instruction_version, load_instruction
from kitune.programs.parsing import FactCandidate, ParsedFacts, parse_facts
from kitune.schema import Document

if TYPE_CHECKING:
    from kitune.config import KituneConfig

__all__ = ["DocExtraction", "ExtractFacts", "FactExtractor", "split_text"]

RETRY_TEMPERATURE = 0.7
"""Temperature of the retry call, so a cache-bypassing retry can produce different text."""


class ExtractFacts(dspy.Signature):  # type: ignore[misc]
    """Extract self-contained, evidence-backed facts from one document as a JSON array."""

    docid: str = dspy.InputField(desc="Identifier of the document.")
    url: str = dspy.InputField(desc="Where the document comes from (may be empty).")
    title: str = dspy.InputField(desc="Title of the document (may be empty).")
    text: str = dspy.InputField(desc="The document text, or one part of a long document.")
    facts_json: str = dspy.OutputField(
        desc='A JSON array with one object per fact, each with the keys "title", "description", '
        '"subject", "predicate", "object", "evidence_span", "confidence" and "tags".'
    )


@dataclass(frozen=True)
class DocExtraction:
    """What extracting one document produced."""

    docid: str
    status: Literal["ok", "failed"]
    """``failed``: a chunk stayed malformed after its retry, or the LM call raised."""
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


_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s+")


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


class FactExtractor(dspy.Module):  # type: ignore[misc]
    """Extract verified KIs from documents (see the module docstring for the steps).

    Args:
        instructions: the extraction instruction; None loads ``prompts/extractor.txt``.
        max_facts: cap on KIs per document (0–50).
        chunk_chars: split documents longer than this many characters (≥ 1).
        corpus: corpus name for KI references (``index://<corpus>``).
        retries: extra calls for a chunk whose reply is malformed (default 1).

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
    ) -> None:
        super().__init__()
        if instructions is None:
            instructions = load_instruction("extractor").text
        self.extract = dspy.Predict(ExtractFacts.with_instructions(instructions))
        self.max_facts = max_facts
        self.chunk_chars = chunk_chars
        self.corpus = corpus
        self.retries = retries

    @classmethod
    def from_config(cls, cfg: KituneConfig, instructions: str | None = None) -> FactExtractor:
        """Build an extractor with ``cfg.extraction`` limits and ``cfg.corpus_name``."""
        return cls(
            instructions,
            max_facts=cfg.extraction.max_facts_per_doc,
            chunk_chars=cfg.extraction.chunk_chars,
            corpus=cfg.corpus_name,
        )

    @property
    def prompt_version(self) -> str:
        """``extractor@<sha8>`` of the current instruction text (changes when optimisers rewrite it)."""
        return instruction_version("extractor", self.extract.signature.instructions)

    def _complete(self, doc: Document, chunk: str, attempt: int) -> str:
        config: dict[str, Any] = {}
        if attempt > 0:
            config = {"cache": False, "rollout_id": attempt, "temperature": RETRY_TEMPERATURE}
        overrides: dict[str, Any] = {}
        if dspy.settings.adapter is None:
            # Our parser reads the raw reply; skip the adapter's second (JSON-mode) call.
            overrides["adapter"] = dspy.ChatAdapter(use_json_adapter_fallback=False)
        with dspy.context(**overrides):
            try:
                pred = self.extract(docid=doc.docid, url=doc.url, title=doc.title, text=chunk, config=config)
            except dspy.utils.exceptions.AdapterParseError as e:
                return str(e.lm_response or "")
        return str(pred.facts_json or "")

    def _extract_chunk(
        self, doc: Document, chunk: str, counts: Counter[str]
    ) -> tuple[ParsedFacts | None, str, str]:
        """Return (parsed, error, raw); parsed is None when the chunk stayed malformed."""
        error, raw = "", ""
        for attempt in range(self.retries + 1):
            if attempt:
                counts["retries"] += 1
            counts["lm_calls"] += 1
            raw = self._complete(doc, chunk, attempt)
            try:
                parsed = parse_facts(raw)
            except ParseError as e:
                counts["parse_failures"] += 1
                error = str(e)
                continue
            counts.update(parsed.counters)
            if parsed.is_malformed:
                counts["parse_failures"] += 1
                error = "every record was rejected: " + "; ".join(err.message for err in parsed.errors[:3])
                continue
            return parsed, "", ""
        return None, error, raw

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
        chunks = [(off, c) for off, c in split_text(doc.text, self.chunk_chars) if c.strip()]
        facts: list[tuple[FactCandidate, str]] = []
        for _offset, chunk in chunks:
            parsed, error, raw = self._extract_chunk(doc, chunk, counts)
            if parsed is None:
                return DocExtraction(
                    docid=doc.docid,
                    status="failed",
                    counters=dict(counts),
                    chunks=len(chunks),
                    error=error,
                    raw=raw,
                )
            facts.extend((fact, chunk) for fact in parsed.records)
        result = apply_guardrails(
            facts,
            docid=doc.docid,
            max_facts=self.max_facts,
            prompt_version=self.prompt_version,
            corpus=self.corpus,
            now=now,
        )
        counts.update(result.counters)
        return DocExtraction(
            docid=doc.docid,
            status="ok",
            kis=result.kis,
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
