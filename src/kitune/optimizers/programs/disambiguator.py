"""The disambiguator's task: GEPA over the instruction that writes disambiguation KIs.

Examples: the tuning failures whose gold document exists. Module:
:class:`kitune.optimizers.tasks.CheckedDisambiguator` (the guardrails applied). Metric:
:func:`kitune.optimizers.tasks.disambiguator_metric` — 0 rejected, 0.5 passes the guardrails,
1.0 also retrieved for its question. Write-only: the instruction changes what is written, so a
proposal is judged by this metric, not by a validation run that cannot see it.
"""

from __future__ import annotations

from kitune.optimizers import tasks
from kitune.optimizers.improve_env import ImproveEnv, ImproveInput
from kitune.optimizers.program_spec import ProgramTask, TaskSetup
from kitune.programs.disambiguator import Disambiguator

__all__ = ["DISAMBIGUATOR", "PLUGINS", "disambiguator_setup"]


def disambiguator_setup(env: ImproveEnv, inp: ImproveInput) -> TaskSetup:
    """The checked disambiguator with the setting's instruction, the failures, the retrieval metric."""
    setting = inp.setting
    examples = tasks.disambiguator_examples(inp.failures, inp.get_document)
    module = tasks.CheckedDisambiguator(
        Disambiguator(setting.prompts["disambiguator"], corpus=inp.cfg.corpus_name)
    )
    metric = tasks.disambiguator_metric(env.store_for(setting), env.context_ids(setting))
    return TaskSetup(module, examples, metric)


DISAMBIGUATOR = ProgramTask(
    "disambiguator",
    predictor="program.writer",
    lm_role="extract",
    setup=disambiguator_setup,
    write_only=True,
    task_words=("answer", "distinguish", "tell apart", "disambig"),
    order=30,
)

PLUGINS = {"disambiguator": DISAMBIGUATOR}
"""This module's program task, registered by :data:`kitune.optimizers.program_task.PROGRAM_TASKS`."""
