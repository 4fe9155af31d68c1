"""What the optimisers optimise: one DSPy module, example builder and feedback metric per program.

Since issue 21 the loop's extractor and rewriter tasks score on their own stage signals
(:mod:`kitune.optimizers.stage_tasks`: document coverage, recall@k); the extractor and rewriter
modules and metrics below (:class:`InContextQA` with whole agent episodes, the coverage-plus-
grounding extractor metric) stay available to plug-in tasks and direct optimiser runs, and the
disambiguator's task and :func:`extraction_outcomes` are still the loop's.

Every metric has GEPA's signature ``metric(gold, pred, trace=None, pred_name=None,
pred_trace=None) -> dspy.Prediction(score, feedback)`` (score 0.0–1.0, higher is better);
:func:`as_float_metric` turns one into the plain float metric MIPROv2 wants.

* **rewriter** — :class:`InContextQA`: question → rewrite → ``get_context`` → the budgeted agent
  → answer. Score: :func:`kitune.optimizers.objective.question_score` (correctness plus a
  scale-free token ratio to the reference run); feedback
  :func:`kitune.optimizers.objective.trace_feedback`.
  Predictor ``rewriter.planner``.
* **extractor** — :class:`kitune.programs.fact_extractor.FactExtractor` on doc-level examples
  built from the tuning questions' gold documents (:func:`extractor_examples`). Score: ``0.6 ×
  covers an answer + 0.4 × grounding rate`` (0 for a failed document); feedback the drop
  reasons. No LLM in the metric. Predictor ``extract``.
* **disambiguator** — :class:`CheckedDisambiguator` on failure examples
  (:func:`disambiguator_examples`). Score: 0 when a guardrail rejects the KI, 0.5 when it passes,
  1.0 when it is also retrieved for its question. Predictor ``program.writer``.

Injected dependencies (store, chat model, judge) live in a :class:`Shared` holder that deep
copies share, because optimisers deep-copy the module for every candidate.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import dspy

from kitune.data.examples import to_dspy_examples
from kitune.data.loaders import Question
from kitune.errors import DocumentNotFoundError
from kitune.evaluation.agent import Agent
from kitune.evaluation.budget import Budget
from kitune.evaluation.failures import is_correct
from kitune.evaluation.metrics import build_trace, failed_trace
from kitune.evaluation.tools import build_toolbox
from kitune.optimizers.objective import LoopWeights, ki_contains_answer, question_score, trace_feedback

if TYPE_CHECKING:
    from kitune.chat import ChatModel
    from kitune.evaluation.metrics import JudgeFn
    from kitune.evaluation.tools import ContextObservation
    from kitune.evaluation.trace import Trace
    from kitune.optimizers.feedback import Failure
    from kitune.programs.query_rewriter import QueryRewriter
    from kitune.retrieval.base import Store
    from kitune.schema import Document

__all__ = [
    "REWRITER_HINT",
    "CheckedDisambiguator",
    "InContextQA",
    "Shared",
    "as_float_metric",
    "disambiguator_examples",
    "disambiguator_metric",
    "extraction_outcomes",
    "extractor_examples",
    "extractor_metric",
    "make_rewriter_metric",
    "qa_examples",
]

ContextFactory = Callable[["QueryRewriter"], Callable[[str], "ContextObservation"]]
"""Builds the agent's ``get_context`` tool around a given rewriter (the service layer supplies it)."""


class Shared:
    """Attribute bag for dependencies that must not be copied; ``deepcopy`` returns it unchanged."""

    def __init__(self, **items: Any) -> None:
        self.__dict__.update(items)

    def __deepcopy__(self, memo: dict[int, Any]) -> Shared:
        return self

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"Shared has no item {name!r}")


class InContextQA(dspy.Module):  # type: ignore[misc]
    """Question → rewrite → get_context → budgeted agent → answer (the rewriter's task).

    Args:
        rewriter: the :class:`~kitune.programs.query_rewriter.QueryRewriter` being tuned.
        context_factory: rewriter → the agent's ``get_context`` tool.
        chat_model: the agent model.
        cfg: configuration (agent budget, limits).
        judge: grader (None: exact match decides).
        corpus_store: the raw-search fallback (None: the in-context skill without it).
    """

    def __init__(
        self,
        rewriter: QueryRewriter,
        *,
        context_factory: ContextFactory,
        chat_model: ChatModel,
        cfg: Any,
        judge: JudgeFn | None = None,
        corpus_store: Any = None,
    ) -> None:
        super().__init__()
        self.rewriter = rewriter
        self.deps = Shared(
            context_factory=context_factory,
            chat_model=chat_model,
            cfg=cfg,
            judge=judge,
            corpus_store=corpus_store,
        )

    def run_question(self, question: Question) -> Trace:
        """Answer one question with the agent; never raises (a failure is a ``failed`` trace)."""
        d = self.deps
        try:
            box = build_toolbox(
                "in-context", d.cfg, corpus_store=d.corpus_store, get_context=d.context_factory(self.rewriter)
            )
            agent = Agent(
                d.chat_model,
                box,
                budget=Budget.from_config(d.cfg.agent),
                max_output_tokens=d.cfg.lm.agent.max_tokens,
            )
            return build_trace(question, "in-context", agent.run(question.query), judge=d.judge)
        except Exception as e:  # one question never sinks an optimisation run
            return failed_trace(question, "in-context", f"{type(e).__name__}: {e}")

    def forward(self, question: str, **gold: Any) -> dspy.Prediction:
        """Answer ``question``; extra example fields (answer, aliases, ids) are used for grading.

        Returns:
            ``dspy.Prediction(answer=str, trace=Trace)``.
        """
        q = Question(
            query_id=str(gold.get("query_id") or "q"),
            query=question,
            answer=str(gold.get("answer") or ""),
            aliases=tuple(gold.get("aliases") or ()),
            evidence_docids=tuple(gold.get("evidence_docids") or ()),
            gold_docids=tuple(gold.get("gold_docids") or ()),
        )
        trace = self.run_question(q)
        return dspy.Prediction(answer=trace.exact_answer, trace=trace)


def qa_examples(questions: Sequence[Question]) -> list[dspy.Example]:
    """One example per question; every field is an input so :class:`InContextQA` can grade."""
    keys = ("question", "answer", "aliases", "query_id", "evidence_docids", "gold_docids")
    return [ex.with_inputs(*keys) for ex in to_dspy_examples(questions)]


REWRITER_HINT = "Plan look-ups whose entity tags and text would surface facts naming the gold answer."
"""The rewriter metric's advice on a wrong answer (:func:`~kitune.optimizers.objective.trace_feedback`)."""


def make_rewriter_metric(
    weights: LoopWeights | None = None, reference_tokens: Mapping[str, float] | None = None
) -> Callable[..., dspy.Prediction]:
    """The rewriter's metric: :func:`~kitune.optimizers.objective.question_score` (0–1) + feedback.

    Args:
        weights: loop weights (timeout penalty; a token weight of 0 drops the token term).
        reference_tokens: query id → that question's input tokens in the reference run (the
            tuning run GEPA starts from), so the token term is a scale-free ratio.
    """
    w = weights or LoopWeights()
    refs = dict(reference_tokens or {})

    def metric(
        gold: Any, pred: Any, trace: Any = None, pred_name: str | None = None, pred_trace: Any = None
    ) -> dspy.Prediction:
        t = getattr(pred, "trace", None)
        if t is None:
            return dspy.Prediction(score=0.0, feedback="The program produced no trace.")
        score = question_score(t, refs.get(t.query_id), w)
        return dspy.Prediction(score=score, feedback=trace_feedback(t, REWRITER_HINT))

    return metric


def extractor_examples(
    questions: Sequence[Question],
    get_document: Callable[[str], Document],
    *,
    max_docs: int | None = None,
    outcomes: Mapping[str, str] | None = None,
    first: Sequence[str] = (),
) -> list[dspy.Example]:
    """Doc-level examples from the questions' gold documents (evidence documents when none).

    Each example has inputs ``docid``, ``text``, ``url``, ``title``, the label ``answers`` (gold
    answers + aliases of every question the document is gold for) and ``outcome``: what the agent
    did with this document's KIs (:func:`extraction_outcomes`; empty when unknown), which the
    metric passes on as feedback. Unknown documents are skipped. Order: the documents in
    ``first`` (e.g. the gold documents of no-candidate failures), then first appearance; at most
    ``max_docs``.
    """
    answers: dict[str, list[str]] = {}
    for docid in first:
        answers.setdefault(docid, [])
    for q in questions:
        for docid in q.gold_docids or q.evidence_docids:
            answers.setdefault(docid, []).extend(q.golds)
    out: list[dspy.Example] = []
    for docid, golds in answers.items():
        if not golds:
            continue
        try:
            doc = get_document(docid)
        except (DocumentNotFoundError, KeyError):
            continue
        ex = dspy.Example(
            docid=doc.docid,
            text=doc.text,
            url=doc.url,
            title=doc.title,
            answers=golds,
            outcome=(outcomes or {}).get(docid, ""),
        )
        out.append(ex.with_inputs("docid", "text", "url", "title"))
        if max_docs is not None and len(out) >= max_docs:
            break
    return out


def extractor_metric(
    gold: Any, pred: Any, trace: Any = None, pred_name: str | None = None, pred_trace: Any = None
) -> dspy.Prediction:
    """Score one document's extraction (see the module docstring); no LLM."""
    kis = list(getattr(pred, "kis", []) or [])
    drops: dict[str, int] = dict(getattr(pred, "drops", {}) or {})
    if getattr(pred, "status", "failed") != "ok":
        result = getattr(pred, "result", None)
        err = getattr(result, "error", "") if result is not None else ""
        return dspy.Prediction(
            score=0.0, feedback=f"Extraction failed: {err[:300]}. Reply with a JSON array of facts."
        )
    answers = list(gold.get("answers", []) or [])
    covered = any(ki_contains_answer(k, answers) for k in kis)
    offered = len(kis) + sum(drops.values())
    grounding = len(kis) / offered if offered else 0.0
    score = 0.6 * float(covered) + 0.4 * grounding
    lines = [f"{len(kis)} facts kept of {offered} offered."]
    if answers:
        lines.append(
            f"A fact states {answers[0]!r}."
            if covered
            else f"No fact states {answers[0]!r}, which the document holds."
        )
    for reason, n in sorted(drops.items(), key=lambda kv: -kv[1])[:5]:
        lines.append(f"Dropped {n}: {reason}.")
    outcome = gold.get("outcome") if hasattr(gold, "get") else None
    if outcome:
        lines.append(f"With the current instruction's KIs: {outcome}")
    return dspy.Prediction(score=score, feedback=" ".join(lines))


def extraction_outcomes(
    questions: Sequence[Question],
    traces: Sequence[Trace],
    kis_by_doc: Mapping[str, Sequence[Any]],
    *,
    kinds: Mapping[str, str | None] | None = None,
    max_chars: int = 600,
) -> dict[str, str]:
    """Per gold document, what the agent did with the KIs extracted from it (extractor feedback).

    For each tuning question and each of its gold documents (evidence documents when none): was
    the question answered correctly, its failure kind, whether the agent saw the document, how
    many KIs the document has and whether any of them states the gold answer — i.e. which
    answer-bearing fact is missing from the KIs.

    Args:
        questions: the tuning questions.
        traces: their traces (by query id).
        kis_by_doc: docid → KIs extracted from it.
        kinds: query id → failure kind (None: correct).
        max_chars: cap per document.

    Returns:
        docid → one or more sentences (one per question the document serves).
    """
    by_id = {t.query_id: t for t in traces}
    out: dict[str, list[str]] = {}
    for q in questions:
        t = by_id.get(q.query_id)
        if t is None:
            continue
        kind = (kinds or {}).get(q.query_id)
        verdict = (
            "answered correctly"
            if is_correct(t)
            else f"answered {t.exact_answer or '(nothing)'!r} ({kind or 'wrong'})"
        )
        for docid in q.gold_docids or q.evidence_docids:
            kis = list(kis_by_doc.get(docid, ()))
            states = any(ki_contains_answer(k, q.golds) for k in kis)
            seen = docid in set(t.doc_ids_seen)
            fact = (
                f"a KI states {q.answer!r}"
                if states
                else f"no KI states the answer {q.answer!r} (the missing answer-bearing fact)"
            )
            out.setdefault(docid, []).append(
                f"Question {q.query!r}: the agent {verdict}; it {'saw' if seen else 'never saw'} this "
                f"document's KIs; {len(kis)} KIs, {fact}."
            )
    return {d: " ".join(v)[:max_chars] for d, v in out.items()}


class CheckedDisambiguator(dspy.Module):  # type: ignore[misc]
    """Wraps a :class:`~kitune.programs.disambiguator.Disambiguator` so forward applies its guardrails.

    Returns ``dspy.Prediction(result=DisambiguationResult, question=str)``.
    """

    def __init__(self, program: Any) -> None:
        super().__init__()
        self.program = program

    def forward(
        self, question: str, correct_answer: str, wrong_answer: str, document: str, docid: str = "doc"
    ) -> dspy.Prediction:
        """Write and check one disambiguation KI."""
        res = self.program.disambiguate(question, correct_answer, wrong_answer, document, docid)
        return dspy.Prediction(result=res, question=question)


def disambiguator_examples(
    failures: Sequence[Failure], get_document: Callable[[str], Document]
) -> list[dspy.Example]:
    """One example per failure whose gold document exists (inputs of :class:`CheckedDisambiguator`)."""
    out: list[dspy.Example] = []
    for f in failures:
        for docid in f.gold_docids:
            try:
                doc = get_document(docid)
            except (DocumentNotFoundError, KeyError):
                continue
            ex = dspy.Example(
                question=f.question,
                correct_answer=f.gold_answer,
                wrong_answer=f.prediction,
                document=doc.text,
                docid=doc.docid,
            )
            out.append(ex.with_inputs("question", "correct_answer", "wrong_answer", "document", "docid"))
            break
    return out


def disambiguator_metric(
    store: Store | None, context_fn: Callable[[str], Sequence[str]] | None, top_k: int = 10
) -> Callable[..., dspy.Prediction]:
    """The disambiguator's metric: 0 rejected, 0.5 passes the guardrails, 1.0 also retrieved.

    The retrieval check writes the KI to ``store``, asks ``context_fn`` and removes it again (the
    store is left as it was). Without a store only the guardrails count. The write-ask-remove
    section holds a lock, so metric calls on several threads never see each other's KIs.
    """
    lock = threading.Lock()

    def metric(
        gold: Any, pred: Any, trace: Any = None, pred_name: str | None = None, pred_trace: Any = None
    ) -> dspy.Prediction:
        res = getattr(pred, "result", None)
        if res is None or res.ki is None:
            reason = getattr(res, "rejected_reason", None) or "no result"
            return dspy.Prediction(
                score=0.0,
                feedback=f"Rejected: {reason}. The title must contain {gold.correct_answer!r} and "
                f"{gold.wrong_answer!r} exactly, and the evidence must be copied verbatim.",
            )
        if store is None or context_fn is None:
            return dspy.Prediction(score=0.5, feedback="Passed the guardrails.")
        ki = res.ki
        with lock:
            try:
                store.get(ki.id)
                existed = True
            except DocumentNotFoundError:
                existed = False
            try:
                store.upsert([ki])
                found = ki.id in list(context_fn(gold.question))[:top_k]
            finally:
                if not existed:
                    store.delete([ki.id])
        if found:
            return dspy.Prediction(
                score=1.0, feedback="Passed the guardrails and is retrieved for its question."
            )
        return dspy.Prediction(
            score=0.5,
            feedback="Passed the guardrails but retrieval for the question does not return it: use the "
            "question's own words and entity names in the title.",
        )

    return metric


def as_float_metric(metric: Callable[..., Any]) -> Callable[..., float]:
    """Wrap a feedback metric for optimisers that want a float (MIPROv2)."""

    def scalar(gold: Any, pred: Any, trace: Any = None) -> float:
        out = metric(gold, pred, trace)
        return float(out.score if hasattr(out, "score") else out)

    return scalar
