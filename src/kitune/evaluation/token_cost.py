"""What each run's answers cost in agent input tokens, against a reference run, with intervals.

Issue 39's question is whether pre-computed context pays for itself: fewer input tokens per
question, and per *correct* answer, than search-and-fetch. :func:`token_costs` answers it from
the traces alone, per run:

* mean input tokens per question with a 95% percentile-bootstrap interval over questions;
* input tokens per correct answer (all tokens over the correct answers: what one right answer
  costs) with the same bootstrap (resamples with no correct answer are left out and counted);
* paired against the reference run on the questions both ran: the ratio of their mean tokens
  per question with a paired bootstrap interval (< 1: this run is cheaper);
* the mean tokens per question by component (system prompt + tool schemas, question, each
  tool's observations, re-sent history, …; :data:`kitune.evaluation.agent.COMPONENTS`) over the
  traces that carry the split.

Tokens are the agent's input tokens plus the tools' own LLM input tokens (query rewrites):
what the question cost. The bootstrap is seeded (``random.Random(seed)``), so a report is
reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from kitune.evaluation.failures import is_correct
from kitune.evaluation.trace import Trace

__all__ = ["TokenCost", "token_cost_markdown", "token_costs"]


@dataclass(frozen=True)
class TokenCost:
    """One run's token cost (see the module docstring); token counts are input tokens."""

    name: str
    n: int
    """Questions in the run."""
    n_correct: int
    per_question: float
    per_question_ci: tuple[float, float]
    per_correct: float | None
    """Tokens over correct answers; None when nothing was answered correctly."""
    per_correct_ci: tuple[float, float] | None
    reference: str | None = None
    """The run compared against (None for the reference itself)."""
    n_paired: int = 0
    """Questions both runs ran."""
    ratio: float | None = None
    """Mean tokens per question of this run / the reference's, on the paired questions."""
    ratio_ci: tuple[float, float] | None = None
    components: dict[str, float] = field(default_factory=dict)
    """Component → mean tokens per question, over the ``n_split`` traces that carry the split."""
    n_split: int = 0

    def to_dict(self) -> dict[str, object]:
        """JSON-able dict."""
        return asdict(self)


def _tokens(t: Trace) -> int:
    return t.input_tokens + t.tool_input_tokens


def _interval(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    lo = values[int(0.025 * (len(values) - 1))]
    hi = values[round(0.975 * (len(values) - 1))]
    return lo, hi


def _cost(name: str, traces: Sequence[Trace], rng: random.Random, resamples: int) -> TokenCost:
    toks = [_tokens(t) for t in traces]
    ok = [is_correct(t) for t in traces]
    n, n_ok = len(toks), sum(ok)
    means, per_ok = [], []
    for _ in range(resamples if n else 0):
        idx = [rng.randrange(n) for _ in range(n)]
        means.append(sum(toks[i] for i in idx) / n)
        c = sum(ok[i] for i in idx)
        if c:
            per_ok.append(sum(toks[i] for i in idx) / c)
    split = [t.input_split for t in traces if t.input_split]
    comps: dict[str, float] = {}
    for s in split:
        for k, v in s.items():
            comps[k] = comps.get(k, 0.0) + v
    return TokenCost(
        name=name,
        n=n,
        n_correct=n_ok,
        per_question=sum(toks) / n if n else 0.0,
        per_question_ci=_interval(means) if means else (0.0, 0.0),
        per_correct=sum(toks) / n_ok if n_ok else None,
        per_correct_ci=_interval(per_ok) if per_ok else None,
        components={k: v / len(split) for k, v in sorted(comps.items())},
        n_split=len(split),
    )


def token_costs(
    runs: Mapping[str, Sequence[Trace]],
    reference: str | None = None,
    *,
    seed: int = 0,
    resamples: int = 2000,
) -> list[TokenCost]:
    """Each run's token cost, paired against ``reference`` (see the module docstring).

    Args:
        runs: run name → traces, in display order.
        reference: the run to compare against; None: a run named ``baseline`` when there is one,
            else the first run.
        seed: seeds the bootstrap.
        resamples: bootstrap resamples (>= 100).

    Returns:
        One :class:`TokenCost` per run, in ``runs`` order (the reference's own ``ratio`` is None).

    Raises:
        ValueError: ``runs`` is empty, ``reference`` names no run, or ``resamples < 100``.
    """
    if not runs:
        raise ValueError("token_costs needs at least one run")
    if resamples < 100:
        raise ValueError(f"resamples must be >= 100 for a 95% interval, got {resamples}")
    ref = reference or ("baseline" if "baseline" in runs else next(iter(runs)))
    if ref not in runs:
        raise ValueError(f"reference run {ref!r} is not one of {list(runs)}")
    rng = random.Random(seed)
    ref_tok = {t.query_id: _tokens(t) for t in runs[ref]}
    out = []
    for name, traces in runs.items():
        cost = _cost(name, traces, rng, resamples)
        if name == ref:
            out.append(cost)
            continue
        pairs = [(_tokens(t), ref_tok[t.query_id]) for t in traces if t.query_id in ref_tok]
        ratio = ratio_ci = None
        if pairs and sum(b for _, b in pairs):
            ratio = sum(a for a, _ in pairs) / sum(b for _, b in pairs)
            boot = []
            for _ in range(resamples):
                idx = [rng.randrange(len(pairs)) for _ in pairs]
                den = sum(pairs[i][1] for i in idx)
                if den:
                    boot.append(sum(pairs[i][0] for i in idx) / den)
            ratio_ci = _interval(boot) if boot else None
        out.append(
            TokenCost(
                **{
                    **cost.to_dict(),
                    "reference": ref,
                    "n_paired": len(pairs),
                    "ratio": ratio,
                    "ratio_ci": ratio_ci,
                }  # type: ignore[arg-type]
            )
        )
    return out


def _fmt(x: float | None, ci: tuple[float, float] | None) -> str:
    if x is None:
        return "–"
    return f"{x:,.0f} [{ci[0]:,.0f}, {ci[1]:,.0f}]" if ci else f"{x:,.0f}"


def token_cost_markdown(costs: Sequence[TokenCost]) -> list[str]:
    """The report section: tokens per question / per correct answer / ratio, then components."""
    if not costs:
        return []
    md = [
        "## Input tokens per question and per correct answer",
        "",
        "Agent + tool input tokens; 95% bootstrap intervals over questions (seeded). The ratio is this run's "
        "mean tokens per question over the reference run's, paired on the questions both ran.",
        "",
        "| run | questions | correct | tokens / question | tokens / correct answer | vs reference |",
        "|---|---|---|---|---|---|",
    ]
    for c in costs:
        vs = "reference"
        if c.reference is not None:
            vs = (
                f"{c.ratio:.2f} [{c.ratio_ci[0]:.2f}, {c.ratio_ci[1]:.2f}] × {c.reference} (n={c.n_paired})"
                if c.ratio is not None and c.ratio_ci is not None
                else "–"
            )
        md.append(
            f"| {c.name} | {c.n} | {c.n_correct} | {_fmt(c.per_question, c.per_question_ci)} "
            f"| {_fmt(c.per_correct, c.per_correct_ci)} | {vs} |"
        )
    names = sorted({k for c in costs for k in c.components})
    if names:
        md += [
            "",
            "Mean input tokens per question by component (traces that carry the split; the parts add up "
            "to the agent's input tokens):",
            "",
            "| component | " + " | ".join(c.name for c in costs) + " |",
            "|---|" + "---|" * len(costs),
        ]
        for k in names:
            cells = [f"{c.components[k]:,.0f}" if k in c.components else "–" for c in costs]
            md.append(f"| {k} | " + " | ".join(cells) + " |")
        md.append("| (traces with the split) | " + " | ".join(str(c.n_split) for c in costs) + " |")
    return md
