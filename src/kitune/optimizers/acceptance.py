"""Accept on evidence: a paired comparison of two settings on the same validation questions.

The loop evaluates the current setting and the proposal on the *same* validation questions, on
the *same* KI store state. :func:`compare_paired` pairs the two runs question by question
(questions that failed — LLM calls that did not go through — in either run are left out of the
pairs and counted) and reports:

* flips — questions fixed (wrong → right) and broken (right → wrong);
* the accuracy difference with a 95% paired-bootstrap interval (``resamples`` resamples of the
  paired questions drawn with ``random.Random(seed)``: same inputs and seed ⇒ same interval);
* the exact two-sided McNemar p-value on the discordant pairs (binomial, p = 0.5);
* the token ratio (candidate / current mean input tokens per paired question) and the
  timeout-rate difference;
* the paired score difference — :func:`~kitune.optimizers.objective.loop_score` of the
  candidate with the current run as its reference (accuracy difference − token log-ratio −
  timeout-rate difference).

**Accept rule** (:func:`decide` owns all of it), checked in this order:

1. *undecided* (keep the current setting, decide nothing) when either validation run has more
   than ``max_failed_share`` of its questions failed, or the tuning run has — an outage must not
   read as a worse prompt;
2. *rejected* when the proposal changes nothing, or did not pass its sanity checks;
3. when the proposal changes only *write-only* programs (their instruction changes what is
   written to the KI store, never what an evaluation reads, so the validation runs are the same
   run): *accepted* when every changed program's own task metric improved
   (``<program>_best_score`` > ``<program>_baseline_score`` in the improve step's metrics), else
   *rejected*;
4. *accepted* when the paired score difference is more than ``margin`` **and** the proposal
   broke no more questions than it fixed **and**, with ``require_significance``, the bootstrap
   interval of the accuracy difference lies above 0;
5. otherwise *rejected*.

**The stage rule** (issue 36; ``optimize.decision_rule: stage``, the default in the loop):
:func:`decide_stage` keeps rules 1–2, replaces rule 3 by "kept the incumbent: no stage metric
on validation" for every changed write-only program (:data:`NO_STAGE_METRIC`: its task metric was
scored on the tuning failures it was optimised on, not a test), and rules 4–5 by one test per
change on the program's own per-question stage values on validation (:data:`STAGE_METRICS`;
:func:`paired_test`: exact sign test for 0/1 values, sign-flip permutation test otherwise), decided by
:func:`decide_change` — accepted (effect ≥ ``min_effect``, ``p ≤ alpha / tests in the round``,
end to end non-inferior), rejected (worse), or kept the incumbent: not enough evidence.
:func:`decide_round` keeps at most the best of k proposals tested on the same questions. A KI
batch (feedback KIs, a KI change in the review queue) is decided by :func:`decide_noninferior`:
shown not worse by a margin (:func:`noninferiority_test`, :func:`batch_tests`), one more of the
round's tests (:func:`round_tests`).
``docs/loop-stages.md`` ("The decision rule") has the whole rule, the power formula
(:mod:`kitune.optimizers.power`) and the measured false-accept rates.

**Sanity checks** (:func:`check_instruction`), run on every instruction a proposal changes
*before* it is evaluated, so a degenerate proposal costs no agent run: at least
``MIN_INSTRUCTION_CHARS`` characters (a short instruction may be a good one: GEPA's proposals
are often terse), the program's task still stated (one of its
:attr:`~kitune.optimizers.program_task.ProgramTask.task_words`), and not cut off: it does not end
on an opening bracket or on ``, ; :``, and outside double quotes it opens no more ``( [ {`` than
it closes (a reflection reply cut short: ``experiments/loop-dev-48`` accepted a rewriter
instruction that ended in "with the unknown left open (", losing its last two rules). The output
format is not checked here: it comes from each program's typed signature, which no instruction can remove.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from kitune.evaluation.failures import is_correct
from kitune.optimizers.feedback import count_flips
from kitune.optimizers.objective import LoopWeights, RunStats, loop_score
from kitune.optimizers.program_task import PROGRAM_TASKS, get_program_task

if TYPE_CHECKING:
    from kitune.evaluation.trace import Trace

__all__ = [
    "BATCH_METRIC",
    "FEEDBACK_BATCH",
    "KI_BATCHES_NOTE",
    "NO_STAGE_METRIC",
    "STAGE_METRICS",
    "ChangeDecision",
    "Decision",
    "DecisionRuleName",
    "KIBatch",
    "PairedComparison",
    "PairedTest",
    "batch_tests",
    "binomial_cdf",
    "check_instruction",
    "compare_paired",
    "cut_off",
    "decide",
    "decide_change",
    "decide_noninferior",
    "decide_round",
    "decide_stage",
    "mcnemar_exact_p",
    "noninferiority_test",
    "paired_test",
    "round_tests",
    "sign_test_p",
    "trace_values",
]


MIN_INSTRUCTION_CHARS = 40
"""A proposed instruction shorter than this is degenerate (GEPA once proposed "ok")."""

_CUT_OFF_ENDINGS = frozenset("([{,;:")
"""Last characters that leave a sentence unfinished (see :func:`check_instruction`)."""

_QUOTED = re.compile(r'"[^"\n]*"')
"""A double-quoted span on one line, left out of the bracket count."""


def check_instruction(program: str, current: str, proposed: str) -> list[str]:
    """Problems with a proposed instruction (empty list: it passes).

    Args:
        program: a registered program (its task's ``task_words`` are checked); unregistered
            names get only the length and cut-off checks.
        current: the instruction in use (kept for checks relative to it; unused by the current rules).
        proposed: the proposal.

    Returns:
        Human-readable problems, e.g. ``"too short: 2 characters (minimum 40)"`` or
        ``"cut off: ends on '(' (an unfinished sentence)"``.
    """
    problems: list[str] = []
    text = proposed.strip()
    floor = MIN_INSTRUCTION_CHARS
    if len(text) < floor:
        problems.append(f"too short: {len(text)} characters (minimum {floor})")
    words = get_program_task(program).task_words if program in PROGRAM_TASKS else ()
    if words and not any(w in text.lower() for w in words):
        problems.append(f"no longer states the task (none of: {', '.join(words)})")
    cut = cut_off(text)
    if cut:
        problems.append(cut)
    return problems


def cut_off(text: str) -> str | None:
    """Why ``text`` looks cut off mid-sentence, or None when it does not.

    Cut off: the stripped text ends on an opening bracket or on ``, ; :``, or, outside
    double-quoted spans, it opens more ``(``, ``[`` or ``{`` than it closes. Used by
    :func:`check_instruction` and by GEPA's instruction proposer
    (:class:`~kitune.optimizers.gepa.SizedInstructionProposer`), which counts such a reflection
    reply as unusable instead of spending metric calls on it.

    Args:
        text: an instruction, any length (empty: not cut off).

    Returns:
        E.g. ``"cut off: ends on '(' (an unfinished sentence)"``, ``"cut off: 2 '(' but 1 ')'
        outside quotes"``; None when the text looks finished.
    """
    text = text.strip()
    if text and text[-1] in _CUT_OFF_ENDINGS:
        return f"cut off: ends on {text[-1]!r} (an unfinished sentence)"
    unquoted = _QUOTED.sub("", text)  # quoted look-ups (rewriter feedback) may hold any bracket
    for opening, closing in ("()", "[]", "{}"):
        opened, closed = unquoted.count(opening), unquoted.count(closing)
        if opened > closed:
            return f"cut off: {opened} {opening!r} but {closed} {closing!r} outside quotes"
    return None


@dataclass(frozen=True)
class PairedComparison:
    """Current vs candidate on the same questions (see the module docstring)."""

    n_pairs: int
    """Questions answered (not failed) in both runs."""
    fixed: tuple[str, ...]
    """Wrong in the current run, right in the candidate's."""
    broken: tuple[str, ...]
    """Right in the current run, wrong in the candidate's."""
    current_accuracy: float
    candidate_accuracy: float
    accuracy_diff: float
    """Candidate − current accuracy over the pairs, −1.0–1.0."""
    ci_low: float
    ci_high: float
    """95% paired-bootstrap interval of ``accuracy_diff``."""
    mcnemar_p: float
    """Exact two-sided McNemar p-value (1.0 with no discordant pair)."""
    token_ratio: float
    """Candidate / current mean input tokens per paired question (1.0 when both are 0)."""
    timeout_rate_diff: float
    score_diff: float
    """Candidate's loop score with the current run as reference."""
    current_failed_share: float
    candidate_failed_share: float
    """Share of each run's questions that failed (not graded), 0.0–1.0."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (question-id tuples as lists, so it equals its own JSON round trip)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def to_metrics(self, prefix: str = "paired_") -> dict[str, float]:
        """Flat float metrics for tracking."""
        return {
            f"{prefix}n": float(self.n_pairs),
            f"{prefix}fixed": float(len(self.fixed)),
            f"{prefix}broken": float(len(self.broken)),
            f"{prefix}accuracy_diff": self.accuracy_diff,
            f"{prefix}ci_low": self.ci_low,
            f"{prefix}ci_high": self.ci_high,
            f"{prefix}mcnemar_p": self.mcnemar_p,
            f"{prefix}token_ratio": self.token_ratio,
            f"{prefix}score_diff": self.score_diff,
        }


@dataclass(frozen=True)
class Decision:
    """What the loop does with a proposal."""

    outcome: Literal["accepted", "rejected", "undecided", "not_enough_evidence"]
    """``not_enough_evidence`` (the stage rule only): the incumbent is kept, nothing shown either way."""
    reason: str
    """One sentence with the numbers that decided it."""
    changes: tuple[ChangeDecision, ...] = ()
    """The stage rule's verdict on each change of the proposal (empty under the permissive rule)."""

    @property
    def accepted(self) -> bool:
        """True only for ``accepted``."""
        return self.outcome == "accepted"


def mcnemar_exact_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value for ``b`` and ``c`` discordant pairs (binomial test, p = 0.5).

    Computed in exact integer arithmetic and divided once with Python's correctly rounded
    ``int / int`` true division, so it never overflows (``float(2**n)`` did from n = 1,024).

    Returns:
        0.0–1.0; 1.0 when ``b + c == 0``.
    """
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    twice_tail = 2 * sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, twice_tail / (1 << n))


def _stats(traces: Sequence[Trace]) -> RunStats:
    n = len(traces)
    if n == 0:
        return RunStats(0.0, 0.0, 0.0, 0)
    correct = sum(is_correct(t) for t in traces)
    tokens = sum(t.input_tokens + t.tool_input_tokens for t in traces) / n
    return RunStats(correct / n, tokens, sum(t.timed_out for t in traces) / n, n)


def compare_paired(
    current: Sequence[Trace],
    candidate: Sequence[Trace],
    weights: LoopWeights | None = None,
    *,
    seed: int = 0,
    resamples: int = 2000,
) -> PairedComparison:
    """Pair two runs by query id and compare them (see the module docstring).

    Args:
        current: the current setting's traces.
        candidate: the proposal's traces on the same questions.
        weights: loop-score weights.
        seed: seeds the bootstrap (``random.Random(seed)``).
        resamples: bootstrap resamples, ≥ 1.

    Returns:
        The :class:`PairedComparison`; with no pairs every difference is 0 and the interval (0, 0).
    """
    cur = {t.query_id: t for t in current}
    cand = {t.query_id: t for t in candidate}
    ids = [q for q in cur if q in cand and cur[q].status != "failed" and cand[q].status != "failed"]
    a = [cur[q] for q in ids]
    b = [cand[q] for q in ids]
    flips = count_flips(a, b)  # the pairs only: both runs' traces of the same questions
    fixed, broken = flips.fixed, flips.newly_wrong
    sa, sb = _stats(a), _stats(b)
    diffs = [float(is_correct(y)) - float(is_correct(x)) for x, y in zip(a, b, strict=True)]
    lo = hi = 0.0
    if diffs:
        rng = random.Random(seed)
        n = len(diffs)
        boots = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(max(resamples, 1)))
        lo = boots[int(0.025 * (len(boots) - 1))]
        top = len(boots) - 1
        hi = boots[math.ceil(0.975 * top)]
    ratio = (sb.tokens_per_question / sa.tokens_per_question) if sa.tokens_per_question else 1.0
    return PairedComparison(
        n_pairs=len(ids),
        fixed=fixed,
        broken=broken,
        current_accuracy=sa.accuracy,
        candidate_accuracy=sb.accuracy,
        accuracy_diff=sb.accuracy - sa.accuracy,
        ci_low=lo,
        ci_high=hi,
        mcnemar_p=mcnemar_exact_p(len(fixed), len(broken)),
        token_ratio=ratio,
        timeout_rate_diff=sb.timeout_rate - sa.timeout_rate,
        score_diff=loop_score(sb, sa, weights) if ids else 0.0,
        current_failed_share=_failed_share(current),
        candidate_failed_share=_failed_share(candidate),
    )


def _failed_share(traces: Sequence[Trace]) -> float:
    return sum(t.status == "failed" for t in traces) / len(traces) if traces else 0.0


def decide(
    comparison: PairedComparison,
    *,
    changed_programs: Sequence[str] = (),
    knobs_changed: bool = False,
    store_changed: bool = False,
    reads_changed: bool = True,
    task_metrics: Mapping[str, float] | None = None,
    sanity_problems: Sequence[str] = (),
    margin: float = 0.0,
    max_failed_share: float = 0.2,
    require_significance: bool = False,
    tune_failed_share: float = 0.0,
) -> Decision:
    """Apply the whole accept rule of the module docstring.

    Args:
        comparison: from :func:`compare_paired` (current vs candidate on validation).
        changed_programs: programs whose instruction the proposal changes.
        knobs_changed: the proposal changes a knob.
        store_changed: the proposal changes the KI store an evaluation reads (a reviewed KI added,
            edited or retired) — judged on validation like a knob.
        reads_changed: the proposal changes something an evaluation reads (a knob, or a program
            that is not write-only); False with ``changed_programs`` means only write-only
            programs changed (rule 3).
        task_metrics: the improve step's metrics (``<program>_best_score`` /
            ``<program>_baseline_score`` decide rule 3).
        sanity_problems: why the proposal failed its sanity checks (empty: it passed).
        margin: the paired score difference must exceed this (≥ 0).
        max_failed_share: above this share of failed questions in any run, decide nothing.
        require_significance: also require the bootstrap interval's low end above 0.
        tune_failed_share: share of the tuning run's questions that failed, 0.0–1.0.

    Returns:
        The :class:`Decision` with a reason that quotes the numbers.
    """
    c = comparison
    early = _precheck(
        c,
        changed_programs=changed_programs,
        knobs_changed=knobs_changed,
        store_changed=store_changed,
        reads_changed=reads_changed,
        task_metrics=task_metrics,
        sanity_problems=sanity_problems,
        max_failed_share=max_failed_share,
        tune_failed_share=tune_failed_share,
    )
    if early is not None:
        return early
    numbers = (
        f"score {c.score_diff:+.3f} (margin {margin}), accuracy {c.accuracy_diff:+.2f} "
        f"[95% CI {c.ci_low:+.2f}, {c.ci_high:+.2f}], fixed {len(c.fixed)} / broken {len(c.broken)}, "
        f"McNemar p={c.mcnemar_p:.2f}, tokens ×{c.token_ratio:.2f}, n={c.n_pairs}"
    )
    if c.score_diff <= margin:
        return Decision("rejected", f"not better: {numbers}")
    if len(c.broken) > len(c.fixed):
        return Decision("rejected", f"breaks more questions than it fixes: {numbers}")
    if require_significance and c.ci_low <= 0:
        return Decision("rejected", f"not significant: {numbers}")
    return Decision("accepted", numbers)


def _precheck(
    c: PairedComparison,
    *,
    changed_programs: Sequence[str],
    knobs_changed: bool,
    store_changed: bool,
    reads_changed: bool,
    task_metrics: Mapping[str, float] | None,
    sanity_problems: Sequence[str],
    max_failed_share: float,
    tune_failed_share: float,
) -> Decision | None:
    """Rules 1–3 of the module docstring, shared by both rules; None: the paired rule decides."""
    worst = max(c.current_failed_share, c.candidate_failed_share)
    if worst > max_failed_share:
        return Decision(
            "undecided",
            f"{worst:.0%} of the validation questions failed (LLM calls did not go through; limit "
            f"{max_failed_share:.0%}): no decision on this run",
        )
    if tune_failed_share > max_failed_share:
        return Decision(
            "undecided",
            f"{tune_failed_share:.0%} of the tuning questions failed (limit {max_failed_share:.0%}): "
            "no decision on this run",
        )
    if not changed_programs and not knobs_changed and not store_changed:
        return Decision("rejected", "the proposal changes nothing")
    if sanity_problems:
        return Decision("rejected", "failed sanity checks: " + "; ".join(sanity_problems))
    if changed_programs and not reads_changed:
        return _decide_write_only(changed_programs, task_metrics or {})
    return None


def _decide_write_only(changed: Sequence[str], metrics: Mapping[str, float]) -> Decision:
    """Rule 3: accept a change to write-only programs when each one's own task metric improved."""
    gains = {p: (metrics.get(f"{p}_best_score"), metrics.get(f"{p}_baseline_score")) for p in changed}
    text = ", ".join(f"{p} {b} → {a}" for p, (a, b) in gains.items())
    if all(a is not None and b is not None and a > b for a, b in gains.values()):
        return Decision("accepted", f"task metric improved ({text}); validation reads no change")
    return Decision("rejected", f"task metric not improved ({text}); validation reads no change")


# -- the stage rule (issue 36): a paired test on the program's own stage metric ----------------

DecisionRuleName = Literal["stage", "permissive"]
"""``stage``: :func:`decide_change` on each change's stage metric (the default); ``permissive``:
:func:`decide`, the old rule (any paired end-to-end score gain; no test), kept by configuration."""

ChangeOutcome = Literal["accepted", "rejected", "not_enough_evidence", "undecided"]

STAGE_METRICS: dict[str, str] = {
    "extractor": "extractor_answer_coverage",
    "rewriter": "rewriter_mrr",
}
"""Program → the per-question stage value it is decided on (keys of
:attr:`kitune.evaluation.stage_metrics.StageReport.per_question`): the extractor on answer
coverage (0/1 per question), the rewriter on the reciprocal rank of the first gold KI (0–1)."""

_EXACT_SIGN_FLIPS = 16
"""Up to this many non-zero differences the permutation test enumerates every sign pattern."""


@dataclass(frozen=True)
class PairedTest:
    """A one-sided paired test of candidate vs incumbent on per-question values.

    0/1 values (every value 0 or 1): the exact sign test on the discordant questions (McNemar's
    exact test, one-sided). Other values: the paired sign-flip permutation test of the mean
    difference (exact up to 16 non-zero differences, else ``resamples`` seeded random flips,
    ``p = (1 + hits) / (1 + resamples)``). The interval is the paired bootstrap's two-sided
    ``1 − 2α`` percentile interval of the mean difference, so its low end is the one-sided
    ``1 − α`` lower bound the test's ``α`` goes with.
    """

    metric: str
    """What was compared (``rewriter_mrr``, ``end_to_end_accuracy`` …)."""
    method: Literal["sign", "permutation", "none"]
    """``sign`` (0/1 values), ``permutation`` (others), ``none`` (no pairs)."""
    n: int
    """Paired questions."""
    current: float
    candidate: float
    """Mean value per question of each side (0.0 with no pairs)."""
    effect: float
    """Mean difference candidate − incumbent."""
    ci_low: float
    ci_high: float
    """Two-sided ``1 − 2·alpha`` paired-bootstrap interval of :attr:`effect`."""
    p_better: float
    """One-sided p-value of "the candidate is better" (1.0 with no pairs)."""
    p_worse: float
    """One-sided p-value of "the candidate is worse"."""
    better: int
    """Questions on which the candidate's value is higher."""
    worse: int
    """Questions on which it is lower."""
    alpha: float
    """The one-sided level the interval was computed at."""
    margin: float | None = None
    """Set for a non-inferiority test (:func:`noninferiority_test`): the hypothesis is "candidate −
    incumbent > −margin"; None: a superiority test ("candidate better")."""
    p_noninferior: float | None = None
    """One-sided p-value of "not worse by ``margin`` or more" (non-inferiority tests only)."""

    @property
    def p_decision(self) -> float:
        """The p-value the decision compares with its level.

        :attr:`p_noninferior` for a non-inferiority test, else :attr:`p_better`.
        """
        return self.p_noninferior if self.p_noninferior is not None else self.p_better

    def net(self) -> str:
        """``+1/24`` for 0/1 values (better − worse over n), else ``+0.042`` (the mean difference)."""
        if self.method == "sign":
            return f"{self.better - self.worse:+d}/{self.n}"
        return f"{self.effect:+.3f}"

    def summary(self) -> str:
        """One line with the numbers.

        E.g. ``rewriter_mrr +0.176 (0.428 → 0.604), n=24, better 9 / worse 2, 90.0% CI [+0.020,
        +0.330], p=0.03 (permutation)``.
        """
        level = 1.0 - 2.0 * self.alpha
        p = (
            f"p={_p(self.p_better)} ({self.method})"
            if self.p_noninferior is None
            else f"p non-inferior={_p(self.p_noninferior)} (lowers < {self.margin:.0%}, binomial)"
        )
        return (
            f"{self.metric} {self.net()} ({self.current:.3f} → {self.candidate:.3f}), n={self.n}, "
            f"better {self.better} / worse {self.worse}, "
            f"{level:.1%} CI [{self.ci_low:+.3f}, {self.ci_high:+.3f}], {p}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return asdict(self)


def _p(p: float) -> str:
    return f"{p:.2g}" if p < 0.01 else f"{p:.2f}"


def sign_test_p(better: int, worse: int) -> float:
    """One-sided exact sign test: ``P(X ≥ better)`` for ``X ~ Binomial(better + worse, 1/2)``.

    Exact integer arithmetic (no overflow at any n). 1.0 when ``better + worse == 0``.
    """
    if better < 0 or worse < 0:
        raise ValueError(f"better={better}, worse={worse}: counts must be ≥ 0")
    n = better + worse
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(better, n + 1))
    return min(1.0, tail / (1 << n))


def _permutation_p(diffs: np.ndarray, *, resamples: int, rng: np.random.Generator) -> tuple[float, float]:
    """One-sided sign-flip p-values (better, worse) of the mean of ``diffs``."""
    nz = diffs[diffs != 0.0]
    k = int(nz.size)
    if k == 0:
        return 1.0, 1.0
    observed = float(nz.sum())
    tol = 1e-12 * max(1.0, float(np.abs(nz).sum()))
    if k <= _EXACT_SIGN_FLIPS:
        codes = np.arange(1 << k, dtype=np.int64)[:, None]
        signs = 1 - 2 * ((codes >> np.arange(k, dtype=np.int64)) & 1)
        sums = signs @ np.abs(nz)
        total = float(sums.size)
        return float((sums >= observed - tol).sum()) / total, float((sums <= observed + tol).sum()) / total
    signs = rng.choice(np.array([-1.0, 1.0]), size=(resamples, k))
    sums = signs @ np.abs(nz)
    hi = float((sums >= observed - tol).sum())
    lo = float((sums <= observed + tol).sum())
    return (1.0 + hi) / (1.0 + resamples), (1.0 + lo) / (1.0 + resamples)


def paired_test(
    current: Mapping[str, float],
    candidate: Mapping[str, float],
    *,
    metric: str,
    alpha: float = 0.05,
    seed: int = 0,
    resamples: int = 4000,
) -> PairedTest:
    """Test "candidate better than incumbent" on the questions both have a value for.

    Args:
        current: question id → the incumbent's value (0/1 or a score such as a reciprocal rank).
        candidate: question id → the candidate's value on the same questions; ids missing on
            either side are left out of the pairs.
        metric: name recorded with the result.
        alpha: one-sided level of the reported interval, 0 < alpha < 0.5.
        seed: seeds the bootstrap and, above 16 non-zero differences, the permutation draws.
        resamples: bootstrap resamples and random sign flips, ≥ 100.

    Returns:
        The :class:`PairedTest` (see its docstring for the methods). Same inputs and seed ⇒ same result.

    Raises:
        ValueError: ``alpha`` or ``resamples`` out of range.
    """
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha={alpha}: use a one-sided level between 0 and 0.5 (e.g. 0.05)")
    if resamples < 100:
        raise ValueError(f"resamples={resamples}: use at least 100")
    ids = [q for q in current if q in candidate]
    if not ids:
        return PairedTest(metric, "none", 0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0, 0, alpha)
    a = np.array([float(current[q]) for q in ids])
    b = np.array([float(candidate[q]) for q in ids])
    d = b - a
    better, worse = int((d > 0).sum()), int((d < 0).sum())
    rng = np.random.default_rng(seed)
    binary = bool(np.isin(a, (0.0, 1.0)).all() and np.isin(b, (0.0, 1.0)).all())
    if binary:
        method: Literal["sign", "permutation", "none"] = "sign"
        p_better, p_worse = sign_test_p(better, worse), sign_test_p(worse, better)
    else:
        method = "permutation"
        p_better, p_worse = _permutation_p(d, resamples=resamples, rng=rng)
    n = len(ids)
    boots = d[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    lo, hi = np.quantile(boots, [alpha, 1.0 - alpha])
    return PairedTest(
        metric=metric,
        method=method,
        n=n,
        current=float(a.mean()),
        candidate=float(b.mean()),
        effect=float(d.mean()),
        ci_low=float(lo),
        ci_high=float(hi),
        p_better=p_better,
        p_worse=p_worse,
        better=better,
        worse=worse,
        alpha=alpha,
    )


def noninferiority_test(
    current: Mapping[str, float],
    candidate: Mapping[str, float],
    *,
    metric: str,
    margin: float,
    alpha: float = 0.05,
    seed: int = 0,
    resamples: int = 4000,
) -> PairedTest:
    """Test "the candidate lowers fewer than a ``margin`` share of the questions" on paired values.

    :func:`paired_test` (interval, counts, ``p_worse``) plus :attr:`PairedTest.p_noninferior`,
    the exact one-sided binomial p-value ``P(Binomial(n, margin) ≤ worse)`` of H0 "the share of
    questions whose value the candidate lowers is at least ``margin``" (``worse`` = questions with
    a lower value, ``n`` = paired questions). Exact and valid whatever the values: a value in
    0–1 that falls counts as one question lowered however far it falls, and gains are not set off
    against falls, so rejecting H0 also shows "mean difference > −margin" (each fall is at most 1).
    Conservative on purpose: the shifted sign-flip permutation test of the mean (the first
    version) accepted 7.1% of batches sitting exactly at the margin at a nominal 2.5%
    (``power.batch_round_false_accept_rate``: its ``d_i + margin`` are skewed). With nothing
    lowered ``p = (1 − margin)^n``, so it can pass only from ``n ≥ log(α') / log(1 − margin)``
    questions (35 at α' 0.025 and margin 0.1); ``margin = 0`` shows nothing (p = 1).

    Args:
        current: question id → the incumbent's value.
        candidate: question id → the candidate's value (ids missing on either side are left out).
        metric: name recorded with the result.
        margin: the largest share of questions the candidate may lower, 0–1.
        alpha: one-sided level of the reported interval, 0 < alpha < 0.5.
        seed: seeds the bootstrap.
        resamples: bootstrap resamples, ≥ 100.

    Returns:
        The :class:`PairedTest` with :attr:`~PairedTest.margin` and
        :attr:`~PairedTest.p_noninferior` set.

    Raises:
        ValueError: ``margin`` outside 0–1, or ``alpha``/``resamples`` out of range.
    """
    if not 0.0 <= margin <= 1.0:
        raise ValueError(f"margin={margin}: use a non-inferiority margin between 0 and 1")
    test = paired_test(current, candidate, metric=metric, alpha=alpha, seed=seed, resamples=resamples)
    return replace(test, margin=margin, p_noninferior=binomial_cdf(test.worse, test.n, margin))


def binomial_cdf(k: int, n: int, p: float) -> float:
    """``P(Binomial(n, p) ≤ k)``, exact sum of the terms (1.0 when ``k ≥ n``; ``n = 0``: 1.0).

    Raises:
        ValueError: ``n`` or ``k`` negative, or ``p`` outside 0–1.
    """
    if n < 0 or k < 0 or not 0.0 <= p <= 1.0:
        raise ValueError(f"k={k}, n={n}, p={p}: use counts ≥ 0 and a probability between 0 and 1")
    if k >= n:
        return 1.0
    return min(1.0, sum(math.comb(n, i) * p**i * (1.0 - p) ** (n - i) for i in range(k + 1)))


def trace_values(traces: Sequence[Trace]) -> dict[str, float]:
    """Query id → 1.0 right / 0.0 wrong (:func:`~kitune.evaluation.failures.is_correct`).

    Failed traces (LLM calls that did not go through) are left out, as in :func:`compare_paired`.
    """
    return {t.query_id: float(is_correct(t)) for t in traces if t.status != "failed"}


@dataclass(frozen=True)
class ChangeDecision:
    """The stage rule's verdict on one change (a program's instruction, a knob set, a KI batch)."""

    change: str
    """``rewriter``, ``extractor``, ``knobs``, ``feedback KIs`` …"""
    outcome: ChangeOutcome
    reason: str
    """One sentence with the numbers (n, effect, interval, p, the level it had to reach)."""
    test: PairedTest | None
    """The paired test on the change's stage metric (None: no test was possible)."""
    end_to_end: PairedTest | None = None
    """The end-to-end non-inferiority comparison on the questions the change was run on."""
    alpha: float = 0.05
    """The one-sided level this change had to reach (α over the round's number of tests)."""
    tests_in_round: int = 1
    """How many changes the round tested (Bonferroni's divisor)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {
            "change": self.change,
            "outcome": self.outcome,
            "reason": self.reason,
            "alpha": self.alpha,
            "tests_in_round": self.tests_in_round,
            "test": self.test.to_dict() if self.test else None,
            "end_to_end": self.end_to_end.to_dict() if self.end_to_end else None,
        }

    def to_metrics(self) -> dict[str, float]:
        """Flat floats for tracking: ``decision_<change>_{n,effect,ci_low,ci_high,p,accepted,…}``."""
        key = "decision_" + re.sub(r"[^a-z0-9]+", "_", self.change.lower()).strip("_")
        out = {
            f"{key}_accepted": float(self.outcome == "accepted"),
            f"{key}_not_enough_evidence": float(self.outcome == "not_enough_evidence"),
            f"{key}_alpha": self.alpha,
        }
        for prefix, t in ((key, self.test), (f"{key}_e2e", self.end_to_end)):
            if t is not None:
                out |= {
                    f"{prefix}_n": float(t.n),
                    f"{prefix}_effect": t.effect,
                    f"{prefix}_ci_low": t.ci_low,
                    f"{prefix}_ci_high": t.ci_high,
                    f"{prefix}_p": t.p_decision,
                    f"{prefix}_p_worse": t.p_worse,
                }
        return out


def _end_to_end_note(end_to_end: PairedTest | None) -> str:
    """The reason's end-to-end suffix: its summary, a no-pairs note, or "" when not checked."""
    if end_to_end is None:
        return ""
    return f"; end to end {end_to_end.summary()}" if end_to_end.n else "; no end-to-end pairs (not checked)"


def decide_change(
    change: str,
    test: PairedTest,
    *,
    alpha: float = 0.05,
    min_effect: float = 0.02,
    tests_in_round: int = 1,
    end_to_end: PairedTest | None = None,
    noninferiority_margin: float = 0.10,
) -> ChangeDecision:
    """The stage rule for one change (see ``docs/loop-stages.md``, "The decision rule").

    In order:

    1. **rejected (worse)** when the stage test shows the candidate worse: ``p_worse ≤ alpha``
       (rejecting keeps the incumbent, so no correction is needed);
    2. **accepted** when the effect is at least ``min_effect``, ``p_better ≤ alpha /
       tests_in_round`` (Bonferroni over the changes the round tested: the chance the round
       accepts any change when none is better stays ≤ ``alpha``) and the end-to-end comparison
       (when given) is non-inferior: the low end of its one-sided ``1 − alpha`` bootstrap bound
       is above ``−noninferiority_margin``. No end-to-end pairs (no question affected) passes;
    3. **rejected (worse end to end)** when the stage test passed but the end-to-end
       comparison shows the candidate worse (``p_worse ≤ alpha``);
    4. otherwise **kept the incumbent: not enough evidence**.

    Args:
        change: what changed (``rewriter`` …), for the record.
        test: :func:`paired_test` on the change's stage metric on validation.
        alpha: round-level one-sided level, 0 < alpha < 0.5.
        min_effect: smallest effect worth a change (same unit as the metric), ≥ 0.
        tests_in_round: changes tested in this round (≥ 1), the Bonferroni divisor.
        end_to_end: :func:`paired_test` of end-to-end accuracy on the affected questions; its
            interval must have been computed at ``alpha`` (None: no end-to-end check).
        noninferiority_margin: how much end-to-end accuracy may drop at the bound, 0–1.

    Returns:
        The :class:`ChangeDecision`.

    Raises:
        ValueError: a parameter out of range.
    """
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha={alpha}: use a one-sided level between 0 and 0.5 (e.g. 0.05)")
    if min_effect < 0 or not 0.0 <= noninferiority_margin <= 1.0:
        raise ValueError(
            f"min_effect={min_effect}, noninferiority_margin={noninferiority_margin}: use min_effect ≥ 0 "
            "and a margin between 0 and 1"
        )
    if tests_in_round < 1:
        raise ValueError(f"tests_in_round={tests_in_round}: a round tests at least 1 change")
    level = alpha / tests_in_round
    what = test.summary()
    e2e = _end_to_end_note(end_to_end)

    def verdict(outcome: ChangeOutcome, reason: str) -> ChangeDecision:
        return ChangeDecision(change, outcome, reason, test, end_to_end, level, tests_in_round)

    if test.n == 0:
        return verdict(
            "not_enough_evidence",
            f"kept the incumbent: not enough evidence (no paired questions on {test.metric})",
        )
    if test.p_worse <= alpha:
        return verdict("rejected", f"rejected (worse): {what} (p worse={_p(test.p_worse)} ≤ α {alpha}){e2e}")
    stage_ok = test.effect >= min_effect and test.p_better <= level
    if not stage_ok:
        need = f"needs p ≤ {level:.3g} (α {alpha} / {tests_in_round} tests) and effect ≥ {min_effect}"
        return verdict(
            "not_enough_evidence",
            f"kept the incumbent: not enough evidence ({test.net()}, p = {_p(test.p_better)}; {need}): "
            f"{what}{e2e}",
        )
    if end_to_end is not None and end_to_end.n > 0:
        if end_to_end.p_worse <= alpha:
            return verdict(
                "rejected",
                f"rejected (worse end to end, p worse={_p(end_to_end.p_worse)} ≤ α {alpha}) "
                f"although {what}{e2e}",
            )
        if end_to_end.ci_low <= -noninferiority_margin:
            return verdict(
                "not_enough_evidence",
                "kept the incumbent: not enough evidence end to end (accuracy bound "
                f"{end_to_end.ci_low:+.3f} ≤ −{noninferiority_margin}, the non-inferiority margin) "
                f"although {what}{e2e}",
            )
    return verdict("accepted", f"accepted: {what} (p ≤ {level:.3g}){e2e}")


def decide_round(
    candidates: Sequence[tuple[str, PairedTest]],
    *,
    alpha: float = 0.05,
    min_effect: float = 0.02,
    end_to_end: Mapping[str, PairedTest] | None = None,
    noninferiority_margin: float = 0.10,
) -> tuple[ChangeDecision, ...]:
    """Several proposals for one thing, each tested on the same validation questions: keep at most the best.

    The best is the one with the smallest ``p_better`` (ties: the larger effect, then the first);
    it is decided by :func:`decide_change` with ``tests_in_round = len(candidates)`` (Bonferroni:
    for keeping only the best this is also Holm's first step), so the round accepts a pure-noise
    proposal with probability ≤ ``alpha``. The others are recorded as not kept.

    Args:
        candidates: ``(name, test)`` per proposal, ≥ 1.
        alpha: round-level one-sided level.
        min_effect: as in :func:`decide_change`.
        end_to_end: name → end-to-end comparison for the non-inferiority check (optional).
        noninferiority_margin: as in :func:`decide_change`.

    Returns:
        One :class:`ChangeDecision` per candidate, in the input order; at most one ``accepted``.

    Raises:
        ValueError: no candidates.
    """
    if not candidates:
        raise ValueError("decide_round needs at least one candidate")
    k = len(candidates)
    best = min(range(k), key=lambda i: (candidates[i][1].p_better, -candidates[i][1].effect, i))
    out: list[ChangeDecision] = []
    for i, (name, test) in enumerate(candidates):
        if i == best:
            out.append(
                decide_change(
                    name,
                    test,
                    alpha=alpha,
                    min_effect=min_effect,
                    tests_in_round=k,
                    end_to_end=(end_to_end or {}).get(name),
                    noninferiority_margin=noninferiority_margin,
                )
            )
        else:
            reason = f"not kept: {candidates[best][0]} was the round's best; {test.summary()}"
            out.append(ChangeDecision(name, "not_enough_evidence", reason, test, None, alpha / k, k))
    return tuple(out)


FEEDBACK_BATCH = "feedback KIs"
"""The change name of the disambiguation improver's batch (``decision_feedback_kis_*`` metrics)."""

BATCH_METRIC = "rewriter_mrr"
"""What a KI batch is decided on: each validation question's gold reciprocal rank in the top ``k``
(the rewriter's per-question stage value, one rewrite + one look-up, no agent)."""

KI_BATCHES_NOTE = "ki_batches"
"""The :attr:`~kitune.optimizers.setting.Proposal.notes` key under which an improver hands the loop
the KI batches it kept (a list of :meth:`KIBatch.to_dict`), for the loop to decide them."""


@dataclass(frozen=True)
class KIBatch:
    """KIs an improver wrote into the store this round, with what validation measured before them.

    The loop decides the batch (:func:`decide_noninferior`) on the same validation values measured
    after the improve step and undoes it (retires its KIs) unless it is accepted.
    """

    change: str
    """What the batch is, for the record: ``feedback KIs``."""
    ki_ids: tuple[str, ...]
    """The KIs the batch keeps in the store (the gate's survivors)."""
    metric: str
    """The per-question stage value it is decided on (:attr:`StageReport.per_question` key:
    ``rewriter_mrr``, each question's gold reciprocal rank in the top ``k``)."""
    before: Mapping[str, float]
    """Validation question id → :attr:`metric` on the store before the batch was written."""
    before_e2e: Mapping[str, float]
    """Validation question id → 1.0 right / 0.0 wrong before the batch (:func:`trace_values`;
    the questions the agent ran)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (what :data:`KI_BATCHES_NOTE` holds)."""
        return {
            "change": self.change,
            "ki_ids": list(self.ki_ids),
            "metric": self.metric,
            "before": dict(self.before),
            "before_e2e": dict(self.before_e2e),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KIBatch:
        """Read :meth:`to_dict`'s output back.

        Raises:
            ValueError: a field is missing or has the wrong shape (names it).
        """
        try:
            return cls(
                change=str(data["change"]),
                ki_ids=tuple(str(k) for k in data["ki_ids"]),
                metric=str(data["metric"]),
                before={str(q): float(v) for q, v in dict(data["before"]).items()},
                before_e2e={str(q): float(v) for q, v in dict(data["before_e2e"]).items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"a KI batch record needs change, ki_ids, metric, before, before_e2e: {exc}"
            ) from exc


def batch_tests(
    before: Mapping[str, float],
    after: Mapping[str, float],
    before_e2e: Mapping[str, float],
    after_e2e: Mapping[str, float],
    *,
    metric: str = BATCH_METRIC,
    margin: float = 0.10,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[PairedTest, PairedTest | None]:
    """The two comparisons :func:`decide_noninferior` takes for a KI batch.

    The non-inferiority test on the stage values (``metric``) of the questions measured before
    and after, and the end-to-end paired test on the answers; when no question has a stage value
    on both sides (no gold document), the non-inferiority test on the answers alone (and no
    separate end-to-end check).

    Args:
        before: question id → stage value before the batch.
        after: the same after it.
        before_e2e: question id → 1.0 right / 0.0 wrong before (:func:`trace_values`).
        after_e2e: the same after.
        metric: the stage values' name.
        margin: the non-inferiority margin (``optimize.noninferiority_margin``).
        alpha: the one-sided level of the intervals.
        seed: seeds the draws.

    Returns:
        ``(stage test, end-to-end test or None)``.
    """
    if any(q in after for q in before):
        stage = noninferiority_test(before, after, metric=metric, margin=margin, alpha=alpha, seed=seed)
        e2e = paired_test(before_e2e, after_e2e, metric="end_to_end_accuracy", alpha=alpha, seed=seed)
        return stage, e2e
    answers = noninferiority_test(
        before_e2e, after_e2e, metric="end_to_end_accuracy", margin=margin, alpha=alpha, seed=seed
    )
    return answers, None


NO_STAGE_METRIC = (
    "kept the incumbent: no stage metric on validation ({program} is write-only: a validation run "
    "cannot see its instruction, and its GEPA metric was scored on the tuning failures it was "
    "optimised on, so it is not a test); tune it in a round of its own to see its GEPA numbers"
)
"""The stage rule's verdict on a changed write-only program (the disambiguator)."""


def _write_only(program: str) -> bool:
    return program in PROGRAM_TASKS and get_program_task(program).write_only


def round_tests(changed_programs: Sequence[str], knobs_changed: bool, batches: int = 0) -> int:
    """How many changes a round tests (the Bonferroni divisor shared by all of them).

    Every changed program that is not write-only (those have no test, :data:`NO_STAGE_METRIC`),
    the knobs when they changed, and every KI batch the round decides
    (feedback KIs, re-extractions) — what :func:`decide_stage` and :func:`decide_noninferior` divide
    ``alpha`` by, so the round as a whole accepts a change that is not better (or, for a batch, not
    non-inferior) with probability ≤ ``alpha``. At least 1.
    """
    tested = [p for p in changed_programs if not _write_only(p)]
    return max(1, len(tested) + int(knobs_changed) + batches)


def decide_noninferior(
    change: str,
    test: PairedTest,
    *,
    alpha: float = 0.05,
    tests_in_round: int = 1,
    end_to_end: PairedTest | None = None,
    noninferiority_margin: float = 0.10,
) -> ChangeDecision:
    """The stage rule for a KI batch (feedback KIs, a re-extraction): kept only when shown not worse.

    A batch is written to fix particular (tuning) questions; on the validation split it can only
    be required not to hurt. ``test`` is :func:`noninferiority_test` of the batch's stage metric
    on validation (the gold reciprocal rank of every validation question, before vs after the
    batch). In order:

    1. **rejected (worse)** when the stage values are significantly lower: ``p_worse ≤ alpha``;
    2. **accepted** when non-inferiority is shown at the round's level: ``p_noninferior ≤ alpha /
       tests_in_round`` (Bonferroni over everything the round tested, batches included) and the
       end-to-end comparison on the questions the agent ran before and after (when given, with
       pairs) is non-inferior — the low end of its one-sided ``1 − alpha`` bound above
       ``−noninferiority_margin``;
    3. **rejected (worse end to end)** when the stage check passed but end to end is
       significantly worse (``p_worse ≤ alpha``);
    4. otherwise **kept the incumbent: not enough evidence** (the batch is undone).

    Args:
        change: what the batch is (``feedback KIs``, ``re_extract`` …), for the record.
        test: :func:`noninferiority_test` on validation (its ``margin`` is the stage margin).
        alpha: round-level one-sided level, 0 < alpha < 0.5.
        tests_in_round: changes the round tested, batches included (≥ 1).
        end_to_end: :func:`paired_test` of end-to-end accuracy before vs after, computed at
            ``alpha`` (None or no pairs: not checked, and the reason says so).
        noninferiority_margin: how much end-to-end accuracy may drop at the bound, 0–1.

    Returns:
        The :class:`ChangeDecision` (its ``test`` carries ``p_noninferior``).

    Raises:
        ValueError: a parameter out of range, or ``test`` is not a non-inferiority test.
    """
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha={alpha}: use a one-sided level between 0 and 0.5 (e.g. 0.05)")
    if tests_in_round < 1:
        raise ValueError(f"tests_in_round={tests_in_round}: a round tests at least 1 change")
    if test.p_noninferior is None or test.margin is None:
        raise ValueError(
            f"{change}: decide_noninferior needs a noninferiority_test result (margin and p set)"
        )
    level = alpha / tests_in_round
    what = test.summary()
    e2e = _end_to_end_note(end_to_end)

    def verdict(outcome: ChangeOutcome, reason: str) -> ChangeDecision:
        return ChangeDecision(change, outcome, reason, test, end_to_end, level, tests_in_round)

    if test.n == 0:
        return verdict(
            "not_enough_evidence",
            f"kept the incumbent: not enough evidence (no paired validation questions on {test.metric})",
        )
    if test.p_worse <= alpha:
        return verdict("rejected", f"rejected (worse): {what} (p worse={_p(test.p_worse)} ≤ α {alpha}){e2e}")
    if test.p_noninferior > level:
        need = (
            f"needs p ≤ {level:.3g} (α {alpha} / {tests_in_round} tests) to show it lowers under "
            f"{test.margin:.0%} of the questions"
        )
        return verdict(
            "not_enough_evidence",
            f"kept the incumbent: not enough evidence that it is not worse ({test.net()}, "
            f"p = {_p(test.p_noninferior)}; {need}): {what}{e2e}",
        )
    if end_to_end is not None and end_to_end.n > 0:
        if end_to_end.p_worse <= alpha:
            return verdict(
                "rejected",
                f"rejected (worse end to end, p worse={_p(end_to_end.p_worse)} ≤ α {alpha}) "
                f"although {what}{e2e}",
            )
        if end_to_end.ci_low <= -noninferiority_margin:
            return verdict(
                "not_enough_evidence",
                "kept the incumbent: not enough evidence end to end (accuracy bound "
                f"{end_to_end.ci_low:+.3f} ≤ −{noninferiority_margin}, the non-inferiority margin) "
                f"although {what}{e2e}",
            )
    return verdict(
        "accepted",
        f"accepted (lowers fewer than {test.margin:.0%} of the questions): {what} (p ≤ {level:.3g}){e2e}",
    )


def decide_stage(
    comparison: PairedComparison,
    current_values: Mapping[str, Mapping[str, float]],
    candidate_values: Mapping[str, Mapping[str, float]],
    current_traces: Sequence[Trace],
    candidate_traces: Sequence[Trace],
    *,
    changed_programs: Sequence[str] = (),
    knobs_changed: bool = False,
    reads_changed: bool = True,
    task_metrics: Mapping[str, float] | None = None,
    sanity_problems: Sequence[str] = (),
    alpha: float = 0.05,
    min_effect: float = 0.02,
    noninferiority_margin: float = 0.10,
    max_failed_share: float = 0.2,
    tune_failed_share: float = 0.0,
    seed: int = 0,
    other_tests: int = 0,
) -> Decision:
    """The stage rule for a whole proposal (``optimize.decision_rule: stage``; ``docs/loop-stages.md``).

    Rules 1–3 of the module docstring first (outage ⇒ undecided; no change or failed sanity ⇒
    rejected; write-only programs ⇒ their own task metric). Then one test per change: each
    changed program with a stage metric (:data:`STAGE_METRICS`) on its per-question validation
    values, any other changed program and changed knobs on end-to-end accuracy; the round's
    tests share ``alpha`` (Bonferroni). Each change is decided by :func:`decide_change` with the
    end-to-end non-inferiority check on the paired validation traces (the questions the
    candidate was run on). The proposal is one setting: **accepted** only when every change is
    accepted, **rejected** when any change is rejected, else **not enough evidence** (the
    incumbent is kept).

    Args:
        comparison: :func:`compare_paired` of the same traces (its failed shares are checked).
        current_values: the incumbent's per-question stage values on validation
            (:attr:`~kitune.evaluation.stage_metrics.StageReport.per_question`).
        candidate_values: the candidate's, on the same questions.
        current_traces: the incumbent's validation traces (re-measured on the same store state).
        candidate_traces: the candidate's validation traces.
        changed_programs: programs whose instruction the proposal changes.
        knobs_changed: the proposal changes a knob.
        reads_changed: False when only write-only programs changed.
        task_metrics: the improve step's metrics (write-only rule).
        sanity_problems: why the proposal failed its sanity checks.
        alpha: round-level one-sided level.
        min_effect: smallest effect worth a change.
        noninferiority_margin: end-to-end margin.
        max_failed_share: outage threshold.
        tune_failed_share: the tuning run's failed share.
        seed: seeds the tests' bootstrap and permutation draws.
        other_tests: tests the round makes besides this proposal's changes (its KI batches,
            :func:`decide_noninferior`), ≥ 0: they share ``alpha`` (:func:`round_tests`).

    Returns:
        The :class:`Decision`, with :attr:`Decision.changes` holding each change's verdict.
    """
    early = _precheck(
        comparison,
        changed_programs=changed_programs,
        knobs_changed=knobs_changed,
        store_changed=False,
        reads_changed=True,  # write-only programs are handled below, not by their task metric
        task_metrics=task_metrics,
        sanity_problems=sanity_problems,
        max_failed_share=max_failed_share,
        tune_failed_share=tune_failed_share,
    )
    if early is not None:
        return early
    untested = tuple(
        ChangeDecision(p, "not_enough_evidence", NO_STAGE_METRIC.format(program=p), None, None, alpha, 1)
        for p in changed_programs
        if _write_only(p)
    )
    tested = [p for p in changed_programs if not _write_only(p)]
    if not reads_changed or (not tested and not knobs_changed):
        return Decision(
            "not_enough_evidence", "; ".join(f"{v.change}: {v.reason}" for v in untested), untested
        )
    e2e = paired_test(
        trace_values(current_traces),
        trace_values(candidate_traces),
        metric="end_to_end_accuracy",
        alpha=alpha,
        seed=seed,
    )
    changes: list[tuple[str, PairedTest, bool]] = []
    for program in changed_programs:
        if _write_only(program):
            continue
        metric = STAGE_METRICS.get(program)
        if metric is None or metric not in current_values or metric not in candidate_values:
            changes.append((program, e2e, False))
            continue
        test = paired_test(
            current_values[metric], candidate_values[metric], metric=metric, alpha=alpha, seed=seed
        )
        changes.append((program, test, True))
    if knobs_changed:
        changes.append(("knobs", e2e, False))
    m = len(changes) + max(other_tests, 0)
    verdicts = (
        tuple(
            decide_change(
                name,
                test,
                alpha=alpha,
                min_effect=min_effect,
                tests_in_round=m,
                end_to_end=e2e if staged else None,
                noninferiority_margin=noninferiority_margin,
            )
            for name, test, staged in changes
        )
        + untested
    )
    outcomes = {v.outcome for v in verdicts}
    reason = "; ".join(f"{v.change}: {v.reason}" for v in verdicts)
    if outcomes == {"accepted"}:
        return Decision("accepted", reason, verdicts)
    if "rejected" in outcomes:
        return Decision("rejected", reason, verdicts)
    return Decision("not_enough_evidence", reason, verdicts)
