"""The budgeted tool-using agent: one question in, one :class:`Episode` out.

The loop talks to a :class:`kitune.chat.ChatModel` in one of two tool modes
(:data:`kitune.chat.ToolMode`): ``json`` — the JSON text protocol of
:mod:`kitune.evaluation.protocol`, for any model (the embedded one included); ``native`` —
function schemas sent as ``tools=`` and tool-call messages (:mod:`kitune.evaluation.native`),
for models with function calling. The mode comes from the ``tool_mode`` argument, else the
model's own ``tool_mode`` attribute (``LiteLLMChatModel`` sets it from ``agent.tool_calling``),
else ``json``; it is recorded on the :class:`Episode`. Budgets, repeats, force-commit, traces
and token accounting are the same in both modes, and a Step's ``reply`` holds the JSON-protocol
text of the action either way. Model mistakes are data, not exceptions:

* a malformed reply or a bad tool call is recorded on its :class:`Step` (``error``) and the
  model is told what was wrong — a failed call as a JSON error object
  (:func:`kitune.evaluation.native.tool_error_json`); the loop continues — until
  :data:`MALFORMED_IN_A_ROW` (5) replies or calls in a row could not be run (unparseable, cut or
  invalid arguments, unknown tool, wrong argument names): the episode then ends with no answer
  and no force-commit, as ``status="invalid_tool_arguments"`` when every one of them was a call
  with invalid or cut arguments, else ``status="malformed_calls"`` (a named failure, not an
  exhausted budget);
* every action is labelled with where it was read (``Step.source``: ``tool_calls``,
  ``content`` — a native-mode reply's text —, or ``json``); a content-borne call counts only
  for an offered tool with its exact arguments, else the reply is plain text (see
  :mod:`kitune.evaluation.native`); exact duplicate calls in one reply are run once
  (``Episode.duplicate_calls`` counts the dropped copies);
* native mode, several calls in one reply (parallel tool calls): every call is run, in the
  model's order, and answered by its own ``role="tool"`` message; **each call is one step of
  the budget** (the reply's tokens and latency are booked on its first step). Calls left when the
  budget runs out mid-reply are answered "not run" and are not steps. An ``answer`` call ends
  the episode where it stands (calls after it are not run). Call ids are kept as the provider
  sent them unless missing or already used in the episode (the same id twice in one reply, or
  again in a later reply): such a call gets ``<id>_<n>`` (``call_<n>`` when missing), so every
  id in the conversation sent back is unique and answered once;
* an identical tool call (canonical name + sorted-args JSON) is answered from the trace
  instead of re-run, by a pointer to the step that returned it (the result is not sent again),
  and booked by the tool as if it had run (a repeated ``get_context`` is one more look-up that
  did not answer, toward the search fallback); the :data:`BLOCK_AFTER_IDENTICAL`-th (3rd)
  identical call of the episode is blocked with "identical call already returned … — change
  the query or finish" (case A2); both still cost a step;
* a **refused** call — blocked as above, or declined by its tool (``Observation.refused``: the
  in-context search before its fallback opens) — costs a step; the second refusal of the same
  call, or the :data:`MAX_REFUSALS`-th (3rd) refusal of any call, ends the loop with a
  force-commit (``exhausted_by="refused"``, the reason in ``errors``): a model that does not
  change its call after being told cannot loop;
* when the budget (steps, input tokens, wall clock) runs out without an answer, exactly ONE
  tool-less force-commit call asks for the most likely answer from the trace
  (``status="budget_exhausted"``, ``force_committed=True``). The input-token budget is checked
  **before** each call too: when the next call's prompt (the last call's tokens per character
  times the characters it would send) would cross it, the call is not made and the
  force-commit runs on the trimmed trace, so the budget ends an episode before the history
  overflows the model's context;
* every call's input tokens are split by component (:data:`COMPONENTS`; ``Step.input_split``,
  ``Episode.input_split``): characters per component of the messages sent (the tool schemas
  with the system prompt), scaled to the provider's count so the parts add up to it exactly;
* :class:`kitune.errors.LMContextWindowError` ends the loop with ``status="context_overflow"``
  and the force-commit runs on a trimmed trace (case A1); never a crash.

Other :class:`kitune.errors.LMError` (transport failures after the LM layer's retries) end the
episode with ``status="failed"``. Anything else (a harness bug, an exhausted test script)
propagates.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kitune.chat import ChatMessage, ChatModel, ChatResponse, ToolMode
from kitune.errors import LMContextWindowError, LMError, ParseError
from kitune.evaluation.budget import Budget, BudgetMeter
from kitune.evaluation.native import (
    ANSWER_TOOL,
    CUT_NOTE,
    CallSource,
    NativeTurn,
    answer_schema,
    native_force_commit_prompt,
    native_system_prompt,
    read_native_reply,
    tool_error_json,
    tool_schemas,
)
from kitune.evaluation.protocol import (
    AnswerAction,
    ToolAction,
    force_commit_prompt,
    parse_action,
    system_prompt,
)
from kitune.evaluation.tools import Observation, Toolbox, canonical_call

__all__ = ["COMPONENTS", "Agent", "Episode", "EpisodeStatus", "Step", "StepKind", "split_tokens"]

EpisodeStatus = Literal[
    "answered", "budget_exhausted", "context_overflow", "malformed_calls", "invalid_tool_arguments", "failed"
]
StepKind = Literal["tool", "answer", "invalid", "force_commit", "lm_error"]

REPLY_KEEP_CHARS = 500
"""How much of each raw model reply a Step keeps."""

BLOCK_AFTER_IDENTICAL = 3
"""The n-th identical call of an episode is blocked (case A2), wherever it comes."""

MALFORMED_IN_A_ROW = 5
"""This many unusable replies or calls in a row end the episode as ``malformed_calls``."""

MAX_REFUSALS = 3
"""This many refused calls (blocked repeats, or calls a tool declined) end the episode with a
force-commit; so does the second refusal of the same call."""

ARGUMENT_ERRORS = frozenset({"invalid_arguments", "truncated_arguments"})
"""Error codes of a call whose arguments could not be used (the ``invalid_tool_arguments`` status)."""

COMPONENTS = ("system", "question", "observation:<tool>", "feedback", "history", "force_commit")
"""The input-token components of a call: ``system`` — the system prompt and the tool schemas (sent
on every call); ``question``; ``observation:<tool>`` — a tool's result, the first time it is sent;
``feedback`` — an error message to the model (unusable reply), the first time it is sent;
``history`` — everything sent again from an earlier call (the model's own replies, earlier
observations, the trimmed recap after an overflow); ``force_commit`` — the final request."""

NOT_RUN = "ERROR: not run: the step budget ran out before this call."
"""The tool message answering a parallel call left when the budget ran out mid-reply."""


@dataclass(frozen=True)
class Step:
    """One model call and what followed from it."""

    index: int
    """1-based position in the episode."""
    kind: StepKind
    """tool | answer | invalid (unparseable reply) | force_commit | lm_error (the call raised)."""
    tool: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    observation_chars: int = 0
    """Length of the observation text fed back to the model."""
    doc_ids: tuple[str, ...] = ()
    """Docs the observation showed."""
    error: str | None = None
    input_tokens: int = 0
    """Prompt tokens of this call (provider usage)."""
    output_tokens: int = 0
    """Completion tokens of this call (provider usage)."""
    repeated: bool = False
    """The tool call was identical to an earlier one and answered from the trace."""
    blocked: bool = False
    """The tool call was the 3rd+ identical call in a row and was not run."""
    truncated: bool = False
    """The observation was cut to the cap."""
    latency_s: float = 0.0
    """Wall time of the model call in seconds."""
    tool_input_tokens: int = 0
    """LLM input tokens the tool spent (e.g. the query rewrite inside get_context)."""
    tool_output_tokens: int = 0
    """LLM output tokens the tool spent."""
    reply: str = ""
    """The model's raw reply, first 500 characters (for debugging and optimiser feedback)."""
    call_id: str | None = None
    """Native mode: the id of the function call this step ran, as sent back to the model."""
    finish_reason: str | None = None
    """How the model call ended as the provider reported it (``stop``, ``tool_calls``, ``length``
    — cut at the output-token limit —, …); None when the call raised or did not say."""
    n_results: int | None = None
    """Results the tool found (KIs, search hits), when the tool counts them; None otherwise."""
    observation: str = ""
    """The tool result text fed back to the model, as shown (after the cap); what the failure
    signals of :mod:`kitune.evaluation.signals` read (KI ids shown, answer support)."""
    refused: bool = False
    """The call was refused (blocked repeat, or declined by its tool) and not run."""
    source: CallSource | None = None
    """Where the action was read (``tool_calls``, ``content``, ``json``); None for a force-commit
    or a failed model call."""
    error_code: str | None = None
    """The error's name when the step failed (``invalid_arguments``, ``truncated_arguments``,
    ``plain_text``, ``unknown_tool``, ``not_allowed_yet``, ``repeated_call``, …)."""
    input_split: dict[str, int] = field(default_factory=dict)
    """This call's ``input_tokens`` by component (:data:`COMPONENTS`); sums to ``input_tokens``."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {
            "index": self.index,
            "kind": self.kind,
            "tool": self.tool,
            "args": self.args,
            "observation_chars": self.observation_chars,
            "doc_ids": list(self.doc_ids),
            "error": self.error,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "repeated": self.repeated,
            "blocked": self.blocked,
            "truncated": self.truncated,
            "latency_s": round(self.latency_s, 4),
            "tool_input_tokens": self.tool_input_tokens,
            "tool_output_tokens": self.tool_output_tokens,
            "reply": self.reply,
            "call_id": self.call_id,
            "finish_reason": self.finish_reason,
            "n_results": self.n_results,
            "observation": self.observation,
            "refused": self.refused,
            "source": self.source,
            "error_code": self.error_code,
            "input_split": dict(self.input_split),
        }


@dataclass(frozen=True)
class Episode:
    """The outcome of one question."""

    question: str
    status: EpisodeStatus
    explanation: str = ""
    exact_answer: str = ""
    confidence: int | None = None
    """0–100, None when no answer was parsed."""
    steps: tuple[Step, ...] = ()
    tool_calls: dict[str, int] = field(default_factory=dict)
    """Tool name → calls actually executed (repeats answered from the trace are not counted)."""
    timed_out: bool = False
    """The budget ran out before the model answered (any limit)."""
    exhausted_by: str | None = None
    """``"steps"``, ``"tokens"``, ``"timeout"`` when the budget ran out, ``"refused"`` when
    repeated refusals ended the episode."""
    force_committed: bool = False
    """The answer came from the force-commit call."""
    repeated_calls: int = 0
    """Identical calls answered from the trace (including blocked ones)."""
    repeated_call_blocked: int = 0
    """Identical back-to-back calls blocked (case A2)."""
    wall_time_s: float = 0.0
    doc_ids_seen: tuple[str, ...] = ()
    """Every doc id shown to the model, first-seen order, unique."""
    errors: tuple[str, ...] = ()
    """Step errors and LM errors, in order."""
    tool_mode: ToolMode = "json"
    """How tools were offered to the model: ``json`` (text protocol) or ``native`` (function calling)."""
    refused_calls: int = 0
    """Calls refused (blocked repeats and calls a tool declined)."""
    duplicate_calls: int = 0
    """Exact duplicate calls (same id, name, arguments) dropped from replies; never run nor charged."""

    @property
    def input_split(self) -> dict[str, int]:
        """Input tokens by component (:data:`COMPONENTS`), summed over the steps; sums to ``input_tokens``."""
        out: dict[str, int] = {}
        for s in self.steps:
            for k, v in s.input_split.items():
                out[k] = out.get(k, 0) + v
        return dict(sorted(out.items()))

    @property
    def input_tokens(self) -> int:
        """Sum of input tokens over all steps (the force-commit included)."""
        return sum(s.input_tokens for s in self.steps)

    @property
    def output_tokens(self) -> int:
        """Sum of output tokens over all steps."""
        return sum(s.output_tokens for s in self.steps)

    @property
    def tool_input_tokens(self) -> int:
        """Sum of LLM input tokens spent inside tools (query rewrites); not in ``input_tokens``."""
        return sum(s.tool_input_tokens for s in self.steps)

    @property
    def tool_output_tokens(self) -> int:
        """Sum of LLM output tokens spent inside tools."""
        return sum(s.tool_output_tokens for s in self.steps)


class Agent:
    """A budgeted agent for one skill. Not thread-safe: build one per question.

    Args:
        model: the chat model (its ledger, if any, records every call).
        toolbox: a fresh toolbox for this question.
        budget: steps, input-token and wall-clock limits.
        max_output_tokens: cap per call (None: the model's default).
        trimmed_observation_chars: per-observation cap in the trimmed trace used after a
            context overflow; at most 4 observations, most recent, are kept.
        clock: monotonic clock in seconds (injectable for tests).
        tool_mode: ``json`` or ``native`` (None: the model's ``tool_mode`` attribute, else ``json``).
        max_malformed_in_a_row: unusable replies or calls in a row that end the episode as
            ``malformed_calls`` (>= 1).

    Raises:
        ValueError: ``tool_mode`` (given or from the model) is not ``json`` or ``native``, or
            ``max_malformed_in_a_row < 1``.
    """

    def __init__(
        self,
        model: ChatModel,
        toolbox: Toolbox,
        *,
        budget: Budget | None = None,
        max_output_tokens: int | None = None,
        trimmed_observation_chars: int = 1200,
        clock: Callable[[], float] = time.monotonic,
        tool_mode: ToolMode | None = None,
        max_malformed_in_a_row: int = MALFORMED_IN_A_ROW,
    ) -> None:
        mode = tool_mode or getattr(model, "tool_mode", None) or "json"
        if mode not in ("json", "native"):
            raise ValueError(f"tool_mode={mode!r}: use 'json' or 'native'")
        if max_malformed_in_a_row < 1:
            raise ValueError(f"max_malformed_in_a_row must be >= 1, got {max_malformed_in_a_row}")
        self.max_malformed_in_a_row = max_malformed_in_a_row
        self.tool_mode: ToolMode = mode
        self.model = model
        self.toolbox = toolbox
        self.budget = budget or Budget()
        self.max_output_tokens = max_output_tokens
        self.trimmed_observation_chars = trimmed_observation_chars
        self.clock = clock

    def run(self, question: str) -> Episode:
        """Answer ``question`` within the budget.

        Returns:
            An :class:`Episode`; never raises for model mistakes, budget exhaustion or a context
            overflow.

        Raises:
            HarnessError: a bug or misconfiguration (propagated from tools or test doubles).
        """
        return _Run(self, question).execute()


def split_tokens(total: int, chars: Mapping[str, int]) -> dict[str, int]:
    """Split ``total`` tokens over components in proportion to their characters, exactly.

    Largest-remainder rounding (ties by component name), so the parts are integers that add up
    to ``total``.

    Args:
        total: the call's input tokens as the provider counted them (>= 0).
        chars: component → characters sent (components with 0 characters get nothing).

    Returns:
        Component → tokens, sorted by name; empty when ``total <= 0`` or no characters were sent.
    """
    weights = {k: v for k, v in chars.items() if v > 0}
    size = sum(weights.values())
    if total <= 0 or size <= 0:
        return {}
    exact = {k: total * v / size for k, v in weights.items()}
    out = {k: math.floor(x) for k, x in exact.items()}
    left = total - sum(out.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), k))[:left]:
        out[k] += 1
    return {k: v for k, v in sorted(out.items()) if v}


def _message_chars(message: ChatMessage) -> int:
    n = len(str(message.get("content") or ""))
    calls = message.get("tool_calls")
    return n + (len(json.dumps(calls, ensure_ascii=False)) if calls else 0)


class _Run:
    """State of one episode."""

    def __init__(self, agent: Agent, question: str) -> None:
        self.a = agent
        self.question = question
        self.native = agent.tool_mode == "native"
        # Recorded/replayed calls report their stored latency; the clock is shifted by (stored -
        # measured) so steps, wall time and the timeout budget see the same time in both runs.
        self.offset = 0.0
        self.meter = BudgetMeter(agent.budget, clock=self._now)
        self.start = self._now()
        self.steps: list[Step] = []
        self.errors: list[str] = []
        self.tool_calls: dict[str, int] = {}
        self.seen: dict[str, None] = {}
        self.cache: dict[str, tuple[Observation, int]] = {}  # call key → (result, step that ran it)
        self.calls_of: dict[str, int] = {}  # call key → identical calls so far in the episode
        self.observations: list[tuple[str, str]] = []  # (call label, text) for the trimmed trace
        self.repeated = 0
        self.blocked = 0
        self.refused: dict[str, int] = {}  # call key → refusals
        self.refusal_end: str | None = None  # why refusals ended the episode
        self.duplicates = 0
        self.malformed_codes: list[str | None] = []  # error codes of the current run of unusable calls
        self.call_ids: set[str] = set()  # every call id already in the conversation
        self.tokens_per_char: float | None = None  # measured on the last call
        self.call_chars: dict[str, int] | None = None  # the pending call's characters by component
        self.offered = {name: tuple(t.args) for name, t in agent.toolbox.tools.items()}
        self.legacy = agent.budget.call_rules == "legacy"
        self.last_key: str | None = None  # legacy rules: identical calls are counted back to back
        self.identical_run = 0
        if self.native:
            self.tools = tool_schemas(agent.toolbox)
            system = native_system_prompt(agent.toolbox.skill, agent.budget.max_steps)
        else:
            self.tools = []
            system = system_prompt(agent.toolbox.skill, agent.toolbox.describe(), agent.budget.max_steps)
        self.schema_chars = len(json.dumps(self.tools, ensure_ascii=False)) if self.tools else 0
        self.head: list[ChatMessage] = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Question: {question}"},
        ]
        self.messages: list[ChatMessage] = list(self.head)
        self.labels: list[str] = ["system", "question"]  # component of each message, first sending
        self.sent = 0  # messages of self.messages already sent in an earlier call

    def _now(self) -> float:
        return self.a.clock() + self.offset

    def _labels_now(self) -> list[str]:
        """Components of ``self.messages`` for the next call: re-sent messages are ``history``."""
        keep = ("system", "question")
        return [lab if j >= self.sent or lab in keep else "history" for j, lab in enumerate(self.labels)]

    def _chars(
        self, messages: Sequence[ChatMessage], labels: Sequence[str], *, final: bool
    ) -> dict[str, int]:
        out: dict[str, int] = {}
        for m, lab in zip(messages, labels, strict=True):
            out[lab] = out.get(lab, 0) + _message_chars(m)
        schemas = len(json.dumps([answer_schema()])) if (final and self.native) else self.schema_chars
        out["system"] = out.get("system", 0) + schemas
        return out

    def _projected(self) -> int | None:
        """Input tokens the next loop call would cost (None: not measured yet)."""
        if self.tokens_per_char is None:
            return None
        chars = sum(self._chars(self.messages, self.labels, final=False).values())
        return math.ceil(self.tokens_per_char * chars)

    def _exhausted(self) -> str | None:
        """Why the loop must stop before the next call (a budget limit, or refusals), else None."""
        if self.refusal_end is not None:
            return "refused"
        spent = self.meter.exhausted_by()
        if spent is not None:
            return spent
        cap, projected = self.a.budget.max_tokens, self._projected()
        if self.legacy:
            return None
        if cap is not None and projected is not None and self.meter.input_tokens + projected > cap:
            return "tokens"
        return None

    def _call(
        self, messages: list[ChatMessage], labels: Sequence[str], *, final: bool = False
    ) -> tuple[ChatResponse, float]:
        chars = self._chars(messages, labels, final=final)
        self.call_chars = chars
        t0 = self.a.clock()
        if not self.native:
            resp = self.a.model.complete(messages, json_mode=True, max_tokens=self.a.max_output_tokens)
        elif final:  # force-commit: only the answer function, and it must be called
            forced = {"type": "function", "function": {"name": ANSWER_TOOL}}
            resp = self.a.model.complete(
                messages, max_tokens=self.a.max_output_tokens, tools=[answer_schema()], tool_choice=forced
            )
        else:
            resp = self.a.model.complete(messages, max_tokens=self.a.max_output_tokens, tools=self.tools)
        if resp.input_tokens > 0 and sum(chars.values()) > 0:
            self.tokens_per_char = resp.input_tokens / sum(chars.values())
        measured = self.a.clock() - t0
        if resp.latency_s is None:
            return resp, measured
        self.offset += resp.latency_s - measured
        return resp, resp.latency_s

    def _episode(self, status: EpisodeStatus, answer: AnswerAction | None = None, **kw: Any) -> Episode:
        return Episode(
            question=self.question,
            status=status,
            explanation=answer.explanation if answer else "",
            exact_answer=answer.exact_answer if answer else "",
            confidence=answer.confidence if answer else None,
            steps=tuple(self.steps),
            tool_calls=dict(self.tool_calls),
            repeated_calls=self.repeated,
            repeated_call_blocked=self.blocked,
            wall_time_s=self._now() - self.start,
            doc_ids_seen=tuple(self.seen),
            errors=tuple(self.errors),
            tool_mode=self.a.tool_mode,
            refused_calls=sum(self.refused.values()),
            duplicate_calls=self.duplicates,
            **kw,
        )

    def _step(
        self,
        kind: StepKind,
        resp: ChatResponse | LMError | None,
        latency: float,
        reply: str | None = None,
        **kw: Any,
    ) -> None:
        """Append a step; ``resp`` is the reply, or the LMError the call raised (its billed tokens)."""
        if reply is None:
            reply = resp.text if isinstance(resp, ChatResponse) else ""
        if kw.get("error"):
            self.errors.append(f"step {len(self.steps) + 1}: {kw['error']}")
        tokens = resp.input_tokens if resp else 0
        split: dict[str, int] = {}
        if resp is not None and self.call_chars is not None:  # the call's tokens are booked once
            split = split_tokens(tokens, self.call_chars)
            self.call_chars = None
        self.steps.append(
            Step(
                index=len(self.steps) + 1,
                kind=kind,
                input_tokens=tokens,
                output_tokens=resp.output_tokens if resp else 0,
                latency_s=latency,
                reply=reply[:REPLY_KEEP_CHARS],
                input_split=split,
                **kw,
            )
        )

    def execute(self) -> Episode:
        overflow = False
        while self._exhausted() is None:
            labels = self._labels_now()
            self.sent = len(self.messages)
            try:
                resp, latency = self._call(self.messages, labels)
            except LMContextWindowError as e:
                self.meter.charge(input_tokens=0, output_tokens=0)
                self._step("lm_error", e, 0.0, error=f"context window exceeded: {e}")
                overflow = True
                break
            except LMError as e:
                self._step("lm_error", e, 0.0, error=f"{type(e).__name__}: {e}")
                return self._episode("failed")
            self.meter.charge(input_tokens=resp.input_tokens, output_tokens=resp.output_tokens)
            fed: list[tuple[NativeTurn, str, str]] = []  # (turn, text fed back, component)
            turns = self._read(resp)
            self.duplicates += len(resp.tool_calls) - sum(1 for t in turns if t.call is not None)
            for i, turn in enumerate(self._own_ids(turns)):
                if i and (self.meter.exhausted_by() is not None or self.refusal_end is not None):
                    fed.append((turn, NOT_RUN, "feedback"))
                    continue
                if i:  # each further call of a reply is one more step; the reply's tokens are on the first
                    self.meter.charge(input_tokens=0, output_tokens=0)
                billed, took = (resp, latency) if i == 0 else (None, 0.0)
                ids = {
                    "call_id": turn.call.id if turn.call else None,
                    "finish_reason": resp.finish_reason,
                    "source": turn.source,
                }
                if turn.action is None:
                    self._step(
                        "invalid",
                        billed,
                        took,
                        reply=turn.reply,
                        error=turn.error,
                        error_code=turn.code,
                        **ids,
                    )
                    self.malformed_codes.append(turn.code)
                    fed.append((turn, self._invalid_feedback(turn), "feedback"))
                elif isinstance(turn.action, AnswerAction):
                    self._step("answer", billed, took, reply=turn.reply, **ids)
                    return self._episode("answered", turn.action)
                else:
                    obs, text = self._tool_step(turn.action, billed, took, turn, **ids)
                    if obs.malformed:
                        self.malformed_codes.append(obs.code)
                    else:
                        self.malformed_codes = []
                    fed.append((turn, text, f"observation:{turn.action.tool}"))
            self._feed(resp, fed)
            if len(self.malformed_codes) >= self.a.max_malformed_in_a_row:
                args_only = all(c in ARGUMENT_ERRORS for c in self.malformed_codes)
                status: EpisodeStatus = "invalid_tool_arguments" if args_only else "malformed_calls"
                what = (
                    "tool calls with invalid or cut arguments"
                    if args_only
                    else "malformed replies or tool calls"
                )
                self.errors.append(
                    f"{len(self.malformed_codes)} {what} in a row: the episode ends as {status} "
                    "(no call could be run; see the step errors)"
                )
                return self._episode(status)
        return self._force_commit(overflow)

    def _invalid_feedback(self, turn: NativeTurn) -> str:
        """What the model is told about an unusable action."""
        if turn.call is not None and not self.legacy:  # a native call not read: a JSON error object
            raw = turn.call.arguments if turn.code in ARGUMENT_ERRORS else None
            return tool_error_json(
                turn.code or "invalid_call", turn.error or "", tool=turn.call.name, raw=raw
            )
        hint = " Call one of the tools, or call answer with your final answer." if self.native else ""
        return f"ERROR: {turn.error}{hint}"

    def _read(self, resp: ChatResponse) -> tuple[NativeTurn, ...]:
        """The reply's actions in order (one for a text reply); ``action=None`` + ``error`` when unusable."""
        if self.native:
            return read_native_reply(resp, self.offered)
        try:
            return (NativeTurn(parse_action(resp.text), None, resp.text, None, source="json"),)
        except ParseError as e:
            error = f"{e} ({CUT_NOTE})" if resp.finish_reason == "length" else str(e)
            return (NativeTurn(None, error, resp.text, None, source="json", code="unparseable"),)

    def _own_ids(self, turns: tuple[NativeTurn, ...]) -> list[NativeTurn]:
        """``turns`` with every call id unique in the episode (missing or reused ids renamed ``<id>_<n>``)."""
        out: list[NativeTurn] = []
        for turn in turns:
            if turn.call is None:
                out.append(turn)
                continue
            cid = turn.call.id.strip()
            if not cid or cid in self.call_ids:
                base, n = cid or "call", 1
                while f"{base}_{n}" in self.call_ids:
                    n += 1
                cid = f"{base}_{n}"
            self.call_ids.add(cid)
            out.append(turn if cid == turn.call.id else replace(turn, call=replace(turn.call, id=cid)))
        return out

    def _append(self, message: ChatMessage, label: str) -> None:
        self.messages.append(message)
        self.labels.append(label)

    def _feed(self, resp: ChatResponse, fed: list[tuple[NativeTurn, str, str]]) -> None:
        """Append the model's reply and what each of its actions got back, with the steps left."""
        left = self.meter.steps_left
        first, observation, label = fed[0]
        if first.call is None:  # JSON mode, or a native reply that held no function call: one action
            tool = first.action.tool if isinstance(first.action, ToolAction) else None
            shown = f"Observation from {tool}:\n{observation}" if tool else observation
            self._append({"role": "assistant", "content": resp.text}, "history")
            self._append({"role": "user", "content": f"{shown}\n\n[{left} step(s) left]"}, label)
            return
        answered = [(turn.call, text, lab) for turn, text, lab in fed if turn.call is not None]
        self._append(
            {
                "role": "assistant",
                "content": resp.text or None,
                "tool_calls": [c.to_message() for c, _, _ in answered],
            },
            "history",
        )
        for i, (call, text, lab) in enumerate(answered):
            tail = f"\n\n[{left} step(s) left]" if i == len(answered) - 1 else ""
            self._append({"role": "tool", "tool_call_id": call.id, "content": text + tail}, lab)

    def _refuse(self, key: str, tool: str, why: str) -> None:
        """Count one refusal of the call ``key``; a repeat or too many end the episode."""
        self.refused[key] = self.refused.get(key, 0) + 1
        if self.legacy:
            return
        total = sum(self.refused.values())
        if self.refused[key] >= 2:
            self.refusal_end = f"{tool} refused twice for the same call ({why})"
        elif total >= MAX_REFUSALS:
            self.refusal_end = f"{total} refused calls (last: {tool}: {why})"

    def _tool_step(
        self, action: ToolAction, resp: ChatResponse | None, latency: float, turn: NativeTurn, **ids: Any
    ) -> tuple[Observation, str]:
        """Run (or answer from the trace, or block) one tool call and record its step.

        Returns:
            The observation and the text fed back to the model for it.
        """
        key = canonical_call(action.tool, action.args)
        cached = self.cache.get(key)
        repeated = blocked = False
        self.identical_run = self.identical_run + 1 if key == self.last_key else 1
        self.last_key = key
        if cached is not None and self.legacy:
            earlier, _ = cached
            repeated = True
            if self.identical_run >= BLOCK_AFTER_IDENTICAL:
                blocked = True
                n = earlier.n_results if earlier.n_results is not None else len(earlier.doc_ids)
                obs = Observation(
                    text=(
                        f"ERROR: identical call already returned {n} result(s) "
                        f"({len(earlier.text)} characters) — change the query or finish with your answer."
                    ),
                    error=f"identical call repeated {self.identical_run} times in a row; not run",
                )
            else:
                obs = Observation(
                    text="(identical to an earlier call; result repeated from the trace)\n" + earlier.text,
                    doc_ids=earlier.doc_ids,
                    n_results=earlier.n_results,
                    truncated=earlier.truncated,
                )
        elif cached is not None:
            earlier, at = cached
            self.calls_of[key] = self.calls_of.get(key, 1) + 1
            repeated = True
            if self.calls_of[key] >= BLOCK_AFTER_IDENTICAL:
                blocked = True
                n = earlier.n_results if earlier.n_results is not None else len(earlier.doc_ids)
                message = (
                    f"identical call already returned {n} result(s) ({len(earlier.text)} characters) at "
                    f"step {at} — change the query or finish with your answer."
                )
                obs = Observation(
                    text=f"ERROR: {message}",
                    error=f"identical call repeated {self.calls_of[key]} times; not run ({message})",
                    refused=True,
                    code="repeated_call",
                )
            else:
                self.a.toolbox.note_repeat(action.tool, earlier)
                obs = Observation(
                    text=(
                        f"(identical to the call at step {at}: its result, shown there, is unchanged; "
                        "it is not repeated here)"
                    ),
                    doc_ids=earlier.doc_ids,
                    n_results=earlier.n_results,
                    truncated=earlier.truncated,
                )
        else:
            obs = self.a.toolbox.call(action.tool, action.args)
            self.meter.charge(input_tokens=obs.input_tokens, output_tokens=obs.output_tokens, step=False)
            if action.tool in self.a.toolbox.tools:
                self.tool_calls[action.tool] = self.tool_calls.get(action.tool, 0) + 1
            if obs.error is None:
                self.cache[key] = (obs, len(self.steps) + 1)
                self.calls_of[key] = 1
                self.observations.append((f"{action.tool}({action.args})", obs.text))
        if obs.refused:
            self._refuse(key, action.tool, obs.error or "refused")
        self.repeated += int(repeated)
        self.blocked += int(blocked)
        for d in obs.doc_ids:
            self.seen.setdefault(d, None)
        text = obs.text
        if obs.error is not None and not self.legacy:
            text = tool_error_json(obs.code or "tool_error", obs.error, tool=action.tool)
        self._step(
            "tool",
            resp,
            latency,
            reply=turn.reply,
            tool=action.tool,
            args=dict(action.args),
            observation_chars=len(text),
            doc_ids=obs.doc_ids,
            error=obs.error,
            error_code=obs.code,
            repeated=repeated,
            blocked=blocked,
            refused=obs.refused,
            truncated=obs.truncated,
            n_results=obs.n_results,
            observation=text,
            tool_input_tokens=obs.input_tokens,
            tool_output_tokens=obs.output_tokens,
            **ids,
        )
        return obs, text

    def _trimmed(self) -> tuple[list[ChatMessage], list[str]]:
        cap = self.a.trimmed_observation_chars
        kept = self.observations[-4:]
        body = "\n\n".join(f"{label}:\n{text[:cap]}" for label, text in kept) or "(no observations)"
        recap: ChatMessage = {"role": "user", "content": f"Observations so far (trimmed):\n{body}"}
        return [*self.head, recap], ["system", "question", "history"]

    def _force_commit(self, overflow: bool) -> Episode:
        exhausted = None if overflow else self._exhausted()
        if exhausted == "refused":
            self.errors.append(f"the episode ends with a force-commit: {self.refusal_end}")
        status: EpisodeStatus = "context_overflow" if overflow else "budget_exhausted"
        text = native_force_commit_prompt() if self.native else force_commit_prompt()
        prompt: ChatMessage = {"role": "user", "content": text}
        # Out of tokens (or overflowed): commit from the trimmed trace, which stays small.
        trimmed = overflow or (exhausted == "tokens" and not self.legacy)
        if trimmed:
            messages, labels = self._trimmed()
        else:
            messages, labels = list(self.messages), self._labels_now()
        messages, labels = [*messages, prompt], [*labels, "force_commit"]
        try:
            resp, latency = self._call(messages, labels, final=True)
        except LMContextWindowError as e:
            if trimmed:
                self._step("lm_error", e, 0.0, error=f"force-commit context window exceeded: {e}")
                return self._episode(status, exhausted_by=exhausted, timed_out=not overflow)
            # The full trace no longer fits: commit from the trimmed trace instead.
            self._step("lm_error", e, 0.0, error=f"force-commit context window exceeded: {e}")
            status = "context_overflow"
            messages, labels = self._trimmed()
            try:
                resp, latency = self._call([*messages, prompt], [*labels, "force_commit"], final=True)
            except LMError as e2:
                self._step("lm_error", e2, 0.0, error=f"{type(e2).__name__}: {e2}")
                return self._episode(status, exhausted_by=exhausted, timed_out=True)
        except LMError as e:
            self._step("lm_error", e, 0.0, error=f"force-commit {type(e).__name__}: {e}")
            return self._episode(status, exhausted_by=exhausted, timed_out=not overflow)
        answer: AnswerAction | None = None
        error: str | None = None
        turns = self._read(resp)  # the first answer call wins; tool calls are never run here
        turn = next((t for t in turns if isinstance(t.action, AnswerAction)), turns[0])
        if isinstance(turn.action, AnswerAction):
            answer = turn.action
        elif isinstance(turn.action, ToolAction):
            error = f"force-commit reply was a tool call ({turn.action.tool}), not an answer"
        else:
            error = f"force-commit reply unparseable: {turn.error}"
        self._step(
            "force_commit", resp, latency, reply=turn.reply, error=error, finish_reason=resp.finish_reason
        )
        return self._episode(
            status,
            answer,
            exhausted_by=exhausted,
            timed_out=exhausted is not None,
            force_committed=answer is not None,
        )
