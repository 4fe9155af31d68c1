"""One :class:`ProgramTask` per tunable program, each in its own file under :mod:`kitune.optimizers.programs`.

A task says everything the loop needs to tune one program's instruction: the predictor whose
instruction it is, the LM role that runs it, whether it only changes what is *written* (then a
proposal is judged by its own task metric, since validation cannot see it), the words a proposed
instruction must keep, and how to build the module, the examples and the stage metric for one
iteration (:attr:`ProgramTask.setup`). Every module of :mod:`kitune.optimizers.programs` registers
its task when imported, and the registry imports them all on first use, so adding a program is one
new file there (a plug-in elsewhere registers by being imported)::

    register_program_task(ProgramTask("summariser", predictor="summarise", lm_role="extract",
                                      setup=summariser_setup, task_words=("summar",)))

:func:`program_names` replaces the old ``LOOP_PROGRAMS``, :func:`write_only_programs` the old
``WRITE_ONLY_PROGRAMS``, :attr:`ProgramTask.task_words` the old ``acceptance.TASK_WORDS``.

This registry is the only list of programs. Serving asks it which prompts to resolve
(:func:`served_programs`: ``kitune serve``, ``context``, ``extract``, ``eval``, the MCP server,
``--prompt-version``) and which program's version names the KI table (:func:`store_program`);
``kitune drift`` and ``kitune optimize`` ask it for the programs to tune (:func:`program_names`).
A program says so on its task (:attr:`ProgramTask.served`, :attr:`ProgramTask.names_store`,
:attr:`ProgramTask.stage_metric`), so adding a served program is its one module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kitune.errors import ConfigError
from kitune.plugins import Registry
from kitune.programs.instructions import available_instructions, load_instruction

if TYPE_CHECKING:
    from kitune.optimizers.improve_env import ImproveEnv, ImproveInput
    from kitune.optimizers.setting import Setting

__all__ = [
    "PROGRAM_TASKS",
    "ProgramTask",
    "TaskSetup",
    "eval_key",
    "get_program_task",
    "program_names",
    "read_programs",
    "register_program_task",
    "served_programs",
    "store_program",
    "unregister_program_task",
    "write_only_programs",
]


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


PROGRAM_TASKS: Registry[ProgramTask] = Registry(
    "program", packages=("kitune.optimizers.programs",), setting="--programs / optimize programs"
)
"""Program name → task. Built-ins: every module of :mod:`kitune.optimizers.programs`."""


def register_program_task(task: ProgramTask, *, replace: bool = False) -> ProgramTask:
    """Register ``task`` under ``task.name``; returns it.

    Raises:
        ValueError: bad or taken name (see :meth:`~kitune.optimizers.registry.Registry.register`).
    """
    return PROGRAM_TASKS.register(task.name, task, replace=replace)


def unregister_program_task(name: str) -> None:
    """Remove a program task (tests that added a toy one clean up with this)."""
    PROGRAM_TASKS.unregister(name)


def get_program_task(name: str) -> ProgramTask:
    """The task registered as ``name``.

    Raises:
        ConfigError: not registered (the message lists the registered programs).
    """
    return PROGRAM_TASKS.get(name)


def program_names() -> tuple[str, ...]:
    """Every registered program by :attr:`ProgramTask.order`, then name.

    The built-ins: ``("extractor", "rewriter", "disambiguator")``.
    """
    return tuple(name for name, _ in sorted(PROGRAM_TASKS.entries(), key=lambda kv: (kv[1].order, kv[0])))


def served_programs() -> tuple[str, ...]:
    """The programs whose prompts the serving commands resolve, in :func:`program_names` order.

    The built-ins: ``("extractor", "rewriter", "disambiguator")``.
    """
    return tuple(name for name in program_names() if PROGRAM_TASKS.get(name).served)


def read_programs(*, rewrite: bool = True) -> tuple[str, ...]:
    """The served programs an answer depends on, whose versions label a served or evaluated setting.

    Every served program but the write-only ones (what they wrote is in the KI table, which the
    :func:`store_program`'s version names), and the rewriter only when questions are rewritten.

    Args:
        rewrite: the query rewriter runs (False: ``--no-rewrite``, plain plans).

    Returns:
        Built-ins: ``("extractor", "rewriter")``, or ``("extractor",)`` without rewriting.
    """
    skip = write_only_programs() | (set() if rewrite else {"rewriter"})
    return tuple(name for name in served_programs() if name not in skip)


def store_program() -> str:
    """The program whose instruction version names the KI table (the extractor).

    Raises:
        ConfigError: no registered program, or more than one, declares ``names_store``.
    """
    found = [name for name in program_names() if PROGRAM_TASKS.get(name).names_store]
    if len(found) != 1:
        raise ConfigError(
            f"exactly one registered program must name the KI table "
            f"(names_store=True); found {found or 'none'}: "
            "register the plug-in program with names_store=False"
        )
    return found[0]


def write_only_programs() -> frozenset[str]:
    """Programs whose instruction changes only what is written (the disambiguator)."""
    return frozenset(name for name, task in PROGRAM_TASKS.entries() if task.write_only)


def eval_key(setting: Setting) -> str:
    """8 hex characters identifying what an evaluation of ``setting`` reads.

    Leaves out the instructions of :func:`write_only_programs` (the disambiguator writes KIs;
    what it wrote is covered by the KI store's state), so two settings that differ only there
    share their evaluations.
    """
    return setting.key_without(write_only_programs())
