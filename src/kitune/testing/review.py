"""Deterministic stand-ins for the review queue's tests: production chats, a drafter, an evaluator.

* :func:`chat_record` — one OpenAI-style conversation (user question, tool calls with their
  results, final ``Exact Answer:``), the shape ``kitune traces import`` reads.
* :func:`scenario` — a small production day over a 3-document corpus: two episodes fall back
  to the same document (``re_extract``), one falls back to another and finds the answer there
  (``add_ki``), two show one KI and answer something it does not say (``retire_ki``), and three
  distinct look-ups find nothing (``rewriter_feedback``). Unlabelled.
* :class:`TableDrafter` — the extractor stand-in: document id → the KIs it "extracts".
* :func:`gold_evaluator` — the agent stand-in: a question is answered correctly exactly when
  the store serves an active KI whose title contains its gold answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kitune.data.loaders import Question
from kitune.evaluation.metrics import Trace
from kitune.ki import KI
from kitune.retrieval.base import Store
from kitune.schema import Document, Filter
from kitune.testing.store_contract import make_ki
from kitune.text import contains_answer

__all__ = ["Scenario", "TableDrafter", "chat_record", "gold_evaluator", "scenario"]


def chat_record(
    rid: str, question: str, calls: Sequence[tuple[str, Mapping[str, str], str]], answer: str, **extra: Any
) -> dict[str, Any]:
    """One conversation: ``calls`` are ``(tool, arguments, result text)`` in order.

    Returns:
        ``{"id", "messages", **extra}`` (``doc_ids_seen``, ``gold_answer``, … go in ``extra``).
    """
    msgs: list[dict[str, Any]] = [{"role": "user", "content": question}]
    for i, (tool, args, result) in enumerate(calls):
        cid = f"{rid}-c{i}"
        call = {
            "id": cid,
            "type": "function",
            "function": {"name": tool, "arguments": json.dumps(dict(args))},
        }
        msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": cid, "content": result})
    msgs.append({"role": "assistant", "content": f"Explanation: see above\nExact Answer: {answer}"})
    return {"id": rid, "messages": msgs, **extra}


@dataclass(frozen=True)
class Scenario:
    """A production day: corpus, KI store contents, conversations and what the drafter extracts."""

    docs: list[Document]
    kis: list[KI]
    chats: list[dict[str, Any]]
    drafts: dict[str, list[KI]]
    questions: list[Question] = field(default_factory=list)
    """Labelled questions (for the effect and the gate)."""


def scenario() -> Scenario:
    """The production day described in the module docstring."""
    docs = [
        Document("d1", "Paris is the capital of France.", title="Paris"),
        Document("d7", "Henry Dunant founded the Red Cross in 1863 in Geneva.", title="Red Cross"),
        Document("d8", "The Eiffel Tower was designed by Stephen Sauvestre.", title="Eiffel Tower"),
    ]
    paris = make_ki("Paris", "France", docid="d1", predicate="capital_of", confidence=90)
    dunant = make_ki(
        "Red Cross",
        "Henry Dunant",
        docid="d7",
        predicate="founded_by",
        title="The Red Cross was founded by Henry Dunant.",
    )
    geneva = make_ki(
        "Red Cross",
        "Geneva",
        docid="d7",
        predicate="founded_in",
        title="The Red Cross was founded in Geneva.",
    )
    sauvestre = make_ki(
        "Eiffel Tower",
        "Stephen Sauvestre",
        docid="d8",
        predicate="designed_by",
        title="The Eiffel Tower was designed by Stephen Sauvestre.",
    )
    ki_line = f"1. [{paris.id}] {paris.title} — {paris.description} (docs: d1)"
    chats = [
        chat_record(
            "conv-1",
            "Who founded the Red Cross?",
            [
                ("get_context", {"query": "Red Cross founder"}, "no KIs found for: Red Cross founder"),
                ("get_context", {"query": "red cross founder?"}, "no KIs found for: red cross founder?"),
                (
                    "search",
                    {"query": "Red Cross founded"},
                    "1. [d7] Red Cross\n  … Henry Dunant founded the Red Cross",
                ),
            ],
            "Henry Dunant",
            doc_ids_seen=["d7"],
        ),
        chat_record(
            "conv-2",
            "Where was the Red Cross founded?",
            [
                ("get_context", {"query": "Red Cross city"}, "no KIs found for: Red Cross city"),
                (
                    "search",
                    {"query": "Red Cross Geneva"},
                    "1. [d7] Red Cross\n  … founded the Red Cross in 1863 in Geneva",
                ),
            ],
            "Geneva",
            doc_ids_seen=["d7"],
        ),
        chat_record(
            "conv-3",
            "Who designed the Eiffel Tower?",
            [
                (
                    "get_context",
                    {"query": "Eiffel Tower designer"},
                    "no KIs found for: Eiffel Tower designer",
                ),
                (
                    "search",
                    {"query": "Eiffel Tower design"},
                    "1. [d8] Eiffel Tower\n  … designed by Stephen Sauvestre",
                ),
            ],
            "Stephen Sauvestre",
            doc_ids_seen=["d8"],
        ),
        chat_record(
            "conv-4",
            "What is the largest city of France?",
            [("get_context", {"query": "France city"}, ki_line)],
            "Marseille",
        ),
        chat_record(
            "conv-5",
            "Which river crosses Paris?",
            [("get_context", {"query": "Paris river"}, ki_line)],
            "Seine",
        ),
    ]
    questions = [
        Question("g1", "Who designed the Eiffel Tower?", "Stephen Sauvestre"),
        Question("g2", "What is the capital of France?", "Paris"),
    ]
    return Scenario(docs, [paris], chats, {"d7": [dunant, geneva], "d8": [sauvestre]}, questions)


@dataclass
class TableDrafter:
    """The extractor stand-in: ``drafts[docid]`` are the KIs "extracted" from that document."""

    drafts: Mapping[str, Sequence[KI]]
    calls: list[str] = field(default_factory=list)

    def __call__(self, doc: Document) -> list[KI]:
        """The table's KIs for ``doc`` (``[]`` for a document not in the table)."""
        self.calls.append(doc.docid)
        return list(self.drafts.get(doc.docid, ()))


def gold_evaluator(calls: list[str] | None = None) -> Any:
    """An :data:`~kitune.service.workflows.review.Evaluator`: right iff an active KI's title holds the gold.

    Args:
        calls: when given, each call's label is appended (to check which arms ran).
    """

    def evaluate(
        questions: Sequence[Question], store: Store, rewriter_text: str | None, label: str
    ) -> list[Trace]:
        if calls is not None:
            calls.append(label)
        titles = [k.title for k in store.iter_kis(Filter(statuses=("active",)))]
        out = []
        for q in questions:
            hit = next((t for t in titles if contains_answer(t, [q.answer])), None)
            out.append(
                Trace(
                    query_id=q.query_id,
                    skill="in-context",
                    question=q.query,
                    gold_answer=q.answer,
                    status="answered",
                    exact_answer=q.answer if hit else "",
                    judge_correct=hit is not None,
                    judge_status="graded",
                    input_tokens=1000,
                )
            )
        return out

    return evaluate
