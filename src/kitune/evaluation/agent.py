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
  model is told what was wrong; the loop continues — until :data:`MALFORMED_IN_A_ROW` (5)
  replies or calls in a row could not be run (unparseable, cut or invalid arguments, unknown
  tool, wrong argument names): the episode then ends with ``status="malformed_calls"``, no
  answer and no force-commit (a named failure, not an exhausted budget);
* native mode, several calls in one reply (parallel tool calls): every call is run, in the
  model's order, and answered by its own ``role="tool"`` message; **each call is one step of
  the budget** (the reply's tokens and latency are booked on its first step). Calls left when the
  budget runs out mid-reply are answered "not run" and are not steps. An ``answer`` call ends
  the episode where it stands (calls after it are not run). Call ids are kept as the provider
  sent them unless missing or already used in the episode (the same id twice in one reply, or
  again in a later reply): such a call gets ``<id>_<n>`` (``call_<n>`` when missing), so every
  id in the conversation sent back is unique and answered once;
* an identical tool call (canonical name + sorted-args JSON) is answered from the trace
  instead of re-run; the third identical call in a row is blocked with "identical call already
  returned … — change the query or finish" (case A2); both still cost a step;
* when the budget (steps, input tokens, wall clock) runs out without an answer, exactly ONE
  tool-less force-commit call asks for the most likely answer from the trace
  (``status="budget_exhausted"``, ``force_committed=True``);
* :class:`kitune.errors.LMContextWindowError` ends the loop with ``status="context_overflow"``
  and the force-commit runs on a trimmed trace (case A1); never a crash.

Other :class:`kitune.errors.LMError` (transport failures after the LM layer's retries) end the
episode with ``status="failed"``. Anything else (a harness bug, an exhausted test script)
propagates.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kitune.chat import ChatMessage, ChatModel, ChatResponse, ToolMode
from kitune.errors import LMContextWindowError, LMError, ParseError
from kitune.evaluation.budget import Budget, BudgetMeter
from kitune.evaluation.native import (
    ANSWER_TOOL,
    CUT_NOTE,
    NativeTurn,
    answer_schema,
    native_force_commit_prompt,
    native_system_prompt,
    read_native_reply,
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

__all__ = ["Agent", "Episode", "EpisodeStatus", "Step", "StepKind"]

EpisodeStatus = Literal["answered", "budget_exhausted", "context_overflow", "malformed_calls", "failed"]
StepKind = Literal["tool", "answer", "invalid", "force_commit", "lm_error"]

REPLY_KEEP_CHARS = 500
"""How much of each raw model reply a Step keeps."""

BLOCK_AFTER_IDENTICAL = 3
"""The n-th identical back-to-back call is blocked (case A2)."""

MALFORMED_IN_A_ROW = 5
"""This many unusable replies or calls in a row end the episode as ``malformed_calls``."""

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
    """``"steps"``, ``"tokens"`` or ``"timeout"`` when the budget ran out."""
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
        self.cache: dict[str, Observation] = {}
        self.observations: list[tuple[str, str]] = []  # (call label, text) for the trimmed trace
        self.last_key: str | None = None
        self.identical_run = 0
        self.repeated = 0
        self.blocked = 0
        self.malformed_run = 0  # unusable replies/calls in a row
        self.call_ids: set[str] = set()  # every call id already in the conversation
        if self.native:
            self.tools = tool_schemas(agent.toolbox)
            system = native_system_prompt(agent.toolbox.skill, agent.budget.max_steps)
        else:
            self.tools = []
            system = system_prompt(agent.toolbox.skill, agent.toolbox.describe(), agent.budget.max_steps)
        self.head: list[ChatMessage] = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Question: {question}"},
        ]
        self.messages: list[ChatMessage] = list(self.head)

    def _now(self) -> float:
        return self.a.clock() + self.offset

    def _call(self, messages: list[ChatMessage], *, final: bool = False) -> tuple[ChatResponse, float]:
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
        self.steps.append(
            Step(
                index=len(self.steps) + 1,
                kind=kind,
                input_tokens=resp.input_tokens if resp else 0,
                output_tokens=resp.output_tokens if resp else 0,
                latency_s=latency,
                reply=reply[:REPLY_KEEP_CHARS],
                **kw,
            )
        )

    def execute(self) -> Episode:
        overflow = False
        while self.meter.exhausted_by() is None:
            try:
                resp, latency = self._call(self.messages)
            except LMContextWindowError as e:
                self.meter.charge(input_tokens=0, output_tokens=0)
                self._step("lm_error", e, 0.0, error=f"context window exceeded: {e}")
                overflow = True
                break
            except LMError as e:
                self._step("lm_error", e, 0.0, error=f"{type(e).__name__}: {e}")
                return self._episode("failed")
            self.meter.charge(input_tokens=resp.input_tokens, output_tokens=resp.output_tokens)
            fed: list[tuple[NativeTurn, str]] = []
            for i, turn in enumerate(self._own_ids(self._read(resp))):
                if i and self.meter.exhausted_by() is not None:
                    fed.append((turn, NOT_RUN))
                    continue
                if i:  # each further call of a reply is one more step; the reply's tokens are on the first
                    self.meter.charge(input_tokens=0, output_tokens=0)
                billed, took = (resp, latency) if i == 0 else (None, 0.0)
                ids = {"call_id": turn.call.id if turn.call else None, "finish_reason": resp.finish_reason}
                if turn.action is None:
                    self._step("invalid", billed, took, reply=turn.reply, error=turn.error, **ids)
                    self.malformed_run += 1
                    hint = (
                        " Call one of the tools, or call answer with your final answer."
                        if self.native
                        else ""
                    )
                    fed.append((turn, f"ERROR: {turn.error}{hint}"))
                elif isinstance(turn.action, AnswerAction):
                    self._step("answer", billed, took, reply=turn.reply, **ids)
                    return self._episode("answered", turn.action)
                else:
                    obs = self._tool_step(turn.action, billed, took, turn, **ids)
                    self.malformed_run = self.malformed_run + 1 if obs.malformed else 0
                    fed.append((turn, obs.text))
            self._feed(resp, fed)
            if self.malformed_run >= self.a.max_malformed_in_a_row:
                self.errors.append(
                    f"{self.malformed_run} malformed replies or tool calls in a row: the episode ends as "
                    "malformed_calls (no call could be run; see the step errors)"
                )
                return self._episode("malformed_calls")
        return self._force_commit(overflow)

    def _read(self, resp: ChatResponse) -> tuple[NativeTurn, ...]:
        """The reply's actions in order (one for a text reply); ``action=None`` + ``error`` when unusable."""
        if self.native:
            return read_native_reply(resp)
        try:
            return (NativeTurn(parse_action(resp.text), None, resp.text, None),)
        except ParseError as e:
            error = f"{e} ({CUT_NOTE})" if resp.finish_reason == "length" else str(e)
            return (NativeTurn(None, error, resp.text, None),)

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

    def _feed(self, resp: ChatResponse, fed: list[tuple[NativeTurn, str]]) -> None:
        """Append the model's reply and what each of its actions got back, with the steps left."""
        left = self.meter.steps_left
        first, observation = fed[0]
        if first.call is None:  # JSON mode, or a native reply that held no function call: one action
            tool = first.action.tool if isinstance(first.action, ToolAction) else None
            shown = f"Observation from {tool}:\n{observation}" if tool else observation
            self.messages.append({"role": "assistant", "content": resp.text})
            self.messages.append({"role": "user", "content": f"{shown}\n\n[{left} step(s) left]"})
            return
        answered = [(turn.call, text) for turn, text in fed if turn.call is not None]
        self.messages.append(
            {
                "role": "assistant",
                "content": resp.text or None,
                "tool_calls": [c.to_message() for c, _ in answered],
            }
        )
        for i, (call, text) in enumerate(answered):
            tail = f"\n\n[{left} step(s) left]" if i == len(answered) - 1 else ""
            self.messages.append({"role": "tool", "tool_call_id": call.id, "content": text + tail})

    def _tool_step(
        self, action: ToolAction, resp: ChatResponse | None, latency: float, turn: NativeTurn, **ids: Any
    ) -> Observation:
        """Run (or answer from the trace, or block) one tool call and record its step."""
        key = canonical_call(action.tool, action.args)
        self.identical_run = self.identical_run + 1 if key == self.last_key else 1
        self.last_key = key
        cached = self.cache.get(key)
        repeated = blocked = False
        if cached is not None and self.identical_run >= BLOCK_AFTER_IDENTICAL:
            blocked = repeated = True
            n = cached.n_results if cached.n_results is not None else len(cached.doc_ids)
            obs = Observation(
                text=(
                    f"ERROR: identical call already returned {n} result(s) ({len(cached.text)} characters) "
                    "— change the query or finish with your answer."
                ),
                error=f"identical call repeated {self.identical_run} times in a row; not run",
            )
        elif cached is not None:
            repeated = True
            obs = Observation(
                text="(identical to an earlier call; result repeated from the trace)\n" + cached.text,
                doc_ids=cached.doc_ids,
                n_results=cached.n_results,
                truncated=cached.truncated,
            )
        else:
            obs = self.a.toolbox.call(action.tool, action.args)
            self.meter.charge(input_tokens=obs.input_tokens, output_tokens=obs.output_tokens, step=False)
            if action.tool in self.a.toolbox.tools:
                self.tool_calls[action.tool] = self.tool_calls.get(action.tool, 0) + 1
            if obs.error is None:
                self.cache[key] = obs
                self.observations.append((f"{action.tool}({action.args})", obs.text))
        self.repeated += int(repeated)
        self.blocked += int(blocked)
        for d in obs.doc_ids:
            self.seen.setdefault(d, None)
        self._step(
            "tool",
            resp,
            latency,
            reply=turn.reply,
            tool=action.tool,
            args=dict(action.args),
            observation_chars=len(obs.text),
            doc_ids=obs.doc_ids,
            error=obs.error,
            repeated=repeated,
            blocked=blocked,
            truncated=obs.truncated,
            n_results=obs.n_results,
            observation=obs.text,
            tool_input_tokens=obs.input_tokens,
            tool_output_tokens=obs.output_tokens,
            **ids,
        )
        return obs

    def _trimmed(self) -> list[ChatMessage]:
        cap = self.a.trimmed_observation_chars
        kept = self.observations[-4:]
        body = "\n\n".join(f"{label}:\n{text[:cap]}" for label, text in kept) or "(no observations)"
        return [*self.head, {"role": "user", "content": f"Observations so far (trimmed):\n{body}"}]

    def _force_commit(self, overflow: bool) -> Episode:
        exhausted = None if overflow else self.meter.exhausted_by()
        status: EpisodeStatus = "context_overflow" if overflow else "budget_exhausted"
        text = native_force_commit_prompt() if self.native else force_commit_prompt()
        prompt: ChatMessage = {"role": "user", "content": text}
        messages = [*self._trimmed(), prompt] if overflow else [*self.messages, prompt]
        try:
            resp, latency = self._call(messages, final=True)
        except LMContextWindowError as e:
            if overflow:
                self._step("lm_error", e, 0.0, error=f"force-commit context window exceeded: {e}")
                return self._episode(status, exhausted_by=exhausted, timed_out=not overflow)
            # The full trace no longer fits: commit from the trimmed trace instead.
            self._step("lm_error", e, 0.0, error=f"force-commit context window exceeded: {e}")
            status = "context_overflow"
            try:
                resp, latency = self._call([*self._trimmed(), prompt], final=True)
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
