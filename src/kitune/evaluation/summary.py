"""Run summaries: the aggregates every report, category breakdown and loop score are computed from.

:func:`summarize` turns one run's traces into a :class:`RunSummary`. Accuracy is judge-correct
over *graded* questions: grader errors and failed runs are excluded from the denominator and
reported as counts (case J3). :func:`wilson_interval` gives the 95% interval of a proportion.

**Adversarial (abstention) questions** — LoCoMo's category 5, where the conversation never says
and the right answer is to say so (``Trace.category`` ``adversarial`` or ``5``) — are scored
apart, as LoCoMo's authors and the published memory-system evaluations do: by default
(``include_adversarial=False``) every headline field (counts, accuracy and its interval, EM, F1,
tokens, failure kinds …) is computed over the other questions only, and the adversarial ones
are reported in the ``abstention_*`` fields (how many, how many graded, how many abstained
correctly). ``include_adversarial=True`` (``grading.include_adversarial``) puts them in the
headline as ordinary questions; the ``abstention_*`` fields are filled either way.
Reports (:mod:`kitune.evaluation.report`) and the per-category breakdown
(:mod:`kitune.evaluation.categories`) both build on this module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from kitune.evaluation.failures import count_failure_kinds
from kitune.evaluation.metrics import Trace

__all__ = [
    "ADVERSARIAL_CATEGORIES",
    "GRADER_ERROR_THRESHOLD",
    "RunSummary",
    "is_adversarial",
    "summarize",
    "wilson_interval",
]

ADVERSARIAL_CATEGORIES = frozenset({"adversarial", "5"})
"""``Trace.category`` values of abstention questions (LoCoMo category 5, by name or number)."""


def is_adversarial(trace: Trace) -> bool:
    """True for an adversarial (abstention) question's trace (:data:`ADVERSARIAL_CATEGORIES`)."""
    return trace.category.strip().lower() in ADVERSARIAL_CATEGORIES


GRADER_ERROR_THRESHOLD = 0.05
"""Above this share of grader errors a run is marked incomplete."""


def wilson_interval(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for ``k`` successes in ``n`` trials (95% by default).

    Returns:
        ``(low, high)`` in 0.0–1.0 with ``low <= k / n <= high`` exactly (float noise such as
        ``5.55e-17`` above the point at ``k = 0`` or ``0.9999999999999999`` at ``k = n`` is
        clamped, so an error bar drawn from it never has a negative length); ``low`` is exactly
        0.0 when ``k == 0`` and ``high`` exactly 1.0 when ``k == n``; ``(0.0, 0.0)`` when
        ``n == 0``.

    Raises:
        ValueError: ``k`` outside 0..``n``.
    """
    if n <= 0:
        return 0.0, 0.0
    if not 0 <= k <= n:
        raise ValueError(f"wilson_interval: k={k} successes must lie in 0..n={n}")
    p = k / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if k == 0 else min(p, max(0.0, center - half))
    high = 1.0 if k == n else max(p, min(1.0, center + half))
    return low, high


@dataclass(frozen=True)
class RunSummary:
    """Aggregates over one run's traces."""

    name: str
    n_total: int
    n_graded: int
    n_grader_errors: int
    n_failed: int
    """Questions whose run raised or ended in status ``failed``."""
    n_correct: int
    accuracy: float | None
    """n_correct / n_graded, None when nothing was graded."""
    ci_low: float
    ci_high: float
    """95% Wilson interval of ``accuracy``."""
    em: float
    """Mean exact match over all questions, 0.0–1.0."""
    f1: float
    """Mean token F1 over all questions."""
    input_tokens: int
    input_tokens_per_question: float
    output_tokens: int
    tool_input_tokens: int
    """LLM input tokens spent inside tools (query rewrites); the plot adds them to the agent's."""
    timeouts: int
    """Questions whose budget ran out before an answer."""
    force_committed: int
    force_commit_rescues: int
    """Force-committed and judged correct."""
    context_overflows: int
    evidence_recall: float | None
    """Mean over questions that have evidence docs."""
    search_calls: int
    tool_calls: int
    repeated_call_blocked: int
    wall_time_s: float
    """Sum of per-question wall times (not the run's elapsed time when concurrent)."""
    incomplete: bool
    """Grader-error share above 5%."""
    failure_kinds: dict[str, int] = field(default_factory=dict)
    """Failure kind → count (every kind of :data:`~kitune.evaluation.failures.FAILURE_KINDS`,
    0 when absent), by :func:`~kitune.evaluation.failures.classify_failure`'s rules."""
    input_split_per_question: dict[str, float] = field(default_factory=dict)
    """Mean agent input tokens per question by component (``system``, ``question``,
    ``observation:<tool>``, ``feedback``, ``history``, ``force_commit``), over the traces that
    carry the split (:attr:`kitune.evaluation.trace.Trace.input_split`); empty when none does."""
    data_sha256: str = ""
    """SHA-256 of the dataset files the run read (:func:`kitune.data.checksum.dataset_checksum`);
    empty when not known (a summary rebuilt from traces alone)."""
    abstention_total: int = 0
    """Adversarial (abstention) questions in the run (:func:`is_adversarial`)."""
    abstention_graded: int = 0
    """Of those, graded (grader errors and failed runs excluded, as for ``n_graded``)."""
    abstention_correct: int = 0
    """Of those, graded correct: the answer abstained ("not mentioned in the conversation")."""
    abstention_accuracy: float | None = None
    """``abstention_correct / abstention_graded``; None when none was graded."""
    adversarial_in_headline: bool = False
    """True when the adversarial questions are also counted in the headline fields."""

    def to_dict(self) -> dict[str, object]:
        """JSON-able dict."""
        return asdict(self)


def summarize(
    traces: Sequence[Trace],
    name: str = "run",
    *,
    data_sha256: str = "",
    include_adversarial: bool = False,
) -> RunSummary:
    """Aggregate traces into a :class:`RunSummary` (see its field docs for definitions).

    Args:
        traces: one run's traces.
        name: the summary's name.
        data_sha256: recorded as given (the dataset checksum of the run).
        include_adversarial: count adversarial (abstention) questions in the headline fields
            too; False (default): they are only in the ``abstention_*`` fields (module docstring).
    """
    adversarial = [t for t in traces if is_adversarial(t)]
    abstention_graded = [t for t in adversarial if t.is_graded]
    abstention_correct = sum(1 for t in abstention_graded if t.judge_correct)
    if not include_adversarial:
        traces = [t for t in traces if not is_adversarial(t)]
    n = len(traces)
    graded = [t for t in traces if t.is_graded]
    correct = sum(1 for t in graded if t.judge_correct)
    grader_errors = sum(1 for t in traces if t.judge_status == "grader_error")
    low, high = wilson_interval(correct, len(graded))
    recalls = [t.evidence_recall for t in traces if t.evidence_recall is not None]
    in_tok = sum(t.input_tokens for t in traces)
    split = [t.input_split for t in traces if t.input_split]
    per_component: dict[str, float] = {}
    for one in split:
        for k, v in one.items():
            per_component[k] = per_component.get(k, 0.0) + v / len(split)
    return RunSummary(
        name=name,
        n_total=n,
        n_graded=len(graded),
        n_grader_errors=grader_errors,
        n_failed=sum(1 for t in traces if t.status == "failed"),
        n_correct=correct,
        accuracy=correct / len(graded) if graded else None,
        ci_low=low,
        ci_high=high,
        em=sum(t.em for t in traces) / n if n else 0.0,
        f1=sum(t.f1 for t in traces) / n if n else 0.0,
        input_tokens=in_tok,
        input_tokens_per_question=in_tok / n if n else 0.0,
        output_tokens=sum(t.output_tokens for t in traces),
        tool_input_tokens=sum(t.tool_input_tokens for t in traces),
        timeouts=sum(1 for t in traces if t.timed_out),
        force_committed=sum(1 for t in traces if t.force_committed),
        force_commit_rescues=sum(1 for t in traces if t.force_committed and t.judge_correct is True),
        context_overflows=sum(1 for t in traces if t.status == "context_overflow"),
        evidence_recall=sum(recalls) / len(recalls) if recalls else None,
        search_calls=sum(t.tool_calls.get("search", 0) for t in traces),
        tool_calls=sum(sum(t.tool_calls.values()) for t in traces),
        repeated_call_blocked=sum(t.repeated_call_blocked for t in traces),
        wall_time_s=sum(t.wall_time_s for t in traces),
        incomplete=bool(n) and grader_errors / n > GRADER_ERROR_THRESHOLD,
        failure_kinds=count_failure_kinds(traces),
        input_split_per_question=dict(sorted(per_component.items())),
        data_sha256=data_sha256,
        abstention_total=len(adversarial),
        abstention_graded=len(abstention_graded),
        abstention_correct=abstention_correct,
        abstention_accuracy=abstention_correct / len(abstention_graded) if abstention_graded else None,
        adversarial_in_headline=include_adversarial and bool(adversarial),
    )
