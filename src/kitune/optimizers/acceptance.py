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
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from kitune.evaluation.failures import is_correct
from kitune.optimizers.feedback import count_flips
from kitune.optimizers.objective import LoopWeights, RunStats, loop_score
from kitune.optimizers.program_task import PROGRAM_TASKS, get_program_task

if TYPE_CHECKING:
    from kitune.evaluation.trace import Trace

__all__ = [
    "Decision",
    "PairedComparison",
    "check_instruction",
    "compare_paired",
    "cut_off",
    "decide",
    "mcnemar_exact_p",
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

    outcome: Literal["accepted", "rejected", "undecided"]
    reason: str
    """One sentence with the numbers that decided it."""

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


def _decide_write_only(changed: Sequence[str], metrics: Mapping[str, float]) -> Decision:
    """Rule 3: accept a change to write-only programs when each one's own task metric improved."""
    gains = {p: (metrics.get(f"{p}_best_score"), metrics.get(f"{p}_baseline_score")) for p in changed}
    text = ", ".join(f"{p} {b} → {a}" for p, (a, b) in gains.items())
    if all(a is not None and b is not None and a > b for a, b in gains.values()):
        return Decision("accepted", f"task metric improved ({text}); validation reads no change")
    return Decision("rejected", f"task metric not improved ({text}); validation reads no change")
