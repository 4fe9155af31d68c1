"""Optuna over kitune's numeric knobs, with a study on disk that resumes (case M3).

:class:`KnobSpace` lists the knobs as ranges over *dotted config keys* (``retrieval.rrf_k``,
``extraction.max_facts_per_doc`` …); :meth:`KnobSpace.suggest` turns an Optuna trial into a
``{dotted key: value}`` dict that :func:`kitune.config.load_config` accepts as ``overrides``.

:class:`KnobStudy` keeps the study on disk:

* a **journal file** (default, any suffix but ``.db``/``.sqlite``): ``JournalStorage`` with a
  file-lock backend, safe for several processes;
* a **SQLite file** (``.db``/``.sqlite``): one process only (threads allowed; the connection has
  a busy timeout so concurrent writers wait instead of failing with "database is locked").

The parent creates the study once (:meth:`KnobStudy.create`) before any worker starts; workers
only load it. Reopening the same path and study name resumes: previous trials count.
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kitune.errors import OptimizationError

if TYPE_CHECKING:
    import optuna

__all__ = [
    "DEFAULT_KNOBS",
    "FloatKnob",
    "IntKnob",
    "KnobObjective",
    "KnobSpace",
    "KnobStudy",
    "KnobTrial",
]

SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
_FAIL_ATTR = "kitune_fail_reason"


@dataclass(frozen=True)
class IntKnob:
    """An integer knob over ``[low, high]`` (inclusive) in steps of ``step``."""

    key: str
    """Dotted config key, e.g. ``retrieval.rrf_k``."""
    low: int
    high: int
    step: int = 1
    log: bool = False
    """Sample on a log scale (``step`` must then be 1)."""

    def __post_init__(self) -> None:
        if self.low > self.high or self.step < 1 or (self.log and (self.step != 1 or self.low < 1)):
            raise ValueError(
                f"invalid IntKnob {self.key}: low={self.low} high={self.high} step={self.step} log={self.log}"
            )

    def suggest(self, trial: optuna.trial.BaseTrial) -> int:
        """Ask ``trial`` for a value (the Optuna param name is :attr:`key`)."""
        return int(trial.suggest_int(self.key, self.low, self.high, step=self.step, log=self.log))


@dataclass(frozen=True)
class FloatKnob:
    """A float knob over ``[low, high]``."""

    key: str
    """Dotted config key, e.g. ``retrieval.semantic_weight``."""
    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        if not (self.low <= self.high) or (self.log and self.low <= 0):
            raise ValueError(f"invalid FloatKnob {self.key}: low={self.low} high={self.high} log={self.log}")

    def suggest(self, trial: optuna.trial.BaseTrial) -> float:
        """Ask ``trial`` for a value (the Optuna param name is :attr:`key`)."""
        return float(trial.suggest_float(self.key, self.low, self.high, log=self.log))


Knob = IntKnob | FloatKnob

DEFAULT_KNOBS: tuple[Knob, ...] = (
    IntKnob("extraction.max_facts_per_doc", 3, 15),
    IntKnob("retrieval.branch_size", 10, 100, step=10),
    IntKnob("retrieval.rrf_k", 10, 120, step=10),
    FloatKnob("retrieval.tag_weight", 0.0, 2.0),
    FloatKnob("retrieval.lexical_weight", 0.0, 2.0),
    FloatKnob("retrieval.semantic_weight", 0.0, 2.0),
    IntKnob("retrieval.confidence_floor", 0, 80, step=10),
    IntKnob("agent.max_steps", 8, 43),
)
"""The design's knobs: facts per doc cap, per-branch size, RRF constant and the three branch
weights, confidence floor, step budget. Ranges stay inside the config fields' bounds."""


@dataclass(frozen=True)
class KnobSpace:
    """The knobs Optuna tunes. Keys must be unique dotted :class:`~kitune.config.KituneConfig` paths."""

    knobs: tuple[Knob, ...] = DEFAULT_KNOBS

    def __post_init__(self) -> None:
        keys = [k.key for k in self.knobs]
        if not keys:
            raise ValueError("KnobSpace needs at least one knob")
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ValueError(f"duplicate knob keys: {dupes}")

    @property
    def keys(self) -> tuple[str, ...]:
        """The dotted config keys, in order."""
        return tuple(k.key for k in self.knobs)

    def suggest(self, trial: optuna.trial.BaseTrial) -> dict[str, int | float]:
        """Sample every knob from ``trial``.

        Returns:
            ``{dotted config key: value}``, usable as ``load_config(path, overrides=...)``.
        """
        return {k.key: k.suggest(trial) for k in self.knobs}

    def current(self, cfg: Any) -> dict[str, int | float]:
        """The values ``cfg`` (a ``KituneConfig``) has now for every knob, ``{dotted key: value}``.

        Raises:
            ValueError: a key is not a config field.
        """
        out: dict[str, int | float] = {}
        for knob in self.knobs:
            section_name, _, field_name = knob.key.partition(".")
            section = getattr(cfg, section_name, None)
            if section is None or not hasattr(section, field_name):
                raise ValueError(f"knob {knob.key!r} is not a config field (expected e.g. 'retrieval.rrf_k')")
            out[knob.key] = getattr(section, field_name)
        return out

    def check_against(self, cfg: Any) -> None:
        """Check every key exists on ``cfg`` (a ``KituneConfig``) and every range is valid for it.

        Raises:
            ValueError: a key is not a config field, or a range endpoint fails the field's
                validation (the message names the key and the bound).
        """
        for knob in self.knobs:
            section_name, _, field_name = knob.key.partition(".")
            section = getattr(cfg, section_name, None)
            if section is None or not field_name or field_name not in type(section).model_fields:
                raise ValueError(f"knob {knob.key!r} is not a config field (expected e.g. 'retrieval.rrf_k')")
            for bound in (knob.low, knob.high):
                try:
                    type(section).model_validate({**section.model_dump(), field_name: bound})
                except Exception as e:  # pydantic ValidationError
                    raise ValueError(f"knob {knob.key!r}: bound {bound} is not a valid value: {e}") from e


@dataclass(frozen=True)
class KnobTrial:
    """One finished trial."""

    number: int
    """Optuna trial number (0-based, unique within the study)."""
    params: Mapping[str, int | float]
    """``{dotted config key: value}``."""
    value: float | None
    """Objective value (higher is better), None unless the trial completed."""
    state: str
    """``COMPLETE``, ``FAIL``, ``PRUNED``, ``RUNNING`` or ``WAITING``."""
    fail_reason: str | None = None
    """Why it failed, when kitune's wrapper saw the error."""


KnobObjective = Callable[[dict[str, int | float]], float]
"""``objective(params) -> score``: evaluate one knob setting; higher is better; raise or return
NaN to fail the trial. Must be a module-level function for :meth:`KnobStudy.optimize_parallel`."""


def _wrap(space: KnobSpace, objective: KnobObjective) -> Callable[[optuna.trial.Trial], float]:
    def run(trial: optuna.trial.Trial) -> float:
        params = space.suggest(trial)
        try:
            value = objective(params)
            if value is None or not isinstance(value, (int, float)) or math.isnan(float(value)):
                raise ValueError(f"objective returned {value!r}, not a number")
        except Exception as e:
            trial.set_user_attr(_FAIL_ATTR, f"{type(e).__name__}: {e}"[:1000])
            raise
        return float(value)

    return run


class KnobStudy:
    """An Optuna study over a :class:`KnobSpace`, stored at ``path`` so it resumes.

    Args:
        path: storage file. ``.db``/``.sqlite``/``.sqlite3`` → SQLite (single process);
            anything else → journal file with a file lock (multi-process safe).
        study_name: name inside the storage.
        space: the knobs.
        direction: ``"maximize"`` (default) or ``"minimize"``.
        seed: sampler seed (TPE); the same seed and objective give the same first suggestions.
        sqlite_timeout_s: SQLite busy/connect timeout in seconds (threads wait this long).
    """

    def __init__(
        self,
        path: Path | str,
        study_name: str,
        *,
        space: KnobSpace | None = None,
        direction: Literal["maximize", "minimize"] = "maximize",
        seed: int = 0,
        sqlite_timeout_s: float = 60.0,
    ) -> None:
        self.path = Path(path)
        self.study_name = study_name
        self.space = space or KnobSpace()
        self.direction = direction
        self.seed = seed
        self.sqlite_timeout_s = sqlite_timeout_s
        self._study: optuna.Study | None = None

    @property
    def is_sqlite(self) -> bool:
        """True for a single-process SQLite store."""
        return self.path.suffix.lower() in SQLITE_SUFFIXES

    def _storage(self) -> Any:
        import optuna

        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.is_sqlite:
            return optuna.storages.RDBStorage(
                f"sqlite:///{self.path.resolve()}",
                engine_kwargs={"connect_args": {"timeout": self.sqlite_timeout_s}},
            )
        from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock, JournalStorage

        file = str(self.path.resolve())
        return JournalStorage(JournalFileBackend(file, lock_obj=JournalFileOpenLock(file)))

    def _sampler(self) -> Any:
        import optuna

        return optuna.samplers.TPESampler(seed=self.seed)

    def create(self) -> optuna.Study:
        """Create the study (or load it if it exists). Call once in the parent before workers start.

        Raises:
            OptimizationError: the storage cannot be opened.
        """
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            self._study = optuna.create_study(
                storage=self._storage(),
                study_name=self.study_name,
                direction=self.direction,
                sampler=self._sampler(),
                load_if_exists=True,
            )
        except Exception as e:
            raise OptimizationError(
                f"cannot open Optuna study {self.study_name!r} at {self.path}: {e}"
            ) from e
        return self._study

    @property
    def study(self) -> optuna.Study:
        """The study, created/loaded on first use."""
        return self._study if self._study is not None else self.create()

    def optimize(self, objective: KnobObjective, n_trials: int, *, n_jobs: int = 1) -> list[KnobTrial]:
        """Run ``n_trials`` more trials in this process (``n_jobs`` threads).

        An objective that raises or returns None/NaN fails its trial (reason kept) without
        stopping the others.

        Returns:
            The trials run by this call, in number order.

        Raises:
            ValueError: ``n_trials`` < 1 or ``n_jobs`` < 1.
            OptimizationError: every trial of this call failed (the message gives the first
                reasons), so callers never get a silent "no trials are completed yet".
        """
        if n_trials < 1 or n_jobs < 1:
            raise ValueError(f"n_trials and n_jobs must be >= 1, got {n_trials}, {n_jobs}")
        study = self.study
        before = _finished_numbers(study)
        study.optimize(_wrap(self.space, objective), n_trials=n_trials, n_jobs=n_jobs, catch=(Exception,))
        mine = [t for t in self.trials() if t.number not in before]
        if mine and all(t.state == "FAIL" for t in mine):
            reasons = "; ".join(sorted({t.fail_reason or "unknown" for t in mine})[:3])
            raise OptimizationError(
                f"all {len(mine)} knob trials of study {self.study_name!r} failed: {reasons}. "
                "Fix the objective (it must return a finite number) and rerun; the study resumes."
            )
        return mine

    def optimize_parallel(
        self, objective: KnobObjective, *, n_workers: int, trials_per_worker: int, start_method: str = "spawn"
    ) -> list[KnobTrial]:
        """Run ``n_workers`` processes × ``trials_per_worker`` trials on the shared journal.

        The study is created here first, then each worker loads it (case M3).

        Raises:
            OptimizationError: the store is SQLite (single process only; use a journal path),
                a worker process failed, or every new trial failed.
            ValueError: non-positive counts.
        """
        if n_workers < 1 or trials_per_worker < 1:
            raise ValueError(
                f"n_workers and trials_per_worker must be >= 1, got {n_workers}, {trials_per_worker}"
            )
        if self.is_sqlite:
            raise OptimizationError(
                f"{self.path} is SQLite, which is single-process only; use a journal file "
                "(e.g. knobs.journal) for parallel workers"
            )
        before = _finished_numbers(self.study)
        ctx: Any = multiprocessing.get_context(start_method)
        args = (
            str(self.path),
            self.study_name,
            self.space,
            self.direction,
            self.seed,
            objective,
            trials_per_worker,
        )
        procs = [ctx.Process(target=_worker, args=(*args, i)) for i in range(n_workers)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        bad = [p.exitcode for p in procs if p.exitcode != 0]
        mine = [t for t in self.trials() if t.number not in before]
        if bad or (mine and all(t.state == "FAIL" for t in mine)):
            reasons = "; ".join(sorted({t.fail_reason or "unknown" for t in mine if t.state == "FAIL"})[:3])
            raise OptimizationError(
                f"parallel knob search on {self.study_name!r}: {len(bad)} worker(s) exited with {bad}; "
                f"{sum(t.state == 'COMPLETE' for t in mine)}/{len(mine)} trials completed. {reasons}"
            )
        return mine

    def enqueue(self, params: Mapping[str, int | float]) -> None:
        """Queue ``params`` as the next trial (e.g. ``space.current(cfg)`` to score the baseline first).

        Skipped when a trial with the same params already exists, so a resumed run does not
        repeat it.
        """
        self.study.enqueue_trial(dict(params), skip_if_exists=True)

    def trials(self) -> list[KnobTrial]:
        """Every trial in the study, by number."""
        out = []
        for t in self.study.get_trials(deepcopy=False):
            out.append(
                KnobTrial(
                    number=t.number,
                    params=dict(t.params),
                    value=t.value if t.state.name == "COMPLETE" else None,
                    state=t.state.name,
                    fail_reason=t.user_attrs.get(_FAIL_ATTR),
                )
            )
        return sorted(out, key=lambda t: t.number)

    def best(self) -> KnobTrial:
        """The best completed trial.

        Raises:
            OptimizationError: no trial has completed (the message counts failed trials and
                quotes their reasons instead of Optuna's "No trials are completed yet").
        """
        trials = self.trials()
        done = [t for t in trials if t.state == "COMPLETE" and t.value is not None]
        if not done:
            failed = [t for t in trials if t.state == "FAIL"]
            reasons = "; ".join(sorted({t.fail_reason or "unknown" for t in failed})[:3])
            raise OptimizationError(
                f"study {self.study_name!r} at {self.path} has no completed trial "
                f"({len(trials)} trials, {len(failed)} failed{': ' + reasons if reasons else ''}); "
                "run optimize() with an objective that returns a finite number"
            )
        pick = max if self.direction == "maximize" else min
        return pick(done, key=lambda t: t.value or 0.0)


def _finished_numbers(study: optuna.Study) -> set[int]:
    """Numbers of trials already finished (queued WAITING trials are not: this call will run them)."""
    return {t.number for t in study.get_trials(deepcopy=False) if t.state.is_finished()}


def _worker(
    path: str,
    study_name: str,
    space: KnobSpace,
    direction: Literal["maximize", "minimize"],
    seed: int,
    objective: KnobObjective,
    n_trials: int,
    index: int,
) -> None:
    """One worker process: load (never create) the study and run ``n_trials`` trials."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ks = KnobStudy(path, study_name, space=space, direction=direction, seed=seed + 1000 * (index + 1))
    study = optuna.load_study(study_name=study_name, storage=ks._storage(), sampler=ks._sampler())
    study.optimize(_wrap(space, objective), n_trials=n_trials, catch=(Exception,))
