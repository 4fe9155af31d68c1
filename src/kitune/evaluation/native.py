"""The agent's native tool-calling protocol: function schemas, prompts, and reading tool calls.

In ``native`` mode (see :data:`kitune.chat.ToolMode`) each toolbox tool is sent as an OpenAI
function schema, plus an ``answer`` function whose arguments are the final answer
(``explanation``, ``exact_answer``, ``confidence``). A reply is read as:

* a call of ``answer`` → :class:`~kitune.evaluation.protocol.AnswerAction` (same tolerance as
  the JSON protocol: confidence drift, template placeholders rejected);
* a call of any other function → :class:`~kitune.evaluation.protocol.ToolAction`; only the
  first call of a reply runs (one step per model call, as in JSON mode) and the others are
  answered with an error;
* no call → the text is parsed with the JSON protocol (models sometimes answer in text), else
  it is an invalid step.

:func:`canonical_reply` renders a call the way the JSON protocol would have it written, so an
episode's trace is the same in both modes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kitune.chat import ChatResponse, ToolCall
from kitune.errors import ParseError
from kitune.evaluation.protocol import _SKILL_RULES, AnswerAction, ToolAction, parse_action
from kitune.evaluation.tools import Toolbox

__all__ = [
    "ANSWER_TOOL",
    "NativeTurn",
    "answer_schema",
    "canonical_reply",
    "native_force_commit_prompt",
    "native_system_prompt",
    "read_native_reply",
    "tool_schemas",
]

ANSWER_TOOL = "answer"
"""Name of the function that carries the final answer."""


def answer_schema() -> dict[str, Any]:
    """The ``answer`` function schema (explanation citing [docid], exact answer, confidence 0–100)."""
    return {
        "type": "function",
        "function": {
            "name": ANSWER_TOOL,
            "description": "Give your final answer. Call it once, when you know the answer.",
            "parameters": {
                "type": "object",
                "properties": {
                    "explanation": {
                        "type": "string",
                        "description": "Short reasoning that cites the supporting documents as [docid].",
                    },
                    "exact_answer": {
                        "type": "string",
                        "description": "The answer only, as short as possible.",
                    },
                    "confidence": {"type": "integer", "minimum": 0, "maximum": 100, "description": "0-100."},
                },
                "required": ["explanation", "exact_answer", "confidence"],
                "additionalProperties": False,
            },
        },
    }


def tool_schemas(toolbox: Toolbox) -> list[dict[str, Any]]:
    """OpenAI function schemas for every tool of ``toolbox`` (string arguments, all required) + ``answer``."""
    out = []
    for t in toolbox.tools.values():
        props = {name: {"type": "string", "description": desc} for name, desc in t.args.items()}
        out.append(
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": {
                        "type": "object",
                        "properties": props,
                        "required": list(t.args),
                        "additionalProperties": False,
                    },
                },
            }
        )
    out.append(answer_schema())
    return out


def native_system_prompt(skill: str, max_steps: int) -> str:
    """The system message in native mode: the skill's rules, one call per turn, finish with ``answer``."""
    rules = _SKILL_RULES.get(skill, "")
    return (
        "You answer a question, step by step, with tools.\n"
        f"{rules}\n\n"
        "Call one tool per turn. When you know the answer, call the answer tool with a short explanation "
        "that cites the supporting documents as [docid], the exact answer only, and your confidence 0-100.\n"
        f"You have at most {max_steps} turns. Do not repeat a call that already returned a result."
    )


def native_force_commit_prompt() -> str:
    """The final request after the budget is spent (sent with only the ``answer`` function)."""
    return (
        "Your budget is spent: no more tools. Using only the observations above, call answer now with your "
        "most likely answer, even if unsure."
    )


def canonical_reply(action: ToolAction | AnswerAction) -> str:
    """The JSON-protocol text of ``action`` (what a Step's ``reply`` holds in both modes)."""
    if isinstance(action, AnswerAction):
        body = {
            "explanation": action.explanation,
            "exact_answer": action.exact_answer,
            "confidence": action.confidence,
        }
        return json.dumps({"answer": body}, ensure_ascii=False)
    return json.dumps({"tool": action.tool, "args": action.args}, ensure_ascii=False)


@dataclass(frozen=True)
class NativeTurn:
    """One native reply, read."""

    action: ToolAction | AnswerAction | None
    """The action, or None when the reply was unusable (``error`` says why)."""
    error: str | None
    """Why the reply was unusable."""
    reply: str
    """The canonical JSON text of the action, else the reply text."""
    call: ToolCall | None
    """The function call that is run (None for a text reply)."""
    skipped: tuple[ToolCall, ...] = ()
    """Further calls in the same reply, answered with an error and not run."""


def _arguments(call: ToolCall) -> dict[str, Any]:
    raw = call.arguments.strip() if isinstance(call.arguments, str) else call.arguments
    if isinstance(raw, dict):
        return raw
    if not raw:
        return {}
    try:
        args = json.loads(raw)
    except json.JSONDecodeError:
        import json_repair

        args = json_repair.loads(raw)
    if not isinstance(args, dict):
        raise ParseError(f"{call.name} arguments are not a JSON object: {raw[:200]}", raw=str(raw))
    return args


def read_native_reply(resp: ChatResponse) -> NativeTurn:
    """Turn one response of a ``tools=`` call into an action (see the module docstring). Never raises."""
    calls: Sequence[ToolCall] = resp.tool_calls
    if not calls:
        try:
            action = parse_action(resp.text)
        except ParseError as e:
            return NativeTurn(None, str(e), resp.text, None)  # same error text as the JSON protocol
        return NativeTurn(action, None, canonical_reply(action), None)
    first, rest = calls[0], tuple(calls[1:])
    try:
        args = _arguments(first)
        if first.name == ANSWER_TOOL:
            parsed = parse_action(json.dumps({"answer": args}))
        else:
            parsed = ToolAction(tool=first.name.strip(), args=args)
    except ParseError as e:
        return NativeTurn(None, str(e), f"{first.name}({first.arguments})"[:500], first, rest)
    if isinstance(parsed, ToolAction) and first.name == ANSWER_TOOL:
        return NativeTurn(None, "answer arguments hold no exact_answer", canonical_reply(parsed), first, rest)
    return NativeTurn(parsed, None, canonical_reply(parsed), first, rest)
