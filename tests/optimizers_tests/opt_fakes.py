"""Stand-in LMs for optimiser tests: replies chosen by a rule over the system and user messages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dspy.utils import DummyLM

Rule = Callable[[str, str], dict[str, Any]]


class RuleLM(DummyLM):
    """A DummyLM whose reply is ``rule(system_text, last_user_text)`` (a dict of output fields).

    Unlike DummyLM's dict mode it sees the system message, so the reply can depend on the
    instruction an optimiser wrote. Calls are counted in :attr:`calls`.
    """

    def __init__(self, rule: Rule, *, json: bool = False) -> None:
        import dspy

        super().__init__([], follow_examples=True, adapter=dspy.JSONAdapter() if json else None)
        self.rule = rule
        self.calls = 0

    def _use_example(self, messages: list[dict[str, Any]]) -> str:
        self.calls += 1
        system = next((m["content"] for m in messages if m.get("role") == "system"), "")
        return str(self._format_answer_fields(self.rule(system, messages[-1]["content"])))


def fact(subject: str, predicate: str, obj: str, evidence: str) -> dict[str, object]:
    return {
        "title": f"{subject} {predicate.replace('_', ' ')} {obj}.",
        "description": f"{subject} {predicate.replace('_', ' ')} {obj}.",
        "subject": subject,
        "predicate": predicate,
        "object": obj,
        "evidence_span": evidence,
        "confidence": 80,
        "tags": ["org"],
    }


def extractor_rule(system: str, user: str) -> dict[str, Any]:
    """With 'DATES' in the instruction the extractor states the founding year; else only the city."""
    facts = [
        fact("Acme Corp", "headquartered_in", "Springfield", "Acme Corp is headquartered in Springfield")
    ]
    if "DATES" in system:
        facts.append(fact("Acme Corp", "founded_in", "1999", "Acme Corp was founded in 1999"))
    return {"facts": facts}


def reflection_rule(system: str, user: str) -> dict[str, Any]:
    return {"new_instruction": "Extract every fact, with DATES of every event."}


def reflection_lm() -> RuleLM:
    """GEPA's proposer parses JSON replies."""
    return RuleLM(reflection_rule, json=True)
