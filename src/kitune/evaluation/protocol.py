"""The agent's text protocol: prompts and the parser of its one-JSON-object replies.

Each turn the model replies with one JSON object, either a tool call
``{"tool": "<name>", "args": {...}}`` or the final answer
``{"answer": {"explanation": "... [docid] ...", "exact_answer": "...", "confidence": 0-100}}``.
The parser tolerates what models really emit (cases P1–P3, G1): code fences and a reasoning
preamble around the JSON, ``name``/``arguments`` key drift, arguments as a JSON string, an
envelope such as ``{"action": {...}}``, confidence as ``"85%"`` or ``0.85``. It never guesses:
a reply holding two different actions runs neither (see :func:`parse_action`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from kitune.errors import ParseError
from kitune.lm import repair_surrogates
from kitune.programs.records import coerce_confidence

__all__ = [
    "AnswerAction",
    "ToolAction",
    "force_commit_prompt",
    "parse_action",
    "parse_confidence",
    "system_prompt",
]

ANSWER_FORMAT = (
    '{"answer": {"explanation": "<short reasoning that cites the supporting documents as [docid]>", '
    '"exact_answer": "<the answer only, as short as possible>", "confidence": <integer 0-100>}}, '
    'for example {"answer": {"explanation": "Document [123] says the bridge opened in 1932.", '
    '"exact_answer": "1932", "confidence": 80}}'
)

_PLACEHOLDER = re.compile(r"^\s*<[^<>]*>\s*$")

_SKILL_RULES = {
    "baseline": "Search the document collection, read the documents you need, then answer.",
    "in-context": (
        "Use get_context first: it returns pre-computed facts with the documents that support them. "
        "Break multi-hop questions into one look-up per hop. Use search only after two get_context "
        "look-ups did not answer the question."
    ),
    "closed-book": "Answer from your own knowledge; there is nothing to look up.",
}


@dataclass(frozen=True)
class ToolAction:
    """A parsed tool call."""

    tool: str
    args: dict[str, Any]


@dataclass(frozen=True)
class AnswerAction:
    """A parsed final answer."""

    explanation: str
    exact_answer: str
    confidence: int
    """0–100."""


def system_prompt(skill: str, tools_text: str, max_steps: int) -> str:
    """The system message for ``skill``: the rules, the tools and the fixed answer format."""
    rules = _SKILL_RULES.get(skill, "")
    return (
        "You answer a question, step by step, with tools.\n"
        f"{rules}\n\n"
        f"Tools:\n{tools_text}\n\n"
        "Reply each turn with exactly ONE JSON object and nothing else: either a tool call as shown "
        f"above, or, when you know the answer, {ANSWER_FORMAT}\n"
        f"You have at most {max_steps} turns. Do not repeat a call that already returned a result."
    )


def force_commit_prompt() -> str:
    """The final, tool-less request after the budget is spent."""
    return (
        "Your budget is spent: no more tools. Using only the observations above, give your most likely "
        f"answer now, even if unsure, as {ANSWER_FORMAT}"
    )


def parse_confidence(value: Any) -> int:
    """The agent's confidence under the one confidence policy (``programs.records.coerce_confidence``).

    ``"85%"`` → 85, ``0.85`` → 85, ``"85"`` → 85. A value the policy rejects (a word such as
    ``"high"``, a boolean, 140, NaN) does not sink the answer: it is kept with confidence 50, the
    value that means "unknown" (case G1).
    """
    try:
        return coerce_confidence(value)
    except ValueError:
        return 50


def _json_objects(text: str) -> list[dict[str, Any]]:
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    i = text.find("{")
    while i >= 0:
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            found.append(repair_surrogates(obj))  # half an emoji pair ("\\ud83d") → U+FFFD
        i = text.find("{", end)
    return found


def _unwrap(obj: dict[str, Any]) -> dict[str, Any]:
    for key in ("action", "tool_call", "function_call", "response", "output", "result"):
        inner = obj.get(key)
        if isinstance(inner, dict) and len(obj) == 1:
            return _unwrap(inner)
    if isinstance(obj.get("function"), dict):  # OpenAI tool-call envelope
        return obj["function"]  # type: ignore[no-any-return]
    return obj


def _as_action(obj: dict[str, Any]) -> ToolAction | AnswerAction | None:
    obj = _unwrap(obj)
    answer = obj.get("answer", obj.get("final_answer"))
    if isinstance(answer, dict):
        # Fields that drifted out of the wrapper ({"answer": {"explanation"}, "exact_answer": …}).
        src = {**{k: v for k, v in obj.items() if k != "answer"}, **answer}
    elif "exact_answer" in obj:
        src = obj
    elif isinstance(answer, str | int | float) and not isinstance(answer, bool) and "tool" not in obj:
        src = {"exact_answer": answer, **{k: v for k, v in obj.items() if k != "answer"}}
    else:
        src = None
    if src is not None:
        exact = src.get("exact_answer", src.get("answer"))
        if exact is None or isinstance(exact, dict | list):
            return None
        if _PLACEHOLDER.match(str(exact)):
            raise ParseError(
                f"exact_answer {exact!r} is the template placeholder: write the actual answer", raw=str(exact)
            )
        return AnswerAction(
            explanation=str(src.get("explanation", src.get("reasoning", "")) or ""),
            exact_answer=str(exact).strip(),
            confidence=parse_confidence(src.get("confidence")),
        )
    name = obj.get("tool", obj.get("name", obj.get("tool_name")))
    if not isinstance(name, str) or not name.strip():
        return None
    args: Any = obj.get("args", obj.get("arguments", obj.get("parameters", obj.get("input", {}))))
    if isinstance(args, str):
        try:
            args = repair_surrogates(json.loads(args))
        except json.JSONDecodeError:
            args = {"query": args}
    if not isinstance(args, dict):
        return None
    return ToolAction(tool=name.strip(), args=args)


def parse_action(text: str) -> ToolAction | AnswerAction:
    """Parse one model reply into a tool call or an answer.

    The reply may hold prose and other JSON objects around its action (a preamble, a code fence,
    the copied answer template, which is skipped). The rule: **exactly one action is run, never
    a guess** — the JSON objects with a tool-call or answer shape are collected; when they are
    all the same action (a model that repeats itself) it is returned; when they differ (prose
    weighing ``{"tool": "search", …}`` against ``{"tool": "get_by_doc_id", …}``, or an example
    call before an answer) the reply is ambiguous and nothing is run.

    Raises:
        ParseError: no JSON object; none with a tool-call or answer shape; or several different
            actions (``reply held N different actions (…)``); ``raw`` holds the text.
    """
    objects = _json_objects(text or "")
    if not objects:
        raise ParseError(
            "reply held no JSON object: reply with exactly one JSON object (a tool call or the answer)",
            raw=text,
        )
    placeholder: ParseError | None = None
    actions: list[ToolAction | AnswerAction] = []
    for obj in objects:
        try:
            action = _as_action(obj)
        except ParseError as e:
            placeholder = placeholder or e
            continue
        if action is not None and action not in actions:
            actions.append(action)
    if len(actions) == 1:
        return actions[0]
    if actions:
        names = ", ".join(a.tool if isinstance(a, ToolAction) else "answer" for a in actions)
        raise ParseError(
            f"reply held {len(actions)} different actions ({names}): reply with exactly ONE JSON object; "
            "nothing was run",
            raw=text,
        )
    if placeholder is not None:
        raise ParseError(str(placeholder), raw=text)
    raise ParseError(
        'reply JSON is neither a tool call {"tool": ..., "args": {...}} nor {"answer": {...}}',
        raw=text,
        missing_fields=("tool", "answer"),
    )
