"""The optimisation loop: evaluate → improve → validate → accept or reject → log (optuna's ask/tell).

One iteration:

1. evaluate the current :class:`Setting` (prompts + numeric knobs) on the tuning and on the
   held-out validation split. The environment's evaluation cache is keyed by the setting *and
   the KI store's state*, so KIs written from failures in the previous iteration are measured
   here (questions whose retrieval did not change are reused, the others re-run);
2. record every question's outcome and failure kind in the :class:`~kitune.optimizers.ledger.FailureLedger`,
   which also resolves the previous iteration's feedback (was its KI retrieved? did it fix the
   question?);
3. ``env.improve`` proposes a new setting from the tuning traces (prompt optimisation, Optuna
   knobs) and writes feedback KIs, routed by failure kind through the ledger;
4. a proposal whose changed instructions fail the sanity checks
   (:func:`~kitune.optimizers.acceptance.check_instruction`) is rejected before any evaluation;
5. the current setting is re-measured on validation *on the store as it now is* and the
   proposal evaluated on the same questions, so the comparison is paired on one store state;
6. :func:`~kitune.optimizers.acceptance.decide` accepts, rejects, or — when too many questions
   failed (an outage, not a worse prompt) — decides nothing; an accepted prompt is registered as
   a new version, aliased ``candidate`` and promoted to ``production``;
7. the iteration is one tracking run, nested under the invocation's parent run (params,
   metrics, prompt texts, program state, traces, the ledger).

Scores are :func:`~kitune.optimizers.objective.loop_score` values relative to the start
setting's first measurement of the same split (the reference scores 0.0).

The environment (:class:`LoopEnv`) owns every LLM and store; the loop is pure bookkeeping, so
it is tested with a fake environment. Resume: after each iteration the loop writes
``<state_dir>/loop_state.json`` and ``failure_ledger.json``; a rerun skips finished iterations
and continues from the setting they left. Curves: ``<state_dir>/curves.md`` and ``curves.png``
show tuning and validation accuracy (with 95% intervals) and scores per iteration, flips and
failure kinds, so over-fitting to the tuning questions shows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kitune.errors import PromptNotFoundError, TrackingError
from kitune.optimizers.acceptance import Decision, check_instruction, compare_paired, decide
from kitune.optimizers.ledger import FailureLedger
from kitune.optimizers.objective import LoopWeights, RunStats, loop_score, run_stats
from kitune.optimizers.program_task import eval_key, get_program_task, program_names
from kitune.optimizers.setting import Evaluation, LoopSplit, Proposal, Setting

if TYPE_CHECKING:
    from kitune.evaluation.report import RunSummary
    from kitune.experiments.prompts import PromptRegistry
    from kitune.experiments.tracking import Tracker

__all__ = [
    "Evaluation",
    "IterationRecord",
    "LoopEnv",
    "LoopResult",
    "Proposal",
    "Setting",
    "initial_prompts",
    "run_loop",
    "start_prompts",
    "write_curves",
]

logger = logging.getLogger(__name__)


class LoopEnv(Protocol):
    """The loop's environment: evaluates settings and proposes new ones.

    Contract: never raises for one question's or one document's failure (those are recorded in
    the traces/metrics); ``evaluate`` of the same setting and split twice on an unchanged KI
    store may return the cached first result, but after the store changed (KIs written, expired
    or deleted) it must re-run at least every question whose retrieval could change.
    Optional: ``tokens_used() -> int`` (LLM tokens spent so far), logged per iteration.
    """

    def evaluate(self, setting: Setting, split: LoopSplit) -> Evaluation:
        """Extract what the setting needs, index it, and run the agent on ``split``."""
        ...

    def improve(
        self, setting: Setting, tune: Evaluation, iteration: int, *, ledger: FailureLedger | None = None
    ) -> Proposal:
        """Propose a setting from the tuning run's traces (``ledger`` routes the feedback)."""
        ...


@dataclass(frozen=True)
class IterationRecord:
    """One finished iteration (a row of the curves table)."""

    iteration: int
    """0-based."""
    current_key: str
    candidate_key: str
    tune_score: float
    """Loop score of the current setting on the tuning split."""
    val_score: float
    """Loop score of the current setting on the validation split."""
    candidate_val_score: float
    """Loop score of the proposal on the validation split."""
    accepted: bool
    tune_accuracy: float | None = None
    val_accuracy: float | None = None
    candidate_val_accuracy: float | None = None
    run_id: str | None = None
    """Tracking run of the iteration (None when tracking is off or failed)."""
    registered: Mapping[str, int] = field(default_factory=dict)
    """Program → prompt version registered (accepted iterations only)."""
    changed: tuple[str, ...] = ()
    """Programs whose instruction the proposal changed."""
    decision: str = ""
    """``accepted`` | ``rejected`` | ``undecided`` (too many failed questions to decide)."""
    reason: str = ""
    """Why, with the numbers of the paired comparison."""
    val_after_score: float | None = None
    """Loop score of the current setting on validation re-measured after the improve step."""
    val_after_accuracy: float | None = None
    tune_ci: tuple[float, float] | None = None
    val_ci: tuple[float, float] | None = None
    """95% Wilson intervals of the tuning / validation accuracy."""
    n_tune: int = 0
    n_val: int = 0
    paired: Mapping[str, Any] = field(default_factory=dict)
    """The :class:`~kitune.optimizers.acceptance.PairedComparison` as a dict."""
    flips: Mapping[str, Any] = field(default_factory=dict)
    """``{"tune": {"fixed": [...], "broken": [...]}, "validation": {...}}`` vs the previous iteration."""
    failure_kinds: Mapping[str, Any] = field(default_factory=dict)
    """``{"tune": {kind: n}, "validation": {kind: n}}`` at the start of the iteration."""
    failed: Mapping[str, int] = field(default_factory=dict)
    """Failed (not graded) questions per split."""
    tokens_used: int | None = None
    """LLM tokens the iteration spent (all roles), when the environment reports them."""


@dataclass(frozen=True)
class LoopResult:
    """What :func:`run_loop` returns."""

    setting: Setting
    """The setting in use after the last iteration (the last accepted one)."""
    history: tuple[IterationRecord, ...]
    """Every iteration, resumed ones included, oldest first."""
    curves_md: Path | None = None
    curves_png: Path | None = None

    @property
    def accepted(self) -> int:
        """How many iterations were accepted."""
        return sum(r.accepted for r in self.history)


def initial_prompts(
    programs: Sequence[str], *, corpus: str, registry: PromptRegistry | None
) -> dict[str, str]:
    """The starting instruction of each program: the registry's ``production`` version, else packaged.

    Args:
        programs: program names (``extractor``, ``rewriter``, ``disambiguator``).
        corpus: corpus name (the registry names prompts per corpus).
        registry: the prompt registry, or None to use the packaged instructions.

    Raises:
        ConfigError: a program has no packaged instruction.
    """
    from kitune.programs.instructions import prompt_name

    out: dict[str, str] = {}
    for program in programs:
        text: str | None = None
        if registry is not None:
            try:
                text = registry.get(prompt_name(corpus, program), "production").text
            except (PromptNotFoundError, TrackingError):
                text = None
        out[program] = text if text is not None else get_program_task(program).start_instruction()
    return out


def start_prompts(programs: Sequence[str], *, corpus: str, registry: PromptRegistry | None) -> dict[str, str]:
    """The loop's start setting: the tuned programs' prompts plus every fixed program's production one.

    :func:`initial_prompts` for ``programs``; then each other registered program
    (:func:`~kitune.optimizers.program_task.program_names`)
    whose registry ``production`` version differs from its packaged instruction (for example the
    extractor ``kitune bootstrap`` drafted for a new domain) is added, so a loop that tunes only
    the disambiguator still extracts with the domain's extractor. Programs left out run their
    packaged instruction, as before.

    Args:
        programs: the tuned program names.
        corpus: corpus name (the registry names prompts per corpus).
        registry: the prompt registry, or None (then the same as :func:`initial_prompts`).

    Raises:
        ConfigError: a program has no packaged instruction.
    """
    out = initial_prompts(programs, corpus=corpus, registry=registry)
    if registry is None:
        return out
    for program in program_names():
        if program not in out:
            text = initial_prompts((program,), corpus=corpus, registry=registry)[program]
            if text != get_program_task(program).start_instruction():
                out[program] = text
    return out


def _summary_metrics(prefix: str, summary: RunSummary, score: float) -> dict[str, float]:
    n = max(summary.n_total, 1)
    return {
        f"{prefix}_score": score,
        f"{prefix}_accuracy": float(summary.accuracy or 0.0),
        f"{prefix}_em": summary.em,
        f"{prefix}_f1": summary.f1,
        f"{prefix}_input_tokens": float(summary.input_tokens + summary.tool_input_tokens),
        f"{prefix}_input_tokens_per_question": (summary.input_tokens + summary.tool_input_tokens) / n,
        f"{prefix}_output_tokens": float(summary.output_tokens),
        f"{prefix}_timeouts": float(summary.timeouts),
        f"{prefix}_force_committed": float(summary.force_committed),
        f"{prefix}_questions": float(summary.n_total),
    }


def _record_from_dict(r: Mapping[str, Any]) -> IterationRecord:
    data = dict(r)
    data["changed"] = tuple(data.get("changed", ()))
    for k in ("tune_ci", "val_ci"):
        if data.get(k) is not None:
            data[k] = tuple(data[k])
    return IterationRecord(**data)


def _read_state(path: Path) -> tuple[list[IterationRecord], Setting | None, dict[str, RunStats]]:
    if not path.is_file():
        return [], None, {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        history = [_record_from_dict(r) for r in data.get("history", [])]
        reference = {k: RunStats(**v) for k, v in data.get("reference", {}).items()}
        return history, Setting.from_dict(data["current"]), reference
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        logger.warning("ignoring unreadable loop state %s (%s); starting afresh", path, e)
        return [], None, {}


def _write_state(
    path: Path, history: Sequence[IterationRecord], current: Setting, reference: Mapping[str, RunStats]
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    data = {
        "history": [asdict(r) for r in history],
        "current": current.to_dict(),
        "reference": {k: asdict(v) for k, v in reference.items()},
    }
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _ci(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f" ({ci[0]:.0%}–{ci[1]:.0%})"


def _flips(r: IterationRecord, split: str) -> str:
    f = r.flips.get(split) or {}
    return f"+{len(f.get('fixed', []))}/−{len(f.get('broken', []))}" if r.iteration else "-"


def _kinds(r: IterationRecord, split: str) -> str:
    k = {n: c for n, c in (r.failure_kinds.get(split) or {}).items() if c}
    return ", ".join(f"{n} {c}" for n, c in k.items()) or "-"


def _decision(r: IterationRecord) -> str:
    return r.decision or ("accepted" if r.accepted else "rejected")


def write_curves(history: Sequence[IterationRecord], out_dir: Path) -> tuple[Path, Path | None]:
    """Write ``curves.md`` (tables) and ``curves.png`` (tuning vs validation per iteration).

    The Markdown has one row per iteration: accuracy with its 95% Wilson interval and the loop
    score for both splits, flips against the previous iteration, failure kinds, the proposal's
    paired comparison and the decision with its reason.

    Returns:
        ``(markdown path, png path or None when there is nothing to plot)``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        "# kitune optimisation curves",
        "",
        "Accuracy is judge-correct / graded questions with its 95% Wilson interval; scores are loop",
        "scores relative to iteration 0's measurement of the same split (0.0 = no change; see",
        "kitune.optimizers.objective). Flips are against the previous iteration (+fixed/−broken).",
        "",
        "| iteration | tune accuracy | tune score | tune flips | validation accuracy | validation score "
        "| validation flips | changed | decision |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in history:
        lines.append(
            f"| {r.iteration} | {_pct(r.tune_accuracy)}{_ci(r.tune_ci)} of {r.n_tune} | {r.tune_score:+.3f} "
            f"| {_flips(r, 'tune')} | {_pct(r.val_accuracy)}{_ci(r.val_ci)} of {r.n_val} "
            f"| {r.val_score:+.3f} "
            f"| {_flips(r, 'validation')} | {', '.join(r.changed) or '-'} | {_decision(r)} |"
        )
    lines += [
        "",
        "## Failure kinds at the start of each iteration",
        "",
        "| iteration | tune | validation | failed (tune/validation) |",
        "|---|---|---|---|",
    ]
    for r in history:
        lines.append(
            f"| {r.iteration} | {_kinds(r, 'tune')} | {_kinds(r, 'validation')} "
            f"| {r.failed.get('tune', 0)}/{r.failed.get('validation', 0)} |"
        )
    lines += ["", "## Decisions", ""]
    for r in history:
        after = (
            ""
            if r.val_after_score is None
            else f"; current re-measured after improve {r.val_after_score:+.3f}"
        )
        lines.append(
            f"- iteration {r.iteration}: {_decision(r)} — "
            f"{r.reason or '-'} (candidate validation score {r.candidate_val_score:+.3f}{after}"
            + (f"; {r.tokens_used:,} LLM tokens" if r.tokens_used is not None else "")
            + ")"
        )
    md = out_dir / "curves.md"
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if not history:
        return md, None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax, ax2 = fig.subplots(1, 2)
    xs = [r.iteration for r in history]
    for split, acc, ci, mark in (
        ("tuning", "tune_accuracy", "tune_ci", "o-"),
        ("validation", "val_accuracy", "val_ci", "s-"),
    ):
        ys = [getattr(r, acc) or 0.0 for r in history]
        lo = [y - (getattr(r, ci) or (y, y))[0] for r, y in zip(history, ys, strict=True)]
        hi = [(getattr(r, ci) or (y, y))[1] - y for r, y in zip(history, ys, strict=True)]
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt=mark, capsize=3, label=split)
    ax.set_xlabel("iteration")
    ax.set_ylabel("accuracy, graded questions (95% CI)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xticks(xs)
    ax.set_title("Accuracy of the current setting")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax2.plot(xs, [r.tune_score for r in history], "o-", label="tuning (current)")
    ax2.plot(xs, [r.val_score for r in history], "s-", label="validation (current)")
    ax2.plot(xs, [r.candidate_val_score for r in history], "x--", label="validation (candidate)")
    ax2.set_xlabel("iteration")
    ax2.set_ylabel("loop score vs iteration 0")
    ax2.set_xticks(xs)
    ax2.set_title("Loop score")
    ax2.grid(alpha=0.3)
    ax2.legend(loc="best")
    fig.tight_layout()
    png = out_dir / "curves.png"
    fig.savefig(png)
    return md, png


def _register(
    registry: PromptRegistry,
    corpus: str,
    setting: Setting,
    programs: Sequence[str],
    tags: Mapping[str, str],
) -> dict[str, int]:
    from kitune.programs.instructions import prompt_name

    versions: dict[str, int] = {}
    for program in programs:
        name = prompt_name(corpus, program)
        pv = registry.register(
            name,
            setting.prompts[program],
            tags=tags,
            commit_message=f"accepted by kitune optimize ({program})",
        )
        registry.set_alias(name, "candidate", pv.version)
        registry.promote(name, pv.version)
        versions[program] = pv.version
    return versions


def _decide_write_only(changed: Sequence[str], metrics: Mapping[str, float]) -> Decision:
    """Accept a change to write-only programs when their own task metric improved (``write_only``)."""
    gains = {p: (metrics.get(f"{p}_best_score"), metrics.get(f"{p}_baseline_score")) for p in changed}
    text = ", ".join(f"{p} {b} → {a}" for p, (a, b) in gains.items())
    if all(a is not None and b is not None and a > b for a, b in gains.values()):
        return Decision("accepted", f"task metric improved ({text}); validation reads no change")
    return Decision("rejected", f"task metric not improved ({text}); validation reads no change")


def run_loop(
    env: LoopEnv,
    start: Setting,
    *,
    iterations: int,
    state_dir: Path,
    tracker: Tracker,
    registry: PromptRegistry | None = None,
    corpus: str = "corpus",
    weights: LoopWeights | None = None,
    accept_margin: float = 0.0,
    params: Mapping[str, Any] | None = None,
    on_iteration: Callable[[IterationRecord], None] | None = None,
    max_failed_share: float = 0.2,
    require_significance: bool = False,
    seed: int = 0,
) -> LoopResult:
    """Run (or resume) ``iterations`` iterations of the loop (see the module docstring).

    Args:
        env: evaluates and improves settings.
        start: the setting to start from (ignored when a saved state resumes).
        iterations: total iterations wanted (finished ones from a saved state count), ≥ 1.
        state_dir: where ``loop_state.json``, ``failure_ledger.json`` and the curves live.
        tracker: one run per iteration (``iteration-<i>``), nested under the caller's open run.
        registry: the prompt registry; None skips registration.
        corpus: corpus name for prompt names.
        weights: loop-score weights (None: defaults).
        accept_margin: the paired score difference must exceed this (0.0: any strict gain).
        params: extra params logged on every iteration run.
        on_iteration: called after each new iteration.
        max_failed_share: above this share of failed questions in a run the loop decides nothing.
        require_significance: also require the paired bootstrap interval above 0 to accept.
        seed: seeds the paired bootstrap.

    Returns:
        The :class:`LoopResult`.

    Raises:
        ValueError: ``iterations`` < 1, ``accept_margin`` < 0 or ``max_failed_share`` outside 0–1.
        TrackingError: registering an accepted prompt failed (the iteration is not recorded, so
            a rerun retries it).
    """
    if iterations < 1:
        raise ValueError(f"iterations={iterations}: run at least 1")
    if accept_margin < 0:
        raise ValueError(f"accept_margin={accept_margin}: use 0 or more")
    if not 0.0 <= max_failed_share <= 1.0:
        raise ValueError(f"max_failed_share={max_failed_share}: use a share between 0 and 1")
    from kitune.evaluation.report import wilson_interval
    from kitune.optimizers.artifacts import log_candidate, log_program_state

    state_path = state_dir / "loop_state.json"
    history, saved, reference = _read_state(state_path)
    ledger = FailureLedger(state_dir / "failure_ledger.json")
    current = saved or start
    tokens_used = getattr(env, "tokens_used", None)
    for i in range(len(history), iterations):
        spent_before = tokens_used() if callable(tokens_used) else None
        tune = env.evaluate(current, "tune")
        cur_val = env.evaluate(current, "validation")
        reference.setdefault("tune", run_stats(tune.summary))
        reference.setdefault("validation", run_stats(cur_val.summary))
        tune_score = loop_score(tune.summary, reference["tune"], weights)
        val_score = loop_score(cur_val.summary, reference["validation"], weights)
        ledger.record(i, "tune", tune.traces, gold_docids=tune.gold_docids, retrieved=tune.retrieved)
        ledger.record(
            i, "validation", cur_val.traces, gold_docids=cur_val.gold_docids, retrieved=cur_val.retrieved
        )
        flips = {split: ledger.flips(i, split) for split in ("tune", "validation")}
        kinds = {split: ledger.kind_counts(i, split) for split in ("tune", "validation")}
        run_params = {
            **dict(params or {}),
            "iteration": i,
            "setting": current.key,
            "accept_margin": accept_margin,
            "max_failed_share": max_failed_share,
            **{f"knob.{k}": v for k, v in current.knobs.items()},
        }
        with tracker.run(f"iteration-{i}", run_params, tags={"kitune.kind": "iteration"}) as handle:
            rid = handle.run_id
            metrics = {
                **_summary_metrics("tune", tune.summary, tune_score),
                **_summary_metrics("val", cur_val.summary, val_score),
                **{f"tune_{k}": v for k, v in tune.metrics.items()},
                **{f"tune_kind_{k}": float(v) for k, v in kinds["tune"].items()},
                **{f"val_kind_{k}": float(v) for k, v in kinds["validation"].items()},
                "tune_flips_fixed": float(len(flips["tune"]["fixed"])),
                "tune_flips_broken": float(len(flips["tune"]["broken"])),
                "val_flips_fixed": float(len(flips["validation"]["fixed"])),
                "val_flips_broken": float(len(flips["validation"]["broken"])),
            }
            tracker.log_metrics(metrics, step=i, run_id=rid)
            log_candidate(tracker, current.prompts, "prompts/current", run_id=rid)
            proposal = env.improve(current, tune, i, ledger=ledger)
            ledger.save()
            changed = proposal.setting.changed_programs(current)
            knobs_changed = dict(proposal.setting.knobs) != dict(current.knobs)
            problems = [
                f"{program}: {problem}"
                for program in changed
                for problem in check_instruction(
                    program, current.prompts.get(program, ""), proposal.setting.prompts.get(program, "")
                )
            ]
            # the improve step may have written KIs: re-measure the current setting on the store
            # as it is now, so current and candidate are compared on one store state
            cur_after = env.evaluate(current, "validation")
            reads_changed = knobs_changed or eval_key(proposal.setting) != eval_key(current)
            if reads_changed and not problems:
                cand = env.evaluate(proposal.setting, "validation")
            else:
                cand = cur_after
            paired = compare_paired(cur_after.traces, cand.traces, weights, seed=seed)
            tune_failed = tune.summary.n_failed / tune.summary.n_total if tune.summary.n_total else 0.0
            decision = decide(
                paired,
                changed=bool(changed) or knobs_changed,
                margin=accept_margin,
                max_failed_share=max_failed_share,
                require_significance=require_significance,
                sanity_problems=problems,
            )
            if changed and not reads_changed and not problems and decision.outcome == "rejected":
                decision = _decide_write_only(changed, proposal.metrics)
            if decision.outcome != "undecided" and tune_failed > max_failed_share:
                decision = type(decision)(
                    "undecided",
                    f"{tune_failed:.0%} of the tuning questions failed (limit {max_failed_share:.0%}): "
                    "no decision on this run",
                )
            accepted = decision.accepted
            after_score = loop_score(cur_after.summary, reference["validation"], weights)
            cand_score = loop_score(cand.summary, reference["validation"], weights)
            spent = (
                (tokens_used() - spent_before) if callable(tokens_used) and spent_before is not None else None
            )
            tracker.log_metrics(
                {
                    **_summary_metrics("candidate_val", cand.summary, cand_score),
                    **{f"improve_{k}": v for k, v in proposal.metrics.items()},
                    **paired.to_metrics(),
                    "val_after_score": after_score,
                    "accepted": float(accepted),
                    "undecided": float(decision.outcome == "undecided"),
                    "score_gain": cand_score - after_score,
                    **({"iteration_tokens": float(spent)} if spent is not None else {}),
                    **{f"ledger_{k}": float(v) for k, v in ledger.feedback_summary().items()},
                },
                step=i,
                run_id=rid,
            )
            log_candidate(tracker, proposal.setting.prompts, "prompts/candidate", run_id=rid)
            for program, module in proposal.programs.items():
                log_program_state(tracker, module, f"programs/{program}.json", run_id=rid)
            notes = {**dict(proposal.notes), "decision": decision.outcome, "reason": decision.reason}
            if problems:
                notes["sanity_problems"] = problems
            tracker.log_dict(notes, "improve.json", run_id=rid)
            tracker.log_dict(ledger.to_dict(), "failure_ledger.json", run_id=rid)
            tracker.log_dict(
                {
                    "tune": [t.to_dict() for t in tune.traces],
                    "validation": [t.to_dict() for t in cur_val.traces],
                    "validation_after_improve": [t.to_dict() for t in cur_after.traces],
                    "candidate_validation": [t.to_dict() for t in cand.traces],
                },
                "traces.json",
                run_id=rid,
            )
            log_episodes = getattr(tracker, "log_episodes", None)
            if callable(log_episodes):
                log_episodes(list(tune.traces), run_id=rid, name=f"iteration-{i}-tune")
                log_episodes(list(cur_val.traces), run_id=rid, name=f"iteration-{i}-validation")
            registered: dict[str, int] = {}
            if accepted and registry is not None and changed:
                tags = {
                    "kitune.run_id": rid or "",
                    "kitune.val_score": f"{cand_score:.4f}",
                    "kitune.iteration": str(i),
                }
                registered = _register(registry, corpus, proposal.setting, changed, tags)
            record = IterationRecord(
                iteration=i,
                current_key=current.key,
                candidate_key=proposal.setting.key,
                tune_score=tune_score,
                val_score=val_score,
                candidate_val_score=cand_score,
                accepted=accepted,
                tune_accuracy=tune.summary.accuracy,
                val_accuracy=cur_val.summary.accuracy,
                candidate_val_accuracy=cand.summary.accuracy,
                run_id=rid,
                registered=registered,
                changed=tuple(changed),
                decision=decision.outcome,
                reason=decision.reason,
                val_after_score=after_score,
                val_after_accuracy=cur_after.summary.accuracy,
                tune_ci=wilson_interval(tune.summary.n_correct, tune.summary.n_graded),
                val_ci=wilson_interval(cur_val.summary.n_correct, cur_val.summary.n_graded),
                n_tune=tune.summary.n_total,
                n_val=cur_val.summary.n_total,
                paired=paired.to_dict(),
                flips=flips,
                failure_kinds=kinds,
                failed={"tune": tune.summary.n_failed, "validation": cur_val.summary.n_failed},
                tokens_used=spent,
            )
        if accepted:
            current = proposal.setting
        history.append(record)
        _write_state(state_path, history, current, reference)
        ledger.save()
        if on_iteration is not None:
            on_iteration(record)
    md, png = write_curves(history, state_dir)
    (state_dir / "failure_ledger.md").write_text(ledger.to_markdown(), encoding="utf-8")
    return LoopResult(setting=current, history=tuple(history), curves_md=md, curves_png=png)
