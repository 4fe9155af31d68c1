"""The optimisation loop: evaluate → improve → validate → accept or reject → log (optuna's ask/tell).

One iteration:

1. evaluate the current :class:`Setting` (prompts + numeric knobs) on the tuning split;
2. evaluate it on the held-out validation split (cached by the environment, so free after the
   first time);
3. ``env.improve`` proposes a new setting from the tuning traces (prompt optimisation, Optuna
   knobs, feedback KIs: whatever the environment does);
4. evaluate the proposal on the validation split;
5. accept it only when its :func:`~kitune.optimizers.objective.loop_score` is *more than*
   ``accept_margin`` above the current one's; an accepted prompt is registered as a new version
   in the prompt registry, aliased ``candidate`` and then promoted to ``production``;
6. log the iteration as one tracking run (params, metrics, prompt texts, program state JSON).

The environment (:class:`LoopEnv`) owns every LLM and store; the loop is pure bookkeeping, so
it is tested with a fake environment. Resume: after each iteration the loop writes
``<state_dir>/loop_state.json``; a rerun skips finished iterations and continues from the
setting they left. Curves: ``<state_dir>/curves.md`` and ``curves.png`` show the tuning and
validation scores per iteration separately, so over-fitting to the tuning questions shows.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from kitune.errors import PromptNotFoundError, TrackingError
from kitune.optimizers.objective import LoopWeights, loop_score

if TYPE_CHECKING:
    from kitune.evaluation.metrics import Trace
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
    "write_curves",
]

logger = logging.getLogger(__name__)

LoopSplit = Literal["tune", "validation"]


@dataclass(frozen=True)
class Setting:
    """What the loop tunes: instruction texts per program and numeric config overrides."""

    prompts: Mapping[str, str]
    """Program name (``extractor``, ``rewriter``, ``disambiguator``) → instruction text."""
    knobs: Mapping[str, int | float] = field(default_factory=dict)
    """Dotted config key → value (``retrieval.rrf_k`` …), applied as config overrides."""

    @property
    def key(self) -> str:
        """8 hex characters identifying the setting (same texts and knobs ⇒ same key)."""
        blob = json.dumps({"p": dict(self.prompts), "k": dict(self.knobs)}, sort_keys=True)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:8]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {"prompts": dict(self.prompts), "knobs": dict(self.knobs)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Setting:
        """Inverse of :meth:`to_dict`."""
        return cls(prompts=dict(data.get("prompts", {})), knobs=dict(data.get("knobs", {})))

    def changed_programs(self, other: Setting) -> list[str]:
        """Programs whose instruction differs from ``other``'s, sorted."""
        names = set(self.prompts) | set(other.prompts)
        return sorted(n for n in names if self.prompts.get(n) != other.prompts.get(n))


@dataclass(frozen=True)
class Evaluation:
    """One setting evaluated on one split."""

    summary: RunSummary
    """Aggregates of the run."""
    traces: tuple[Trace, ...] = ()
    """Per-question traces."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Extra measures (extraction feedback, flips …) to log."""


@dataclass(frozen=True)
class Proposal:
    """What ``env.improve`` proposes."""

    setting: Setting
    """The candidate setting (may equal the current one: nothing found)."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Measures of the improvement step (metric calls, feedback KIs written, flips …)."""
    programs: Mapping[str, Any] = field(default_factory=dict)
    """Program name → optimised ``dspy.Module`` (its state is logged as JSON)."""
    notes: Mapping[str, Any] = field(default_factory=dict)
    """JSON-able details (stop reasons, knob trials …), logged as ``improve.json``."""


class LoopEnv(Protocol):
    """The loop's environment: evaluates settings and proposes new ones.

    Contract: never raises for one question's or one document's failure (those are recorded in
    the traces/metrics); ``evaluate`` of the same setting and split twice may return the cached
    first result.
    """

    def evaluate(self, setting: Setting, split: LoopSplit) -> Evaluation:
        """Extract what the setting needs, index it, and run the agent on ``split``."""
        ...

    def improve(self, setting: Setting, tune: Evaluation, iteration: int) -> Proposal:
        """Propose a setting from the tuning run's traces."""
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
    from kitune.experiments.prompts import prompt_name
    from kitune.programs.instructions import load_instruction

    out: dict[str, str] = {}
    for program in programs:
        text: str | None = None
        if registry is not None:
            try:
                text = registry.get(prompt_name(corpus, program), "production").text
            except (PromptNotFoundError, TrackingError):
                text = None
        out[program] = text if text is not None else load_instruction(program).text
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


def _read_state(path: Path) -> tuple[list[IterationRecord], Setting | None]:
    if not path.is_file():
        return [], None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        history = [
            IterationRecord(**{**r, "changed": tuple(r.get("changed", ()))}) for r in data.get("history", [])
        ]
        return history, Setting.from_dict(data["current"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        logger.warning("ignoring unreadable loop state %s (%s); starting afresh", path, e)
        return [], None


def _write_state(path: Path, history: Sequence[IterationRecord], current: Setting) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    data = {"history": [asdict(r) for r in history], "current": current.to_dict()}
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)


def write_curves(history: Sequence[IterationRecord], out_dir: Path) -> tuple[Path, Path | None]:
    """Write ``curves.md`` (table) and ``curves.png`` (tuning vs validation score per iteration).

    Returns:
        ``(markdown path, png path or None when there is nothing to plot)``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        "# kitune optimisation curves",
        "",
        "| iteration | tune score | validation score | candidate validation score | accepted | changed |",
        "|---|---|---|---|---|---|",
    ]
    for r in history:
        lines.append(
            f"| {r.iteration} | {r.tune_score:.3f} | {r.val_score:.3f} | {r.candidate_val_score:.3f} | "
            f"{'yes' if r.accepted else 'no'} | {', '.join(r.changed) or '-'} |"
        )
    lines += ["", "Scores are loop scores (see kitune.optimizers.objective); higher is better."]
    md = out_dir / "curves.md"
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if not history:
        return md, None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = [r.iteration for r in history]
    ax.plot(xs, [r.tune_score for r in history], "o-", label="tuning (current)")
    ax.plot(xs, [r.val_score for r in history], "s-", label="validation (current)")
    ax.plot(xs, [r.candidate_val_score for r in history], "x--", label="validation (candidate)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("loop score")
    ax.set_title("Tuning vs validation")
    ax.grid(alpha=0.3)
    ax.legend()
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
    from kitune.experiments.prompts import prompt_name

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
) -> LoopResult:
    """Run (or resume) ``iterations`` iterations of the loop.

    Args:
        env: evaluates and improves settings.
        start: the setting to start from (ignored when a saved state resumes).
        iterations: total iterations wanted (finished ones from a saved state count), ≥ 1.
        state_dir: where ``loop_state.json`` and the curves live.
        tracker: one run per iteration (``iteration-<i>``), with explicit run ids.
        registry: the prompt registry; None skips registration.
        corpus: corpus name for prompt names.
        weights: loop-score weights (None: defaults).
        accept_margin: the candidate's validation score must exceed the current one's by more
            than this (0.0: any strict improvement).
        params: extra params logged on every iteration run.
        on_iteration: called after each new iteration.

    Returns:
        The :class:`LoopResult`.

    Raises:
        ValueError: ``iterations`` < 1 or ``accept_margin`` < 0.
        TrackingError: registering an accepted prompt failed (the iteration is not recorded, so
            a rerun retries it).
    """
    if iterations < 1:
        raise ValueError(f"iterations={iterations}: run at least 1")
    if accept_margin < 0:
        raise ValueError(f"accept_margin={accept_margin}: use 0 or more")
    from kitune.experiments.tracking import log_candidate, log_program_state

    state_path = state_dir / "loop_state.json"
    history, saved = _read_state(state_path)
    current = saved or start
    for i in range(len(history), iterations):
        tune = env.evaluate(current, "tune")
        cur_val = env.evaluate(current, "validation")
        tune_score = loop_score(tune.summary, weights)
        val_score = loop_score(cur_val.summary, weights)
        run_params = {
            **dict(params or {}),
            "iteration": i,
            "setting": current.key,
            "accept_margin": accept_margin,
            **{f"knob.{k}": v for k, v in current.knobs.items()},
        }
        with tracker.run(f"iteration-{i}", run_params, tags={"kitune.kind": "iteration"}) as handle:
            rid = handle.run_id
            metrics = {
                **_summary_metrics("tune", tune.summary, tune_score),
                **_summary_metrics("val", cur_val.summary, val_score),
                **{f"tune_{k}": v for k, v in tune.metrics.items()},
            }
            tracker.log_metrics(metrics, step=i, run_id=rid)
            log_candidate(tracker, current.prompts, "prompts/current", run_id=rid)
            proposal = env.improve(current, tune, i)
            changed = proposal.setting.changed_programs(current)
            knobs_changed = dict(proposal.setting.knobs) != dict(current.knobs)
            if changed or knobs_changed:
                cand = env.evaluate(proposal.setting, "validation")
            else:
                cand = cur_val
            cand_score = loop_score(cand.summary, weights)
            accepted = (bool(changed) or knobs_changed) and cand_score > val_score + accept_margin
            tracker.log_metrics(
                {
                    **_summary_metrics("candidate_val", cand.summary, cand_score),
                    **{f"improve_{k}": v for k, v in proposal.metrics.items()},
                    "accepted": float(accepted),
                    "score_gain": cand_score - val_score,
                },
                step=i,
                run_id=rid,
            )
            log_candidate(tracker, proposal.setting.prompts, "prompts/candidate", run_id=rid)
            for program, module in proposal.programs.items():
                log_program_state(tracker, module, f"programs/{program}.json", run_id=rid)
            if proposal.notes:
                tracker.log_dict(dict(proposal.notes), "improve.json", run_id=rid)
            tracker.log_dict(
                {
                    "tune": [t.to_dict() for t in tune.traces],
                    "validation": [t.to_dict() for t in cand.traces],
                },
                "traces.json",
                run_id=rid,
            )
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
            )
        if accepted:
            current = proposal.setting
        history.append(record)
        _write_state(state_path, history, current)
        if on_iteration is not None:
            on_iteration(record)
    md, png = write_curves(history, state_dir)
    return LoopResult(setting=current, history=tuple(history), curves_md=md, curves_png=png)
