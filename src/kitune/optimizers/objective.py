"""The loop metric and the textual feedback the optimisers reflect on.

**Loop score** (what the loop accepts or rejects on, higher is better) is *relative to a
reference run on the same questions* (the start setting's first measurement on that split, or
the baseline skill), so it is scale-free::

    loop_score = accuracy_weight · (accuracy − accuracy_ref)
                 − token_weight   · log2(tokens_per_question / tokens_per_question_ref)
                 − timeout_weight · (timeout_rate − timeout_rate_ref)

* ``accuracy`` — judge-correct / graded, 0.0–1.0 (failed and grader-error questions excluded);
* tokens per question — agent input tokens plus the tools' LLM input tokens (query rewrites),
  over the questions that did not fail; the term is a *log-ratio*, so halving the tokens earns
  ``token_weight`` and doubling them costs it, whatever the absolute scale;
* ``timeout_rate`` — questions whose step budget ran out / questions that did not fail.

The reference run scores 0.0. Without a reference the token term is 0 and the accuracy and
timeout terms are absolute. Defaults (``cfg.optimize``): accuracy 1.0, tokens 0.1 per doubling,
timeouts 0.2 — a setting must buy a 2× token cost with ≥ 10 points of accuracy.

Worked examples (reference: the published baseline, 60/96 correct, 174.8M input tokens, 28/96
timeouts):

* published scale — with KIs + disambiguation KIs, 88/96 at 42.6M, 27 timeouts:
  ``1.0·(0.917−0.625) − 0.1·log2(42.6/174.8) − 0.2·(0.281−0.292) = 0.292 + 0.204 + 0.002 = 0.498``;
  a run at 60/96 and 38M tokens with the same timeouts scores ``0 + 0.220 + 0.002 = 0.222``. The
  accurate run wins, although it used 12% more tokens (the old additive penalty, 0.1 per 10k
  tokens per question, ranked them the other way round: −3.58 vs −3.39).
* 1/1000 of those tokens (42.6k vs 38k vs 174.8k): every ratio is the same, so the scores are
  exactly the same (0.498, 0.222) and so is the ranking.

**Feedback** (:func:`trace_feedback`): per question and per program, plain text GEPA's reflection
LM reads — the wrong answer against the gold answer and its aliases, the evidence documents the
agent never saw, the queries it issued, parse failures, tokens spent, timeouts and
force-commits. **Extractor feedback** (:func:`extractor_feedback`) needs no LLM: evidence
grounding rate, facts per document, guardrail drops by reason, and *answer coverage* — whether
some KI extracted from a question's gold documents contains the normalised gold answer.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kitune.evaluation.failures import is_correct
from kitune.text import contains_answer

if TYPE_CHECKING:
    from kitune.data.loaders import Question
    from kitune.evaluation.report import RunSummary
    from kitune.evaluation.trace import Trace
    from kitune.ki import KI
    from kitune.programs.fact_extractor import DocExtraction

__all__ = [
    "ExtractorFeedback",
    "LoopWeights",
    "RunStats",
    "answer_coverage",
    "extractor_feedback",
    "ki_contains_answer",
    "loop_score",
    "question_score",
    "run_stats",
    "text_contains_answer",
    "trace_feedback",
]


@dataclass(frozen=True)
class LoopWeights:
    """Weights of :func:`loop_score` (see the module docstring)."""

    accuracy: float = 1.0
    """Weight of the accuracy difference (accuracy in 0.0–1.0)."""
    tokens: float = 0.1
    """Penalty per doubling of input tokens per question relative to the reference."""
    timeouts: float = 0.2
    """Penalty per unit of timeout-rate difference (rates in 0.0–1.0)."""

    @classmethod
    def from_config(cls, cfg: Any) -> LoopWeights:
        """Read ``cfg.optimize.{accuracy,token,timeout}_weight`` of a ``KituneConfig``."""
        o = cfg.optimize
        return cls(accuracy=o.accuracy_weight, tokens=o.token_weight, timeouts=o.timeout_weight)


@dataclass(frozen=True)
class RunStats:
    """The three quantities the loop score compares, over the questions that did not fail."""

    accuracy: float
    """Judge-correct / graded, 0.0–1.0 (0.0 when nothing was graded)."""
    tokens_per_question: float
    """Mean agent + tool input tokens per non-failed question."""
    timeout_rate: float
    """Timed-out / non-failed questions, 0.0–1.0."""
    n: int
    """Questions that did not fail."""


def run_stats(summary: RunSummary) -> RunStats:
    """The :class:`RunStats` of one run summary (failed questions excluded from every term)."""
    n = max(summary.n_total - summary.n_failed, 0)
    if n == 0:
        return RunStats(0.0, 0.0, 0.0, 0)
    tokens = (summary.input_tokens + summary.tool_input_tokens) / n
    return RunStats(float(summary.accuracy or 0.0), tokens, summary.timeouts / n, n)


def _log_ratio(value: float, reference: float) -> float:
    """``log2(value / reference)``, with both floored at 1 token (an empty run is not infinitely cheap)."""
    return math.log2(max(value, 1.0) / max(reference, 1.0))


def loop_score(
    summary: RunSummary | RunStats,
    reference: RunSummary | RunStats | None = None,
    weights: LoopWeights | None = None,
) -> float:
    """The loop metric of one evaluated run relative to a reference run (see the module docstring).

    Args:
        summary: the run (a :class:`~kitune.evaluation.report.RunSummary` or its :class:`RunStats`).
        reference: the reference run on the same questions; None: no token term, absolute
            accuracy and timeout terms.
        weights: the weights (None: defaults, equal to ``OptimizeConfig``'s defaults).

    Returns:
        A float; 0.0 for the reference itself and for a run with no non-failed question. Scale-free:
        multiplying every token count of both runs by the same factor leaves it unchanged.
    """
    w = weights or LoopWeights()
    s = summary if isinstance(summary, RunStats) else run_stats(summary)
    if s.n == 0:
        return 0.0
    if reference is None:
        return w.accuracy * s.accuracy - w.timeouts * s.timeout_rate
    r = reference if isinstance(reference, RunStats) else run_stats(reference)
    if r.n == 0:
        return w.accuracy * s.accuracy - w.timeouts * s.timeout_rate
    return (
        w.accuracy * (s.accuracy - r.accuracy)
        - w.tokens * _log_ratio(s.tokens_per_question, r.tokens_per_question)
        - w.timeouts * (s.timeout_rate - r.timeout_rate)
    )


def question_score(
    trace: Trace, reference_tokens: float | None = None, weights: LoopWeights | None = None
) -> float:
    """A per-question score in 0.0–1.0 for the optimisers, informative at any token scale.

    ``correct`` earns 0.8 of the range and the token term the remaining 0.2:
    ``0.8·correct + 0.2·clip(0.5 − 0.5·log2(tokens / reference_tokens), 0, 1)`` minus
    ``timeout_weight/2`` when the budget ran out, clipped to 0–1. At the reference's tokens the
    token term is 0.1, at half of them 0.2, at double 0.0 — the same at 5k and at 1.8M tokens.
    Without ``reference_tokens`` the token term is a neutral 0.1. A failed question scores 0.

    Args:
        trace: the question's trace.
        reference_tokens: the same question's input tokens in the reference run (agent + tools).
        weights: only ``timeouts`` and whether ``tokens`` is 0 (no token term) are used.
    """
    w = weights or LoopWeights()
    if trace.status == "failed":
        return 0.0
    tokens = trace.input_tokens + trace.tool_input_tokens
    token_term = 0.1
    if reference_tokens and w.tokens > 0:
        token_term = 0.2 * min(1.0, max(0.0, 0.5 - 0.5 * _log_ratio(tokens, reference_tokens)))
    score = 0.8 * float(is_correct(trace)) + token_term - (w.timeouts / 2) * float(trace.timed_out)
    return min(1.0, max(0.0, score))


def _queries(trace: Trace) -> list[str]:
    out: list[str] = []
    for step in trace.steps:
        if step.get("kind") == "tool" and step.get("args"):
            args = step["args"]
            q = args.get("query") or args.get("docid") or args.get("doc_id")
            out.append(f"{step.get('tool')}({q!r})" if q is not None else f"{step.get('tool')}({args})")
    return out


def trace_feedback(trace: Trace, hint: str = "", *, max_chars: int = 2000) -> str:
    """Textual feedback on one evaluated question, for the reflection LM.

    Args:
        trace: the question's trace (any skill).
        hint: the tuned program's own advice, added when the answer is wrong; ``{gold}`` and
            ``{answer}`` are replaced by the quoted gold and given answers (e.g.
            :data:`kitune.optimizers.tasks.REWRITER_HINT`). Empty: no such line.
        max_chars: cut the text to this length (≥ 100).

    Returns:
        Several lines of plain text; never empty.
    """
    lines: list[str] = []
    answer = trace.exact_answer or "(no answer)"
    if is_correct(trace):
        lines.append(f"Correct: answered {answer!r} (gold {trace.gold_answer!r}).")
    else:
        alias = f" (aliases: {', '.join(map(repr, trace.aliases))})" if trace.aliases else ""
        lines.append(f"Wrong: answered {answer!r}, gold answer is {trace.gold_answer!r}{alias}.")
    missed = [d for d in trace.evidence_docids if d not in set(trace.doc_ids_seen)]
    if missed:
        lines.append(f"Evidence documents never seen: {', '.join(missed)}.")
    elif trace.evidence_docids:
        lines.append("Every evidence document was seen.")
    queries = _queries(trace)
    if queries:
        lines.append("Look-ups issued: " + "; ".join(queries[:8]) + (" …" if len(queries) > 8 else ""))
    else:
        lines.append("No look-ups were issued.")
    parse_errors = [s.get("error") for s in trace.steps if s.get("kind") == "invalid"]
    if parse_errors:
        lines.append(f"Unparseable replies: {len(parse_errors)} (first: {str(parse_errors[0])[:160]}).")
    if trace.timed_out:
        lines.append(f"The step budget ran out ({trace.exhausted_by or 'steps'}).")
    if trace.force_committed:
        lines.append("The answer was force-committed at the end of the budget.")
    lines.append(
        f"Tokens: {trace.input_tokens} input, {trace.output_tokens} output, "
        f"{trace.tool_input_tokens} spent by tools, in {trace.n_steps} steps."
    )
    if hint and not is_correct(trace):
        lines.append(hint.replace("{gold}", repr(trace.gold_answer)).replace("{answer}", repr(answer)))
    text = "\n".join(lines)
    return text[: max(100, max_chars)]


def ki_contains_answer(ki: KI, golds: Iterable[str]) -> bool:
    """True when the KI's title or description contains a normalised gold answer.

    Normalisation is :func:`kitune.text.normalize_answer` (case, punctuation, articles) on both
    sides, compared as a whole-word substring.
    """
    return text_contains_answer(ki.title + " " + ki.description, golds)


text_contains_answer = contains_answer
"""True when ``text`` contains a gold answer as whole words (:func:`kitune.text.contains_answer`)."""


def answer_coverage(questions: Sequence[Question], kis_by_doc: Mapping[str, Sequence[KI]]) -> float | None:
    """Share of questions for which some KI from a gold document contains the gold answer.

    A strong LLM-free proxy for extractor quality: the agent cannot find an answer no KI states.

    Args:
        questions: the questions; gold documents are ``gold_docids``, else ``evidence_docids``.
        kis_by_doc: docid → KIs extracted from it.

    Returns:
        0.0–1.0, or None when no question names a gold document.
    """
    counted = hits = 0
    for q in questions:
        docs = q.gold_docids or q.evidence_docids
        if not docs:
            continue
        counted += 1
        if any(ki_contains_answer(k, q.golds) for d in docs for k in kis_by_doc.get(d, ())):
            hits += 1
    return hits / counted if counted else None


@dataclass(frozen=True)
class ExtractorFeedback:
    """Cheap (no LLM) measures of one extraction pass."""

    docs: int
    """Documents looked at."""
    facts_offered: int
    """Facts the model proposed (kept + dropped)."""
    facts_kept: int
    """KIs that passed the guardrails."""
    drops: dict[str, int] = field(default_factory=dict)
    """Guardrail drop reason → count."""
    parse_failures: int = 0
    """Malformed replies."""
    failed_docs: int = 0
    """Documents whose extraction failed."""
    coverage: float | None = None
    """:func:`answer_coverage` over the questions given, None without questions."""

    @property
    def grounding_rate(self) -> float:
        """Kept / offered, 0.0–1.0 (1.0 when nothing was offered): how much survived the checks."""
        return self.facts_kept / self.facts_offered if self.facts_offered else 1.0

    @property
    def facts_per_doc(self) -> float:
        """Kept facts per document (0.0 when no documents)."""
        return self.facts_kept / self.docs if self.docs else 0.0

    @property
    def violations(self) -> int:
        """Total dropped facts."""
        return sum(self.drops.values())

    def score(self) -> float:
        """``coverage (or 0) + 0.5·grounding_rate − 0.5·failed share``, the extractor metric, ≤ 1.5."""
        failed_share = self.failed_docs / self.docs if self.docs else 0.0
        return (self.coverage or 0.0) + 0.5 * self.grounding_rate - 0.5 * failed_share

    def to_metrics(self) -> dict[str, float]:
        """Flat metrics for tracking (``extract_*``)."""
        out = {
            "extract_docs": float(self.docs),
            "extract_facts_kept": float(self.facts_kept),
            "extract_facts_dropped": float(self.violations),
            "extract_grounding_rate": self.grounding_rate,
            "extract_facts_per_doc": self.facts_per_doc,
            "extract_parse_failures": float(self.parse_failures),
            "extract_failed_docs": float(self.failed_docs),
        }
        if self.coverage is not None:
            out["extract_answer_coverage"] = self.coverage
        return out

    def text(self) -> str:
        """The feedback text for the reflection LM."""
        lines = [
            f"{self.facts_kept} facts kept of {self.facts_offered} offered over {self.docs} documents "
            f"({self.facts_per_doc:.1f} per document, grounding {self.grounding_rate:.0%}).",
        ]
        if self.coverage is not None:
            lines.append(f"Answer coverage: {self.coverage:.0%} of questions have a fact stating the answer.")
        for reason, n in Counter(self.drops).most_common(5):
            lines.append(f"Dropped {n} fact(s): {reason}.")
        if self.parse_failures:
            lines.append(f"{self.parse_failures} replies were not valid JSON arrays of facts.")
        if self.failed_docs:
            lines.append(f"{self.failed_docs} document(s) produced no usable output.")
        return "\n".join(lines)


def extractor_feedback(
    results: Sequence[DocExtraction], questions: Sequence[Question] = ()
) -> ExtractorFeedback:
    """Summarise extraction results into :class:`ExtractorFeedback` (no LLM).

    Args:
        results: one :class:`~kitune.programs.fact_extractor.DocExtraction` per document.
        questions: questions whose gold documents are among ``results`` (for coverage).
    """
    drops: Counter[str] = Counter()
    kept = parse_failures = failed = 0
    by_doc: dict[str, list[KI]] = {}
    for r in results:
        drops.update(r.drops)
        kept += len(r.kis)
        parse_failures += int(r.counters.get("parse_failures", 0))
        failed += int(r.status != "ok")
        by_doc.setdefault(r.docid, []).extend(r.kis)
    return ExtractorFeedback(
        docs=len(results),
        facts_offered=kept + sum(drops.values()),
        facts_kept=kept,
        drops=dict(drops),
        parse_failures=parse_failures,
        failed_docs=failed,
        coverage=answer_coverage(questions, by_doc) if questions else None,
    )
