"""extraction.grammar_limits: the guardrails' limits go into llama.cpp's grammar, for the local model only."""

from __future__ import annotations

import json
import types
from typing import Any

import dspy
import pytest

import kitune.localmodel
from kitune.config import load_config
from kitune.ki import DESCRIPTION_MAX_CHARS, TITLE_MAX_CHARS
from kitune.lm import build_lm
from kitune.programs.fact_extractor import FactExtractor
from kitune.schema import Document
from kitune.testing.openai_stub import Reply, StubServer
from kitune.usage import TokenLedger

DOC = Document(docid="d1", title="Acme", text="Acme was founded in 1990 in Oslo. It makes anvils.")
REPLY = json.dumps(
    {
        "facts": [
            {
                "title": "Acme was founded in Oslo in 1990.",
                "description": "Acme, a company, was founded in 1990 in Oslo.",
                "subject": "Acme",
                "predicate": "founded_in",
                "object": "Oslo",
                "evidence_sentences": [1],
                "tags": ["company"],
                "confidence": 90,
            }
        ]
    }
)


def _schema_props(body: dict[str, Any]) -> dict[str, Any]:
    schema = body["response_format"]["schema"]
    records = [d for d in (schema.get("$defs") or {}).values() if "title" in d.get("properties", {})]
    assert len(records) == 1
    return dict(records[0]["properties"])


@pytest.mark.parametrize("limits", [True, False])
def test_local_extractor_sends_the_guardrail_limits_in_its_grammar_only_when_on(
    stub: StubServer, monkeypatch: pytest.MonkeyPatch, limits: bool
) -> None:
    server = types.SimpleNamespace(api_base=stub.base_url, model_alias="qwen-local")
    monkeypatch.setattr(kitune.localmodel, "get_local_server", lambda local_cfg: server)
    stub.push(Reply.ok(REPLY))
    cfg = load_config(
        overrides={"extraction.evidence_mode": "sentences", "extraction.grammar_limits": limits}
    )
    lm = build_lm(cfg, "extract", ledger=TokenLedger())
    with dspy.context(lm=lm):
        result = FactExtractor.from_config(cfg).extract_document(DOC)
    assert [k.title for k in result.kis] == ["Acme was founded in Oslo in 1990."]
    (req,) = stub.chat_requests
    props = _schema_props(req.body)
    got = (props["title"].get("maxLength"), props["description"].get("maxLength"))
    cited = (props["evidence_sentences"].get("minItems"), props["evidence_sentences"].get("maxItems"))
    if limits:
        assert (got, cited) == ((TITLE_MAX_CHARS, DESCRIPTION_MAX_CHARS), (1, 3))
    else:
        assert (got, cited) == ((None, None), (None, None))


def test_grammar_limits_default_on_and_a_provider_request_never_carries_them(
    gateway_cfg: Any, stub: StubServer
) -> None:
    assert load_config().extraction.grammar_limits is True
    stub.push(Reply.ok(REPLY))
    cfg = gateway_cfg(**{"extraction.evidence_mode": "sentences"})
    lm = build_lm(cfg, "extract", ledger=TokenLedger())
    with dspy.context(lm=lm):
        FactExtractor.from_config(cfg).extract_document(DOC)
    (req,) = stub.chat_requests
    assert "maxLength" not in json.dumps(req.body.get("response_format") or {})
