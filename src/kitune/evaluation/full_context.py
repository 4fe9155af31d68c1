"""The full-context skill: the whole conversation in the prompt, one answer call (the ceiling arm).

For conversational memory (LoCoMo) the reference point every memory system is measured against
is "put the entire conversation in context and ask": no retrieval, no tools, the most tokens.
Here a *conversation* is the set of corpus documents sharing a ``source`` (LoCoMo:
``locomo-26``, one document per session), in corpus order; a question's conversation is the
one holding its evidence documents.

Prompt layout (for the local server's prompt cache): the system message holds the rules and the
whole conversation and is byte-identical for every question of that conversation; the question
comes last, alone in the user message. llama.cpp keeps the evaluated prefix of the previous
request, so with one request at a time (concurrency 1) every question after the first only
processes its own few tokens. Anything else sent to the same server in between (a judge call)
replaces that prefix, which is why the service judges full-context runs after all answers
(:func:`kitune.evaluation.judging.judge_pending`). :func:`cache_effect` measures the effect
from the traces: the first question's latency against the later ones'.

Each question is one call with the agent's JSON answer format
(:data:`kitune.evaluation.protocol.ANSWER_FORMAT`); tokens come from the provider's usage. The
arm's budget is that one call (no retry), so a reply that is not an answer is the model's
mistake, graded wrong: ``budget_exhausted`` with no answer (``exhausted_by="steps"``). A
context that does not fit is ``context_overflow`` (also graded wrong); an LM failure after the
LM layer's retries (outage, auth, timeout) is ``failed`` and is not graded.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kitune.chat import ChatMessage, ChatModel
from kitune.data.loaders import Question
from kitune.errors import HarnessError, LMContextWindowError, LMError, ParseError
from kitune.evaluation.agent import REPLY_KEEP_CHARS, Episode, EpisodeStatus, Step
from kitune.evaluation.metrics import Trace
from kitune.evaluation.protocol import ANSWER_FORMAT, AnswerAction, parse_action
from kitune.evaluation.tools import SKILLS
from kitune.schema import Document

__all__ = [
    "EVAL_SKILLS",
    "FULL_CONTEXT",
    "CacheEffect",
    "ConversationIndex",
    "FullContextRunner",
    "cache_effect",
    "full_context_factory",
    "full_context_messages",
    "render_conversation",
]

FULL_CONTEXT = "full-context"
"""The skill label of this arm."""
EVAL_SKILLS: tuple[str, ...] = (*SKILLS, FULL_CONTEXT)
"""Every skill ``kitune eval --skill`` accepts."""

_RULES = (
    "You answer one question about a conversation between two people. The whole conversation is "
    "below: its sessions in order, each starting with [docid], its speakers, number and date, then "
    "one line per turn as [D<session>:<turn>] Speaker: text.\n"
    "Answer from the conversation only. When a turn gives a relative time (yesterday, last week, "
    "next month), resolve it against the date of the session it was said in.\n"
    f"Reply with exactly ONE JSON object and nothing else: {ANSWER_FORMAT}"
)


def render_conversation(documents: Sequence[Document]) -> str:
    """The conversation as prompt text: one block per session, in the given order.

    Each block is ``[docid]`` on its own line, then ``date: <date>`` when the document's
    ``metadata["date"]`` is not already in its text, then the text. Blocks are separated by a
    blank line. Deterministic: the same documents give byte-identical text (the cache prefix).
    """
    blocks = []
    for d in documents:
        date = d.metadata.get("date", "")
        head = f"[{d.docid}]" + (f"\ndate: {date}" if date and date not in d.text else "")
        blocks.append(f"{head}\n{d.text.strip()}")
    return "\n\n".join(blocks)


def full_context_messages(conversation: str, question: str) -> list[ChatMessage]:
    """System message = rules + conversation (the shared prefix); user message = the question."""
    return [
        {"role": "system", "content": f"{_RULES}\n\nThe conversation:\n\n{conversation}"},
        {"role": "user", "content": f"Question: {question}"},
    ]


class ConversationIndex:
    """Corpus documents grouped into conversations by ``source``, in corpus order.

    Args:
        documents: the corpus (e.g. ``load_corpus("../shared/data/locomo")``).
    """

    def __init__(self, documents: Sequence[Document]) -> None:
        self._groups: dict[str, list[Document]] = {}
        self._source_of: dict[str, str] = {}
        for d in documents:
            self._groups.setdefault(d.source, []).append(d)
            self._source_of[d.docid] = d.source
        self._text: dict[str, str] = {}

    @property
    def conversations(self) -> list[str]:
        """Conversation keys (document sources) in corpus order."""
        return list(self._groups)

    def documents(self, source: str) -> list[Document]:
        """The sessions of one conversation, in corpus order (a copy of the list)."""
        return list(self._groups.get(source, []))

    def text(self, source: str) -> str:
        """:func:`render_conversation` of one conversation (computed once)."""
        if source not in self._text:
            self._text[source] = render_conversation(self._groups.get(source, []))
        return self._text[source]

    def conversation_of(self, question: Question) -> str:
        """The conversation holding the question's evidence documents.

        Raises:
            HarnessError: the question has no evidence documents (and the corpus has more than
                one conversation), cites an unknown document, or its evidence spans
                conversations.
        """
        if not question.evidence_docids:
            if len(self._groups) == 1:
                return next(iter(self._groups))
            raise HarnessError(
                f"question {question.query_id!r} has no evidence doc ids, so its conversation is unknown: "
                "add its qrel_evidence lines or run full-context on a one-conversation corpus"
            )
        unknown = [d for d in question.evidence_docids if d not in self._source_of]
        if unknown:
            raise HarnessError(
                f"question {question.query_id!r} cites {unknown}, which are not in the corpus given to "
                "full-context: pass the corpus the questions come from"
            )
        sources = {self._source_of[d] for d in question.evidence_docids}
        if len(sources) > 1:
            raise HarnessError(
                f"question {question.query_id!r} has evidence in {sorted(sources)}: full-context puts one "
                "conversation (one document source) in the prompt"
            )
        return sources.pop()


class FullContextRunner:
    """Answers one question with the whole conversation in the prompt (one model call).

    Args:
        model: the answering chat model (the agent role).
        conversation: :func:`render_conversation` text.
        doc_ids: the conversation's doc ids, reported as seen (all of them were in the prompt).
        max_output_tokens: cap on the answer call (None: the model's default).
        clock: monotonic clock in seconds (injectable for tests).
    """

    def __init__(
        self,
        model: ChatModel,
        conversation: str,
        *,
        doc_ids: Sequence[str] = (),
        max_output_tokens: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.conversation = conversation
        self.doc_ids = tuple(doc_ids)
        self.max_output_tokens = max_output_tokens
        self.clock = clock

    def run(self, question: str) -> Episode:
        """Ask once.

        Returns:
            ``answered`` with the parsed answer; ``budget_exhausted`` (no answer, step kind
            ``invalid``) when the reply is not an answer; ``context_overflow`` when the
            conversation does not fit the model's context; ``failed`` when the call raised
            another :class:`LMError`. Never raises for those.
        """
        start = self.clock()
        messages = full_context_messages(self.conversation, question)
        try:
            resp = self.model.complete(messages, json_mode=True, max_tokens=self.max_output_tokens)
        except LMContextWindowError as e:
            step = Step(
                1,
                "lm_error",
                error=f"context window exceeded: {e}",
                input_tokens=e.input_tokens,
                output_tokens=e.output_tokens,
            )
            return self._episode(question, "context_overflow", start, step, None)
        except LMError as e:
            err = f"{type(e).__name__}: {e}"
            step = Step(1, "lm_error", error=err, input_tokens=e.input_tokens, output_tokens=e.output_tokens)
            return self._episode(question, "failed", start, step, None)
        latency = self.clock() - start
        answer: AnswerAction | None = None
        error: str | None = None
        try:
            action = parse_action(resp.text)
            if isinstance(action, AnswerAction):
                answer = action
            else:
                error = f"reply was a tool call ({action.tool}); full-context has no tools"
        except ParseError as e:
            error = f"reply unparseable: {e}"
        step = Step(
            1,
            "answer" if answer is not None else "invalid",
            doc_ids=self.doc_ids,
            error=error,
            input_tokens=resp.input_tokens,
            output_tokens=resp.output_tokens,
            latency_s=latency,
            reply=resp.text[:REPLY_KEEP_CHARS],
        )
        return self._episode(
            question, "answered" if answer is not None else "budget_exhausted", start, step, answer
        )

    def _episode(
        self, question: str, status: EpisodeStatus, start: float, step: Step, answer: AnswerAction | None
    ) -> Episode:
        return Episode(
            question=question,
            status=status,
            explanation=answer.explanation if answer else "",
            exact_answer=answer.exact_answer if answer else "",
            confidence=answer.confidence if answer else None,
            steps=(step,),
            wall_time_s=self.clock() - start,
            doc_ids_seen=self.doc_ids if status != "context_overflow" else (),
            errors=(f"step 1: {step.error}",) if step.error else (),
            timed_out=status == "budget_exhausted",
            exhausted_by="steps" if status == "budget_exhausted" else None,
        )


def full_context_factory(
    model: ChatModel,
    documents: Sequence[Document],
    *,
    max_output_tokens: int | None = None,
) -> Callable[[Question], FullContextRunner]:
    """An agent factory for :func:`kitune.evaluation.harness.evaluate` (skill ``full-context``).

    Args:
        model: the answering chat model.
        documents: the corpus; grouped by :class:`ConversationIndex`.
        max_output_tokens: cap per answer call.

    Returns:
        ``factory(question) -> FullContextRunner`` over the question's conversation. The factory
        raises :class:`HarnessError` for a question whose conversation is unknown (the harness
        records that question as ``failed``).
    """
    index = ConversationIndex(documents)

    def factory(question: Question) -> FullContextRunner:
        source = index.conversation_of(question)
        docs = index.documents(source)
        return FullContextRunner(
            model,
            index.text(source),
            doc_ids=[d.docid for d in docs],
            max_output_tokens=max_output_tokens,
        )

    return factory


@dataclass(frozen=True)
class CacheEffect:
    """First question vs later questions of a full-context run (the prompt cache at work)."""

    first_query_id: str
    first_latency_s: float
    """Latency of the first answer call (the whole conversation processed)."""
    first_input_tokens: int
    later_n: int
    """Later questions with a latency (answered or failed after a reply)."""
    later_median_latency_s: float | None
    later_mean_latency_s: float | None
    later_mean_input_tokens: float | None
    """Input tokens are billed in full either way; the cache saves time, not usage."""
    speedup: float | None
    """``first_latency_s / later_median_latency_s``; None without later questions."""

    def to_dict(self) -> dict[str, object]:
        """JSON-able dict."""
        return dict(self.__dict__)


def cache_effect(traces: Sequence[Trace]) -> CacheEffect | None:
    """Measure the prompt cache from a full-context run's traces, in the order the run asked them.

    Only meaningful for a run with concurrency 1 on one conversation, judged after the answers
    (the service does that for ``full-context``); traces must be in execution order (the
    question order of that run).

    Args:
        traces: the run's traces; ones without a model call (no step latency) are skipped.

    Returns:
        The comparison, or None when no trace has a timed model call.
    """
    timed = [t for t in traces if t.steps and float(t.steps[0].get("latency_s") or 0.0) > 0.0]
    if not timed:
        return None
    first, later = timed[0], timed[1:]
    lat = [float(t.steps[0]["latency_s"]) for t in later]
    first_lat = float(first.steps[0]["latency_s"])
    median = statistics.median(lat) if lat else None
    return CacheEffect(
        first_query_id=first.query_id,
        first_latency_s=round(first_lat, 3),
        first_input_tokens=first.input_tokens,
        later_n=len(later),
        later_median_latency_s=None if median is None else round(median, 3),
        later_mean_latency_s=round(statistics.fmean(lat), 3) if lat else None,
        later_mean_input_tokens=statistics.fmean(t.input_tokens for t in later) if later else None,
        speedup=round(first_lat / median, 2) if median else None,
    )
