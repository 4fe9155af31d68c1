"""Shared set-up for the reliability tests: fixture slices, good replies, stub configs."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kitune.config import KituneConfig, load_config
from kitune.data.loaders import Question
from kitune.schema import Document
from kitune.testing.faults import dspy_docid, request_text
from kitune.testing.openai_stub import RecordedRequest

NOW = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)

_SENT = re.compile(r"(?<=[.!?])\s+")


def facts_for(doc: Document) -> list[dict[str, Any]]:
    """Two deterministic, verifiable facts for ``doc`` (evidence = its first two sentences)."""
    out = []
    for i, sentence in enumerate(s for s in _SENT.split(doc.text) if len(s.split()) >= 4):
        if i == 2:
            break
        evidence = " ".join(sentence.split()[:12])
        evidence = doc.text[doc.text.find(evidence.split()[0]) :][: len(evidence)]
        if evidence not in doc.text:  # whitespace differences: fall back to the raw prefix
            evidence = sentence[:80]
        subject = f"Entity {doc.docid}"
        obj = f"value {i} of {doc.docid}"
        pred = ("first_fact", "second_fact")[i]
        out.append(
            {
                "title": f"{subject} has {pred.replace('_', ' ')} {obj}",
                "description": f"{subject} has {pred.replace('_', ' ')} {obj}.",
                "subject": subject,
                "predicate": pred,
                "object": obj,
                "evidence_span": evidence,
                "confidence": 80,
                "tags": ["fact"],
            }
        )
    return out


def extraction_reply(docs: dict[str, Document]) -> Any:
    """A ``good`` callable for :class:`FaultyProvider`: the JSON facts for the request's document."""

    def good(request: RecordedRequest) -> str:
        doc = docs.get(dspy_docid(request))
        return json.dumps(facts_for(doc)) if doc is not None else "[]"

    return good


_QUESTION = re.compile(r"Question: (?P<q>[^\n]*)")


def question_key(request: RecordedRequest) -> str:
    """The question text of an agent request (first ``Question:`` line)."""
    m = _QUESTION.search(request_text(request))
    return m.group("q").strip() if m else ""


def agent_reply(questions: list[Question]) -> Any:
    """A ``good`` callable: the agent answers every question with its gold answer."""
    gold = {q.query: q.answer for q in questions}

    def good(request: RecordedRequest) -> str:
        answer = gold.get(question_key(request), "unknown")
        return json.dumps(
            {"answer": {"explanation": "From memory [none].", "exact_answer": answer, "confidence": 70}}
        )

    return good


def stub_config(base_url: str, workdir: Path | None = None, **overrides: object) -> KituneConfig:
    """A config whose gateway is the stub at ``base_url`` (env vars must be set by the caller)."""
    base: dict[str, object] = {
        "lm.gateway.base_url_env": "KI_GW_URL",
        "lm.gateway.api_key_env": "KI_GW_KEY",
        "lm.gateway.default_model": "m-small",
        "extraction.concurrency": 2,
        "extraction.write_batch_size": 8,
    }
    if workdir is not None:
        base["workdir"] = str(workdir)
    base.update(overrides)
    return load_config(overrides=base)


def fixture_slice(fixture_dir: Path, n: int) -> list[Document]:
    """The first ``n`` fixture documents."""
    from kitune.data.loaders import load_corpus

    return load_corpus(fixture_dir)[:n]
