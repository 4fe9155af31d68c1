"""What a program module declares: its :class:`ProgramTask` and, per iteration, a :class:`TaskSetup`.

The registry of these tasks is :mod:`kitune.optimizers.program_task`; a built-in program module
(:mod:`kitune.optimizers.programs`) imports only this module, so the registry that lists it never
imports it back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kitune.programs.instructions import available_instructions, load_instruction

if TYPE_CHECKING:
    from kitune.optimizers.improve_env import ImproveEnv, ImproveInput

__all__ = ["ProgramTask", "TaskSetup"]


@dataclass(frozen=True)
class TaskSetup:
    """One iteration's optimisation task for a program."""

    module: Any
    """The ``dspy.Module`` whose :attr:`ProgramTask.predictor` instruction is optimised."""
    examples: Sequence[Any]
    """``dspy.Example`` items (empty: nothing to optimise this iteration)."""
    metric: Callable[..., Any]
    """The stage metric, GEPA's feedback signature ``(gold, pred, trace, pred_name, pred_trace)``."""
    valset: Sequence[Any] | None = None
    """GEPA's Pareto (validation) candidates, best first; the optimiser keeps the first
    :func:`~kitune.optimizers.gepa.pareto_size` of them and proposes from all ``examples``.
    None: the first half of ``examples`` proposes and the second half scores (4 or more), else
    all of them do both."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Measures of the setup itself (examples found, routed failures), logged as
    ``improve_<program>_<key>``."""


@dataclass(frozen=True)
class ProgramTask:
    """How the loop tunes one program (see the module docstring).

    Args:
        name: the program's name in settings, prompts and ``--programs`` (lower case).
        predictor: the predictor (``named_predictors()`` name) that holds the instruction.
        lm_role: the LM role that runs the module (``extract``, ``rewrite``).
        setup: ``(env, input) -> TaskSetup | None`` for one iteration (None: skip).
        write_only: True when the instruction changes what is written to the KI store, never
            what an evaluation reads.
        task_words: a proposed instruction must contain one of these (case-insensitive).
        instruction: the starting instruction when the package ships no prompt for ``name``
            (``kitune/prompts/<name>.txt`` wins when present); for plug-ins.
        order: where the program comes in :func:`program_names` (and so in the default
            ``--programs`` and the improve step): the extractor 10, the rewriter 20, the
            disambiguator 30, plug-ins 100 unless they say otherwise.
        served: the serving commands resolve this program's prompt (its ``production`` version
            of ``kitune-<corpus>-<name>``, else the packaged one; :func:`served_programs`).
        names_store: this program's instruction version names the KI table/index the serving
            commands read (``<table>-<sha8>``); exactly one registered program says so (the
            extractor, :func:`store_program`).
        stage_metric: the key of this program's own signal in
            :mod:`kitune.evaluation.stage_metrics` (``StageMetric.name`` with
            ``StageMetric.stage == name``: the extractor ``answer_coverage``, the rewriter
            ``mrr``), None when it has none (write-only programs are
            judged by their task metric).
    """

    name: str
    predictor: str
    lm_role: str
    setup: Callable[[ImproveEnv, ImproveInput], TaskSetup | None]
    write_only: bool = False
    task_words: tuple[str, ...] = ()
    instruction: str | None = None
    order: int = 100
    served: bool = True
    names_store: bool = False
    stage_metric: str | None = None

    def start_instruction(self) -> str:
        """The packaged instruction ``kitune/prompts/<name>.txt``, else :attr:`instruction`.

        Raises:
            ConfigError: neither exists.
        """
        if self.instruction is not None and self.name not in available_instructions():
            return self.instruction
        return load_instruction(self.name).text
