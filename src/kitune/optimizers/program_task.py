"""The program registry: one :class:`~kitune.optimizers.program_spec.ProgramTask` per program.

A task (:mod:`kitune.optimizers.program_spec`, one file per program) says everything the loop
needs to tune one program's instruction: the predictor whose
instruction it is, the LM role that runs it, whether it only changes what is *written* (then a
proposal is judged by its own task metric, since validation cannot see it), the words a proposed
instruction must keep, and how to build the module, the examples and the stage metric for one
iteration (:attr:`ProgramTask.setup`). Every module of :mod:`kitune.optimizers.programs` declares its task
as ``PLUGINS = {name: task}`` and the registry imports them all on first use, so adding a program
is one new file there (a plug-in elsewhere registers by being imported)::

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

from typing import TYPE_CHECKING

from kitune.errors import ConfigError
from kitune.optimizers.program_spec import ProgramTask
from kitune.plugins import Registry

if TYPE_CHECKING:
    from kitune.optimizers.setting import Setting

__all__ = [
    "PROGRAM_TASKS",
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
