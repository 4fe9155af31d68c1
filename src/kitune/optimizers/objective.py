"""The loop metric and the textual feedback the optimisers reflect on.

**Loop score** (what the loop accepts or rejects on, higher is better)::

    loop_score = accuracy_weight · judge_accuracy
                 − token_weight   · (mean input tokens per question / 10,000)
                 − timeout_weight · timeout_rate

* ``judge_accuracy`` — judge-correct / graded, 0.0–1.0 (0.0 when nothing was graded);
* mean input tokens per question — agent input tokens plus the tools' LLM input tokens (query
  rewrites), divided by the number of questions;
* ``timeout_rate`` — questions whose step budget ran out / questions, 0.0–1.0.

The weights come from ``cfg.optimize`` (defaults 1.0, 0.1, 0.2): with them a run at 60%
accuracy, 20k input tokens per question and 1 timeout in 10 scores ``0.6 − 0.2 − 0.02 = 0.38``.

**Feedback** (:func:`trace_feedback`): per question and per program, plain text GEPA's reflection
LM reads — the wrong answer against the gold answer and its aliases, the evidence documents the
agent never saw, the queries it issued, parse failures, tokens spent, timeouts and
force-commits. **Extractor feedback** (:func:`extractor_feedback`) needs no LLM: evidence
grounding rate, facts per document, guardrail drops by reason, and *answer coverage* — whether
some KI extracted from a question's gold documents contains the normalised gold answer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from kitune.text import normalize_answer

if TYPE_CHECKING:
    from kitune.data.loaders import Question
    from kitune.evaluation.metrics import Trace
    from kitune.evaluation.report import RunSummary
    from kitune.ki import KI
    from kitune.programs.fact_extractor import DocExtraction

__all__ = [
    "ExtractorFeedback",
    "LoopWeights",
    "ProgramName",
    "answer_coverage",
    "extractor_feedback",
    "ki_contains_answer",
    "loop_score",
    "text_contains_answer",
    "trace_feedback",
]

ProgramName = Literal["extractor", "rewriter", "disambiguator"]
"""The programs whose instructions the loop optimises."""

TOKENS_UNIT = 10_000
"""Input tokens per question are divided by this before weighting."""


@dataclass(frozen=True)
class LoopWeights:
    """Weights of :func:`loop_score` (see the module docstring)."""

    accuracy: float = 1.0
    """Weight of judge accuracy (0.0–1.0)."""
    tokens: float = 0.1
    """Penalty per 10,000 mean input tokens per question."""
    timeouts: float = 0.2
    """Penalty per unit of timeout rate (0.0–1.0)."""

    @classmethod
    def from_config(cls, cfg: Any) -> LoopWeights:
        """Read ``cfg.optimize.{accuracy,token,timeout}_weight`` of a ``KituneConfig``."""
        o = cfg.optimize
        return cls(accuracy=o.accuracy_weight, tokens=o.token_weight, timeouts=o.timeout_weight)


def loop_score(summary: RunSummary, weights: LoopWeights | None = None) -> float:
    """The loop metric of one evaluated run (see the module docstring for the formula).

    Args:
        summary: the run's :class:`~kitune.evaluation.report.RunSummary`.
        weights: the weights (None: defaults, equal to ``OptimizeConfig``'s defaults).

    Returns:
        A float, at most ``weights.accuracy``; 0.0 for an empty run.
    """
    w = weights or LoopWeights()
    n = summary.n_total
    if n == 0:
        return 0.0
    accuracy = summary.accuracy or 0.0
    tokens_per_q = (summary.input_tokens + summary.tool_input_tokens) / n
    timeout_rate = summary.timeouts / n
    return w.accuracy * accuracy - w.tokens * tokens_per_q / TOKENS_UNIT - w.timeouts * timeout_rate


def _is_correct(trace: Trace) -> bool:
    if trace.is_graded:
        return bool(trace.judge_correct)
    return bool(trace.em)


def _queries(trace: Trace) -> list[str]:
    out: list[str] = []
    for step in trace.steps:
        if step.get("kind") == "tool" and step.get("args"):
            args = step["args"]
            q = args.get("query") or args.get("docid") or args.get("doc_id")
            out.append(f"{step.get('tool')}({q!r})" if q is not None else f"{step.get('tool')}({args})")
    return out


def trace_feedback(trace: Trace, program: ProgramName = "rewriter", *, max_chars: int = 2000) -> str:
    """Textual feedback on one evaluated question, for the reflection LM.

    Args:
        trace: the question's trace (any skill).
        program: whose feedback: ``rewriter`` stresses the look-ups issued and the evidence
            missed; ``extractor`` what the KIs lacked; ``disambiguator`` the two answers to tell
            apart.
        max_chars: cut the text to this length (≥ 100).

    Returns:
        Several lines of plain text; never empty.
    """
    lines: list[str] = []
    answer = trace.exact_answer or "(no answer)"
    if _is_correct(trace):
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
    if program == "rewriter" and not _is_correct(trace):
        lines.append("Plan look-ups whose entity tags and text would surface facts naming the gold answer.")
    if program == "extractor" and not _is_correct(trace):
        lines.append(
            f"No retrieved fact stated {trace.gold_answer!r}: extract every named entity, date and "
            "relation of the evidence documents, secondary ones included."
        )
    if program == "disambiguator" and not _is_correct(trace):
        lines.append(f"A fact must tell {trace.gold_answer!r} from {answer!r}, naming both in its title.")
    text = "\n".join(lines)
    return text[: max(100, max_chars)]


def ki_contains_answer(ki: KI, golds: Iterable[str]) -> bool:
    """True when the KI's title or description contains a normalised gold answer.

    Normalisation is :func:`kitune.text.normalize_answer` (case, punctuation, articles) on both
    sides, compared as a whole-word substring.
    """
    return text_contains_answer(ki.title + " " + ki.description, golds)


def text_contains_answer(text: str, golds: Iterable[str]) -> bool:
    """True when ``text`` contains a gold answer as whole words, after answer normalisation."""
    hay = f" {normalize_answer(text)} "
    for g in golds:
        n = normalize_answer(g)
        if n and f" {n} " in hay:
            return True
    return False


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
