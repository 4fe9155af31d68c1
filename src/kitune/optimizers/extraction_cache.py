"""Extractions cached on disk per (extractor instruction + limits, document content): none extracted twice.

GEPA's extractor task extracts one document per metric call with a candidate instruction; its
seed evaluation scores the current instruction on the Pareto set, and the loop itself extracts
every document of the slice with the current instruction. :class:`ExtractionCache` keeps each
:class:`~kitune.programs.fact_extractor.DocExtraction` under

* :func:`extractor_key` — 16 hex characters of the instruction text *and* the limits that shape
  the result (``max_facts``, ``chunk_chars``, ``evidence_mode``, ``corpus``, ``retries``,
  ``max_retry_tokens``, ``split_cut_chunks``), so the same instruction with other limits is a
  different entry;
* the document id and :func:`~kitune.data.checksum.document_hash` (SHA-256 of title and text,
  the same function as the extraction resume file), so an edited document is extracted again.

One JSONL file per extractor key (``<dir>/<key>.jsonl``, appended and fsynced per document), read
once per key. :class:`CachedFactExtractor` is a :class:`~kitune.programs.fact_extractor.FactExtractor`
whose ``extract_document`` reads the cache first and writes it after a miss; the loop environment
hands it to both the extractor task (GEPA's metric calls) and ``extract_corpus`` (the loop's own
extraction), so GEPA's seed evaluation of the current instruction costs no LLM call and the loop
reuses what GEPA extracted for an accepted instruction. An LM error raises as before and is not
cached; a ``failed`` result (a reply that stayed malformed) is cached like any other, since the
same request at temperature 0 gives the same reply. Cached KIs keep the ``last_seen`` of the run
that extracted them. The ``extract`` predictor's calls (inputs and parsed outputs) are cached
too and replayed into DSPy's trace on a hit, since GEPA reflects on the traced calls of the
parent's minibatch — a hit without them would leave it nothing to reflect on.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import dspy

from kitune.data.checksum import document_hash
from kitune.ki import KI
from kitune.programs.fact_extractor import DocExtraction, FactExtractor, ParseFailure
from kitune.schema import Document

__all__ = ["CachedFactExtractor", "ExtractionCache", "TraceStep", "extractor_key"]

_LIMITS = (
    "max_facts",
    "chunk_chars",
    "evidence_mode",
    "corpus",
    "retries",
    "max_retry_tokens",
    "split_cut_chunks",
    "call_unit",
    "grammar_limits",
)


def extractor_key(extractor: FactExtractor) -> str:
    """16 hex characters naming the extractor's instruction text and limits (see the module docstring)."""
    blob = {
        "instruction": extractor.extract.signature.instructions,
        **{k: getattr(extractor, k, None) for k in _LIMITS},
    }
    if getattr(extractor, "keep_truncated", False):  # only when on: keys of the default stay as they were
        blob["keep_truncated"] = True
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:16]


def _to_json(res: DocExtraction) -> dict[str, Any]:
    return {
        "docid": res.docid,
        "status": res.status,
        "kis": [k.model_dump(mode="json") for k in res.kis],
        "drops": dict(res.drops),
        "counters": dict(res.counters),
        "chunks": res.chunks,
        "error": res.error,
        "raw": res.raw,
        "parse_failure": res.parse_failure.to_dict() if res.parse_failure is not None else None,
    }


def _from_json(data: dict[str, Any]) -> DocExtraction:
    return DocExtraction(
        docid=str(data["docid"]),
        status=data["status"],
        kis=tuple(KI.model_validate(k) for k in data.get("kis", ())),
        drops={str(k): int(v) for k, v in dict(data.get("drops", {})).items()},
        counters={str(k): int(v) for k, v in dict(data.get("counters", {})).items()},
        chunks=int(data.get("chunks", 1)),
        error=str(data.get("error", "")),
        raw=str(data.get("raw", "")),
        parse_failure=ParseFailure(**data["parse_failure"]) if data.get("parse_failure") else None,
    )


def _jsonable(value: Any) -> Any:
    return json.loads(
        json.dumps(value, default=lambda o: o.model_dump(mode="json") if hasattr(o, "model_dump") else str(o))
    )


@dataclass(frozen=True)
class TraceStep:
    """One call of the extractor's ``extract`` predictor, as DSPy traces it (inputs, outputs), JSON-able."""

    inputs: dict[str, Any]
    outputs: dict[str, Any]


@dataclass(frozen=True)
class _Entry:
    result: DocExtraction
    trace: tuple[TraceStep, ...] = ()


@dataclass
class CacheStats:
    """Hits and misses since the cache was opened (every key)."""

    hits: int = 0
    misses: int = 0


class ExtractionCache:
    """Document extractions on disk, keyed by :func:`extractor_key`, document id and document hash.

    The hash is :func:`~kitune.data.checksum.document_hash`, the one the extraction resume file keeps.

    Thread-safe (GEPA's metric threads and the extraction workers share one instance). A line
    that does not parse (a crash mid-write) is skipped.

    Args:
        folder: ``<loop state>/extractions``; created on the first write.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._loaded: dict[str, dict[tuple[str, str], _Entry]] = {}

    def _entries(self, key: str) -> dict[tuple[str, str], _Entry]:
        if key in self._loaded:
            return self._loaded[key]
        entries: dict[tuple[str, str], _Entry] = {}
        path = self.folder / f"{key}.jsonl"
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    rec = json.loads(line)
                    trace = tuple(
                        TraceStep(dict(t["inputs"]), dict(t["outputs"])) for t in rec.get("trace", ())
                    )
                    entries[(str(rec["docid"]), str(rec["hash"]))] = _Entry(_from_json(rec["result"]), trace)
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue
        self._loaded[key] = entries
        return entries

    def get(self, key: str, doc: Document) -> _Entry | None:
        """The cached extraction of ``doc`` under ``key`` (None: a miss); counts the hit or miss."""
        with self._lock:
            hit = self._entries(key).get((doc.docid, document_hash(doc)))
            if hit is None:
                self.stats.misses += 1
            else:
                self.stats.hits += 1
            return hit

    def peek(self, key: str, doc: Document) -> DocExtraction | None:
        """The cached result, without counting (for reports); None: not cached."""
        with self._lock:
            hit = self._entries(key).get((doc.docid, document_hash(doc)))
            return hit.result if hit is not None else None

    def put(self, key: str, doc: Document, result: DocExtraction, trace: Sequence[TraceStep] = ()) -> None:
        """Store ``result`` (and the predictor calls that produced it) for ``doc`` under ``key``.

        Appended to ``<key>.jsonl`` and fsynced.
        """
        entry = _Entry(result, tuple(trace))
        line = json.dumps(
            {
                "docid": doc.docid,
                "hash": document_hash(doc),
                "result": _to_json(result),
                "trace": [{"inputs": t.inputs, "outputs": t.outputs} for t in entry.trace],
            },
            ensure_ascii=False,
        )
        with self._lock:
            self._entries(key)[(doc.docid, document_hash(doc))] = entry
            self.folder.mkdir(parents=True, exist_ok=True)
            with (self.folder / f"{key}.jsonl").open("a", encoding="utf-8") as fh:
                fh.write(line + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    def results(self, key: str, docs: Iterable[Document]) -> list[DocExtraction]:
        """The cached extractions of ``docs`` under ``key`` that exist (misses left out, not counted)."""
        return [r for r in (self.peek(key, d) for d in docs) if r is not None]


class _CacheRef:
    """Holds the cache so ``deepcopy`` (GEPA copies the module per candidate) shares it."""

    def __init__(self, cache: ExtractionCache) -> None:
        self.cache = cache

    def __deepcopy__(self, memo: dict[int, Any]) -> _CacheRef:
        return self


class CachedFactExtractor(FactExtractor):
    """A :class:`~kitune.programs.fact_extractor.FactExtractor` that reads and fills an extraction cache.

    Build it with :meth:`wrap`. The key is computed from the instruction at call time, so a copy
    whose instruction GEPA rewrote caches under its own key.
    """

    cache_ref: _CacheRef

    @classmethod
    def wrap(cls, base: FactExtractor, cache: ExtractionCache) -> CachedFactExtractor:
        """A copy of ``base`` (instruction, limits, LM) that uses ``cache``; ``base`` is unchanged."""
        new = copy.deepcopy(base)
        new.__class__ = cls
        new.cache_ref = _CacheRef(cache)
        assert isinstance(new, CachedFactExtractor)
        return new

    @property
    def cache(self) -> ExtractionCache:
        """The shared cache."""
        return self.cache_ref.cache

    def extract_document(self, doc: Document, *, now: datetime | None = None) -> DocExtraction:
        """The cached extraction of ``doc`` for this instruction and limits, else extract and cache it.

        The ``extract`` predictor's calls are traced and cached with the result; a hit replays
        them into DSPy's trace when one is being recorded, so GEPA's reflection sees a cached
        document's inputs and outputs as if it had been extracted now.
        """
        key = extractor_key(self)
        outer = dspy.settings.trace
        hit = self.cache.get(key, doc)
        if hit is not None:
            if outer is not None:
                for step in hit.trace:
                    outer.append((self.extract, dict(step.inputs), dspy.Prediction(**step.outputs)))
            return hit.result
        with dspy.context(trace=[]):
            result = super().extract_document(doc, now=now)
            calls = [
                t for t in dspy.settings.trace if t[0] is self.extract and isinstance(t[2], dspy.Prediction)
            ]
            recorded = list(dspy.settings.trace)
        if outer is not None:
            outer.extend(recorded)
        steps = [TraceStep(_jsonable(dict(t[1])), _jsonable(dict(t[2].items()))) for t in calls]
        self.cache.put(key, doc, result, steps)
        return result
