"""A reply holding the JSON escape of half an emoji pair extracts its document (issue 25).

In a real run (qwen2.5-coder-1.5b on llama.cpp) one document failed with ``UnicodeEncodeError:
'utf-8' codec can't encode character '\\ud83d' … surrogates not allowed``: the model wrote
``"\\ud83d"`` (half of U+1F600), JSON decoded it to a lone surrogate and the KI id's hash failed on
it. The reply is now read with the half as U+FFFD (counted), the escaped pair as the emoji itself,
and evidence stays verbatim or the fact is dropped with its reason.
"""

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
TEXT = "Jane Roe reacted with \U0001f600 to the news. Acme Corp was founded in 1999 by Jane Roe."
# The reply as the model wrote it: JSON escapes, every character ASCII.
PAIRED = (
    '{"title": "Jane Roe reacted with \\ud83d\\ude00 to the news", '
    '"description": "Jane Roe reacted with \\ud83d\\ude00 to the news.", "subject": "Jane Roe", '
    '"predicate": "reacted_to", "object": "the news", '
    '"evidence_span": "Jane Roe reacted with \\ud83d\\ude00 to the news.", "confidence": 80}'
)
HALF_ONLY_FIELD = (
    '{"title": "Acme Corp was founded in 1999", "description": "\\ud83d", "subject": "Acme Corp", '
    '"predicate": "founded_in", "object": "1999", "evidence_span": "Acme Corp was founded in 1999", '
    '"confidence": 90}'
)
HALF_IN_EVIDENCE = (
    '{"title": "Jane Roe reacted with an emoji", "description": "Jane Roe reacted with an emoji.", '
    '"subject": "Jane Roe", "predicate": "reacted_with", "object": "\\ud83d", '
    '"evidence_span": "Jane Roe reacted with \\ud83d", "confidence": 70}'
)
REPLY = f"[{PAIRED}, {HALF_ONLY_FIELD}, {HALF_IN_EVIDENCE}]"


class RawLM(DummyLM):
    """DummyLM that returns each answer verbatim (no DSPy field markers): what a model really sends."""

    def _format_answer_fields(self, v):  # type: ignore[no-untyped-def,override]
        return v if isinstance(v, str) else super()._format_answer_fields(v)


def test_the_reply_is_ascii_and_json_gives_lone_surrogates() -> None:
    assert REPLY.isascii()
    facts = json.loads(REPLY)
    assert facts[1]["description"] == "\ud83d" and facts[0]["object"] == "the news"


def test_a_document_whose_reply_holds_half_an_emoji_pair_is_extracted(tmp_path: Path) -> None:
    cfg = load_config(overrides={"extraction.concurrency": 1})
    state = tmp_path / "state.jsonl"
    store = MemoryStore()
    with dspy.context(lm=RawLM({"Jane Roe reacted": REPLY})):
        report = extract_corpus(
            [Document(docid="d1", text=TEXT)],
            store,
            FactExtractor.from_config(cfg),
            cfg=cfg,
            state_path=state,
            progress=False,
            now=NOW,
        )
    assert (report.docs_done, report.docs_failed, report.failed) == (1, 0, {})
    assert report.kis_written == 2
    # the half in the third fact's object and evidence: read as U+FFFD, its evidence is not in the
    # document any more, so the fact is dropped with the usual reason (never repaired into a match)
    assert report.drops == {"evidence_not_found": 1}
    assert report.counters["surrogates_replaced"] == 3
    kis = sorted(store.iter_kis(), key=lambda k: k.title)
    assert [(k.title, k.description, k.payload.evidence) for k in kis] == [
        ("Acme Corp was founded in 1999", "\ufffd", ["Acme Corp was founded in 1999"]),
        (
            "Jane Roe reacted with \U0001f600 to the news",
            "Jane Roe reacted with \U0001f600 to the news.",
            ["Jane Roe reacted with \U0001f600 to the news."],
        ),
    ]
    for ki in kis:  # what a store or an export writes: every KI is valid UTF-8
        assert json.loads(ki.model_dump_json().encode("utf-8"))["id"] == ki.id
    (record,) = [json.loads(line) for line in state.read_text(encoding="utf-8").splitlines()]
    assert (record["docid"], record["status"], record["kis"], record["error"]) == ("d1", "ok", 2, "")
    assert read_state(state) == {"d1": "ok"}
