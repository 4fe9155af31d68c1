"""A document whose reply stays unusable is recorded failed with its raw reply kept (issue 25)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import dspy
from dspy.utils import DummyLM

from kitune.config import load_config
from kitune.programs.fact_extractor import FactExtractor
from kitune.retrieval.memory import MemoryStore
from kitune.schema import Document
from kitune.service.pipelines.extraction import extract_corpus, read_state

NOW = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
PROSE = "Let me think about this document first. It mentions Acme."
GOOD = {
    "title": "Acme Corp was founded in 1999",
    "description": "Acme Corp was founded in 1999 by Jane Roe.",
    "subject": "Acme Corp",
    "predicate": "founded_in",
    "object": "1999",
    "evidence_span": "Acme Corp was founded in 1999",
    "confidence": 80,
}


class RawLM(DummyLM):
    """DummyLM that returns each answer verbatim (no DSPy field markers): what a model really sends."""

    def _format_answer_fields(self, v):  # type: ignore[no-untyped-def,override]
        return v if isinstance(v, str) else super()._format_answer_fields(v)


def test_failed_document_keeps_its_raw_reply_in_the_state_file(tmp_path: Path) -> None:
    docs = [
        Document(docid="ok", text="Acme Corp was founded in 1999 by Jane Roe."),
        Document(docid="bad", text="Globex was founded in 2001 by Hank Scorpio."),
    ]
    lm = RawLM({"Acme Corp was founded": json.dumps([GOOD]), "Globex was founded": PROSE})
    cfg = load_config(overrides={"extraction.concurrency": 1})
    state = tmp_path / "state.jsonl"
    with dspy.context(lm=lm):
        report = extract_corpus(
            docs,
            MemoryStore(),
            FactExtractor.from_config(cfg),
            cfg=cfg,
            state_path=state,
            progress=False,
            now=NOW,
        )
    assert (report.docs_done, report.docs_failed) == (1, 1)
    assert report.failed["bad"].startswith("no JSON object found: ")
    lines = {rec["docid"]: rec for rec in map(json.loads, state.read_text(encoding="utf-8").splitlines())}
    assert lines["bad"]["status"] == "failed"
    assert lines["bad"]["raw"] == PROSE  # the model's own reply, whole, for debugging
    assert "raw" not in lines["ok"]
    assert read_state(state) == {"ok": "ok", "bad": "failed"}
