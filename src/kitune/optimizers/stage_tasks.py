"""The extractor's and the rewriter's optimisation tasks on their own stage signals (issue 21).

Both are cheap and deterministic apart from the one LLM call a metric call makes, so a GEPA
budget of dozens of metric calls costs minutes, not hours of agent episodes:

* **extractor** — one example per *coverable* gold document of the tuning questions (a gold
  document, :func:`~kitune.evaluation.stage_metrics.gold_documents`, of a question that is not
  yes/no and whose answer its text states: :func:`~kitune.evaluation.stage_feedback.answer_sentences`
  finds a sentence). A metric call extracts that one document with the candidate instruction
  (through the extraction cache, :mod:`kitune.optimizers.extraction_cache`) and
  :func:`coverage_metric` scores it with
  :func:`~kitune.evaluation.stage_feedback.document_coverage`: covered / (covered + missed)
  answers; the feedback names each answer-bearing sentence the KIs missed, plus what the agent
  did with the document's current KIs and, for ``out_of_budget`` failures, that the document
  never surfaced;
* **rewriter** — one example per tuning question with a gold document. A metric call is one
  rewrite plus one ``get_context`` (:class:`RewriterRecall`, no agent run); :func:`recall_metric`
  scores ``1 / rank`` of the first of the top ``k`` KIs citing a gold document (0 when none, as
  :func:`~kitune.evaluation.stage_metrics.reciprocal_rank`); the feedback names the missed
  document (title, the entities its KIs name), what came back and the plan that fetched it.

Example order (:func:`order_ids`): the priority items first (gold documents / questions of
``no_candidate`` and ``out_of_budget`` failures), then the rest in a seeded shuffle — the
Pareto set is the first :func:`~kitune.optimizers.gepa.pareto_size` examples. GEPA's
reflection minibatches come from the trainset: the examples whose current score is below 1
(:func:`imperfect`), so a proposal has something to fix (all examples when none is).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import dspy

from kitune.errors import DocumentNotFoundError
from kitune.evaluation.stage_feedback import answer_sentences, document_coverage
from kitune.evaluation.stage_metrics import gold_documents, is_yes_no, reciprocal_rank
from kitune.optimizers.tasks import Shared
from kitune.schema import Document

if TYPE_CHECKING:
    from kitune.data.loaders import Question
    from kitune.ki import KI
    from kitune.programs.query_rewriter import QueryRewriter

__all__ = [
    "RewriterRecall",
    "coverable_documents",
    "coverage_examples",
    "coverage_metric",
    "gold_document_map",
    "imperfect",
    "order_ids",
    "recall_examples",
    "recall_metric",
]

MAX_RETURNED_NAMED = 5
"""Returned KIs the rewriter's miss feedback names."""


def order_ids(ids: Iterable[str], first: Iterable[str], seed: str | int) -> list[str]:
    """``first`` (those among ``ids``, in their order), then the other ``ids`` in a seeded shuffle.

    Args:
        ids: every candidate id (duplicates count once).
        first: priority ids; ids not in ``ids`` are ignored.
        seed: ``random.Random`` seed (a string is hashed deterministically, e.g. ``"0:extractor:2"``).

    Returns:
        Each id of ``ids`` once; the same inputs always give the same order.
    """
    pool = list(dict.fromkeys(ids))
    head = [i for i in dict.fromkeys(first) if i in set(pool)]
    rest = [i for i in pool if i not in set(head)]
    random.Random(seed).shuffle(rest)
    return head + rest


def gold_document_map(
    questions: Sequence[Question], get_document: Callable[[str], Document]
) -> tuple[dict[str, tuple[str, ...]], dict[str, Document]]:
    """Each question's gold document ids and the gold documents that exist, for the program tasks.

    Args:
        questions: the tuning questions.
        get_document: docid → document; a missing one (``DocumentNotFoundError``, ``KeyError``)
            is left out of the documents, not an error.

    Returns:
        ``(gold, documents)``: query id → its gold document ids
        (:func:`~kitune.evaluation.stage_metrics.gold_documents`), and docid → document for every
        gold document found.
    """
    gold = {q.query_id: gold_documents(q) for q in questions}
    documents: dict[str, Document] = {}
    for docids in gold.values():
        for d in docids:
            try:
                documents[d] = get_document(d)
            except (DocumentNotFoundError, KeyError):
                continue
    return gold, documents


def coverable_documents(questions: Sequence[Question], get_document: Callable[[str], Document]) -> list[str]:
    """Gold documents (question order) whose text states the answer of a non-yes/no question they serve."""
    out: dict[str, None] = {}
    for q in questions:
        if is_yes_no(q):
            continue
        for docid in gold_documents(q):
            if docid in out:
                continue
            try:
                doc = get_document(docid)
            except (DocumentNotFoundError, KeyError):
                continue
            if answer_sentences(doc.text, q.golds):
                out[docid] = None
    return list(out)


def coverage_examples(
    questions: Sequence[Question],
    get_document: Callable[[str], Document],
    *,
    first: Sequence[str] = (),
    outcomes: Mapping[str, str] | None = None,
    seed: str | int = 0,
) -> list[dspy.Example]:
    """One example per coverable gold document (:func:`coverable_documents`), ordered by :func:`order_ids`.

    Inputs ``docid``, ``text``, ``url``, ``title`` (what ``FactExtractor.forward`` takes); label
    ``outcome`` — what happened with the document's current KIs (passed on as feedback; empty
    when unknown).
    """
    docids = order_ids(coverable_documents(questions, get_document), first, seed)
    out: list[dspy.Example] = []
    for docid in docids:
        doc = get_document(docid)
        ex = dspy.Example(
            docid=doc.docid,
            text=doc.text,
            url=doc.url,
            title=doc.title,
            outcome=(outcomes or {}).get(docid, ""),
        )
        out.append(ex.with_inputs("docid", "text", "url", "title"))
    return out


def coverage_metric(questions: Sequence[Question]) -> Callable[..., dspy.Prediction]:
    """The extractor's GEPA metric: :func:`~kitune.evaluation.stage_feedback.document_coverage` of a document.

    Args:
        questions: the questions whose answers count (the tuning split).

    Returns:
        ``metric(gold, pred, trace, pred_name, pred_trace) -> dspy.Prediction(score, feedback)``;
        score 0.0–1.0 (0.0 for a failed extraction, whose feedback quotes the error).
    """
    qs = list(questions)

    def metric(
        gold: Any, pred: Any, trace: Any = None, pred_name: str | None = None, pred_trace: Any = None
    ) -> dspy.Prediction:
        status = getattr(pred, "status", "failed")
        if status == "failed":
            result = getattr(pred, "result", None)
            err = getattr(result, "error", "") if result is not None else "no result"
            return dspy.Prediction(
                score=0.0,
                feedback=f"Extraction failed: {err[:300]}. Reply with the facts in the required format.",
            )
        doc = Document(docid=gold.docid, text=gold.text, title=gold.get("title", "") or "")
        kis: list[KI] = list(getattr(pred, "kis", []) or [])
        cov = document_coverage(doc, qs, kis)
        lines = [cov.feedback()]
        if status == "partial":
            lines.append("The reply was cut at its token limit: state fewer, shorter facts.")
        outcome = gold.get("outcome", "")
        if outcome:
            lines.append(f"With the current instruction's KIs: {outcome}")
        return dspy.Prediction(score=cov.score, feedback="\n".join(lines))

    return metric


def imperfect(examples: Sequence[Any], score: Callable[[Any], float]) -> list[Any]:
    """The examples whose current ``score`` is below 1, or all of them when none is (GEPA's trainset)."""
    low = [ex for ex in examples if score(ex) < 1.0]
    return low or list(examples)


class RewriterRecall(dspy.Module):  # type: ignore[misc]
    """Question → rewrite → one ``get_context`` (the rewriter's task; no agent run).

    Args:
        rewriter: the :class:`~kitune.programs.query_rewriter.QueryRewriter` being tuned (its
            predictor is ``rewriter.planner``).
        lookup: ``(rewriter, question) -> ContextResponse`` on the setting's store (the service
            layer supplies it: credit demotion applied, feedback KIs visible).
    """

    def __init__(self, rewriter: QueryRewriter, *, lookup: Callable[[Any, str], Any]) -> None:
        super().__init__()
        self.rewriter = rewriter
        self.deps = Shared(lookup=lookup)

    def forward(self, question: str, **_: Any) -> dspy.Prediction:
        """Rewrite and look up ``question``.

        Returns:
            ``dspy.Prediction(kis=[ContextKI …] best first, plan=QueryPlan, fell_back=bool,
            reason=str | None)``.
        """
        resp = self.deps.lookup(self.rewriter, question)
        return dspy.Prediction(
            kis=list(resp.kis),
            plan=resp.plan,
            fell_back=bool(resp.rewrite_fell_back),
            reason=resp.rewrite_reason,
        )


def recall_examples(
    questions: Sequence[Question],
    *,
    first: Sequence[str] = (),
    seed: str | int = 0,
    describe: Callable[[str], str] | None = None,
    notes: Mapping[str, str] | None = None,
) -> list[dspy.Example]:
    """One example per question with a gold document, ordered by :func:`order_ids` over query ids.

    Inputs ``question``, ``query_id``; labels ``gold_docids`` (list), ``gold_about`` (how the
    feedback names them, from ``describe``; the ids when None) and ``note`` (extra feedback, e.g.
    the ``out_of_budget`` route's "searched X, got nothing about Y").
    """
    by_id = {q.query_id: q for q in questions if gold_documents(q)}
    out: list[dspy.Example] = []
    for qid in order_ids(by_id, first, seed):
        q = by_id[qid]
        docs = list(gold_documents(q))
        about = "; ".join(describe(d) if describe is not None else f"document {d}" for d in docs)
        ex = dspy.Example(
            question=q.query,
            query_id=q.query_id,
            gold_docids=docs,
            gold_about=about,
            note=(notes or {}).get(qid, ""),
        )
        out.append(ex.with_inputs("question", "query_id"))
    return out


def _plan_text(plan: Any) -> str:
    if plan is None:
        return "no plan"
    tags = ", ".join(getattr(plan, "entity_tags", ()) or ()) or "none"
    return f"lexical {plan.lexical!r}, semantic {plan.semantic!r}, entity tags [{tags}]"


def recall_metric(k: int) -> Callable[..., dspy.Prediction]:
    """The rewriter's GEPA metric: ``1 / rank`` of the first of the top ``k`` KIs citing a gold document.

    Args:
        k: the cut-off (``retrieval.default_size``: what the agent is shown), ≥ 1.

    Returns:
        ``metric(gold, pred, trace, pred_name, pred_trace) -> dspy.Prediction(score, feedback)``,
        score 0.0–1.0.

    Raises:
        ValueError: ``k`` < 1.
    """
    if k < 1:
        raise ValueError(f"k={k}: the recall cut-off must be at least 1")

    def metric(
        gold: Any, pred: Any, trace: Any = None, pred_name: str | None = None, pred_trace: Any = None
    ) -> dspy.Prediction:
        kis = list(getattr(pred, "kis", []) or [])
        targets = list(gold.get("gold_docids", []) or [])
        rr = reciprocal_rank(targets, kis, k)
        about = gold.get("gold_about", "") or ", ".join(targets)
        plan = _plan_text(getattr(pred, "plan", None))
        if rr > 0:
            rank = round(1 / rr)
            lines = [f"A KI of the gold document {about} came back at rank {rank} of {min(len(kis), k)}."]
            if rank > 1:
                lines.append(f"Plan: {plan}. Name the gold document's entities so its KI ranks first.")
        else:
            shown = "; ".join(
                f"{getattr(ki, 'title', '')!r} (document {', '.join(ki.evidence_doc_ids)})"
                for ki in kis[:MAX_RETURNED_NAMED]
            )
            got = f"Got: {shown}." if kis else "Got nothing."
            lines = [
                f"None of the top {k} KIs cites the gold document {about}. {got}",
                f"Plan: {plan}: plan a look-up whose entity tags and text name the gold document's entities.",
            ]
        if getattr(pred, "fell_back", False):
            lines.append(f"The rewrite was unusable and fell back to the plain question ({pred.reason}).")
        note = gold.get("note", "")
        if note:
            lines.append(note)
        return dspy.Prediction(score=rr, feedback="\n".join(lines))

    return metric
