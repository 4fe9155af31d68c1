"""The agent's native tool-calling protocol: function schemas, prompts, and reading tool calls.

In ``native`` mode (see :data:`kitune.chat.ToolMode`) each toolbox tool is sent as an OpenAI
function schema, plus an ``answer`` function whose arguments are the final answer
(``explanation``, ``exact_answer``, ``confidence``). A reply is read as:

* a call of ``answer`` → :class:`~kitune.evaluation.protocol.AnswerAction` (same tolerance as
  the JSON protocol: confidence drift, template placeholders rejected);
* a call of any other function → :class:`~kitune.evaluation.protocol.ToolAction`;
* no call → the text is parsed with the JSON protocol (models sometimes answer in text). Such a
  content-borne action is labelled ``source="content"`` (a function call's is ``"tool_calls"``)
  and counts only when it is an ``answer`` or a call of an **offered** tool with exactly that
  tool's argument names; anything else is plain text (``code="plain_text"``, not a failed tool
  step: nothing was called), as is a reply that holds no action at all.

Arguments are parsed strictly, never repaired: a cut string (``'{"city": "Par'``, typically
with ``finish_reason="length"``) or one that is not a JSON object is a named error on that call
(``truncated_arguments`` / ``invalid_arguments``, with the raw text); the call is not run and
the call's tool message is a JSON error object (:func:`tool_error_json`:
``{"error": {"type": …, "tool": …, "message": …, "raw": …}}``) the model can read as data.

Several calls in one reply (parallel tool calls) are all read, in the model's order, one
:class:`NativeTurn` each; the agent runs them in that order, each as one step of the budget
(see :mod:`kitune.evaluation.agent`). An exact duplicate within one reply — the same id, name
and arguments text — is one call: it is read once (:func:`unique_calls`) and costs one step.

:func:`canonical_reply` renders a call the way the JSON protocol would have it written, so an
episode's trace is the same in both modes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kitune.chat import ChatResponse, ToolCall
from kitune.errors import ParseError
from kitune.evaluation.protocol import _SKILL_RULES, AnswerAction, ToolAction, parse_action
from kitune.evaluation.tools import Toolbox
from kitune.lm import repair_surrogates

__all__ = [
    "ANSWER_TOOL",
    "CUT_NOTE",
    "CallSource",
    "NativeTurn",
    "answer_schema",
    "canonical_reply",
    "native_force_commit_prompt",
    "native_system_prompt",
    "read_native_reply",
    "tool_error_json",
    "tool_schemas",
    "unique_calls",
]

CallSource = Literal["tool_calls", "content", "json"]
"""Where an action was read: a native function call (``tool_calls``), the message text of a
native-mode reply (``content``), or the reply of the JSON text protocol (``json``)."""

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
    """One action of a reply, read: one function call, or the whole text of a call-less reply."""

    action: ToolAction | AnswerAction | None
    """The action, or None when it was unusable (``error`` says why)."""
    error: str | None
    """Why the action was unusable (named: ``invalid_arguments: …``, ``truncated_arguments: …``)."""
    reply: str
    """The canonical JSON text of the action, else what the model wrote (``name(raw arguments)``)."""
    call: ToolCall | None
    """The function call this action came from (None for a text reply)."""
    source: CallSource = "tool_calls"
    """Where the action was read (see :data:`CallSource`)."""
    code: str | None = None
    """The error's name when unusable: ``invalid_arguments``, ``truncated_arguments``,
    ``invalid_answer``, ``plain_text`` (a native-mode reply with no usable call), ``unparseable``
    (a JSON-protocol reply that could not be read)."""


def tool_error_json(code: str, message: str, *, tool: str | None = None, raw: str | None = None) -> str:
    """The JSON error object a failed call's tool message carries (one line).

    Args:
        code: the error's name (``invalid_arguments``, ``truncated_arguments``, ``unknown_tool``, …).
        message: what was wrong and what to do instead.
        tool: the called tool's name, when there was one.
        raw: the arguments text as the model wrote it (first 200 characters kept).

    Returns:
        ``{"error": {"type": code, "tool": tool, "message": message, "raw": raw}}`` as JSON text
        (``tool`` and ``raw`` left out when None).
    """
    body: dict[str, Any] = {"type": code}
    if tool is not None:
        body["tool"] = tool
    body["message"] = message
    if raw is not None:
        body["raw"] = raw[:200]
    return json.dumps({"error": body}, ensure_ascii=False)


def unique_calls(calls: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
    """``calls`` without exact duplicates (same id, name and arguments text), first one kept, in order."""
    seen: set[tuple[str, str, str]] = set()
    out: list[ToolCall] = []
    for c in calls:
        key = (c.id, c.name, c.arguments)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return tuple(out)


CUT_NOTE = "the reply was cut at the output-token limit (finish_reason=length)"
"""Added to every parse error of a reply whose ``finish_reason`` is ``length``."""


def _arguments(call: ToolCall, finish_reason: str | None) -> dict[str, Any]:
    """The call's arguments, parsed strictly: a JSON object, or empty text for no arguments.

    Never repaired: a cut or invalid string raises with the raw text kept, so the call is not run
    with arguments the model did not write (``'{"city": "Par'`` is not ``{"city": "Par"}``). Only
    a string's lone UTF-16 surrogate (an escape of half an emoji pair) is read as U+FFFD
    (:func:`kitune.lm.repair_surrogates`), since no store, file or request can carry it.

    Raises:
        ParseError: the text is not JSON (``truncated_arguments`` when the reply was cut at the
            output-token limit, else ``invalid_arguments``) or not a JSON object; ``raw`` holds it.
    """
    raw = call.arguments
    if not raw.strip():
        return {}
    try:
        args = repair_surrogates(json.loads(raw))
    except json.JSONDecodeError as e:
        cut = finish_reason == "length"
        name = "truncated_arguments" if cut else "invalid_arguments"
        why = CUT_NOTE if cut else f"{e.msg} at character {e.pos}"
        raise ParseError(
            f"{name}: the arguments of {call.name} are not valid JSON ({why}): {raw[:200]!r}. "
            f"The call was not run; call {call.name} again with complete JSON arguments.",
            raw=raw,
        ) from e
    if not isinstance(args, dict):
        raise ParseError(
            f"invalid_arguments: the arguments of {call.name} are not a JSON object: {raw[:200]!r}. "
            f"The call was not run; call {call.name} again with a JSON object of arguments.",
            raw=raw,
        )
    return args


def _read_call(call: ToolCall, finish_reason: str | None) -> NativeTurn:
    try:
        args = _arguments(call, finish_reason)
        if call.name == ANSWER_TOOL:
            parsed = parse_action(json.dumps({"answer": args}))
        else:
            parsed = ToolAction(tool=call.name.strip(), args=args)
    except ParseError as e:
        code = str(e).split(":", 1)[0]
        if code not in ("truncated_arguments", "invalid_arguments"):
            code = "invalid_answer"  # the answer's arguments were JSON but not a usable answer
        return NativeTurn(None, str(e), f"{call.name}({call.arguments})", call, code=code)
    if isinstance(parsed, ToolAction) and call.name == ANSWER_TOOL:
        return NativeTurn(
            None,
            "answer arguments hold no exact_answer",
            canonical_reply(parsed),
            call,
            code="invalid_answer",
        )
    return NativeTurn(parsed, None, canonical_reply(parsed), call)


def _offered_call(action: ToolAction, offered: Mapping[str, Sequence[str]]) -> str | None:
    """Why a content-borne tool call does not count (None: an offered tool with its exact arguments)."""
    if action.tool not in offered:
        return f"it names {action.tool!r}, which is not an offered tool ({', '.join(offered) or 'none'})"
    want, got = sorted(offered[action.tool]), sorted(action.args)
    if want != got:
        return f"its arguments {got} are not {action.tool}'s {want}"
    if any(not isinstance(v, str | int) or not str(v).strip() for v in action.args.values()):
        return "its arguments are not non-empty strings"
    return None


def read_native_reply(
    resp: ChatResponse, offered: Mapping[str, Sequence[str]] | None = None
) -> tuple[NativeTurn, ...]:
    """Turn one response of a ``tools=`` call into its actions (see the module docstring). Never raises.

    Args:
        resp: the model's reply.
        offered: tool name → its argument names, the tools the agent was offered (``answer``
            apart); a tool call read out of the message text counts only when it matches one.
            None: any content-borne tool call counts (no check).

    Returns:
        One :class:`NativeTurn` per distinct function call (exact duplicates dropped, see
        :func:`unique_calls`), in the model's order (``call`` set, ids as the provider sent them,
        ``source="tool_calls"``); a reply without calls gives one turn read from its text with the
        JSON protocol (``call`` None, ``source="content"``; ``code="plain_text"`` when it holds no
        usable action). At least one turn. When the reply was cut (``finish_reason="length"``),
        every error says so.
    """
    calls: Sequence[ToolCall] = resp.tool_calls
    if calls:
        return tuple(_read_call(c, resp.finish_reason) for c in unique_calls(calls))
    try:
        action = parse_action(resp.text)
    except ParseError as e:  # same error text as the JSON protocol
        error = f"{e} ({CUT_NOTE})" if resp.finish_reason == "length" else str(e)
        return (NativeTurn(None, error, resp.text, None, source="content", code="plain_text"),)
    if isinstance(action, ToolAction) and offered is not None:
        why = _offered_call(action, offered)
        if why is not None:
            error = f"plain_text: the reply holds no tool call (the text looks like a call, but {why})"
            return (NativeTurn(None, error, resp.text, None, source="content", code="plain_text"),)
    return (NativeTurn(action, None, canonical_reply(action), None, source="content"),)
