"""Optuna on the knobs that cost: a two-objective study (answers up, tokens down) that resumes (issue 39.3).

:class:`CostStudy` runs a seeded multi-objective TPE study over :data:`COST_KNOBS` (top-k, the
observation cap, the RRF constant, the per-signal weights, the per-branch size) with a
:class:`~kitune.optimizers.knobs.KnobSpace`, stored in a local SQLite file so a rerun resumes
where the last one stopped. The objective is scripted by the caller and must be deterministic
and LLM-free — ``benchmarks/cost_study.py`` uses ``benchmarks/context_cost.py``'s measurement:
the answer-bearing rate of one ``get_context`` per question (maximised) and its mean tokens
(minimised) on committed KIs.

The chosen setting is a constrained pick (:meth:`CostStudy.choose`): among the Pareto-optimal
trials whose rate is at least ``min_rate`` (e.g. the current setting's), the one with the
fewest tokens; ties go to the lower trial number, so the same study always gives the same
choice. The step budget (``agent.max_steps``) is not in :data:`COST_KNOBS`: no deterministic
measurement sees it; it is checked end to end with the model (the loop's decision rule).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kitune.errors import OptimizationError
from kitune.optimizers.knobs import FloatKnob, IntKnob, KnobSpace

if TYPE_CHECKING:
    import optuna

__all__ = ["COST_KNOBS", "CostObjective", "CostStudy", "CostTrial"]

COST_KNOBS = KnobSpace(
    (
        IntKnob("retrieval.default_size", 3, 15),
        IntKnob("agent.observation_max_chars", 1000, 8000, step=500),
        IntKnob("retrieval.rrf_k", 10, 120, step=10),
        FloatKnob("retrieval.tag_weight", 0.0, 2.0),
        FloatKnob("retrieval.lexical_weight", 0.0, 2.0),
        FloatKnob("retrieval.semantic_weight", 0.0, 2.0),
        IntKnob("retrieval.branch_size", 10, 100, step=10),
    )
)
"""The knobs that change what one look-up costs and finds; ranges inside the config fields' bounds."""

CostObjective = Callable[[dict[str, int | float]], tuple[float, float]]
"""``objective(params) -> (rate, tokens)``: rate to maximise (0–1), tokens to minimise (>= 0)."""

_FAIL_ATTR = "kitune_fail_reason"


@dataclass(frozen=True)
class CostTrial:
    """One completed trial."""

    number: int
    params: Mapping[str, int | float]
    """``{dotted config key: value}``."""
    rate: float
    """The first objective (higher is better)."""
    tokens: float
    """The second objective (lower is better)."""


class CostStudy:
    """A seeded two-objective TPE study over ``space``, stored in SQLite at ``path`` (resumes).

    Args:
        path: the SQLite file (``.db``/``.sqlite``); created with its folder when missing.
        study_name: name inside the storage.
        space: the knobs (default :data:`COST_KNOBS`).
        seed: the TPE sampler's seed.

    Raises:
        ValueError: ``path`` is not a ``.db``/``.sqlite``/``.sqlite3`` file.
    """

    def __init__(
        self, path: Path | str, study_name: str, *, space: KnobSpace | None = None, seed: int = 0
    ) -> None:
        self.path = Path(path)
        if self.path.suffix.lower() not in (".db", ".sqlite", ".sqlite3"):
            raise ValueError(f"CostStudy stores in SQLite: give a .db/.sqlite path, not {self.path}")
        self.study_name = study_name
        self.space = space or COST_KNOBS
        self.seed = seed
        self._study: optuna.Study | None = None

    @property
    def study(self) -> optuna.Study:
        """The study, created or loaded (resumed) on first use.

        Raises:
            OptimizationError: the storage cannot be opened.
        """
        if self._study is None:
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._study = optuna.create_study(
                    storage=f"sqlite:///{self.path.resolve()}",
                    study_name=self.study_name,
                    directions=["maximize", "minimize"],
                    sampler=optuna.samplers.TPESampler(seed=self.seed),
                    load_if_exists=True,
                )
            except Exception as e:
                raise OptimizationError(
                    f"cannot open cost study {self.study_name!r} at {self.path}: {e}"
                ) from e
        return self._study

    def enqueue(self, params: Mapping[str, int | float]) -> None:
        """Queue ``params`` as the next trial (the current setting first), unless already tried."""
        self.study.enqueue_trial(dict(params), skip_if_exists=True)

    def optimize(self, objective: CostObjective, n_trials: int) -> list[CostTrial]:
        """Run ``n_trials`` more trials (sequential: the seeded sampler then gives the same trials).

        Returns:
            Every completed trial of the study, by number.

        Raises:
            ValueError: ``n_trials < 1``.
            OptimizationError: no trial of the study has completed (the first failure reasons quoted).
        """
        if n_trials < 1:
            raise ValueError(f"n_trials must be >= 1, got {n_trials}")

        def run(trial: optuna.trial.Trial) -> tuple[float, float]:
            params = self.space.suggest(trial)
            try:
                rate, tokens = objective(params)
                if not all(isinstance(v, int | float) and math.isfinite(v) for v in (rate, tokens)):
                    raise ValueError(f"objective returned {(rate, tokens)!r}, not two finite numbers")
            except Exception as e:
                trial.set_user_attr(_FAIL_ATTR, f"{type(e).__name__}: {e}"[:1000])
                raise
            return float(rate), float(tokens)

        self.study.optimize(run, n_trials=n_trials, catch=(Exception,))
        done = self.trials()
        if not done:
            failed = {
                str(t.user_attrs.get(_FAIL_ATTR, "unknown")) for t in self.study.get_trials(deepcopy=False)
            }
            raise OptimizationError(
                f"cost study {self.study_name!r}: no trial completed ({'; '.join(sorted(failed)[:3])})"
            )
        return done

    def trials(self) -> list[CostTrial]:
        """Every completed trial, by number."""
        out = [
            CostTrial(t.number, dict(t.params), float(t.values[0]), float(t.values[1]))
            for t in self.study.get_trials(deepcopy=False)
            if t.state.name == "COMPLETE" and t.values is not None
        ]
        return sorted(out, key=lambda t: t.number)

    def pareto(self) -> list[CostTrial]:
        """The Pareto-optimal completed trials (no other has a higher rate and fewer tokens), by number."""
        done = self.trials()

        def dominated(a: CostTrial) -> bool:
            return any(
                b.rate >= a.rate and b.tokens <= a.tokens and (b.rate > a.rate or b.tokens < a.tokens)
                for b in done
            )

        return [t for t in done if not dominated(t)]

    def choose(self, min_rate: float) -> CostTrial:
        """The Pareto trial with the fewest tokens among those with ``rate >= min_rate``.

        Raises:
            OptimizationError: no completed trial reaches ``min_rate``.
        """
        ok = [t for t in self.pareto() if t.rate >= min_rate]
        if not ok:
            best = max((t.rate for t in self.trials()), default=None)
            raise OptimizationError(
                f"no trial of {self.study_name!r} reaches rate {min_rate:.4f} (best {best}); run more trials "
                "or lower the floor"
            )
        return min(ok, key=lambda t: (t.tokens, t.number))

    def plot(
        self, path: Path | str, *, reference: CostTrial | None = None, chosen: CostTrial | None = None
    ) -> Path:
        """Save the trials and the Pareto front as a PNG (matplotlib): tokens on x, rate on y.

        Args:
            path: the PNG file.
            reference: the current setting's trial, marked.
            chosen: the chosen trial, marked.

        Returns:
            ``path``.
        """
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        done, front = self.trials(), sorted(self.pareto(), key=lambda t: t.tokens)
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        ax.scatter([t.tokens for t in done], [t.rate for t in done], s=14, c="#bbbbbb", label="trials")
        ax.plot(
            [t.tokens for t in front], [t.rate for t in front], "o-", c="#1f77b4", ms=5, label="Pareto front"
        )
        marks: list[tuple[CostTrial | None, str, str]] = [
            (reference, "s", "current setting"),
            (chosen, "*", "chosen"),
        ]
        for trial, marker, label in marks:
            if trial is not None:
                ax.scatter(
                    [trial.tokens], [trial.rate], marker=marker, s=110, c="#d62728", label=label, zorder=3
                )
        ax.set_xlabel("tokens per get_context call (mean)")
        ax.set_ylabel("answer-bearing rate")
        ax.set_title(f"{self.study_name}: {len(done)} trials")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(out, dpi=110)
        plt.close(fig)
        return out

    def summary(self) -> dict[str, Any]:
        """JSON-able: every completed trial and the Pareto front's numbers."""
        return {
            "study": self.study_name,
            "seed": self.seed,
            "trials": [t.__dict__ | {"params": dict(t.params)} for t in self.trials()],
            "pareto": [t.number for t in self.pareto()],
        }
