"""The extraction cache: one extraction per (instruction + limits, document content); hits replay traces."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import dspy
from opt_fakes import RuleLM, extractor_rule

from kitune.optimizers.extraction_cache import (
    CachedFactExtractor,
    ExtractionCache,
    _from_json,
    _to_json,
    extractor_key,
)
from kitune.programs.fact_extractor import DocExtraction, FactExtractor, ParseFailure
from kitune.schema import Document

DOC = Document(
    docid="d1", title="Acme", text="Acme Corp is headquartered in Springfield. Acme Corp was founded in 1999."
)


def _cached(
    tmp_path: Path, instruction: str = "Extract facts."
) -> tuple[CachedFactExtractor, ExtractionCache]:
    cache = ExtractionCache(tmp_path / "extractions")
    return CachedFactExtractor.wrap(FactExtractor(instruction), cache), cache


def test_a_document_is_extracted_once_per_instruction_and_content(tmp_path: Path) -> None:
    lm = RuleLM(extractor_rule)
    ext, cache = _cached(tmp_path)
    with dspy.context(lm=lm):
        first = ext.extract_document(DOC)
        again = ext.extract_document(DOC)
        assert lm.calls == 1 and [k.id for k in again.kis] == [k.id for k in first.kis]
        assert (cache.stats.hits, cache.stats.misses) == (1, 1)
        # another instruction (GEPA's candidate, on a deep copy sharing the cache) is another entry
        other = copy.deepcopy(ext)
        other.extract.signature = other.extract.signature.with_instructions("Extract facts with DATES.")
        assert other.cache is cache and extractor_key(other) != extractor_key(ext)
        dated = other.extract_document(DOC)
        assert lm.calls == 2 and len(dated.kis) == 2
        # an edited document is extracted again
        ext.extract_document(Document(docid="d1", title="Acme", text=DOC.text + " It makes anvils."))
        assert lm.calls == 3
    # a new process reads the file: no call at all
    fresh, _ = _cached(tmp_path)
    with dspy.context(lm=lm):
        assert [k.id for k in fresh.extract_document(DOC).kis] == [k.id for k in first.kis]
    assert lm.calls == 3
    assert len(list((tmp_path / "extractions").glob("*.jsonl"))) == 2
    assert cache.results(extractor_key(ext), [DOC, Document(docid="zz", text="x")]) == [first]


def test_a_hit_replays_the_predictor_calls_into_the_trace_gepa_reflects_on(tmp_path: Path) -> None:
    lm = RuleLM(extractor_rule)
    ext, _ = _cached(tmp_path)
    with dspy.context(lm=lm, trace=[]):
        ext.extract_document(DOC)
        live = list(dspy.settings.trace)
    with dspy.context(lm=lm, trace=[]):
        ext.extract_document(DOC)
        replayed = list(dspy.settings.trace)
    assert lm.calls == 1 and len(live) == len(replayed) == 1
    (pred, inputs, outputs), (pred2, inputs2, outputs2) = live[0], replayed[0]
    assert pred is pred2 is ext.extract
    assert inputs2 == {k: inputs[k] for k in ("docid", "url", "title", "text")}
    assert [f["object"] for f in outputs2.facts] == [f.object for f in outputs.facts] == ["Springfield"]


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    lm = RuleLM(extractor_rule)
    ext, _ = _cached(tmp_path)
    with dspy.context(lm=lm):
        ext.extract_document(DOC)
    (path,) = (tmp_path / "extractions").glob("*.jsonl")
    path.write_text(path.read_text(encoding="utf-8") + '{"docid": "d2", "ha', encoding="utf-8")
    fresh, cache = _cached(tmp_path)
    with dspy.context(lm=lm):
        fresh.extract_document(DOC)
    assert lm.calls == 1 and cache.stats.hits == 1


def test_a_failed_extraction_keeps_its_structured_parse_failure_through_the_cache() -> None:
    failure = ParseFailure(
        "unparseable", "no_json", "KituneJSONAdapter", "ReplyParseError", "d", "prose", "stop"
    )
    res = DocExtraction(docid="d1", status="failed", error="d", raw="prose", parse_failure=failure)
    assert _from_json(json.loads(json.dumps(_to_json(res)))) == res
