"""The improve step as a fold over :class:`Improver` rooms, one file each under ``optimizers/improvers/``.

An improver (:class:`~kitune.optimizers.improve_env.Improver`) looks at one iteration's
:class:`~kitune.optimizers.improve_env.ImproveInput` (the current setting, its tuning run, the
failures and their kinds, the ledger) and returns an
:class:`~kitune.optimizers.improve_env.Improvement`: new instructions, knob values, metrics, notes
and optimised modules.
:func:`run_improvers` calls the configured ones in order (``optimize.improvers``, default
``prompts``, ``knobs``, ``disambiguation``) on the same input and folds their results into one
:class:`~kitune.optimizers.setting.Proposal` — later improvers win on the same key. Every module
of :mod:`kitune.optimizers.improvers` declares its improver as ``PLUGINS = {name: improver}``
(importing only :mod:`kitune.optimizers.improve_env`, never this registry); adding a new kind of
proposal is one new file there (a plug-in elsewhere registers by being imported).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kitune.optimizers.improve_env import ImproveEnv, ImproveInput, Improvement, Improver
from kitune.optimizers.setting import Proposal, Setting
from kitune.plugins import Registry

__all__ = [
    "IMPROVERS",
    "fold",
    "get_improver",
    "improver_names",
    "register_improver",
    "run_improvers",
    "unregister_improver",
]


IMPROVERS: Registry[Improver] = Registry(
    "improver", packages=("kitune.optimizers.improvers",), setting="optimize.improvers"
)
"""Improver name → improver. Built-ins: every module of :mod:`kitune.optimizers.improvers`."""


def register_improver(improver: Improver, *, replace: bool = False) -> Improver:
    """Register ``improver`` under ``improver.name``; returns it.

    Raises:
        ValueError: bad or taken name.
    """
    return IMPROVERS.register(improver.name, improver, replace=replace)


def unregister_improver(name: str) -> None:
    """Remove an improver (tests that added a toy one clean up with this)."""
    IMPROVERS.unregister(name)


def improver_names() -> tuple[str, ...]:
    """Every registered improver, sorted."""
    return IMPROVERS.names()


def get_improver(name: str) -> Improver:
    """The improver registered as ``name``.

    Raises:
        ConfigError: not registered (the message lists the registered improvers).
    """
    return IMPROVERS.get(name)


def fold(setting: Setting, improvements: Sequence[Improvement]) -> Proposal:
    """Merge improvements, in order, into one proposal on top of ``setting`` (later ones win per key)."""
    prompts = dict(setting.prompts)
    knobs: dict[str, int | float] = dict(setting.knobs)
    metrics: dict[str, float] = {}
    notes: dict[str, Any] = {}
    programs: dict[str, Any] = {}
    for imp in improvements:
        prompts.update(imp.prompts)
        knobs.update(imp.knobs)
        metrics.update(imp.metrics)
        notes.update(imp.notes)
        programs.update(imp.programs)
    return Proposal(Setting(prompts, knobs), metrics=metrics, programs=programs, notes=notes)


def run_improvers(
    env: ImproveEnv,
    inp: ImproveInput,
    names: Sequence[str],
    *,
    apply: Callable[[Improvement], Improvement] | None = None,
) -> Proposal:
    """Run the improvers ``names`` in order on ``inp`` and fold their improvements.

    Args:
        env: the loop's read-only view (look-ups, the extraction cache, seeds, the token count).
        inp: the iteration's immutable input, the same for every improver.
        names: improver names, in order (``optimize.improvers``).
        apply: the loop's side of an improvement that asks for feedback KIs
            (``Improvement.feedback``): it writes and gates them and returns the improvement
            with their metrics and notes (:func:`kitune.optimizers.feedback_step.apply_feedback`).
            Called as each improver returns, before the next one runs, so a later improver's
            look-ups see the KIs an earlier one's feedback left. None: nothing is written (the
            requests are dropped; the fold carries no feedback).

    Raises:
        ConfigError: an unknown improver name (before any runs).
    """
    improvers = [get_improver(name) for name in IMPROVERS.check(names, setting="optimize.improvers")]
    done: list[Improvement] = []
    for improver in improvers:
        got = improver.improve(env, inp)
        done.append(apply(got) if apply is not None and got.feedback else got)
    return fold(inp.setting, done)
