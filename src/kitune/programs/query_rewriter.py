"""The query rewriter: a question → a typed :class:`kitune.schema.QueryPlan`.

The LM writes the plan *values* (entity tags, lexical keywords, a semantic sentence, optional
tag filters) as the typed ``plan`` output (:class:`kitune.programs.records.PlanDraft`: the format
comes from the type through the adapter, not from the instruction). The adapter reads it
leniently (:func:`kitune.lm.parse_leniently`: fences, reasoning, prose around the object, a
stringified or Python-literal object) and :func:`plan_from_draft` validates the draft into a
:class:`QueryPlan`; the LM never writes query text that a store executes. Output that cannot be
turned into a valid, non-empty plan falls back to :meth:`QueryPlan.plain` and the fallback is
counted (:class:`RewriteResult` ``fell_back`` and :attr:`QueryRewriter.fallbacks`).

Policies (tested):

* an entity tag given as a bare name (``"Acme Corp"``) is slugified to ``entity:acme-corp``;
  a tag that already carries the ``entity:`` prefix must be well formed or the plan is invalid;
* with the question given, an entity tag whose slug (hyphens removed) does not occur in the
  slug of the question's name-like words (words with a capital letter or a digit; the whole
  question when it has none after its first word) is dropped and reported
  (``RewriteResult.dropped_tags``): small models tag common nouns (``entity:country``,
  ``entity:of``) or invented topics as entities;
* ``filters`` may only narrow retrieval: ``statuses`` is ignored (expired KIs stay excluded),
  unknown filter keys make the plan invalid;
* ``size`` always comes from the caller, never from the LM (an LM ``size`` key is ignored).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import dspy
from pydantic import ValidationError

from kitune.errors import ParseError
from kitune.ki import entity_tag, slugify
from kitune.programs.instructions import resolve_instruction
from kitune.programs.predict import predict_typed
from kitune.programs.records import PlanDraft
from kitune.recording import RecordingMissError
from kitune.schema import Filter, QueryPlan
from kitune.usage import TokenLedger

__all__ = ["QueryRewriter", "RewriteQuery", "RewriteResult", "RewriteTokens", "plan_from_draft"]

_FILTER_KEYS = {"tags_any", "tags_all", "doc_ids", "subtypes", "min_confidence"}


def _normalise_tags(raw: list[str]) -> list[str]:
    tags: list[str] = []
    for t in raw:
        t = t.strip()
        if not t:
            continue
        if t.startswith("entity:"):
            tags.append(t)  # validated by QueryPlan as given
        else:
            tag = entity_tag(t)
            if tag != "entity:":
                tags.append(tag)
    return tags


_WELL_FORMED_ENTITY = re.compile(r"^entity:[a-z0-9][a-z0-9-]*$")


def _grounded(tag: str, question_key: str) -> bool:
    if not _WELL_FORMED_ENTITY.match(tag):
        return True  # malformed tags are left for validation to reject
    key = tag.removeprefix("entity:").replace("-", "")
    return bool(key) and key in question_key


_WORD_RE = re.compile(r"[\w'’.-]+")


def _names_key(question: str) -> str:
    """Slug (no hyphens) of the name-like words of ``question``, or of all of it if none."""
    words = _WORD_RE.findall(question)
    names = [w for w in words if any(c.isupper() or c.isdigit() for c in w)]
    if not [w for w in names if w is not words[0]]:
        names = words
    return slugify(" ".join(names), max_chars=10_000).replace("-", "")


def plan_from_draft(
    draft: PlanDraft, *, size: int = 10, question: str | None = None, dropped: list[str] | None = None
) -> QueryPlan:
    """Validate the rewriter's typed ``plan`` output into a :class:`QueryPlan`.

    Args:
        draft: the plan values as the adapter read them.
        size: the plan's size, 1–1000 (the caller's choice; the LM never sets it).
        question: when given, entity tags not grounded in it are dropped (see the module doc).
        dropped: when given, the dropped tags are appended to it.

    Returns:
        A validated, non-empty plan.

    Raises:
        ParseError: a value that fails validation (``"invalid_plan: …"``: malformed tags,
            over-long text, unknown filter keys) or a plan with no branch input
            (``"empty_plan: …"``). ``raw`` on the error is the draft as JSON.
    """
    raw = draft.model_dump_json()
    try:
        tags = _normalise_tags(draft.entity_tags)
        if question is not None:
            question_key = _names_key(question)
            ungrounded = [t for t in tags if not _grounded(t, question_key)]
            if dropped is not None:
                dropped.extend(ungrounded)
            tags = [t for t in tags if t not in ungrounded]
        raw_filters = {k: v for k, v in draft.filters.items() if k != "statuses"}
        unknown = sorted(set(raw_filters) - _FILTER_KEYS)
        if unknown:
            raise ParseError(f"unknown filter keys {unknown}")
        plan = QueryPlan(
            entity_tags=tuple(tags),
            lexical=" ".join(draft.lexical.split()),
            semantic=" ".join(draft.semantic.split()),
            filters=Filter(**raw_filters),
            size=size,
        )
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ParseError(f"invalid_plan: {problems}", raw=raw) from e
    except ParseError as e:
        raise ParseError(f"invalid_plan: {e}", raw=raw) from e
    if plan.is_empty():
        raise ParseError("empty_plan: no entity tags, lexical or semantic text", raw=raw)
    return plan


class RewriteQuery(dspy.Signature):  # type: ignore[misc]
    """Turn a question into a retrieval plan (instructions are replaced at construction)."""

    question: str = dspy.InputField(desc="The question to find facts for.")
    plan: PlanDraft = dspy.OutputField(desc="The retrieval plan's values.")


@dataclass(frozen=True)
class RewriteTokens:
    """Tokens one rewrite cost (0 when the LM reported none)."""

    input: int = 0
    """Prompt tokens."""
    output: int = 0
    """Completion tokens."""


@dataclass(frozen=True)
class RewriteResult:
    """What :meth:`QueryRewriter.rewrite` returns."""

    plan: QueryPlan
    """The validated plan, or the plain fallback plan."""
    fell_back: bool
    """True when the LM output was unusable and :meth:`QueryPlan.plain` was used."""
    reason: str | None
    """Why it fell back (``"no_json: …"``, ``"invalid_plan: …"``, ``"empty_plan: …"``,
    ``"lm_error: …"``), None otherwise."""
    tokens: RewriteTokens
    """Tokens the rewrite cost."""
    raw: str = ""
    """The plan values as JSON, or the model's raw text when they could not be read (empty on an LM
    error)."""
    dropped_tags: tuple[str, ...] = ()
    """Entity tags the LM gave that do not occur in the question (removed from the plan)."""


def _usage_tokens(usage: dict[str, dict[str, Any]]) -> RewriteTokens:
    inp = out = 0
    for entry in usage.values():
        inp += int(entry.get("prompt_tokens") or entry.get("input_tokens") or 0)
        out += int(entry.get("completion_tokens") or entry.get("output_tokens") or 0)
    return RewriteTokens(input=inp, output=out)


class QueryRewriter(dspy.Module):  # type: ignore[misc]
    """Question → :class:`QueryPlan` program. Its optimisable predictor is ``planner``.

    Args:
        instructions: starting instruction text; None loads the packaged ``rewriter`` prompt.
        adapter: DSPy adapter scoped around each :meth:`rewrite` call (e.g.
            ``kitune.lm.adapter_for(lm)``); None uses the context's adapter.
        ground_tags: drop entity tags that do not occur in the question (default). Turn off for
            a strong model trusted to add bridge entities from its own knowledge.

    Attributes:
        prompt_version: ``rewriter@<sha8>`` of the starting instructions.
        fallbacks: reason code (``no_json``, ``invalid_plan``, ``empty_plan``, ``lm_error``) →
            how many rewrites fell back, over this instance's lifetime.
    """

    def __init__(
        self, instructions: str | None = None, *, adapter: Any = None, ground_tags: bool = True
    ) -> None:
        super().__init__()
        self.adapter = adapter
        self.ground_tags = ground_tags
        instructions, self.prompt_version = resolve_instruction("rewriter", instructions)
        self.planner = dspy.Predict(RewriteQuery.with_instructions(instructions))
        self.fallbacks: Counter[str] = Counter()

    def forward(self, question: str, size: int = 10) -> dspy.Prediction:
        """Run the LM once and validate its plan (for optimisers and metrics).

        Returns:
            A prediction with ``plan_json`` (the plan values as JSON, or the model's raw text when
            they could not be read), ``plan`` (a QueryPlan, the fallback when invalid),
            ``fell_back`` (bool), ``reason`` (str | None) and ``dropped_tags``.

        Raises:
            Whatever the LM raises (transport errors are not swallowed here; see :meth:`rewrite`).
        """
        reply = predict_typed(self.planner, question=question)
        dropped: list[str] = []
        try:
            if reply.prediction is None:
                assert reply.error is not None
                code = "invalid_plan" if reply.error.reason == "invalid_fields" else "no_json"
                raise ParseError(f"{code}: {reply.error.detail}", raw=reply.raw)
            draft: PlanDraft = reply.prediction.plan
            raw = draft.model_dump_json()
            grounding = question if self.ground_tags else None
            plan = plan_from_draft(draft, size=size, question=grounding, dropped=dropped)
            return dspy.Prediction(
                plan_json=raw, plan=plan, fell_back=False, reason=None, dropped_tags=tuple(dropped)
            )
        except ParseError as e:
            return dspy.Prediction(
                plan_json=e.raw,
                plan=QueryPlan.plain(question, size=size),
                fell_back=True,
                reason=str(e),
                dropped_tags=tuple(dropped),
            )

    def rewrite(
        self, question: str, *, size: int = 10, lm: Any = None, ledger: TokenLedger | None = None
    ) -> RewriteResult:
        """Rewrite ``question`` into a plan; never raises for a model or transport failure.

        Args:
            question: the natural-language question (non-blank).
            size: the plan size, 1–1000.
            lm: a ``dspy.LM`` to use for this call (None: the predictor's or the context's LM).
            ledger: when the LM reported no usage, tokens recorded here for role ``rewrite``
                during the call are used instead.

        Returns:
            The plan, whether it fell back (and why) and the tokens spent.

        Raises:
            ValueError: ``question`` is blank or ``size`` is outside 1–1000.
            kitune.recording.RecordingMissError: a replayed run has no recording of this call (any
                other LM failure falls back to the plain plan).
        """
        if not question or not question.strip():
            raise ValueError("question is blank: pass the question text to rewrite")
        if not 1 <= size <= 1000:
            raise ValueError(f"size={size} is outside 1–1000")
        marker = ledger.snapshot() if ledger is not None else 0
        raw = ""
        dropped: tuple[str, ...] = ()
        with dspy.track_usage() as tracker:
            try:
                scoped: dict[str, Any] = {}
                if lm is not None:
                    scoped["lm"] = lm
                if self.adapter is not None:
                    scoped["adapter"] = self.adapter
                with dspy.context(**scoped):
                    pred = self(question, size=size)
                plan, fell_back, reason, raw = pred.plan, pred.fell_back, pred.reason, pred.plan_json
                dropped = pred.dropped_tags
            except RecordingMissError:
                raise  # a replay without this call is a configuration error: stop, as the agent's own miss
            except Exception as e:  # a transport or adapter failure must not break retrieval
                plan = QueryPlan.plain(question, size=size)
                fell_back, reason = True, f"lm_error: {type(e).__name__}: {e}"[:500]
        tokens = _usage_tokens(tracker.get_total_tokens())
        if ledger is not None and tokens == RewriteTokens():
            recs = [r for r in ledger.since(marker) if r.role == "rewrite"]
            tokens = RewriteTokens(sum(r.input_tokens for r in recs), sum(r.output_tokens for r in recs))
        if fell_back:
            self.fallbacks[(reason or "unknown").split(":", 1)[0]] += 1
        return RewriteResult(
            plan=plan, fell_back=fell_back, reason=reason, tokens=tokens, raw=raw, dropped_tags=dropped
        )
