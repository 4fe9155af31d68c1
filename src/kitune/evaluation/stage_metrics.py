"""Stage metrics: each program scored on its own deterministic signal, with 95% intervals.

The end-to-end loop score (accuracy, tokens, timeouts) decides whether a setting is accepted;
these cheap, LLM-free measures are what each program's optimiser is scored on and what the
report shows beside the end-to-end numbers, per split. Inputs are plain data, so the loop and a
report script call the same functions:

* questions (:class:`~kitune.data.loaders.Question`: gold answer + aliases, gold and evidence
  doc ids). A question's **gold documents** are its ``gold_docids`` (qrel_golds), else its
  ``evidence_docids``;
* extracted KIs grouped by document (``docid → KIs``; disambiguation KIs left out);
* extraction counters (:class:`ExtractionCounts`, from the extractor's drops and counters);
* look-up results: ``query id → KIs best first`` as ``get_context`` returned them.

**Extractor.** *Answer coverage*: share of questions whose gold answer or an alias appears —
Unicode-folded and whole-word (:func:`kitune.text.contains_answer`) — in the title, description
or object of a KI extracted from one of its gold documents; questions whose every gold answer
is ``yes``/``no`` are left out (no single fact states a comparison's verdict; counted in
``excluded``). *Evidence coverage*: share of the questions' distinct evidence documents
(evidence ∪ gold ids) with at least one KI. *Grounding rate*: share of the facts that reached
the evidence check whose evidence span was found verbatim (edge punctuation trimmed at most);
a span the guardrails had to replace (``evidence_repaired``) or could not find
(``evidence_not_found``) is not grounded. *KI tokens per document*: mean over those evidence
documents of the tokens of their KIs as the agent reads them (:meth:`kitune.ki.KI.text_for_context`).

**Rewriter.** *Recall@k*: share of questions for which one of the first ``k`` returned KIs has
an evidence doc id among the question's gold documents; *MRR*: mean of ``1 / rank`` of the first
such KI (0 when none within ``k``).

**Per question.** The question-level metrics also give each question's own value
(:func:`answer_hits`, :func:`reciprocal_ranks`; in :attr:`StageReport.per_question` under
``extractor_answer_coverage``, ``rewriter_recall_at_k`` and ``rewriter_mrr``), so two settings
measured on the same questions can be compared paired, question by question.

Proportions carry a 95% Wilson interval (:func:`kitune.evaluation.summary.wilson_interval`);
means (MRR, tokens) a normal-approximation interval ``mean ± 1.96·s/√n`` (``s`` the sample
standard deviation; the mean itself when ``n < 2``). The extractor's reflection feedback (per
document, the answer-bearing sentence its KIs missed) is :mod:`kitune.evaluation.stage_feedback`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kitune.evaluation.summary import wilson_interval
from kitune.text import contains_answer, normalize_answer
from kitune.usage import estimate_tokens

if TYPE_CHECKING:
    from kitune.data.loaders import Question
    from kitune.ki import KI

__all__ = [
    "ExtractionCounts",
    "RetrievedKI",
    "StageMetric",
    "StageReport",
    "answer_coverage",
    "answer_hits",
    "evidence_coverage",
    "extractor_metrics",
    "gold_documents",
    "grounding_rate",
    "is_yes_no",
    "ki_states_answer",
    "ki_tokens_per_doc",
    "per_question_values",
    "reciprocal_rank",
    "reciprocal_ranks",
    "rewriter_metrics",
]

_Z = 1.959963984540054
_YES_NO = frozenset({"yes", "no"})
_AFTER_EVIDENCE = ("invalid_ki", "over_cap")
"""Drop reasons decided after the evidence check passed (see ``kitune.programs.guardrails``)."""


class RetrievedKI(Protocol):
    """What recall@k reads from a returned KI (a :class:`~kitune.ki.KI` or a ``ContextKI``)."""

    @property
    def evidence_doc_ids(self) -> Sequence[str]:
        """Documents the KI's evidence comes from."""
        ...


@dataclass(frozen=True)
class StageMetric:
    """One stage measure on one split: a proportion (``successes`` set) or a mean."""

    stage: str
    """``extractor`` or ``rewriter``."""
    name: str
    """Metric key (``answer_coverage``, ``recall_at_k`` …)."""
    label: str
    """Column heading for reports (``answer coverage``, ``recall@10`` …)."""
    value: float | None
    """The share (0.0–1.0) or the mean; None when ``n == 0``."""
    n: int
    """Sample size: questions, documents or facts counted."""
    ci_low: float | None
    ci_high: float | None
    """95% interval (Wilson for proportions, normal approximation for means)."""
    successes: int | None = None
    """Numerator of a proportion (None for a mean)."""
    excluded: int = 0
    """Items left out of ``n`` by the metric's rule (e.g. yes/no questions, no gold document)."""

    def cell(self) -> str:
        """Markdown cell: ``6/8 = 75.0% [40.9%–92.9%]`` or ``412.5 [380.1–444.9] (n=20)``."""
        if self.value is None:
            return "– (n=0)"
        if self.successes is not None:
            return (
                f"{self.successes}/{self.n} = {self.value:.1%} "
                f"[{self.ci_low or 0.0:.1%}–{self.ci_high or 0.0:.1%}]"
            )
        return f"{self.value:.3g} [{self.ci_low or 0.0:.3g}–{self.ci_high or 0.0:.3g}] (n={self.n})"


def _share(stage: str, name: str, label: str, k: int, n: int, excluded: int = 0) -> StageMetric:
    if n == 0:
        return StageMetric(stage, name, label, None, 0, None, None, 0, excluded)
    low, high = wilson_interval(k, n)
    return StageMetric(stage, name, label, k / n, n, low, high, k, excluded)


def _mean(
    stage: str, name: str, label: str, values: Sequence[float], high: float | None, excluded: int = 0
) -> StageMetric:
    n = len(values)
    if n == 0:
        return StageMetric(stage, name, label, None, 0, None, None, None, excluded)
    m = sum(values) / n
    half = _Z * math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1) / n) if n > 1 else 0.0
    top = m + half if high is None else min(high, m + half)
    return StageMetric(stage, name, label, m, n, max(0.0, m - half), top, None, excluded)


@dataclass(frozen=True)
class StageReport:
    """The stage metrics of one split (a row of the report's stage table)."""

    split: str
    """``tune``, ``validation`` …"""
    metrics: tuple[StageMetric, ...]
    per_question: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """``<stage>_<name>`` → query id → the question's value (:func:`per_question_values`: 0/1 for
    answer coverage and recall@k, the reciprocal rank for MRR; questions the metric leaves out are
    absent). Empty when not recorded."""
    retrieved: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Query id → ids of the first ``k`` KIs the rewriter's look-up returned, best first (what
    recall@k read; the gate compares them before and after a change). Empty when not recorded."""

    def values(self, stage: str, name: str) -> dict[str, float]:
        """Query id → value of ``stage``/``name`` (empty when not recorded)."""
        return dict(self.per_question.get(f"{stage}_{name}", {}))

    def get(self, stage: str, name: str) -> StageMetric | None:
        """The metric ``stage``/``name``, or None when not measured."""
        return next((m for m in self.metrics if (m.stage, m.name) == (stage, name)), None)

    def to_metrics(self, prefix: str) -> dict[str, float]:
        """Flat floats for tracking: ``<prefix>_<stage>_<name>`` plus ``_ci_low``, ``_ci_high``, ``_n``.

        A metric with no value (``n == 0``) contributes only its ``_n`` (0.0).
        """
        out: dict[str, float] = {}
        for m in self.metrics:
            key = f"{prefix}_{m.stage}_{m.name}"
            out[f"{key}_n"] = float(m.n)
            if m.value is not None:
                out[key] = m.value
                out[f"{key}_ci_low"] = float(m.ci_low or 0.0)
                out[f"{key}_ci_high"] = float(m.ci_high or 0.0)
        return out

    def markdown_header(self) -> str:
        """Two lines: ``| split | <stage> <label> | …`` and the separator."""
        cols = [f"{m.stage} {m.label}" for m in self.metrics]
        return "| split | " + " | ".join(cols) + " |\n|" + "---|" * (len(cols) + 1)

    def markdown_row(self) -> str:
        """One line: ``| <split> | <cell> | …`` (see :meth:`StageMetric.cell`)."""
        return f"| {self.split} | " + " | ".join(m.cell() for m in self.metrics) + " |"


def gold_documents(question: Question) -> tuple[str, ...]:
    """The question's answer-bearing documents: ``gold_docids``, else ``evidence_docids``."""
    return tuple(question.gold_docids or question.evidence_docids)


def ki_states_answer(ki: KI, golds: Iterable[str]) -> bool:
    """True when the KI's title, description or object contains a gold answer (folded, whole-word)."""
    text = f"{ki.title} {ki.description} {ki.payload.properties.object}"
    return contains_answer(text, golds)


def is_yes_no(question: Question) -> bool:
    """True when every gold answer of ``question`` normalises to ``yes`` or ``no``."""
    return all(normalize_answer(g) in _YES_NO for g in question.golds)


def answer_coverage(questions: Sequence[Question], kis_by_doc: Mapping[str, Sequence[KI]]) -> StageMetric:
    """Extractor answer coverage (see the module docstring); ``n`` = questions counted.

    Questions with no gold document, or whose answers are all yes/no, are ``excluded``.
    """
    hits = n = excluded = 0
    for q in questions:
        docs = gold_documents(q)
        if not docs or is_yes_no(q):
            excluded += 1
            continue
        n += 1
        hits += any(ki_states_answer(k, q.golds) for d in docs for k in kis_by_doc.get(d, ()))
    return _share("extractor", "answer_coverage", "answer coverage", hits, n, excluded)


def _evidence_docs(questions: Sequence[Question]) -> list[str]:
    return list(dict.fromkeys(d for q in questions for d in (*q.evidence_docids, *q.gold_docids)))


def evidence_coverage(questions: Sequence[Question], kis_by_doc: Mapping[str, Sequence[KI]]) -> StageMetric:
    """Share of the questions' distinct evidence documents with ≥ 1 KI; ``n`` = documents."""
    docs = _evidence_docs(questions)
    with_kis = sum(bool(kis_by_doc.get(d)) for d in docs)
    return _share("extractor", "evidence_coverage", "evidence coverage", with_kis, len(docs))


@dataclass(frozen=True)
class ExtractionCounts:
    """Extraction counters summed over documents (the grounding rate's input)."""

    kept: int
    """KIs kept by the guardrails."""
    drops: Mapping[str, int]
    """Guardrail drop reason → count (``evidence_not_found``, ``over_cap`` …)."""
    counters: Mapping[str, int]
    """Guardrail/parse counters (``evidence_repaired`` is read)."""

    @classmethod
    def from_results(cls, results: Iterable[Any]) -> ExtractionCounts:
        """Sum per-document results with ``kis``, ``drops`` and ``counters`` (``DocExtraction``)."""
        kept = 0
        drops: dict[str, int] = {}
        counters: dict[str, int] = {}
        for r in results:
            kept += len(r.kis)
            for target, source in ((drops, r.drops), (counters, r.counters)):
                for key, v in source.items():
                    target[key] = target.get(key, 0) + int(v)
        return cls(kept, drops, counters)


def grounding_rate(counts: ExtractionCounts) -> StageMetric:
    """Grounded / facts that reached the evidence check; ``n`` = those facts.

    Reached = kept + ``invalid_ki`` + ``over_cap`` + ``evidence_not_found`` drops (the rules
    before the evidence check drop a fact before its span is looked at); grounded = reached −
    ``evidence_not_found`` − ``evidence_repaired``.
    """
    passed = counts.kept + sum(int(counts.drops.get(r, 0)) for r in _AFTER_EVIDENCE)
    reached = passed + int(counts.drops.get("evidence_not_found", 0))
    grounded = passed - int(counts.counters.get("evidence_repaired", 0))
    return _share("extractor", "grounding_rate", "grounding", max(grounded, 0), reached)


def ki_tokens_per_doc(
    questions: Sequence[Question],
    kis_by_doc: Mapping[str, Sequence[KI]],
    count_tokens: Callable[[str], int] = estimate_tokens,
) -> StageMetric:
    """Mean tokens of the KIs of each evidence document (0 for a document without KIs).

    Args:
        questions: whose evidence ∪ gold documents are measured (``n`` = those documents).
        kis_by_doc: docid → extracted KIs.
        count_tokens: text → tokens (default tiktoken ``cl100k_base``, chars/4 offline).
    """
    values = [
        float(sum(count_tokens(k.text_for_context()) for k in kis_by_doc.get(d, ())))
        for d in _evidence_docs(questions)
    ]
    return _mean("extractor", "ki_tokens_per_doc", "KI tokens/doc", values, None)


def reciprocal_rank(targets: Iterable[str], returned: Sequence[RetrievedKI], k: int) -> float:
    """``1 / rank`` of the first of the first ``k`` KIs citing a target document, else 0.0."""
    want = set(targets)
    for rank, ki in enumerate(returned[:k], 1):
        if want & set(ki.evidence_doc_ids):
            return 1.0 / rank
    return 0.0


def reciprocal_ranks(
    questions: Sequence[Question], lookups: Mapping[str, Sequence[RetrievedKI]], *, k: int
) -> dict[str, float]:
    """Query id → reciprocal rank of its first gold KI within ``k`` (0.0: none; a missing look-up: 0.0).

    Questions without a gold document are left out (as in :func:`rewriter_metrics`).
    """
    return {
        q.query_id: reciprocal_rank(gold_documents(q), lookups.get(q.query_id, ()), k)
        for q in questions
        if gold_documents(q)
    }


def answer_hits(questions: Sequence[Question], kis_by_doc: Mapping[str, Sequence[KI]]) -> dict[str, float]:
    """Query id → 1.0 when a KI of a gold document states its answer, else 0.0 (answer coverage's rule).

    Questions :func:`answer_coverage` excludes (no gold document, yes/no) are left out.
    """
    return {
        q.query_id: float(
            any(ki_states_answer(k, q.golds) for d in gold_documents(q) for k in kis_by_doc.get(d, ()))
        )
        for q in questions
        if gold_documents(q) and not is_yes_no(q)
    }


def per_question_values(
    questions: Sequence[Question],
    kis_by_doc: Mapping[str, Sequence[KI]],
    lookups: Mapping[str, Sequence[RetrievedKI]] | None,
    *,
    k: int,
) -> dict[str, dict[str, float]]:
    """The per-question values of :attr:`StageReport.per_question` (rewriter ones only with ``lookups``)."""
    out = {"extractor_answer_coverage": answer_hits(questions, kis_by_doc)}
    if lookups is not None:
        rr = reciprocal_ranks(questions, lookups, k=k)
        out["rewriter_recall_at_k"] = {q: float(v > 0) for q, v in rr.items()}
        out["rewriter_mrr"] = rr
    return out


def rewriter_metrics(
    questions: Sequence[Question], lookups: Mapping[str, Sequence[RetrievedKI]], *, k: int
) -> tuple[StageMetric, StageMetric]:
    """Recall@k and MRR of ``get_context`` against the questions' gold documents.

    Args:
        questions: the split's questions; those without a gold document are ``excluded``.
        lookups: query id → KIs best first (one rewritten look-up per question); a missing id
            counts as an empty result.
        k: cut-off, ≥ 1.

    Returns:
        ``(recall_at_k, mrr)``.

    Raises:
        ValueError: ``k`` < 1.
    """
    if k < 1:
        raise ValueError(f"k={k}: the recall cut-off must be at least 1")
    ranks: list[float] = []
    excluded = 0
    for q in questions:
        docs = gold_documents(q)
        if not docs:
            excluded += 1
            continue
        ranks.append(reciprocal_rank(docs, lookups.get(q.query_id, ()), k))
    hits = sum(r > 0 for r in ranks)
    recall = _share("rewriter", "recall_at_k", f"recall@{k}", hits, len(ranks), excluded)
    return recall, _mean("rewriter", "mrr", "MRR", ranks, 1.0, excluded)


def extractor_metrics(
    questions: Sequence[Question],
    kis_by_doc: Mapping[str, Sequence[KI]],
    counts: ExtractionCounts | None = None,
    *,
    count_tokens: Callable[[str], int] = estimate_tokens,
) -> tuple[StageMetric, ...]:
    """Answer coverage, evidence coverage, grounding rate (when ``counts`` given), KI tokens/doc."""
    out = [answer_coverage(questions, kis_by_doc), evidence_coverage(questions, kis_by_doc)]
    if counts is not None:
        out.append(grounding_rate(counts))
    out.append(ki_tokens_per_doc(questions, kis_by_doc, count_tokens))
    return tuple(out)
