"""The evidence-modes benchmark, run end to end against a scripted OpenAI-compatible stub."""

from __future__ import annotations

import json
import re
from pathlib import Path

from evidence_modes import main

from kitune.lm import reset_format_memory
from kitune.testing.faults import request_text
from kitune.testing.lm import stub_server_lm
from kitune.testing.openai_stub import RecordedRequest, Reply, StubServer
from kitune.usage import TokenLedger

CORPUS = [
    {"docid": "a1", "title": "Acme", "text": "Acme Corp was founded in 1999. It is based in Springfield."},
    {"docid": "b2", "title": "Bolt", "text": "Bolt Ltd makes bolts. Bolt Ltd was founded in 1950."},
]


def _fact(subject: str, obj: str, **evidence: object) -> dict[str, object]:
    return {
        "title": f"{subject} was founded in {obj}",
        "description": f"{subject} was founded in {obj}.",
        "subject": subject,
        "predicate": "founded_in",
        "object": obj,
        "confidence": 80,
        "tags": [],
        **evidence,
    }


def responder(request: RecordedRequest) -> Reply:
    """Quote mode: one fact quoted verbatim, one misquoted. Sentence mode: the same facts cited."""
    text = request_text(request)
    acme = "Acme Corp" in text
    subject, obj = ("Acme Corp", "1999") if acme else ("Bolt Ltd", "1950")
    if re.search(r"^\[1\] ", text, re.M):
        facts = [_fact(subject, obj, evidence_sentences=[1 if acme else 2])]
    else:
        quote = "Acme Corp was founded in 1999" if acme else "Bolt Ltd was founded in 1950"
        wrong = _fact(subject, "2001", evidence_span="founded 2001")
        facts = [_fact(subject, obj, evidence_span=quote), wrong]
    content = json.dumps({"facts": facts})
    return Reply.ok(content, usage=(200, len(content) // 4))


def test_both_modes_are_measured_and_written(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in CORPUS))
    reset_format_memory()
    ledger = TokenLedger()
    with StubServer(responder=responder) as stub:
        lm = stub_server_lm(stub.base_url, ledger=ledger)
        argv = ["--data", str(corpus), "--docs", "2", "--out-dir", str(tmp_path)]
        results = main(argv, lm=lm, ledger=ledger)
    quote, sentences = results["quote"], results["sentences"]
    assert quote["kis_per_doc"] == [1, 1] and sentences["kis_per_doc"] == [1, 1]
    assert quote["drops"] == {"evidence_not_found": 2} and sentences["drops"] == {}
    assert quote["status"] == {"ok": 2} and sentences["status"] == {"ok": 2}
    assert quote["lm_calls"] == sentences["lm_calls"] == 2
    # output tokens are the stub's reported usage: the quote replies are longer
    assert quote["output_tokens"] > sentences["output_tokens"] > 0
    assert quote["input_tokens"] == sentences["input_tokens"] == 400
    saved = json.loads((tmp_path / "evidence_modes.json").read_text())
    assert saved["results"]["sentences"]["kis_total"] == 2
    md = (tmp_path / "evidence_modes.md").read_text()
    assert "| quote |" in md and "| sentences |" in md and "evidence_not_found" in md
