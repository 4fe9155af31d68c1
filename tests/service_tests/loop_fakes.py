"""A tiny dataset and scripted models for the loop, drift and demo service tests."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kitune.chat import ChatMessage
from kitune.config import KituneConfig
from kitune.retrieval.memory import MemoryStore
from kitune.service.tuning.loop_env import LoopDeps
from kitune.testing.chat import ScriptedChatModel

DOCS = [
    (
        "d1",
        "Marie Curie",
        "Marie Curie was born in Warsaw in Poland. Marie Curie moved to Paris in the year 1891.",
    ),
    (
        "d2",
        "Eiffel Tower",
        "The Eiffel Tower stands in Paris in France. The Eiffel Tower opened in the year 1889.",
    ),
    ("d3", "Lima", "Lima is the capital city of Peru. The city of Lima was founded in the year 1535."),
    ("d4", "Quito", "Quito is the capital city of Ecuador. Quito lies high in the Andes mountains."),
    ("d5", "Oslo", "Oslo is the capital city of Norway. Oslo hosts the Nobel Peace Prize ceremony."),
    ("d6", "Cairo", "Cairo is the capital city of Egypt. Cairo lies on the banks of the Nile river."),
]
QUESTIONS = [
    ("q1", "In which city was Marie Curie born?", "Warsaw", "d1"),
    ("q2", "In which year did the Eiffel Tower open?", "1889", "d2"),
    ("q3", "In which year was the city of Lima founded?", "1535", "d3"),
    ("q4", "What is the capital city of Ecuador?", "Quito", "d4"),
]
GOLD = {q: a for _, q, a, _ in QUESTIONS}


def write_dataset(root: Path, questions: list[tuple[str, str, str, str]] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    with (root / "corpus.jsonl").open("w") as fh:
        for docid, title, text in DOCS:
            fh.write(json.dumps({"docid": docid, "title": title, "text": text}) + "\n")
    with (root / "questions.jsonl").open("w") as fh:
        for qid, query, answer, doc in questions or QUESTIONS:
            fh.write(
                json.dumps(
                    {
                        "query_id": qid,
                        "query": query,
                        "answer": answer,
                        "evidence_docids": [doc],
                        "gold_docids": [doc],
                    }
                )
                + "\n"
            )
    return root


def _fact(sentence: str) -> dict[str, Any]:
    subject = " ".join(sentence.split()[:2])
    return {
        "title": sentence,
        "description": sentence + " This is stated in the source text.",
        "subject": subject,
        "predicate": "described_as",
        "object": sentence.split()[-1].rstrip("."),
        "evidence_span": sentence,
        "confidence": 80,
        "tags": ["place"],
    }


def extractor_rule(system: str, user: str) -> dict[str, Any]:
    """First sentence only; with 'DATES' in the instruction also sentences with a year."""
    m = re.search(r"\[\[ ## text ## \]\]\n(.*?)(?:\n\n\[\[|\Z)", user, re.S)
    text = m.group(1) if m else ""
    sentences = [s.strip() for s in re.findall(r"[^.]+\.", text)]
    keep = sentences[:1] + (
        [s for s in sentences[1:] if re.search(r"\b1[0-9]{3}\b", s)] if "DATES" in system else []
    )
    return {"facts": [_fact(s) for s in keep]}


def reflection_rule(system: str, user: str) -> dict[str, Any]:
    return {"new_instruction": "Extract every fact of the document, with the DATES of every event."}


def disambiguator_rule(system: str, user: str) -> dict[str, Any]:
    question = re.search(r"\[\[ ## question ## \]\]\n(.*?)\n", user)
    correct = re.search(r"\[\[ ## correct_answer ## \]\]\n(.*?)\n", user)
    wrong = re.search(r"\[\[ ## wrong_answer ## \]\]\n(.*?)\n", user)
    c, w = (correct.group(1) if correct else ""), (wrong.group(1) if wrong else "")
    return {
        "title": f"{question.group(1) if question else ''} The answer is {c}, not {w}.",
        "description": f"The source says {c}; {w} is a different answer.",
        "evidence": c,
    }


def task_rule(system: str, user: str) -> dict[str, Any]:
    """The task model: :func:`disambiguator_rule` on a disambiguator request, else :func:`extractor_rule`."""
    if "[[ ## correct_answer ## ]]" in user:
        return disambiguator_rule(system, user)
    return extractor_rule(system, user)


def tiny_config(tmp_path: Path, **optimize: Any) -> KituneConfig:
    """The loop tests' config: workdir in ``tmp_path``, 4 agent steps, 1 worker, half the slice validates.

    The permissive decision rule unless ``decision_rule`` is given: a few-question fixture is too
    small for the stage rule to accept anything (its paired tests need ≥ 5 questions at α 0.05),
    and these tests check the loop's wiring, not its statistics.
    """
    return KituneConfig(
        workdir=tmp_path / "w",
        corpus_name="tiny",
        agent={"max_steps": 4, "concurrency": 1},
        optimize={"validation_fraction": 0.5, "seed": 0, "decision_rule": "permissive", **optimize},
        extraction={"concurrency": 1},
    )


def agent_turn(messages: list[ChatMessage]) -> str:
    """get_context on the question first; then answer the gold answer if the context shows it, else 'Lyon'."""
    question = messages[1]["content"]
    if len(messages) <= 2:
        tool = "get_context" if "get_context" in messages[0]["content"] else "search"
        return json.dumps({"tool": tool, "args": {"query": question}})
    seen = " ".join(m["content"] for m in messages[2:])
    gold = next((a for q, a in GOLD.items() if q in question), "")
    answer = gold if gold and gold in seen else "Lyon"
    return json.dumps({"answer": {"explanation": "from the facts", "exact_answer": answer, "confidence": 60}})


@dataclass(frozen=True)
class Verdict:
    correct: bool | None
    status: str = "graded"


def judge(*, question: str, response: str, gold: str, aliases: list[str]) -> Verdict:
    return Verdict(f"Exact Answer: {gold}\n" in response)


def make_deps(
    task_lm: Any,
    reflection_lm: Any,
    *,
    stores: dict[str, MemoryStore] | None = None,
    corpus_store: Any = None,
) -> LoopDeps:
    from kitune.usage import TokenLedger

    opened = stores if stores is not None else {}

    def store_factory(cfg: KituneConfig) -> MemoryStore:
        key = getattr(cfg.store, "table", "kis")
        if key not in opened:
            opened[key] = MemoryStore(retrieval=cfg.retrieval)
        return opened[key]

    return LoopDeps(
        lms={"extract": task_lm, "rewrite": task_lm, "reflection": reflection_lm},
        chat_model=ScriptedChatModel([agent_turn] * 2000, usage=(200, 20)),
        judge=judge,
        store_factory=store_factory,
        corpus_store=corpus_store,
        ledger=TokenLedger(),
    )
